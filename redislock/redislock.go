// Package redislock is the dlock backend for a single Redis instance (URL schemes
// redis://, rediss:// and unix://), on go-redis v9.
//
//	redis://[[user]:password@]host[:port][/db]?prefix=dlock&ttl=10s
//	rediss://host:6380/0?tls_ca=/etc/ca.pem&tls_cert=c.pem&tls_key=k.pem
//	unix:///run/redis.sock?db=0
//
// Parameters: prefix (key namespace, default "dlock"); replicas and replica_timeout
// (see WithReplicas; default timeout 50ms); strict (see WithStrict); tls_ca,
// tls_cert, tls_key, tls_server_name (rediss only); every go-redis URL option
// (dial_timeout, pool_size, ...); and the core's ttl, renew, drift, owner. Unknown
// parameters are an error.
//
// # Algorithm
//
// Acquire is one Lua script: if the key is free (and no live queued waiter is ahead),
// SET it to the owner id with PX ttl and issue a fencing token; if the owner already
// holds it, extend it and return the same token (re-entry, resume); otherwise report
// the holder's remaining TTL, and, for a waiting Lock, keep the caller's place in a
// FIFO queue. Release compares the owner, deletes the key and publishes a wake-up to
// the first live waiter only, on the wake-up channel of that waiter's client: one
// message per handoff however many wait, and the releaser cannot barge back in ahead
// of them. Each client subscribes to one channel of its own, once. Refresh compares
// the owner and sets PEXPIRE. Waiters also retry after a bounded fallback timer in
// case a message is lost, and a queued place that is not renewed by its waiter's
// attempts expires, so a crashed waiter cannot block the queue.
//
// # Safety model
//
// Mutual exclusion holds while the one Redis server keeps its data. Tokens are
// max(last token + 1, server TIME in microseconds), kept in a counter key without TTL,
// so they keep rising even after a restart that lost every key, as long as the
// server's clock does not step back and fewer than a million grants per second are
// made. What Redis does not promise: with asynchronous replication, a failover to a
// replica that had not yet received a grant lets a second client in; without
// appendonly+fsync, a crash loses grants the same way. In those cases timing cannot
// save you and fencing tokens (checked by the protected resource) must.
//
// Two settings narrow those windows. WithReplicas (?replicas=N) follows every acquire
// and refresh with WAIT N (WAITAOF on Redis 7.2+ with the AOF on) in the same round
// trip, and fails closed: an acquire that too few replicas acknowledged is released
// again and reported as ErrNotReplicated. WithStrict (?strict=true) refuses, at Open,
// a server that does not fsync every write (appendonly yes, appendfsync always), since
// only such a server keeps its grants across its own crash; Persistence reports what
// the server does in any case.
package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

func init() {
	for _, s := range []string{"redis", "rediss", "unix"} {
		driver.Register(s, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
			return Open(ctx, u)
		})
	}
}

// DefaultPrefix is the default key namespace.
const DefaultPrefix = "dlock"

// Option configures a Backend.
type Option func(*Backend) error

// WithPrefix sets the key namespace (default "dlock"). Clients that should contend
// for the same locks must use the same prefix.
func WithPrefix(p string) Option {
	return func(b *Backend) error {
		if p == "" || strings.ContainsAny(p, " \n\r\t") {
			return fmt.Errorf("%w: redis key prefix must be non-empty and without spaces, got %q", driver.ErrInvalid, p)
		}
		b.prefix = p
		return nil
	}
}

// Backend is the Redis backend. It implements driver.Backend, driver.Notifier,
// driver.Inspector and driver.ForceReleaser, and is safe for concurrent use.
type Backend struct {
	rdb    redis.UniversalClient
	own    bool // close rdb in Close
	prefix string
	wakeCh string // this client's wake-up channel
	logger *slog.Logger

	replicas       int
	replicaTimeout time.Duration
	strict         bool

	mu      sync.Mutex
	closed  bool
	ps      *redis.PubSub
	waiters map[waitKey]*waiter
	listen  sync.WaitGroup

	persistence Persistence
}

type waitKey struct{ key, owner string }

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
)

// New returns a backend on an existing go-redis client, which the caller keeps
// owning (Close does not close it). Use a client with ContextTimeoutEnabled so that
// contexts bound every call.
func New(rdb redis.UniversalClient, opts ...Option) (*Backend, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", driver.ErrInvalid)
	}
	var id [12]byte
	_, _ = rand.Read(id[:])
	b := &Backend{rdb: rdb, prefix: DefaultPrefix, waiters: make(map[waitKey]*waiter), logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if err := o(b); err != nil {
			return nil, err
		}
	}
	b.wakeCh = b.prefix + ":wake:" + hex.EncodeToString(id[:])
	return b, nil
}

