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
// The lock's path only records a span (its name, times, attributes, events and
// parent span context); the tracer provider gets it later, in a batch: started,
// given its events and ended, each with the time recorded, so its sampler decides
// then, from the parent and the attributes. A span goes at most 100 ms
// (FlushDelay) after its call or lease ended, or when 256 wait, in a goroutine of
// its own. The SDK's span start and its batching processor's wake-up for every
// span ended cost a third of a 150 µs lock cycle on two CPUs when done inside it
// (docs/observability.md). Call Flush before shutting the tracer provider down,
// so that no span is left behind. With a no-op tracer provider (package
// go.opentelemetry.io/otel/trace/noop) given to WithTracerProvider, no span is
// recorded at all.
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
	"go.opentelemetry.io/otel/trace/noop"

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
		_, noTraces := tp.(noop.TracerProvider)
		o.traces = !noTraces
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
	traces bool // false for a no-op tracer provider: no span is recorded
	meter  metric.Meter
	key    func(string) string

	acquire, wait, heldFor metric.Float64Histogram
	renewals, losses       metric.Int64Counter

	setsMu sync.RWMutex
	sets   map[attrKey]*attrSet

	mu     sync.Mutex
	live   map[uint64]*attrSet   // grants held, by Event.Grant, and their attributes
	held   map[*attrSet]struct{} // every attribute set a grant held has had
	calls  map[uint64]*span      // lock calls in progress
	leases map[uint64]*span      // grants held

	endMu   sync.Mutex
	ending  []*span        // spans ended, in the order they ended
	timer   *time.Timer    // runs Flush FlushDelay after ending became non-empty
	batches sync.WaitGroup // goroutines ending a full batch
}

// FlushDelay bounds how long after its call or lease a span is ended; see the
// package documentation.
const FlushDelay = 100 * time.Millisecond

// maxEnding is how many spans wait to be ended before a goroutine ends them.
const maxEnding = 256

var _ dlock.Observer = (*Observer)(nil)

