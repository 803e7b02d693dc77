// Package dlockotel reports what dlock's locks do to OpenTelemetry: metrics and
// traces, from the core's events (dlock.WithObserver). It is a module of its own, so
// programs that do not use OpenTelemetry never download it.
//
//	obs, err := dlockotel.New() // the global tracer and meter providers
//	if err != nil {
//		return err
//	}
//	c, err := dlock.Open(ctx, url, dlock.WithObserver(obs))
//	defer obs.Flush() // before the tracer provider shuts down
//
// # Metrics
//
// Names and units follow the OpenTelemetry conventions; durations are in seconds.
//
//   - dlock.lock.acquire.duration (histogram, s): from a lock call's start to its
//     grant, re-entry or failure; attribute dlock.lock.result = granted, reentered
//     or failed.
//   - dlock.lock.wait.duration (histogram, s): how long a lock call waited behind a
//     holder, for calls that waited; dlock.lock.result = granted or failed.
//   - dlock.lease.active (asynchronous up-down counter, {lease}): grants held
//     now, counted when the metrics are collected.
//   - dlock.lease.duration (histogram, s): how long a grant was held, at its end;
//     dlock.lease.end = released or lost.
//   - dlock.lease.renewals (counter, {renewal}): renewals; dlock.lease.renewal.result
//     = ok or error (a transient failure, tried again).
//   - dlock.lease.losses (counter, {loss}): leases that may have been lost.
//
// Every metric has dlock.backend (the backend package: redislock, etcdlock, ...) and
// dlock.lock.mode (exclusive, shared, or semaphore), and dlock.key if WithKeys says
// so.
//
// # Traces
//
// A span "dlock.acquire" covers each lock call (Lock, TryLock, Do, Campaign; each key
// of LockAll), a child of the span in the call's context, with an event "waited" if
// it waited; its status is Error when the call failed for another reason than the
// key being held. A span "dlock.lease" then covers the hold, from the grant to the
// release that freed it or the loss, with events "renewed", "renew_failed" and
// "lost" (status Error, with the cause). Spans carry dlock.backend, dlock.lock.mode,
// dlock.lock.owner, dlock.lock.token and, if WithKeys says so, dlock.key.
//
// Spans are ended in batches, each with the time it ended at: a span ends at most
// 100 ms (FlushDelay) after its call or lease did, or when 256 are waiting, in a
// goroutine of its own. Ending a span hands it to the tracer provider's span
// processor, and the SDK's batching processor wakes its goroutine for every span
// handed to it: on a lock cycle of 150 µs on two CPUs, ending its two spans at
// once cost a third of the cycle (docs/observability.md). Call Flush before
// shutting the tracer provider down, so that no span is left unended.
//
// # Keys
//
// Lock keys are often per entity (order:123), so a key attribute could make a
// metric series, and a trace attribute, per entity: by default no key is
// recorded. WithKeys records the key as a function maps it, for example to its
// prefix (order), or unchanged for a small fixed set of keys.
package dlockotel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlockio/dlock"
)

// scope is the instrumentation scope of the tracer and the meter.
const scope = "github.com/dlockio/dlock/dlockotel"

// Attribute keys.
const (
	AttrBackend       = attribute.Key("dlock.backend")
	AttrMode          = attribute.Key("dlock.lock.mode")
	AttrKey           = attribute.Key("dlock.key")
	AttrResult        = attribute.Key("dlock.lock.result")
	AttrEnd           = attribute.Key("dlock.lease.end")
	AttrRenewalResult = attribute.Key("dlock.lease.renewal.result")
	AttrOwner         = attribute.Key("dlock.lock.owner")
	AttrToken         = attribute.Key("dlock.lock.token")
)

// Option configures New.
type Option func(*Observer) error

// WithTracerProvider sets the tracer provider (default: otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *Observer) error {
		if tp == nil {
			return fmt.Errorf("%w: nil tracer provider", dlock.ErrInvalid)
		}
		o.tracer = tp.Tracer(scope)
		return nil
	}
}

