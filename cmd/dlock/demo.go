package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlockio/dlock/cmd/dlock/internal/devserver"
)

func init() { register(newDemoCommand) }

type demoConfig struct {
	workers, rounds int
	ttl             time.Duration
}

func newDemoCommand(e *env) *cobra.Command {
	cfg := demoConfig{workers: 3, rounds: 3, ttl: 2 * time.Second}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Watch a lock and its fencing tokens at work, with nothing to install",
		Long: `demo starts an etcd server inside this process and a few worker processes (this
same program) that take turns holding one lock. Each holder writes a value to that
same etcd through dlock's etcd guard (fence/etcdfence): one etcd transaction that
compares the holder's fencing token with the resource's fence key, and puts the
value and the new fence only if the token is not older than the newest it has seen.

While one worker holds the lock, demo freezes it with SIGSTOP, as a long garbage
collection pause or an overloaded machine would, for longer than the lock's TTL.
Its lease expires, another worker gets the lock with a larger token and writes.
Then demo resumes the frozen worker, which still believes it holds the lock and
writes with its old token: etcd rejects the transaction, and the value keeps the
newer holder's write. That rejection is what fencing tokens are for; no timeout
can prevent the pause.

The log shows who held the lock when and with which token. demo exits 0 with a
one-line summary when the stale write was rejected. It takes a few seconds.`,
		Example: `  dlock demo
  go run ./cmd/dlock demo
  dlock demo --workers 4 --rounds 5`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.workers < 2 || cfg.workers > 9 {
				return usagef("--workers %d: give 2 to 9 workers", cfg.workers)
			}
			if cfg.rounds < 1 || cfg.rounds > 20 {
				return usagef("--rounds %d: give 1 to 20 rounds", cfg.rounds)
			}
			if cfg.ttl < time.Second || cfg.ttl > 30*time.Second || cfg.ttl%time.Second != 0 {
				return usagef("--ttl %v: give whole seconds from 1s to 30s (etcd leases count in seconds)", cfg.ttl)
			}
			return runDemo(cmd.Context(), e, cfg)
		},
	}
	cmd.Flags().IntVar(&cfg.workers, "workers", cfg.workers, "number of worker processes (2 to 9)")
	cmd.Flags().IntVar(&cfg.rounds, "rounds", cfg.rounds, "times each worker takes the lock (1 to 20)")
	cmd.Flags().DurationVar(&cfg.ttl, "ttl", cfg.ttl, "lock TTL, in whole seconds")
	return cmd
}

// demoEvent is one line of a worker (including the guard's decision on its write),
// or a worker's exit.
type demoEvent struct {
	worker int
	kind   string // acquired, accepted, rejected, releasing, lost, error; exit
	token  uint64
	newer  uint64 // rejected: the newer token the fence holds
	text   string
	at     time.Time
}

// demoLog prints the live log: seconds since the start, who, what.
type demoLog struct {
	w     io.Writer
	start time.Time
}

func (l *demoLog) printf(at time.Time, who, format string, a ...any) {
	fmt.Fprintf(l.w, "%6.2fs  %-9s %s\n", at.Sub(l.start).Seconds(), who, fmt.Sprintf(format, a...))
}

func workerName(i int) string { return "worker " + strconv.Itoa(i) }

