package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock/cmd/dlock/internal/check"
)

func init() {
	register(newCheckCommand)
	register(newCheckWorkerCommand)
}

type checkFlags struct {
	setups, faults []string
	resources      []string
	fencing        string
	matrix         bool
	safeOnly       bool
	list           bool
	out            string
	doc            string
	cfg            check.Config
}

// newCheckCommand builds `dlock check`. It is long (about 110 lines) because it is the
// command's flags and their help, declared in one place; the work is in package check.
func newCheckCommand(e *env) *cobra.Command {
	f := checkFlags{fencing: "both", out: "dlock-check-results", resources: []string{check.ResourceStore}}
	f.cfg = check.Config{Workers: 5, Keys: 2, Duration: 10 * time.Second, TTL: time.Second}
	cmd := &cobra.Command{
		Use:   "check [--setup NAME ...] [--fault NAME ...] | --matrix",
		Short: "Inject faults into real servers and check lock and resource safety",
		Long: `check runs a fault-injection safety check in the spirit of Jepsen, with real
servers started on free 127.0.0.1 ports (as the tests start them) and real worker
processes (this same program).

--workers processes contend for --keys keys. Each holder writes to the --resource
with its fencing token, and releases. With --election each key is an election
instead: the workers campaign for it (Campaign, publishing their id as the value),
write as leader with their epoch as the token, and resign; the properties below
are then those of leaders (P1: two leaders at once; P4: epochs out of order). With
--limit N each key is a semaphore of N permits: P1 then counts a grant made while
N others were certainly held, and P3 and P4 do not apply (the holders overlap by
design, and permits granted together are learnt of in any order).
With --rw each key is a read-write lock: three acquisitions in four are readers, who
hold together and write nothing; P1 counts a writer granted beside anyone and a
reader beside a writer, and P4 checks a reader's token against earlier writers'
only (use it with faults that do not pause a holder):

  store     (default) a fenced store run by the checker: with fencing it accepts a
            write only if its token is at least the highest it has accepted for
            the key; without it, it accepts everything and logs what fencing would
            have refused.
  postgres, redis, etcd
            a real server of that kind, started for the run (no fault touches it).
            With fencing every write goes through dlock's guard for that store
            (fence/pgfence, fence/redisfence, fence/etcdfence); without it, the
            same write without the token check. Each write appends (worker, lease,
            token, key) to a log inside the same transaction, script or etcd txn;
            after the run the checker reads that log back in commit order, and P3
            counts what the resource itself committed.

Every operation is recorded with start and end times on CLOCK_MONOTONIC,
which all processes on the machine share. Every --interval (jittered) the fault is
injected and healed; after a leader kill the countdown to the next injection starts
once every worker wrote again (at most 10 TTL, 10s or more), so a slow election is
not hit again before it is over.

The history is then checked:
  P1  lease safety: a grant while an earlier grant of the key could not yet have
      expired and was not released (judged from the recorded times only: a
      violation is reported only when it is certain);
  P3  resource safety: the store (or the real resource, by its own log) accepted
      a write with a token lower than one it had already accepted (0 whenever
      fencing is on);
  P4  token order: a grant that ended before another began has the smaller token
      (a sweep, and porcupine's linearizability check);
  P5  liveness: time from each heal to the next accepted write, longest gap;
  lost releases: acquires that failed while no lease of the key could be live.

Each run prints a row of the summary table and writes, under --out, the JSON history
with the report and an HTML timeline (open it in a browser: who held which key when,
rejected writes, violations in red). The verdict compares the counts with what the
backend promises: "UNEXPECTED" (exit status 1) is a violation where the setup
promises safety; "detected" is a violation the setup is known to allow; "not
observed" is a known-unsafe cell whose violation did not show up in this run.

--matrix runs every setup with every fault that applies to it, unfenced and
fenced (64 cells), and writes the table to --doc (docs/safety.md in the
repository); with --duration 8s a cell takes about 12 seconds.

--acquisitions and --injections give each cell a target instead of a fixed length:
it runs until its workers made that many grants and that many injections of its
fault healed, --duration at most. The safety targets (10^5 acquisitions and 50
injections in every cell whose setup promises safety) are checked by

  dlock check --matrix --safe-only --fencing both --acquisitions 100000 --injections 50 \
    --duration 15m --workers 12 --keys 16 --hold 1ms --interval 2s --doc docs/safety-full.md

(about two hours on two CPUs; --fencing off alone takes half that and is the
stronger test for a safe cell: the store counts every stale write instead of
refusing it).

Setups need their servers installed (redis-server; zookeeper, postgresql and
mariadb-server Debian packages; etcd is embedded); so do resources. "dlock check --list" lists
setups, faults and resources.`,
		Example: `  dlock check --setup redis --fault kill
  dlock check --setup redis --fault pause-after-check --fencing off --duration 20s
  dlock check --setup etcd --fault leader --ttl 2s
  dlock check --setup redis --fault pause-after-check --resource postgres --resource etcd
  dlock check --matrix --duration 20s --doc docs/safety.md`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.list {
				printCheckList(e)
				return nil
			}
			cells, err := f.cells()
			if err != nil {
				return err
			}
			return runCheck(cmd.Context(), e, f, cells)
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&f.setups, "setup", nil, "backend setup `NAME` (repeatable; see --list)")
	fl.StringSliceVar(&f.faults, "fault", nil, "fault `NAME` (repeatable; see --list; default none)")
	fl.StringSliceVar(&f.resources, "resource", f.resources, "what the workers write to: store, postgres, redis or etcd (repeatable; see --list)")
	fl.StringVar(&f.fencing, "fencing", f.fencing, "on, off or both: whether writes are fenced (the store checks tokens; a real resource's guard does)")
	fl.IntVar(&f.cfg.Limit, "limit", 0, "the semaphore workload: each key admits `N` holders (P1 counts more than N; P3 does not apply)")
	fl.BoolVar(&f.cfg.RW, "rw", false, "the read-write workload: 3 in 4 acquisitions are readers (hold together, do not write), the rest writers")
	fl.BoolVar(&f.cfg.Election, "election", false, "the election workload: workers campaign, write as leader, and resign")
	fl.BoolVar(&f.matrix, "matrix", false, "run every setup x fault x fencing cell and write --doc")
	fl.BoolVar(&f.list, "list", false, "list setups, faults and resources, then exit")
	fl.StringVar(&f.out, "out", f.out, "`DIR` for the JSON histories and HTML timelines (\"\" for none)")
	fl.StringVar(&f.doc, "doc", "", "with --matrix, write the markdown report to `FILE` (e.g. docs/safety.md)")
	fl.IntVar(&f.cfg.Workers, "workers", f.cfg.Workers, "worker processes (1 to 64)")
	fl.IntVar(&f.cfg.Keys, "keys", f.cfg.Keys, "keys the workers contend for")
	fl.DurationVar(&f.cfg.Duration, "duration", f.cfg.Duration, "how long each cell's workload runs (with --acquisitions or --injections: at most)")
	fl.IntVar(&f.cfg.Acquisitions, "acquisitions", 0, "run each cell until its workers made at least `N` grants (and --injections), --duration at most")
	fl.IntVar(&f.cfg.Injections, "injections", 0, "run each cell until at least `N` injections of its fault healed (and --acquisitions), --duration at most")
	fl.BoolVar(&f.safeOnly, "safe-only", false, "with --matrix, only the cells whose setup promises safety under the fault")
	fl.DurationVar(&f.cfg.TTL, "ttl", f.cfg.TTL, "lock TTL (etcd rounds up to whole seconds)")
	fl.DurationVar(&f.cfg.Hold, "hold", 0, "time a worker holds each lease (default TTL/10)")
	fl.DurationVar(&f.cfg.Interval, "interval", 0, "time between fault injections, jittered (default 3 TTL)")
	fl.Int64Var(&f.cfg.Seed, "seed", 0, "random seed (default: from the clock; printed)")
	return cmd
}

