package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock/internal/measure"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart files written by WriteCharts.
const (
	ChartCycleLatency   = "cycle-latency.png"
	ChartHandoffLatency = "handoff-latency.png"
	ChartWaitersRate    = "waiters-throughput.png"
	ChartWaitersCost    = "waiters-cost.png"
	// ChartPeers is written only when peers ran (Config.Peers).
	ChartPeers = "peers-hot-key.png"
)

// chart size: small enough for a repository, large enough to read.
const chartW, chartH = 6 * vg.Inch, 3.6 * vg.Inch

// WriteCharts draws the results as PNG files in dir (created if missing) and returns
// their paths: the distribution of uncontended cycle latencies (dlock solid, floor
// dashed) and of hot-key handoff latencies, per backend, as cumulative distributions
// on a log scale; and handoffs per second and cost per handoff against the number of
// waiters; when peers ran, the hot key's acquisitions per second of every dlock
// backend beside its store's peers, with each one's fairness. The latency charts
// need the samples of a Run in this process; a Result read back from JSON draws the
// others.
func (r *Result) WriteCharts(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ok := r.ok()
	var files []string
	save := func(c *chart, name string) error {
		path := filepath.Join(dir, name)
		if err := c.save(path); err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		files = append(files, path)
		return nil
	}

	if r.hasSamples() {
		p := latencyPlot(fmt.Sprintf("Uncontended Lock+Release latency (floor dashed), %d rounds", r.Settings.Rounds))
		for i, br := range ok {
			addCDF(p, br.samples.cycle, br.label(), i, false)
			addCDF(p, br.samples.floor, br.Name+" floor", i, true)
		}
		if err := save(p, ChartCycleLatency); err != nil {
			return files, err
		}
		p = latencyPlot(fmt.Sprintf("Hot key handoff latency, %d workers", r.Settings.Workers))
		for i, br := range ok {
			addCDF(p, br.samples.handoff, br.label(), i, false)
		}
		if err := save(p, ChartHandoffLatency); err != nil {
			return files, err
		}
	}

	p := waitersPlot("Handoffs per second down a chain of waiters", "handoffs/s (log scale)")
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = powerTicks{label: func(v float64) string { return fmtRate(v) }}
	p.decades = true
	for i, br := range ok {
		var pts plotter.XYs
		for _, g := range br.Growth {
			if g.PerSecond > 0 {
				pts = append(pts, plotter.XY{X: float64(g.Waiters), Y: g.PerSecond})
			}
		}
		addLine(p, pts, br.Name, i, false)
	}
	if err := save(p, ChartWaitersRate); err != nil {
		return files, err
	}

	p = waitersPlot("Cost per handoff (server ops solid, driver calls dashed)", "per handoff (log scale)")
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = powerTicks{label: func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }}
	p.decades = true
	for i, br := range ok {
		var ops, calls plotter.XYs
		for _, g := range br.Growth {
			if g.Cost.ServerOps.Valid() && g.Cost.ServerOps > 0 {
				ops = append(ops, plotter.XY{X: float64(g.Waiters), Y: float64(g.Cost.ServerOps)})
			}
			if g.Cost.Calls.Valid() && g.Cost.Calls > 0 {
				calls = append(calls, plotter.XY{X: float64(g.Waiters), Y: float64(g.Cost.Calls)})
			}
		}
		addLine(p, ops, br.Name+" server ops", i, false)
		addLine(p, calls, br.Name+" driver calls", i, true)
	}
	if err := save(p, ChartWaitersCost); err != nil {
		return files, err
	}
	if p := r.peersChart(); p != nil {
		return files, save(p, ChartPeers)
	}
	return files, nil
}

