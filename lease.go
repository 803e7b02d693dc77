package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/driver"
)

// grant is one server-side grant of (key, owner), shared by the leases that
// re-entered it. It ends, once, when it is lost or released; its context, made only
// if a lease's Context is asked for, is then cancelled with the same cause.
//
// Renewal runs on the client's renewer (one clock timer for all grants) rather than
// a goroutine or a timer per grant. Between refreshes the grant's tick is set for the
// next renewal; while a refresh is in flight it is set for the validity deadline, so a
// refresh that hangs cannot keep the lease looking valid. A tick in progress is
// waited for by stopRenewal, so no goroutine outlives Release or Close.
type grant struct {
	key, owner string
	token      Token
	cfg        *config   // the client's, or the lock call's own
	call       uint64    // the lock call that made it, for events
	since      time.Time // when it was granted, on the client's clock, for events

	cause atomic.Pointer[error] // why the grant ended; nil while it lasts

	c     *Client
	slot  *slot // guarded by Client.mu together with slot.g
	refs  int   // leases not yet released; guarded by Client.mu
	first Lease // the first lease, allocated with the grant

	mu            sync.Mutex
	deadline      time.Time // local validity deadline
	renewAt       time.Time // first renewal, set by newGrant
	cut           bool      // deadline is the Bounder's, short of the validity
	used          bool      // first is handed out; guarded by Client.mu
	stopped       bool
	refreshing    bool
	hasCtx        atomic.Bool        // ctx was made
	ctx           *cancelCtx         // made on demand, cancelled with cause
	lost          <-chan struct{}    // from the backend, or nil
	halted        chan struct{}      // closed by halt when lost is watched
	cancelRefresh context.CancelFunc // of the refresh in flight, if any
	inflight      sync.WaitGroup     // ticks in progress

	next int64 // when the tick is due (see renewer); guarded by the renewer
	hidx int   // index in the renewer's heap, -1 when not scheduled
}

// cancelCtx is a context with its cancel function, made only when asked for.
type cancelCtx struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newCancelCtx(parent context.Context) *cancelCtx {
	ctx, cancel := context.WithCancelCause(parent)
	return &cancelCtx{ctx, cancel}
}

// newGrant returns the grant whose server-side TTL started no earlier than start,
// valid until deadline (start plus the validity, or earlier if cut says a Bounder
// cut it). Its first renewal is due one renew interval after start, or sooner when
// the deadline is near.
func newGrant(key, owner string, cfg *config, dg driver.Grant, start, deadline time.Time, cut bool) *grant {
	return &grant{
		key: key, owner: owner, token: Token(dg.Token), cfg: cfg, lost: dg.Lost,
		deadline: deadline, cut: cut, renewAt: start.Add(cfg.renewEvery()),
		hidx: -1,
	}
}

// bound returns deadline, cut to what the backend promises for the grant of owner on
// key if it is a driver.Bounder (now if the backend no longer has the grant), and
// whether it was cut.
func (c *Client) bound(key, owner string, deadline, now time.Time) (time.Time, bool) {
	if c.bounder == nil {
		return deadline, false
	}
	d, ok := c.bounder.Bound(key, owner)
	switch {
	case !ok:
		return now, true
	case d == driver.NoBound:
		return deadline, false
	}
	if b := now.Add(d); b.Before(deadline) {
		return b, true
	}
	return deadline, false
}

// dueAt returns when a renewal due at renew should run instead, given the deadline.
// A deadline a Bounder cut short may come before the renewal; the grant then asks
// three quarters of the way there, again and again, so that it learns of a session
// kept alive meanwhile before the deadline ends it; within milliseconds of the
// deadline it ticks at the deadline, which ends the grant if nothing renewed it.
// (Without a cut, the validity always outlasts the renew interval: renew is kept.)
func (g *grant) dueAt(renew, now time.Time) time.Time {
	left := g.deadline.Sub(now)
	late := now.Add(left * 3 / 4)
	switch {
	case !renew.After(late):
		return renew
	case g.cut && left > 4*time.Millisecond:
		return late
	case renew.After(g.deadline):
		return g.deadline
	default:
		return renew
	}
}

// errReleased is ErrReleased as grant.end keeps it, made once.
var errReleased = &ErrReleased

// end ends the grant with cause, unless it had already ended.
func (g *grant) end(cause error) {
	p := errReleased
	if cause != ErrReleased {
		own := cause
		p = &own
	}
	if !g.cause.CompareAndSwap(nil, p) {
		return
	}
	// context sets hasCtx before it reads cause: one of the two sees the other.
	if g.hasCtx.Load() {
		g.mu.Lock()
		g.ctx.cancel(cause)
		g.mu.Unlock()
	}
}

// ended reports whether the grant has ended.
func (g *grant) ended() bool { return g.cause.Load() != nil }

// endCause returns why the grant ended, or nil.
func (g *grant) endCause() error {
	if p := g.cause.Load(); p != nil {
		return *p
	}
	return nil
}

