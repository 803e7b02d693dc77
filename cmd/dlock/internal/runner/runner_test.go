package runner

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/memlock"
)

func TestMain(m *testing.M) {
	MaybeRunWatchdog()
	goleak.VerifyTestMain(m)
}

// syncBuf is a buffer that the child's output copier and the runner may write at once.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type env struct {
	store  *memlock.Store
	client *dlock.Client
	out    *syncBuf
	errout *syncBuf
	sigs   chan chan<- os.Signal
}

func setup(t *testing.T, opts ...dlock.Option) *env {
	t.Helper()
	st := memlock.NewStore(clock.Real)
	c, err := dlock.New(st.Backend(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &env{store: st, client: c, out: &syncBuf{}, errout: &syncBuf{}, sigs: make(chan chan<- os.Signal, 1)}
}

func (e *env) cfg(key string, cmd ...string) Config {
	return Config{
		Key: key, Command: cmd, Grace: 500 * time.Millisecond,
		Stderr: e.errout, ChildStdout: e.out, ChildStderr: e.errout, ChildStdin: strings.NewReader(""),
		forwardedSignalsFor: func(c chan<- os.Signal) {
			select {
			case e.sigs <- c:
			default:
			}
		},
	}
}

func (e *env) run(t *testing.T, cfg Config) int {
	t.Helper()
	res := Run(context.Background(), e.client, cfg)
	if res.Abandoned {
		t.Errorf("the run abandoned the lease (stderr: %s)", e.errout)
	}
	return res.Code
}

func TestChildEnvironmentAndStatus(t *testing.T) {
	e := setup(t)
	code := e.run(t, e.cfg("job", "sh", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN $DLOCK_HELD"; exit 3`))
	if code != 3 {
		t.Fatalf("exit code %d, want the child's 3 (stderr: %s)", code, e.errout)
	}
	if got := strings.TrimSpace(e.out.String()); got != "job 1 1" {
		t.Fatalf("child saw %q", got)
	}
	// Released afterwards.
	l, err := e.client.TryLock(context.Background(), "job")
	if err != nil {
		t.Fatalf("lock still held after the run: %v", err)
	}
	_ = l.Release(context.Background())
}

func TestHeldLock(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	l, err := e.client.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if code := e.run(t, e.cfg("job", "true")); code != ExitNotAcquired {
		t.Fatalf("--wait 0 on a held lock: exit %d, want %d", code, ExitNotAcquired)
	}
	cfg := e.cfg("job", "true")
	cfg.Wait = 100 * time.Millisecond
	if code := e.run(t, cfg); code != ExitNotAcquired {
		t.Fatalf("--wait 100ms on a held lock: exit %d, want %d", code, ExitNotAcquired)
	}
	if !strings.Contains(e.errout.String(), "held by another owner") {
		t.Fatalf("no reason given: %q", e.errout)
	}
	if n := e.store.Waiters("job"); n != 0 {
		t.Fatalf("%d waiters left behind", n)
	}
}

func TestMissingCommand(t *testing.T) {
	e := setup(t)
	if code := e.run(t, e.cfg("job", "/nonexistent/program")); code != ExitNoCommand {
		t.Fatalf("exit %d, want %d", code, ExitNoCommand)
	}
	if code := e.run(t, e.cfg("job")); code != ExitUsage {
		t.Fatalf("no command: exit %d, want %d", code, ExitUsage)
	}
}

// The lease is lost while the child runs: the child gets SIGTERM, and SIGKILL after
// the grace period if it ignores SIGTERM.
func TestLeaseLostStopsChild(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		{"obeys TERM", "sleep 30"},
		{"ignores TERM", `trap "" TERM; sleep 30`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, dlock.WithRenewInterval(20*time.Millisecond))
			go func() {
				// Drop the grant on the server once the child runs.
				for e.store.Waiters("job") == 0 {
					if _, err := e.store.Backend().Inspect(context.Background(), "job"); err == nil {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(100 * time.Millisecond)
				e.store.Expire("job")
			}()
			start := time.Now()
			code := e.run(t, e.cfg("job", "sh", "-c", tc.script))
			if code != ExitLeaseLost {
				t.Fatalf("exit %d, want %d (stderr: %s)", code, ExitLeaseLost, e.errout)
			}
			if el := time.Since(start); el > 20*time.Second {
				t.Fatalf("child ran %v after the lease was lost", el)
			}
			if !strings.Contains(e.errout.String(), "lost") {
				t.Fatalf("no message about the lost lease: %q", e.errout)
			}
		})
	}
}

// Signals sent to the runner reach the child; the lock is released afterwards.
func TestSignalsForwarded(t *testing.T) {
	e := setup(t)
	done := make(chan int, 1)
	go func() {
		done <- e.run(t, e.cfg("job", "sh", "-c", `trap 'exit 42' TERM; while :; do sleep 0.01; done`))
	}()
	sigs := <-e.sigs
	for {
		if _, err := e.store.Backend().Inspect(context.Background(), "job"); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // let the shell install its trap
	sigs <- syscall.SIGTERM
	if code := <-done; code != 42 {
		t.Fatalf("exit %d, want the child's 42", code)
	}
	if _, err := e.store.Backend().Inspect(context.Background(), "job"); err == nil {
		t.Fatal("lock still held after the child exited")
	}
}

// Ctrl-C while waiting for the lock leaves nothing behind.
func TestInterruptWhileWaiting(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	l, err := e.client.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	cfg := e.cfg("job", "true")
	cfg.Wait = Forever
	done := make(chan int, 1)
	go func() { done <- e.run(t, cfg) }()
	sigs := <-e.sigs
	for e.store.Waiters("job") == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	sigs <- syscall.SIGINT
	if code := <-done; code != 130 {
		t.Fatalf("exit %d, want 130", code)
	}
	if n := e.store.Waiters("job"); n != 0 {
		t.Fatalf("%d waiters left after Ctrl-C", n)
	}
}

// The child's stdout and stderr may be one writer that is not safe for concurrent
// writes.
func TestSameOutputWriter(t *testing.T) {
	e := setup(t)
	cfg := e.cfg("job", "sh", "-c", `for i in 1 2 3 4 5 6 7 8; do echo out; echo err >&2; done`)
	var b bytes.Buffer // not safe for concurrent use: the race detector watches
	cfg.ChildStdout, cfg.ChildStderr = &b, &b
	if code := e.run(t, cfg); code != 0 {
		t.Fatalf("exit %d (stderr: %s)", code, e.errout)
	}
	if n := strings.Count(b.String(), "out\n") + strings.Count(b.String(), "err\n"); n != 16 {
		t.Fatalf("%d lines of output, want 16: %q", n, b.String())
	}
}
