package timeline

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/checker"
	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
)

type leaseKey struct{ process, lease int }

// drawer lays out the panels of one page.
type drawer struct {
	h        *history.History
	r        *checker.Report
	leases   []*checker.Lease
	faults   []checker.FaultWindow
	vs       []checker.Violation
	anchored map[int]string // violation index -> element id on the page

	keys     []string
	writes   []history.StoreWrite // by Time
	fails    []history.Op         // failed acquires, by Start
	notes    []history.Event
	involved map[leaseKey][]int // P1 and P4 violation indexes naming a lease
	procs    map[int]bool
	barIDs   map[string]bool // lease bar ids already on the page
}

func (d *drawer) index() {
	keys := map[string]bool{}
	d.procs = map[int]bool{}
	d.barIDs = map[string]bool{}
	for _, o := range d.h.Ops {
		keys[o.Key] = true
		d.procs[o.Process] = true
		if o.Kind == history.Acquire && !o.OK {
			d.fails = append(d.fails, o)
		}
	}
	for _, w := range d.h.Writes {
		keys[w.Key] = true
	}
	for k := range keys {
		d.keys = append(d.keys, k)
	}
	slices.SortFunc(d.keys, naturalCompare)
	d.writes = slices.Clone(d.h.Writes)
	slices.SortStableFunc(d.writes, func(a, b history.StoreWrite) int { return cmp.Compare(a.Time, b.Time) })
	slices.SortStableFunc(d.fails, func(a, b history.Op) int { return cmp.Compare(a.Start, b.Start) })
	for _, e := range d.h.Events {
		if e.Kind == history.Note {
			d.notes = append(d.notes, e)
		}
	}
	d.involved = map[leaseKey][]int{}
	for i, v := range d.vs {
		if v.Check != checker.CheckP1 && v.Check != checker.CheckP4 {
			continue
		}
		for j := range min(len(v.Processes), len(v.Leases)) {
			k := leaseKey{v.Processes[j], v.Leases[j]}
			d.involved[k] = append(d.involved[k], i)
		}
	}
}

// naturalCompare orders "k2" before "k10".
func naturalCompare(a, b string) int {
	split := func(s string) (string, int, bool) {
		i := strings.LastIndexFunc(s, func(r rune) bool { return !unicode.IsDigit(r) }) + 1
		if i == len(s) || len(s)-i > 9 {
			return s, 0, false
		}
		n, _ := strconv.Atoi(s[i:])
		return s[:i], n, true
	}
	pa, na, oka := split(a)
	pb, nb, okb := split(b)
	if oka && okb && pa == pb {
		return cmp.Compare(na, nb)
	}
	return cmp.Compare(a, b)
}

// color is a worker's colour: hues spread by the golden angle.
func color(process int) string {
	h := math.Mod(float64(process)*137.508, 360)
	return fmt.Sprintf("hsl(%.0f,62%%,52%%)", h)
}

