package mysqllock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// Benchmarks run against a server with its default settings
// (innodb_flush_log_at_trx_commit=1: every commit waits for a redo log flush, which
// dominates a cycle on real disks). The floor is an INSERT then a DELETE of a row in
// a table of the lock table's shape, with the same driver (see floor in
// mysqllock_test.go). Compare them in the same run only.

func BenchmarkCycle(b *testing.B) {
	srv := testserver.StartMariaDB(b)
	drivertest.BenchCycle(b, harness(b, srv))
}

// BenchmarkCycleInterleaved alternates one floor cycle and one dlock Lock+Release
// cycle per iteration on the same server, so that both see the same disk and CPU
// weather, and reports both and their ratio.
func BenchmarkCycleInterleaved(b *testing.B) {
	srv := testserver.StartMariaDB(b)
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
// returning (release, KILL QUERY of the waiter's listening connection, its read,
// the waiter's acquire).
func BenchmarkHandoff(b *testing.B) {
	srv := testserver.StartMariaDB(b)
	drivertest.BenchHandoff(b, harness(b, srv))
}

// BenchmarkContended runs 2 and 16 workers on one key.
func BenchmarkContended(b *testing.B) {
	srv := testserver.StartMariaDB(b)
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, harness(b, srv), w)
	}
}
