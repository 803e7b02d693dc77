// Package runner runs a program while holding a lock: the engine of `dlock run`.
//
// The child gets DLOCK_KEY, DLOCK_TOKEN and DLOCK_HELD=1 in its environment, and not
// the backend's password (DLOCK_PASSWORD, or a DLOCK_URL that holds one, are removed).
// On Unix it runs in its own process group, and everything the runner does to it, it
// does to the whole group: the INT, TERM and HUP signals sent to the runner are
// forwarded to the group; if the lease is lost the group gets SIGTERM, then SIGKILL
// after the grace period. When the child exits, processes it left in its group get
// SIGTERM, then SIGKILL after the grace period, and the lease is released only once
// no process of the group remains: a straggler never runs beside the next holder.
// If the group cannot be confirmed gone, the lease is not released; the caller lets
// it expire after its TTL (see Result.Abandoned).
//
// If the runner itself dies without cleaning up (kill -9, the OOM killer), a
// watchdog process kills the child's group: see MaybeRunWatchdog. What remains
// unprotected: processes that leave the group (setsid, setpgid, daemons), and, if the
// runner dies in the instant between starting the child and handing its group to the
// watchdog, the child's descendants (on Linux the child itself still dies, by its
// parent-death signal). On Windows a job object takes the place of the group and
// of the watchdog (see group_windows.go). On other systems the child is a single
// process: signals reach it alone and nothing stops it if the runner is killed.
//
// Exit codes follow sysexits(3) and the shell where they fit.
package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/cmd/dlock/internal/errline"
)

// Exit codes of `dlock run` besides the child's own.
const (
	ExitUsage       = 64  // bad flags or arguments
	ExitUnavailable = 69  // backend unreachable or failing
	ExitNotAcquired = 75  // the lock was not acquired within --wait
	ExitNoPerm      = 77  // the backend refused the credentials or a permission
	ExitLeaseLost   = 76  // the lease was lost while the child ran
	ExitCannotRun   = 126 // the command exists but could not be executed
	ExitNoCommand   = 127 // the command was not found
)

// Forever waits without a time limit.
const Forever time.Duration = -1

// killWait bounds the wait for the group to vanish after SIGKILL; a process in an
// uninterruptible sleep can outlast it.
const killWait = 10 * time.Second

// pollInterval is how often the runner looks whether processes the child left in its
// group are gone.
const pollInterval = 20 * time.Millisecond

// Config is one run.
type Config struct {
	// Key is the lock to hold; Keys, when it has more than one key, are held
	// together instead, all or nothing (dlock.Client.LockAll).
	Key     string
	Keys    []string
	Command []string // program and arguments
	// Wait is how long to wait for the lock: 0 tries once, Forever waits without
	// limit.
	Wait time.Duration
	// Grace is how long the child's process group has to exit after SIGTERM before
	// SIGKILL.
	Grace time.Duration
	// LockOptions are passed to Lock/TryLock (TTL, owner).
	LockOptions []dlock.Option
	// Env is what the child's environment is made from (nil: the runner's own). The
	// backend's password is removed from it (see childEnv).
	Env []string
	// Stderr receives the runner's own messages (nil: os.Stderr); Quiet silences
	// all but errors.
	Stderr io.Writer
	Quiet  bool
	// Stdin, Stdout and Stderr of the child default to the runner's.
	ChildStdin          io.Reader
	ChildStdout         io.Writer
	ChildStderr         io.Writer
	forwardedSignalsFor func(chan<- os.Signal) // tests replace signal.Notify

	status                   *status       // the waiting line, nil when off
	statusFirst, statusEvery time.Duration // tests shorten them
}

// Result is the end of a run.
type Result struct {
	// Code is the exit status for the runner's process: the child's own when it ran
	// to the end holding the lease, or one of the Exit constants.
	Code int
	// Abandoned reports that processes of the child's group could not be confirmed
	// gone, so the lease was neither released nor lost. The caller must then end
	// its process without closing the client (Close would release the lease): the
	// lock expires after its TTL.
	Abandoned bool
}

func (cfg *Config) logf(format string, a ...any) {
	if !cfg.Quiet {
		cfg.errorf(format, a...)
	}
}