func (f *checkFlags) cells() ([]check.Cell, error) {
	var modes []bool
	switch f.fencing {
	case "on":
		modes = []bool{true}
	case "off":
		modes = []bool{false}
	case "both":
		modes = []bool{false, true}
	default:
		return nil, usagef("--fencing %q: give on, off or both", f.fencing)
	}
	for _, r := range f.resources {
		if check.ResourceDoc(r) == "" {
			return nil, usagef("--resource %q: give one of %s", r, strings.Join(check.Resources(), ", "))
		}
	}
	if f.matrix {
		if len(f.setups) > 0 || len(f.faults) > 0 {
			return nil, usagef("--matrix runs every setup and fault; do not give --setup or --fault with it")
		}
		var cells []check.Cell
		for _, c := range check.Matrix() {
			if f.safeOnly && check.Expected(c.Setup, c.Fault, c.Fenced) != "safe" {
				continue
			}
			for _, r := range f.resources {
				for _, m := range modes {
					if c.Fenced == m {
						c.Resource = r
						cells = append(cells, c)
					}
				}
			}
		}
		return cells, nil
	}
	if f.doc != "" {
		return nil, usagef("--doc goes with --matrix")
	}
	if f.safeOnly {
		return nil, usagef("--safe-only goes with --matrix")
	}
	if len(f.setups) == 0 {
		return nil, usagef("give --setup (one of %s), or --matrix", strings.Join(check.Setups(), ", "))
	}
	faults := f.faults
	if len(faults) == 0 {
		faults = []string{check.FaultNone}
	}
	var cells []check.Cell
	for _, s := range f.setups {
		for _, fault := range faults {
			if !check.AppliesTo(s, fault) {
				return nil, usagef("setup %q with fault %q: %v", s, fault, f.validate(s, fault))
			}
			for _, r := range f.resources {
				for _, m := range modes {
					cells = append(cells, check.Cell{Setup: s, Fault: fault, Resource: r, Fenced: m})
				}
			}
		}
	}
	return cells, nil
}

