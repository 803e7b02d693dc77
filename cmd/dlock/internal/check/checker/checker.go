// Package checker reads the history of a dlock check run and decides whether the
// run kept the promises of a lock: no two grants of a key while one was certainly
// still held (P1), no write that fencing should have refused (P3), fencing tokens
// that grow with real time (P4), progress after faults heal (P5), and no key left
// locked by a holder that is gone (lost releases).
//
// Every check is conservative: it reports only what is certainly wrong given the
// recorded times. Each op is known only by the interval [Start, End] (for a
// grant, [Attempt, End]) in which it took effect, so two ops whose intervals
// overlap are never said to be ordered, and a check cannot see a violation that
// happened entirely inside such overlaps. A clean report therefore means "no
// violation that the recorded times prove", not "no violation".
//
// Times in the history are CLOCK_MONOTONIC nanoseconds; the sentences in the
// report give them as milliseconds since Meta.Start, as the timeline draws them.
package checker

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"github.com/dlockio/dlock/driver"
)

// Check names, as they appear in Violation.Check.
const (
	CheckP1   = "P1" // lease safety
	CheckP3   = "P3" // resource safety
	CheckP4   = "P4" // token order
	CheckLost = "lost-release"
)

// Porcupine verdicts in OrderResult.Porcupine.
const (
	VerdictOK        = "ok"
	VerdictViolation = "violation"
	VerdictTimeout   = "unknown-timeout"
	VerdictSkipped   = "skipped"
)

// Options tune Check. The zero value is ready to use.
type Options struct {
	// Slack is how long a failed acquire must have waited before its window
	// counts for the lost release check, and how long after a heal the server
	// is still excused. Zero means Meta.TTL.
	Slack time.Duration
	// PorcupineTimeout bounds the porcupine linearizability check of P4. Zero
	// means 10s; negative skips porcupine (the sweep still runs).
	PorcupineTimeout time.Duration
	// PorcupineHTML, when set and porcupine finds a violation, is the path of
	// the HTML visualization porcupine writes of the offending keys' grants.
	PorcupineHTML string
	// MaxExamples is how many examples each check keeps. Zero means 5.
	MaxExamples int
}

// Violation is one example of a failed check, in terms a person can check
// against the timeline.
type Violation struct {
	Check string `json:"check"` // CheckP1, CheckP3, CheckP4 or CheckLost
	Key   string `json:"key"`
	// Time is the moment to look at (CLOCK_MONOTONIC ns): the second grant's end
	// (P1, P4), the store's decision (P3), the start of the window in which no
	// lease could have been live (lost release).
	Time int64 `json:"time"`
	// End, when set, ends the span of the violation: the end of the first
	// lease's certain hold (P1), the end of the failed acquire (lost release).
	End int64 `json:"end,omitempty"`
	// Processes, Leases and Tokens name the leases involved, in the same order:
	// the offending (later) one first.
	Processes []int    `json:"processes,omitempty"`
	Leases    []int    `json:"leases,omitempty"`
	Tokens    []uint64 `json:"tokens,omitempty"`
	Detail    string   `json:"detail"` // one plain sentence
}

// Result is the outcome of one check: how many violations, and the first few.
type Result struct {
	Count    int         `json:"count"`
	Examples []Violation `json:"examples,omitempty"`
}

func (r *Result) add(max int, v Violation) {
	r.Count++
	if len(r.Examples) < max {
		r.Examples = append(r.Examples, v)
	}
}

// StoreResult is P3 with the store's totals.
type StoreResult struct {
	Result
	Writes   int `json:"writes"`   // writes the store decided
	Accepted int `json:"accepted"` // writes it kept
	Rejected int `json:"rejected"` // writes it refused (stale token)
}

// OrderResult is P4: the sweep's count and examples, and porcupine's verdict.
type OrderResult struct {
	Result
	Grants    int    `json:"grants"`      // OK acquires with a non-zero token, checked
	ZeroToken int    `json:"zero_tokens"` // OK acquires with token 0 (cannot fence), not checked
	Porcupine string `json:"porcupine"`   // VerdictOK, VerdictViolation, VerdictTimeout or VerdictSkipped
	// PorcupineTime is how long porcupine took.
	PorcupineTime time.Duration `json:"porcupine_time"`
	// PorcupineHTML is the visualization written, if any.
	PorcupineHTML string `json:"porcupine_html,omitempty"`
}

// Recovery is the time from one heal to the next accepted write.
type Recovery struct {
	Heal   int64  `json:"heal"` // the Heal event
	Fault  string `json:"fault,omitempty"`
	Target string `json:"target,omitempty"`
	// Write is the next accepted write at or after the heal, 0 if none.
	Write int64         `json:"write,omitempty"`
	After time.Duration `json:"after"` // Write - Heal; Meta.End - Heal when there was none
}

