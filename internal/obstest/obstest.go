// Package obstest is the scripted run that the observer adapters' tests (dlockotel,
// dlockprom) record, on a real server, so that each asserts its own metrics and
// spans for the same events.
package obstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
)

// Key is the key the script locks: "order:1", which a key mapping may turn into
// "order".
const Key = "order:1"

// seen wraps an observer and tells the script each event it passed on.
type seen struct {
	dlock.Observer
	ch chan dlock.Event
}

func (s seen) Observe(ctx context.Context, e dlock.Event) {
	s.Observer.Observe(ctx, e)
	s.ch <- e
}

// waitFor receives events until one of kind k comes, calling step (if not nil)
// whenever none came for a while.
func (s seen) waitFor(t *testing.T, k dlock.EventKind, step func()) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-s.ch:
			if e.Kind == k {
				return
			}
		case <-time.After(20 * time.Millisecond):
			if step != nil {
				step()
			}
		case <-deadline:
			t.Fatalf("no %v event", k)
		}
	}
}

// Run drives two clients of the backend at url, both reporting to obs, on a fake
// clock: client a locks Key (a grant) and renews it once; client b waits for Key;
// a releases it and b gets it (a wait and a grant); the key is released by force
// and b's next renewal is refused (a loss); b releases its lost lease. So obs sees:
// 2 grants, 1 wait, 1 renewal, 1 release that frees a grant, 1 loss, and no lease
// left.
func Run(t *testing.T, url string, obs dlock.Observer) {
	t.Helper()
	ctx := context.Background()
	s := seen{obs, make(chan dlock.Event, 100)}
	clk := clock.NewFake(time.Now())
	open := func() *dlock.Client {
		c, err := dlock.Open(ctx, url, dlock.WithObserver(s), dlock.WithClock(clk), dlock.WithTTL(9*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := open(), open()
	la, err := a.Lock(ctx, Key)
	if err != nil {
		t.Fatal(err)
	}
	clk.BlockUntil(1)
	clk.Advance(3 * time.Second)
	s.waitFor(t, dlock.EventRenewed, nil)

	got := make(chan *dlock.Lease)
	go func() {
		lb, err := b.Lock(ctx, Key)
		if err != nil {
			t.Error(err)
		}
		got <- lb
	}()
	s.waitFor(t, dlock.EventRequested, nil)
	for {
		if info, err := a.Inspect(ctx, Key); err == nil && info.Waiters > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil {
		t.FailNow()
	}
	if err := a.ForceRelease(ctx, Key); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, dlock.EventLost, func() { clk.Advance(time.Second) })
	if err := lb.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of the lost lease: %v", err)
	}
}