// Open returns a backend for a redis://, rediss:// or unix:// URL; see the package
// documentation for its parameters. Options given here apply after the URL's. It
// checks that the server answers and runs Verify before returning.
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	p := driver.NewParams(u.Query())
	prefix, err := p.String("prefix", DefaultPrefix)
	if err != nil {
		return nil, err
	}
	tlsFiles := map[string]string{}
	for _, name := range []string{"tls_ca", "tls_cert", "tls_key", "tls_server_name"} {
		if tlsFiles[name], err = p.String(name, ""); err != nil {
			return nil, err
		}
	}
	durability, err := parseDurability(p)
	if err != nil {
		return nil, err
	}
	ours := []string{"prefix", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "replicas", "replica_timeout", "strict"}
	opt, err := redis.ParseURL(driver.Without(u, ours...).String())
	if err != nil {
		// go-redis errors name the parameter, not the password.
		return nil, fmt.Errorf("%w: %v", driver.ErrInvalid, err)
	}
	if err := configureTLS(opt, u.Scheme, tlsFiles); err != nil {
		return nil, err
	}
	opt.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opt)
	b, err := New(rdb, append([]Option{WithPrefix(prefix)}, append(durability, opts...)...)...)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	b.own = true
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redislock: connect to %s: %w", driver.Redact(u), err)
	}
	if err := b.Verify(ctx); err != nil {
		rdb.Close()
		return nil, err
	}
	return b, nil
}

func configureTLS(opt *redis.Options, scheme string, f map[string]string) error {
	want := f["tls_ca"] != "" || f["tls_cert"] != "" || f["tls_key"] != "" || f["tls_server_name"] != ""
	if !want {
		return nil
	}
	if scheme != "rediss" {
		return fmt.Errorf("%w: tls_* parameters need the rediss:// scheme", driver.ErrInvalid)
	}
	base, err := driver.TLSConfig(f)
	if err != nil {
		return err
	}
	if base.RootCAs != nil {
		opt.TLSConfig.RootCAs = base.RootCAs
	}
	opt.TLSConfig.Certificates = base.Certificates
	if base.ServerName != "" {
		opt.TLSConfig.ServerName = base.ServerName
	}
	return nil
}

// Client returns the go-redis client.
func (b *Backend) Client() redis.UniversalClient { return b.rdb }

// LockKey returns the Redis key that holds the lock named key.
func (b *Backend) LockKey(key string) string { return b.prefix + ":lock:" + key }

func (b *Backend) keys(key string) (lock, token, queue, waiterPrefix string) {
	return b.prefix + ":lock:" + key, b.prefix + ":token:" + key, b.prefix + ":queue:" + key, b.prefix + ":waiter:" + key + ":"
}

func ms(d time.Duration) int64 { return max(int64((d+time.Millisecond-1)/time.Millisecond), 1) }

func wrap(op, key string, err error) error {
	return fmt.Errorf("redislock: %s %q: %w", op, key, err)
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	lock, token, queue, wp := b.keys(req.Key)
	wait, queued := "0", "0"
	var w *waiter
	if req.Wait {
		wait = "1"
		b.mu.Lock()
		w = b.waiters[waitKey{req.Key, req.Owner}]
		b.mu.Unlock()
		if w != nil && w.queued.Load() {
			queued = "1"
		}
	}
	cmd, err := b.runScript(ctx, acquireScript, []string{lock, token, queue},
		req.Owner, ms(req.TTL), wait, ms(req.Patience), wp, b.wakeCh, queued)
	n, cerr := cmd.Int64()
	if errors.Is(err, ErrNotReplicated) && cerr == nil && n > 0 {
		// Fail closed: give back a grant the replicas may not have.
		if rerr := releaseScript.Run(ctx, b.rdb, []string{lock, queue}, req.Owner, wp, req.Key).Err(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("release after failed replication: %w", rerr))
		}
		return driver.Grant{}, wrap("acquire", req.Key, err)
	}
	if cerr != nil {
		return driver.Grant{}, wrap("acquire", req.Key, cerr)
	}
	if n < 0 && w != nil {
		w.queued.Store(true)
	}
	if n > 0 {
		return driver.Grant{Token: uint64(n)}, nil
	}
	if n == 0 {
		// Re-entry after the token counter was lost: the grant stands but cannot
		// be fenced against earlier ones; refuse to pretend.
		return driver.Grant{}, wrap("acquire", req.Key, errors.New("token counter missing for a held key"))
	}
	return driver.Grant{}, &driver.HeldError{RetryAfter: time.Duration(-n-1) * time.Millisecond}
}

