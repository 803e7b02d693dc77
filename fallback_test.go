package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/memlock"
)

// placing is the reference backend reporting, in every refusal of a waiting
// attempt, the place in the queue that the test sets (driver.HeldError.Ahead), and
// recording the patience each waiting attempt asked for.
type placing struct {
	*memlock.Backend
	ahead    atomic.Int64
	attempts atomic.Int64 // waiting attempts

	mu        sync.Mutex
	patiences []time.Duration
}

func (b *placing) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, req)
	if req.Wait {
		b.mu.Lock()
		b.patiences = append(b.patiences, req.Patience)
		b.mu.Unlock()
		var held *driver.HeldError
		if errors.As(err, &held) {
			h := *held
			h.Ahead = int(b.ahead.Load())
			err = &h
		}
		b.attempts.Add(1)
	}
	return g, err
}

func (b *placing) lastPatience() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.patiences[len(b.patiences)-1]
}

// waitAttempts waits (in real time, bounded) until the waiter made n waiting attempts.
func (b *placing) waitAttempts(t *testing.T, n int64) {
	t.Helper()
	waitAtLeast(t, &b.attempts, n, "waiting attempts")
}

// A notified waiter's fallback interval (its guard against a lost wake-up) grows
// with its place in the queue, 1+log2(1+ahead) rounded up times retryMax, jittered
// down to half, and stays at most 4 times retryMax however far back it is; the
// interval after an attempt never exceeds the one before (the patience that
// attempt asked for must cover it), and every attempt asks the backend to keep the

// heldByAnother returns a client over a placing reference backend (and its store), with the given
// retryMax, on a fake clock, and key "k" held by another owner for an hour.
func heldByAnother(t *testing.T, retryMax time.Duration) (*dlock.Client, *memlock.Store, *placing, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	st := memlock.NewStore(clk)
	pb := &placing{Backend: st.Backend()}
	c, err := dlock.New(pb, dlock.WithClock(clk), dlock.WithRetry(10*time.Millisecond, retryMax))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := st.Backend().Acquire(context.Background(), driver.Request{Key: "k", Owner: "holder", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return c, st, pb, clk
}

// place comfortably longer than the interval that may follow it.
func TestFallbackGrowsWithPlaceInQueue(t *testing.T) {
	const retryMax = time.Second
	c, st, pb, clk := heldByAnother(t, retryMax)
	ctx := context.Background()
	got := make(chan error, 1)
	pb.ahead.Store(1 << 40) // far back: the bound applies
	go func() {
		l, err := c.Lock(ctx, "k")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	// Each step: the place the next refusal reports, and the bounds of the interval
	// that follows it.
	steps := []struct {
		ahead  int64
		lo, hi time.Duration
	}{
		{1 << 40, 2 * time.Second, 4 * time.Second}, // (first attempt, reported above)
		{7, 2 * time.Second, 4 * time.Second},       // 1+log2(8) = 4
		{100, 2 * time.Second, 4 * time.Second},     // capped at 4
		{3, 1500 * time.Millisecond, 3 * time.Second},
		{1, time.Second, 2 * time.Second},
		{5, time.Second, 2 * time.Second}, // never above the interval before
		{0, 500 * time.Millisecond, time.Second},
	}
	var n int64 = 1
	for i, s := range steps {
		pb.waitAttempts(t, n)
		if p, maxInterval := pb.lastPatience(), steps[max(i-1, 0)].hi; p < maxInterval+2*retryMax {
			t.Fatalf("step %d: attempt asked for patience %v, want at least %v (the longest interval that may follow, %v, plus 2*retryMax)", i, p, maxInterval+2*retryMax, maxInterval)
		}
		if i+1 < len(steps) {
			pb.ahead.Store(steps[i+1].ahead) // reported by the attempt after this step's interval
		}
		clk.BlockUntil(1) // the waiter sleeps on its fallback timer
		clk.Advance(s.lo - time.Millisecond)
		if a := pb.attempts.Load(); a != n || clk.Pending() != 1 {
			t.Fatalf("step %d (ahead %d): attempted again before %v (%d attempts, %d timers)", i, s.ahead, s.lo, a, clk.Pending())
		}
		clk.Advance(s.hi - s.lo + time.Millisecond)
		n++
		pb.waitAttempts(t, n)
	}
	if p := pb.lastPatience(); p < time.Second+2*retryMax {
		t.Fatalf("attempt after the interval for a place next in line asked for patience %v, want at least %v", p, 3*retryMax)
	}
	if err := st.Backend().Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Lock after the holder released: %v", err)
	}
}

// A waiter that does not learn its place (a backend that leaves Ahead 0) keeps the
// plain fallback, retryMax jittered down to half, and is asked to be kept about as
// long as before (3*retryMax+1s once it has been refused).
func TestFallbackWithoutPlaceIsRetryMax(t *testing.T) {
	const retryMax = 200 * time.Millisecond
	c, st, pb, clk := heldByAnother(t, retryMax)
	ctx := context.Background()
	lctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := c.Lock(lctx, "k")
		got <- err
	}()
	for n := int64(1); n <= 5; n++ {
		pb.waitAttempts(t, n)
		clk.BlockUntil(1)
		clk.Advance(retryMax/2 - time.Millisecond)
		if a := pb.attempts.Load(); a != n {
			t.Fatalf("attempt %d: attempted again before retryMax/2 (%d attempts)", n, a)
		}
		clk.Advance(retryMax/2 + time.Millisecond)
	}
	pb.waitAttempts(t, 6)
	if p, want := pb.lastPatience(), 3*retryMax+time.Second; p != want {
		t.Fatalf("patience %v, want %v", p, want)
	}
	cancel()
	if err := <-got; !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock after cancel: %v, want ErrLocked and context.Canceled", err)
	}
	if w := st.Waiters("k"); w != 0 {
		t.Fatalf("%d waiters left queued after cancel", w)
	}
}
