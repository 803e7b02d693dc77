// Package timeline draws the history of a dlock check run as one self-contained
// HTML page: the run's settings, the checker's report (safety counts in red when
// they are not zero), the violation examples, and a timeline with one lane per
// key, a bar per lease coloured by worker, the store's verdict on every write,
// fault windows, and the violations outlined in red.
//
// The page has no external resource (no script, style sheet, font or image from
// anywhere): inline CSS and inline SVG only, so it opens offline and can be
// attached to a bug report. Every text from the history is escaped.
//
// Histories can hold 10^5 operations: when a run has more leases than
// Options.MaxLeases, the page draws only windows of time around the start, every
// violation example, and every fault and heal, and says so.
package timeline

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/checker"
	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
)

// Options tune Render. The zero value is ready to use.
type Options struct {
	// MaxLeases is how many leases the page draws before it switches to
	// windows around the interesting moments. Zero means 3000.
	MaxLeases int
	// Title heads the page; empty means one made from Meta.
	Title string
}

// Render writes the page for h and its report r to w. If r is nil, Render runs
// checker.Check with default options.
func Render(w io.Writer, h *history.History, r *checker.Report, opts Options) error {
	if opts.MaxLeases <= 0 {
		opts.MaxLeases = 3000
	}
	if r == nil {
		r = checker.Check(h, checker.Options{})
	}
	p := build(h, r, opts)
	return page.Execute(w, p)
}

// Layout, in pixels.
const (
	leftMargin = 80 // key labels
	axisHeight = 42 // time axis and fault labels
	rowHeight  = 14 // one row of lease bars
	barHeight  = 10 //
	failRow    = 6  // failed acquires, at the bottom of a lane
	rightPad   = 40 // room for the last tick label
	minPlot    = 1000
	maxPlot    = 16000
	pxPerLease = 20 // plot width grows with the leases drawn, within [minPlot, maxPlot]
)

// num is a coordinate, printed with one decimal.
type num float64

func (n num) String() string { return strconv.FormatFloat(float64(n), 'f', 1, 64) }

type pageData struct {
	Title      string
	Meta       [][2]string
	Verdict    string
	Safe       bool
	Expected   string
	Rows       []summaryRow
	Counts     [][2]string
	Notes      []string
	Violations []violationItem
	Truncated  string
	Panels     []*panel
	Workers    []workerColor
}

type summaryRow struct {
	Name, Count, Detail string
	Class               string // "bad", "warn" or ""
}

type violationItem struct {
	Check, Key, At, Detail string
	Anchor                 string // element id on the timeline, "" if not drawn
}

type workerColor struct {
	Name, Color string
}

type panel struct {
	Title          string
	Width, Height  num
	PlotLeft       num
	PlotRight      num
	AxisY          num
	Ticks          []tick
	Lanes          []lane
	Bands          []band
	Bars           []bar
	Marks          []mark
	Outlines       []outline
	Fails          []bar
	Lines          []mark
	from, to       int64
	scale          float64 // px per ns
	leaseCount     int
	violationCount int
}

type tick struct {
	X     num
	Label string
}

type lane struct {
	Key       string
	Y, H      num
	LabelY    num
	Alternate bool
}

type band struct {
	X, W, Y, H num
	Label      string
	LabelX     num
	Title      string
}

type bar struct {
	X, Y, W, H num
	GrantW     num // the [Attempt, End] part, drawn lighter
	Color      string
	Title      string
	ID         string
	TailX      num    // the certain server-side hold after the last known op
	TailW      num    // (0: none)
	TailTitle  string //
	Lost       bool   // declared lost inside the window, at LostX
	LostX      num
	LostY1     num
	LostY2     num
}

type mark struct {
	X, Y, W, H num
	Class      string
	Title      string
	ID         string
}

type outline struct {
	X, Y, W, H num
	ID         string
	Title      string
	Dashed     bool
}

func ms(h *history.History, t int64) string {
	return strconv.FormatFloat(float64(t-h.Meta.Start)/1e6, 'f', 1, 64) + " ms"
}

