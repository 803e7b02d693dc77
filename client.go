package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
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
	notifier driver.Notifier     // nil when the backend cannot notify
	bounder  driver.Bounder      // nil unless grants live on a backend-kept session
	advisor  driver.WatchAdvisor // nil unless the notifier advises
	cfg      config

	closing chan struct{} // closed by Close
	wg      sync.WaitGroup
	ren     renewer

	mu     sync.Mutex
	closed bool
	slots  map[slotKey]*slot
}

type slotKey struct{ key, owner string }

// slot serialises the server-side work of one (key, owner): acquiring, and releasing
// the last reference. Re-entry into a live grant needs only Client.mu. Its fields are
// guarded by Client.mu.
type slot struct {
	busy   bool            // someone is talking to the server for this (key, owner)
	mapped bool            // it is Client.slots' entry for its (key, owner)
	queue  []chan struct{} // callers waiting for busy to clear, oldest first
	g      *grant          // the live grant, or nil
	users  int             // lock calls inside acquire
}

// enterLocked makes the caller the slot's only user of the server, waiting, if it
// must, until ctx or stop ends (then it returns false). It is called with Client.mu
// held and returns with Client.mu held; waited reports whether it let go of it.
func (c *Client) enterLocked(ctx context.Context, s *slot, stop <-chan struct{}) (ok, waited bool) {
	if !s.busy {
		s.busy = true
		return true, false
	}
	ch := make(chan struct{})
	s.queue = append(s.queue, ch)
	c.mu.Unlock()
	select {
	case <-ch:
		c.mu.Lock()
		return true, true
	case <-ctx.Done():
	case <-stop:
	}
	c.mu.Lock()
	for i, q := range s.queue {
		if q == ch {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return false, true
		}
	}
	// The slot was passed to us as we gave up: pass it on.
	c.leaveLocked(s)
	return false, true
}

// leaveLocked passes the slot to the next waiting caller, or frees it.
func (c *Client) leaveLocked(s *slot) {
	if len(s.queue) > 0 {
		ch := s.queue[0]
		s.queue = s.queue[1:]
		close(ch)
		return
	}
	s.busy = false
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
	c := &Client{b: b, cfg: cfg, closing: make(chan struct{}), slots: make(map[slotKey]*slot)}
	c.ren.clk, c.ren.base, c.ren.lazy = cfg.clock, cfg.clock.Now(), cfg.clock == clock.Real
	c.notifier, _ = b.(driver.Notifier)
	c.bounder, _ = b.(driver.Bounder)
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

// Backend returns the client's backend, for optional capabilities (Inspector,
// ForceReleaser) and backend-specific accessors.
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
		err = errors.Join(err, l.Release(rctx))
	}()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	defer stop()
	return fn(fctx, l)
}

// newOwner returns a fresh random 128-bit owner id, in hex, from crypto/rand.
func (c *Client) newOwner() string { return driver.RandomHex(16) }

func (c *Client) lock(ctx context.Context, key string, opts []Option, wait bool) (*Lease, error) {
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	cfg := &c.cfg // shared with the grant unless this call has options
	if len(opts) > 0 {
		own := c.cfg
		own.perLock = true
		var err error
		if own, err = own.with(opts); err != nil {
			return nil, err
		}
		cfg = &own
	}
	owner := cfg.owner
	generated := owner == ""
	if generated {
		owner = c.newOwner()
	}
	sk := slotKey{key, owner}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	var s *slot
	if !generated { // a fresh random owner has no slot yet
		s = c.slots[sk]
	}
	if s == nil {
		s = &slot{mapped: true}
		c.slots[sk] = s
	}
	if l := c.reenterLocked(s); l != nil {
		c.mu.Unlock()
		return l, nil
	}
	s.users++
	ok, waited := c.enterLocked(ctx, s, c.closing)
	if !ok {
		s.users--
		c.dropLocked(sk, s)
		c.mu.Unlock()
		if ctx.Err() == nil {
			return nil, ErrClosed
		}
		return nil, ctxErr(ctx, wait)
	}
	if waited {
		// Another call of the same owner may have acquired meanwhile.
		if l := c.reenterLocked(s); l != nil {
			s.users--
			c.leaveLocked(s)
			c.mu.Unlock()
			return l, nil
		}
	}
	c.wg.Add(1)
	c.mu.Unlock()

	g, now, err := c.obtain(ctx, key, owner, cfg, wait, generated)

	c.mu.Lock()
	l, err := c.settleLocked(sk, s, g, now, err)
	c.mu.Unlock()
	c.wg.Done()
	return l, err
}