// errorf prints one message: always one line that starts "dlock: " once, whatever
// the errors in it hold (see errline).
func (cfg *Config) errorf(format string, a ...any) {
	cfg.status.clear()
	fmt.Fprintln(cfg.Stderr, errline.Message(fmt.Sprintf(format, a...)))
}

// errText is err's message as one line without the "dlock: " that the library's
// errors start with, for messages that carry the prefix already.
func errText(err error) string { return errline.Line(err.Error()) }

// lossCause is why a lease was lost, without the "lease lost" that the message
// around it says already.
func lossCause(err error) string {
	t := errText(err)
	if c, ok := strings.CutPrefix(t, errText(dlock.ErrLeaseLost)+": "); ok {
		return c
	}
	return t
}

// Run acquires cfg.Key on c, runs the command while the lease is held, releases the
// lease once no process of the command's group remains, and returns the exit code
// for the runner's process. ctx ends the wait for the lock (Ctrl-C while waiting);
// once the child runs, signals are forwarded to its group instead.
//
// It is one function (about 110 lines) because each step's teardown is a defer right
// after it, in the order the steps start (signals, status line, lock, child).
func Run(ctx context.Context, c *dlock.Client, cfg Config) Result {
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if len(cfg.Command) == 0 {
		cfg.errorf("no command to run")
		return Result{Code: ExitUsage}
	}
	keys := []string{cfg.Key}
	if len(cfg.Keys) > 0 {
		// In the order the lock takes them, each once, as MultiLease.Keys says.
		keys = slices.Compact(slices.Sorted(slices.Values(cfg.Keys)))
	}
	name := fmt.Sprintf("%q", keys[0]) // how messages name what the run locks
	if len(keys) > 1 {
		name = fmt.Sprintf("the %d keys %s", len(keys), quoteAll(keys))
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
	in := c // the status line and "held by" messages ask it who holds the key
	stopStatus := func() {}
	if cfg.Wait != 0 && !cfg.Quiet {
		cfg.status = newStatus(cfg.Stderr)
		cfg.LockOptions = append(cfg.LockOptions[:len(cfg.LockOptions):len(cfg.LockOptions)], dlock.WithQueueReport(cfg.status.queued))
		if cfg.statusFirst == 0 {
			cfg.statusFirst, cfg.statusEvery = statusFirst, statusEvery
		}
		sctx, stop := context.WithCancel(wctx)
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			cfg.status.watch(sctx, in, keys, cfg.statusFirst, cfg.statusEvery)
		}()
		stopStatus = func() { stop(); <-stopped; cfg.status.clear() }
	}
	var lease holding
	var err error
	acquired := make(chan struct{})
	go func() {
		defer close(acquired)
		lctx := wctx
		if cfg.Wait > 0 {
			var tcancel context.CancelFunc
			lctx, tcancel = context.WithTimeout(wctx, cfg.Wait)
			defer tcancel()
		}
		lease, err = acquire(lctx, c, keys, cfg.Wait != 0, cfg.LockOptions)
	}()
	var interrupted os.Signal
	select {
	case <-acquired:
	case interrupted = <-sigs:
		cancel()
		<-acquired
	}
	stopStatus()
	if err != nil {
		switch {
		case interrupted != nil:
			cfg.errorf("interrupted by %v while waiting for %s", interrupted, name)
			return Result{Code: 128 + signum(interrupted)}
		case errors.Is(err, dlock.ErrLocked):
			// "Another owner" includes this --owner id in another run or Client.
			who := "another owner"
			key, h := heldKey(in, keys)
			if h != "" {
				who += " " + h
			}
			if cfg.Wait == 0 {
				cfg.errorf("%q is held by %s", key, who)
			} else {
				cfg.errorf("%q still held by %s after %v", key, who, cfg.Wait)
			}
			return Result{Code: ExitNotAcquired}
		case errors.Is(err, dlock.ErrValidityTooShort):
			cfg.errorf("cannot use a grant of %s: %s (raise --ttl)", name, errText(err))
			return Result{Code: ExitNotAcquired}
		case errors.Is(err, dlock.ErrAuth):
			cfg.errorf("backend refused access: %s", errText(err))
			return Result{Code: ExitNoPerm}
		case errors.Is(err, dlock.ErrInvalid):
			cfg.errorf("%s", errText(err))
			return Result{Code: ExitUsage}
		default:
			cfg.errorf("cannot acquire %s: %s", name, errText(err))
			return Result{Code: ExitUnavailable}
		}
	}
	if interrupted != nil { // the signal raced with a successful acquire
		_ = releaseBounded(lease)
		cfg.errorf("interrupted by %v", interrupted)
		return Result{Code: 128 + signum(interrupted)}
	}
	tokens := lease.tokens()
	got := make([]string, len(keys))
	for i, k := range keys {
		got[i] = fmt.Sprintf("%q (token %d)", k, tokens[i])
	}
	cfg.logf("acquired %s; running %s", strings.Join(got, ", "), cfg.Command[0])
	code, gone := runChild(lease, keys, name, cfg, sigs)
	if !gone {
		cfg.errorf("not releasing %s: processes of the command's group may still run; the lock expires after its TTL", name)
		return Result{Code: code, Abandoned: true}
	}
	if rerr := releaseBounded(lease); rerr != nil && code != ExitLeaseLost {
		if errors.Is(rerr, dlock.ErrLeaseLost) {
			cfg.errorf("the lease on %s was lost before the command finished: %s", name, lossCause(rerr))
			return Result{Code: ExitLeaseLost}
		}
		cfg.errorf("%s (the lock expires after its TTL)", errText(rerr))
	}
	return Result{Code: code}
}

