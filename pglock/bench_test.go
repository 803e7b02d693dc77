package pglock_test

import (
	"testing"

	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// Benchmarks run against a server with its default settings (fsync=on,
// synchronous_commit=on, wal_sync_method=fdatasync): every committed write waits for
// a WAL flush, which dominates the cost of a cycle on real disks. Compare the dlock
// cycle with the floor (pglock's FloorCycle: INSERT then DELETE of a row in the lock
// table, with pgx alone) in the same run only.

func BenchmarkCycle(b *testing.B) {
	srv := testserver.StartPostgres(b)
	drivertest.BenchCycle(b, harness(b, srv))
}

// BenchmarkHandoff measures the time from a release to the waiting client's Lock
// returning: the release reserves the lock for the queued waiter and notifies its
// client, whose listening connection receives the NOTIFY, and the waiter's next
// attempt commits the grant. ops/handoff counts write transactions (pglock's
// ServerOps).
func BenchmarkHandoff(b *testing.B) {
	srv := testserver.StartPostgres(b)
	drivertest.BenchHandoff(b, harness(b, srv), nil)
}

// BenchmarkContended runs 2 and 16 workers on one key. Waiters queue on the server
// and are handed the lock in turn, so ops/acq (write transactions per acquisition)
// stays flat as workers grow.
func BenchmarkContended(b *testing.B) {
	srv := testserver.StartPostgres(b)
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, harness(b, srv), w, nil)
	}
}
