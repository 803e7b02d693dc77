package drivertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// semaphoreBackend skips a test of a backend that cannot have several holders.
func (h Harness) semaphoreBackend(t *testing.T, c *dlock.Client) {
	t.Helper()
	if _, ok := c.Backend().(driver.Semaphorer); !ok {
		t.Skip("backend is not a Semaphorer")
	}
}

// SemaphoreLimit: up to N owners hold a key at once, each with its own rising
// token; the next is refused until one releases; Holders lists them; a call with
// another limit is refused while the key is held, and accepted once it is free.
func (h Harness) testSemaphoreLimit(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	h.semaphoreBackend(t, c)
	key := Key(t, "k")
	var leases []*dlock.Lease
	var last dlock.Token
	for i := range 3 {
		l, err := h.Client(t).TryLock(ctx, key, dlock.WithLimit(3))
		if err != nil {
			t.Fatalf("permit %d of 3: %v", i+1, err)
		}
		h.checkToken(t, l.Token())
		if h.Fencing && l.Token() <= last {
			t.Fatalf("permit %d's token %d not above %d", i+1, l.Token(), last)
		}
		last = l.Token()
		leases = append(leases, l)
	}
	if _, err := c.TryLock(ctx, key, dlock.WithLimit(3)); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("a fourth holder of 3: %v, want ErrLocked", err)
	}
	for _, opts := range [][]dlock.Option{{dlock.WithLimit(2)}, nil} {
		if _, err := c.TryLock(ctx, key, opts...); !errors.Is(err, dlock.ErrLimitMismatch) || !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("another limit while held (%d options): %v, want ErrLimitMismatch", len(opts), err)
		}
	}
	limit, holders, err := c.Holders(ctx, key)
	if err != nil || limit != 3 || len(holders) != 3 {
		t.Fatalf("Holders = %d, %d holders, %v; want 3, 3", limit, len(holders), err)
	}
	for i, hi := range holders {
		if hi.Owner != leases[i].Owner() || hi.Token != leases[i].Token() || hi.TTL <= 0 {
			t.Fatalf("holder %d = %+v, want owner %s token %d (oldest first)", i, hi, leases[i].Owner(), leases[i].Token())
		}
	}
	MustRelease(t, ctx, leases[1])
	l, err := c.TryLock(ctx, key, dlock.WithLimit(3))
	if err != nil {
		t.Fatalf("TryLock after a permit was released: %v", err)
	}
	if h.Fencing && l.Token() <= last {
		t.Fatalf("token %d after release not above %d", l.Token(), last)
	}
	for _, x := range []*dlock.Lease{leases[0], leases[2], l} {
		MustRelease(t, ctx, x)
	}
	if limit, holders, err := c.Holders(ctx, key); err != nil || limit != 0 || len(holders) != 0 {
		t.Fatalf("Holders of a free key = %d, %v, %v", limit, holders, err)
	}
	l = MustLock(t, ctx, c, key, dlock.WithLimit(2)) // free: a new limit applies
	MustRelease(t, ctx, l)
}

