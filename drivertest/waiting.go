package drivertest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// A waiting Lock whose ctx ends, whether between attempts or during a request to
// the server, returns an error matching both ErrLocked and ctx.Err(); TryLock's
// matches ctx.Err().
func (h Harness) testWaiterDeadlines(t *testing.T) {
	ctx := ctxT(t)
	holder, c := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l := MustLock(t, ctx, holder, key)
	const n = 60
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			// Deadlines from 0 to 30ms, so many end during a request.
			wctx, cancel := context.WithTimeout(ctx, time.Duration(i)*time.Millisecond/2)
			defer cancel()
			_, err := c.Lock(wctx, key)
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock with a short deadline on a held key = %v, want ErrLocked and DeadlineExceeded", err)
		}
	}
	tctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.TryLock(tctx, key); !errors.Is(err, context.Canceled) {
		t.Errorf("TryLock with a cancelled ctx = %v, want context.Canceled", err)
	}
	MustRelease(t, ctx, l)
}

// A waiter that gives up leaves nothing behind: no queued place blocks the next taker.
func (h Harness) testCancelledWaiter(t *testing.T) {
	ctx := ctxT(t)
	a, b, c := h.Client(t), h.Client(t), h.Client(t)
	key := Key(t, "k")
	l := MustLock(t, ctx, a, key)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := b.Lock(wctx, key)
	cancel()
	if !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled Lock = %v, want ErrLocked and DeadlineExceeded", err)
	}
	MustRelease(t, ctx, l)
	l2, err := c.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after the waiter gave up and the holder released: %v", err)
	}
	if in, ok := c.Backend().(driver.Inspector); ok {
		info, err := in.Inspect(ctx, key)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if info.Waiters > 0 {
			t.Fatalf("Inspect shows %d waiters after the only waiter gave up", info.Waiters)
		}
	}
	MustRelease(t, ctx, l2)
}

// A waiter that gives up just as the holder releases passes the key on, whether the
// release handed the key to it or only woke it: the next waiter gets the key at
// once, long before any grant's TTL could run out.
func (h Harness) testCancelDuringHandoff(t *testing.T) {
	ctx := ctxT(t)
	key := Key(t, "k")
	const ttl = time.Minute // far beyond Wait: a grant left behind fails the test
	holder := h.Open(t)
	defer holder.Close()
	if _, err := holder.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: ttl}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	first := h.Open(t)
	defer first.Close()
	n, ok := first.(driver.Notifier)
	if !ok {
		t.Skip("backend has no Notifier")
	}
	w, err := n.Watch(ctx, key, "first-waiter")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	req := driver.Request{Key: key, Owner: "first-waiter", TTL: ttl, Wait: true, Patience: ttl}
	if _, err := first.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		w.Stop(ctx, false)
		t.Fatalf("waiting Acquire on a held key: %v, want ErrLocked", err)
	}
	// A second waiter, through the core, queues behind the first.
	c := h.Client(t, dlock.WithTTL(ttl))
	got := make(chan error, 1)
	go func() {
		l, err := c.Lock(ctx, key)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	waitQueued(t, ctx, c, key, 2)
	if err := holder.Release(ctx, key, "holder"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The release hands the key to the first waiter (or wakes it); it gives up
	// without acquiring.
	select {
	case <-w.C():
	case <-time.After(2 * time.Second):
	}
	if err := w.Stop(ctx, false); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("second waiter: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("the second waiter did not get the key after the first gave up")
	}
	l, err := h.Client(t).TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after both waiters: %v", err)
	}
	MustRelease(t, ctx, l)
}

// Waiters whose Lock is cancelled at about the moment the holder releases leave
// nothing held: after each round another client gets the key at once.
func (h Harness) testCancelRace(t *testing.T) {
	ctx := ctxT(t)
	key := Key(t, "k")
	const ttl = time.Minute
	a, b, c := h.Client(t, dlock.WithTTL(ttl)), h.Client(t, dlock.WithTTL(ttl)), h.Client(t, dlock.WithTTL(ttl))
	for i := range 10 {
		l := MustLock(t, ctx, a, key)
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan *dlock.Lease, 1)
		go func() {
			l2, _ := b.Lock(wctx, key)
			got <- l2
		}()
		waitQueued(t, ctx, b, key, 1)
		// Release and cancel at once, in either order.
		if i%2 == 0 {
			go cancel()
			MustRelease(t, ctx, l)
		} else {
			go func() { _ = l.Release(ctx) }()
			cancel()
		}
		if l2 := <-got; l2 != nil {
			MustRelease(t, ctx, l2)
		}
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		l3, err := c.Lock(cctx, key)
		ccancel()
		if err != nil {
			t.Fatalf("round %d: the key stayed held after the cancelled waiter returned: %v", i, err)
		}
		MustRelease(t, ctx, l3)
	}
}

// A waiting Lock gets the key when the holder releases it.
func (h Harness) testHandoff(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l := MustLock(t, ctx, a, key)
	got := make(chan *dlock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l2, err := b.Lock(ctx, key)
		if err != nil {
			errc <- err
			return
		}
		got <- l2
	}()
	select {
	case l2 := <-got:
		t.Fatalf("waiter got the key while it was held (token %d)", l2.Token())
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	MustRelease(t, ctx, l)
	select {
	case l2 := <-got:
		if h.Fencing && l2.Token() <= l.Token() {
			t.Fatalf("handoff token %d not above %d", l2.Token(), l.Token())
		}
		MustRelease(t, ctx, l2)
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	}
}

// Waiters get the key in the order they started waiting, and the releaser does not
// win it back while others wait.
func (h Harness) testFIFO(t *testing.T) {
	ctx := ctxT(t)
	key := Key(t, "k")
	holder := h.Client(t)
	l := MustLock(t, ctx, holder, key)
	const n = 4
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		c := h.Client(t)
		started := make(chan struct{})
		wg.Go(func() {
			close(started)
			w, err := c.Lock(ctx, key)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			if err := w.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		})
		<-started
		waitQueued(t, ctx, c, key, i+1)
	}
	MustRelease(t, ctx, l)
	// The releaser asks again at once; it must queue behind the waiters.
	l2 := MustLock(t, ctx, holder, key)
	MustRelease(t, ctx, l2)
	wg.Wait()
	close(order)
	i := 0
	for got := range order {
		if got != i {
			t.Fatalf("waiter %d got the key in turn %d", got, i)
		}
		i++
	}
	if i != n {
		t.Fatalf("only %d of %d waiters got the key", i, n)
	}
}

// waitQueued waits until the backend reports n queued waiters, or, without an
// Inspector, gives the waiter time to queue.
func waitQueued(t *testing.T, ctx context.Context, c *dlock.Client, key string, n int) {
	in, ok := c.Backend().(driver.Inspector)
	if !ok {
		time.Sleep(100 * time.Millisecond)
		return
	}
	for {
		info, err := in.Inspect(ctx, key)
		if err == nil && info.Waiters >= n {
			return
		}
		if err == nil && info.Waiters < 0 {
			// The backend cannot count waiters: give the waiter time to queue.
			time.Sleep(100 * time.Millisecond)
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiter %d never queued (last Inspect: %+v, %v)", n, info, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