// holding is what the run holds: a *dlock.Lease, or a *dlock.MultiLease for several
// keys.
type holding interface {
	Done() <-chan struct{}
	Err() error
	Release(ctx context.Context) error
	tokens() []dlock.Token // in key order
}

type single struct{ *dlock.Lease }

func (l single) tokens() []dlock.Token { return []dlock.Token{l.Token()} }

type multi struct{ *dlock.MultiLease }

func (m multi) tokens() []dlock.Token { return m.Tokens() }

// acquire takes keys (one, or a set held all or nothing), waiting if wait is set.
func acquire(ctx context.Context, c *dlock.Client, keys []string, wait bool, opts []dlock.Option) (holding, error) {
	if len(keys) == 1 {
		lock := c.TryLock
		if wait {
			lock = c.Lock
		}
		l, err := lock(ctx, keys[0], opts...)
		if err != nil {
			return nil, err
		}
		return single{l}, nil
	}
	lock := c.TryLockAll
	if wait {
		lock = c.LockAll
	}
	m, err := lock(ctx, keys, opts...)
	if err != nil {
		return nil, err
	}
	return multi{m}, nil
}

// quoteAll quotes each key and joins them with spaces.
func quoteAll(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = strconv.Quote(k)
	}
	return strings.Join(q, " ")
}

func releaseBounded(l holding) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return l.Release(ctx)
}

