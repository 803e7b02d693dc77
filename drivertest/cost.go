package drivertest

import (
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/measure"
)

// Cost is what one handoff costs down a chain of waiters.
type Cost struct {
	// Calls is the driver calls (Acquire, Release, Watch, Stop, ...) per handoff,
	// counted in the clients.
	Calls float64
	// Ops is the server operations per handoff, from Harness.Ops; -1 when the
	// harness has none.
	Ops float64
}

// HandoffCost queues waiters behind a holder, each on a client of its own, then lets
// the key pass down the chain, and returns the cost per handoff (measure.Growth does
// the work; dlock bench reports the same numbers).
func HandoffCost(t testing.TB, h Harness, waiters int) Cost {
	t.Helper()
	ctx := ctxT(t)
	var counts measure.Counts
	client := func() *dlock.Client {
		c, err := dlock.New(measure.Counting(h.Open(t), &counts), h.Options...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	holder := client()
	pool := make([]*dlock.Client, waiters)
	for i := range pool {
		pool[i] = client()
	}
	o := measure.GrowthOptions{Calls: counts.Calls, Locked: counts.Locked}
	o.Inspector, _ = holder.Backend().(driver.Inspector)
	if h.Ops != nil {
		o.Ops = h.Ops
		overhead, err := measure.OpsOverhead(ctx, h.Ops)
		if err != nil {
			t.Fatalf("ServerOps: %v", err)
		}
		o.OpsOverhead = overhead
	}
	run, err := measure.Growth(ctx, holder, pool, Key(t, "chain"), waiters, o)
	if err != nil {
		t.Fatalf("chain of %d waiters: %v", waiters, err)
	}
	cost := Cost{Calls: float64(run.Calls) / float64(run.Handoffs), Ops: -1}
	if run.Ops >= 0 {
		cost.Ops = float64(run.Ops) / float64(run.Handoffs)
	}
	return cost
}

// A release wakes the next waiter only: a handoff costs no more with 16 waiters than
// with one (no herd).
func (h Harness) testHandoffCost(t *testing.T) {
	if testing.Short() {
		t.Skip("chains of waiters in -short mode")
	}
	HandoffCost(t, h, 2) // warm up: connections, subscriptions, server script caches
	one, many := HandoffCost(t, h, 1), HandoffCost(t, h, 16)
	t.Logf("per handoff: %.2f driver calls and %.2f server ops with 1 waiter; %.2f and %.2f with 16", one.Calls, one.Ops, many.Calls, many.Ops)
	if many.Calls > one.Calls+0.5 {
		t.Fatalf("driver calls per handoff grow with waiters: %.2f with 1, %.2f with 16", one.Calls, many.Calls)
	}
	if one.Ops >= 0 && many.Ops > 1.5*one.Ops+1 {
		t.Fatalf("server operations per handoff grow with waiters: %.2f with 1, %.2f with 16", one.Ops, many.Ops)
	}
}