// context returns a context that is cancelled, with the cause, when the grant ends.
func (g *grant) context() context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx == nil {
		g.ctx = newCancelCtx(context.Background())
		g.hasCtx.Store(true)
		if cause := g.endCause(); cause != nil {
			g.ctx.cancel(cause)
		}
	}
	return g.ctx.ctx
}

// start schedules the first renewal, one renew interval after the validity started;
// now is the client clock's time. Called with Client.mu held.
func (g *grant) start(c *Client, now time.Time) {
	g.c = c
	g.since = now
	c.ren.schedule(g, g.dueAt(g.renewAt, now), now)
	if g.lost != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.halted = make(chan struct{})
		g.inflight.Add(1)
		go func() {
			defer g.inflight.Done()
			select {
			case <-g.lost:
				g.lose(fmt.Errorf("%w: the backend reports the grant gone (session or lease expired)", ErrLeaseLost))
			case <-g.halted:
			}
		}()
	}
}

// halt stops the timer and any refresh in flight; it reports whether it was the
// first to do so.
func (g *grant) halt() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.stopped = true
	g.c.ren.cancel(g)
	if g.halted != nil {
		close(g.halted)
	}
	if g.cancelRefresh != nil {
		g.cancelRefresh()
	}
	return true
}

// stopRenewal halts renewal and waits for a tick in progress to finish.
func (g *grant) stopRenewal() {
	g.halt()
	g.inflight.Wait()
}

func (g *grant) validUntil() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.deadline
}

var errDeadline = fmt.Errorf("%w: validity deadline passed without a successful renewal", ErrLeaseLost)

// tick renews the grant once, or declares it lost if the deadline has come.
func (g *grant) tick() {
	clk := g.cfg.clock
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return
	}
	sent := clk.Now()
	left := g.deadline.Sub(sent)
	if g.refreshing || left <= 0 {
		g.mu.Unlock()
		g.lose(errDeadline)
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), left)
	defer cancel()
	g.refreshing = true
	g.cancelRefresh = cancel
	g.c.ren.schedule(g, g.deadline, sent) // watchdog while the refresh is in flight
	g.inflight.Add(1)
	defer g.inflight.Done()
	g.mu.Unlock()

	err := g.c.b.Refresh(rctx, g.key, g.owner, g.cfg.ttl)

	g.mu.Lock()
	g.refreshing = false
	g.cancelRefresh = nil
	if g.stopped {
		g.mu.Unlock()
		return
	}
	now := clk.Now()
	switch {
	case err == nil && !now.Before(g.deadline):
		// The reply came after the validity deadline: the lease counts as lost
		// from then, whatever the server did with the refresh (its watchdog tick
		// may not have run yet). A late reply never brings a lease back.
		g.mu.Unlock()
		g.lose(errDeadline)
	case err == nil:
		g.deadline, g.cut = g.c.bound(g.key, g.owner, sent.Add(g.cfg.validity()), now)
		g.c.ren.schedule(g, g.dueAt(now.Add(g.cfg.renewEvery()), now), now)
		g.mu.Unlock()
		if g.c.obs != nil {
			g.event(context.Background(), EventRenewed, now.Sub(sent), nil)
		}
	case errors.Is(err, ErrNotHeld):
		g.mu.Unlock()
		g.lose(fmt.Errorf("%w: renewal refused: %w", ErrLeaseLost, err))
	default:
		// A transient error: retry soon, but not past the deadline.
		retry := min(max(g.cfg.renewEvery()/8, 10*time.Millisecond), time.Second, g.deadline.Sub(now))
		g.c.ren.schedule(g, now.Add(retry), now)
		g.mu.Unlock()
		g.cfg.logger.Debug("dlock: renewal failed, retrying", "key", g.key, "err", err, "retry_in", retry)
		if g.c.obs != nil {
			g.event(context.Background(), EventRenewFailed, now.Sub(sent), err)
		}
	}
}

// lose ends the grant as lost. Leases of it report the cause; the slot forgets it so a
// new lock call acquires afresh.
func (g *grant) lose(cause error) {
	if !g.halt() {
		return // released or closed meanwhile
	}
	c := g.c
	c.mu.Lock()
	if g.slot != nil && g.slot.g == g {
		g.slot.g = nil
		c.dropLocked(slotKey{g.key, g.owner}, g.slot)
	}
	c.mu.Unlock()
	g.cfg.logger.Warn("dlock: lease lost", "key", g.key, "token", uint64(g.token), "cause", cause)
	g.end(cause)
	if c.obs != nil {
		g.event(context.Background(), EventLost, g.cfg.clock.Now().Sub(g.since), cause)
	}
}

// newLease returns a new handle on g. Called with Client.mu held.
func (g *grant) newLease() *Lease {
	g.refs++
	if !g.used {
		g.used = true
		g.first.g = g
		return &g.first
	}
	return &Lease{g: g}
}

