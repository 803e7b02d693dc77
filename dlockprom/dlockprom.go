// Package dlockprom reports what dlock's locks do as Prometheus metrics, from the
// core's events (dlock.WithObserver). It is a module of its own, so programs that do
// not use Prometheus never download it.
//
//	m := dlockprom.New()
//	prometheus.MustRegister(m)
//	c, err := dlock.Open(ctx, url, dlock.WithObserver(m))
//
// # Metrics
//
// Durations are in seconds.
//
//   - dlock_lock_acquire_duration_seconds (histogram): from a lock call's start to
//     its grant, re-entry or failure; label result = granted, reentered or failed.
//   - dlock_lock_wait_duration_seconds (histogram): how long a lock call waited
//     behind a holder, for calls that waited; result = granted or failed.
//   - dlock_leases_active (gauge): grants held now.
//   - dlock_lease_duration_seconds (histogram): how long a grant was held, at its
//     end; end = released or lost.
//   - dlock_lease_renewals_total (counter): renewals; result = ok or error (a
//     transient failure, tried again).
//   - dlock_lease_losses_total (counter): leases that may have been lost.
//
// Every metric has the labels backend (the backend package: redislock, etcdlock,
// ...) and mode (exclusive, shared or semaphore), and key if WithKeys says so. These
// are the metrics of package dlockotel under Prometheus' naming rules.
//
// # Keys
//
// Lock keys are often per entity (order:123), so a key label could make a series
// per entity: by default no key is recorded. WithKeys records the key as a function
// maps it, for example to its prefix (order), or unchanged for a small fixed set of
// keys.
package dlockprom

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlockio/dlock"
)

// Option configures New.
type Option func(*Metrics)

// WithKeys adds the label key to every metric, as key maps each lock key (an empty
// result for keys to leave unnamed). Without it no key is recorded (see the package
// documentation). A nil function is ignored.
func WithKeys(key func(string) string) Option {
	return func(m *Metrics) { m.key = key }
}

// WithNamespace prefixes every metric name with ns and an underscore.
func WithNamespace(ns string) Option {
	return func(m *Metrics) { m.ns = ns }
}

// Metrics is a dlock.Observer and a prometheus.Collector: register it, and give it
// to the clients to watch with dlock.WithObserver. It is safe for concurrent use and
// may serve several clients.
type Metrics struct {
	key func(string) string
	ns  string

	acquire, wait, held *prometheus.HistogramVec
	active              *prometheus.GaugeVec
	renewals, losses    *prometheus.CounterVec

	mu   sync.Mutex
	live map[uint64]struct{} // grants held, by Event.Grant
}

var (
	_ dlock.Observer       = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// New returns the metrics, to register with a Prometheus registry.
func New(opts ...Option) *Metrics {
	m := &Metrics{live: map[uint64]struct{}{}}
	for _, opt := range opts {
		if opt != nil {
			opt(m)
		}
	}
	labels := []string{"backend", "mode"}
	if m.key != nil {
		labels = append(labels, "key")
	}
	with := func(extra ...string) []string { return append(append([]string{}, labels...), extra...) }
	hist := func(name, help string, extra ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: m.ns, Name: name, Help: help,
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, with(extra...))
	}
	m.acquire = hist("dlock_lock_acquire_duration_seconds", "Time from a lock call's start to its grant, re-entry or failure.", "result")
	m.wait = hist("dlock_lock_wait_duration_seconds", "Time a lock call waited behind a holder.", "result")
	m.held = hist("dlock_lease_duration_seconds", "Time a grant was held, at its end.", "end")
	m.active = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: m.ns, Name: "dlock_leases_active", Help: "Grants held now."}, with())
	m.renewals = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: m.ns, Name: "dlock_lease_renewals_total", Help: "Lease renewals, by result."}, with("result"))
	m.losses = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: m.ns, Name: "dlock_lease_losses_total", Help: "Leases that may have been lost."}, with())
	return m
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.acquire, m.wait, m.held, m.active, m.renewals, m.losses}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// labels returns the label values of e, and extra.
func (m *Metrics) labels(e dlock.Event, extra ...string) []string {
	v := make([]string, 0, 4)
	v = append(v, e.Backend, e.Mode())
	if m.key != nil {
		v = append(v, m.key(e.Key))
	}
	return append(v, extra...)
}

// Observe implements dlock.Observer.
func (m *Metrics) Observe(_ context.Context, e dlock.Event) {
	switch e.Kind {
	case dlock.EventWaited:
		result := "granted"
		if e.Err != nil {
			result = "failed"
		}
		m.wait.WithLabelValues(m.labels(e, result)...).Observe(e.Duration.Seconds())
	case dlock.EventGranted:
		m.acquire.WithLabelValues(m.labels(e, "granted")...).Observe(e.Duration.Seconds())
		m.mu.Lock()
		m.live[e.Grant] = struct{}{}
		m.mu.Unlock()
		m.active.WithLabelValues(m.labels(e)...).Inc()
	case dlock.EventReentered:
		m.acquire.WithLabelValues(m.labels(e, "reentered")...).Observe(e.Duration.Seconds())
	case dlock.EventFailed:
		m.acquire.WithLabelValues(m.labels(e, "failed")...).Observe(e.Duration.Seconds())
	case dlock.EventRenewed:
		m.renewals.WithLabelValues(m.labels(e, "ok")...).Inc()
	case dlock.EventRenewFailed:
		m.renewals.WithLabelValues(m.labels(e, "error")...).Inc()
	case dlock.EventLost:
		m.losses.WithLabelValues(m.labels(e)...).Inc()
		m.end(e, "lost")
	case dlock.EventReleased:
		if e.Freed {
			m.end(e, "released")
		}
	}
}

// end records the end of a grant the metrics saw begin.
func (m *Metrics) end(e dlock.Event, how string) {
	m.mu.Lock()
	_, ok := m.live[e.Grant]
	delete(m.live, e.Grant)
	m.mu.Unlock()
	if ok {
		m.active.WithLabelValues(m.labels(e)...).Dec()
		m.held.WithLabelValues(m.labels(e, how)...).Observe(e.Duration.Seconds())
	}
}