// runChild runs the command and returns its exit code, and whether its whole process
// group is known to be gone.
//
// It is one function (about 110 lines): a single select loop over the child's exit,
// the lease's loss and forwarded signals, whose branches share the child's state.
func runChild(lease holding, keys []string, name string, cfg Config, sigs <-chan os.Signal) (code int, gone bool) {
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	base := cfg.Env
	if base == nil {
		base = os.Environ()
	}
	cmd.Env = append(childEnv(base), lockEnv(keys, lease.tokens())...)
	cmd.Stdin = cfg.ChildStdin
	if cmd.Stdin == nil {
		cmd.Stdin = os.Stdin
	}
	stdout, stderr := cfg.ChildStdout, cfg.ChildStderr
	if stdout == nil {
		stdout = os.Stdout
	}
	if stderr == nil {
		stderr = os.Stderr
	}
	var outs [2]*copier
	var err error
	if cmd.Stdout, outs[0], err = fileFor(stdout); err == nil {
		if sameWriter(stdout, stderr) {
			cmd.Stderr = cmd.Stdout // one copier: a writer need not be safe for two
		} else {
			cmd.Stderr, outs[1], err = fileFor(stderr)
		}
	}
	defer func() {
		for _, c := range outs {
			c.finish()
		}
	}()
	if err != nil {
		cfg.errorf("cannot start %s: %v", cfg.Command[0], err)
		return ExitCannotRun, true
	}
	g, err := startGroup(cmd, func(format string, a ...any) { cfg.errorf(format, a...) })
	for _, c := range outs {
		c.started()
	}
	if err != nil {
		cfg.errorf("cannot start %s: %v", cfg.Command[0], err)
		return startFailureCode(err), true
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	lost, stopping := false, false
	done := lease.Done()
	var killTimer, giveUp, poll <-chan time.Time
	stop := func() {
		if !stopping {
			stopping = true
			g.signal(syscall.SIGTERM)
			killTimer = time.After(cfg.Grace)
		}
	}
	finish := func() (int, bool) {
		if lost {
			return ExitLeaseLost, true
		}
		return code, true
	}
	for {
		select {
		case err := <-exited:
			exited = nil
			code = exitCode(err)
			if g.gone() {
				g.close(true)
				return finish()
			}
			if !stopping {
				cfg.errorf("%s exited, leaving processes in its group; stopping them (SIGTERM, SIGKILL after %v)", cfg.Command[0], cfg.Grace)
				stop()
			}
			poll = time.After(pollInterval)
		case <-poll:
			if g.gone() {
				g.close(true)
				return finish()
			}
			poll = time.After(pollInterval)
		case s := <-sigs:
			g.signal(s)
		case <-done:
			done = nil
			lost = true
			cfg.errorf("lease on %s lost (%s); stopping the command (SIGTERM, SIGKILL after %v)", name, lossCause(lease.Err()), cfg.Grace)
			stop()
		case <-killTimer:
			killTimer = nil
			cfg.errorf("processes of the command's group still running %v after SIGTERM; sending SIGKILL", cfg.Grace)
			g.signal(syscall.SIGKILL)
			giveUp = time.After(killWait)
		case <-giveUp:
			if exited != nil {
				cfg.errorf("%s still running %v after SIGKILL", cfg.Command[0], killWait)
			} else {
				cfg.errorf("processes of the command's group still exist %v after SIGKILL", killWait)
			}
			g.close(false)
			if lost {
				return ExitLeaseLost, false
			}
			return code, false
		}
	}
}

// lockEnv is what the child learns of its lock: DLOCK_KEY and DLOCK_TOKEN for one
// key; for a set, DLOCK_KEYS (how many) and DLOCK_KEY_i, DLOCK_TOKEN_i for i from 1,
// in key order (no DLOCK_TOKEN: each token fences its own key's resource). And
// DLOCK_HELD=1.
func lockEnv(keys []string, tokens []dlock.Token) []string {
	if len(keys) == 1 {
		return []string{"DLOCK_KEY=" + keys[0], "DLOCK_TOKEN=" + strconv.FormatUint(uint64(tokens[0]), 10), "DLOCK_HELD=1"}
	}
	env := []string{"DLOCK_KEYS=" + strconv.Itoa(len(keys))}
	for i, k := range keys {
		env = append(env, fmt.Sprintf("DLOCK_KEY_%d=%s", i+1, k), fmt.Sprintf("DLOCK_TOKEN_%d=%d", i+1, tokens[i]))
	}
	return append(env, "DLOCK_HELD=1")
}

// startFailureCode is the shell's status for a command that could not be started:
// 127 when it was not found, 126 when it was found but could not be executed.
func startFailureCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return ExitNoCommand
	}
	return ExitCannotRun
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

// childEnv returns env without the backend's secrets: DLOCK_PASSWORD always, and
// DLOCK_URL when it holds a password (in its user info or in a query parameter that
// looks secret) or does not parse. The lock's own variables (DLOCK_KEY, DLOCK_TOKEN,
// DLOCK_HELD) are dropped too, for the runner to set.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case "DLOCK_PASSWORD", "DLOCK_KEY", "DLOCK_TOKEN", "DLOCK_HELD", watchdogEnv:
			continue
		case "DLOCK_URL":
			if urlHasSecret(value) {
				continue
			}
		}
		out = append(out, kv)
	}
	return out
}

// urlHasSecret reports whether a backend URL holds a password, in its user info or
// in a query parameter whose name looks secret, or does not parse (so cannot be
// told).
func urlHasSecret(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return true
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return true
		}
	}
	for k := range u.Query() {
		lk := strings.ToLower(k)
		if strings.Contains(lk, "pass") || strings.Contains(lk, "token") || strings.Contains(lk, "secret") || strings.HasSuffix(lk, "key") {
			return true
		}
	}
	return false
}
