package drivertest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// ManyWaitersCount is how many waiters the ManyWaiters case queues on one key:
// DLOCK_MANY_WAITERS if set, else 100 under -short or the race detector (which
// slows servers embedded in the test tenfold), else 1,000: issue 17 asks every
// queueing backend to scale to 1,000 waiters per key. `dlock bench --waiters`
// measures the cost per handoff at any size.
func ManyWaitersCount() int {
	if s := os.Getenv("DLOCK_MANY_WAITERS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	if testing.Short() || raceEnabled {
		return 100
	}
	return 1000
}

// testManyWaiters queues ManyWaitersCount waiters on one held key, each a
// Lock(context.Background()) spread over a few clients, then releases: every waiter
// gets the lock once, one at a time, and none gets an error (a waiter whose caller
// gave no deadline never gets a timeout, however long the queue).
func (h Harness) testManyWaiters(t *testing.T) {
	n := ManyWaitersCount()
	key := Key(t, "many")
	holder := h.Client(t)
	clients := make([]*dlock.Client, 8)
	for i := range clients {
		clients[i] = h.Client(t)
	}
	ctx := context.Background()
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var inside, got atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		c := clients[i%len(clients)]
		wg.Go(func() {
			l, err := c.Lock(context.Background(), key)
			if err != nil {
				errs <- err
				return
			}
			if inside.Add(1) != 1 {
				t.Error("two holders at once")
			}
			got.Add(1)
			inside.Add(-1)
			if err := l.Release(context.Background()); err != nil {
				errs <- err
			}
		})
	}
	// Release once every waiter has queued, where the backend can count them; a
	// backend that cannot gets a moment instead (the check below holds either way).
	if in, ok := holder.Backend().(driver.Inspector); ok {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			info, err := in.Inspect(ctx, key)
			if err == nil && (info.Waiters < 0 || info.Waiters >= n) {
				break
			}
			if len(errs) > 0 {
				t.Fatalf("a waiter failed while queueing (%d queued): %v", info.Waiters, <-errs)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiters never queued (last Inspect %+v, %v)", n, info, err)
			}
		}
	}
	start := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitProgress(t, &wg, &got, n, func() string {
		if in, ok := holder.Backend().(driver.Inspector); ok {
			info, err := in.Inspect(ctx, key)
			return fmt.Sprintf("Inspect: %+v, %v", info, err)
		}
		return "the backend cannot be inspected"
	})
	t.Logf("%d waiters: %v from the release to the last waiter's release", n, time.Since(start))
	close(errs)
	failed := 0
	for err := range errs {
		if failed++; failed <= 5 {
			t.Error(err)
		}
	}
	if int(got.Load()) != n {
		t.Fatalf("%d of %d waiters got the lock (%d errors)", got.Load(), n, failed)
	}
}

// stallAfter is how long waitProgress lets the waiters go without one more of them
// getting the lock before it fails the test.
const stallAfter = 3 * Wait

// waitProgress waits for wg while got (the count of waiters that got the lock, of
// n) keeps rising. A waiter whose caller gave no deadline waits for ever, so a
// handoff that never happens would hang the test until go test's timeout, whose
// dump shows neither the key's state nor which test it was. Instead, once got has
// not risen for stallAfter, it logs the goroutines and fails the test with state,
// which describes the key on the server. The waiters left are cut short when the
// test's clients close.
func waitProgress(t *testing.T, wg *sync.WaitGroup, got *atomic.Int32, n int, state func() string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, since := got.Load(), time.Now()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if g := got.Load(); g != last {
			last, since = g, time.Now()
			continue
		}
		if time.Since(since) >= stallAfter {
			var dump bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&dump, 1)
			t.Logf("goroutines:\n%s", dump.String())
			t.Fatalf("stalled: %d of %d waiters got the lock, none in the last %v; %s", last, n, stallAfter, state())
		}
	}
}