func build(h *history.History, r *checker.Report, opts Options) *pageData {
	p := &pageData{Title: opts.Title, Safe: r.Safe(), Expected: h.Meta.Expected, Notes: r.Notes}
	m := h.Meta
	if p.Title == "" {
		p.Title = fmt.Sprintf("dlock check: %s, fault %s", m.Backend, m.Fault)
	}
	p.Verdict = "SAFE: no P1, P3 or P4 violation"
	if !p.Safe {
		p.Verdict = "UNSAFE: the safety checks found violations"
	}
	fenced := "no"
	if m.Fenced {
		fenced = "yes"
	}
	resource := m.Resource
	if resource == "" {
		resource = "store" // histories from before resources existed
	}
	p.Meta = [][2]string{
		{"Backend", m.Backend}, {"URL", m.URL}, {"Fault schedule", m.Fault}, {"Resource", resource}, {"Fenced", fenced},
		{"TTL", m.TTL.String()}, {"Hold (certain server-side hold)", m.Hold.String()},
		{"Workers", strconv.Itoa(m.Workers)}, {"Keys", strconv.Itoa(m.Keys)}, {"Seed", strconv.FormatInt(m.Seed, 10)},
		{"Duration", time.Duration(m.End - m.Start).String()}, {"Expected", m.Expected},
	}
	p.Rows = summaryRows(h, r)
	s := r.Summary
	p.Counts = [][2]string{
		{"Acquires OK / failed", fmt.Sprintf("%d / %d", s.AcquiresOK, s.AcquiresFailed)},
		{"Leases / declared lost", fmt.Sprintf("%d / %d", s.Leases, s.LeasesLost)},
		{"Renewals (failed)", fmt.Sprintf("%d (%d)", s.Renewals, s.RenewalsFailed)},
		{"Releases (failed)", fmt.Sprintf("%d (%d)", s.Releases, s.ReleasesFailed)},
		{"Faults injected", strconv.Itoa(s.Faults)},
	}

	leases := checker.Leases(h)
	faults := checker.FaultWindows(h)
	vs := r.Violations()
	wins, truncated := chooseWindows(h, leases, faults, vs, opts.MaxLeases)
	d := &drawer{h: h, r: r, leases: leases, faults: faults, vs: vs, anchored: map[int]string{}}
	d.index()
	drawn := 0
	for i, win := range wins {
		pn := d.panel(win)
		if truncated {
			pn.Title = fmt.Sprintf("Window %d of %d: %s to %s, around %s", i+1, len(wins), ms(h, win.from), ms(h, win.to), strings.Join(win.why, ", "))
		} else {
			pn.Title = fmt.Sprintf("The whole run: %s to %s", ms(h, win.from), ms(h, win.to))
		}
		drawn += pn.leaseCount
		p.Panels = append(p.Panels, pn)
	}
	if truncated {
		p.Truncated = fmt.Sprintf("This run has %d leases, more than the %d this page draws at once. The timeline shows only %d windows of time (±%s) around the start, every violation example below, and every fault and heal, with %d leases in them; everything outside those windows is not drawn.",
			len(leases), opts.MaxLeases, len(wins), time.Duration(wins[0].half).Round(time.Microsecond), drawn)
	}
	for i, v := range vs {
		p.Violations = append(p.Violations, violationItem{
			Check: checkName(v.Check), Key: v.Key, At: ms(h, v.Time), Detail: v.Detail, Anchor: d.anchored[i],
		})
	}
	p.Workers = d.workers()
	return p
}

func checkName(c string) string {
	switch c {
	case checker.CheckP1:
		return "P1 lease safety"
	case checker.CheckP3:
		return "P3 resource safety"
	case checker.CheckP4:
		return "P4 token order"
	case checker.CheckLost:
		return "Lost release"
	}
	return c
}

