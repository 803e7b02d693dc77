package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// The URL schemes of a Redis Cluster: SchemeCluster for TCP, SchemeClusterTLS
// for TCP with TLS. The host part lists seed nodes, host:port separated by commas.
const (
	SchemeCluster    = "redis+cluster"
	SchemeClusterTLS = "rediss+cluster"
)

func init() {
	for _, s := range []string{SchemeCluster, SchemeClusterTLS} {
		driver.Register(s, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
			return Open(ctx, u)
		})
	}
}

func isClusterScheme(s string) bool { return s == SchemeCluster || s == SchemeClusterTLS }

// In the cluster layout a lock name K is spelt clusterOpen K clusterClose inside
// every name of K (see names.go): Redis hashes only what lies between a name's
// first '{' and the next '}', here "=" and K up to its first '}', the same text
// for every name of K, never empty, so all of K's keys share a hash slot.
const (
	clusterOpen  = "{="
	clusterClose = "}"
)

// setCluster turns on the cluster layout for a *redis.ClusterClient, whose
// prefix must then hold no brace (it would move the hash tag).
func (b *Backend) setCluster(rdb redis.UniversalClient) error {
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		return nil
	}
	if strings.ContainsAny(b.prefix, "{}") {
		return invalid("a Redis Cluster key prefix cannot contain '{' or '}' (they would change the keys' hash slots), got %q", b.prefix)
	}
	b.cluster = true
	return nil
}

// part returns the spelling of the lock name key inside the backend's key names.
func (b *Backend) part(key string) string {
	if !b.cluster {
		return key
	}
	return clusterOpen + key + clusterClose
}

// unpart returns the lock name whose spelling in key names is s, and false if s
// is not one.
func (b *Backend) unpart(s string) (string, bool) {
	if !b.cluster {
		return s, true
	}
	k, ok := strings.CutPrefix(s, clusterOpen)
	if !ok {
		return "", false
	}
	return strings.CutSuffix(k, clusterClose)
}

var _ driver.SetChecker = (*Backend)(nil)

// AtomicSet implements driver.SetChecker: on a single server every set, in a
// cluster a set whose keys' names all fall in one hash slot (keys with a common
// part up to their first '}', such as "{order1}:a" and "{order1}:b").
func (b *Backend) AtomicSet(keys []string) bool {
	if !b.cluster || len(keys) == 0 {
		return true
	}
	s := keySlot(b.LockKey(keys[0]))
	for _, k := range keys[1:] {
		if keySlot(b.LockKey(k)) != s {
			return false
		}
	}
	return true
}

// keySlot returns the Redis Cluster hash slot of the key name s: CRC16 (XMODEM)
// of its hash tag (what lies between its first '{' and the next '}', if not
// empty) or else of the whole name, modulo 16384.
func keySlot(s string) int {
	if i := strings.IndexByte(s, '{'); i >= 0 {
		if j := strings.IndexByte(s[i+1:], '}'); j > 0 {
			s = s[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc & 16383)
}

// openCluster is Open for the cluster schemes.
func openCluster(ctx context.Context, u *url.URL, opts []Option) (*Backend, error) {
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	urlOpts, err := urlOptions(p)
	if err != nil {
		return nil, err
	}
	copt, first, err := clusterOptions(u, p)
	if err != nil {
		return nil, err
	}
	// TLS as for one server: rediss+cluster:// is rediss:// for every node.
	t := *u
	t.Scheme, t.Host = Scheme, first
	if u.Scheme == SchemeClusterTLS {
		t.Scheme = SchemeTLS
	}
	if copt.TLSConfig, err = readTLS(&t, p); err != nil {
		return nil, err
	}
	if err := p.Unknown(); err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	copt.ContextTimeoutEnabled = true
	rdb := redis.NewClusterClient(copt)
	return start(ctx, u, rdb, append(urlOpts, opts...), func(ctx context.Context) error {
		return rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() })
	})
}

