package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock/internal/measure"
)

// WriteMarkdown writes the results as markdown tables with a short legend.
func (r *Result) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	ok := r.ok()
	r.writeHeader(&b)
	r.writeCycles(&b, ok)
	r.writeManyKeys(&b, ok)
	r.writeHotKey(&b, ok)
	r.writePeers(&b, ok)
	dl := dlockOnly(ok)
	r.writeCost(&b, dl)
	r.writeChain(&b, dl)
	r.writeBackends(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Result) writeHeader(b *strings.Builder) {
	s := r.Settings
	m := r.Machine
	pinned := "not pinned"
	if m.Pinned != "" {
		pinned = "pinned to CPU " + m.Pinned
	}
	fmt.Fprintf(b, "dlock bench, %s: %d round(s), %v per workload and backend, %d workers, %d keys, waiters %s.\n",
		r.Started.Format("2006-01-02 15:04 MST"), s.Rounds, s.Duration, s.Workers, s.Keys, joinInts(s.Waiters, ", "))
	fmt.Fprintf(b, "%s/%s, %d CPUs, %s, %s; load average %s at the start, %s at the end; took %v.\n\n",
		m.OS, m.Arch, m.CPUs, m.Go, pinned, fmtFloat(m.LoadStart, 1), fmtFloat(m.LoadEnd, 1), r.Elapsed.Round(100*time.Millisecond))
}

func (r *Result) writeCycles(b *strings.Builder, ok []*BackendResult) {
	b.WriteString("### Uncontended Lock + Release (one client)\n\n")
	b.WriteString("Three cycles run in turn, in an order shuffled for each group of three, in the same rounds: dlock (Lock+Release through the core), the driver alone (its Acquire+Release called directly: what the backend's own requests cost) and the floor (the least a correct lock does on the engine, with the engine's own client and none of dlock).")
	peers := r.hasPeers()
	if peers {
		b.WriteString(" Each peer of the store takes its cycles in the same loop, one in each group.")
	}
	b.WriteString("\n\n")
	head := []string{"backend", "cycles/s", "p50", "p99", "driver p50", "floor p50", "floor p99", "dlock / floor", "driver / floor", "dlock / floor per round"}
	align := "lrrrrrrrrl"
	if peers {
		head, align = append(head, "p50 / best peer p50"), align+"l"
	}
	table(b, head, align, ok, func(br *BackendResult) []string {
		c := br.Cycle
		if !br.can(WorkCycle) {
			return cannotRow(br, len(head))
		}
		row := []string{br.label(), fmtRate(c.PerSecond), fmtDur(c.Dlock.P50), fmtDur(c.Dlock.P99), fmtDur(c.Driver.P50)}
		if c.Floor != nil {
			row = append(row, fmtDur(c.Floor.P50), fmtDur(c.Floor.P99))
		} else {
			row = append(row, "n/a", "n/a")
		}
		var rounds []string
		for _, rc := range c.Rounds {
			rounds = append(rounds, fmtFloat(rc.Ratio, 2))
		}
		per := strings.Join(rounds, ", ")
		if !c.Ratio.Valid() {
			per = ""
		}
		row = append(row, fmtRatio(c.Ratio), fmtRatio(c.DriverRatio), per)
		if peers {
			row = append(row, br.vsPeer(func(v *PeerRatios) (Float, string, []Float) { return v.CycleP50, v.CycleBest, nil }))
		}
		return row
	})
	if rel := r.relativeCycles(); rel != "" {
		b.WriteString("\n" + rel)
	}
}

func (r *Result) writeManyKeys(b *strings.Builder, ok []*BackendResult) {
	s := r.Settings
	fmt.Fprintf(b, "\n### Many keys (%d workers over %d keys, a random key per acquisition)\n\n", s.Workers, s.Keys)
	b.WriteString("The floor runs the same number of clients, each on keys of its own (no contention at all).\n\n")
	head := []string{"backend", "acquisitions/s", "floor cycles/s", "dlock / floor"}
	align := "lrrr"
	peers := r.hasPeers()
	if peers {
		head, align = append(head, "dlock / best peer"), align+"l"
	}
	table(b, head, align, ok, func(br *BackendResult) []string {
		m := br.ManyKeys
		if !br.can(WorkManyKeys) {
			return cannotRow(br, len(head))
		}
		row := []string{br.label(), fmtRate(m.PerSecond), fmtRateF(m.FloorPerSecond), fmtRatio(m.Ratio)}
		if peers {
			row = append(row, br.vsPeer(func(v *PeerRatios) (Float, string, []Float) { return v.ManyKeys, v.ManyKeysBest, nil }))
		}
		return row
	})
}

