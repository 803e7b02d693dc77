package redislock

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dlockio/dlock/driver"
)

// DefaultPrefix is the default key namespace.
const DefaultPrefix = "dlock"

// Option configures a Backend. An option given a bad value makes Open and New
// return an error matching driver.ErrInvalid.
type Option func(*config) error

// config holds every setting of a Backend.
type config struct {
	prefix         string
	replicas       int
	replicaTimeout time.Duration
	strict         bool
	allowEviction  bool
	logger         *slog.Logger
	cluster        bool // Redis Cluster key layout (cluster.go): set by New for a *redis.ClusterClient
}

func defaultConfig() config {
	return config{prefix: DefaultPrefix, logger: slog.New(slog.DiscardHandler)}
}

// invalid returns an error matching driver.ErrInvalid.
func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: redislock: %s", driver.ErrInvalid, fmt.Sprintf(format, a...))
}

// WithPrefix sets the key namespace (default "dlock"): non-empty, without spaces or
// control characters (the byte 0x1f separates a key name's parts; see the key layout
// in names.go). Clients that should contend for the same locks must use the same
// prefix; clients with different prefixes never share a key, whatever their lock
// names (prefix "a" with lock "b:lock:c" and prefix "a:lock:b" with lock "c" are
// two locks).
func WithPrefix(p string) Option {
	return func(c *config) error {
		if p == "" || strings.ContainsFunc(p, func(r rune) bool { return r == ' ' || r < 0x20 || r == 0x7f }) {
			return invalid("key prefix must be non-empty and without spaces or control characters, got %q", p)
		}
		c.prefix = p
		return nil
	}
}

// WithReplicas makes every acquire and refresh wait until n replicas acknowledged
// it (WAIT n timeout, sent on the same connection in the same round trip). Fewer
// acknowledgements within timeout fail the operation; a failed acquire is released
// again. A grant handed over at release is not used as it is then: the waiter's own
// attempt re-enters it, followed by WAIT (a handoff costs two requests again). This
// narrows, but does not close, the failover window of asynchronous replication: a
// replica that acknowledged has the grant in memory, not on disk, and Redis does not
// promise to promote that replica. Fencing tokens still matter.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(c *config) error {
		if n < 0 || n > 64 {
			return invalid("replicas must be between 0 and 64, got %d", n)
		}
		if n > 0 && timeout < time.Millisecond {
			return invalid("replica timeout must be at least 1ms (WAIT 0 would block forever), got %v", timeout)
		}
		c.replicas, c.replicaTimeout = n, timeout
		return nil
	}
}

// WithStrict makes Verify refuse a server that cannot keep a grant across its own
// crash and restart (see ErrNotDurable).
func WithStrict() Option {
	return func(c *config) error {
		c.strict = true
		return nil
	}
}

// WithAllowEviction makes Verify accept a server that may evict keys under memory
// pressure (see ErrEvicts): a held lock may then vanish, and only fencing tokens
// protect the resource. For a shared cache whose policy cannot change.
func WithAllowEviction() Option {
	return func(c *config) error {
		c.allowEviction = true
		return nil
	}
}

// WithLogger sets where the backend reports the server's persistence settings and
// replication trouble (default: discard). go-redis itself logs connection trouble
// (failed dials, pool errors) through its own process-wide logger, which a library
// should not replace behind its user's back: route it with redis.SetLogger, as the
// dlock command does (to its --log-level logger at Debug).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	}
}

// urlOptions reads the URL parameters that are options: prefix, replicas,
// replica_timeout, strict and allow_eviction.
func urlOptions(p *driver.Params) ([]Option, error) {
	prefix, err := p.String("prefix", DefaultPrefix)
	if err != nil {
		return nil, err
	}
	opts := []Option{WithPrefix(prefix)}
	n, err := p.Int("replicas", 0)
	if err != nil {
		return nil, err
	}
	timeout, err := p.Duration("replica_timeout", 50*time.Millisecond)
	if err != nil {
		return nil, err
	}
	if n > 0 {
		opts = append(opts, WithReplicas(n, timeout))
	}
	strict, err := p.Bool("strict", false)
	if err != nil {
		return nil, err
	}
	if strict {
		opts = append(opts, WithStrict())
	}
	evict, err := p.Bool("allow_eviction", false)
	if err != nil {
		return nil, err
	}
	if evict {
		opts = append(opts, WithAllowEviction())
	}
	return opts, nil
}
