// Package runner runs a program while holding a lock: the engine of `dlock run`.
//
// The child gets DLOCK_KEY, DLOCK_TOKEN and DLOCK_HELD=1 in its environment, runs in
// its own process group, and receives the INT, TERM and HUP signals sent to the
// runner. If the lease is lost while the child runs, the whole group gets SIGTERM,
// then SIGKILL after the grace period. Exit codes follow sysexits(3) where they fit.
package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/dlockio/dlock"
)

// Exit codes of `dlock run` besides the child's own.
const (
	ExitUsage       = 64 // bad flags or arguments
	ExitUnavailable = 69 // backend unreachable or failing
	ExitNotAcquired = 75 // the lock was not acquired within --wait
	ExitLeaseLost   = 76 // the lease was lost while the child ran
	ExitNoCommand   = 127
)

// Forever waits without a time limit.
const Forever time.Duration = -1

// Config is one run.
type Config struct {
	Key     string
	Command []string // program and arguments
	// Wait is how long to wait for the lock: 0 tries once, Forever waits without
	// limit.
	Wait time.Duration
	// Grace is how long the child has to exit after SIGTERM before SIGKILL.
	Grace time.Duration
	// LockOptions are passed to Lock/TryLock (TTL, owner).
	LockOptions []dlock.Option
	// Stderr receives the runner's own messages (nil: os.Stderr); Quiet silences
	// all but errors.
	Stderr io.Writer
	Quiet  bool
	// Stdin, Stdout and Stderr of the child default to the runner's.
	ChildStdin          io.Reader
	ChildStdout         io.Writer
	ChildStderr         io.Writer
	forwardedSignalsFor func(chan<- os.Signal) // tests replace signal.Notify
}

func (cfg *Config) logf(format string, a ...any) {
	if !cfg.Quiet {
		fmt.Fprintf(cfg.Stderr, "dlock: "+format+"\n", a...)
	}
}

func (cfg *Config) errorf(format string, a ...any) {
	fmt.Fprintf(cfg.Stderr, "dlock: "+format+"\n", a...)
}

// Run acquires cfg.Key on c, runs the command while the lease is held, releases the
// lease, and returns the exit code for the runner's process: the child's own status
// when it ran to the end holding the lease, or one of the Exit constants. ctx ends the
// wait for the lock (Ctrl-C while waiting); once the child runs, signals are forwarded
// to it instead.
func Run(ctx context.Context, c *dlock.Client, cfg Config) int {
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if len(cfg.Command) == 0 {
		cfg.errorf("no command to run")
		return ExitUsage
	}
	sigs := make(chan os.Signal, 4)
	if cfg.forwardedSignalsFor != nil {
		cfg.forwardedSignalsFor(sigs)
	} else {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(sigs)
	}

	// While waiting for the lock, a signal abandons the wait; the waiter withdraws
	// before Lock returns, so nothing is left behind.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lease *dlock.Lease
	var err error
	acquired := make(chan struct{})
	go func() {
		defer close(acquired)
		switch {
		case cfg.Wait == 0:
			lease, err = c.TryLock(wctx, cfg.Key, cfg.LockOptions...)
		case cfg.Wait > 0:
			tctx, tcancel := context.WithTimeout(wctx, cfg.Wait)
			defer tcancel()
			lease, err = c.Lock(tctx, cfg.Key, cfg.LockOptions...)
		default:
			lease, err = c.Lock(wctx, cfg.Key, cfg.LockOptions...)
		}
	}()
	var interrupted os.Signal
	select {
	case <-acquired:
	case interrupted = <-sigs:
		cancel()
		<-acquired
	}
	if err != nil {
		switch {
		case interrupted != nil:
			cfg.errorf("interrupted by %v while waiting for %q", interrupted, cfg.Key)
			return 128 + signum(interrupted)
		case errors.Is(err, dlock.ErrLocked):
			if cfg.Wait == 0 {
				cfg.errorf("%q is held by another owner", cfg.Key)
			} else {
				cfg.errorf("%q still held by another owner after %v", cfg.Key, cfg.Wait)
			}
			return ExitNotAcquired
		case errors.Is(err, dlock.ErrInvalid):
			cfg.errorf("%v", err)
			return ExitUsage
		default:
			cfg.errorf("cannot acquire %q: %v", cfg.Key, err)
			return ExitUnavailable
		}
	}
	if interrupted != nil { // the signal raced with a successful acquire
		releaseBounded(lease)
		cfg.errorf("interrupted by %v", interrupted)
		return 128 + signum(interrupted)
	}
	cfg.logf("acquired %q (token %d); running %s", cfg.Key, lease.Token(), cfg.Command[0])
	code := runChild(lease, cfg, sigs)
	if rerr := releaseBounded(lease); rerr != nil && code != ExitLeaseLost {
		if errors.Is(rerr, dlock.ErrLeaseLost) {
			cfg.errorf("the lease on %q was lost before the command finished: %v", cfg.Key, rerr)
			return ExitLeaseLost
		}
		cfg.errorf("release %q: %v (it expires after its TTL)", cfg.Key, rerr)
	}
	return code
}

func releaseBounded(l *dlock.Lease) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return l.Release(ctx)
}

func runChild(lease *dlock.Lease, cfg Config, sigs <-chan os.Signal) int {
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Env = append(os.Environ(),
		"DLOCK_KEY="+cfg.Key,
		"DLOCK_TOKEN="+strconv.FormatUint(uint64(lease.Token()), 10),
		"DLOCK_HELD=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = cfg.ChildStdin, cfg.ChildStdout, cfg.ChildStderr
	if cmd.Stdin == nil {
		cmd.Stdin = os.Stdin
	}
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		cfg.errorf("cannot start %s: %v", cfg.Command[0], err)
		return ExitNoCommand
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	pgid := cmd.Process.Pid

	lost := false
	done := lease.Done()
	var killTimer <-chan time.Time
	for {
		select {
		case err := <-exited:
			if lost {
				return ExitLeaseLost
			}
			return exitCode(err)
		case s := <-sigs:
			_ = syscall.Kill(cmd.Process.Pid, s.(syscall.Signal))
		case <-done:
			done = nil
			lost = true
			cfg.errorf("lease on %q lost (%v); stopping the command (SIGTERM, SIGKILL after %v)", cfg.Key, lease.Err(), cfg.Grace)
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			killTimer = time.After(cfg.Grace)
		case <-killTimer:
			cfg.errorf("command still running %v after SIGTERM; sending SIGKILL", cfg.Grace)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			killTimer = nil
		}
	}
}

// exitCode turns the child's end into the runner's exit status, with the shell's
// 128+signal convention.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return ExitUnavailable
}

func signum(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 1
}