func (r *Result) writeHotKey(b *strings.Builder, ok []*BackendResult) {
	s := r.Settings
	fmt.Fprintf(b, "\n### One hot key (%d workers)\n\n", s.Workers)
	b.WriteString("Handoff: from a Release call to the next holder's Lock returning. Fairness is that of the worst round: acquisitions of the least and the most served worker, and Jain's index (1 = equal shares, 1/workers = one worker takes all).\n\n")
	head := []string{"backend", "acquisitions/s", "handoff p50", "handoff p99", "handoff p50 / floor p50", "per worker min-max", "min/max", "Jain"}
	align := "lrrrrrrr"
	peers := r.hasPeers()
	if peers {
		head, align = append(head, "dlock / best peer"), align+"l"
	}
	table(b, head, align, ok, func(br *BackendResult) []string {
		h := br.HotKey
		if !br.can(WorkHotKey) {
			return cannotRow(br, len(head))
		}
		row := []string{br.label(), fmtRate(h.PerSecond), fmtDur(h.Handoff.P50), fmtDur(h.Handoff.P99), fmtRatio(h.HandoffFloorRatio),
			fmt.Sprintf("%d-%d", h.MinPerWorker, h.MaxPerWorker), fmtFloat(h.MinMax, 2), fmtFloat(h.Jain, 3)}
		if peers {
			row = append(row, br.vsPeer(func(v *PeerRatios) (Float, string, []Float) { return v.HotKey, v.HotKeyBest, nil }))
		}
		return row
	})
}

func (r *Result) writeCost(b *strings.Builder, ok []*BackendResult) {
	s := r.Settings
	b.WriteString("\n### Cost per handoff as waiters grow\n\n")
	fmt.Fprintf(b, "N waiters queue behind a holder, each with its own owner id, spread over %d clients; the key then passes down the chain. Server operations come from the server's own counters; driver calls (Acquire, Release, Watch, Stop, ...) are counted in the client, for every backend.\n\n", max(s.Workers-1, 1))
	head := []string{"backend", "counted", "floor cycle", "dlock cycle"}
	align := "llrr"
	for _, n := range s.Waiters {
		head = append(head, plural(n, "waiter"))
		align += "r"
	}
	var rows [][]string
	for _, br := range ok {
		so := []string{br.Name, "server ops", fmtFloat(br.FloorOps, 1), fmtFloat(br.CycleCost.ServerOps, 1)}
		dc := []string{br.Name, "driver calls", "n/a", fmtFloat(br.CycleCost.Calls, 1)}
		for _, n := range s.Waiters {
			g := br.point(n)
			if g == nil {
				so, dc = append(so, "n/a"), append(dc, "n/a")
				continue
			}
			mark := ""
			if !g.Queued {
				mark = " *"
			}
			so = append(so, fmtFloat(g.Cost.ServerOps, 1)+mark)
			dc = append(dc, fmtFloat(g.Cost.Calls, 1)+mark)
		}
		if br.OpsSource != "" {
			rows = append(rows, so)
		}
		rows = append(rows, dc)
	}
	writeTable(b, head, align, rows)
	var srcs []string
	for _, br := range ok {
		if br.OpsSource != "" {
			srcs = append(srcs, br.Name+": "+br.OpsSource)
		} else {
			srcs = append(srcs, br.Name+": no server counter, driver calls only")
		}
	}
	b.WriteString("\nServer operations: " + strings.Join(srcs, "; ") + ".\n")
	if unqueued(ok) {
		b.WriteString("\n\\* the backend did not show every waiter queued before the release in some round.\n")
	}
}

func (r *Result) writeChain(b *strings.Builder, ok []*BackendResult) {
	s := r.Settings
	b.WriteString("\n### Handoffs per second down the chain of waiters\n\n")
	head := []string{"backend"}
	align := "l"
	for _, n := range s.Waiters {
		head = append(head, plural(n, "waiter"))
		align += "r"
	}
	var rows [][]string
	for _, br := range ok {
		row := []string{br.Name}
		for _, n := range s.Waiters {
			if g := br.point(n); g != nil {
				row = append(row, fmtRate(g.PerSecond))
			} else {
				row = append(row, "n/a")
			}
		}
		rows = append(rows, row)
	}
	writeTable(b, head, align, rows)
}

