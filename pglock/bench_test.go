package pglock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// Benchmarks run against a server with its default settings (fsync=on,
// synchronous_commit=on, wal_sync_method=fdatasync): every committed write waits for
// a WAL flush, which dominates the cost of a cycle on real disks. Compare the dlock
// cycle with the floor (internal/storeops: INSERT then DELETE of a row in a table of
// the lock table's shape, with pgx alone) in the same run only.

func BenchmarkCycle(b *testing.B) {
	srv := testserver.StartPostgres(b)
	drivertest.BenchCycle(b, harness(b, srv))
}

// BenchmarkCycleInterleaved alternates one floor cycle and one dlock Lock+Release
// cycle per iteration on the same server, so that both see the same disk and CPU
// weather (fsync latency on a shared machine drifts a lot between two sequential
// benchmarks). It reports both, and their ratio.
func BenchmarkCycleInterleaved(b *testing.B) {
	srv := testserver.StartPostgres(b)
	h := harness(b, srv)
	ctx := context.Background()
	c := h.Client(b)
	fkey, key := drivertest.Key(b, "floor"), drivertest.Key(b, "k")
	var tf, td time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := h.Floor(ctx, fkey); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		l, err := c.Lock(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		td += time.Since(t1)
		tf += t1.Sub(t0)
	}
	b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N), "floor-ns/cycle")
	b.ReportMetric(float64(td.Nanoseconds())/float64(b.N), "dlock-ns/cycle")
	b.ReportMetric(float64(td)/float64(tf), "dlock/floor")
}

// BenchmarkHandoff measures the time from a release to the waiting client's Lock
// returning: the release reserves the lock for the queued waiter and notifies its
// client, whose listening connection receives the NOTIFY, and the waiter's next
// attempt commits the grant. ops/handoff counts write transactions (the harness's
// Ops, from internal/storeops).
func BenchmarkHandoff(b *testing.B) {
	srv := testserver.StartPostgres(b)
	drivertest.BenchHandoff(b, harness(b, srv))
}

// BenchmarkContended runs 2 and 16 workers on one key. Waiters queue on the server
// and are handed the lock in turn, so ops/acq (write transactions per acquisition)
// stays flat as workers grow.
func BenchmarkContended(b *testing.B) {
	srv := testserver.StartPostgres(b)
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, harness(b, srv), w)
	}
}

// BenchmarkSemaphoreCycle measures an uncontended Lock+Release of one permit of a
// semaphore of 4 (one round trip each, two statements in one transaction), beside
// the mutex cycle on the same server.
func BenchmarkSemaphoreCycle(b *testing.B) {
	srv := testserver.StartPostgres(b)
	h := harness(b, srv)
	ctx := context.Background()
	c := h.Client(b)
	for _, limit := range []int{1, 4} {
		key := drivertest.Key(b, "k")
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			for b.Loop() {
				l, err := c.Lock(ctx, key, dlock.WithLimit(limit))
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSemaphore: acquisitions/s of a semaphore of 4 permits and of a mutex,
// with 1, 4 and 16 workers (64 clients, each with its pool and its listener, pass
// the test server's max_connections of 100).
func BenchmarkSemaphore(b *testing.B) {
	srv := testserver.StartPostgres(b)
	for _, w := range []int{1, 4, 16} {
		for _, limit := range []int{1, 4} {
			drivertest.BenchSemaphore(b, harness(b, srv), limit, w)
		}
	}
}

// BenchmarkReaders: reads/s of 1 and of 16 readers of a read-write lock, each
// holding for 5ms: readers hold together, so 16 should reach many times one.
func BenchmarkReaders(b *testing.B) {
	srv := testserver.StartPostgres(b)
	for _, r := range []int{1, 16} {
		drivertest.BenchReaders(b, harness(b, srv), r, 5*time.Millisecond)
	}
}

// BenchmarkMultiKey: LockAll+Release of a free set of 2, 4 and 8 keys, taken in one
// batch (one transaction and round trip: AcquireAll), beside the keys taken one by
// one.
func BenchmarkMultiKey(b *testing.B) {
	srv := testserver.StartPostgres(b)
	for _, n := range []int{2, 4, 8} {
		drivertest.BenchMultiKey(b, harness(b, srv), n)
	}
}
