package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// Peers are the lock libraries dlock is measured beside (Config.Peers): each runs in
// this process, on the same servers as the dlock backend of its store, through the
// same loops (package measure) and statistics, in the same rounds; its uncontended
// cycles run in the dlock backend's loop, in turn with dlock's (pairPeers).
//
// A peer is a small adapter, an Acquire function on one connection of its own per
// worker. The loops drive it through a dlock.Client over a pass-through backend
// (peerBackend): Lock calls the peer's acquire once, which blocks the peer's own
// way (retrying, watching, or blocking in the server) until it holds the key, and
// Release calls the release it returned. The core adds its bookkeeping (an owner id,
// a lease object; no renewal happens within the hour-long TTL the peers' clients
// get), which the mem backend's cycle bounds from above. Peers have no fencing
// tokens, no handoff hooks and no server-operation counts: the cost-growth workload
// is not theirs.

// Acquire takes key, waiting until it is free the peer's own way, and returns the
// function that releases it.
type Acquire func(ctx context.Context, key string) (release func(context.Context) error, err error)

// peerConn is one worker's connection of a peer.
type peerConn struct {
	acquire Acquire
	close   func() error
}

// peerDef describes a peer of a store.
type peerDef struct {
	name  string
	store string // redis, redlock, etcd, zk, postgres, mysql
	note  string
	// cannot lists the workloads the peer cannot run (shown as such, not as 0).
	cannot []string
	// open connects one worker to the servers of the dlock URL u.
	open func(ctx context.Context, u *url.URL) (peerConn, error)
}

// Stores that have peers, as BackendResult.Store names them.
const (
	StoreRedis    = "redis"
	StoreRedlock  = "redlock"
	StoreEtcd     = "etcd"
	StoreZK       = "zk"
	StorePostgres = "postgres"
	StoreMySQL    = "mysql"
)

// storeOf names the store a backend URL runs on, empty for one without peers (mem).
func storeOf(rawURL string) string {
	switch strings.ToLower(schemeOf(rawURL)) {
	case "redis", "rediss", "unix":
		return StoreRedis
	case "redlock":
		return StoreRedlock
	case "etcd":
		return StoreEtcd
	case "zk":
		return StoreZK
	case "postgres", "postgresql":
		return StorePostgres
	case "mysql", "mariadb":
		return StoreMySQL
	}
	return ""
}

// peerRowPoll is how often the PostgreSQL and MySQL row-lock peers try again.
const peerRowPoll = 10 * time.Millisecond

// peerRowTable is the row-lock peer's table, its own.
const peerRowTable = "dlock_bench_peer_rows"

// peerTTL is the expiry the peers that need one (redsync, bsm/redislock) are given,
// and the etcd session's TTL in seconds: far beyond a hot-key hold.
const peerTTL = 30 * time.Second

// peerDefs lists every peer, in the order they are shown.
var peerDefs = []peerDef{
	{name: "redsync-1", store: StoreRedis, note: "go-redsync/redsync/v4, one pool, default retry delay (random 50-250 ms; tries unbounded), 30 s expiry", open: openRedsync1},
	{name: "bsm/redislock", store: StoreRedis, note: "github.com/bsm/redislock, retry every 10 ms, 30 s TTL", open: openBsm},
	{name: "redsync-5", store: StoreRedlock, note: "go-redsync/redsync/v4, one pool per master (Redlock), default retry delay (random 50-250 ms; tries unbounded), 30 s expiry", open: openRedsyncN},
	{name: "etcd-mutex", store: StoreEtcd, note: "go.etcd.io/etcd/client/v3/concurrency Mutex, one session (30 s TTL) per worker", open: openEtcdMutex},
	{name: "zk-lock", store: StoreZK, note: "github.com/go-zookeeper/zk Lock (sequential ephemeral node, watch on the predecessor)", open: openZKLock},
	{name: "pg-advisory", store: StorePostgres, note: "pg_advisory_lock / pg_advisory_unlock with pgx on one connection per worker, blocking in the server (a session lock, not a lease)", open: openPgAdvisory},
	{name: "pg-row-poll", store: StorePostgres, note: "a row of its own table: INSERT ... ON CONFLICT DO NOTHING, polled every 10 ms, DELETE to release", open: openPgRow},
	{name: "mysql-get-lock", store: StoreMySQL, note: "GET_LOCK / RELEASE_LOCK with go-sql-driver/mysql on one connection per worker, blocking in the server (a session lock, not a lease)", open: openMySQLGetLock},
	{name: "mysql-row-poll", store: StoreMySQL, note: "a row of its own table: INSERT IGNORE, polled every 10 ms, DELETE to release", open: openMySQLRow},
}

// peersOf returns the peers of the store of a backend URL.
func peersOf(rawURL string) []peerDef {
	s := storeOf(rawURL)
	var out []peerDef
	for _, p := range peerDefs {
		if s != "" && p.store == s {
			out = append(out, p)
		}
	}
	return out
}