// Liveness is P5. It is a measurement, not a pass/fail check.
type Liveness struct {
	Recoveries []Recovery `json:"recoveries,omitempty"`
	// MaxRecovery is the longest Recovery.After; Unrecovered counts heals
	// followed by no accepted write at all.
	MaxRecovery time.Duration `json:"max_recovery"`
	Unrecovered int           `json:"unrecovered"`
	// LongestGap is the longest time within [Meta.Start, Meta.End] without an
	// accepted write (on any key), from GapStart to GapEnd: between two
	// consecutive accepted writes, or from Meta.Start to the first, or from the
	// last to Meta.End.
	LongestGap time.Duration `json:"longest_gap"`
	GapStart   int64         `json:"gap_start"`
	GapEnd     int64         `json:"gap_end"`
}

// Summary counts what happened in the run.
type Summary struct {
	Duration       time.Duration `json:"duration"` // Meta.End - Meta.Start
	AcquiresOK     int           `json:"acquires_ok"`
	AcquiresFailed int           `json:"acquires_failed"`
	Leases         int           `json:"leases"`
	LeasesLost     int           `json:"leases_lost"` // leases the core declared lost
	Renewals       int           `json:"renewals"`
	RenewalsFailed int           `json:"renewals_failed"`
	Releases       int           `json:"releases"`
	ReleasesFailed int           `json:"releases_failed"`
	Faults         int           `json:"faults"` // Fault events
}

// Report is the outcome of Check. It encodes as JSON.
type Report struct {
	Summary Summary `json:"summary"`
	// P1 lease safety: a grant made while an earlier grant of the same key was
	// certainly still held on the server (not expired, not being released).
	P1 Result `json:"p1_lease_safety"`
	// P3 resource safety: writes the store accepted with a token lower than one
	// it had already accepted for the key.
	P3 StoreResult `json:"p3_resource_safety"`
	// P4 token order: a grant that ended before another began has the smaller
	// token (and no two grants of a key share one).
	P4 OrderResult `json:"p4_token_order"`
	// P5 liveness measurements.
	P5 Liveness `json:"p5_liveness"`
	// LostReleases: failed acquires that waited while no lease of the key could
	// have been live.
	LostReleases Result `json:"lost_releases"`
	// Notes say what was not checked and why.
	Notes []string `json:"notes,omitempty"`
}

// Safe reports whether the safety checks passed: no P1, P3 or P4 violation, and
// porcupine did not find one either. Liveness and lost releases are not safety.
func (r *Report) Safe() bool {
	return r.P1.Count == 0 && r.P3.Count == 0 && r.P4.Count == 0 && r.P4.Porcupine != VerdictViolation
}

// Violations returns every example of every check, P1, P3, P4 then lost releases.
func (r *Report) Violations() []Violation {
	var out []Violation
	for _, res := range []*Result{&r.P1, &r.P3.Result, &r.P4.Result, &r.LostReleases} {
		out = append(out, res.Examples...)
	}
	return out
}

// Check runs every check on h.
func Check(h *history.History, opts Options) *Report {
	if opts.MaxExamples <= 0 {
		opts.MaxExamples = 5
	}
	if opts.Slack <= 0 {
		opts.Slack = h.Meta.TTL
	}
	if opts.PorcupineTimeout == 0 {
		opts.PorcupineTimeout = 10 * time.Second
	}
	c := &run{h: h, opts: opts, leases: Leases(h), r: &Report{}}
	c.byKey = map[string][]*Lease{}
	for _, l := range c.leases {
		c.byKey[l.Key] = append(c.byKey[l.Key], l)
	}
	c.keys = make([]string, 0, len(c.byKey))
	for k := range c.byKey {
		c.keys = append(c.keys, k)
	}
	slices.Sort(c.keys)
	c.summary()
	c.p1()
	c.p3()
	c.p4()
	c.p5()
	c.lostReleases()
	return c.r
}

type run struct {
	h      *history.History
	opts   Options
	leases []*Lease
	byKey  map[string][]*Lease
	keys   []string // keys with leases, sorted
	r      *Report
}

func (c *run) note(format string, a ...any) { c.r.Notes = append(c.r.Notes, fmt.Sprintf(format, a...)) }

// ms formats a CLOCK_MONOTONIC time as milliseconds since Meta.Start.
func (c *run) ms(t int64) string { return fmtMS(t - c.h.Meta.Start) }