// validate explains why a setup and a fault do not go together.
func (f *checkFlags) validate(setup, fault string) error {
	c := f.cfg
	c.Setup, c.Fault, c.Worker = setup, fault, []string{"worker"}
	if c.Hold == 0 {
		c.Hold = c.TTL / 10
	}
	if c.Interval == 0 {
		c.Interval = 3 * c.TTL
	}
	return c.Validate()
}

func printCheckList(e *env) {
	fmt.Fprintln(e.stdout, "setups:")
	for _, s := range check.Setups() {
		fmt.Fprintf(e.stdout, "  %-16s %s\n", s, check.SetupDoc(s))
	}
	fmt.Fprintln(e.stdout, "faults:")
	for _, f := range check.Faults() {
		fmt.Fprintf(e.stdout, "  %-18s %s\n", f, check.FaultDoc(f))
	}
	fmt.Fprintln(e.stdout, "resources (--resource; fenced or not with --fencing):")
	for _, r := range check.Resources() {
		fmt.Fprintf(e.stdout, "  %-10s %s\n", r, check.ResourceDoc(r))
	}
}

func runCheck(ctx context.Context, e *env, f checkFlags, cells []check.Cell) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg := f.cfg
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	cfg.Worker = []string{exe, "check-worker"}
	// Validate once with the first cell, so that bad numbers are a usage error.
	if err := f.validate(cells[0].Setup, cells[0].Fault); err != nil {
		return usagef("%v", err)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	each := fmt.Sprintf("%v each", cfg.Duration)
	if cfg.Acquisitions > 0 || cfg.Injections > 0 {
		each = fmt.Sprintf("each until %d acquisitions and %d injections, %v at most", cfg.Acquisitions, cfg.Injections, cfg.Duration)
	}
	fmt.Fprintf(e.stderr, "dlock check: %d cell(s), %s, seed %d; results in %s\n", len(cells), each, cfg.Seed, f.out)
	var outcomes []check.Outcome
	fmt.Fprintln(e.stdout, check.TableHeader)
	bad := 0
	for _, c := range cells {
		if ctx.Err() != nil {
			break
		}
		o := check.RunCell(ctx, c, cfg, f.out)
		outcomes = append(outcomes, o)
		fmt.Fprintln(e.stdout, o.Row())
		if o.Verdict == check.VerdictUnexpected || o.Verdict == check.VerdictFailed {
			bad++
		}
	}
	if f.doc != "" {
		if err := writeSafetyDoc(f.doc, matrixCommand(f, cfg), outcomes); err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "dlock check: wrote %s\n", f.doc)
	}
	if ctx.Err() != nil {
		return exitCodeError{code: 130, err: fmt.Errorf("interrupted")}
	}
	if bad > 0 {
		return fmt.Errorf("%d cell(s) failed or showed a violation where the setup promises safety", bad)
	}
	return nil
}