// peerBackend is the pass-through driver.Backend that lets the measuring loops,
// written for a dlock.Client, drive a peer: Acquire calls the peer's acquire once
// (blocking until held), Release calls the release it returned.
type peerBackend struct {
	c    peerConn
	mu   sync.Mutex
	held map[string]func(context.Context) error // by key and owner
}

var _ driver.Backend = (*peerBackend)(nil)

func newPeerBackend(c peerConn) *peerBackend {
	return &peerBackend{c: c, held: map[string]func(context.Context) error{}}
}

func (b *peerBackend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	rel, err := b.c.acquire(ctx, req.Key)
	if err != nil {
		return driver.Grant{}, err
	}
	b.mu.Lock()
	b.held[req.Key+"\x00"+req.Owner] = rel
	b.mu.Unlock()
	return driver.Grant{}, nil
}

// Refresh does nothing: a peer keeps its own expiry, far beyond a hold.
func (b *peerBackend) Refresh(context.Context, string, string, time.Duration) error { return nil }

func (b *peerBackend) Release(ctx context.Context, key, owner string) error {
	b.mu.Lock()
	rel, ok := b.held[key+"\x00"+owner]
	delete(b.held, key+"\x00"+owner)
	b.mu.Unlock()
	if !ok {
		return driver.ErrNotHeld
	}
	return rel(ctx)
}

func (b *peerBackend) Close() error {
	if b.c.close == nil {
		return nil
	}
	return b.c.close()
}

// openPeer prepares a peer on the servers of target t and checks that its workers
// connect. A peer holds its connections only while it runs (see connectPeer), so
// that the peers do not take the connections the dlock backends' long waiter chains
// need (PostgreSQL's max_connections).
func openPeer(ctx context.Context, cfg Config, p peerDef, t Target, br *BackendResult, runID string) (*targetEnv, error) {
	u, err := driver.ParseURL(t.URL)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	e := &targetEnv{cfg: cfg, res: br, keys: "dlock-bench." + runID + ".peer-" + strings.ReplaceAll(p.name, "/", "-") + ".", peer: &p, peerURL: u}
	if err := e.connectPeer(ctx, cfg.Workers); err != nil {
		return nil, err
	}
	e.close()
	return e, nil
}

// connectPeer connects n of the peer's workers (one connection, or one per Redlock
// master, each), wrapped for the loops as a dlock.Client.
func (e *targetEnv) connectPeer(ctx context.Context, n int) error {
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for range n {
		c, err := e.peer.open(octx, e.peerURL)
		if err != nil {
			e.close()
			return fmt.Errorf("bench: peer %s: %w", e.peer.name, err)
		}
		b := newPeerBackend(c)
		e.raw = append(e.raw, b)
		cl, err := dlock.New(b, dlock.WithTTL(time.Hour))
		if err != nil {
			e.close()
			return err
		}
		e.cl = append(e.cl, cl)
	}
	return nil
}

// redisOptions reads a redis://, rediss:// or unix:// dlock URL as go-redis options:
// its host, credentials, database (path or db=) and TLS (driver.ReadTLS).
func redisOptions(u *url.URL) (*redis.Options, error) {
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, err
	}
	c := *u
	c.RawQuery = ""
	if db, _ := p.String("db", ""); db != "" {
		c.RawQuery = url.Values{"db": {db}}.Encode()
	}
	opt, err := redis.ParseURL(c.String())
	if err != nil {
		return nil, err
	}
	cfg, err := driver.ReadTLS(p)
	if err != nil {
		return nil, err
	}
	if cfg == nil && u.Scheme == "rediss" {
		cfg, _ = driver.TLSConfig(nil)
	}
	if cfg != nil {
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.InsecureSkipVerify, _ = p.Bool("skip_verify", false)
		opt.TLSConfig = cfg
	}
	opt.PoolSize = 1
	return opt, nil
}

// redlockOptions reads a redlock:// URL as go-redis options, one per master.
func redlockOptions(u *url.URL) ([]*redis.Options, error) {
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := driver.ReadTLS(p)
	if err != nil {
		return nil, err
	}
	db := 0
	if path := strings.Trim(u.Path, "/"); path != "" {
		if db, err = strconv.Atoi(path); err != nil {
			return nil, fmt.Errorf("redlock URL path must be a database number, got %q", u.Path)
		}
	}
	if u.Host == "" {
		return nil, errors.New("redlock URL lists no nodes")
	}
	var out []*redis.Options
	for h := range strings.SplitSeq(u.Host, ",") {
		addr := h
		if _, _, err := net.SplitHostPort(h); err != nil {
			addr = net.JoinHostPort(h, "6379")
		}
		opt := &redis.Options{Addr: addr, DB: db, PoolSize: 1}
		if u.User != nil {
			opt.Username = u.User.Username()
			opt.Password, _ = u.User.Password()
		}
		if tlsCfg != nil {
			opt.TLSConfig = tlsCfg.Clone()
			if opt.TLSConfig.ServerName == "" {
				opt.TLSConfig.ServerName, _, _ = net.SplitHostPort(addr)
			}
		}
		out = append(out, opt)
	}
	return out, nil
}

