package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
)

// grant is one server-side grant of (key, owner), shared by the leases that
// re-entered it. Its context is cancelled when the grant is lost or released.
//
// Renewal runs on one clock timer rather than a goroutine per grant. Between
// refreshes the timer is set to the next renewal; while a refresh is in flight it is
// set to the validity deadline, so a refresh that hangs cannot keep the lease looking
// valid. A tick in progress is waited for by stopRenewal, so no goroutine outlives
// Release or Close.
type grant struct {
	key, owner string
	token      Token
	cfg        config

	ctx    context.Context // cancelled with the cause of the end of the grant
	cancel context.CancelCauseFunc

	c    *Client
	slot *slot // guarded by Client.mu together with slot.g
	refs int   // leases not yet released; guarded by Client.mu

	mu            sync.Mutex
	deadline      time.Time // local validity deadline
	stopped       bool
	refreshing    bool
	lost          <-chan struct{} // from the backend, or nil
	halted        chan struct{}   // closed by halt when lost is watched
	timer         clock.Timer
	cancelRefresh context.CancelFunc // of the refresh in flight, if any
	inflight      sync.WaitGroup     // ticks in progress
}

func newGrant(key string, cfg config, dg driver.Grant, sent time.Time) *grant {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &grant{
		key: key, owner: cfg.owner, token: Token(dg.Token), cfg: cfg, lost: dg.Lost,
		ctx: ctx, cancel: cancel,
		deadline: sent.Add(cfg.validity()),
	}
}

// start arms the renewal timer. Called with Client.mu held.
func (g *grant) start(c *Client) {
	g.c = c
	g.mu.Lock()
	defer g.mu.Unlock()
	g.timer = g.cfg.clock.AfterFunc(g.cfg.renewEvery(), g.tick)
	if g.lost != nil {
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
	g.timer.Stop()
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
	g.timer.Reset(left) // watchdog while the refresh is in flight
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
	switch {
	case err == nil:
		g.deadline = sent.Add(g.cfg.validity())
		g.timer.Reset(g.cfg.renewEvery())
		g.mu.Unlock()
	case errors.Is(err, ErrNotHeld):
		g.mu.Unlock()
		g.lose(fmt.Errorf("%w: renewal refused: %w", ErrLeaseLost, err))
	default:
		// A transient error: retry soon, but not past the deadline.
		retry := min(max(g.cfg.renewEvery()/8, 10*time.Millisecond), time.Second, g.deadline.Sub(clk.Now()))
		g.timer.Reset(retry)
		g.mu.Unlock()
		g.cfg.logger.Debug("dlock: renewal failed, retrying", "key", g.key, "err", err, "retry_in", retry)
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
	g.cancel(cause)
}

// newLease returns a new handle on g. Called with Client.mu held.
func (g *grant) newLease() *Lease {
	g.refs++
	return &Lease{g: g}
}

// Lease is a held lock. It is safe for concurrent use. Its context is cancelled, and
// Done closed, the moment the lock may be lost (cause ErrLeaseLost) or when it is
// released (cause ErrReleased).
type Lease struct {
	g *grant

	mu sync.Mutex // serialises Release

	cmu      sync.Mutex // guards the fields below
	ctx      context.Context
	cancel   context.CancelCauseFunc
	released bool
	cause    error // why the lease ended, once released
}

// Key returns the lock's key.
func (l *Lease) Key() string { return l.g.key }

// Owner returns the owner id of the grant. Pass it to WithOwner to re-enter the lock
// from elsewhere, or after a restart to resume it.
func (l *Lease) Owner() string { return l.g.owner }

// Token returns the fencing token of the grant (0 if the backend cannot fence). Leases
// that re-entered the same grant share its token.
func (l *Lease) Token() Token { return l.g.token }

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
		l.ctx, l.cancel = context.WithCancelCause(l.g.ctx)
		if l.released {
			l.cancel(l.cause)
		}
	}
	return l.ctx
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
	if l.g.ctx.Err() != nil {
		return context.Cause(l.g.ctx)
	}
	return nil
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
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cmu.Lock()
	released := l.released
	l.cmu.Unlock()
	if released {
		return ErrReleased
	}
	g, c := l.g, l.g.c

	c.mu.Lock()
	if g.slot.g != g { // lost (or the client closed): nothing to do on the server
		g.refs--
		c.mu.Unlock()
		l.finish()
		if cause := context.Cause(g.ctx); errors.Is(cause, ErrLeaseLost) {
			return cause
		}
		return nil
	}
	if g.refs > 1 {
		g.refs--
		c.mu.Unlock()
		l.finish()
		return nil
	}
	c.mu.Unlock()

	s := g.slot
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("dlock: release %q: %w", g.key, context.Cause(ctx))
	}
	defer func() { <-s.sem }()
	c.mu.Lock()
	g.refs--
	if g.refs > 0 || s.g != g {
		// Re-entered, lost or closed while we waited for the slot.
		c.mu.Unlock()
		l.finish()
		if cause := context.Cause(g.ctx); errors.Is(cause, ErrLeaseLost) {
			return cause
		}
		return nil
	}
	s.g = nil
	c.mu.Unlock()

	g.stopRenewal()
	err := c.b.Release(ctx, g.key, g.owner)
	lostCause := context.Cause(g.ctx)
	g.cancel(ErrReleased)
	c.mu.Lock()
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

func (l *Lease) finish() {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	l.released = true
	l.cause = ErrReleased
	if cause := context.Cause(l.g.ctx); cause != nil && !errors.Is(cause, ErrReleased) {
		l.cause = cause // lost before it was released
	}
	if l.cancel != nil {
		l.cancel(l.cause)
	}
}
