package measure

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// GrowthOptions are the optional parts of Growth.
type GrowthOptions struct {
	// Inspector shows the waiters queued on the server.
	Inspector driver.Inspector
	// Ops reads a running total of server operations, and OpsOverhead is what one
	// read itself adds to that total (see OpsOverhead).
	Ops         func(context.Context) (int64, error)
	OpsOverhead int64
	// Calls reads a running total of the driver calls the clients made, and Locked
	// of the attempts answered "locked" (see Counting).
	Calls, Locked func() int64
}

// GrowthRun is the outcome of Growth.
type GrowthRun struct {
	Waiters  int
	Handoffs int64
	Elapsed  time.Duration // from the first Release to the last waiter's Release
	Ops      int64         // server operations over the chain; -1 when not counted
	Calls    int64         // driver calls over the chain; -1 when not counted
	Queued   bool          // every waiter was seen queued before the release
}

// Growth measures what a handoff costs with many waiters: holder takes key, n
// waiters (each its own owner id, spread round-robin over the clients of pool) queue
// behind it, and the holder releases. Each waiter releases as soon as it holds the
// key, so the key passes down the chain to every waiter. The run counts the server
// operations and driver calls made from the first Release to the last, n handoffs in
// all: a backend that wakes only the next waiter costs the same per handoff whatever
// n is; one that wakes every waiter (a herd) costs more per handoff as n grows.
func Growth(ctx context.Context, holder *dlock.Client, pool []*dlock.Client, key string, n int, o GrowthOptions) (GrowthRun, error) {
	run := GrowthRun{Waiters: n, Ops: -1, Calls: -1}
	if n < 1 || len(pool) == 0 {
		return run, fmt.Errorf("%w: bench: Growth needs waiters and clients", driver.ErrInvalid)
	}
	l, err := holder.Lock(ctx, key)
	if err != nil {
		return run, fmt.Errorf("bench: lock %q: %w", key, err)
	}
	var locked0 int64
	if o.Locked != nil {
		locked0 = o.Locked()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var done atomic.Int64
	allDone := make(chan struct{})
	for i := range n {
		c := pool[i%len(pool)]
		wg.Go(func() {
			nl, err := c.Lock(ctx, key)
			if err == nil {
				err = nl.Release(ctx)
			}
			if err != nil {
				cancel(fmt.Errorf("bench: waiter %d of %d on %q: %w", i+1, n, key, err))
				return
			}
			if done.Add(1) == int64(n) {
				close(allDone)
			}
		})
	}
	fail := func(err error) (GrowthRun, error) {
		cancel(err)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = l.Release(rctx)
		rcancel()
		wg.Wait()
		return run, err
	}
	if err := awaitQueue(ctx, key, n, locked0, o, &run); err != nil {
		return fail(err)
	}
	var ops0, calls0 int64
	if o.Ops != nil {
		if ops0, err = settledOps(ctx, o); err != nil {
			return fail(err)
		}
	}
	if o.Calls != nil {
		calls0 = o.Calls()
	}
	t0 := time.Now()
	if err := l.Release(ctx); err != nil {
		return fail(fmt.Errorf("bench: release %q: %w", key, err))
	}
	select {
	case <-allDone:
	case <-ctx.Done():
	}
	run.Elapsed = time.Since(t0)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return run, err
	}
	run.Handoffs = int64(n)
	if o.Calls != nil {
		run.Calls = o.Calls() - calls0
	}
	if o.Ops != nil {
		ops1, err := o.Ops(ctx)
		if err != nil {
			return run, fmt.Errorf("bench: server ops: %w", err)
		}
		run.Ops = max(ops1-ops0-o.OpsOverhead, 0)
	}
	return run, nil
}

// awaitQueue waits until the n waiters of a Growth run queued: every one was told
// "locked" once (o.Locked), and the server shows n waiters (o.Inspector; run.Queued
// says whether it did), or, with neither, 100ms.
func awaitQueue(ctx context.Context, key string, n int, locked0 int64, o GrowthOptions, run *GrowthRun) error {
	for o.Locked != nil && o.Locked()-locked0 < int64(n) {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		sleep(ctx, 200*time.Microsecond)
	}
	if o.Inspector != nil {
		deadline := time.Now().Add(10 * time.Second)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			info, err := o.Inspector.Inspect(ctx, key)
			if err == nil && info.Waiters < 0 {
				break
			}
			if err == nil && info.Waiters >= n {
				run.Queued = true
				break
			}
			sleep(ctx, time.Millisecond)
		}
	} else if o.Locked == nil {
		sleep(ctx, 100*time.Millisecond)
	}
	return context.Cause(ctx)
}

// settledOps reads o.Ops once the server's counter has settled. Work a waiter
// started when it queued may still be under way (etcd sets up a waiter's watch after
// the attempt that queued it): count from when the counter stays put for 10ms
// (beyond what reading it adds), waiting at most 2s, so that setting up the queue is
// not charged to the handoffs, however long the queue.
func settledOps(ctx context.Context, o GrowthOptions) (int64, error) {
	ops0, err := o.Ops(ctx)
	if err != nil {
		return 0, fmt.Errorf("bench: server ops: %w", err)
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		sleep(ctx, 10*time.Millisecond)
		cur, err := o.Ops(ctx)
		if err != nil {
			return 0, fmt.Errorf("bench: server ops: %w", err)
		}
		settled := cur-ops0 <= o.OpsOverhead
		ops0 = cur
		if settled {
			break
		}
	}
	return ops0, nil
}

// OpsOverhead estimates what one read of ops adds to its own total (a ZooKeeper mntr
// request is itself a packet; a Redis INFO is not counted): the smallest difference
// between two reads in a row, over a few tries.
func OpsOverhead(ctx context.Context, ops func(context.Context) (int64, error)) (int64, error) {
	best := int64(-1)
	for range 5 {
		a, err := ops(ctx)
		if err != nil {
			return 0, err
		}
		b, err := ops(ctx)
		if err != nil {
			return 0, err
		}
		if d := b - a; best < 0 || d < best {
			best = d
		}
	}
	return max(best, 0), nil
}
