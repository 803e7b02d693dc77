package redlock

import (
	"fmt"
	"strings"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Defaults.
const (
	DefaultPrefix      = "redlock"
	DefaultNodeTimeout = 10 * time.Millisecond
	DefaultDialTimeout = 2 * time.Second
	DefaultDrift       = 0.01
	DefaultDriftFixed  = 2 * time.Millisecond
)

// Option configures a Backend.
type Option func(*config) error

type config struct {
	prefix        string
	nodeTimeout   time.Duration
	dialTimeout   time.Duration
	drift         float64
	driftFixed    time.Duration
	allowFew      bool
	allowEviction bool
}

// newConfig applies opts, in order, to the defaults.
func newConfig(opts []Option) (config, error) {
	cfg := config{prefix: DefaultPrefix, nodeTimeout: DefaultNodeTimeout, dialTimeout: DefaultDialTimeout,
		drift: DefaultDrift, driftFixed: DefaultDriftFixed}
	for _, o := range opts {
		if o == nil {
			return config{}, fmt.Errorf("%w: nil redlock option", driver.ErrInvalid)
		}
		if err := o(&cfg); err != nil {
			return config{}, err
		}
	}
	return cfg, nil
}

// WithPrefix sets the key namespace (default "redlock"): non-empty, without spaces
// or control characters (the byte 0x1f separates a key name's parts; see the key
// layout in names.go). Clients that should contend for the same locks must use the
// same prefix; clients with different prefixes never share a key, whatever their
// lock names.
func WithPrefix(p string) Option {
	return func(c *config) error {
		if p == "" || strings.ContainsFunc(p, func(r rune) bool { return r == ' ' || r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("%w: redlock key prefix must be non-empty and without spaces or control characters, got %q", driver.ErrInvalid, p)
		}
		c.prefix = p
		return nil
	}
}

// WithNodeTimeout bounds each call to one node (default 10ms): a dead or stopped node
// delays an operation by at most this much. Keep it well below the lease validity,
// and above a round trip to the farthest node (plus a TLS handshake when a connection
// must be made).
func WithNodeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: node timeout must be positive, got %v", driver.ErrInvalid, d)
		}
		c.nodeTimeout = d
		return nil
	}
}

// WithDialTimeout bounds connecting to a node and the checks Open makes (default
// 2s). It is the dial_timeout URL parameter; New, whose clients are the caller's,
// ignores it.
func WithDialTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: dial timeout must be positive, got %v", driver.ErrInvalid, d)
		}
		c.dialTimeout = d
		return nil
	}
}

// WithDrift sets the clock drift allowance the backend subtracts from the TTL when it
// checks that a grant or renewal is still valid (default 1% of the TTL plus 2ms). The
// core applies its own allowance (dlock.WithDrift) on top; set both when clocks may
// run at different rates.
func WithDrift(factor float64, fixed time.Duration) Option {
	return func(c *config) error {
		if factor < 0 || factor >= 0.5 || factor != factor || fixed < 0 {
			return fmt.Errorf("%w: drift needs a factor in [0, 0.5) and a non-negative fixed part, got %v and %v", driver.ErrInvalid, factor, fixed)
		}
		c.drift, c.driftFixed = factor, fixed
		return nil
	}
}

// WithAllowEviction makes Open accept nodes that may evict keys under memory
// pressure (maxmemory set, maxmemory-policy other than noeviction), which Open
// otherwise refuses: such nodes may drop held locks together, a majority at once
// under the same load, and only fencing tokens protect the resource then.
func WithAllowEviction() Option {
	return func(c *config) error {
		c.allowEviction = true
		return nil
	}
}

// WithAllowFewNodes accepts 1 or 2 nodes, which give no fault tolerance (see the
// package documentation). Without it New and Open refuse fewer than 3 nodes.
func WithAllowFewNodes() Option {
	return func(c *config) error {
		c.allowFew = true
		return nil
	}
}
