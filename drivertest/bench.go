package drivertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// OpsCounter returns a running total of server-side operations (for example the sum
// of Redis commandstats calls), so benchmarks can report operations per handoff. A
// nil OpsCounter given to a benchmark falls back to the backend's
// driver.OpsCounter, if it has one.
type OpsCounter func(tb testing.TB) int64

func (h Harness) opsCounter(tb testing.TB, given OpsCounter) OpsCounter {
	if given != nil {
		return given
	}
	be := h.Open(tb)
	oc, ok := be.(driver.OpsCounter)
	if !ok {
		be.Close()
		return nil
	}
	tb.Cleanup(func() { be.Close() })
	return func(tb testing.TB) int64 {
		n, err := oc.ServerOps(context.Background())
		if err != nil {
			tb.Fatalf("ServerOps: %v", err)
		}
		return n
	}
}

// BenchCycle measures one uncontended Lock+Release cycle on one key ("dlock"), and,
// when the backend is a driver.Floorer, the floor cycle on the same server in the
// same run ("floor"), so the two can be compared as a ratio.
func BenchCycle(b *testing.B, h Harness) {
	ctx := context.Background()
	be := h.Open(b)
	defer be.Close()
	if f, ok := be.(driver.Floorer); ok {
		b.Run("floor", func(b *testing.B) {
			key := Key(b, "k")
			b.ReportAllocs()
			for b.Loop() {
				if err := f.FloorCycle(ctx, key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("dlock", func(b *testing.B) {
		c := h.Client(b)
		key := Key(b, "k")
		b.ReportAllocs()
		for b.Loop() {
			l, err := c.Lock(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchHandoff measures contended handoff between two clients: the time from one
// client's Release call to the waiting client's Lock returning. It reports the
// median and 99th percentile ("handoff-p50-ns", "handoff-p99-ns"), and, when the
// harness has RoundTrip, the median in round trips ("handoff-p50-rtt") and the
// server operations per handoff ("ops/handoff") when ops is given.
func BenchHandoff(b *testing.B, h Harness, ops OpsCounter) {
	ctx := context.Background()
	key := Key(b, "k")
	clients := [2]*dlock.Client{h.Client(b), h.Client(b)}
	l := mustLock(b, ctx, clients[0], key)
	lat := make([]time.Duration, 0, b.N)
	type result struct {
		l  *dlock.Lease
		at time.Time
	}
	turn := make(chan result)
	ops = h.opsCounter(b, ops)
	var opsTotal int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		next := clients[(i+1)%2]
		go func() {
			nl, err := next.Lock(ctx, key)
			if err != nil {
				b.Error(err)
			}
			turn <- result{nl, time.Now()}
		}()
		// Let the waiter queue up before the release; the pause is not timed.
		b.StopTimer()
		waitForWaiter(ctx, next, key)
		var before int64
		if ops != nil {
			before = ops(b)
		}
		b.StartTimer()
		released := time.Now()
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		r := <-turn
		if r.l == nil {
			b.FailNow()
		}
		lat = append(lat, r.at.Sub(released))
		l = r.l
		if ops != nil {
			b.StopTimer()
			opsTotal += ops(b) - before
			b.StartTimer()
		}
	}
	b.StopTimer()
	if ops != nil {
		b.ReportMetric(float64(opsTotal)/float64(b.N), "ops/handoff")
	}
	p50, p99 := Percentile(lat, 0.5), Percentile(lat, 0.99)
	b.ReportMetric(float64(p50), "handoff-p50-ns")
	b.ReportMetric(float64(p99), "handoff-p99-ns")
	if h.RoundTrip != nil {
		rtt := make([]time.Duration, 0, 1000)
		for range 1000 {
			t := time.Now()
			if err := h.RoundTrip(ctx); err != nil {
				b.Fatal(err)
			}
			rtt = append(rtt, time.Since(t))
		}
		b.ReportMetric(float64(p50)/float64(Percentile(rtt, 0.5)), "handoff-p50-rtt")
	}
	_ = l.Release(ctx)
}

// waitForWaiter waits until the backend shows a queued waiter on key, or, without an
// Inspector, gives it a moment.
func waitForWaiter(ctx context.Context, c *dlock.Client, key string) {
	in, ok := c.Backend().(driver.Inspector)
	if !ok {
		time.Sleep(time.Millisecond)
		return
	}
	for range 1000 {
		if info, err := in.Inspect(ctx, key); err == nil && info.Waiters > 0 {
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// Percentile returns the q-quantile (0..1) of ds, which it sorts.
func Percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q * float64(len(ds)-1))
	return ds[i]
}

// BenchContended runs W workers, each with its own client, looping Lock+Release on
// one hot key. It reports acquisitions/s, server operations per acquisition (if ops
// is given) and the fairness ratio min/max acquisitions per worker.
func BenchContended(b *testing.B, h Harness, workers int, ops OpsCounter) {
	b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
		ctx := context.Background()
		key := Key(b, "k")
		cs := make([]*dlock.Client, workers)
		for i := range cs {
			cs[i] = h.Client(b)
		}
		var next atomic.Int64
		counts := make([]int64, workers)
		ops := h.opsCounter(b, ops)
		var start0 int64
		if ops != nil {
			start0 = ops(b)
		}
		b.ResetTimer()
		t0 := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					l, err := cs[w].Lock(ctx, key)
					if err != nil {
						b.Error(err)
						return
					}
					counts[w]++
					if err := l.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(t0)
		b.StopTimer()
		lo, hi := counts[0], counts[0]
		for _, c := range counts {
			lo, hi = min(lo, c), max(hi, c)
		}
		b.ReportMetric(float64(b.N)/el.Seconds(), "acq/s")
		if hi > 0 {
			b.ReportMetric(float64(lo)/float64(hi), "min/max")
		}
		if ops != nil {
			b.ReportMetric(float64(ops(b)-start0)/float64(b.N), "ops/acq")
		}
	})
}
