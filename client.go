package dlock

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
)

// Token is a fencing token: strictly larger for every later grant of the same key, as
// far as the backend can promise (see its documentation). 0 means the backend cannot
// fence.
type Token uint64

// Client takes locks on one backend. It is safe for concurrent use. Close it to
// release what it still holds and stop its goroutines.
type Client struct {
	b        driver.Backend
	notifier driver.Notifier      // nil when the backend cannot notify
	bounder  driver.Bounder       // nil unless grants live on a backend-kept session
	advisor  driver.WatchAdvisor  // nil unless the notifier advises
	valuer   driver.Valuer        // nil unless grants carry values
	watcher  driver.HolderWatcher // nil unless holders can be watched
	sem      driver.Semaphorer    // nil unless keys can have several holders
	shares   bool                 // the backend honours Request.Shared
	cfg      config
	obs      Observer // the events' observer, or nil
	name     string   // the backend's package name, for events

	closing chan struct{} // closed by Close
	wg      sync.WaitGroup
	giving  chan struct{} // a slot per background release under way (releaseAsync)
	ren     renewer

	mu     sync.Mutex
	closed bool
	slots  map[slotKey]*slot
}

// New returns a client for a backend, bypassing the URL registry. The client owns b
// and closes it in Close.
func New(b driver.Backend, opts ...Option) (*Client, error) {
	if b == nil {
		return nil, invalid("nil backend")
	}
	cfg, err := defaultConfig().with(opts)
	if err != nil {
		return nil, err
	}
	c := &Client{b: b, cfg: cfg, closing: make(chan struct{}), giving: make(chan struct{}, maxBackgroundReleases), slots: make(map[slotKey]*slot)}
	c.ren.clk, c.ren.base, c.ren.lazy = cfg.clock, cfg.clock.Now(), cfg.clock == clock.Real
	c.notifier, _ = b.(driver.Notifier)
	c.bounder, _ = b.(driver.Bounder)
	c.valuer, _ = b.(driver.Valuer)
	c.watcher, _ = b.(driver.HolderWatcher)
	c.sem, _ = b.(driver.Semaphorer)
	c.obs, c.name = cfg.observer, backendName(b)
	if s, ok := b.(driver.Sharer); ok {
		c.shares = s.Shares()
	}
	if c.notifier != nil {
		c.advisor, _ = b.(driver.WatchAdvisor)
	}
	return c, nil
}

// Core URL parameters, read by Open before the backend sees the URL.
var coreParams = []string{"ttl", "renew", "drift", "owner"}

// Open opens a client for the backend named by the URL scheme (redis, rediss, unix,
// mem, ...), which must have been registered by importing the backend package (or
// github.com/dlockio/dlock/all). The query parameters ttl, renew, drift (a fraction
// of the TTL) and owner set the matching options; every other parameter belongs to
// the backend, which rejects unknown ones. Options given here override the URL. A
// query that does not decode cleanly (a bad %-escape, a ';') is an error, not a
// setting dropped. Where the backend takes several servers (etcd, zk, redlock) the
// host part may list them: etcd://h1:2379,h2/prefix. Error messages never contain
// the URL's password; one that matches ErrAuth means the backend refused the
// credentials.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Client, error) {
	u, err := driver.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "" {
		return nil, invalid("backend URL has no scheme; registered schemes: %s", strings.Join(driver.Schemes(), ", "))
	}
	open, ok := driver.Lookup(u.Scheme)
	if !ok {
		return nil, invalid("unknown backend scheme %q; registered schemes: %s (import the backend package or github.com/dlockio/dlock/all)", u.Scheme, strings.Join(driver.Schemes(), ", "))
	}
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, err
	}
	var urlOpts []Option
	if d, err := p.Duration("ttl", 0); err != nil {
		return nil, err
	} else if d > 0 {
		urlOpts = append(urlOpts, WithTTL(d))
	}
	if d, err := p.Duration("renew", 0); err != nil {
		return nil, err
	} else if d > 0 {
		urlOpts = append(urlOpts, WithRenewInterval(d))
	}
	if f, err := p.Float("drift", -1); err != nil {
		return nil, err
	} else if f >= 0 {
		urlOpts = append(urlOpts, WithDrift(f, DefaultDriftFixed))
	}
	if s, err := p.String("owner", ""); err != nil {
		return nil, err
	} else if s != "" {
		urlOpts = append(urlOpts, WithOwner(s))
	}
	all := append(urlOpts, opts...)
	if _, err := defaultConfig().with(all); err != nil {
		return nil, err
	}
	b, err := open(ctx, driver.Without(u, coreParams...))
	if err != nil {
		return nil, err
	}
	return New(b, all...)
}