func fmtMS(ns int64) string { return fmt.Sprintf("%.1f ms", float64(ns)/1e6) }

func who(l *Lease) string {
	return fmt.Sprintf("worker %d lease %d (token %d)", l.Process, l.Lease, l.Token)
}

func (c *run) summary() {
	s := &c.r.Summary
	s.Duration = time.Duration(c.h.Meta.End - c.h.Meta.Start)
	for i := range c.h.Ops {
		o := &c.h.Ops[i]
		switch o.Kind {
		case history.Acquire:
			if o.OK {
				s.AcquiresOK++
			} else {
				s.AcquiresFailed++
			}
		case history.Renew:
			s.Renewals++
			if !o.OK {
				s.RenewalsFailed++
			}
		case history.Release:
			s.Releases++
			if !o.OK {
				s.ReleasesFailed++
			}
		case history.Lost:
			s.LeasesLost++
		}
	}
	s.Leases = len(c.leases)
	for _, e := range c.h.Events {
		if e.Kind == history.Fault {
			s.Faults++
		}
	}
}

// p1 is the lease safety check. For grants g1, g2 of one key, g1 is before g2 when
// g1's acquire ended before g2's attempt began. Then g1 was certainly held on the
// server until H1 = min(start of g1's first release call, the moment g1's client
// declared it lost, max(g1's attempt, start of each OK renewal of g1 that ended
// before g2's attempt) + Meta.Hold), and g2 violates P1 when its acquire ended
// before H1: g2 was granted somewhere in its [Attempt, End], entirely inside g1's
// certain hold. A loss the client reported ends the hold like a release: its
// holder was told to stop before g2 was made. (For session backends, whose
// keep-alives the history does not show, a session kept alive only before g1's
// attempt may end before attempt + Meta.Hold; the client then reports the loss
// before the server can grant anyone else, and that is what P1 checks.)
//
// What it misses: a grant whose attempt overlaps the earlier grant's acquire, or
// that was granted after H1 while the earlier holder still (wrongly) believed it
// held the key: the latter is what fencing is for, and P3 shows it. With
// Meta.Hold = 0 (backends whose expiry the history cannot bound) only grants
// made before a release call began could be caught, and none can be.
func (c *run) p1() {
	hold := int64(c.h.Meta.Hold)
	if hold <= 0 {
		c.note("P1: Meta.Hold is 0, so no grant is certainly held past its own attempt: lease safety was not checked")
		return
	}
	limit := max(c.h.Meta.Limit, 1)
	var found []Violation
	for _, k := range c.keys {
		ls := c.byKey[k] // by acquire End
		byAttempt := slices.Clone(ls)
		slices.SortStableFunc(byAttempt, func(a, b *Lease) int { return cmp.Compare(a.Attempt(), b.Attempt()) })
		var active []*Lease // grants that ended before the current attempt and may still be held
		next := 0
		for _, g2 := range byAttempt {
			t := g2.Attempt()
			for next < len(ls) && ls[next].Acquire.End < t {
				active = append(active, ls[next])
				next++
			}
			// Drop grants whose hold, however renewed, ends by t: no later
			// attempt can be inside it.
			active = slices.DeleteFunc(active, func(g1 *Lease) bool { return g1.maxCertainHold(hold) <= t })
			// g2 violates when it was granted while limit earlier grants were
			// certainly held (one for a lock); worst is the one held longest.
			var worst *Lease
			var worstH int64
			inside := 0
			for _, g1 := range active {
				if c.h.Meta.RW && g1.Acquire.Shared && g2.Acquire.Shared {
					continue // readers hold together
				}
				if h1 := g1.certainHold(t, hold); g2.Acquire.End < h1 {
					inside++
					if worst == nil || h1 > worstH {
						worst, worstH = g1, h1
					}
				}
			}
			if inside < limit {
				continue
			}
			found = append(found, Violation{
				Check: CheckP1, Key: k, Time: g2.Acquire.End, End: worstH,
				Processes: []int{g2.Process, worst.Process},
				Leases:    []int{g2.Lease, worst.Lease},
				Tokens:    []uint64{g2.Token, worst.Token},
				Detail:    c.p1Detail(k, g2, worst, worstH, inside),
			})
		}
	}
	slices.SortStableFunc(found, func(a, b Violation) int { return cmp.Compare(a.Time, b.Time) })
	for _, v := range found {
		c.r.P1.add(c.opts.MaxExamples, v)
	}
}

// mode names a read-write lock's grant: a reader's or a writer's.
func mode(l *Lease) string {
	if l.Acquire.Shared {
		return "a reader's"
	}
	return "a writer's"
}

