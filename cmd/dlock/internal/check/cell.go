package check

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/checker"
	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"github.com/dlockio/dlock/cmd/dlock/internal/check/timeline"
)

// Cell is one setup x fault x resource x fencing combination.
type Cell struct {
	Setup, Fault string
	// Resource is a name from Resources; "" is ResourceStore.
	Resource string
	Fenced   bool
}

// Name is a file-name-safe name of the cell.
func (c Cell) Name() string {
	mode := "unfenced"
	if c.Fenced {
		mode = "fenced"
	}
	if c.Resource != "" && c.Resource != ResourceStore {
		mode = c.Resource + "_" + mode
	}
	return c.Setup + "_" + c.Fault + "_" + mode
}

// Matrix lists the cells of dlock check --matrix, unfenced and fenced: every setup
// without faults, with its server fault, and with a holder paused right after its
// lease check; and on one Redis the client-side faults (a random pause, a
// partition, a clock jump), on PostgreSQL and MariaDB the clock jump.
func Matrix() []Cell {
	var pairs [][2]string
	for _, s := range Setups() {
		pairs = append(pairs, [2]string{s, FaultNone})
	}
	for _, f := range []string{FaultKill, FaultFailover, FaultLeader, FaultDrop, FaultPauseAfterCheck} {
		for _, s := range Setups() {
			if AppliesTo(s, f) {
				pairs = append(pairs, [2]string{s, f})
			}
		}
	}
	pairs = append(pairs, [2]string{"redis", FaultPause}, [2]string{"redis", FaultPartition},
		[2]string{"redis", FaultClock}, [2]string{"postgres", FaultClock}, [2]string{"mariadb", FaultClock})
	var cells []Cell
	for _, p := range pairs {
		for _, fenced := range []bool{false, true} {
			cells = append(cells, Cell{Setup: p[0], Fault: p[1], Fenced: fenced})
		}
	}
	return cells
}

// Outcome is a checked cell.
type Outcome struct {
	Cell     Cell
	Expect   Expectation
	Report   *checker.Report
	Verdict  string // see Verdict
	Files    []string
	Took     time.Duration
	RunError string // the run itself failed (a server would not start, ...)
}

// Verdicts.
const (
	VerdictAsExpected = "as expected"  // safe and expected safe, or violations where expected
	VerdictDetected   = "detected"     // an expected violation showed up
	VerdictNotSeen    = "not observed" // an expected violation did not show up in this run
	VerdictUnexpected = "UNEXPECTED"   // a violation where the backend promises safety
	VerdictFailed     = "RUN FAILED"
)

// Verdict compares a report with the expectation.
func Verdict(e Expectation, r *checker.Report) string {
	p1, p3 := r.P1.Count, r.P3.Count
	p4 := r.P4.Count > 0 || r.P4.Porcupine == checker.VerdictViolation
	switch {
	case e.TokenSafe && p4, e.LockSafe && p1 > 0, e.ResourceSafe && p3 > 0:
		return VerdictUnexpected
	case !e.LockSafe && p1 > 0, !e.ResourceSafe && p3 > 0, !e.TokenSafe && p4:
		return VerdictDetected
	case !e.LockSafe || !e.ResourceSafe:
		return VerdictNotSeen
	}
	return VerdictAsExpected
}

// RunCell runs one cell with cfg (Setup, Fault, Resource and Fenced are taken from cell),
// checks the history, and writes <dir>/<cell>.json (history and report) and
// <dir>/<cell>.html (the timeline) when dir is not empty.
func RunCell(ctx context.Context, cell Cell, cfg Config, dir string) Outcome {
	cfg.Setup, cfg.Fault, cfg.Resource, cfg.Fenced = cell.Setup, cell.Fault, cell.Resource, cell.Fenced
	o := Outcome{Cell: cell, Expect: Expect(cell.Setup, cell.Fault, cell.Fenced)}
	start := time.Now()
	h, err := Run(ctx, cfg)
	o.Took = time.Since(start)
	if h == nil {
		o.Verdict, o.RunError = VerdictFailed, err.Error()
		return o
	}
	if err != nil {
		o.RunError = err.Error() // the history is still checked
	}
	o.Report = checker.Check(h, checker.Options{})
	o.Verdict = Verdict(o.Expect, o.Report)
	if dir != "" {
		files, err := save(dir, cell, h, o.Report)
		o.Files = files
		if err != nil && o.RunError == "" {
			o.RunError = err.Error()
		}
	}
	return o
}

func save(dir string, cell Cell, h *history.History, r *checker.Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	jsonPath := filepath.Join(dir, cell.Name()+".json")
	htmlPath := filepath.Join(dir, cell.Name()+".html")
	if err := writeFile(jsonPath, func(w io.Writer) error {
		return writeJSON(w, struct {
			History *history.History `json:"history"`
			Report  *checker.Report  `json:"report"`
		}{h, r})
	}); err != nil {
		return nil, err
	}
	if err := writeFile(htmlPath, func(w io.Writer) error { return timeline.Render(w, h, r, timeline.Options{}) }); err != nil {
		return []string{jsonPath}, err
	}
	return []string{jsonPath, htmlPath}, nil
}

func writeFile(path string, f func(io.Writer) error) error {
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f(file); err != nil {
		file.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return file.Close()
}

// Row is the cell's line in a markdown table (see TableHeader).
func (o Outcome) Row() string {
	mode := "no"
	if o.Cell.Fenced {
		mode = "yes"
	}
	if o.Cell.Resource != "" && o.Cell.Resource != ResourceStore {
		mode += " (" + o.Cell.Resource + ")"
	}
	exp := "safe"
	switch {
	case !o.Expect.LockSafe:
		exp = "P1 > 0"
		if !o.Expect.TokenSafe {
			exp += ", P4 ≥ 0"
		}
		if o.Expect.ResourceSafe {
			exp += ", P3 = 0"
		}
	case !o.Expect.ResourceSafe:
		exp = "P3 > 0"
	case o.Expect.Why != "":
		exp = "P3 = 0 (fenced)"
	}
	if o.Report == nil {
		return fmt.Sprintf("| %s | %s | %s | %s | | | | | | | | | %s: %s |", o.Cell.Setup, o.Cell.Fault, mode, exp, o.Verdict, mdEscape(o.RunError))
	}
	r := o.Report
	p4 := fmt.Sprint(r.P4.Count)
	if r.P4.Porcupine != checker.VerdictOK {
		p4 += " (porcupine: " + r.P4.Porcupine + ")"
	}
	verdict := o.Verdict
	if o.RunError != "" {
		verdict += " (" + mdEscape(o.RunError) + ")"
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %d | %d | %d | %d | %s | %d | %s | %s | %s |",
		o.Cell.Setup, o.Cell.Fault, mode, exp, r.Summary.AcquiresOK, r.Summary.Faults,
		r.P1.Count, r.P3.Count, p4, r.LostReleases.Count,
		r.P5.MaxRecovery.Round(time.Millisecond), r.P5.LongestGap.Round(time.Millisecond), verdict)
}

// TableHeader is the header of the markdown table of Row.
const TableHeader = "| setup | fault | fenced | expected | acquisitions | faults | P1 | P3 | P4 | lost releases | heal→write (max) | longest gap | verdict |\n" +
	"|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"

func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	return strings.ReplaceAll(s, "\n", " ")
}
