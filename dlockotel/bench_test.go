package dlockotel_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlockotel"
	"github.com/dlockio/dlock/internal/testserver"
)

// BenchmarkRedisCycle: the uncontended Lock+Release cycle on a real Redis server
// with the adapter off and on, alternating cycle by cycle in one run so that both
// see the same machine: with the SDK's metrics alone (a manual reader; no tracer),
// with its traces too (every span recorded and sent to a batching processor), and
// with traces sampled at 1%.
// It reports the mean cycle of each and their ratio.
func BenchmarkRedisCycle(b *testing.B) {
	srv := testserver.StartRedis(b)
	ctx := context.Background()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer tp.Shutdown(ctx)
	sampled := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()),
		sdktrace.WithSampler(sdktrace.TraceIDRatioBased(0.01)))
	defer sampled.Shutdown(ctx)
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
	}{{"metrics", noop.NewTracerProvider()}, {"metrics+traces", tp}, {"metrics+traces-1%", sampled}} {
		b.Run(tc.name, func(b *testing.B) {
			obs, err := dlockotel.New(dlockotel.WithTracerProvider(tc.tp), dlockotel.WithMeterProvider(mp))
			if err != nil {
				b.Fatal(err)
			}
			cycleOnOff(b, srv.URL(), obs)
		})
	}
}

func cycleOnOff(b *testing.B, url string, obs dlock.Observer) {
	ctx := context.Background()
	open := func(opts ...dlock.Option) *dlock.Client {
		c, err := dlock.Open(ctx, url, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	off, on := open(), open(dlock.WithObserver(obs))
	cycle := func(c *dlock.Client) time.Duration {
		start := time.Now()
		l, err := c.Lock(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 200 { // warm up both
		cycle(off)
		cycle(on)
	}
	var tOff, tOn time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			tOff += cycle(off)
			tOn += cycle(on)
		} else {
			tOn += cycle(on)
			tOff += cycle(off)
		}
	}
	b.ReportMetric(float64(tOff.Microseconds())/float64(b.N), "µs/off")
	b.ReportMetric(float64(tOn.Microseconds())/float64(b.N), "µs/on")
	b.ReportMetric(float64(tOn)/float64(tOff), "on/off")
}
