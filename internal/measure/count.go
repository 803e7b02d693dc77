package measure

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Counts are running totals kept by the backends that Counting wraps. They are safe
// for concurrent use.
type Counts struct {
	calls  atomic.Int64
	locked atomic.Int64
}

// Calls returns the driver calls made so far: Acquire, Refresh, Release, Watch,
// Waiter.Stop, Inspect and ForceRelease. Each is at least one request to the server
// on a network backend (some make more; a Watch that reuses a subscription may make
// none): it is the client-side count that stands in for server operations when the
// backend cannot report those.
func (c *Counts) Calls() int64 { return c.calls.Load() }

// Locked returns how many Acquire calls were answered "locked".
func (c *Counts) Locked() int64 { return c.locked.Load() }

// Counting wraps b so that every driver call is counted in counts. The wrapper has
// exactly the optional capabilities of b among driver.Notifier, driver.Inspector and
// driver.ForceReleaser, so the core behaves with it as with b (it waits for
// notifications only if b sends them). Closing the wrapper closes b.
func Counting(b driver.Backend, counts *Counts) driver.Backend {
	c := &counted{b: b, n: counts}
	n, isN := b.(driver.Notifier)
	i, isI := b.(driver.Inspector)
	f, isF := b.(driver.ForceReleaser)
	wn, wi, wf := &countNotifier{c, n}, &countInspector{c, i}, &countForce{c, f}
	switch {
	case isN && isI && isF:
		return struct {
			*counted
			*countNotifier
			*countInspector
			*countForce
		}{c, wn, wi, wf}
	case isN && isI:
		return struct {
			*counted
			*countNotifier
			*countInspector
		}{c, wn, wi}
	case isN && isF:
		return struct {
			*counted
			*countNotifier
			*countForce
		}{c, wn, wf}
	case isI && isF:
		return struct {
			*counted
			*countInspector
			*countForce
		}{c, wi, wf}
	case isN:
		return struct {
			*counted
			*countNotifier
		}{c, wn}
	case isI:
		return struct {
			*counted
			*countInspector
		}{c, wi}
	case isF:
		return struct {
			*counted
			*countForce
		}{c, wf}
	default:
		return c
	}
}

type counted struct {
	b driver.Backend
	n *Counts
}

func (c *counted) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	c.n.calls.Add(1)
	g, err := c.b.Acquire(ctx, req)
	if errors.Is(err, driver.ErrLocked) {
		c.n.locked.Add(1)
	}
	return g, err
}

func (c *counted) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	c.n.calls.Add(1)
	return c.b.Refresh(ctx, key, owner, ttl)
}

func (c *counted) Release(ctx context.Context, key, owner string) error {
	c.n.calls.Add(1)
	return c.b.Release(ctx, key, owner)
}

func (c *counted) Close() error { return c.b.Close() }

type countNotifier struct {
	c *counted
	n driver.Notifier
}

// WatchFirst passes on the wrapped backend's driver.WatchAdvisor answer (true, the
// core's default, when it has none), so the core waits with the wrapper as with b.
func (w *countNotifier) WatchFirst(key string) bool {
	if a, ok := w.n.(driver.WatchAdvisor); ok {
		return a.WatchFirst(key)
	}
	return true
}

func (w *countNotifier) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	w.c.n.calls.Add(1)
	wt, err := w.n.Watch(ctx, key, owner)
	if err != nil {
		return nil, err
	}
	return &countWaiter{wt, w.c.n}, nil
}

type countWaiter struct {
	w driver.Waiter
	n *Counts
}

func (w *countWaiter) C() <-chan struct{} { return w.w.C() }

func (w *countWaiter) Stop(ctx context.Context, acquired bool) error {
	w.n.calls.Add(1)
	return w.w.Stop(ctx, acquired)
}

type countInspector struct {
	c *counted
	i driver.Inspector
}

func (w *countInspector) Inspect(ctx context.Context, key string) (driver.Info, error) {
	w.c.n.calls.Add(1)
	return w.i.Inspect(ctx, key)
}

type countForce struct {
	c *counted
	f driver.ForceReleaser
}

func (w *countForce) ForceRelease(ctx context.Context, key string) error {
	w.c.n.calls.Add(1)
	return w.f.ForceRelease(ctx, key)
}