// settleLocked ends a lock call's acquisition on slot s of sk: it hands the slot on
// and returns a lease on g, or err, or ErrClosed (giving g back) if Close ran
// meanwhile. Called with Client.mu held; not deferred, which on this path costs more
// than the call.
func (c *Client) settleLocked(sk slotKey, s *slot, g *grant, now time.Time, err error) (*Lease, error) {
	s.users--
	c.leaveLocked(s)
	if err != nil {
		c.dropLocked(sk, s)
		return nil, err
	}
	if c.closed {
		// Close ran while we were acquiring: give the grant back.
		c.dropLocked(sk, s)
		c.releaseAsync(sk.key, sk.owner)
		return nil, ErrClosed
	}
	g.slot = s
	s.g = g
	g.start(c, now)
	return g.newLease(), nil
}

// reenterLocked returns a new lease on the slot's live grant, or nil.
func (c *Client) reenterLocked(s *slot) *Lease {
	if s.g == nil || s.g.ended() {
		return nil
	}
	return s.g.newLease()
}

func (c *Client) dropLocked(sk slotKey, s *slot) {
	if s.users == 0 && s.g == nil && !s.busy && s.mapped {
		delete(c.slots, sk)
		s.mapped = false
	}
}

func ctxErr(ctx context.Context, wait bool) error {
	if wait {
		return waitEnded(ctx, nil)
	}
	return context.Cause(ctx)
}

// ended reports whether ctx has ended. A request cut short by ctx's deadline (a dial
// or read given that deadline fails with "i/o timeout") may return a moment before
// ctx's own timer marks it done: past the deadline, it waits for that.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		<-ctx.Done()
		return true
	}
	return false
}

// waitEnded is a waiting Lock's error when its ctx ended: it matches ErrLocked,
// ctx.Err() and context.Cause(ctx), whatever the request in flight returned; last,
// if not nil, is that request's error, kept for its text only (it may be anything
// that the end of ctx caused: a cancelled dial, a closed stream).
func waitEnded(ctx context.Context, last error) error {
	errs := []error{ErrLocked, ctx.Err()}
	if cause := context.Cause(ctx); cause != ctx.Err() {
		errs = append(errs, cause)
	}
	if last != nil && !errors.Is(last, ErrLocked) {
		errs = append(errs, errors.New(last.Error()))
	} else if last != nil {
		errs[0] = last
	}
	return errors.Join(errs...)
}

// obtain runs the attempt loop against the backend. It returns the grant and the
// client clock's time when it was granted.
func (c *Client) obtain(ctx context.Context, key, owner string, cfg *config, wait, generated bool) (g *grant, now time.Time, err error) {
	var st obtainState
	defer func() { c.afterObtain(ctx, key, owner, cfg, generated, &st, g != nil) }()
	return c.attempts(ctx, key, owner, cfg, wait, generated, &st)
}

// obtainState is what obtain's clean-up needs to know of its attempts.
type obtainState struct {
	w driver.Waiter // the wait registered with the backend's notifier, if any
	// A generated owner that may hold the key on the server (an attempt's reply
	// came too late, or its outcome is unknown) gives it back when this call fails,
	// and only then: the owner id is used by every attempt of this call, so a
	// release sent earlier could reach the server after a later attempt's grant
	// and delete it.
	mayHold bool
}

// afterObtain withdraws the wait, if one was registered, and gives back a key that
// a failed call of a generated owner may hold.
func (c *Client) afterObtain(ctx context.Context, key, owner string, cfg *config, generated bool, st *obtainState, acquired bool) {
	if st.w != nil {
		sctx, cancel := c.withdrawCtx(ctx)
		if err := st.w.Stop(sctx, acquired); err != nil {
			cfg.logger.Debug("dlock: withdraw waiter", "key", key, "err", err)
		}
		cancel()
	}
	if generated && st.mayHold && !acquired {
		c.releaseAsync(key, owner)
	}
}

