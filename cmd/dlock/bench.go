package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/dlockio/dlock/cmd/dlock/internal/bench"
	"github.com/dlockio/dlock/driver"
)

func init() { register(newBenchCommand) }

// benchMemURL is the in-process backend that every run can measure.
const benchMemURL = "mem://dlock-bench"

// newBenchCommand builds `dlock bench`. It is long (about 230 lines) because it is the
// command's flags and their help, declared in one place as cobra commands are; the
// work is in package bench.
func newBenchCommand(e *env) *cobra.Command {
	var (
		backends     []string
		startServers bool
		servers      string
		duration     time.Duration
		workers      int
		keys         int
		rounds       int
		waiters      string
		pin          string
		jsonFile     string
		chartsDir    string
		quiet        bool
		peers        bool
	)
	cmd := &cobra.Command{
		Use:   "bench [--backend [NAME=]URL ...] [--start-servers]",
		Short: "Measure backends side by side: throughput, latency, fairness, cost per handoff",
		Long: `bench measures dlock backends side by side, in one run, with the same
workloads, and prints markdown tables (on stdout), optionally JSON and PNG charts.

For every backend, in interleaved rounds (round 1 runs every backend, then round 2,
... so that changes in machine load touch them all alike):

  cycle      one client doing Lock+Release on one key: cycles/s, p50, p99, paired
             cycle by cycle with the backend's floor (the least a correct lock does
             on that engine with its own client: SET NX PX and a compare-and-delete
             for Redis, create and delete for ZooKeeper, insert and delete for
             PostgreSQL and MySQL), and the ratio of the medians; with --peers,
             each peer of the store takes its cycles in the same loop, in turn;
  many keys  --workers clients over --keys keys, a random key per acquisition;
  hot key    --workers clients on one key: acquisitions/s, handoff latency (from a
             Release to the next holder's Lock returning), fairness (min/max
             acquisitions per worker, Jain's index);
  waiters    --waiters waiters queue behind a holder and the key passes down the
             chain: server operations (from the server's own counters where the
             backend has them) and driver calls per handoff, and handoffs/s.

--peers also measures the lock libraries users run on the same stores, beside
the backend of each store, in this process, on the same servers, through the same
loops and in the same rounds: go-redsync/redsync (one pool on Redis, one per master
on Redlock), bsm/redislock, etcd's concurrency.Mutex, go-zookeeper's Lock,
PostgreSQL's pg_advisory_lock and a row lock polled every 10 ms, and MySQL's
GET_LOCK and a row polled every 10 ms. They are shown as
peers, and every dlock backend gets its ratio to the best peer of its store next to
its fairness. Peers have no fencing and no server counts: the waiters workload is
not theirs.

A backend without a floor shows n/a for the ratios. Give backends with --backend
(repeatable; NAME=URL names one); --start-servers starts local servers itself
(redis-server, 5 Redis masters for redlock, an embedded etcd, and ZooKeeper,
PostgreSQL and MariaDB when their Debian packages are installed) on free 127.0.0.1 ports and
stops them at the end. Without either, it measures the in-process mem:// backend,
so the command always works. The in-process backend is measured whenever
--start-servers is given, as the reference for the core's own cost.

--duration is the measuring time of each timed workload on each backend, split over
the rounds: the default run with mem:// and one Redis takes about 18 seconds. Before
round 1, each backend and peer runs unrecorded cycles and a hot key for --duration (at
most 4s), so that servers are not measured cold (a ZooKeeper just started, whose JIT
has not compiled its request path yet, is a third slower for a while).

Why --pin: on a small virtual machine, a loopback round trip is two wake-ups, and
when the client and the server run on different CPUs each wake-up may cross CPUs
(an inter-processor interrupt, sometimes a halted virtual CPU to wake up). That
can cost more than the work itself and varies from run to run, which makes the
numbers noisy. --pin 0 puts this process and the servers it starts on CPU 0 (as
taskset -c 0 would): round trips become context switches on one CPU, slower on an
idle machine but far steadier. Servers you started yourself are not moved: pin
them with taskset. Compare ratios within one run, not across runs or machines.

Every load is bounded in time and count and stops by itself; keys are named
dlock-bench.<run id>.*, and every lock is released at the end.`,
		Example: `  dlock bench                                   # in-process backend only
  dlock bench --start-servers --pin 0           # every installed server, pinned
  dlock bench --backend redis://127.0.0.1:6379/0 --backend zk=zk://127.0.0.1:2181/dlock
  dlock bench --start-servers --servers redis,redlock --json out.json --charts img
  dlock bench --start-servers --peers --duration 20s   # beside redsync, etcd Mutex, ...`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := bench.Config{Duration: duration, Rounds: rounds, Workers: workers, Keys: keys, Peers: peers}
			var err error
			if cfg.Waiters, err = benchParseInts(waiters); err != nil {
				return usagef("--waiters %q: %v", waiters, err)
			}
			var kinds []string
			if servers != "" {
				if !startServers {
					return usagef("--servers needs --start-servers")
				}
				kinds = strings.Split(servers, ",")
				for _, k := range kinds {
					if !benchContains(bench.ServerKinds, k) {
						return usagef("--servers: unknown server %q (known: %s)", k, strings.Join(bench.ServerKinds, ", "))
					}
				}
			}
			var cpus []int
			if pin != "" {
				if cpus, err = bench.ParseCPUs(pin); err != nil {
					return usagef("--pin: %v", benchTrimInvalid(err))
				}
			}
			names := map[string]int{}
			add := func(t bench.Target) {
				if t.Name == "" {
					t.Name = strings.SplitN(t.URL, "://", 2)[0]
				}
				names[t.Name]++
				if n := names[t.Name]; n > 1 {
					t.Name += "-" + strconv.Itoa(n)
				}
				cfg.Targets = append(cfg.Targets, t)
			}
			if len(backends) == 0 || startServers {
				add(bench.Target{Name: "mem", URL: benchMemURL, Note: "in-process reference backend"})
			}
			for _, b := range backends {
				name, u := benchSplitNamed(b)
				if names[name] > 0 && name != "" {
					return usagef("--backend: two backends are named %q", name)
				}
				add(bench.Target{Name: name, URL: u})
			}
			if err := cfg.Validate(); err != nil {
				return usagef("%v", benchTrimInvalid(err))
			}

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			info := e.stderr
			if quiet {
				info = io.Discard
			}
			if cpus != nil {
				if err := bench.Pin(cpus); err != nil {
					if errors.Is(err, driver.ErrInvalid) {
						return usagef("--pin: %v", benchTrimInvalid(err))
					}
					return err
				}
				fmt.Fprintf(info, "dlock bench: pinned to CPU %s\n", bench.FormatCPUs(cpus))
			}
			if startServers {
				fmt.Fprintln(info, "dlock bench: starting servers...")
				srv, err := bench.StartServers(kinds)
				if err != nil {
					return err
				}
				defer srv.Stop()
				for _, k := range bench.ServerKinds {
					if why, ok := srv.Skipped[k]; ok {
						fmt.Fprintf(e.stderr, "dlock bench: %s not started: %s\n", k, oneLine(errors.New(why)))
					}
				}
				for _, t := range srv.Targets {
					add(t)
					fmt.Fprintf(info, "dlock bench: started %s (%s)\n", t.Name, t.Note)
				}
				if ctx.Err() != nil {
					return exitCodeError{130, errors.New("interrupted")}
				}
			}
			if len(cpus) > 0 {
				// The embedded etcd's threads, started just now, inherit the
				// affinity; pin again to be sure nothing escaped.
				_ = bench.Pin(cpus)
			}

			bar := benchProgress(e.stderr, quiet)
			if bar != nil {
				cfg.Progress = func(p bench.Progress) {
					bar.ChangeMax(p.Steps)
					desc := "connecting"
					switch {
					case p.Step == p.Steps:
						desc = "done"
					case p.Round > 0:
						desc = fmt.Sprintf("round %d/%d %s: %s", p.Round, cfg.Rounds, p.Target, p.Workload)
					case p.Workload == bench.WorkWarmUp:
						desc = "warming up " + p.Target
					default:
						desc = "connecting to " + p.Target
					}
					bar.Describe(fmt.Sprintf("%-36s", desc))
					_ = bar.Set(p.Step)
				}
			}
			res, err := bench.Run(ctx, cfg)
			if bar != nil {
				_ = bar.Finish()
				_ = bar.Clear()
				fmt.Fprint(e.stderr, "\r")
			}
			if err != nil {
				if ctx.Err() != nil {
					return exitCodeError{130, errors.New("interrupted")}
				}
				return err
			}
			if jsonFile == "-" {
				if err := res.WriteJSON(e.stdout); err != nil {
					return err
				}
			} else {
				if err := res.WriteMarkdown(e.stdout); err != nil {
					return err
				}
				if jsonFile != "" {
					if err := benchWriteFile(jsonFile, res.WriteJSON); err != nil {
						return err
					}
					fmt.Fprintf(info, "dlock bench: wrote %s\n", jsonFile)
				}
			}
			if chartsDir != "" {
				files, err := res.WriteCharts(chartsDir)
				if err != nil {
					return err
				}
				fmt.Fprintf(info, "dlock bench: wrote %s\n", strings.Join(files, ", "))
			}
			var failed []string
			for _, b := range res.Backends {
				if b.Error != "" {
					failed = append(failed, b.Name+": "+b.Error)
				}
			}
			if len(failed) > 0 {
				return fmt.Errorf("bench: %d backend(s) failed: %s", len(failed), strings.Join(failed, "; "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&backends, "backend", nil, "measure the backend at `[NAME=]URL` (repeatable), e.g. redis://127.0.0.1:6379/0")
	f.BoolVar(&startServers, "start-servers", false, "start local servers (redis, redlock, etcd, and zk, postgres, mariadb if installed) and measure them")
	f.StringVar(&servers, "servers", "", "with --start-servers, start only these (comma-separated `LIST` of "+strings.Join(bench.ServerKinds, ",")+")")
	f.DurationVar(&duration, "duration", bench.DefaultDuration, "measuring `TIME` of each workload on each backend, split over the rounds")
	f.IntVar(&workers, "workers", bench.DefaultWorkers, "clients (each its own connection) of the many-keys and hot-key workloads")
	f.IntVar(&keys, "keys", bench.DefaultKeys, "keys of the many-keys workload")
	f.IntVar(&rounds, "rounds", bench.DefaultRounds, "interleaved rounds")
	f.StringVar(&waiters, "waiters", benchJoinInts(bench.DefaultWaiters), "queue lengths of the cost-growth workload (comma-separated)")
	f.StringVar(&pin, "pin", "", "pin this process and the servers it starts to `CPUS` (taskset -c syntax: 0 or 0,1 or 0-3)")
	f.StringVar(&jsonFile, "json", "", "also write the results as JSON to `FILE` (- writes JSON instead of markdown on stdout)")
	f.StringVar(&chartsDir, "charts", "", "draw PNG charts into `DIR`")
	f.BoolVar(&peers, "peers", false, "also measure the peers (redsync, bsm/redislock, etcd Mutex, go-zookeeper Lock, pg_advisory_lock, a polled row lock) beside each backend of their store")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar and no messages on stderr except warnings")
	return cmd
}

// benchProgress returns a progress bar on w when w is a terminal and not quiet.
func benchProgress(w io.Writer, quiet bool) *progressbar.ProgressBar {
	f, ok := w.(*os.File)
	if quiet || !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return progressbar.NewOptions(1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionShowCount(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
}

// benchSplitNamed splits NAME=URL; a plain URL has no name. The name is what precedes the
// first '=' when that comes before "://".
func benchSplitNamed(s string) (name, u string) {
	i, j := strings.Index(s, "="), strings.Index(s, "://")
	if i > 0 && (j < 0 || i < j) {
		return s[:i], s[i+1:]
	}
	return "", s
}

func benchParseInts(s string) ([]int, error) {
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", part)
		}
		out = append(out, n)
	}
	return out, nil
}

func benchJoinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func benchContains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// benchTrimInvalid drops the "dlock: invalid argument: " prefix, redundant in a usage
// message.
func benchTrimInvalid(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, driver.ErrInvalid.Error()+": ")
	return strings.TrimPrefix(s, "bench: ")
}

// benchWriteFile writes a file through write, reporting the first error.
func benchWriteFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
