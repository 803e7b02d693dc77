package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// Queue: Waiters lists the queued places in the order they will be served, a
// reader's place marked Shared (on a backend with read-write locks), each with
// its owner and value; a place whose waiter gave up is gone from the list, and a
// free key has none.
func (h Harness) testQueue(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	if _, ok := c.Backend().(driver.Queuer); !ok {
		if _, err := c.Waiters(ctx, Key(t, "k")); !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("Waiters on a backend that is not a Queuer: %v, want ErrUnsupported", err)
		}
		t.Skip("backend is not a Queuer")
	}
	key := Key(t, "k")
	if places, err := c.Waiters(ctx, key); err != nil || len(places) != 0 {
		t.Fatalf("Waiters of a free key = %+v, %v; want none", places, err)
	}
	holder := MustLock(t, ctx, h.Client(t), key)
	s, ok := c.Backend().(driver.Sharer)
	readers := ok && s.Shares()
	type waiter struct {
		c      *dlock.Client
		cancel context.CancelFunc
		done   chan error
		shared bool
	}
	var ws []*waiter
	for i := range 3 {
		w := &waiter{c: h.Client(t), done: make(chan error, 1), shared: readers && i == 1}
		var wctx context.Context
		wctx, w.cancel = context.WithCancel(ctx)
		opts := []dlock.Option{dlock.WithValue([]byte{byte('a' + i)})}
		if _, ok := w.c.Backend().(driver.Valuer); !ok {
			opts = nil
		}
		if w.shared {
			opts = append(opts, shared)
		}
		go func() {
			l, err := w.c.Lock(wctx, key, opts...)
			if err == nil {
				err = l.Release(ctx)
			}
			w.done <- err
		}()
		waitPlaces(t, ctx, c, key, i+1)
		ws = append(ws, w)
	}
	places, err := c.Waiters(ctx, key)
	if err != nil || len(places) != 3 {
		t.Fatalf("Waiters = %+v, %v; want 3 places", places, err)
	}
	for i, p := range places {
		if p.Shared != ws[i].shared || p.Token != 0 || p.Key != key || p.Owner == "" || p.Owner == holder.Owner() {
			t.Fatalf("place %d = %+v; want shared=%v, an owner, token 0", i, p, ws[i].shared)
		}
		if _, ok := c.Backend().(driver.Valuer); ok && string(p.Value) != string(rune('a'+i)) {
			t.Fatalf("place %d's value = %q, want %q (queue order)", i, p.Value, string(rune('a'+i)))
		}
	}
	ws[1].cancel()
	if err := <-ws[1].done; !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("the cancelled waiter: %v", err)
	}
	places, err = c.Waiters(ctx, key)
	if err != nil || len(places) != 2 || places[0].Owner == places[1].Owner {
		t.Fatalf("Waiters after one gave up = %+v, %v; want the other two", places, err)
	}
	MustRelease(t, ctx, holder)
	for _, i := range []int{0, 2} {
		if err := <-ws[i].done; err != nil {
			t.Fatalf("waiter %d: %v", i, err)
		}
		ws[i].cancel()
	}
	if places, err := c.Waiters(ctx, key); err != nil || len(places) != 0 {
		t.Fatalf("Waiters once all were served = %+v, %v; want none", places, err)
	}
}

// waitPlaces waits until Waiters lists n places of key.
func waitPlaces(t *testing.T, ctx context.Context, c *dlock.Client, key string, n int) {
	t.Helper()
	for {
		places, err := c.Waiters(ctx, key)
		if err == nil && len(places) >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiter %d never queued (last Waiters: %+v, %v)", n, places, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
