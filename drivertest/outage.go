package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// WithdrawAfterOutage checks, for a backend whose waiters hold places in a queue on
// the server (a driver.Notifier), that a waiter that gives up while the server is
// down leaves no place behind once it is back. Its withdrawal fails then; if the
// place stayed, first in line, nobody could take the key once the holder's lease
// lapsed without a release (it could not release either). The waiter's client
// keeps listening for another key throughout, as a client with other waits does
// (on PostgreSQL that keeps its places live however old they are). stop and
// restart stop the harness's server and start it again on the same data.
func WithdrawAfterOutage(t *testing.T, h Harness, stop func(), restart func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	key, other := Key(t, "k"), Key(t, "other")
	// The holder never renews nor releases: its lease lapses after the outage.
	holder := h.Open(t)
	defer holder.Close()
	if _, err := holder.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Acquire(ctx, driver.Request{Key: other, Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// a is a backend, not a client: its waits are registered and stopped here, so
	// that nothing in the test fails on the outage but the withdrawal.
	a := h.Open(t)
	defer a.Close()
	kept, err := a.(driver.Notifier).Watch(ctx, other, "a") // a listens throughout
	if err != nil {
		t.Fatal(err)
	}
	w, err := a.(driver.Notifier).Watch(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, driver.Request{Key: key, Owner: "a", TTL: time.Second, Wait: true, Patience: time.Minute}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a's waiting attempt: %v", err)
	}
	b := h.Client(t, dlock.WithRetry(10*time.Millisecond, 200*time.Millisecond))
	// b's Lock may fail on the lost connections; it locks again, as a worker would.
	got := make(chan error, 1)
	go func() {
		for {
			l, err := b.Lock(ctx, key)
			if err == nil {
				got <- l.Release(context.Background())
				return
			}
			if ctx.Err() != nil {
				got <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	waitQueued(t, ctx, b, key, 2)

	stop()
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	if err := w.Stop(sctx, false); err == nil {
		t.Fatal("a's withdrawal succeeded with the server down")
	}
	scancel()
	if err := restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("b's Lock: %v", err)
		}
	case <-time.After(Wait):
		t.Fatal("b never got the key: the place a left behind stayed first in line")
	}
	if err := kept.Stop(ctx, false); err != nil {
		t.Fatalf("a's other wait: %v", err)
	}
}