func (r *Result) writeBackends(b *strings.Builder) {
	b.WriteString("\n### Backends\n\n")
	for _, br := range r.Backends {
		fmt.Fprintf(b, "- %s: `%s`", br.label(), br.URL)
		if br.Note != "" {
			b.WriteString(" (" + br.Note + ")")
		}
		if br.Error != "" {
			b.WriteString(". **Failed:** " + oneLine(br.Error))
		}
		if br.Overlaps > 0 {
			fmt.Fprintf(b, ". **%d overlapping acquisitions** (mutual exclusion failed)", br.Overlaps)
		}
		for _, n := range br.Notes {
			b.WriteString(". " + n)
		}
		b.WriteString(".\n")
	}
}

// writePeers sums up dlock beside the peers of each store: the uncontended cycle
// and the hot key with its fairness, and each dlock backend's ratios to the best
// peer of its store.
func (r *Result) writePeers(b *strings.Builder, ok []*BackendResult) {
	if !r.hasPeers() {
		return
	}
	s := r.Settings
	b.WriteString("\n### Beside the peers\n\n")
	fmt.Fprintf(b, "Peers are the lock libraries users run on the same stores, measured in this process on the same servers, through the same loops, in the same rounds; their uncontended cycles run in the dlock backend's loop, cycle by cycle in turn with dlock's. They have no fencing tokens, no handoff hooks and no server-operation counts, and are left out of the cost tables. Hot key: %d workers; fairness as above (the worst round). Ratios are dlock's over the best peer of its store, over the whole run and (in brackets) round by round: p50 below 1 and acquisitions/s above 1 are dlock ahead.\n\n", s.Workers)
	var rows [][]string
	for _, store := range []string{StoreRedis, StoreRedlock, StoreEtcd, StoreZK, StorePostgres, StoreMySQL} {
		for _, br := range ok {
			if br.Store != store {
				continue
			}
			row := []string{store, br.label()}
			if br.can(WorkCycle) {
				row = append(row, fmtDur(br.Cycle.Dlock.P50), fmtRate(br.Cycle.PerSecond))
			} else {
				row = append(row, "cannot", "cannot")
			}
			if br.can(WorkHotKey) {
				h := br.HotKey
				row = append(row, fmtRate(h.PerSecond), fmt.Sprintf("%d-%d", h.MinPerWorker, h.MaxPerWorker), fmtFloat(h.MinMax, 2))
			} else {
				row = append(row, "cannot", "", "")
			}
			row = append(row,
				br.vsPeer(func(v *PeerRatios) (Float, string, []Float) { return v.CycleP50, v.CycleBest, v.CycleP50Rounds }),
				br.vsPeer(func(v *PeerRatios) (Float, string, []Float) { return v.HotKey, v.HotKeyBest, v.HotKeyRounds }))
			rows = append(rows, row)
		}
	}
	writeTable(b, []string{"store", "backend", "cycle p50", "cycles/s", "hot key acq/s", "per worker min-max", "min/max", "cycle p50 / best peer", "hot key / best peer"}, "llrrrrrll", rows)
}

// hasPeers reports whether peers ran.
func (r *Result) hasPeers() bool {
	for _, br := range r.Backends {
		if br.Peer {
			return true
		}
	}
	return false
}

// dlockOnly drops the peers.
func dlockOnly(brs []*BackendResult) []*BackendResult {
	var out []*BackendResult
	for _, br := range brs {
		if !br.Peer {
			out = append(out, br)
		}
	}
	return out
}

// label is the backend's name in the tables, a peer's marked as such.
func (br *BackendResult) label() string {
	if br.Peer {
		return br.Name + " (peer)"
	}
	return br.Name
}