func (c *run) p1Detail(k string, g2, g1 *Lease, h1 int64, inside int) string {
	why := fmt.Sprintf("its attempt at %s plus the hold of %v", c.ms(g1.Attempt()), c.h.Meta.Hold)
	if rs := g1.ReleaseStart(); rs != 0 && rs == h1 {
		why = fmt.Sprintf("its release call began at %s", c.ms(rs))
	} else if g1.Lost != 0 && g1.Lost == h1 {
		why = fmt.Sprintf("its client declared it lost at %s", c.ms(h1))
	} else if h1-int64(c.h.Meta.Hold) != g1.Attempt() {
		why = fmt.Sprintf("a renewal sent at %s plus the hold of %v", c.ms(h1-int64(c.h.Meta.Hold)), c.h.Meta.Hold)
	}
	d := fmt.Sprintf("Key %s was granted to %s between %s and %s, while %s, granted by %s, was certainly still held until %s (%s).",
		k, who(g2), c.ms(g2.Attempt()), c.ms(g2.Acquire.End), who(g1), c.ms(g1.Acquire.End), c.ms(h1), why)
	if n := c.h.Meta.Limit; n > 1 {
		d += fmt.Sprintf(" With it, %d earlier grants were certainly held: %d holders, more than the key's %d permits.", inside, inside+1, n)
	}
	if c.h.Meta.RW {
		d += fmt.Sprintf(" The new grant was %s, the earlier one %s.", mode(g2), mode(g1))
	}
	return d
}

// p3 is the resource safety check: the store accepted a write whose token is
// lower than a token it had already accepted for the key. A fenced store refuses
// those, so in a fenced run P3 is zero by construction; in an unfenced run it
// counts the writes fencing would have refused, each a write that may have
// overwritten a newer holder's work.
func (c *run) p3() {
	p := &c.r.P3
	if c.h.Meta.Limit > 1 {
		c.note("P3: a semaphore's %d holders overlap by design and no token orders their writes: resource safety was not checked", c.h.Meta.Limit)
		return
	}
	for _, w := range c.h.Writes {
		p.Writes++
		if !w.Accepted {
			p.Rejected++
			continue
		}
		p.Accepted++
		if w.Token < w.Max {
			p.add(c.opts.MaxExamples, Violation{
				Check: CheckP3, Key: w.Key, Time: w.Time,
				Processes: []int{w.Process}, Leases: []int{w.Lease}, Tokens: []uint64{w.Token, w.Max},
				Detail: fmt.Sprintf("At %s %s accepted a write to key %s from worker %d lease %d with token %d, after it had already accepted token %d for that key.%s",
					c.ms(w.Time), c.storeName(), w.Key, w.Process, w.Lease, w.Token, w.Max, c.sentAt(w)),
			})
		}
	}
}

// storeName names what the workers wrote to: the checker's store, or a real
// resource (whose own log gave the writes).
func (c *run) storeName() string {
	name, _, _ := strings.Cut(c.h.Meta.Resource, ":")
	if name == "" || name == "store" {
		return "the store"
	}
	return "the " + name + " resource (by its own log)"
}

// sentAt says when the worker sent store write w and what its lease was then, if the
// history has the write op: it tells a write sent after the lease was lost from one
// sent while it was valid and delayed on its way (which only fencing can stop).
func (c *run) sentAt(w history.StoreWrite) string {
	for _, l := range c.byKey[w.Key] {
		if l.Process != w.Process || l.Lease != w.Lease {
			continue
		}
		var sent int64
		for _, o := range l.Writes {
			if o.Start <= w.Time {
				sent = max(sent, o.Start)
			}
		}
		if sent == 0 {
			return ""
		}
		state := "while its client still held the lease"
		if l.Lost != 0 && l.Lost <= sent {
			state = "after its client had declared the lease lost"
		}
		return fmt.Sprintf(" The worker sent it at %s, %s, %v before the store took it.",
			c.ms(sent), state, time.Duration(w.Time-sent).Round(10*time.Microsecond))
	}
	return ""
}

