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

// sharerBackend skips a test of a backend without read-write locks.
func (h Harness) sharerBackend(t *testing.T, c *dlock.Client) {
	t.Helper()
	if s, ok := c.Backend().(driver.Sharer); !ok || !s.Shares() {
		t.Skip("backend is not a Sharer")
	}
}

var shared = dlock.WithShared()

// RWLock: readers hold together, a writer alone; a writer's token is larger than
// every earlier reader's; Holders (on a Semaphorer or a HolderLister) lists both
// readers, marked shared; a semaphore's key cannot be taken shared.
func (h Harness) testRWLock(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	h.sharerBackend(t, c)
	key := Key(t, "k")
	r1, err := h.Client(t).TryLock(ctx, key, shared)
	if err != nil {
		t.Fatalf("first reader: %v", err)
	}
	r2, err := h.Client(t).TryLock(ctx, key, shared)
	if err != nil {
		t.Fatalf("second reader beside the first: %v", err)
	}
	if !r1.Shared() || !r2.Shared() {
		t.Fatal("reader leases do not say Shared")
	}
	if _, err := c.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("writer while readers hold: %v, want ErrLocked", err)
	}
	_, sem := c.Backend().(driver.Semaphorer)
	_, lister := c.Backend().(driver.HolderLister)
	if sem || lister {
		_, holders, err := c.Holders(ctx, key)
		if err != nil || len(holders) != 2 || !holders[0].Shared || !holders[1].Shared {
			t.Fatalf("Holders = %+v, %v; want the two readers, shared", holders, err)
		}
	}
	MustRelease(t, ctx, r1)
	MustRelease(t, ctx, r2)
	w := MustLock(t, ctx, c, key)
	if h.Fencing && (w.Token() <= r1.Token() || w.Token() <= r2.Token()) {
		t.Fatalf("writer's token %d not above the readers' %d and %d", w.Token(), r1.Token(), r2.Token())
	}
	if _, err := h.Client(t).TryLock(ctx, key, shared); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("reader while a writer holds: %v, want ErrLocked", err)
	}
	MustRelease(t, ctx, w)
	if _, ok := c.Backend().(driver.Semaphorer); ok {
		sem := Key(t, "sem")
		l := MustLock(t, ctx, c, sem, dlock.WithLimit(2))
		if _, err := h.Client(t).TryLock(ctx, sem, shared); !errors.Is(err, dlock.ErrLimitMismatch) {
			t.Fatalf("a semaphore's key taken shared: %v, want ErrLimitMismatch", err)
		}
		MustRelease(t, ctx, l)
	}
}

// RWNoStarvation: a reader that arrives while a writer waits queues behind it,
// and the writer gets the key when the readers ahead of it release.
func (h Harness) testRWNoStarvation(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	h.sharerBackend(t, c)
	key := Key(t, "k")
	r1 := MustLock(t, ctx, h.Client(t), key, shared)
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Lock(ctx, key)
		if err != nil {
			t.Errorf("writer: %v", err)
		}
		got <- l
	}()
	waitQueued(t, ctx, c, key, 1)
	if l, err := h.Client(t).TryLock(ctx, key, shared); !errors.Is(err, dlock.ErrLocked) {
		if err == nil {
			_ = l.Release(ctx)
		}
		t.Fatalf("a reader passed a queued writer: %v", err)
	}
	MustRelease(t, ctx, r1)
	w := <-got
	if w == nil {
		t.FailNow()
	}
	if h.Fencing && w.Token() <= r1.Token() {
		t.Fatalf("writer's token %d not above the reader's %d", w.Token(), r1.Token())
	}
	MustRelease(t, ctx, w)
}

// RWExclusion: readers and writers on separate connections: a writer is never
// beside anyone, and readers do overlap.
func (h Harness) testRWExclusion(t *testing.T) {
	ctx := ctxT(t)
	h.sharerBackend(t, h.Client(t))
	const readers, writers, rounds = 4, 2, 5
	key := Key(t, "k")
	var reading, writing, mostReaders atomic.Int64
	var wg sync.WaitGroup
	work := func(c *dlock.Client, write bool) {
		for range rounds {
			var opts []dlock.Option
			if !write {
				opts = append(opts, shared)
			}
			err := c.Do(ctx, key, func(ctx context.Context, l *dlock.Lease) error {
				if write {
					if writing.Add(1) != 1 || reading.Load() != 0 {
						t.Errorf("a writer beside %d readers and %d writers", reading.Load(), writing.Load()-1)
					}
					time.Sleep(10 * time.Millisecond)
					writing.Add(-1)
					return nil
				}
				n := reading.Add(1)
				for m := mostReaders.Load(); n > m && !mostReaders.CompareAndSwap(m, n); m = mostReaders.Load() {
				}
				if writing.Load() != 0 {
					t.Errorf("a reader beside a writer")
				}
				time.Sleep(20 * time.Millisecond)
				reading.Add(-1)
				return nil
			}, opts...)
			if err != nil {
				t.Errorf("Do: %v", err)
				return
			}
		}
	}
	for i := range readers + writers {
		c := h.Client(t)
		wg.Go(func() { work(c, i >= readers) })
	}
	wg.Wait()
	if mostReaders.Load() < 2 {
		t.Fatalf("readers never overlapped (at most %d at once)", mostReaders.Load())
	}
}

// BenchReaders runs R readers, each with its own client, looping a shared Lock,
// hold (a read), Release on one key, for b.N reads in all, and reports reads/s.
// Readers hold together, so with a hold longer than a round trip R readers reach
// close to R times one reader's rate; BenchmarkReaders in each backend runs 1 and
// 16 readers in one run to show the ratio.
func BenchReaders(b *testing.B, h Harness, readers int, hold time.Duration) {
	b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
		cs := h.clients(b, readers)
		if s, ok := cs[0].Backend().(driver.Sharer); !ok || !s.Shares() {
			b.Skip("backend is not a Sharer")
		}
		rate := lockLoop(b, cs, Key(b, "k"), []dlock.Option{shared}, func() { time.Sleep(hold) })
		b.ReportMetric(rate, "reads/s")
		if h.Floor != nil {
			floor := floorLoop(b, h.Floor, readers, b.N, hold)
			b.ReportMetric(floor, "floor-reads/s")
			b.ReportMetric(rate/floor, "reads/floor")
		}
	})
}

// floorLoop runs n floor cycles, each followed by a pause of hold, on workers
// goroutines that each use a key of its own (so they never contend), and returns
// the cycles per second: how far the server lets that many clients' writes run
// in parallel with no lock between them, the bound of readers' throughput on a
// backend whose grant and release each write. Each worker runs one cycle first,
// untimed, as lockLoop's clients do.
func floorLoop(b *testing.B, floor func(context.Context, string) error, workers, n int, hold time.Duration) float64 {
	ctx := context.Background()
	for i := range workers {
		if err := floor(ctx, Key(b, fmt.Sprint("floor", i))); err != nil {
			b.Fatal(err)
		}
	}
	var left atomic.Int64
	left.Store(int64(n))
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range workers {
		key := Key(b, fmt.Sprint("floor", i))
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := floor(ctx, key); err != nil {
					errs <- err
					return
				}
				time.Sleep(hold)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}
