package dlockotel_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/dlockotel"
	"github.com/dlockio/dlock/internal/obstest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/memlock"
	_ "github.com/dlockio/dlock/redislock"
)

// A scripted run on a real Redis server: a grant, a renewal, a second client's
// wait and grant, a release, a forced loss and the release of the lost lease give
// exactly these metrics and spans.
func TestScriptedRun(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := dlockotel.New(dlockotel.WithTracerProvider(tp), dlockotel.WithMeterProvider(mp),
		dlockotel.WithKeys(func(k string) string { p, _, _ := strings.Cut(k, ":"); return p }))
	if err != nil {
		t.Fatal(err)
	}
	obstest.Run(t, srv.URL(), obs)
	obs.Flush()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		metric string
		attrs  []attribute.KeyValue
		want   int64 // histogram count, or counter sum
	}{
		{"dlock.lock.acquire.duration", []attribute.KeyValue{dlockotel.AttrResult.String("granted")}, 2},
		{"dlock.lock.wait.duration", []attribute.KeyValue{dlockotel.AttrResult.String("granted")}, 1},
		{"dlock.lease.active", nil, 0},
		{"dlock.lease.duration", []attribute.KeyValue{dlockotel.AttrEnd.String("released")}, 1},
		{"dlock.lease.duration", []attribute.KeyValue{dlockotel.AttrEnd.String("lost")}, 1},
		{"dlock.lease.renewals", []attribute.KeyValue{dlockotel.AttrRenewalResult.String("ok")}, 1},
		{"dlock.lease.losses", nil, 1},
	} {
		want := append([]attribute.KeyValue{
			dlockotel.AttrBackend.String("redislock"), dlockotel.AttrMode.String("exclusive"), dlockotel.AttrKey.String("order"),
		}, tc.attrs...)
		if got, ok := value(rm, tc.metric, attribute.NewSet(want...)); !ok || got != tc.want {
			t.Errorf("%s %v = %d (found %v), want %d", tc.metric, tc.attrs, got, ok, tc.want)
		}
	}
	if n := points(rm); n != 7 {
		t.Errorf("%d data points in all, want the 7 above", n)
	}

	var names []string
	for _, sp := range spans.GetSpans() {
		var evs []string
		for _, e := range sp.Events {
			evs = append(evs, e.Name)
		}
		names = append(names, sp.Name+"["+strings.Join(evs, ",")+"]"+sp.Status.Code.String())
		if !slices.Contains(sp.Attributes, dlockotel.AttrKey.String("order")) {
			t.Errorf("span %s without the mapped key: %v", sp.Name, sp.Attributes)
		}
	}
	want := []string{
		"dlock.acquire[]" + codes.Unset.String(),       // a's
		"dlock.acquire[waited]" + codes.Unset.String(), // b's
		"dlock.lease[renewed]" + codes.Unset.String(),  // a's, ended by its release
		"dlock.lease[lost]" + codes.Error.String(),     // b's
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("spans %q, want %q", names, want)
	}
}

// value returns the counter sum or histogram count of metric name at attrs.
func value(rm metricdata.ResourceMetrics, name string, attrs attribute.Set) (int64, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&attrs) {
						return p.Value, true
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&attrs) {
						return int64(p.Count), true
					}
				}
			}
		}
	}
	return 0, false
}

// points counts the data points of every metric.
func points(rm metricdata.ResourceMetrics) int {
	n := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				n += len(d.DataPoints)
			case metricdata.Histogram[float64]:
				n += len(d.DataPoints)
			}
		}
	}
	return n
}

// Spans are ended in batches, each at the time its call or lease ended: by Flush,
// by a goroutine once 256 wait, or FlushDelay after the first of a batch.
func TestSpansEndInBatches(t *testing.T) {
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	obs, err := dlockotel.New(dlockotel.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dlock.New(memlock.NewStore(clock.Real).Backend(), dlock.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cycle := func() time.Time {
		l, err := c.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	// Spans keep the times of the lock's path, and their parent: the span in the
	// lock call's context.
	pctx, parent := tp.Tracer("test").Start(ctx, "parent")
	before := time.Now()
	l, err := c.Lock(pctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	parent.End()
	obs.Flush()
	got := spans.GetSpans()
	if len(got) != 3 {
		t.Fatalf("%d spans after Flush, want the parent and 2", len(got))
	}
	for _, sp := range got[1:] {
		lo, hi := before, granted
		if sp.Name == "dlock.lease" {
			lo, hi = before, released
		}
		if sp.StartTime.Before(lo) || sp.EndTime.After(hi) || sp.EndTime.Before(sp.StartTime) {
			t.Errorf("span %s from %v to %v: want it within %v..%v", sp.Name, sp.StartTime, sp.EndTime, lo, hi)
		}
		if sp.Parent.SpanID() != parent.SpanContext().SpanID() || sp.SpanContext.TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("span %s: parent %v, want %v", sp.Name, sp.Parent.SpanID(), parent.SpanContext().SpanID())
		}
	}
	spans.Reset()
	eventually := func(n int, how string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); len(spans.GetSpans()) < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d spans ended, want %d", how, len(spans.GetSpans()), n)
			}
		}
	}
	for range 128 { // 256 spans: a full batch
		cycle()
	}
	eventually(256, "a full batch")
	cycle()
	eventually(258, "after FlushDelay")
	obs.Flush()
	if n := len(spans.GetSpans()); n != 258 {
		t.Errorf("%d spans ended, want 258", n)
	}
}

func TestNewRejects(t *testing.T) {
	for _, opt := range []dlockotel.Option{nil, dlockotel.WithKeys(nil), dlockotel.WithTracerProvider(nil), dlockotel.WithMeterProvider(nil)} {
		if _, err := dlockotel.New(opt); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("New with a bad option: %v, want ErrInvalid", err)
		}
	}
}