func pingAll(ctx context.Context, rdbs []*redis.Client) error {
	for _, r := range rdbs {
		if err := r.Ping(ctx).Err(); err != nil {
			return err
		}
	}
	return nil
}

func closeAll(rdbs []*redis.Client) error {
	var errs []error
	for _, r := range rdbs {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

func redsyncConn(ctx context.Context, opts []*redis.Options) (peerConn, error) {
	var rdbs []*redis.Client
	var pools []redsyncredis.Pool
	for _, o := range opts {
		r := redis.NewClient(o)
		rdbs = append(rdbs, r)
		pools = append(pools, goredis.NewPool(r))
	}
	if err := pingAll(ctx, rdbs); err != nil {
		closeAll(rdbs)
		return peerConn{}, err
	}
	rs := redsync.New(pools...)
	return peerConn{
		acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
			// Tries raised so that a waiter never gives up within a workload; the
			// retry delay is redsync's default.
			m := rs.NewMutex(key, redsync.WithExpiry(peerTTL), redsync.WithTries(math.MaxInt32))
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				ok, err := m.UnlockContext(ctx)
				if err == nil && !ok {
					err = driver.ErrNotHeld
				}
				return err
			}, nil
		},
		close: func() error { return closeAll(rdbs) },
	}, nil
}

func openRedsync1(ctx context.Context, u *url.URL) (peerConn, error) {
	o, err := redisOptions(u)
	if err != nil {
		return peerConn{}, err
	}
	return redsyncConn(ctx, []*redis.Options{o})
}

func openRedsyncN(ctx context.Context, u *url.URL) (peerConn, error) {
	os, err := redlockOptions(u)
	if err != nil {
		return peerConn{}, err
	}
	return redsyncConn(ctx, os)
}

func openBsm(ctx context.Context, u *url.URL) (peerConn, error) {
	o, err := redisOptions(u)
	if err != nil {
		return peerConn{}, err
	}
	r := redis.NewClient(o)
	if err := r.Ping(ctx).Err(); err != nil {
		r.Close()
		return peerConn{}, err
	}
	c := redislock.New(r)
	opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(peerRowPoll)}
	return peerConn{
		acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
			l, err := c.Obtain(ctx, key, peerTTL, opt)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		},
		close: r.Close,
	}, nil
}

func openEtcdMutex(ctx context.Context, u *url.URL) (peerConn, error) {
	p, err := driver.ParseParams(u)
	if err != nil {
		return peerConn{}, err
	}
	tlsConf, err := driver.ReadTLS(p)
	if err != nil {
		return peerConn{}, err
	}
	var eps []string
	for h := range strings.SplitSeq(u.Host, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "2379")
		}
		if tlsConf != nil {
			eps = append(eps, "https://"+h)
		} else {
			eps = append(eps, "http://"+h)
		}
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, TLS: tlsConf, Logger: zap.NewNop()}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return peerConn{}, err
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(peerTTL/time.Second))) // kept alive until closed, not bound to ctx
	if err != nil {
		cli.Close()
		return peerConn{}, err
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix == "" {
		prefix = "dlock"
	}
	prefix = "/" + prefix + "-bench-peers/"
	return peerConn{
		acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
			m := concurrency.NewMutex(s, prefix+key)
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return m.Unlock, nil
		},
		close: func() error {
			_ = s.Close()
			return cli.Close()
		},
	}, nil
}

func openZKLock(ctx context.Context, u *url.URL) (peerConn, error) {
	if u.Host == "" {
		return peerConn{}, errors.New("zk URL lists no servers")
	}
	var hosts []string
	for h := range strings.SplitSeq(u.Host, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "2181")
		}
		hosts = append(hosts, h)
	}
	conn, events, err := zk.Connect(hosts, 10*time.Second, zk.WithLogger(zk.Logger(log.New(io.Discard, "", 0))))
	if err != nil {
		return peerConn{}, err
	}
	for connected := false; !connected; {
		select {
		case ev := <-events:
			connected = ev.State == zk.StateHasSession
		case <-ctx.Done():
			conn.Close()
			return peerConn{}, ctx.Err()
		}
	}
	go func() {
		for range events { // drained until the connection closes
		}
	}()
	root := strings.TrimSuffix(u.Path, "/")
	if root == "" {
		root = "/dlock"
	}
	root += "-bench-peers/"
	return peerConn{
		// go-zookeeper's Lock takes no context: it waits until it holds the key
		// (or the session fails).
		acquire: func(_ context.Context, key string) (func(context.Context) error, error) {
			l := zk.NewLock(conn, root+key, zk.WorldACL(zk.PermAll))
			if err := l.Lock(); err != nil {
				return nil, err
			}
			return func(context.Context) error { return l.Unlock() }, nil
		},
		close: func() error { conn.Close(); return nil },
	}, nil
}