type demoWorker struct {
	id    int
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

func (w *demoWorker) proceed() { _, _ = io.WriteString(w.stdin, "go\n") }

// runDemo runs the demonstration. It is one script (about 180 lines) on purpose: the
// demonstration's steps, in the order the user sees them.
func runDemo(ctx context.Context, e *env, cfg demoConfig) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	lg := &demoLog{w: e.stdout, start: time.Now()}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("demo: find this program to start workers: %w", err)
	}

	dir, err := os.MkdirTemp("", "dlock-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := devserver.Start(ctx, devserver.Config{Dir: dir, Name: "dlock-demo"})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer srv.Stop()

	events := make(chan demoEvent, 256)
	url := "etcd://" + srv.Endpoint() + "/dlock-demo"
	lg.printf(time.Now(), "demo", "etcd %s runs in this process on %s", version.Version, srv.Endpoint())
	lg.printf(time.Now(), "demo", "%d worker processes take turns on lock %q (TTL %v); each holder puts %q in that etcd", cfg.workers, "demo", cfg.ttl, demoValueKey)
	lg.printf(time.Now(), "demo", "through etcdfence: one transaction that compares its token with fence key %q", demoFenceKey)

	workers := make(map[int]*demoWorker)
	var readers sync.WaitGroup
	defer func() {
		for _, w := range workers {
			resumeProcess(w.cmd.Process)
			_ = w.cmd.Process.Kill()
		}
		readers.Wait()
	}()
	for i := 1; i <= cfg.workers; i++ {
		cmd := exec.Command(exe, "demo-worker", "--url", url, "--etcd", srv.Endpoint(),
			"--id", strconv.Itoa(i), "--rounds", strconv.Itoa(cfg.rounds), "--ttl", cfg.ttl.String())
		cmd.SysProcAttr = workerSysProcAttr()
		cmd.Stderr = e.stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("demo: start worker %d: %w", i, err)
		}
		workers[i] = &demoWorker{id: i, cmd: cmd, stdin: stdin}
		readers.Go(func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				kind, rest, _ := strings.Cut(sc.Text(), " ")
				ev := demoEvent{worker: i, kind: kind, text: rest, at: time.Now()}
				switch kind {
				case "acquired", "accepted":
					ev.token, _ = strconv.ParseUint(rest, 10, 64)
				case "rejected":
					tok, newer, _ := strings.Cut(rest, " ")
					ev.token, _ = strconv.ParseUint(tok, 10, 64)
					ev.newer, _ = strconv.ParseUint(newer, 10, 64)
				}
				events <- ev
			}
			err := cmd.Wait()
			text := "exit status 0"
			if err != nil {
				text = err.Error()
			}
			events <- demoEvent{worker: i, kind: "exit", text: text, at: time.Now()}
		})
	}

	var (
		grants, accepted, exited int
		first, last              uint64
		problems                 []string
		victim                   *demoWorker
		pausedToken              uint64
		pausedAt                 time.Time
		paused                   bool
		stale                    []string
	)
	pauseLimit := time.NewTimer(time.Hour)
	defer pauseLimit.Stop()
	for exited < cfg.workers {
		var ev demoEvent
		select {
		case ev = <-events:
		case <-pauseLimit.C:
			problems = append(problems, "nobody got the lock while the holder was frozen")
			lg.printf(time.Now(), "demo", "nobody got the lock in %v; resuming worker %d", time.Since(pausedAt).Round(time.Millisecond), victim.id)
			resumeProcess(victim.cmd.Process)
			victim.proceed()
			paused = false
			continue
		case <-ctx.Done():
			return fmt.Errorf("demo: %w", context.Cause(ctx))
		}
		who := workerName(ev.worker)
		w := workers[ev.worker]
		switch ev.kind {
		case "acquired":
			grants++
			if first == 0 {
				first = ev.token
			}
			note := ""
			if ev.token <= last {
				problems = append(problems, fmt.Sprintf("token %d after %d", ev.token, last))
				note = fmt.Sprintf(" NOT ABOVE %d", last)
			}
			if paused {
				note += fmt.Sprintf("  (worker %d is frozen; its lease expired on the server)", victim.id)
			}
			last = max(last, ev.token)
			lg.printf(ev.at, who, "acquired the lock    token %d%s", ev.token, note)
			if victim == nil && grants == 2 {
				victim, pausedToken, pausedAt, paused = w, ev.token, time.Now(), true
				if err := pauseProcess(w.cmd.Process); err != nil {
					return fmt.Errorf("demo: pause worker %d: %w", w.id, err)
				}
				lg.printf(time.Now(), "demo", "SIGSTOP %s while it holds token %d: frozen like a process in a long GC pause, it cannot renew its %v lease", who, ev.token, cfg.ttl)
				pauseLimit.Reset(5*cfg.ttl + 10*time.Second)
				continue
			}
			w.proceed()
		case "releasing":
			lg.printf(ev.at, who, "releases the lock")
		case "lost":
			lg.printf(ev.at, who, "learns its lease is lost: %s", ev.text)
		case "error":
			problems = append(problems, who+": "+ev.text)
			lg.printf(ev.at, who, "error: %s", ev.text)
		case "accepted":
			accepted++
			lg.printf(ev.at, who, "wrote the value      token %d (etcd committed it; the fence is now %d)", ev.token, ev.token)
			if paused && ev.token > pausedToken {
				paused = false
				pauseLimit.Stop()
				lg.printf(time.Now(), "demo", "SIGCONT worker %d after %v: it still believes it holds token %d, and writes", victim.id, time.Since(pausedAt).Round(100*time.Millisecond), pausedToken)
				resumeProcess(victim.cmd.Process)
				victim.proceed()
			}
		case "rejected":
			reason := fmt.Sprintf("token %d is older than %d", ev.token, ev.newer)
			stale = append(stale, fmt.Sprintf("%s, %s", who, reason))
			lg.printf(ev.at, who, "write REJECTED by etcd (etcdfence): %s; nothing was written", reason)
		case "exit":
			exited++
			delete(workers, ev.worker)
			if ev.text != "exit status 0" {
				problems = append(problems, who+": "+ev.text)
			}
		}
	}
	if len(stale) == 0 {
		problems = append(problems, "no stale write was rejected")
	}
	if value, err := demoValue(ctx, srv.Endpoint()); err != nil {
		problems = append(problems, "read the value back: "+err.Error())
	} else {
		lg.printf(time.Now(), "demo", "%s in etcd is %q: the last holder's write, not the stale one", demoValueKey, value)
		if !strings.HasSuffix(value, fmt.Sprintf("token %d", last)) {
			problems = append(problems, fmt.Sprintf("the value %q is not the write of token %d", value, last))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("demo failed: %s", strings.Join(problems, "; "))
	}
	fmt.Fprintf(e.stdout, "demo: ok in %.1fs: %d grants with rising tokens (%d to %d), %d writes accepted, %d stale write rejected (%s)\n",
		time.Since(lg.start).Seconds(), grants, first, last, accepted, len(stale), strings.Join(stale, "; "))
	return nil
}

// demoValue reads the protected value back from the demo's etcd.
func demoValue(ctx context.Context, endpoint string) (string, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return "", err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, demoValueKey)
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("%s is missing", demoValueKey)
	}
	return string(resp.Kvs[0].Value), nil
}