// p5 measures liveness: for every heal, the time to the next accepted write on
// any key, and the longest stretch of the run without an accepted write.
func (c *run) p5() {
	var acc []int64
	for _, w := range c.h.Writes {
		if w.Accepted {
			acc = append(acc, w.Time)
		}
	}
	slices.Sort(acc)
	p := &c.r.P5
	start, end := c.h.Meta.Start, c.h.Meta.End
	for _, e := range c.h.Events {
		if e.Kind != history.Heal {
			continue
		}
		r := Recovery{Heal: e.Time, Fault: e.Fault, Target: e.Target}
		if i, _ := slices.BinarySearch(acc, e.Time); i < len(acc) {
			r.Write, r.After = acc[i], time.Duration(acc[i]-e.Time)
		} else {
			r.After = time.Duration(max(end-e.Time, 0))
			p.Unrecovered++
		}
		p.MaxRecovery = max(p.MaxRecovery, r.After)
		p.Recoveries = append(p.Recoveries, r)
	}
	slices.SortStableFunc(p.Recoveries, func(a, b Recovery) int { return cmp.Compare(a.Heal, b.Heal) })
	prev := start
	gap := func(t int64) {
		if d := time.Duration(t - prev); d > p.LongestGap {
			p.LongestGap, p.GapStart, p.GapEnd = d, prev, t
		}
		prev = t
	}
	for _, t := range acc {
		if t >= start && t <= end {
			gap(t)
		}
	}
	if end > prev {
		gap(end)
	}
}

// lostReleases looks for keys left locked by nobody. A failed acquire on key k
// that failed because k was held (Op.Held)
// waited for k during [Start, End]; if no lease of k could have been live
// anywhere in [Start+Slack, End], the key was held on the server by a grant that
// should have ended: a release that did not happen, or expiry that did not come.
// A lease could have been live during [Attempt, min(end of its first OK release,
// end of its last acquire or renewal of any outcome + Meta.TTL)]; a failed
// acquire that failed for another reason (timeout, connection error) may have
// been granted without the worker learning it, so it could have been live during
// [Attempt, End + Meta.TTL]. Acquires that overlap a fault window extended by
// Slack past its heal are skipped: a server that is down is not a lost release.
//
// What it misses: any stuck key while some other lease of it was possibly live,
// and stuck keys nobody waited for Slack on. "Held" failures are told apart by
// Op.Held (errors.Is(err, dlock.ErrLocked) in the worker); histories from before
// Meta.HeldRecorded fall back to the error text of driver.ErrLocked.
func (c *run) lostReleases() {
	ttl := int64(c.h.Meta.TTL)
	slack := int64(c.opts.Slack)
	type span struct{ from, to int64 }
	live := map[string][]span{}
	for _, l := range c.leases {
		live[l.Key] = append(live[l.Key], span{l.Attempt(), l.possiblyLiveUntil(ttl)})
	}
	var waits []*history.Op
	for i := range c.h.Ops {
		o := &c.h.Ops[i]
		if o.Kind != history.Acquire || o.OK {
			continue
		}
		if c.held(o) {
			waits = append(waits, o)
		} else {
			live[o.Key] = append(live[o.Key], span{attemptOf(o), o.End + ttl})
		}
	}
	// Per key: spans by start, with the running max of their ends.
	type index struct {
		from  []int64
		maxTo []int64
	}
	idx := map[string]index{}
	for k, ss := range live {
		slices.SortFunc(ss, func(a, b span) int { return cmp.Compare(a.from, b.from) })
		var ix index
		m := int64(0)
		for _, s := range ss {
			m = max(m, s.to)
			ix.from = append(ix.from, s.from)
			ix.maxTo = append(ix.maxTo, m)
		}
		idx[k] = ix
	}
	faults := FaultWindows(c.h)
	slices.SortStableFunc(waits, func(a, b *history.Op) int { return cmp.Compare(a.Start, b.Start) })
	for _, o := range waits {
		from, to := o.Start+slack, o.End
		if from >= to {
			continue
		}
		if slices.ContainsFunc(faults, func(f FaultWindow) bool { return o.Start <= f.End+slack && f.Start <= o.End }) {
			continue
		}
		ix := idx[o.Key]
		// Spans that start by `to` and end at or after `from` overlap the window.
		if i := sort.Search(len(ix.from), func(j int) bool { return ix.from[j] > to }); i > 0 && ix.maxTo[i-1] >= from {
			continue
		}
		c.r.LostReleases.add(c.opts.MaxExamples, Violation{
			Check: CheckLost, Key: o.Key, Time: from, End: to,
			Processes: []int{o.Process},
			Detail: fmt.Sprintf("Worker %d waited for key %s from %s to %s and was refused, yet no lease of the key could have been live from %s on.",
				o.Process, o.Key, c.ms(o.Start), c.ms(o.End), c.ms(from)),
		})
	}
}

var lockedText = driver.ErrLocked.Error()

// held reports whether a failed acquire failed because the key was held: from
// Op.Held when the history records it, else (older histories) from the error
// text of driver.ErrLocked.
func (c *run) held(o *history.Op) bool {
	if c.h.Meta.HeldRecorded {
		return o.Held
	}
	return strings.Contains(o.Err, lockedText)
}
