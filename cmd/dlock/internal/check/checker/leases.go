package checker

import (
	"cmp"
	"math"
	"slices"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
)

// never stands for "no end": a time later than any recorded one.
const never = math.MaxInt64

// Lease is one grant and what its worker did under it: the ops of a history that
// share (Process, Lease), gathered by Leases.
type Lease struct {
	Process  int
	Lease    int
	Key      string
	Token    uint64
	Acquire  history.Op   // the OK acquire that granted it
	Renews   []history.Op // the core's renewals, by Start
	Writes   []history.Op // the critical section's writes, by Start
	Releases []history.Op // release calls, by Start
	Lost     int64        // when the core declared it lost; 0 if it never did

	renewEnd   []int64 // renewals sorted by End (OK ones only) ...
	renewStart []int64 // ... and the running max of their Start
}

// Attempt is when the backend attempt that produced the grant began.
func (l *Lease) Attempt() int64 { return attemptOf(&l.Acquire) }

// Granted is when the worker learnt of the grant (the acquire's End).
func (l *Lease) Granted() int64 { return l.Acquire.End }

// ReleaseStart is when the first release call began, or 0 if there was none.
func (l *Lease) ReleaseStart() int64 {
	if len(l.Releases) == 0 {
		return 0
	}
	return l.Releases[0].Start
}

// Released is when the first successful release returned, or 0 if none did.
func (l *Lease) Released() int64 {
	for _, r := range l.Releases {
		if r.OK {
			return r.End
		}
	}
	return 0
}

// LastKnown is the last moment the worker is known to have had the lease, as the
// timeline draws it: the end of its first successful release, else the moment it
// was declared lost, else the end of its last recorded op.
func (l *Lease) LastKnown() int64 {
	if t := l.Released(); t != 0 {
		return t
	}
	if l.Lost != 0 {
		return l.Lost
	}
	t := l.Acquire.End
	for _, ops := range [][]history.Op{l.Renews, l.Writes, l.Releases} {
		for _, o := range ops {
			t = max(t, o.End)
		}
	}
	return t
}

// Outcome says in a few words how the lease ended.
func (l *Lease) Outcome() string {
	switch {
	case l.Released() != 0:
		return "released"
	case l.Lost != 0:
		return "lost"
	case len(l.Releases) > 0:
		return "release failed"
	default:
		return "never released (worker stopped or killed)"
	}
}

// certainHold is H1 of the P1 check: the time until which the server certainly kept
// the key for l, as far as renewals that returned before t tell, and its worker
// relied on it: the latest attempt or OK renewal start (among renewals that ended
// before t) plus hold, cut short by the earliest release call's start or by the
// moment the worker's client declared the lease lost (from then on its holder
// was told to stop, as by a release).
func (l *Lease) certainHold(t int64, hold int64) int64 {
	base := l.Attempt()
	if i, _ := slices.BinarySearch(l.renewEnd, t); i > 0 { // renewals with End < t
		base = max(base, l.renewStart[i-1])
	}
	h := base + hold
	if rs := l.ReleaseStart(); rs != 0 {
		h = min(h, rs)
	}
	if l.Lost != 0 {
		h = min(h, l.Lost)
	}
	return h
}

// maxCertainHold is certainHold for a t later than every renewal.
func (l *Lease) maxCertainHold(hold int64) int64 { return l.certainHold(never, hold) }

// possiblyLiveUntil is the end of the lease's possibly-live interval for the lost
// release check: the end of its first OK release, or the end of its last acquire or
// renewal (of any outcome: a renewal whose reply was lost may have extended the
// grant) plus ttl, whichever is earlier.
func (l *Lease) possiblyLiveUntil(ttl int64) int64 {
	last := l.Acquire.End
	for _, r := range l.Renews {
		last = max(last, r.End)
	}
	end := last + ttl
	if r := l.Released(); r != 0 {
		end = min(end, r)
	}
	return end
}

// attemptOf is when the backend attempt behind an acquire began: Op.Attempt, or
// Start for histories that do not record it (a conservative stand-in: it widens
// the grant's window, so fewer pairs are certainly ordered).
func attemptOf(o *history.Op) int64 {
	if o.Attempt != 0 {
		return o.Attempt
	}
	return o.Start
}