func (d *drawer) workers() []workerColor {
	var ps []int
	for p := range d.procs {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	var out []workerColor
	for _, p := range ps {
		out = append(out, workerColor{Name: fmt.Sprintf("worker %d", p), Color: color(p)})
	}
	return out
}

func (d *drawer) ms(t int64) string { return ms(d.h, t) }

func (d *drawer) leaseTitle(l *checker.Lease) string {
	var b strings.Builder
	fmt.Fprintf(&b, "worker %d, lease %d, key %s, token %d\n", l.Process, l.Lease, l.Key, l.Token)
	fmt.Fprintf(&b, "Lock called %s, last attempt %s, granted by %s\n", d.ms(l.Acquire.Start), d.ms(l.Attempt()), d.ms(l.Acquire.End))
	failed := 0
	for _, r := range l.Renews {
		if !r.OK {
			failed++
		}
	}
	fmt.Fprintf(&b, "renewals: %d (%d failed); writes: %d\n", len(l.Renews), failed, len(l.Writes))
	if l.Lost != 0 {
		fmt.Fprintf(&b, "declared lost at %s\n", d.ms(l.Lost))
	}
	if rs := l.ReleaseStart(); rs != 0 {
		fmt.Fprintf(&b, "release called at %s\n", d.ms(rs))
	}
	fmt.Fprintf(&b, "outcome: %s, last known at %s", l.Outcome(), d.ms(l.LastKnown()))
	return b.String()
}

// panel lays out one window of the run: its leases, the keys they are drawn on,
// the write marks and the faults, top to bottom. It is one function of about 220
// lines on purpose: every part places itself below the parts before it on one
// running y, with the window's x scale closed over; split up, each part would take
// and return that whole state.
func (d *drawer) panel(win window) *panel {
	var in []*checker.Lease
	for _, l := range d.leases {
		if l.Attempt() <= win.to && l.LastKnown() >= win.from {
			in = append(in, l)
		}
	}
	plot := float64(min(max(len(in)*pxPerLease, minPlot), maxPlot))
	pn := &panel{from: win.from, to: win.to, leaseCount: len(in), scale: plot / float64(win.to-win.from)}
	pn.PlotLeft, pn.PlotRight = leftMargin, num(leftMargin+plot)
	pn.Width = pn.PlotRight + rightPad
	pn.AxisY = axisHeight - 4
	x := func(t int64) num { return num(leftMargin + float64(min(max(t, win.from), win.to)-win.from)*pn.scale) }
	inWin := func(t int64) bool { return t >= win.from && t <= win.to }

	// Keys drawn: every key in a whole-run panel, the busy ones in a window.
	used := map[string]bool{}
	for _, l := range in {
		used[l.Key] = true
	}
	i0, _ := slices.BinarySearchFunc(d.writes, win.from, func(w history.StoreWrite, t int64) int { return cmp.Compare(w.Time, t) })
	var writes []history.StoreWrite
	for _, w := range d.writes[i0:] {
		if w.Time > win.to {
			break
		}
		writes = append(writes, w)
		used[w.Key] = true
	}
	var fails []history.Op
	for _, o := range d.fails {
		if o.Start > win.to {
			break
		}
		if o.End >= win.from {
			fails = append(fails, o)
			used[o.Key] = true
		}
	}
	for _, v := range d.vs {
		if inWin(v.Time) {
			used[v.Key] = true
		}
	}

	// Rows: a lease goes in the first row of its lane that is free at its start.
	rowOf := map[leaseKey]int{}
	rows := map[string]int{}
	byKey := map[string][]*checker.Lease{}
	for _, l := range in {
		byKey[l.Key] = append(byKey[l.Key], l)
	}
	for k, ls := range byKey {
		slices.SortStableFunc(ls, func(a, b *checker.Lease) int { return cmp.Compare(a.Attempt(), b.Attempt()) })
		var ends []num
		for _, l := range ls {
			s := x(l.Attempt())
			r := slices.IndexFunc(ends, func(e num) bool { return e+1 < s })
			if r < 0 {
				r = len(ends)
				ends = append(ends, 0)
			}
			ends[r] = max(x(l.LastKnown()), x(d.certainHold(l)), s+1) // overlapping holds stack
			rowOf[leaseKey{l.Process, l.Lease}] = r
		}
		rows[k] = len(ends)
	}

	laneY := map[string]num{}
	y := num(axisHeight)
	for i, k := range d.keys {
		if !used[k] {
			continue
		}
		h := num(max(rows[k], 1)*rowHeight + failRow + 4)
		pn.Lanes = append(pn.Lanes, lane{Key: k, Y: y, H: h, LabelY: y + h/2 + 4, Alternate: i%2 == 1})
		laneY[k] = y
		y += h
	}
	if len(pn.Lanes) == 0 {
		y += rowHeight
	}
	bottom := y
	pn.Height = bottom + 10
	rowY := func(key string, row int) num { return laneY[key] + 2 + num(row*rowHeight) }

	// Time axis.
	for _, t := range ticks(win.from, win.to, d.h.Meta.Start, plot) {
		pn.Ticks = append(pn.Ticks, tick{X: x(t), Label: strings.TrimSuffix(d.ms(t), " ms")})
	}

	// Fault bands over every lane.
	for _, f := range d.faults {
		if f.End < win.from || f.Start > win.to {
			continue
		}
		a, b := x(f.Start), x(f.End)
		healed := "never healed"
		if f.Healed {
			healed = "healed at " + d.ms(f.End)
		}
		title := fmt.Sprintf("fault %s on %s at %s, %s", f.Fault, f.Target, d.ms(f.Start), healed)
		if f.Detail != "" {
			title += "\n" + f.Detail
		}
		label := strings.TrimSpace(f.Fault + " " + f.Target)
		pn.Bands = append(pn.Bands, band{X: a, W: max(b-a, 1), Y: axisHeight, H: bottom - axisHeight, Label: label, LabelX: a + 2, Title: title})
	}
	for _, e := range d.notes {
		if inWin(e.Time) {
			pn.Lines = append(pn.Lines, mark{X: x(e.Time), Y: axisHeight, W: 1, H: bottom - axisHeight, Class: "note",
				Title: strings.TrimSpace(fmt.Sprintf("note at %s: %s %s %s", d.ms(e.Time), e.Fault, e.Target, e.Detail))})
		}
	}

	// Leases, their renewals and the lost moment.
	bars := map[leaseKey]bar{}
	for _, l := range in {
		k := leaseKey{l.Process, l.Lease}
		s, e := x(l.Attempt()), x(l.LastKnown())
		b := bar{X: s, Y: rowY(l.Key, rowOf[k]) + (rowHeight-barHeight)/2, W: max(e-s, 1), H: barHeight,
			GrantW: max(x(l.Acquire.End)-s, 0), Color: color(l.Process), Title: d.leaseTitle(l),
			ID: fmt.Sprintf("w%d-l%d", l.Process, l.Lease)}
		if hold := d.certainHold(l); hold > l.LastKnown() && hold >= win.from {
			b.TailX = x(max(l.LastKnown(), win.from))
			b.TailW = x(hold) - b.TailX
			b.TailTitle = fmt.Sprintf("worker %d lease %d: the server holds key %s until at least %s unless released (last attempt or renewal sent plus the hold of %v)",
				l.Process, l.Lease, l.Key, d.ms(hold), d.h.Meta.Hold)
		}
		if d.barIDs[b.ID] {
			b.ID = "" // drawn in an earlier window
		}
		d.barIDs[b.ID] = true
		if l.Lost != 0 && inWin(l.Lost) {
			b.Lost, b.LostX, b.LostY1, b.LostY2 = true, x(l.Lost), b.Y-2, b.Y+b.H+2
		}
		bars[k] = b
		pn.Bars = append(pn.Bars, b)
		for _, r := range l.Renews {
			if !inWin(r.Start) {
				continue
			}
			class, what := "renew", "renewal"
			if !r.OK {
				class, what = "renewfail", "failed renewal"
			}
			pn.Marks = append(pn.Marks, mark{X: x(r.Start), Y: b.Y + 2, W: 1, H: barHeight - 4, Class: class,
				Title: fmt.Sprintf("%s by worker %d lease %d, sent %s, returned %s", what, l.Process, l.Lease, d.ms(r.Start), d.ms(r.End))})
		}
	}

	// Writes as the store decided them.
	for _, w := range writes {
		row := rowOf[leaseKey{w.Process, w.Lease}]
		my := rowY(w.Key, row)
		class, what := "acc", "accepted"
		switch {
		case w.Accepted && w.Token < w.Max:
			class, what = "p3", "accepted although the store had already accepted a larger token (P3 violation)"
		case !w.Accepted:
			class, what = "rej", "rejected (stale token)"
		}
		mk := mark{X: x(w.Time) - 1, Y: my, W: 2, H: rowHeight, Class: class,
			Title: fmt.Sprintf("write to %s by worker %d lease %d with token %d at %s: %s; the store's max before: %d", w.Key, w.Process, w.Lease, w.Token, d.ms(w.Time), what, w.Max)}
		if class == "p3" {
			mk.Y, mk.W, mk.H, mk.X = my-2, 3, rowHeight+4, x(w.Time)-1.5
		}
		pn.Marks = append(pn.Marks, mk)
	}

	// Failed acquires, thin at the bottom of their lane.
	for _, o := range fails {
		a, b := x(o.Start), x(o.End)
		pn.Fails = append(pn.Fails, bar{X: a, Y: laneY[o.Key] + num(max(rows[o.Key], 1)*rowHeight) + 3, W: max(b-a, 1), H: 2,
			Title: fmt.Sprintf("failed acquire by worker %d from %s to %s: %s", o.Process, d.ms(o.Start), d.ms(o.End), o.Err)})
	}

	// Violations: outline the leases a P1 or P4 example names, and place each
	// example's anchor.
	for k, idx := range d.involved {
		b, ok := bars[k]
		if !ok {
			continue
		}
		var titles []string
		for _, i := range idx {
			titles = append(titles, d.vs[i].Detail)
		}
		pn.Outlines = append(pn.Outlines, outline{X: b.X - 2, Y: b.Y - 2, W: b.W + 4, H: b.H + 4, Title: strings.Join(titles, "\n")})
	}
	for i, v := range d.vs {
		if _, done := d.anchored[i]; done || !inWin(v.Time) {
			continue
		}
		id := fmt.Sprintf("v%d", i+1)
		ly, ok := laneY[v.Key]
		if !ok {
			continue
		}
		switch v.Check {
		case checker.CheckLost:
			a, b := x(v.Time), x(v.End)
			pn.Outlines = append(pn.Outlines, outline{X: a, Y: ly + 1, W: max(b-a, 2), H: num(max(rows[v.Key], 1)*rowHeight + failRow + 2), ID: id, Title: v.Detail, Dashed: true})
		case checker.CheckP3:
			row := 0
			if len(v.Processes) > 0 && len(v.Leases) > 0 {
				row = rowOf[leaseKey{v.Processes[0], v.Leases[0]}]
			}
			pn.Outlines = append(pn.Outlines, outline{X: x(v.Time) - 5, Y: rowY(v.Key, row) - 3, W: 10, H: rowHeight + 6, ID: id, Title: v.Detail})
		default: // P1, P4: the offending grant's window, [Attempt, End]
			mk := mark{X: x(v.Time) - 1, Y: ly, W: 3, H: num(max(rows[v.Key], 1) * rowHeight), Class: "viol", ID: id, Title: v.Detail}
			if len(v.Processes) > 0 && len(v.Leases) > 0 {
				if b, ok := bars[leaseKey{v.Processes[0], v.Leases[0]}]; ok {
					mk.X, mk.W = b.X, max(b.GrantW, 3)
					mk.Y, mk.H = b.Y-3, b.H+6
				}
			}
			pn.Marks = append(pn.Marks, mk)
		}
		d.anchored[i] = id
		pn.violationCount++
	}
	return pn
}

// certainHold is how long the server certainly holds the key for l, as far as
// the whole history tells: the latest of its attempt and OK renewal starts plus
// Meta.Hold, or the start of its first release call if earlier; 0 without a Hold.
func (d *drawer) certainHold(l *checker.Lease) int64 {
	if d.h.Meta.Hold <= 0 {
		return 0
	}
	t := l.Attempt()
	for _, r := range l.Renews {
		if r.OK {
			t = max(t, r.Start)
		}
	}
	t += int64(d.h.Meta.Hold)
	if rs := l.ReleaseStart(); rs != 0 {
		t = min(t, rs)
	}
	return t
}

// ticks returns about one tick per 100 px, at round milliseconds since origin
// (Meta.Start, which the labels count from).
func ticks(from, to, origin int64, plot float64) []int64 {
	step := float64(to-from) / max(plot/100, 2)
	mag := math.Pow(10, math.Floor(math.Log10(step)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= step {
			step = m * mag
			break
		}
	}
	s := int64(max(step, 1))
	var out []int64
	first := from - origin
	first -= first % s // rounds towards zero
	for t := first + origin; t <= to && len(out) < 1000; t += s {
		if t >= from {
			out = append(out, t)
		}
	}
	return out
}
