package mysqllock_test

import (
	"testing"
	"time"

	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// Benchmarks run against a server with its default settings
// (innodb_flush_log_at_trx_commit=1: every commit waits for a redo log flush, which
// dominates a cycle on real disks). The floor is an INSERT then a DELETE of a row in
// a table of the lock table's shape, with the same driver, each statement prepared
// once, as `dlock bench` measures it (internal/storeops/mysqlops). Compare them in
// the same run only.

// BenchmarkCycle: dlock's cycle, the floor's, and both paired cycle by cycle
// ("interleaved", whose dlock/floor ratio is the number to compare).
func BenchmarkCycle(b *testing.B) {
	srv := testserver.StartMariaDB(b)
	drivertest.BenchCycle(b, harness(b, srv))
}

// BenchmarkHandoff measures the time from a release to the waiting client's Lock
// returning (the release, which grants the key to the waiter's place, KILL QUERY
// of the waiter's listening connection, and its read of the grant).
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

// BenchmarkSemaphore: acquisitions/s of a semaphore of 4 permits and of a mutex,
// with 1, 4 and 16 workers (each its own client: a pool and a listener).
func BenchmarkSemaphore(b *testing.B) {
	srv := testserver.StartMariaDB(b)
	for _, w := range []int{1, 4, 16} {
		for _, limit := range []int{1, 4} {
			drivertest.BenchSemaphore(b, harness(b, srv), limit, w)
		}
	}
}

// BenchmarkReaders: reads/s of 1 and of 16 readers of a read-write lock, each
// holding for 5ms: readers hold together, so 16 should reach many times one.
func BenchmarkReaders(b *testing.B) {
	srv := testserver.StartMariaDB(b)
	for _, r := range []int{1, 16} {
		drivertest.BenchReaders(b, harness(b, srv), r, 5*time.Millisecond)
	}
}