// WithMeterProvider sets the meter provider (default: otel.GetMeterProvider()).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *Observer) error {
		if mp == nil {
			return fmt.Errorf("%w: nil meter provider", dlock.ErrInvalid)
		}
		o.meter = mp.Meter(scope)
		return nil
	}
}

// WithKeys records the dlock.key attribute on metrics and spans, as key maps each
// lock key; an empty result records none for that key. Without it no key is
// recorded (see the package documentation).
func WithKeys(key func(string) string) Option {
	return func(o *Observer) error {
		if key == nil {
			return fmt.Errorf("%w: nil key function", dlock.ErrInvalid)
		}
		o.key = key
		return nil
	}
}

// Observer is a dlock.Observer that records metrics and spans. It is safe for
// concurrent use and may serve several clients.
type Observer struct {
	tracer trace.Tracer
	meter  metric.Meter
	key    func(string) string

	acquire, wait, heldFor metric.Float64Histogram
	renewals, losses       metric.Int64Counter

	setsMu sync.RWMutex
	sets   map[attrKey]*attrSet

	mu     sync.Mutex
	live   map[uint64]*attrSet   // grants held, by Event.Grant, and their attributes
	held   map[*attrSet]struct{} // every attribute set a grant held has had
	calls  map[uint64]trace.Span // lock calls in progress (recording spans)
	leases map[uint64]trace.Span // grants held (recording spans)

	endMu   sync.Mutex
	ending  []pendingEnd   // spans to end, in the order they ended
	timer   *time.Timer    // runs Flush FlushDelay after ending became non-empty
	batches sync.WaitGroup // goroutines ending a full batch
}

// FlushDelay bounds how long after its call or lease a span is ended; see the
// package documentation.
const FlushDelay = 100 * time.Millisecond

// maxEnding is how many spans wait to be ended before a goroutine ends them.
const maxEnding = 256

// pendingEnd is a span that ended at a time.
type pendingEnd struct {
	span trace.Span
	at   time.Time
}

var _ dlock.Observer = (*Observer)(nil)

// New returns an Observer on the global providers unless options say otherwise.
func New(opts ...Option) (*Observer, error) {
	o := &Observer{
		live: map[uint64]*attrSet{}, held: map[*attrSet]struct{}{},
		calls: map[uint64]trace.Span{}, leases: map[uint64]trace.Span{}, sets: map[attrKey]*attrSet{},
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", dlock.ErrInvalid)
		}
		if err := opt(o); err != nil {
			return nil, err
		}
	}
	if o.tracer == nil {
		o.tracer = otel.GetTracerProvider().Tracer(scope)
	}
	if o.meter == nil {
		o.meter = otel.GetMeterProvider().Meter(scope)
	}
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := o.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		return h
	}
	o.acquire = hist("dlock.lock.acquire.duration", "Time from a lock call's start to its grant, re-entry or failure.")
	o.wait = hist("dlock.lock.wait.duration", "Time a lock call waited behind a holder.")
	o.heldFor = hist("dlock.lease.duration", "Time a grant was held, at its end.")
	// Counted when collected, from the grants held, rather than added to at
	// each grant and end: two measurements fewer per lock cycle.
	_, err := o.meter.Int64ObservableUpDownCounter("dlock.lease.active", metric.WithUnit("{lease}"),
		metric.WithDescription("Grants held now."), metric.WithInt64Callback(o.observeActive))
	errs = append(errs, err)
	o.renewals, err = o.meter.Int64Counter("dlock.lease.renewals", metric.WithUnit("{renewal}"), metric.WithDescription("Lease renewals, by result."))
	errs = append(errs, err)
	o.losses, err = o.meter.Int64Counter("dlock.lease.losses", metric.WithUnit("{loss}"), metric.WithDescription("Leases that may have been lost."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("dlockotel: %w", err)
	}
	return o, nil
}

// attrKey identifies a set of metric attributes: the event's backend, mode and
// mapped key, and at most one more attribute.
type attrKey struct {
	backend, mode, key string
	extra              attribute.KeyValue
}

// attrSet is a set of metric attributes as a measurement option.
type attrSet struct{ opt metric.MeasurementOption }