// matrixCommand is the dlock check command line that repeats a matrix run.
func matrixCommand(f checkFlags, cfg check.Config) string {
	c := fmt.Sprintf("dlock check --matrix --duration %v --ttl %v --workers %d --keys %d", cfg.Duration, cfg.TTL, cfg.Workers, cfg.Keys)
	if cfg.Hold != 0 {
		c += fmt.Sprintf(" --hold %v", cfg.Hold)
	}
	if cfg.Interval != 0 {
		c += fmt.Sprintf(" --interval %v", cfg.Interval)
	}
	if cfg.Acquisitions > 0 {
		c += fmt.Sprintf(" --acquisitions %d", cfg.Acquisitions)
	}
	if cfg.Injections > 0 {
		c += fmt.Sprintf(" --injections %d", cfg.Injections)
	}
	if f.safeOnly {
		c += " --safe-only"
	}
	if f.fencing != "both" {
		c += " --fencing " + f.fencing
	}
	for _, r := range f.resources {
		if r != check.ResourceStore || len(f.resources) > 1 {
			c += " --resource " + r
		}
	}
	return c + fmt.Sprintf(" --seed %d", cfg.Seed)
}

func writeSafetyDoc(path, command string, outcomes []check.Outcome) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Safety matrix\n\nGenerated by `%s` on %s.\n\n", command, time.Now().UTC().Format("2006-01-02"))
	b.WriteString(safetyDocIntro)
	b.WriteString(check.TableHeader + "\n")
	for _, o := range outcomes {
		b.WriteString(o.Row() + "\n")
	}
	seen := map[string]bool{}
	for _, o := range outcomes {
		if o.Expect.Why != "" && !seen[o.Cell.Setup+o.Cell.Fault] {
			if len(seen) == 0 {
				b.WriteString("\n## Why each unsafe cell is unsafe\n\n")
			}
			seen[o.Cell.Setup+o.Cell.Fault] = true
			fmt.Fprintf(&b, "- **%s, %s**: %s.\n", o.Cell.Setup, o.Cell.Fault, o.Expect.Why)
		}
	}
	b.WriteString("\n## Setups and faults\n\n")
	for _, s := range check.Setups() {
		fmt.Fprintf(&b, "- setup `%s`: %s\n", s, check.SetupDoc(s))
	}
	for _, f := range check.Faults() {
		fmt.Fprintf(&b, "- fault `%s`: %s\n", f, check.FaultDoc(f))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

const safetyDocIntro = `Each row is one run: worker processes contend for the keys through real servers,
write to a fenced store with their tokens, and one fault is injected again and
again. *expected* is what the backend promises for that fault (see below); the
counts are what the checker found in the recorded history:

- **P1** lease safety: grants made while an earlier grant of the key certainly had
  not expired and was not being released;
- **P3** resource safety: stale writes the store accepted (always 0 when fenced: the
  store refuses them, and the rejected writes are in the JSON history);
- **P4** token order violations (sweep count; porcupine's verdict if it is not ok);
- **lost releases**: acquires that failed while no lease of the key could be live;
- **heal→write**: the longest time from a fault's healing to the next accepted
  write; **longest gap**: the longest time without an accepted write.

*verdict*: "as expected" or "detected" (a violation the setup is known to allow
showed up) are good; "not observed" is a known-unsafe cell whose violation did not
happen in this run; "UNEXPECTED" would be a bug.

`

func newCheckWorkerCommand(e *env) *cobra.Command {
	return &cobra.Command{
		Use:                "check-worker",
		Short:              "One worker process of dlock check (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := check.ParseWorkerArgs(args)
			if err != nil {
				return usagef("check-worker: %v", err)
			}
			return check.RunWorker(cmd.Context(), cfg, e.stdin, e.stdout)
		},
	}
}
