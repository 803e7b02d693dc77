package etcdlock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// BenchmarkCycle compares an uncontended Lock+Release with the floor (storeops: one
// lease-bound create-if-absent transaction and one delete with the same client), in
// the same run and interleaved cycle by cycle.
func BenchmarkCycle(b *testing.B) {
	srv := testserver.StartEtcd(b)
	drivertest.BenchCycle(b, harness(b, srv))
}

func BenchmarkHandoff(b *testing.B) {
	srv := testserver.StartEtcd(b)
	drivertest.BenchHandoff(b, harness(b, srv))
}

// BenchmarkContended runs W workers on one key, each with its own client, with dlock
// and, as a peer in the same run, with etcd's own concurrency.Mutex.
func BenchmarkContended(b *testing.B) {
	srv := testserver.StartEtcd(b)
	for _, w := range []int{2, 16} {
		b.Run("dlock", func(b *testing.B) { drivertest.BenchContended(b, harness(b, srv), w) })
		b.Run("concurrency.Mutex", func(b *testing.B) { benchMutex(b, srv, w) })
	}
}

func benchMutex(b *testing.B, srv *testserver.Etcd, workers int) {
	b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
		ctx := context.Background()
		key := drivertest.Key(b, "mutex")
		ms := make([]*concurrency.Mutex, workers)
		for i := range ms {
			s, err := concurrency.NewSession(rawClient(b, srv.Endpoint()), concurrency.WithTTL(15))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			ms[i] = concurrency.NewMutex(s, key)
		}
		var next atomic.Int64
		b.ResetTimer()
		t0 := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					if err := ms[w].Lock(ctx); err != nil {
						b.Error(err)
						return
					}
					if err := ms[w].Unlock(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "acq/s")
	})
}

// BenchmarkSemaphore: acquisitions/s of a semaphore of 4 permits and of a mutex,
// with 1, 4, 16 and 64 workers.
func BenchmarkSemaphore(b *testing.B) {
	srv := testserver.StartEtcd(b)
	for _, w := range []int{1, 4, 16, 64} {
		for _, limit := range []int{1, 4} {
			drivertest.BenchSemaphore(b, harness(b, srv), limit, w)
		}
	}
}

// BenchmarkReaders: reads/s of 1 and of 16 readers of a read-write lock, each
// holding for 5ms: readers hold together, so 16 should reach many times one.
func BenchmarkReaders(b *testing.B) {
	srv := testserver.StartEtcd(b)
	for _, r := range []int{1, 16} {
		drivertest.BenchReaders(b, harness(b, srv), r, 5*time.Millisecond)
	}
}

// BenchmarkMultiKey: a LockAll and Release of a set of 2, 4 and 8 keys (one
// transaction takes the set), against a Lock and Release of each key in turn.
func BenchmarkMultiKey(b *testing.B) {
	srv := testserver.StartEtcd(b)
	for _, n := range []int{2, 4, 8} {
		drivertest.BenchMultiKey(b, harness(b, srv), n)
	}
}