type leaseID struct{ process, lease int }

// Leases gathers the ops of h into leases, in the order of their grants (acquire
// End). Ops of a lease with no OK acquire, and renewals not tied to a lease, are
// ignored.
func Leases(h *history.History) []*Lease {
	byID := map[leaseID]*Lease{}
	var out []*Lease
	for i := range h.Ops {
		o := &h.Ops[i]
		if o.Kind != history.Acquire || !o.OK || o.Lease == 0 {
			continue
		}
		id := leaseID{o.Process, o.Lease}
		if byID[id] != nil {
			continue // a second grant for one lease number: keep the first
		}
		l := &Lease{Process: o.Process, Lease: o.Lease, Key: o.Key, Token: o.Token, Acquire: *o}
		byID[id] = l
		out = append(out, l)
	}
	for i := range h.Ops {
		o := &h.Ops[i]
		l := byID[leaseID{o.Process, o.Lease}]
		if l == nil || o.Lease == 0 || o.Key != l.Key {
			continue
		}
		switch o.Kind {
		case history.Renew:
			l.Renews = append(l.Renews, *o)
		case history.Write:
			l.Writes = append(l.Writes, *o)
		case history.Release:
			l.Releases = append(l.Releases, *o)
		case history.Lost:
			if l.Lost == 0 || o.Start < l.Lost {
				l.Lost = o.Start
			}
		}
	}
	byStart := func(a, b history.Op) int { return cmp.Compare(a.Start, b.Start) }
	for _, l := range out {
		slices.SortStableFunc(l.Renews, byStart)
		slices.SortStableFunc(l.Writes, byStart)
		slices.SortStableFunc(l.Releases, byStart)
		var ok []history.Op
		for _, r := range l.Renews {
			if r.OK {
				ok = append(ok, r)
			}
		}
		slices.SortStableFunc(ok, func(a, b history.Op) int { return cmp.Compare(a.End, b.End) })
		m := int64(math.MinInt64)
		for _, r := range ok {
			m = max(m, r.Start)
			l.renewEnd = append(l.renewEnd, r.End)
			l.renewStart = append(l.renewStart, m)
		}
	}
	slices.SortStableFunc(out, func(a, b *Lease) int {
		return cmp.Or(cmp.Compare(a.Acquire.End, b.Acquire.End), cmp.Compare(a.Process, b.Process), cmp.Compare(a.Lease, b.Lease))
	})
	return out
}

// FaultWindow is a fault and the heal that ended it.
type FaultWindow struct {
	Fault  string `json:"fault"`
	Target string `json:"target,omitempty"`
	Detail string `json:"detail,omitempty"`
	Start  int64  `json:"start"` // the Fault event
	End    int64  `json:"end"`   // the matching Heal event, or Meta.End if none
	Healed bool   `json:"healed"`
}

// FaultWindows pairs every Fault event with the first later Heal event not yet
// paired, preferring one with the same fault name and target, then the same fault
// name, then any. A fault never healed lasts until Meta.End (or its own time, if
// later).
func FaultWindows(h *history.History) []FaultWindow {
	ev := slices.Clone(h.Events)
	slices.SortStableFunc(ev, func(a, b history.Event) int { return cmp.Compare(a.Time, b.Time) })
	used := make([]bool, len(ev))
	var out []FaultWindow
	for i, f := range ev {
		if f.Kind != history.Fault {
			continue
		}
		w := FaultWindow{Fault: f.Fault, Target: f.Target, Detail: f.Detail, Start: f.Time, End: max(h.Meta.End, f.Time)}
		match := -1
		for pass := 0; pass < 3 && match < 0; pass++ {
			for j := i + 1; j < len(ev); j++ {
				e := ev[j]
				if used[j] || e.Kind != history.Heal {
					continue
				}
				if pass == 0 && (e.Fault != f.Fault || e.Target != f.Target) || pass == 1 && e.Fault != f.Fault {
					continue
				}
				match = j
				break
			}
		}
		if match >= 0 {
			used[match] = true
			w.End, w.Healed = ev[match].Time, true
		}
		out = append(out, w)
	}
	return out
}