func summaryRows(h *history.History, r *checker.Report) []summaryRow {
	bad := func(n int, class string) string {
		if n > 0 {
			return class
		}
		return ""
	}
	p4 := fmt.Sprintf("grants that ended before another began yet have the larger or an equal token; %d grants checked (%d with token 0 not checked); porcupine: %s", r.P4.Grants, r.P4.ZeroToken, r.P4.Porcupine)
	if r.P4.PorcupineTime > 0 {
		p4 += fmt.Sprintf(" in %v", r.P4.PorcupineTime.Round(10*time.Microsecond))
	}
	p4class := bad(r.P4.Count, "bad")
	if r.P4.Porcupine == checker.VerdictViolation {
		p4class = "bad"
	}
	l := r.P5
	live := fmt.Sprintf("longest time without an accepted write: %v, from %s to %s", l.LongestGap.Round(time.Millisecond), ms(h, l.GapStart), ms(h, l.GapEnd))
	if len(l.Recoveries) > 0 {
		live = fmt.Sprintf("slowest recovery after a heal: %v (heals: %d; followed by no accepted write: %d); ", l.MaxRecovery.Round(time.Millisecond), len(l.Recoveries), l.Unrecovered) + live
	}
	return []summaryRow{
		{"P1 lease safety", strconv.Itoa(r.P1.Count), "grants made while an earlier grant of the key was certainly still held on the server", bad(r.P1.Count, "bad")},
		{"P3 resource safety", strconv.Itoa(r.P3.Count), fmt.Sprintf("writes the store accepted with a token below one it had accepted; %d writes: %d accepted, %d rejected", r.P3.Writes, r.P3.Accepted, r.P3.Rejected), bad(r.P3.Count, "bad")},
		{"P4 token order", strconv.Itoa(r.P4.Count), p4, p4class},
		{"Lost releases", strconv.Itoa(r.LostReleases.Count), "waits refused while no lease of the key could have been live", bad(r.LostReleases.Count, "warn")},
		{"P5 liveness", "", live, bad(l.Unrecovered, "warn")},
	}
}

// window is a span of time drawn as one panel.
type window struct {
	from, to int64
	half     int64    // the half-width used around each point, when truncated
	why      []string // what the window is around
}

type point struct {
	t   int64
	why string
}

// chooseWindows returns one window for the whole run when it has at most max
// leases; otherwise windows of ±half around the start, every violation and every
// fault and heal, with half as large as keeps the leases drawn within limit.
func chooseWindows(h *history.History, leases []*checker.Lease, faults []checker.FaultWindow, vs []checker.Violation, limit int) ([]window, bool) {
	from, to := h.Meta.Start, h.Meta.End
	for _, l := range leases {
		from, to = min(from, l.Attempt()), max(to, l.LastKnown())
	}
	if to <= from {
		to = from + 1
	}
	if len(leases) <= limit {
		return []window{{from: from, to: to}}, false
	}
	pts := []point{{h.Meta.Start, "the start"}}
	for i, v := range vs {
		name := fmt.Sprintf("%s example %d", checkName(v.Check), i+1)
		pts = append(pts, point{v.Time, name})
		if v.End != 0 {
			pts = append(pts, point{v.End, name})
		}
	}
	for _, f := range faults {
		pts = append(pts, point{f.Start, "fault " + f.Fault})
		if f.Healed {
			pts = append(pts, point{f.End, "heal " + f.Fault})
		}
	}
	slices.SortStableFunc(pts, func(a, b point) int { return cmp.Compare(a.t, b.t) })
	lo, hi := int64(time.Microsecond), to-from // binary search the largest half that fits
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if countIn(leases, merge(pts, mid)) <= limit {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	wins := merge(pts, lo)
	for i := range wins {
		wins[i].from, wins[i].to = max(wins[i].from, from), min(wins[i].to, to)
	}
	return wins, true
}

// merge turns sorted points into disjoint windows of ±half.
func merge(pts []point, half int64) []window {
	var out []window
	for _, p := range pts {
		a, b := p.t-half, p.t+half
		if n := len(out); n > 0 && a <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, b)
			if !slices.Contains(out[n-1].why, p.why) {
				out[n-1].why = append(out[n-1].why, p.why)
			}
			continue
		}
		out = append(out, window{from: a, to: b, half: half, why: []string{p.why}})
	}
	return out
}

// countIn counts the leases that overlap any of the disjoint, sorted windows.
func countIn(leases []*checker.Lease, wins []window) int {
	n := 0
	for _, l := range leases {
		s, e := l.Attempt(), l.LastKnown()
		i, _ := slices.BinarySearchFunc(wins, s, func(w window, t int64) int { return cmp.Compare(w.to, t) })
		if i < len(wins) && wins[i].from <= e {
			n++
		}
	}
	return n
}
