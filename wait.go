package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/dlockio/dlock/driver"
)

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
	return driver.Join(errs...)
}

// obtain runs the attempt loop against the backend. It returns the grant and the
// client clock's time when it was granted.
func (c *Client) obtain(ctx context.Context, key, owner string, cfg *config, wait, generated bool, call uint64) (g *grant, now time.Time, err error) {
	var st obtainState
	defer func() {
		c.afterObtain(ctx, key, owner, cfg, generated, &st, g != nil)
		if c.obs != nil && !st.waitFrom.IsZero() {
			grant := uint64(0)
			if g != nil {
				grant = call
			}
			c.event(ctx, EventWaited, call, grant, key, owner, cfg, 0, cfg.clock.Now().Sub(st.waitFrom), err)
		}
	}()
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
	// waitFrom is when the call first paused because the key was held (for the
	// observer's EventWaited); zero if it never did.
	waitFrom time.Time
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
	l := &attemptLoop{
		c: c, cfg: cfg, wait: wait, st: st,
		req:     driver.Request{Key: key, Owner: owner, TTL: cfg.ttl, Reenter: generated || cfg.resume, Resume: cfg.resume, Value: cfg.value, Limit: cfg.limit, Shared: cfg.shared},
		budget:  maxFallbackScale * cfg.retryMax,
		backoff: cfg.retryMin,
	}
	l.own = l.req.Reenter
	// A waiting Lock registers its wait before the first attempt that may queue,
	// so that no wake-up is lost; when the backend advises that the key is likely
	// free, it tries first without (see driver.WatchAdvisor).
	if wait && c.notifier != nil && (c.advisor == nil || c.advisor.WatchFirst(key)) {
		if err := l.watch(ctx); err != nil {
			return nil, time.Time{}, err
		}
	}
	clk := cfg.clock
	for {
		sent := clk.Now()
		gr, err := c.b.Acquire(ctx, l.req)
		untrusted := false
		if l.req.Reenter && !l.own {
			// A stable owner id's re-ask, whatever its answer, is the last
			// attempt of this call that says Reenter.
			l.req.Reenter = false
			untrusted = clk.Now().After(l.trustUntil)
		}
		if err == nil {
			var g *grant
			var now time.Time
			var again bool
			if g, now, again, err = l.granted(ctx, gr, sent, untrusted); !again {
				return g, now, err
			}
			if err == nil {
				continue
			}
		}
		if err := l.refused(ctx, err); err != nil {
			return nil, time.Time{}, err
		}
	}
}

// maxFallbackScale bounds how far a notified waiter's fallback interval grows with
// its place in the queue, in units of retryMax (see attemptLoop).
const maxFallbackScale = 4

// attemptLoop is the state of one call's attempts.
//
// A notified waiter attempts again, in case its wake-up was lost, after a fallback
// interval jittered in [hi/2, hi], where hi grows with its place in the queue
// (driver.HeldError.Ahead): retryMax times 1+log2(1+ahead) rounded up, at most
// maxFallbackScale times retryMax. So a waiter whose wake-up is lost when it reaches
// the head attempts again at most 4*retryMax (4s by default) after its previous
// attempt, and at most retryMax after one that found it next in line; a backend
// that does not report Ahead gets retryMax, as before.
//
// Each attempt asks the backend to keep the place for the longest interval that may
// follow it (budget) plus 2*retryMax+1s for the attempt itself to arrive, and the
// interval never exceeds the budget of the attempt before it, so a live waiter's
// place never lapses. A waiter that dies leaves its place behind for at most
// (maxFallbackScale+2)*retryMax+1s (7s by default; 4s, as before, after an attempt
// that found it next in line); a backend passes over it when it lapses.
type attemptLoop struct {
	c    *Client
	cfg  *config
	wait bool
	st   *obtainState
	req  driver.Request

	budget  time.Duration // the longest fallback interval the next one may have
	backoff time.Duration // an unnotified waiter's next backoff bound
	// own: the owner id is this call's alone, or the caller vouches for it
	// (resume), so re-entering whatever grant it holds is safe. A stable owner
	// id's grant made for this call is re-entered only by a re-ask whose reply
	// comes while that grant is certainly still live on the server (before
	// trustUntil, its validity deadline): a later reply may have re-entered a
	// grant that another process of the same owner id took after this call's
	// expired.
	own                bool
	reasked, lateAgain bool
	trustUntil         time.Time
}

// patience is how long the backend keeps a queued place after an attempt followed
// by a fallback interval of at most hi.
func (l *attemptLoop) patience(hi time.Duration) time.Duration {
	return hi + 2*l.cfg.retryMax + time.Second
}

// watch registers the wait with the backend's notifier; the attempts that follow
// say Wait.
func (l *attemptLoop) watch(ctx context.Context) error {
	var err error
	if l.st.w, err = l.c.notifier.Watch(ctx, l.req.Key, l.req.Owner); err != nil {
		l.st.w = nil
		if ended(ctx) {
			return waitEnded(ctx, fmt.Errorf("wait for %q: %w", l.req.Key, err))
		}
		return fmt.Errorf("dlock: wait for %q: %w", l.req.Key, err)
	}
	l.req.Wait = true
	l.req.Patience = l.patience(l.budget)
	return nil
}