// Lease is a held lock. It is safe for concurrent use. Its context is cancelled, and
// Done closed, the moment the lock may be lost (cause ErrLeaseLost) or when it is
// released (cause ErrReleased).
type Lease struct {
	g *grant

	mu sync.Mutex // serialises Release

	cmu      sync.Mutex // guards the fields below
	ctx      *cancelCtx
	released bool  // written under mu too
	cause    error // why the lease ended, once released
}

// Key returns the lock's key.
func (l *Lease) Key() string { return l.g.key }

// Owner returns the owner id of the grant. Pass it to WithOwner to re-enter the lock
// through the same Client, or, with WithResume, to take the grant over after a
// restart (from another Client, the owner id alone is refused while the key is held).
func (l *Lease) Owner() string { return l.g.owner }

// Token returns the fencing token of the grant (0 if the backend cannot fence). Leases
// that re-entered the same grant share its token.
func (l *Lease) Token() Token { return l.g.token }

// Shared reports whether the lease is a shared (read) hold of its key (WithShared).
func (l *Lease) Shared() bool { return l.g.cfg.shared }

// TTL returns the lease's time to live on the server.
func (l *Lease) TTL() time.Duration { return l.g.cfg.ttl }

// Expiry returns the local validity deadline (on the client's clock): the moment the
// lease counts as lost unless renewed before. It moves forward with each renewal.
func (l *Lease) Expiry() time.Time { return l.g.validUntil() }

// Context returns a context that is cancelled when the lease ends; context.Cause tells
// why (an error matching ErrLeaseLost or ErrReleased). Do the work that needs the lock
// under this context.
func (l *Lease) Context() context.Context {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	if l.ctx == nil {
		l.ctx = newCancelCtx(l.g.context())
		if l.released {
			l.ctx.cancel(l.cause)
		}
	}
	return l.ctx.ctx
}

// Done is closed when the lease ends.
func (l *Lease) Done() <-chan struct{} { return l.Context().Done() }

// Err returns nil while the lease is held, else an error matching ErrLeaseLost or
// ErrReleased.
func (l *Lease) Err() error {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	if l.released {
		return l.cause
	}
	return l.g.endCause()
}

// Release gives the lease back. Re-entered grants are freed on the server when their
// last lease is released. Release returns nil on success; an error matching
// ErrLeaseLost if the lease had been lost (the work done under it may have overlapped
// another holder's); ErrReleased if called again. If ctx ends while Release waits for
// a concurrent lock call of the same owner, nothing changes and Release may be called
// again. Once it reaches the server, the lease ends locally whatever the answer
// (renewal stops); if the server could not be told, the error says so and the
// server frees the grant after its TTL.
func (l *Lease) Release(ctx context.Context) error {
	err := l.release(ctx)
	if g := l.g; g.c.obs != nil && err != ErrReleased && l.done() {
		g.event(ctx, EventReleased, g.cfg.clock.Now().Sub(g.since), err)
	}
	return err
}

func (l *Lease) release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released { // written only by finish, under mu
		return ErrReleased
	}
	g, c := l.g, l.g.c
	s := g.slot

	c.mu.Lock()
	if s.g != g || g.refs > 1 {
		// Lost or closed (nothing to do on the server), or re-entered.
		g.refs--
		c.mu.Unlock()
		l.finish()
		if cause := g.endCause(); errors.Is(cause, ErrLeaseLost) {
			return cause
		}
		return nil
	}
	ok, waited := c.enterLocked(ctx, s, nil)
	if !ok {
		c.mu.Unlock()
		return fmt.Errorf("dlock: release %q: %w", g.key, context.Cause(ctx))
	}
	g.refs--
	if waited && (g.refs > 0 || s.g != g) {
		// Re-entered, lost or closed while we waited for the slot.
		c.leaveLocked(s)
		c.dropLocked(slotKey{g.key, g.owner}, s)
		c.mu.Unlock()
		l.finish()
		if cause := g.endCause(); errors.Is(cause, ErrLeaseLost) {
			return cause
		}
		return nil
	}
	s.g = nil
	c.mu.Unlock()

	g.stopRenewal()
	err := c.b.Release(ctx, g.key, g.owner)
	lostCause := g.endCause()
	g.end(ErrReleased)
	c.mu.Lock()
	c.leaveLocked(s)
	c.dropLocked(slotKey{g.key, g.owner}, s)
	c.mu.Unlock()
	l.finish()
	switch {
	case err == nil:
		return nil
	case errors.Is(lostCause, ErrLeaseLost):
		return lostCause
	case errors.Is(err, ErrNotHeld):
		return fmt.Errorf("%w: the server no longer had the grant at release: %w", ErrLeaseLost, err)
	default:
		return fmt.Errorf("dlock: release %q: %w", g.key, err)
	}
}

// done reports whether Release has ended the lease (finish ran).
func (l *Lease) done() bool {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	return l.released
}

func (l *Lease) finish() {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	l.released = true
	l.cause = ErrReleased
	if cause := l.g.endCause(); cause != nil && !errors.Is(cause, ErrReleased) {
		l.cause = cause // lost before it was released
	}
	if l.ctx != nil {
		l.ctx.cancel(l.cause)
	}
}