// attrs returns the attributes every metric of e has, and extra if it is set.
func (o *Observer) attrs(e dlock.Event, extra attribute.KeyValue) metric.MeasurementOption {
	return o.attrSet(e, extra).opt
}

// attrSet returns the attributes every metric of e has, and extra if it is set
// (made once per distinct set and kept, so a measurement neither sorts nor
// allocates them).
func (o *Observer) attrSet(e dlock.Event, extra attribute.KeyValue) *attrSet {
	k := attrKey{backend: e.Backend, mode: e.Mode(), extra: extra}
	if o.key != nil {
		k.key = o.key(e.Key)
	}
	o.setsMu.RLock()
	set, ok := o.sets[k]
	o.setsMu.RUnlock()
	if ok {
		return set
	}
	kv := []attribute.KeyValue{AttrBackend.String(k.backend), AttrMode.String(k.mode)}
	if k.key != "" {
		kv = append(kv, AttrKey.String(k.key))
	}
	if extra.Key != "" {
		kv = append(kv, extra)
	}
	set = &attrSet{metric.WithAttributeSet(attribute.NewSet(kv...))}
	o.setsMu.Lock()
	if old, ok := o.sets[k]; ok {
		set = old // made by another goroutine meanwhile: one pointer per set
	} else {
		o.sets[k] = set
	}
	o.setsMu.Unlock()
	return set
}

// observeActive reports dlock.lease.active: the grants held, per attribute set
// (zero for a set that has had grants and has none now).
func (o *Observer) observeActive(_ context.Context, obs metric.Int64Observer) error {
	o.mu.Lock()
	n := make(map[*attrSet]int64, len(o.held))
	for set := range o.held {
		n[set] = 0
	}
	for _, set := range o.live {
		n[set]++
	}
	o.mu.Unlock()
	for set, v := range n {
		obs.Observe(v, set.opt)
	}
	return nil
}

// startSpan starts span name for e at now, with e's attributes if it records;
// it returns nil for a span that does not record (a no-op tracer, or one sampled
// out), which then costs nothing more.
func (o *Observer) startSpan(ctx context.Context, name string, e dlock.Event, now time.Time) trace.Span {
	_, span := o.tracer.Start(ctx, name, trace.WithTimestamp(now))
	if !span.IsRecording() {
		return nil
	}
	span.SetAttributes(AttrBackend.String(e.Backend), AttrMode.String(e.Mode()), AttrOwner.String(e.Owner))
	if o.key != nil {
		if k := o.key(e.Key); k != "" {
			span.SetAttributes(AttrKey.String(k))
		}
	}
	return span
}

// Observe implements dlock.Observer.
func (o *Observer) Observe(ctx context.Context, e dlock.Event) {
	now := time.Now()
	switch e.Kind {
	case dlock.EventRequested:
		if span := o.startSpan(ctx, "dlock.acquire", e, now); span != nil {
			o.mu.Lock()
			o.calls[e.Call] = span
			o.mu.Unlock()
		}
	case dlock.EventWaited:
		result := "granted"
		if e.Err != nil {
			result = "failed"
		}
		o.wait.Record(ctx, e.Duration.Seconds(), o.attrs(e, AttrResult.String(result)))
		if span := o.call(e.Call, false); span != nil {
			span.AddEvent("waited", trace.WithAttributes(attribute.Float64("dlock.wait.duration", e.Duration.Seconds())))
		}
	case dlock.EventGranted, dlock.EventReentered, dlock.EventFailed:
		o.ended(ctx, e, now)
	case dlock.EventRenewed, dlock.EventRenewFailed:
		result, name := "ok", "renewed"
		if e.Kind == dlock.EventRenewFailed {
			result, name = "error", "renew_failed"
		}
		o.renewals.Add(ctx, 1, o.attrs(e, AttrRenewalResult.String(result)))
		if span := o.lease(e.Grant); span != nil {
			if e.Err != nil {
				span.AddEvent(name, trace.WithAttributes(attribute.String("error", e.Err.Error())))
			} else {
				span.AddEvent(name)
			}
		}
	case dlock.EventLost:
		o.losses.Add(ctx, 1, o.attrs(e, attribute.KeyValue{}))
		o.endLease(ctx, e, "lost", now)
	case dlock.EventReleased:
		if e.Freed {
			o.endLease(ctx, e, "released", now)
		}
	}
}

