package dlock

import (
	"bytes"
	"fmt"
	"log/slog"
	"time"

	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
)

// Defaults.
const (
	DefaultTTL        = 15 * time.Second
	DefaultDrift      = 0.01                  // fraction of the TTL
	DefaultDriftFixed = 2 * time.Millisecond  // added to the fraction
	DefaultRetryMin   = 10 * time.Millisecond // first backoff when polling
	DefaultRetryMax   = time.Second           // backoff cap, and fallback when notified
	// DefaultObserveInterval is how often Observe reads the holder of a name on a
	// backend that cannot watch holders (see WithObserveInterval).
	DefaultObserveInterval = time.Second
	maxReleaseInClose      = 2 * time.Second
	maxWithdrawTimeout     = time.Second
	maxBackgroundReleases  = 4 // per Client (releaseAsync)
)

// Option configures a Client (New, Open) or a single lock call (Lock, TryLock, Do).
// WithLogger and WithClock apply only to a Client; given to a lock call they are an
// error. Options never modify the caller's data.
type Option func(*config) error

type config struct {
	ttl        time.Duration
	renew      time.Duration // 0 = ttl/3
	drift      float64
	driftFixed time.Duration
	retryMin   time.Duration
	retryMax   time.Duration
	owner      string
	resume     bool
	onQueued   func(ahead int)
	value      []byte
	limit      int // holders admitted at once; 0 is 1
	shared     bool
	observe    time.Duration // Observe's polling interval
	observer   Observer
	logger     *slog.Logger
	clock      clock.Clock
	perLock    bool
}

func defaultConfig() config {
	return config{
		ttl:        DefaultTTL,
		drift:      DefaultDrift,
		driftFixed: DefaultDriftFixed,
		retryMin:   DefaultRetryMin,
		retryMax:   DefaultRetryMax,
		observe:    DefaultObserveInterval,
		logger:     slog.New(slog.DiscardHandler),
		clock:      clock.Real,
	}
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
}

// WithTTL sets how long the server keeps a grant without renewal (default 15s). A
// crashed holder blocks others for at most this long.
func WithTTL(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("TTL must be positive, got %v", d)
		}
		c.ttl = d
		return nil
	}
}

// WithRenewInterval sets how often a held lease is renewed (default TTL/3). It must
// be shorter than the lease validity, TTL minus the drift allowance.
func WithRenewInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("renew interval must be positive, got %v", d)
		}
		c.renew = d
		return nil
	}
}

// WithDrift sets the clock drift allowance: the local validity deadline is
// TTL - (TTL*factor + fixed) after the acquire or renewal was sent (default 1% of the
// TTL plus 2ms). Raise it when clocks may run at different rates.
func WithDrift(factor float64, fixed time.Duration) Option {
	return func(c *config) error {
		if factor < 0 || factor >= 0.5 || factor != factor {
			return invalid("drift factor must be in [0, 0.5), got %v", factor)
		}
		if fixed < 0 {
			return invalid("fixed drift must not be negative, got %v", fixed)
		}
		c.drift, c.driftFixed = factor, fixed
		return nil
	}
}

// WithRetry sets the backoff of a waiting Lock: on a backend that cannot notify,
// attempts are spaced from min doubling up to max, with full jitter; on a backend that
// notifies, max (jittered) bounds the wait for a wake-up that was lost, scaled up to 4x
// for a waiter the backend reports deep in its queue (driver.HeldError.Ahead), where
// the key cannot come before the waiters ahead have had it. Defaults: 10ms and 1s.
func WithRetry(min, max time.Duration) Option {
	return func(c *config) error {
		if min <= 0 || max < min {
			return invalid("retry needs 0 < min <= max, got min %v max %v", min, max)
		}
		c.retryMin, c.retryMax = min, max
		return nil
	}
}

// WithOwner sets the owner id (1 to 128 bytes of [A-Za-z0-9._:-]). Without it, every
// lock call uses a fresh random 128-bit id from crypto/rand.
//
// Within one Client, a lock call whose owner id holds the key through a lease of
// that Client re-enters it: it succeeds at once with the same token, and the key is
// freed when every such lease has been released. Re-entry is counted in the Client
// and never reaches the server. Elsewhere (another Client, another process) the same
// owner id is refused like any other owner while the key is held: TryLock returns an
// error matching ErrLocked, Lock waits until the key is free (polling on the
// fallback timer, see WithRetry, since nothing wakes a waiter refused this way), and
// its Release cannot free the holder's grant. So two processes that share an owner
// id (two runs of one cron job) still exclude each other. To take over a grant this
// owner id holds after a restart, use WithResume.
func WithOwner(id string) Option {
	return func(c *config) error {
		if err := driver.ValidateOwner(id); err != nil {
			return err
		}
		c.owner = id
		return nil
	}
}

// WithResume makes a lock call with a stable owner id (WithOwner, on the call or the
// Client) take over the grant that owner id holds on the server, if it holds one,
// with the same token and a fresh TTL: for a process restarted with a stable owner
// id, to pick up the lease its previous run held instead of waiting for it to
// expire. If the key is free or held by another owner, the call behaves as without
// it.
//
// The caller asserts that no other live Client or process uses that owner id. If one
// does and holds the key, both hold it at once with one token, and fencing cannot
// tell them apart: use WithResume only where the owner id is unique to one running
// process.
func WithResume() Option {
	return func(c *config) error {
		c.resume = true
		return nil
	}
}