// attempts is obtain's loop; st records what its clean-up needs.
//
// A stable owner id may be in use by another Client or process at the same time, so
// an attempt of this call must not take over a grant that owner id already holds on
// the server: the request says Reenter for every attempt of a generated owner id
// (this call's alone) or of a caller that resumes explicitly (WithResume); for a
// stable owner id, only on the one attempt that asks again for a grant handed to
// this call long ago, and its grant is used only if the reply comes while the
// handed grant was certainly still live.
func (c *Client) attempts(ctx context.Context, key, owner string, cfg *config, wait, generated bool, st *obtainState) (*grant, time.Time, error) {
	clk := cfg.clock
	req := driver.Request{Key: key, Owner: owner, TTL: cfg.ttl, Reenter: generated || cfg.resume}
	// A notified waiter attempts again, in case its wake-up was lost, after a
	// fallback interval jittered in [hi/2, hi], where hi grows with its place in
	// the queue (driver.HeldError.Ahead): retryMax times 1+log2(1+ahead) rounded
	// up, at most maxFallbackScale times retryMax. So a waiter whose wake-up is lost
	// when it reaches the head attempts again at most 4*retryMax (4s by default)
	// after its previous attempt, and at most retryMax after one that found it next
	// in line; a backend that does not report Ahead gets retryMax, as before.
	//
	// Each attempt asks the backend to keep the place for the longest interval that
	// may follow it (budget) plus 2*retryMax+1s for the attempt itself to arrive,
	// and the interval never exceeds the budget of the attempt before it, so a live
	// waiter's place never lapses. A waiter that dies leaves its place behind for at
	// most (maxFallbackScale+2)*retryMax+1s (7s by default; 4s, as before, after an
	// attempt that found it next in line); a backend passes over it when it lapses.
	const maxFallbackScale = 4
	budget := maxFallbackScale * cfg.retryMax
	patience := func(hi time.Duration) time.Duration { return hi + 2*cfg.retryMax + time.Second }
	// A waiting Lock registers its wait before the first attempt that may queue,
	// so that no wake-up is lost; when the backend advises that the key is likely
	// free, it tries first without (see driver.WatchAdvisor).
	watch := func() error {
		var err error
		if st.w, err = c.notifier.Watch(ctx, key, owner); err != nil {
			st.w = nil
			if ended(ctx) {
				return waitEnded(ctx, fmt.Errorf("wait for %q: %w", key, err))
			}
			return fmt.Errorf("dlock: wait for %q: %w", key, err)
		}
		req.Wait = true
		req.Patience = patience(budget)
		return nil
	}
	if wait && c.notifier != nil && (c.advisor == nil || c.advisor.WatchFirst(key)) {
		if err := watch(); err != nil {
			return nil, time.Time{}, err
		}
	}
	backoff := cfg.retryMin
	// own: the owner id is this call's alone, or the caller vouches for it (resume),
	// so re-entering whatever grant it holds is safe. A stable owner id's grant
	// made for this call is re-entered only by a re-ask whose reply comes while
	// that grant is certainly still live on the server (before trustUntil, its
	// validity deadline): a later reply may have re-entered a grant that another
	// process of the same owner id took after this call's expired.
	own := req.Reenter
	reasked, lateAgain := false, false
	var trustUntil time.Time
	for {
		sent := clk.Now()
		gr, err := c.b.Acquire(ctx, req)
		untrusted := false
		if req.Reenter && !own {
			// A stable owner id's re-ask, whatever its answer, is the last
			// attempt of this call that says Reenter.
			req.Reenter = false
			untrusted = clk.Now().After(trustUntil)
		}
		if err == nil {
			// The server started the grant's TTL no earlier than start: when this
			// attempt was sent, or, for a grant handed over at release, Age before.
			start, now := sent.Add(-gr.Age), clk.Now()
			if gr.Age > 0 && now.Sub(start) >= cfg.renewEvery() && !reasked {
				// Handed over long ago (the waiter's last attempt was old): ask the
				// server at once. The owner holds the key by this call's grant, so
				// the attempt re-enters it and the validity restarts from now.
				reasked = true
				req.Reenter, trustUntil = true, start.Add(cfg.validity())
				continue
			}
			deadline, cut := c.bound(key, owner, start.Add(cfg.validity()), now)
			if untrusted {
				deadline = now
			}
			if !deadline.After(now) {
				// Granted too late to be trusted (the reply took about the
				// validity). The owner holds the key by this call's grant: a
				// generated (or resumed) owner attempts again at once, which
				// re-enters it with a fresh TTL and a validity counted from then.
				// A stable owner id does not (by then the grant may have expired
				// and been taken by another process of that owner id): a waiting
				// Lock waits as if the key were held, until its grant expires.
				// A second late grant in a row says that the TTL is too short for
				// a request: a clear error of its own, not "locked" (nobody else
				// holds the key). A generated owner's grant is given back when
				// the call returns; a stable owner's expires after its TTL
				// (releasing it could delete a grant another process of that
				// owner id took meanwhile).
				st.mayHold = true
				switch {
				case !lateAgain && ctx.Err() == nil && own:
					lateAgain = true
					continue
				case !lateAgain && ctx.Err() == nil && wait:
					lateAgain = true
					err = &driver.HeldError{RetryAfter: cfg.ttl}
				default:
					err = fmt.Errorf("%w: %q granted %v after the attempt was sent, the lease validity is %v (TTL %v); raise the TTL",
						ErrValidityTooShort, key, now.Sub(sent).Round(time.Microsecond), cfg.validity(), cfg.ttl)
					if ctx.Err() != nil {
						if wait {
							return nil, time.Time{}, errors.Join(waitEnded(ctx, nil), err)
						}
						return nil, time.Time{}, errors.Join(err, context.Cause(ctx))
					}
					return nil, time.Time{}, err
				}
			} else {
				return newGrant(key, owner, cfg, gr, start, deadline, cut), now, nil
			}
		}
		if !errors.Is(err, ErrLocked) {
			// The outcome is unknown (a lost reply may hide a grant). A generated
			// owner id is this call's alone, so releasing it when the call
			// returns cannot hurt anyone.
			st.mayHold = true
			// Backends name themselves and the key in their errors.
			switch {
			case !ended(ctx):
				return nil, time.Time{}, err
			case wait:
				// The request was cut short by the end of a waiting Lock's
				// ctx: that is giving up the wait, as documented.
				return nil, time.Time{}, waitEnded(ctx, err)
			case !errors.Is(err, ctx.Err()):
				return nil, time.Time{}, errors.Join(err, context.Cause(ctx))
			}
			return nil, time.Time{}, err
		}
		if !wait {
			return nil, time.Time{}, err
		}
		if st.w == nil && c.notifier != nil && ctx.Err() == nil {
			// A waiter refused because its owner id holds the key elsewhere
			// registers too; nothing hands it that grant, its fallback timer
			// attempts again.
			if err := watch(); err != nil {
				return nil, time.Time{}, err
			}
			continue // attempt again at once, now waiting
		}
		var held *driver.HeldError
		isHeld := errors.As(err, &held)
		var d time.Duration
		if st.w != nil {
			scale := 1
			if isHeld && held.Ahead > 0 {
				scale = min(1+bits.Len(uint(held.Ahead)), maxFallbackScale)
			}
			hi := min(time.Duration(scale)*cfg.retryMax, budget)
			budget, req.Patience = hi, patience(hi)
			d = jitter(hi/2, hi)
		} else {
			d = jitter(0, backoff)
			backoff = min(2*backoff, cfg.retryMax)
		}
		if isHeld && held.RetryAfter > 0 && held.RetryAfter+time.Millisecond < d {
			d = held.RetryAfter + time.Millisecond
		}
		d = max(d, time.Millisecond)
		t := clk.NewTimer(d)
		var wake <-chan struct{}
		if st.w != nil {
			wake = st.w.C()
		}
		select {
		case <-wake:
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			// The last attempt's error matches ErrLocked and says why (the
			// holder's expiry, or which nodes refused).
			return nil, time.Time{}, waitEnded(ctx, err)
		case <-c.closing:
			t.Stop()
			return nil, time.Time{}, ErrClosed
		}
		t.Stop()
	}
}

// withdrawCtx bounds server-side clean-up that must happen even when ctx has ended.
func (c *Client) withdrawCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), maxWithdrawTimeout)
}

// releaseAsync gives back a grant whose acquire reply may have been lost, without
// making the caller wait; Close waits for it.
func (c *Client) releaseAsync(key, owner string) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), maxReleaseInClose)
		defer cancel()
		_ = c.b.Release(ctx, key, owner)
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
		if !g.ended() {
			if err := c.b.Release(ctx, g.key, g.owner); err != nil && !errors.Is(err, ErrNotHeld) {
				errs = append(errs, fmt.Errorf("dlock: release %q on close: %w", g.key, err))
			}
		}
		g.end(fmt.Errorf("%w: client closed", ErrReleased))
	}
	c.wg.Wait()
	c.ren.stop()
	if err := c.b.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