// Backend returns the client's backend, for backend-specific accessors. The
// administrative capabilities need no type assertion: see Inspect and
// ForceRelease.
func (c *Client) Backend() driver.Backend { return c.b }

// Lock acquires key, waiting until it is free or ctx ends. When ctx ends first, the
// error matches both ErrLocked and ctx.Err(). A waiter that gives up withdraws from
// any server-side queue before Lock returns.
func (c *Client) Lock(ctx context.Context, key string, opts ...Option) (*Lease, error) {
	return c.lock(ctx, key, opts, true)
}

// TryLock makes one attempt to acquire key; it returns an error matching ErrLocked
// when another owner holds it, or this owner id holds it through another Client or
// process (see WithOwner and WithResume).
func (c *Client) TryLock(ctx context.Context, key string, opts ...Option) (*Lease, error) {
	return c.lock(ctx, key, opts, false)
}

// Do acquires key (waiting, like Lock), runs fn with a context that is cancelled when
// ctx ends or the lease may be lost, and releases the lease. If the lease was lost
// while fn ran, the error matches ErrLeaseLost even when fn returned nil: fn's work may
// have overlapped another holder's, and only fencing tokens protect against that.
//
// The lease is released even if fn panics (the panic then continues).
func (c *Client) Do(ctx context.Context, key string, fn func(ctx context.Context, l *Lease) error, opts ...Option) (err error) {
	l, err := c.Lock(ctx, key, opts...)
	if err != nil {
		return err
	}
	defer func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.TTL())
		defer rcancel()
		err = driver.Join(err, l.Release(rctx))
	}()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	defer stop()
	return fn(fctx, l)
}

// newOwner returns a fresh random 128-bit owner id, in hex, from crypto/rand.
func (c *Client) newOwner() string { return driver.RandomHex(16) }

// withdrawCtx bounds server-side clean-up that must happen even when ctx has ended.
func (c *Client) withdrawCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), maxWithdrawTimeout)
}

// releaseAsync gives back a grant whose acquire reply may have been lost, without
// making the caller wait; Close waits for it. At most maxBackgroundReleases run at
// once: calls cut short in a storm (each may leave such a grant) must not open
// a server connection each, all queued on the same key behind its holders, and
// starve the calls still under way. A release that does not get its turn within
// maxReleaseInClose is dropped: a grant it would have given back expires after its
// TTL, as when a release fails. One that gets its turn has maxReleaseInClose from
// then (the wait for its turn is not taken from it). Both windows run on the
// client's clock.
func (c *Client) releaseAsync(key, owner string) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		clk := c.cfg.clock
		turn := clk.NewTimer(maxReleaseInClose)
		select {
		case c.giving <- struct{}{}:
			turn.Stop()
		case <-turn.C():
			c.cfg.logger.Debug("dlock: background release dropped", "key", key, "err", context.DeadlineExceeded)
			return
		}
		defer func() { <-c.giving }()
		ctx, cancel := context.WithCancelCause(context.Background())
		bound := clk.AfterFunc(maxReleaseInClose, func() { cancel(context.DeadlineExceeded) })
		defer func() {
			bound.Stop()
			cancel(context.Canceled)
		}()
		if err := c.b.Release(ctx, key, owner); err != nil && !errors.Is(err, driver.ErrNotHeld) {
			c.cfg.logger.Debug("dlock: background release", "key", key, "err", err)
		}
	}()
}

// jitter returns a random duration in [lo, hi].
func jitter(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + mrand.N(hi-lo+1)
}

// Close releases every lease the client still holds (their contexts are cancelled
// with cause ErrReleased), stops every goroutine the client started, makes waiting
// Lock calls return ErrClosed, and closes the backend. Release on the server is
// bounded by a short timeout; a grant that cannot be released expires after its TTL.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
	var live []*grant
	for sk, s := range c.slots {
		if s.g != nil {
			live = append(live, s.g)
			s.g = nil
			c.dropLocked(sk, s)
		}
	}
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), maxReleaseInClose)
	defer cancel()
	var errs []error
	for _, g := range live {
		g.stopRenewal()
		var err error
		if !g.ended() {
			if err = c.b.Release(ctx, g.key, g.owner); err != nil && !errors.Is(err, ErrNotHeld) {
				err = fmt.Errorf("dlock: release %q on close: %w", g.key, err)
				errs = append(errs, err)
			}
			if c.obs != nil {
				g.event(ctx, EventReleased, g.cfg.clock.Now().Sub(g.since), err)
			}
		}
		g.end(fmt.Errorf("%w: client closed", ErrReleased))
	}
	c.wg.Wait()
	c.ren.stop()
	if err := c.b.Close(); err != nil {
		errs = append(errs, err)
	}
	return driver.Join(errs...)
}
