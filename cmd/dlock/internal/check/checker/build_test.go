package checker

import (
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
)

// base is Meta.Start of the synthetic histories: every time in the tests is given
// in milliseconds after it.
const base = int64(1_000_000_000)

func at(ms float64) int64 { return base + int64(ms*1e6) }

// builder writes a synthetic history readably: times are milliseconds since
// Meta.Start.
type builder struct{ h history.History }

func newHistory(hold, ttl time.Duration, lengthMS float64) *builder {
	return &builder{h: history.History{Meta: history.Meta{
		Backend: "test", Fault: "none", Fenced: true, Hold: hold, TTL: ttl,
		Start: base, End: at(lengthMS), Workers: 4, Keys: 2, HeldRecorded: true,
	}}}
}

func (b *builder) op(o history.Op) { b.h.Ops = append(b.h.Ops, o) }

type leaseBuilder struct {
	b     *builder
	p, l  int
	key   string
	token uint64
}

// grant records an OK acquire of key by worker p's lease l: the Lock call began at
// start, its last attempt at attempt, and it returned at end.
func (b *builder) grant(p, l int, key string, token uint64, start, attempt, end float64) *leaseBuilder {
	b.op(history.Op{Process: p, Key: key, Kind: history.Acquire, Lease: l, Start: at(start), Attempt: at(attempt), End: at(end), OK: true, Token: token})
	return &leaseBuilder{b: b, p: p, l: l, key: key, token: token}
}

func (lb *leaseBuilder) add(kind string, s, e float64, ok bool) *leaseBuilder {
	lb.b.op(history.Op{Process: lb.p, Key: lb.key, Kind: kind, Lease: lb.l, Start: at(s), Attempt: at(s), End: at(e), OK: ok, Token: lb.token})
	return lb
}

func (lb *leaseBuilder) renew(s, e float64, ok bool) *leaseBuilder {
	return lb.add(history.Renew, s, e, ok)
}

func (lb *leaseBuilder) release(s, e float64, ok bool) *leaseBuilder {
	return lb.add(history.Release, s, e, ok)
}

func (lb *leaseBuilder) lost(t float64) *leaseBuilder { return lb.add(history.Lost, t, t, false) }

// write records the worker's write at t and the store's verdict on it, given the
// highest token the store had accepted before.
func (lb *leaseBuilder) write(t float64, accepted bool, max uint64) *leaseBuilder {
	lb.add(history.Write, t, t+0.1, true)
	lb.b.h.Writes = append(lb.b.h.Writes, history.StoreWrite{
		Process: lb.p, Key: lb.key, Lease: lb.l, Token: lb.token, Time: at(t + 0.05), Accepted: accepted, Max: max,
	})
	return lb
}

const (
	errHeld    = "dlock: locked by another owner (expires in 80ms unless renewed)\ncontext deadline exceeded"
	errUnknown = "redislock: acquire \"k\": dial tcp 127.0.0.1:6379: connection refused"
)

// failed records a failed acquire of key by worker p from s to e; it failed
// because the key was held when err is errHeld (Op.Held, as a worker records it).
func (b *builder) failed(p int, key string, s, e float64, err string) {
	b.failedHeld(p, key, s, e, err, err == errHeld)
}

func (b *builder) failedHeld(p int, key string, s, e float64, err string, held bool) {
	b.op(history.Op{Process: p, Key: key, Kind: history.Acquire, Start: at(s), Attempt: at(s), End: at(e), Err: err, Held: held})
}

func (b *builder) event(kind, fault, target string, t float64) {
	b.h.Events = append(b.h.Events, history.Event{Time: at(t), Kind: kind, Fault: fault, Target: target})
}

func (b *builder) check(opts Options) *Report { return Check(&b.h, opts) }