// peersChart draws the hot key's acquisitions per second of each dlock backend
// that has peers and of those peers, a bar each, grouped by store (dlock first,
// in colour; peers in grey), with the worst round's fairness (min/max
// acquisitions per worker) above each bar. It returns nil when no peer ran.
func (r *Result) peersChart() *chart {
	type bar struct {
		name string
		rate float64
		fair Float
		peer bool
	}
	var bars []bar
	for _, br := range r.ok() {
		if br.Peer || br.Store == "" || br.HotKey.PerSecond <= 0 {
			continue
		}
		var peers []bar
		for _, p := range r.ok() {
			if p.Peer && p.Store == br.Store && p.can(WorkHotKey) && p.HotKey.PerSecond > 0 {
				peers = append(peers, bar{p.Name, p.HotKey.PerSecond, p.HotKey.MinMax, true})
			}
		}
		if len(peers) > 0 {
			bars = append(append(bars, bar{br.Name, br.HotKey.PerSecond, br.HotKey.MinMax, false}), peers...)
		}
	}
	if len(bars) == 0 {
		return nil
	}
	where := "not pinned"
	if r.Machine.Pinned != "" {
		where = "pinned to CPU " + r.Machine.Pinned
	}
	p := newChart(fmt.Sprintf("Hot key, %d workers, %s: dlock beside the peers (fairness min/max above)", r.Settings.Workers, where))
	p.Y.Label.Text = "acquisitions/s (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = powerTicks{label: func(v float64) string { return fmtRate(v) }}
	p.decades = true
	// A log axis has no zero: the bars rise from the power of ten below the
	// lowest of them.
	lo := bars[0].rate
	for _, b := range bars {
		lo = min(lo, b.rate)
	}
	lo = decadeBelow(lo)
	names := make([]string, len(bars))
	var labels plotter.XYLabels
	for i, b := range bars {
		names[i] = b.name
		base, err1 := plotter.NewBarChart(plotter.Values{lo}, vg.Points(14)) // not drawn
		bc, err2 := plotter.NewBarChart(plotter.Values{b.rate - lo}, vg.Points(14))
		if err1 != nil || err2 != nil {
			continue
		}
		base.XMin, bc.XMin = float64(i), float64(i)
		bc.StackOn(base)
		bc.LineStyle.Width = 0
		bc.Color = colour(0)
		if b.peer {
			bc.Color = color.Gray{Y: 0xa0}
		}
		p.Add(bc)
		if b.fair.Valid() {
			labels.XYs = append(labels.XYs, plotter.XY{X: float64(i), Y: b.rate * 1.15})
			labels.Labels = append(labels.Labels, strconv.FormatFloat(float64(b.fair), 'f', 2, 64))
		}
	}
	if l, err := plotter.NewLabels(labels); err == nil {
		for i := range l.TextStyle {
			l.TextStyle[i].Font.Size = vg.Points(7)
			l.TextStyle[i].XAlign = draw.XCenter
		}
		p.Add(l)
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 4
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	p.legend.Add("dlock", &plotter.BarChart{Color: colour(0)})
	p.legend.Add("peer", &plotter.BarChart{Color: color.Gray{Y: 0xa0}})
	return p
}

func (r *Result) hasSamples() bool {
	for _, br := range r.ok() {
		if br.samples.cycle != nil {
			return true
		}
	}
	return false
}

// chart is a plot with its legend drawn beside it rather than over the lines.
type chart struct {
	*plot.Plot
	legend   plot.Legend
	decades  bool // widen a log Y axis to whole powers of ten
	xdecades bool // the same for a log X axis
}

const legendW = 1.7 * vg.Inch

func newChart(title string) *chart {
	p := plot.New()
	p.Title.Text = title
	p.Add(plotter.NewGrid())
	c := &chart{Plot: p, legend: plot.NewLegend()}
	c.legend.Top, c.legend.Left = true, true
	c.legend.TextStyle.Font.Size = vg.Points(9)
	return c
}

func (c *chart) save(path string) error {
	// A log axis with nothing to show (no data) still needs a positive range.
	for _, a := range []*plot.Axis{&c.X, &c.Y} {
		if _, log := a.Scale.(plot.LogScale); log && (a.Min <= 0 || a.Max <= a.Min) {
			a.Min, a.Max = 1, 10
		}
	}
	if c.decades && c.Y.Min > 0 {
		c.Y.Min, c.Y.Max = decadeBelow(c.Y.Min), decadeAbove(c.Y.Max)
	}
	if c.xdecades && c.X.Min > 0 {
		c.X.Min, c.X.Max = decadeBelow(c.X.Min), decadeAbove(c.X.Max)
	}
	img := vgimg.NewWith(vgimg.UseWH(chartW+legendW, chartH), vgimg.UseDPI(96))
	dc := draw.New(img)
	c.Draw(draw.Crop(dc, 0, -legendW, 0, 0))
	lc := draw.Crop(dc, chartW+vg.Points(6), 0, 0, -vg.Points(24))
	c.legend.Draw(lc)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func decadeBelow(v float64) float64 { return math.Pow(10, math.Floor(math.Log10(v)+1e-9)) }
func decadeAbove(v float64) float64 { return math.Pow(10, math.Ceil(math.Log10(v)-1e-9)) }

func latencyPlot(title string) *chart {
	p := newChart(title)
	p.X.Label.Text = "latency (log scale)"
	p.Y.Label.Text = "fraction at or below"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = powerTicks{label: func(v float64) string { return shortDur(time.Duration(v)) }}
	p.Y.Min, p.Y.Max = 0, 1
	p.xdecades = true
	return p
}

func waitersPlot(title, ylabel string) *chart {
	p := newChart(title)
	p.X.Label.Text = "waiters queued (log scale)"
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = powerTicks{base2: true, label: func(v float64) string { return strconv.Itoa(int(math.Round(v))) }}
	return p
}

// shortDur writes a power-of-ten duration briefly: 1µs, 10µs, 100µs, 1ms.
func shortDur(d time.Duration) string {
	s := fmtDur(d)
	for _, z := range []string{".00", ".0"} {
		if i := strings.Index(s, z); i > 0 && (i+len(z) == len(s) || s[i+len(z)] < '0' || s[i+len(z)] > '9') {
			return s[:i] + s[i+len(z):]
		}
	}
	return s
}

// colours that stay apart on white and in grey.
var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
	color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
	color.RGBA{0x17, 0xbe, 0xcf, 0xff}, color.RGBA{0x7f, 0x7f, 0x7f, 0xff},
}

func colour(i int) color.Color { return palette[i%len(palette)] }

// addCDF draws the cumulative distribution of s, at most 400 points.
func addCDF(p *chart, s *measure.Samples, name string, i int, dashed bool) {
	if s == nil || s.Count() == 0 {
		return
	}
	v := s.Values()
	const n = 400
	pts := make(plotter.XYs, 0, n+1)
	for k := 0; k <= n; k++ {
		q := float64(k) / n
		d := measure.SortedPercentile(v, q)
		if d <= 0 {
			continue
		}
		pts = append(pts, plotter.XY{X: float64(d), Y: q})
	}
	addLine(p, pts, name, i, dashed)
}

func addLine(p *chart, pts plotter.XYs, name string, i int, dashed bool) {
	if len(pts) == 0 {
		return
	}
	l, sc, err := plotter.NewLinePoints(pts)
	if err != nil {
		return
	}
	l.Color = colour(i)
	l.Width = vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	sc.Color = colour(i)
	sc.Radius = vg.Points(2)
	sc.Shape = draw.CircleGlyph{}
	if len(pts) > 20 { // a distribution: no marks on every point
		p.Add(l)
		p.legend.Add(name, l)
		return
	}
	p.Add(l, sc)
	p.legend.Add(name, l, sc)
}

// powerTicks marks powers of ten (or of two) on a log axis, with minor ticks at 2
// and 5 times each power of ten.
type powerTicks struct {
	base2 bool
	label func(float64) string
}

func (t powerTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 {
		lo = math.SmallestNonzeroFloat64
	}
	var ticks []plot.Tick
	if t.base2 {
		for v := 1.0; v <= hi*1.0001; v *= 2 {
			if v >= lo*0.9999 {
				label := ""
				if e := math.Log2(v); int(e)%2 == 0 {
					label = t.label(v)
				}
				ticks = append(ticks, plot.Tick{Value: v, Label: label})
			}
		}
		return ticks
	}
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		base := math.Pow(10, e)
		for _, m := range []float64{1, 2, 5} {
			v := base * m
			if v < lo || v > hi {
				continue
			}
			label := ""
			if m == 1 {
				label = t.label(v)
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: label})
		}
	}
	labelled := 0
	for _, tk := range ticks {
		if tk.Label != "" {
			labelled++
		}
	}
	if labelled < 2 { // a narrow range: label every tick, and both ends
		for i := range ticks {
			ticks[i].Label = t.label(ticks[i].Value)
		}
		ticks = append(ticks, plot.Tick{Value: lo, Label: t.label(lo)}, plot.Tick{Value: hi, Label: t.label(hi)})
	}
	return ticks
}