// endLease records the end of the grant of e (how: lost or released), if the
// observer saw it begin and has not seen it end.
func (o *Observer) endLease(ctx context.Context, e dlock.Event, how string, now time.Time) {
	o.mu.Lock()
	_, live := o.live[e.Grant]
	delete(o.live, e.Grant)
	span := o.leases[e.Grant]
	delete(o.leases, e.Grant)
	o.mu.Unlock()
	if !live {
		return
	}
	o.heldFor.Record(ctx, e.Duration.Seconds(), o.attrs(e, AttrEnd.String(how)))
	if span == nil {
		return
	}
	if how == "lost" {
		span.AddEvent("lost", trace.WithAttributes(attribute.String("cause", e.Err.Error())))
	}
	if e.Err != nil {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	o.end(span, now)
}

// end has span ended, with time at, in the next batch.
func (o *Observer) end(span trace.Span, at time.Time) {
	o.endMu.Lock()
	o.ending = append(o.ending, pendingEnd{span, at})
	var batch []pendingEnd
	switch n := len(o.ending); {
	case n >= maxEnding:
		batch = o.ending
		o.ending = nil
		o.timer.Stop()
	case n > 1:
	case o.timer == nil:
		o.timer = time.AfterFunc(FlushDelay, o.Flush)
	default:
		o.timer.Reset(FlushDelay)
	}
	o.endMu.Unlock()
	if batch != nil {
		o.batches.Go(func() { endAll(batch) })
	}
}

// Flush ends every span whose call or lease has ended, now; later spans are
// still ended in batches. Call it before shutting the tracer provider down.
func (o *Observer) Flush() {
	o.endMu.Lock()
	batch := o.ending
	o.ending = nil
	if o.timer != nil {
		o.timer.Stop()
	}
	o.endMu.Unlock()
	endAll(batch)
	o.batches.Wait()
}

func endAll(batch []pendingEnd) {
	for _, e := range batch {
		e.span.End(trace.WithTimestamp(e.at))
	}
}

// ended records the end of a lock call: granted (a lease span starts), re-entered
// or failed.
func (o *Observer) ended(ctx context.Context, e dlock.Event, now time.Time) {
	result := "granted"
	switch e.Kind {
	case dlock.EventReentered:
		result = "reentered"
	case dlock.EventFailed:
		result = "failed"
	}
	o.acquire.Record(ctx, e.Duration.Seconds(), o.attrs(e, AttrResult.String(result)))
	if span := o.call(e.Call, true); span != nil {
		span.SetAttributes(AttrResult.String(result))
		if e.Token != 0 {
			span.SetAttributes(AttrToken.Int64(int64(e.Token)))
		}
		if e.Err != nil && !errors.Is(e.Err, dlock.ErrLocked) {
			span.SetStatus(codes.Error, e.Err.Error())
		}
		o.end(span, now)
	}
	if e.Kind != dlock.EventGranted {
		return
	}
	set := o.attrSet(e, attribute.KeyValue{})
	o.mu.Lock()
	o.live[e.Grant] = set
	o.held[set] = struct{}{}
	o.mu.Unlock()
	if span := o.startSpan(ctx, "dlock.lease", e, now); span != nil {
		span.SetAttributes(AttrToken.Int64(int64(e.Token)))
		o.mu.Lock()
		o.leases[e.Grant] = span
		o.mu.Unlock()
	}
}

// call returns the span of lock call id, forgetting it if end is set; nil if none.
func (o *Observer) call(id uint64, end bool) trace.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	span := o.calls[id]
	if end {
		delete(o.calls, id)
	}
	return span
}

// lease returns the recording span of grant id, or nil.
func (o *Observer) lease(id uint64) trace.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.leases[id]
}
