package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/memlock"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []dlock.Event
}

func (r *recorder) Observe(_ context.Context, e dlock.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// take returns the events so far, as "kind key token duration [err]" lines, and
// forgets them.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		s := fmt.Sprintf("%s %s %d %v", e.Kind, e.Key, e.Token, e.Duration)
		if e.Err != nil {
			s += " err"
		}
		out = append(out, s)
	}
	r.events = nil
	return out
}

func (r *recorder) all() []dlock.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// waitEvents waits (in real time, bounded) until n events were seen.
func (r *recorder) waitEvents(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(r.all()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d events, want %d: %v", len(r.all()), n, r.take())
		}
		time.Sleep(time.Millisecond)
	}
}

func wantEvents(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("events:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// The observer sees a lease's life with its key, token and durations on the
// client's clock: request and grant, renewals, a refused TryLock, a re-entry, a
// wait, a loss with its cause, and a release; every event of one lease has its
// lock call's number.
func TestObserverEvents(t *testing.T) {
	rec := &recorder{}
	c, fb, clk := setup(t, dlock.WithTTL(9*time.Second), dlock.WithObserver(rec))
	ctx := context.Background()
	l, err := c.Lock(ctx, "k", dlock.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	first := rec.all()[1].Grant
	wantEvents(t, rec.take(), "requested k 0 0s", "granted k 1 0s")
	clk.BlockUntil(1)
	clk.Advance(3 * time.Second)
	rec.waitEvents(t, 1)
	wantEvents(t, rec.take(), "renewed k 1 0s")
	l2, err := c.TryLock(ctx, "k", dlock.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	if ev := rec.all(); len(ev) != 2 || ev[1].Grant != first || ev[1].Call != ev[0].Call || ev[1].Call == first {
		t.Fatalf("re-entry events %+v: want a call of its own joining grant %d", ev, first)
	}
	wantEvents(t, rec.take(), "requested k 0 0s", "reentered k 1 0s")
	if _, err := c.TryLock(ctx, "k"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatal(err)
	}
	wantEvents(t, rec.take(), "requested k 0 0s", "failed k 0 0s err")
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := rec.all(); len(ev) != 2 || ev[0].Freed || !ev[1].Freed {
		t.Fatalf("released events %+v: want the second to free the grant", ev)
	}
	wantEvents(t, rec.take(), "released k 1 3s", "released k 1 4s")

	// A wait: another client holds the key; the waiter is woken by its release.
	other, err := dlock.New(fb.Store().Backend(), dlock.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	held, err := other.Lock(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease)
	go func() {
		w, err := c.Lock(ctx, "w")
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	rec.waitEvents(t, 1)
	for fb.Store().Waiters("w") == 0 {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(2 * time.Second)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-got
	ev := rec.all()
	wantEvents(t, rec.take(), "requested w 0 0s", "waited w 0 2s", "granted w 2 2s")
	if ev[0].Call != ev[2].Call || ev[2].Grant != ev[2].Call || ev[0].Grant != 0 || ev[0].Owner != w.Owner() || ev[0].Backend != "dlock_test" {
		t.Fatalf("events of one call: %+v", ev)
	}

	// A loss: the server drops the grant, the next renewal is refused.
	fb.Store().Expire("w")
	clk.BlockUntil(1)
	clk.Advance(3 * time.Second)
	waitLost(t, w, "not lost")
	rec.waitEvents(t, 1)
	lost := rec.all()[0]
	wantEvents(t, rec.take(), "lost w 2 3s err")
	if !errors.Is(lost.Err, dlock.ErrLeaseLost) || lost.Call != ev[2].Call {
		t.Fatalf("lost event %+v: want the grant's call and ErrLeaseLost", lost)
	}
	if err := w.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatal(err)
	}
	wantEvents(t, rec.take(), "released w 2 3s err")
}

// The events of a set taken in one step: each key is a call of its own.
func TestObserverLockAll(t *testing.T) {
	rec := &recorder{}
	c, _, _ := setup(t, dlock.WithObserver(rec))
	ctx := context.Background()
	m, err := c.LockAll(ctx, []string{"b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	wantEvents(t, rec.take(), "requested a 0 0s", "requested b 0 0s", "granted a 1 0s", "granted b 1 0s")
	if err := m.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := rec.take()
	slices.Sort(got) // released at once
	wantEvents(t, got, "released a 1 0s", "released b 1 0s")
	if _, err := dlock.New(memlock.NewStore(clock.Real).Backend(), dlock.WithObserver(nil)); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("a nil observer: %v", err)
	}
	if _, err := c.Lock(ctx, "x", dlock.WithObserver(rec)); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("WithObserver on a lock call: %v", err)
	}
}