// SemaphoreExclusion: many clients on separate connections never have more than N
// inside at once, and do overlap up to N.
func (h Harness) testSemaphoreExclusion(t *testing.T) {
	ctx := ctxT(t)
	h.semaphoreBackend(t, h.Client(t))
	const clients, rounds, n = 6, 6, 3
	key := Key(t, "k")
	var inside, most atomic.Int64
	var tokens sync.Map
	var wg sync.WaitGroup
	for range clients {
		c := h.Client(t)
		wg.Go(func() {
			for range rounds {
				err := c.Do(ctx, key, func(ctx context.Context, l *dlock.Lease) error {
					now := inside.Add(1)
					defer inside.Add(-1)
					for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
					}
					if _, dup := tokens.LoadOrStore(l.Token(), true); dup && h.Fencing {
						t.Errorf("token %d granted twice", l.Token())
					}
					time.Sleep(15 * time.Millisecond)
					return nil
				}, dlock.WithLimit(n))
				if err != nil {
					t.Errorf("Do: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m > n || m < 2 {
		t.Fatalf("at most %d inside at once, want 2 to %d", m, n)
	}
}

// SemaphoreCrashedHolder: a holder that dies without releasing frees its permit
// after its TTL, and a waiter gets it; a waiter that gives up leaves no permit
// reserved behind it.
func (h Harness) testSemaphoreCrash(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	h.semaphoreBackend(t, c)
	key := Key(t, "k")
	crashed := h.Open(t)
	defer crashed.Close()
	if _, err := crashed.Acquire(ctx, driver.Request{Key: key, Owner: "crashed", TTL: time.Second, Limit: 2}); err != nil {
		t.Fatalf("raw Acquire: %v", err)
	}
	live := MustLock(t, ctx, h.Client(t), key, dlock.WithLimit(2))
	// A waiter that gives up while both permits are held.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.Lock(wctx, key, dlock.WithLimit(2))
	cancel()
	if !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("Lock past its deadline: %v, want ErrLocked", err)
	}
	start := time.Now()
	l := MustLock(t, ctx, c, key, dlock.WithLimit(2)) // the crashed holder's permit
	if d := time.Since(start); d > Wait/2 {
		t.Fatalf("the crashed holder's permit came back only after %v", d)
	}
	if h.Fencing && l.Token() <= live.Token() {
		t.Fatalf("token %d not above %d", l.Token(), live.Token())
	}
	MustRelease(t, ctx, live)
	// The cancelled waiter left nothing: the freed permit goes to a newcomer.
	l2, err := h.Client(t).TryLock(ctx, key, dlock.WithLimit(2))
	if err != nil {
		t.Fatalf("TryLock after a release, with a cancelled waiter behind: %v", err)
	}
	MustRelease(t, ctx, l)
	MustRelease(t, ctx, l2)
}

// BenchSemaphore runs W workers, each with its own client, looping Lock+Release
// of one permit of a semaphore of limit permits on one key, for b.N acquisitions in
// all. It reports acquisitions/s and fails if more than limit were ever inside.
// Run it with limit 1 beside the semaphore to compare with a mutex.
func BenchSemaphore(b *testing.B, h Harness, limit, workers int) {
	b.Run(fmt.Sprintf("limit=%d/workers=%d", limit, workers), func(b *testing.B) {
		cs := h.clients(b, workers)
		if _, ok := cs[0].Backend().(driver.Semaphorer); !ok && limit > 1 {
			b.Skip("backend is not a Semaphorer")
		}
		var inside, most atomic.Int64
		rate := lockLoop(b, cs, Key(b, "k"), []dlock.Option{dlock.WithLimit(limit)}, func() {
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			inside.Add(-1)
		})
		if m := most.Load(); m > int64(limit) {
			b.Fatalf("%d holders inside at once, limit %d", m, limit)
		}
		b.ReportMetric(rate, "acq/s")
	})
}

// clients opens n clients, each on its own connection.
func (h Harness) clients(b *testing.B, n int) []*dlock.Client {
	cs := make([]*dlock.Client, n)
	for i := range cs {
		cs[i] = h.Client(b)
	}
	return cs
}

// lockLoop has each client loop Lock(key, opts), hold, Release until b.N locks
// were taken in all, and returns the locks per second; a failed Lock or Release
// fails the benchmark. Each client first takes and gives back the key once,
// untimed, so that the rate is the steady one: a client's first lock opens its
// connections (and, on some backends, prepares statements or starts a
// listener), which in a short run weighs on 16 clients more than on one.
func lockLoop(b *testing.B, cs []*dlock.Client, key string, opts []dlock.Option, hold func()) float64 {
	ctx := context.Background()
	for _, c := range cs {
		l, err := c.Lock(ctx, key, opts...)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	errs := make(chan error, len(cs))
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for _, c := range cs {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				l, err := c.Lock(ctx, key, opts...)
				if err != nil {
					errs <- err
					return
				}
				hold()
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(b.N) / elapsed.Seconds()
}
