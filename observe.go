package dlock

import (
	"context"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Observer sees what a Client's locks do: every lock call, wait, grant, renewal,
// loss and release (WithObserver). Adapters turn events into metrics and traces
// (OpenTelemetry, Prometheus) without the core depending on them.
//
// Observe is called synchronously on the goroutine doing the work (a lock call, a
// Release, the renewer), never with a lock of the Client held, so it may call the
// Client; it must be quick and must not block, since a slow Observe delays
// renewals, which can cost a lease. It must be safe for concurrent use. ctx is the
// lock call's or Release's context for the events of those calls, and
// context.Background() for events of the renewer.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// EventKind says what an Event reports.
type EventKind int

// The kinds of events, in the order a lease's events come.
const (
	// EventRequested: a lock call (Lock, TryLock, Do, Campaign, or one key of
	// LockAll taken key by key) starts.
	EventRequested EventKind = iota + 1
	// EventWaited: a lock call that found the key held and waited (Lock, not
	// TryLock) stops waiting. Duration is how long it waited; Err is nil when it
	// got the key.
	EventWaited
	// EventGranted: the lock call got the key. Duration is the time from
	// EventRequested; Token is the grant's.
	EventGranted
	// EventFailed: the lock call returns without the key. Err is its error (one
	// matching ErrLocked for a TryLock refused or a wait given up).
	EventFailed
	// EventReentered: the lock call re-entered a grant this Client holds for its
	// owner id (WithOwner); no server request was made. Call is the grant's.
	EventReentered
	// EventRenewed: the grant was renewed. Duration is the refresh's round trip.
	EventRenewed
	// EventRenewFailed: a renewal failed with a transient error (Err) and will be
	// tried again before the validity deadline.
	EventRenewFailed
	// EventLost: the lease may be lost; Err is the cause (it matches
	// ErrLeaseLost). Duration is how long the grant was held.
	EventLost
	// EventReleased: a lease of the grant was released (Lease.Release, or Close).
	// Duration is how long the grant had been held; Err is the error Release
	// returns, if any.
	EventReleased
)

var eventNames = [...]string{"", "requested", "waited", "granted", "failed", "reentered", "renewed", "renew_failed", "lost", "released"}

// String returns the kind's name in lower case: "requested", "granted", ...
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one thing that happened to a lock call or a lease (see Observer).
type Event struct {
	Kind EventKind
	// Call numbers the lock call (from 1, in the process) for the events of a call:
	// requested, waited, granted, failed, reentered. Grant numbers the grant
	// they concern: the Call that made it. A grant's own events (renewed, renew
	// failed, lost, released) have Call == Grant; a re-entry has its own Call
	// and the Grant it joined, whose leases are then released one by one (one
	// released event each) until the last frees it. Grant is 0 before a grant.
	Call  uint64
	Grant uint64
	// Backend is the backend package's name: "redislock", "etcdlock", "memlock", ...
	Backend string
	Key     string
	Owner   string
	// Token is the grant's fencing token, 0 before the grant.
	Token Token
	// Shared and Limit are the lock call's WithShared and WithLimit (0 for none).
	Shared bool
	Limit  int
	// Duration depends on Kind (see the kinds); zero where it has no meaning.
	Duration time.Duration
	// Err is the error or cause, for the kinds that have one.
	Err error
	// Freed, for EventReleased, says that the grant has ended: this was its last
	// lease (or Close released it), or it had been lost.
	Freed bool
}

// calls numbers lock calls for events, across clients, so that adapters may key
// their state by Event.Grant.
var calls atomic.Uint64

// Mode names the lock call's kind for metrics and traces: "exclusive", "shared"
// (WithShared) or "semaphore" (WithLimit above 1).
func (e Event) Mode() string {
	switch {
	case e.Shared:
		return "shared"
	case e.Limit > 1:
		return "semaphore"
	}
	return "exclusive"
}

// WithObserver makes the client report every lock call, wait, grant, renewal,
// loss and release to o (see Observer). Without it the events cost nothing.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if c.perLock {
			return invalid("WithObserver applies to a Client, not to a lock call")
		}
		if o == nil {
			return invalid("nil observer")
		}
		c.observer = o
		return nil
	}
}

// backendName is the name of the package that defines b's type: "redislock".
func backendName(b driver.Backend) string {
	t := reflect.TypeOf(b)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	p := t.PkgPath()
	if p == "" {
		return t.String()
	}
	return p[strings.LastIndexByte(p, '/')+1:]
}

// event reports e, filled with the call's grant or request fields, to the
// client's observer. Callers check c.obs first, so an unobserved client pays one
// nil check.
func (c *Client) event(ctx context.Context, kind EventKind, call, grant uint64, key, owner string, cfg *config, tok Token, d time.Duration, err error) {
	c.obs.Observe(ctx, Event{
		Kind: kind, Call: call, Grant: grant, Backend: c.name, Key: key, Owner: owner, Token: tok,
		Shared: cfg.shared, Limit: cfg.limit, Duration: d, Err: err,
	})
}

// event reports an event of grant g.
func (g *grant) event(ctx context.Context, kind EventKind, d time.Duration, err error) {
	c := g.c
	c.obs.Observe(ctx, Event{
		Kind: kind, Call: g.call, Grant: g.call, Backend: c.name, Key: g.key, Owner: g.owner, Token: g.token,
		Shared: g.cfg.shared, Limit: g.cfg.limit, Duration: d, Err: err, Freed: kind == EventReleased && g.ended(),
	})
}