// clusterOptions checks the seed nodes and go-redis parameters of a cluster URL
// and returns the go-redis ClusterOptions (without TLS) and the first seed.
func clusterOptions(u *url.URL, p *driver.Params) (*redis.ClusterOptions, string, error) {
	if strings.Trim(u.Path, "/") != "" || p.Has("db") {
		return nil, "", invalid("a Redis Cluster has one database: no database number in the path or db=")
	}
	var addrs []string
	for h := range strings.SplitSeq(u.Host, ",") {
		if h == "" {
			return nil, "", invalid("empty seed node in the cluster URL host list")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = h, "6379"
			if strings.Contains(h, ":") && !strings.HasPrefix(h, "[") {
				return nil, "", invalid("seed node %q is not host or host:port", h)
			}
			host = strings.Trim(host, "[]")
		}
		if host == "" || port == "" {
			return nil, "", invalid("seed node %q is not host or host:port", h)
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	if len(addrs) == 0 {
		return nil, "", invalid("a cluster URL names at least one seed node")
	}
	pass := url.Values{}
	for name, spec := range redisParams {
		if name == "db" || !p.Has(name) {
			continue
		}
		s, err := p.String(name, "")
		if err != nil {
			return nil, "", fmt.Errorf("redislock: %w", err)
		}
		if err := checkRedisParam(name, spec, s); err != nil {
			return nil, "", err
		}
		switch name { // older names that only redis.ParseURL knows
		case "idle_timeout":
			name = "conn_max_idle_time"
		case "max_conn_age":
			name = "conn_max_lifetime"
		}
		if pass.Has(name) {
			return nil, "", invalid("URL parameter %s is given twice (under its older name too)", name)
		}
		pass.Set(name, s)
	}
	for _, a := range addrs[1:] {
		pass.Add("addr", a)
	}
	c := url.URL{Scheme: Scheme, User: u.User, Host: addrs[0], RawQuery: pass.Encode()}
	opt, err := redis.ParseClusterURL(c.String())
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return nil, "", invalid("URL does not parse")
		}
		return nil, "", fmt.Errorf("%w: redislock: %v", driver.ErrInvalid, err)
	}
	return opt, addrs[0], nil
}

// persistence reads the persistence settings of the server or, in a cluster, of
// every master, and returns the least durable (with the lowest version, so that
// WAITAOF is used only if every master has it, and the eviction settings of a
// master that may evict keys, if any).
func (b *Backend) readPersistence(ctx context.Context) (Persistence, error) {
	cc, ok := b.rdb.(*redis.ClusterClient)
	if !ok {
		return readPersistence(ctx, b.rdb)
	}
	var mu sync.Mutex
	var all []Persistence
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		p, err := readPersistence(ctx, m)
		mu.Lock()
		all = append(all, p)
		mu.Unlock()
		return err
	})
	if err != nil || len(all) == 0 {
		return Persistence{}, err
	}
	w := all[0]
	for _, p := range all[1:] {
		if w.Durable() && !p.Durable() || w.Known && !p.Known || w.AppendOnly && !p.AppendOnly && p.Known {
			v := w.Version
			w = p
			if versionLess(v, w.Version) {
				w.Version = v
			}
		} else if versionLess(p.Version, w.Version) {
			w.Version = p.Version
		}
	}
	// and a master that may evict keys, if any.
	for _, p := range all {
		if p.Evicts() {
			w.MaxMemory, w.EvictionPolicy = p.MaxMemory, p.EvictionPolicy
			break
		}
	}
	return w, nil
}

// versionLess reports whether Redis version a (major.minor) is below b.
func versionLess(a, b string) bool {
	var am, an, bm, bn int
	if _, err := fmt.Sscanf(a, "%d.%d", &am, &an); err != nil {
		return true
	}
	if _, err := fmt.Sscanf(b, "%d.%d", &bm, &bn); err != nil {
		return false
	}
	return am < bm || am == bm && an < bn
}

// scriptNode returns the client that runs a script with WAIT: b.rdb, or in a
// cluster the master that owns key's slot (WAIT counts the replicas of the node
// it runs on, which must be the one that ran the script, on the same connection).
func (b *Backend) scriptNode(ctx context.Context, key string) (redis.Cmdable, error) {
	cc, ok := b.rdb.(*redis.ClusterClient)
	if !ok {
		return b.rdb, nil
	}
	return cc.MasterForKey(ctx, key)
}

// redirected reports whether err is a cluster redirection (MOVED, ASK) or a
// slot in transit (TRYAGAIN, CLUSTERDOWN), after which a script sent to the
// master that was thought to own the slot did not run there; it then asks the
// client to reload the slot map and waits a moment before another attempt.
func (b *Backend) redirected(ctx context.Context, err error, attempt int) bool {
	cc, ok := b.rdb.(*redis.ClusterClient)
	if !ok || err == nil || attempt >= 20 {
		return false
	}
	for _, p := range []string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN"} {
		if redis.HasErrorPrefix(err, strings.TrimSpace(p)) {
			cc.ReloadState(ctx)
			t := time.NewTimer(time.Duration(attempt+1) * 10 * time.Millisecond)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return false
			case <-t.C:
				return true
			}
		}
	}
	return false
}
