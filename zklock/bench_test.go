package zklock_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

func BenchmarkCycle(b *testing.B) {
	srv := testserver.StartZooKeeper(b)
	warmUp(b, srv)
	b.Run("floor=create+delete", func(b *testing.B) { benchFloor(b, srv) })
	b.Run("dlock", func(b *testing.B) { drivertest.BenchCycle(b, harness(b, srv)) })
	b.Run("interleaved", func(b *testing.B) { benchInterleaved(b, srv) })
}

// benchInterleaved alternates one floor cycle and one dlock cycle, so that both see
// the same machine load (this matters on a shared machine), and reports their
// medians and the ratio of the medians.
func benchInterleaved(b *testing.B, srv *testserver.ZooKeeper) {
	ctx := context.Background()
	conn := rawConn(b, srv.Addr())
	parent := "/floor-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := conn.Create(parent, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		b.Fatal(err)
	}
	c := harness(b, srv).Client(b)
	key := drivertest.Key(b, "k")
	floor := make([]time.Duration, 0, b.N)
	cycle := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		p, err := conn.Create(parent+"/n", []byte("15000"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		if err != nil {
			b.Fatal(err)
		}
		if err := conn.Delete(p, -1); err != nil {
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
		floor, cycle = append(floor, t1.Sub(t0)), append(cycle, time.Since(t1))
	}
	f, d := drivertest.Percentile(floor, 0.5), drivertest.Percentile(cycle, 0.5)
	b.ReportMetric(float64(f), "floor-p50-ns")
	b.ReportMetric(float64(d), "dlock-p50-ns")
	b.ReportMetric(float64(d)/float64(f), "dlock/floor")
}

// warmUp runs the server's hot paths until the JIT compiler has done its work, so
// that the first sub-benchmark is not slowed by it.
func warmUp(b *testing.B, srv *testserver.ZooKeeper) {
	conn := rawConn(b, srv.Addr())
	parent := "/warm-up-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := conn.Create(parent, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		b.Fatal(err)
	}
	for range 5000 {
		p, err := conn.Create(parent+"/n-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := conn.Children(parent); err != nil {
			b.Fatal(err)
		}
		if err := conn.Delete(p, -1); err != nil {
			b.Fatal(err)
		}
	}
}

// benchFloor is the least a ZooKeeper lock can do: create an ephemeral node, delete
// it, on one session of the same client library.
func benchFloor(b *testing.B, srv *testserver.ZooKeeper) {
	conn := rawConn(b, srv.Addr())
	parent := "/floor-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := conn.Create(parent, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		p, err := conn.Create(parent+"/n", []byte("15000"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		if err != nil {
			b.Fatal(err)
		}
		if err := conn.Delete(p, -1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHandoff(b *testing.B) {
	srv := testserver.StartZooKeeper(b)
	drivertest.BenchHandoff(b, harness(b, srv))
}

func BenchmarkContended(b *testing.B) {
	srv := testserver.StartZooKeeper(b)
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, harness(b, srv), w)
	}
}

// BenchmarkSemaphore: acquisitions/s of a semaphore of 4 permits and of a mutex,
// with 1, 4, 16 and 64 workers.
func BenchmarkSemaphore(b *testing.B) {
	srv := testserver.StartZooKeeper(b)
	for _, w := range []int{1, 4, 16, 64} {
		for _, limit := range []int{1, 4} {
			drivertest.BenchSemaphore(b, harness(b, srv), limit, w)
		}
	}
}

// BenchmarkReaders: reads/s of 1 and of 16 readers of a read-write lock, each
// holding for 5ms: readers hold together, so 16 should reach many times one.
func BenchmarkReaders(b *testing.B) {
	srv := testserver.StartZooKeeper(b)
	for _, r := range []int{1, 16} {
		drivertest.BenchReaders(b, harness(b, srv), r, 5*time.Millisecond)
	}
}

// BenchmarkMultiKey: sets of 2, 4 and 8 free keys taken with LockAll (one multi,
// see AcquireAll) and released, against the same keys locked one by one.
func BenchmarkMultiKey(b *testing.B) {
	srv := testserver.StartZooKeeper(b)
	for _, n := range []int{2, 4, 8} {
		drivertest.BenchMultiKey(b, harness(b, srv), n)
	}
}
