package redlock_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

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

// benchQuery sets a node timeout that a busy benchmark machine does not hit on
// healthy nodes; BenchmarkCyclePausedNode sets its own.
const benchQuery = "node_timeout=1s"

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
// 5 nodes in parallel (the cost of one fan-out round on this machine), and
// "ping-5-sequential" the same one node after the other.
func BenchmarkCycle(b *testing.B) {
	nodes := benchNodes(b, 5)
	cycleBenchmarks(b, nodes, testserver.RedlockURL(nodes, benchQuery))
}

// BenchmarkCycleDelayed is BenchmarkCycle with every node behind a proxy that delays
// each direction by 0.5ms (more on a busy machine, where the sleeps overshoot;
// "ping-1" shows the real round trip), as on a network where round trips, not CPU,
// dominate: the parallel fan-out then costs about one round trip per round, like the
// single-node floor, where one node after the other would cost five.
func BenchmarkCycleDelayed(b *testing.B) {
	nodes := benchNodes(b, 5)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = testserver.StartDelayProxy(b, n.Addr(), 500*time.Microsecond)
	}
	cycleBenchmarks(b, nodes, "redlock://"+strings.Join(addrs, ",")+"?"+benchQuery)
}

func cycleBenchmarks(b *testing.B, nodes []*testserver.Redis, u string) {
	h := harness(b, nodes)
	h.Open = func(t testing.TB) driver.Backend { return open(t, u) }
	direct := store(b, u) // the floor through the same path (proxies included)
	h.Floor, h.Ops = direct.FloorCycle, direct.Ops
	drivertest.BenchCycle(b, h)
	ctx := context.Background()
	b.Run("backend", func(b *testing.B) {
		be := open(b, u)
		defer be.Close()
		key := drivertest.Key(b, "k")
		req := driver.Request{Key: key, Owner: "owner-value-0123456789abcdef", TTL: 15 * time.Second}
		before, err := direct.Ops(ctx)
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
		after, err := direct.Ops(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(after-before)/float64(b.N), "cmds/op")
	})
	b.Run("ping-1", func(b *testing.B) {
		be := open(b, u)
		defer be.Close()
		c := be.Clients()[0]
		for b.Loop() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ping-5-sequential", func(b *testing.B) {
		be := open(b, u)
		defer be.Close()
		for b.Loop() {
			for _, c := range be.Clients() {
				if err := c.Ping(ctx).Err(); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("ping-5", func(b *testing.B) {
		be := open(b, u)
		defer be.Close()
		for b.Loop() {
			if err := be.Ping(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCyclePausedNode is the uncontended cycle with one of the 5 nodes stopped
// (SIGSTOP) and a node timeout of 20ms: each of the two rounds waits for it.
func BenchmarkCyclePausedNode(b *testing.B) {
	nodes := benchNodes(b, 5)
	nodes[4].Pause()
	defer nodes[4].Resume()
	h := harness(b, nodes)
	h.Open = func(t testing.TB) driver.Backend { return open(t, testserver.RedlockURL(nodes, "node_timeout=20ms")) }
	drivertest.BenchCycle(b, h)
}

func BenchmarkHandoff(b *testing.B) {
	nodes := benchNodes(b, 5)
	drivertest.BenchHandoff(b, benchHarness(b, nodes))
}

func BenchmarkContended(b *testing.B) {
	nodes := benchNodes(b, 5)
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, benchHarness(b, nodes), w)
	}
}

// BenchmarkMultiKey: a set of 2, 4 and 8 keys (taken key by key: Redlock has no
// atomic step over several masters) beside one lock per key.
func BenchmarkMultiKey(b *testing.B) {
	nodes := benchNodes(b, 5)
	for _, n := range []int{2, 4, 8} {
		drivertest.BenchMultiKey(b, benchHarness(b, nodes), n)
	}
}

// BenchmarkReaders: 1 and 16 readers of one key, each holding 5ms per read; readers
// hold together, so 16 should reach close to 16 times one reader's rate (a reader's
// grant draws its own token through the majority register, so readers that start
// together may need a second round to settle theirs).
func BenchmarkReaders(b *testing.B) {
	nodes := benchNodes(b, 5)
	for _, r := range []int{1, 16} {
		drivertest.BenchReaders(b, benchHarness(b, nodes), r, 5*time.Millisecond)
	}
}
