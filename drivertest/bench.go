package drivertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/measure"
)

// The benchmarks below are thin wrappers over the measuring loops of internal/measure,
// which the "dlock bench" command runs too: a developer's Go benchmark and a user's
// side-by-side run measure the same thing.

// readOps reads Harness.Ops, failing tb on an error.
func (h Harness) readOps(tb testing.TB) int64 {
	n, err := h.Ops(context.Background())
	if err != nil {
		tb.Fatalf("server operations: %v", err)
	}
	return n
}

func reportLatency(b *testing.B, s *measure.Samples, prefix string) {
	b.ReportMetric(float64(s.Percentile(0.5)), prefix+"p50-ns")
	b.ReportMetric(float64(s.Percentile(0.99)), prefix+"p99-ns")
}

// BenchCycle measures one uncontended Lock+Release cycle on one key ("dlock"), and,
// when the harness has a Floor, the floor cycle on the same server in the
// same run ("floor") and both paired cycle by cycle with the driver alone, its
// Acquire and Release called directly ("interleaved", which reports the ratio of
// the medians, "dlock/floor": the number to compare, since all see the same machine
// load; "driver-p50-ns" tells the backend's requests from the core's bookkeeping).
func BenchCycle(b *testing.B, h Harness) {
	ctx := context.Background()
	be := h.Open(b)
	defer be.Close()
	f, hasFloor := h.Floor, h.Floor != nil
	if hasFloor {
		b.Run("floor", func(b *testing.B) {
			var s measure.Samples
			key := Key(b, "k")
			b.ReportAllocs()
			b.ResetTimer()
			if err := measure.FloorCycles(ctx, f, key, measure.Limit{N: int64(b.N)}, &s); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			reportLatency(b, &s, "")
		})
	}
	b.Run("dlock", func(b *testing.B) {
		c := h.Client(b)
		key := Key(b, "k")
		var run measure.CycleRun
		b.ReportAllocs()
		b.ResetTimer()
		if err := measure.Cycles(ctx, c, key, measure.CyclePeers{}, measure.Limit{N: int64(b.N)}, &run); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		reportLatency(b, &run.Dlock, "")
	})
	if hasFloor {
		b.Run("interleaved", func(b *testing.B) {
			c := h.Client(b)
			var run measure.CycleRun
			b.ResetTimer()
			if err := measure.Cycles(ctx, c, Key(b, "k"), measure.CyclePeers{Floor: f, FloorKey: Key(b, "floor"), Driver: be, DriverKey: Key(b, "drv")}, measure.Limit{N: int64(b.N)}, &run); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			fp, dp := run.Floor.Percentile(0.5), run.Dlock.Percentile(0.5)
			b.ReportMetric(float64(run.Driver.Percentile(0.5)), "driver-p50-ns")
			b.ReportMetric(float64(fp), "floor-p50-ns")
			b.ReportMetric(float64(dp), "dlock-p50-ns")
			b.ReportMetric(float64(dp)/float64(fp), "dlock/floor")
		})
	}
}