// WithQueueReport makes a waiting Lock (or Do) call fn after each attempt that left
// it queued on the server, with the number of places ahead of its own (0: next in
// line), for a progress display. It is called only when the backend tells
// (driver.HeldError.Queued: memlock, etcd, ZooKeeper, Redlock, and PostgreSQL, which
// counts up to 8); never on redislock. fn runs on the waiting call's goroutine
// and must return quickly.
func WithQueueReport(fn func(ahead int)) Option {
	return func(c *config) error {
		if fn == nil {
			return invalid("nil queue report function")
		}
		c.onQueued = fn
		return nil
	}
}

// WithValue stores value (at most 4096 bytes) with the grant a lock call makes,
// for others to read with Client.Inspect or Client.Leader: a leader's address, a
// job's host and pid. Campaign's value argument sets it too. A lock call that
// re-enters a grant this Client already holds does not change the stored value
// (use Leadership.Proclaim). On a backend that cannot store values (not a
// driver.Valuer) a lock call with a non-empty value fails with an error matching
// ErrUnsupported. The value is copied.
func WithValue(value []byte) Option {
	return func(c *config) error {
		if err := driver.ValidateValue(value); err != nil {
			return err
		}
		c.value = bytes.Clone(value)
		return nil
	}
}

// WithLimit makes a lock call take one of n permits of key (a semaphore): up to n
// owners hold key at once, each with its own lease, renewal, token and release;
// the next caller waits (FIFO) until one of them releases or expires. n is part
// of the key's state while it is held or waited for: a call with another n (a
// Lock without WithLimit counts as n = 1) fails with an error matching
// ErrLimitMismatch. Every grant's token, of any permit, is larger than every
// earlier grant's of key. n from 1 to 1,000,000; 1 is an ordinary lock. On a
// backend that cannot keep the promise (not a driver.Semaphorer) a call with
// n > 1 fails with an error matching ErrUnsupported.
func WithLimit(n int) Option {
	return func(c *config) error {
		if n < 1 || n > MaxLimit {
			return invalid("holder limit must be from 1 to %d, got %d", MaxLimit, n)
		}
		c.limit = n
		return nil
	}
}

// WithShared makes a lock call take key shared, as a reader of a read-write lock:
// shared holders of a key hold it together, while a lock call without WithShared
// (a writer) holds it alone. Waiting is FIFO, so a reader that arrives after a
// queued writer waits behind it: a stream of readers cannot starve a writer. Every
// grant, shared or not, has a token larger than every earlier grant's of key, so a
// writer's token exceeds every earlier reader's. An owner id that holds key one
// way cannot take it the other way through the same Client (an error matching
// ErrInvalid: release it first; there is no upgrade or downgrade). Not with
// WithLimit above 1. On a backend that cannot keep the promise (not a
// driver.Sharer) a shared lock call fails with an error matching ErrUnsupported.
func WithShared() Option {
	return func(c *config) error {
		c.shared = true
		return nil
	}
}

// MaxLimit is the largest holder limit WithLimit takes.
const MaxLimit = 1_000_000

// WithObserveInterval sets how often Observe reads the holder of a name on a
// backend that cannot watch holders (not a driver.HolderWatcher), so a change is
// seen up to d late there (default 1s). On a backend that watches, Observe reads
// on each notification, when the holder's TTL runs out, and every 30 times d as a
// guard against a lost notification.
func WithObserveInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("observe interval must be positive, got %v", d)
		}
		c.observe = d
		return nil
	}
}

// WithLogger sets the client's logger (default: discard). Lease loss is logged at
// Warn, renewal trouble at Debug and Warn.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if c.perLock {
			return invalid("WithLogger applies to a Client, not to a lock call")
		}
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	}
}

// WithClock sets the client's clock (default: the real monotonic clock). Tests and
// the fault checker use a fake clock.
func WithClock(clk clock.Clock) Option {
	return func(c *config) error {
		if c.perLock {
			return invalid("WithClock applies to a Client, not to a lock call")
		}
		if clk == nil {
			return invalid("nil clock")
		}
		c.clock = clk
		return nil
	}
}

func (c config) with(opts []Option) (config, error) {
	for _, o := range opts {
		if o == nil {
			return c, invalid("nil option")
		}
		if err := o(&c); err != nil {
			return c, err
		}
	}
	return c, c.validate()
}

// driftFor is the drift allowance subtracted from the TTL.
func (c config) driftFor() time.Duration {
	return time.Duration(float64(c.ttl)*c.drift) + c.driftFixed
}

// validity is how long a grant is trusted locally after its request was sent.
func (c config) validity() time.Duration { return c.ttl - c.driftFor() }

func (c config) renewEvery() time.Duration {
	if c.renew > 0 {
		return c.renew
	}
	return c.ttl / 3
}

func (c config) validate() error {
	if c.resume && c.owner == "" {
		return invalid("WithResume needs a stable owner id (WithOwner)")
	}
	if c.shared && c.limit > 1 {
		return invalid("WithShared and WithLimit(%d) do not go together: a read-write lock has one writer", c.limit)
	}
	v := c.validity()
	if v <= 0 {
		return invalid("TTL %v leaves no validity after the drift allowance %v", c.ttl, c.driftFor())
	}
	if r := c.renewEvery(); r >= v {
		return invalid("renew interval %v must be shorter than the lease validity %v (TTL %v minus drift %v)", r, v, c.ttl, c.driftFor())
	}
	return nil
}
