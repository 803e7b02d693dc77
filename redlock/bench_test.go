package redlock_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// benchNodes starts n masters. With DLOCK_BENCH_SERVER_CPUS set (a taskset CPU list
// such as "1"), the servers are moved to those CPUs, so that a benchmark binary
// pinned elsewhere does not share its CPU with them.
func benchNodes(b *testing.B, n int) []*testserver.Redis {
	nodes := testserver.StartRedisNodes(b, n)
	if cpus := os.Getenv("DLOCK_BENCH_SERVER_CPUS"); cpus != "" {
		for _, s := range nodes {
			if out, err := exec.Command("taskset", "-p", "-c", cpus, strconv.Itoa(s.Pid())).CombinedOutput(); err != nil {
				b.Fatalf("taskset: %v: %s", err, out)
			}
		}
	}
	return nodes
}

const benchQuery = "node_timeout=50ms"

func benchHarness(b *testing.B, nodes []*testserver.Redis) drivertest.Harness {
	h := harness(b, nodes)
	h.Open = func(t testing.TB) driver.Backend { return open(t, testserver.RedlockURL(nodes, benchQuery)) }
	return h
}

// BenchmarkCycle compares, in one run, an uncontended Lock+Release cycle of Redlock
// over 5 local masters ("dlock") with the single-instance floor ("floor": SET NX PX
// plus a compare-and-delete script on one node, same client library). The other
// sub-benchmarks explain the ratio: "backend" is Redlock without the dlock core
// (Acquire+Release), "ping-1" one PING to one node, "ping-5" one PING to each of the
// 5 nodes in parallel (the cost of one fan-out round on this machine).
func BenchmarkCycle(b *testing.B) {
	nodes := benchNodes(b, 5)
	h := benchHarness(b, nodes)
	drivertest.BenchCycle(b, h)
	ctx := context.Background()
	b.Run("backend", func(b *testing.B) {
		be := open(b, testserver.RedlockURL(nodes, benchQuery))
		defer be.Close()
		key := drivertest.Key(b, "k")
		req := driver.Request{Key: key, Owner: "owner-value-0123456789abcdef", TTL: 15 * time.Second}
		before, err := be.ServerOps(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := be.Acquire(ctx, req); err != nil {
				b.Fatal(err)
			}
			if err := be.Release(ctx, key, req.Owner); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		after, err := be.ServerOps(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(after-before)/float64(b.N), "cmds/op")
	})
	b.Run("ping-1", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: nodes[0].Addr(), ContextTimeoutEnabled: true})
		defer rdb.Close()
		for b.Loop() {
			if err := rdb.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ping-5", func(b *testing.B) {
		be := open(b, testserver.RedlockURL(nodes, benchQuery))
		defer be.Close()
		for b.Loop() {
			if err := be.Ping(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCyclePausedNode is the uncontended cycle with one of the 5 nodes stopped
// (SIGSTOP): each of the two rounds waits for the node timeout (50ms here).
func BenchmarkCyclePausedNode(b *testing.B) {
	nodes := benchNodes(b, 5)
	nodes[4].Pause()
	defer nodes[4].Resume()
	drivertest.BenchCycle(b, benchHarness(b, nodes))
}

func BenchmarkHandoff(b *testing.B) {
	nodes := benchNodes(b, 5)
	drivertest.BenchHandoff(b, benchHarness(b, nodes), nil)
}

func BenchmarkContended(b *testing.B) {
	nodes := benchNodes(b, 5)
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, benchHarness(b, nodes), w, nil)
	}
}