// BenchHandoff measures contended handoff between two clients: the time from one
// client's Release call to the waiting client's Lock returning. It reports the
// median and 99th percentile ("handoff-p50-ns", "handoff-p99-ns"), and, when the
// harness has RoundTrip, the median in round trips ("handoff-p50-rtt") and the
// server operations per handoff ("ops/handoff") when the harness has Ops.
//
// Server operations are counted in a separate, shorter run: reading the counters
// (Redis INFO, a ZooKeeper mntr) right before each release would disturb the timed
// handoff, on a pinned CPU by evicting what the handoff needs from the caches, and
// not the round trip timed next to it.
func BenchHandoff(b *testing.B, h Harness) {
	ctx := context.Background()
	key := Key(b, "k")
	a, c := h.Client(b), h.Client(b)
	in, _ := c.Backend().(driver.Inspector)
	b.ResetTimer()
	run, err := measure.Handoff(ctx, a, c, key, measure.Limit{N: int64(b.N)}, measure.HandoffOptions{
		Inspector: in, Pause: b.StopTimer, Resume: b.StartTimer, RoundTrip: h.RoundTrip,
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if h.Ops != nil {
		counted, err := measure.Handoff(ctx, a, c, key, measure.Limit{N: min(int64(b.N), 100)}, measure.HandoffOptions{
			Inspector: in, Ops: h.Ops,
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(counted.Ops)/float64(counted.Handoffs), "ops/handoff")
	}
	reportLatency(b, &run.Latency, "handoff-")
	if h.RoundTrip != nil {
		rtt := run.RTT.Percentile(0.5)
		b.ReportMetric(float64(rtt), "rtt-p50-ns")
		b.ReportMetric(float64(run.Latency.Percentile(0.5))/float64(rtt), "handoff-p50-rtt")
	}
}

// Percentile returns the q-quantile (0..1) of ds, which it sorts.
func Percentile(ds []time.Duration, q float64) time.Duration { return measure.Percentile(ds, q) }

// BenchContended runs W workers, each with its own client, looping Lock+Release on
// one hot key. It reports acquisitions/s, server operations per acquisition (if the
// harness has Ops), the fairness ratio min/max
// acquisitions per worker, Jain's fairness index ("jain": 1 is equal shares) and the
// handoff latency from a Release call to the next holder's Lock returning.
func BenchContended(b *testing.B, h Harness, workers int) {
	benchContended(b, fmt.Sprintf("workers=%d", workers), h, workers, workers)
}

// BenchContendedClients is BenchContended with the workers spread over the given
// number of clients (worker i uses client i mod clients), as goroutines of fewer
// processes would: what a backend's per-client resources (a listening connection,
// a subscriber) cost on a hot key.
func BenchContendedClients(b *testing.B, h Harness, workers, clients int) {
	benchContended(b, fmt.Sprintf("workers=%d,clients=%d", workers, clients), h, workers, max(clients, 1))
}

func benchContended(b *testing.B, name string, h Harness, workers, clients int) {
	b.Run(name, func(b *testing.B) {
		ctx := context.Background()
		key := Key(b, "k")
		cl := make([]*dlock.Client, min(clients, workers))
		for i := range cl {
			cl[i] = h.Client(b)
		}
		cs := make([]*dlock.Client, workers)
		for i := range cs {
			cs[i] = cl[i%len(cl)]
		}
		var start0 int64
		if h.Ops != nil {
			start0 = h.readOps(b)
		}
		cpu := startCPU()
		b.ResetTimer()
		run, err := measure.Contend(ctx, cs, []string{key}, measure.Limit{N: int64(b.N)})
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		cpu.report(b, run.All)
		if run.Overlaps > 0 {
			b.Fatalf("%d acquisitions found the key held by another worker", run.Overlaps)
		}
		b.ReportMetric(measure.PerSecond(run.Acquisitions, run.Elapsed), "acq/s")
		if lo, hi := measure.MinMax(run.Counts); hi > 0 {
			b.ReportMetric(float64(lo)/float64(hi), "min/max")
		}
		b.ReportMetric(measure.Jain(run.Counts), "jain")
		if run.Handoff.Count() > 0 {
			reportLatency(b, &run.Handoff, "handoff-")
		}
		if h.Ops != nil {
			b.ReportMetric(float64(h.readOps(b)-start0)/float64(run.All), "ops/acq")
		}
	})
}

// cpuReading is the machine's busy CPU time at the start of a measurement.
type cpuReading struct {
	busy time.Duration
	ok   bool
}

func startCPU() cpuReading {
	busy, ok := measure.MachineCPU()
	return cpuReading{busy, ok}
}

// report adds "machine-cpu-us/acq": the CPU time the whole machine (client, servers
// and kernel) spent per acquisition since the reading, where it can be read. It
// counts everything else running too: compare it between runs on a quiet machine.
func (r cpuReading) report(b *testing.B, acquisitions int64) {
	busy, ok := measure.MachineCPU()
	if r.ok && ok && acquisitions > 0 {
		b.ReportMetric(float64((busy-r.busy).Microseconds())/float64(acquisitions), "machine-cpu-us/acq")
	}
}

// BenchRing runs measure.Ring for b.N turns (each one acquisition) with the given
// wait and pass, and reports acquisitions per second and the machine's CPU time per
// acquisition: the bare fair handoff a backend's hot key is compared with.
func BenchRing(b *testing.B, workers int, wait, pass func(ctx context.Context, w int, turn int64) error) {
	cpu := startCPU()
	b.ResetTimer()
	d, err := measure.Ring(context.Background(), workers, int64(b.N), wait, pass)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(measure.PerSecond(int64(b.N), d), "acq/s")
	cpu.report(b, int64(b.N))
}

// BenchPolled runs measure.Polled for b.N acquisitions and reports as BenchRing
// does: the unfair polled lock of the peers, in the same benchmark run.
func BenchPolled(b *testing.B, workers int, poll time.Duration, try func(ctx context.Context, w int) (bool, error), release func(ctx context.Context, w int) error) {
	cpu := startCPU()
	b.ResetTimer()
	d, err := measure.Polled(context.Background(), workers, int64(b.N), poll, try, release)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(measure.PerSecond(int64(b.N), d), "acq/s")
	cpu.report(b, int64(b.N))
}