// New returns an Observer on the global providers unless options say otherwise.
func New(opts ...Option) (*Observer, error) {
	o := &Observer{
		live: map[uint64]*attrSet{}, held: map[*attrSet]struct{}{},
		calls: map[uint64]*span{}, leases: map[uint64]*span{}, sets: map[attrKey]*attrSet{},
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
		o.traces = true
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

// span is a span as the lock's path records it: started, given its events and
// ended later, in a batch, with the times recorded here (see the package
// documentation). Its events and end are set under Observer.mu; the rest only by
// the goroutine that took it out of Observer.calls or Observer.leases, before
// queue.
type span struct {
	parent     trace.SpanContext // of the lock call's context
	name       string
	start, end time.Time
	attrs      []attribute.KeyValue
	events     []spanEvent
	err        string // status Error with this description, if set
}

type spanEvent struct {
	name  string
	at    time.Time
	attrs []attribute.KeyValue
}

// maxEvents bounds the events kept per span (the SDK's default limit): a lease
// held for days renews thousands of times; the latest are kept.
const maxEvents = 128

// newSpan records the start of span name for e at now, with e's attributes; nil
// if the observer records no traces.
func (o *Observer) newSpan(ctx context.Context, name string, e dlock.Event, now time.Time) *span {
	if !o.traces {
		return nil
	}
	sp := &span{parent: trace.SpanContextFromContext(ctx), name: name, start: now,
		attrs: make([]attribute.KeyValue, 0, 6)}
	sp.attrs = append(sp.attrs, AttrBackend.String(e.Backend), AttrMode.String(e.Mode()), AttrOwner.String(e.Owner))
	if o.key != nil {
		if k := o.key(e.Key); k != "" {
			sp.attrs = append(sp.attrs, AttrKey.String(k))
		}
	}
	return sp
}

// event adds an event to sp (nil: none) unless it has ended.
func (o *Observer) event(sp *span, name string, at time.Time, attrs ...attribute.KeyValue) {
	if sp == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if sp.end.IsZero() {
		sp.add(spanEvent{name, at, attrs})
	}
}

// add appends ev to sp's events, dropping the oldest beyond maxEvents; under
// Observer.mu.
func (sp *span) add(ev spanEvent) {
	if len(sp.events) == maxEvents {
		sp.events = append(sp.events[:0], sp.events[1:]...)
	}
	sp.events = append(sp.events, ev)
}

// Observe implements dlock.Observer.
func (o *Observer) Observe(ctx context.Context, e dlock.Event) {
	now := time.Now()
	switch e.Kind {
	case dlock.EventRequested:
		if sp := o.newSpan(ctx, "dlock.acquire", e, now); sp != nil {
			o.mu.Lock()
			o.calls[e.Call] = sp
			o.mu.Unlock()
		}
	case dlock.EventWaited:
		result := "granted"
		if e.Err != nil {
			result = "failed"
		}
		o.wait.Record(ctx, e.Duration.Seconds(), o.attrs(e, AttrResult.String(result)))
		o.event(o.call(e.Call, false), "waited", now, attribute.Float64("dlock.wait.duration", e.Duration.Seconds()))
	case dlock.EventGranted, dlock.EventReentered, dlock.EventFailed:
		o.ended(ctx, e, now)
	case dlock.EventRenewed, dlock.EventRenewFailed:
		result, name := "ok", "renewed"
		if e.Kind == dlock.EventRenewFailed {
			result, name = "error", "renew_failed"
		}
		o.renewals.Add(ctx, 1, o.attrs(e, AttrRenewalResult.String(result)))
		if e.Err != nil {
			o.event(o.lease(e.Grant), name, now, attribute.String("error", e.Err.Error()))
		} else {
			o.event(o.lease(e.Grant), name, now)
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
	sp := o.leases[e.Grant]
	delete(o.leases, e.Grant)
	if sp != nil {
		if how == "lost" {
			sp.add(spanEvent{"lost", now, []attribute.KeyValue{attribute.String("cause", e.Err.Error())}})
		}
		if e.Err != nil {
			sp.err = e.Err.Error()
		}
		sp.end = now // a renewal's event that comes later is dropped
	}
	o.mu.Unlock()
	if !live {
		return
	}
	o.heldFor.Record(ctx, e.Duration.Seconds(), o.attrs(e, AttrEnd.String(how)))
	if sp != nil {
		o.queue(sp)
	}
}

// queue queues sp, ended, for the next batch.
func (o *Observer) queue(sp *span) {
	o.endMu.Lock()
	o.ending = append(o.ending, sp)
	var batch []*span
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
		o.batches.Go(func() { o.export(batch) })
	}
}

// Flush hands every span whose call or lease has ended to the tracer provider
// now; later spans are still handed over in batches. Call it before shutting the
// tracer provider down.
func (o *Observer) Flush() {
	o.endMu.Lock()
	batch := o.ending
	o.ending = nil
	if o.timer != nil {
		o.timer.Stop()
	}
	o.endMu.Unlock()
	o.export(batch)
	o.batches.Wait()
}

// export starts, fills and ends the spans of batch with their recorded times.
// The tracer's sampler decides here, as it would have at their start: from the
// parent span context and the attributes.
func (o *Observer) export(batch []*span) {
	for _, sp := range batch {
		ctx := context.Background()
		if sp.parent.IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, sp.parent)
		}
		_, s := o.tracer.Start(ctx, sp.name, trace.WithTimestamp(sp.start), trace.WithAttributes(sp.attrs...))
		if s.IsRecording() {
			for _, ev := range sp.events {
				s.AddEvent(ev.name, trace.WithTimestamp(ev.at), trace.WithAttributes(ev.attrs...))
			}
			if sp.err != "" {
				s.SetStatus(codes.Error, sp.err)
			}
		}
		s.End(trace.WithTimestamp(sp.end))
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
	if sp := o.call(e.Call, true); sp != nil { // no longer in o.calls: this goroutine's alone
		sp.attrs = append(sp.attrs, AttrResult.String(result))
		if e.Token != 0 {
			sp.attrs = append(sp.attrs, AttrToken.Int64(int64(e.Token)))
		}
		if e.Err != nil && !errors.Is(e.Err, dlock.ErrLocked) {
			sp.err = e.Err.Error()
		}
		o.mu.Lock()
		sp.end = now
		o.mu.Unlock()
		o.queue(sp)
	}
	if e.Kind != dlock.EventGranted {
		return
	}
	set := o.attrSet(e, attribute.KeyValue{})
	sp := o.newSpan(ctx, "dlock.lease", e, now)
	if sp != nil {
		sp.attrs = append(sp.attrs, AttrToken.Int64(int64(e.Token)))
	}
	o.mu.Lock()
	o.live[e.Grant] = set
	o.held[set] = struct{}{}
	if sp != nil {
		o.leases[e.Grant] = sp
	}
	o.mu.Unlock()
}

// call returns the span of lock call id, forgetting it if end is set; nil if none.
func (o *Observer) call(id uint64, end bool) *span {
	o.mu.Lock()
	defer o.mu.Unlock()
	sp := o.calls[id]
	if end {
		delete(o.calls, id)
	}
	return sp
}

// lease returns the span of grant id, or nil.
func (o *Observer) lease(id uint64) *span {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.leases[id]
}