// Refresh implements driver.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	lock, _, _, _ := b.keys(key)
	cmd, err := b.runScript(ctx, refreshScript, []string{lock}, owner, ms(ttl))
	if n, cerr := cmd.Int64(); cerr == nil && n == 0 {
		return driver.ErrNotHeld
	}
	if err != nil {
		return wrap("refresh", key, err)
	}
	return nil
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	lock, _, queue, wp := b.keys(key)
	n, err := releaseScript.Run(ctx, b.rdb, []string{lock, queue}, owner, wp, key).Int64()
	if err != nil {
		return wrap("release", key, err)
	}
	if n == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	lock, _, queue, wp := b.keys(key)
	n, err := forceReleaseScript.Run(ctx, b.rdb, []string{lock, queue}, wp, key).Int64()
	if err != nil {
		return wrap("force release", key, err)
	}
	if n == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// Inspect implements driver.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	lock, token, queue, wp := b.keys(key)
	v, err := inspectScript.Run(ctx, b.rdb, []string{lock, token, queue}, wp).Slice()
	if errors.Is(err, redis.Nil) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, wrap("inspect", key, err)
	}
	if len(v) != 4 {
		return driver.Info{}, wrap("inspect", key, fmt.Errorf("unexpected reply %v", v))
	}
	owner, _ := v[0].(string)
	pttl, _ := v[1].(int64)
	tokStr, _ := v[2].(string)
	tok, _ := strconv.ParseUint(tokStr, 10, 64)
	live, _ := v[3].(int64)
	return driver.Info{Key: key, Owner: owner, Token: tok, TTL: time.Duration(max(pttl, 0)) * time.Millisecond, Waiters: int(live)}, nil
}

// Watch implements driver.Notifier. The first call subscribes this client to its
// wake-up channel; every later wait shares that one subscription.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, driver.ErrClosed
	}
	if b.ps == nil {
		ps := b.rdb.Subscribe(ctx, b.wakeCh)
		if _, err := ps.Receive(ctx); err != nil { // the subscription confirmation
			ps.Close()
			return nil, fmt.Errorf("redislock: subscribe: %w", err)
		}
		b.ps = ps
		// Read messages on our own goroutine rather than through ps.Channel,
		// which adds a goroutine hop to every wake-up.
		b.listen.Go(func() {
			for {
				m, err := ps.ReceiveMessage(context.Background())
				if err != nil {
					if errors.Is(err, redis.ErrClosed) || b.isClosed() {
						return
					}
					// go-redis reconnects on the next call; wake-ups lost meanwhile
					// are covered by the waiters' fallback timer.
					time.Sleep(50 * time.Millisecond)
					continue
				}
				b.dispatch(m.Payload)
			}
		})
	}
	w := &waiter{b: b, key: key, owner: owner, c: make(chan struct{}, 1)}
	b.waiters[waitKey{key, owner}] = w
	return w, nil
}

func (b *Backend) dispatch(payload string) {
	owner, key, ok := strings.Cut(payload, " ")
	if !ok {
		return
	}
	b.mu.Lock()
	w := b.waiters[waitKey{key, owner}]
	b.mu.Unlock()
	if w != nil {
		select {
		case w.c <- struct{}{}:
		default:
		}
	}
}

type waiter struct {
	b          *Backend
	key, owner string
	c          chan struct{}
	queued     atomic.Bool // an attempt of this wait took a place in the queue
}

func (w *waiter) C() <-chan struct{} { return w.c }

func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	b := w.b
	b.mu.Lock()
	if b.waiters[waitKey{w.key, w.owner}] == w {
		delete(b.waiters, waitKey{w.key, w.owner})
	}
	b.mu.Unlock()
	if acquired || !w.queued.Load() {
		return nil
	}
	lock, _, queue, wp := b.keys(w.key)
	if err := withdrawScript.Run(ctx, b.rdb, []string{lock, queue}, w.owner, wp, w.key).Err(); err != nil {
		return wrap("withdraw waiter", w.key, err)
	}
	return nil
}

// Close implements driver.Backend: it ends the wake-up subscription and, when the
// backend was made by Open, closes the connection pool.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	ps := b.ps
	b.mu.Unlock()
	var errs []error
	if ps != nil {
		errs = append(errs, ps.Close())
	}
	b.listen.Wait()
	if b.own {
		errs = append(errs, b.rdb.Close())
	}
	return errors.Join(errs...)
}

var floorCAD = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// FloorCycle implements driver.Floorer: SET NX PX, then a compare-and-delete script,
// on this backend's client, under the prefix's "floor:" namespace.
func (b *Backend) FloorCycle(ctx context.Context, key string) error {
	k := b.prefix + ":floor:" + key
	ok, err := b.rdb.SetNX(ctx, k, b.wakeCh, 15*time.Second).Result()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("floor key %q held", k)
	}
	return floorCAD.Run(ctx, b.rdb, []string{k}, b.wakeCh).Err()
}

// ServerOps implements driver.OpsCounter: the sum of the calls in INFO
// commandstats, which counts the commands run inside scripts as well, less the INFO
// calls themselves.
func (b *Backend) ServerOps(ctx context.Context) (int64, error) {
	s, err := b.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	for line := range strings.SplitSeq(s, "\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		n, _ := strconv.ParseInt(rest[:max(strings.IndexByte(rest, ','), 0)], 10, 64)
		total += n
	}
	return total, nil
}