// granted handles an attempt, sent at sent, that the backend granted (gr). It
// returns the grant, or again to attempt once more: at once when err is nil, or
// after a wait as if the key were held (err, matching ErrLocked). Otherwise err is
// the call's error.
func (l *attemptLoop) granted(ctx context.Context, gr driver.Grant, sent time.Time, untrusted bool) (g *grant, now time.Time, again bool, err error) {
	cfg, clk, key, owner := l.cfg, l.cfg.clock, l.req.Key, l.req.Owner
	// The server started the grant's TTL no earlier than start: when this attempt
	// was sent, or, for a grant handed over at release, Age before.
	start := sent.Add(-gr.Age)
	now = clk.Now()
	if gr.Age > 0 && now.Sub(start) >= cfg.renewEvery() && !l.reasked {
		// Handed over long ago (the waiter's last attempt was old): ask the server
		// at once. The owner holds the key by this call's grant, so the attempt
		// re-enters it and the validity restarts from now.
		l.reasked = true
		l.req.Reenter, l.trustUntil = true, start.Add(cfg.validity())
		return nil, now, true, nil
	}
	deadline, cut := l.c.bound(key, owner, start.Add(cfg.validity()), now)
	if untrusted {
		deadline = now
	}
	if deadline.After(now) {
		return newGrant(key, owner, cfg, gr, start, deadline, cut), now, false, nil
	}
	// Granted too late to be trusted (the reply took about the validity). The
	// owner holds the key by this call's grant: a generated (or resumed) owner
	// attempts again at once, which re-enters it with a fresh TTL and a validity
	// counted from then. A stable owner id does not (by then the grant may have
	// expired and been taken by another process of that owner id): a waiting Lock
	// waits as if the key were held, until its grant expires. A second late grant
	// in a row says that the TTL is too short for a request: a clear error of its
	// own, not "locked" (nobody else holds the key). A generated owner's grant is
	// given back when the call returns; a stable owner's expires after its TTL
	// (releasing it could delete a grant another process of that owner id took
	// meanwhile).
	l.st.mayHold = true
	switch {
	case !l.lateAgain && ctx.Err() == nil && l.own:
		l.lateAgain = true
		return nil, now, true, nil
	case !l.lateAgain && ctx.Err() == nil && l.wait:
		l.lateAgain = true
		return nil, now, true, &driver.HeldError{RetryAfter: cfg.ttl}
	}
	err = fmt.Errorf("%w: %q granted %v after the attempt was sent, the lease validity is %v (TTL %v); raise the TTL",
		ErrValidityTooShort, key, now.Sub(sent).Round(time.Microsecond), cfg.validity(), cfg.ttl)
	if ctx.Err() != nil {
		if l.wait {
			return nil, time.Time{}, false, driver.Join(waitEnded(ctx, nil), err)
		}
		return nil, time.Time{}, false, driver.Join(err, context.Cause(ctx))
	}
	return nil, time.Time{}, false, err
}

// refused handles an attempt that failed with err: it returns nil to attempt
// again (at once after registering a wait, else after a pause), or the call's
// error.
func (l *attemptLoop) refused(ctx context.Context, err error) error {
	if !errors.Is(err, ErrLocked) {
		// The outcome is unknown (a lost reply may hide a grant). A generated
		// owner id is this call's alone, so releasing it when the call returns
		// cannot hurt anyone.
		l.st.mayHold = true
		// Backends name themselves and the key in their errors.
		switch {
		case !ended(ctx):
			return err
		case l.wait:
			// The request was cut short by the end of a waiting Lock's ctx: that
			// is giving up the wait, as documented.
			return waitEnded(ctx, err)
		case !errors.Is(err, ctx.Err()):
			return driver.Join(err, context.Cause(ctx))
		}
		return err
	}
	if !l.wait {
		return err
	}
	if l.st.w == nil && l.c.notifier != nil && ctx.Err() == nil {
		// A waiter refused because its owner id holds the key elsewhere registers
		// too; nothing hands it that grant, its fallback timer attempts again.
		return l.watch(ctx) // nil: attempt again at once, now waiting
	}
	return l.pause(ctx, err)
}

// pause waits, after an attempt refused with err (matching ErrLocked), for a
// wake-up, the fallback interval or the backoff, and returns nil; or the call's
// error if ctx ends or the client closes first.
func (l *attemptLoop) pause(ctx context.Context, err error) error {
	cfg := l.cfg
	if l.st.waitFrom.IsZero() {
		l.st.waitFrom = cfg.clock.Now()
	}
	var held *driver.HeldError
	isHeld := errors.As(err, &held)
	if isHeld && held.Queued && cfg.onQueued != nil {
		cfg.onQueued(held.Ahead)
	}
	var d time.Duration
	if l.st.w != nil {
		scale := 1
		if isHeld && held.Ahead > 0 {
			scale = min(1+bits.Len(uint(held.Ahead)), maxFallbackScale)
		}
		hi := min(time.Duration(scale)*cfg.retryMax, l.budget)
		l.budget, l.req.Patience = hi, l.patience(hi)
		d = jitter(hi/2, hi)
	} else {
		d = jitter(0, l.backoff)
		l.backoff = min(2*l.backoff, cfg.retryMax)
	}
	if isHeld && held.RetryAfter > 0 && held.RetryAfter+time.Millisecond < d {
		d = held.RetryAfter + time.Millisecond
	}
	d = max(d, time.Millisecond)
	t := cfg.clock.NewTimer(d)
	defer t.Stop()
	var wake <-chan struct{}
	if l.st.w != nil {
		wake = l.st.w.C()
	}
	select {
	case <-wake:
	case <-t.C():
	case <-ctx.Done():
		// The last attempt's error matches ErrLocked and says why (the holder's
		// expiry, or which nodes refused).
		return waitEnded(ctx, err)
	case <-l.c.closing:
		return ErrClosed
	}
	return nil
}