// vsPeer writes a ratio to the best peer with that peer's name and, with more than
// one round, the ratio of each round in brackets; empty for a peer and for a
// backend whose store has no peer result.
func (br *BackendResult) vsPeer(f func(*PeerRatios) (Float, string, []Float)) string {
	if br.Peer || br.VsPeers == nil {
		return ""
	}
	v, name, rounds := f(br.VsPeers)
	if !v.Valid() {
		return "n/a"
	}
	s := fmtRatio(v) + " " + name
	if len(rounds) > 1 {
		parts := make([]string, len(rounds))
		for i, r := range rounds {
			parts[i] = fmtFloat(r, 2)
		}
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

// cannotRow is the row of a peer that cannot run a workload.
func cannotRow(br *BackendResult, n int) []string {
	row := []string{br.label(), "cannot (the peer has no such operation)"}
	for len(row) < n {
		row = append(row, "")
	}
	return row
}

// ok returns the backends that produced results.
func (r *Result) ok() []*BackendResult {
	var ok []*BackendResult
	for _, br := range r.Backends {
		if br.Error == "" {
			ok = append(ok, br)
		}
	}
	return ok
}

func unqueued(brs []*BackendResult) bool {
	for _, br := range brs {
		for _, g := range br.Growth {
			if !g.Queued {
				return true
			}
		}
	}
	return false
}

func (br *BackendResult) point(waiters int) *GrowthPoint {
	for i := range br.Growth {
		if br.Growth[i].Waiters == waiters {
			return &br.Growth[i]
		}
	}
	return nil
}

// relativeCycles compares Redlock's cycle with a single Redis instance's when both
// ran.
func (r *Result) relativeCycles() string {
	var single, multi *BackendResult
	for _, br := range dlockOnly(r.ok()) {
		switch schemeOf(br.URL) {
		case "redis", "rediss", "unix":
			if single == nil {
				single = br
			}
		case "redlock":
			if multi == nil {
				multi = br
			}
		}
	}
	if single == nil || multi == nil || single.Cycle.Dlock.P50 == 0 {
		return ""
	}
	return fmt.Sprintf("%s's cycle p50 is %s that of %s (%s against %s).\n", multi.Name,
		fmtRatio(Float(measure.Ratio(float64(multi.Cycle.Dlock.P50), float64(single.Cycle.Dlock.P50)))), single.Name,
		fmtDur(multi.Cycle.Dlock.P50), fmtDur(single.Cycle.Dlock.P50))
}

func table(b *strings.Builder, head []string, align string, brs []*BackendResult, row func(*BackendResult) []string) {
	var rows [][]string
	for _, br := range brs {
		rows = append(rows, row(br))
	}
	writeTable(b, head, align, rows)
}

func writeTable(b *strings.Builder, head []string, align string, rows [][]string) {
	if len(rows) == 0 {
		b.WriteString("(no backend produced results)\n")
		return
	}
	b.WriteString("| " + strings.Join(head, " | ") + " |\n|")
	for i := range head {
		if i < len(align) && align[i] == 'r' {
			b.WriteString(" --: |")
		} else {
			b.WriteString(" :-- |")
		}
	}
	b.WriteString("\n")
	for _, r := range rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func joinInts(xs []int, sep string) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, sep)
}

// fmtDur writes a latency with three significant digits: 812ns, 1.25µs, 31.4ms.
func fmtDur(d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	v, unit := float64(d), "ns"
	for _, u := range []struct {
		f    float64
		name string
	}{{1e9, "s"}, {1e6, "ms"}, {1e3, "µs"}} {
		if float64(d) >= u.f {
			v, unit = float64(d)/u.f, u.name
			break
		}
	}
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f%s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f%s", v, unit)
	default:
		return fmt.Sprintf("%.2f%s", v, unit)
	}
}

// fmtRate writes a rate rounded to three significant digits with thousands
// separators: 1,230,000 or 412 or 3.51.
func fmtRate(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "n/a"
	}
	if f < 10 {
		return strconv.FormatFloat(f, 'f', 2, 64)
	}
	if f < 100 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	mag := math.Pow(10, math.Floor(math.Log10(f))-2)
	n := int64(math.Round(f/mag) * mag)
	s := strconv.FormatInt(n, 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func fmtRateF(f Float) string { return fmtRate(float64(f)) }

func fmtRatio(f Float) string {
	if !f.Valid() {
		return "n/a"
	}
	return strconv.FormatFloat(float64(f), 'f', 2, 64) + "×"
}

func fmtFloat(f Float, prec int) string {
	if !f.Valid() {
		return "n/a"
	}
	return strconv.FormatFloat(float64(f), 'f', prec, 64)
}
