package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// While it waits, the runner says who holds the key: on a file or pipe, one line per
// change of holder, token or queue, not one per poll.
func TestWaitStatus(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	l, err := e.client.Lock(ctx, "job", dlock.WithOwner("holder-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	cfg := e.cfg("job", "true")
	cfg.Wait = 600 * time.Millisecond
	// The first status comes after the first attempt has told the place.
	cfg.statusFirst, cfg.statusEvery = 150*time.Millisecond, 50*time.Millisecond
	if code := e.run(t, cfg); code != ExitNotAcquired {
		t.Fatalf("exit %d, want %d", code, ExitNotAcquired)
	}
	out := e.errout.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one status line and one error, got %q", out)
	}
	if want := `dlock: waiting for "job": held by owner "holder-1" (token 1, TTL left `; !strings.HasPrefix(lines[0], want) || !strings.HasSuffix(lines[0], ", 1 waiting); this run is 1st in the queue") {
		t.Errorf("status line %q, want %q... 1 waiting); this run is 1st in the queue", lines[0], want)
	}
	if want := `dlock: "job" still held by another owner "holder-1" (token 1, TTL left `; !strings.HasPrefix(lines[1], want) || !strings.HasSuffix(lines[1], " after 600ms") {
		t.Errorf("error %q, want %q... after 600ms", lines[1], want)
	}
}

// --quiet, or no wait at all, shows no status.
func TestWaitStatusQuiet(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	l, err := e.client.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	cfg := e.cfg("job", "true")
	cfg.Wait, cfg.Quiet = 200*time.Millisecond, true
	cfg.statusFirst, cfg.statusEvery = 10*time.Millisecond, 20*time.Millisecond
	e.run(t, cfg)
	if out := e.errout.String(); strings.Contains(out, "waiting for") || strings.Count(out, "\n") != 1 {
		t.Errorf("--quiet printed %q", out)
	}
}

func TestStatusTerminal(t *testing.T) {
	var b bytes.Buffer
	s := &status{w: &b, tty: true}
	info := dlock.Info{Owner: "a", Token: 7, TTL: 4230 * time.Millisecond, Waiters: -1}
	s.show("waiting: "+describe(info), "x")
	s.show("waiting: "+describe(info), "x") // a terminal is refreshed even without change
	s.clear()
	s.clear()
	want := "\r\x1b[Kdlock: waiting: \"a\" (token 7, TTL left 4.2s)" + "\r\x1b[Kdlock: waiting: \"a\" (token 7, TTL left 4.2s)" + "\r\x1b[K"
	if b.String() != want {
		t.Errorf("terminal output %q, want %q", b.String(), want)
	}
}

func TestLossCause(t *testing.T) {
	err := fmt.Errorf("%w: validity deadline passed", dlock.ErrLeaseLost)
	if got := lossCause(err); got != "validity deadline passed" {
		t.Errorf("lossCause = %q", got)
	}
	if got := lossCause(errors.New("dlock: other\ntext")); got != "other; text" {
		t.Errorf("lossCause = %q", got)
	}
}

// fixedHolder is an inspector that always reports the same holder.
type fixedHolder dlock.Info

func (f fixedHolder) Inspect(context.Context, string) (dlock.Info, error) { return dlock.Info(f), nil }

// The line names this run's place in the queue once a waiting attempt has told it,
// and a new place is a change worth a new line.
func TestWaitStatusPlace(t *testing.T) {
	var b bytes.Buffer
	s := &status{w: &b}
	in := fixedHolder{Owner: "h", Token: 3, Waiters: 4}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { defer close(watched); s.watch(ctx, in, []string{"job"}, time.Millisecond, time.Millisecond) }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			s.mu.Lock()
			out := b.String()
			s.mu.Unlock()
			if strings.Contains(out, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("status %q never said %q", out, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor(`held by owner "h" (token 3, 4 waiting)` + "\n")
	s.queued(2)
	waitFor(`held by owner "h" (token 3, 4 waiting); this run is 3rd in the queue` + "\n")
	s.queued(0)
	waitFor("this run is 1st in the queue\n")
	cancel()
	<-watched
	if n := strings.Count(b.String(), "\n"); n != 3 {
		t.Errorf("%d lines, want 3 (one per change): %q", n, b.String())
	}
	for n, want := range map[int64]string{1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th", 13: "13th", 21: "21st", 102: "102nd", 111: "111th"} {
		if got := ordinal(n); got != want {
			t.Errorf("ordinal(%d) = %q, want %q", n, got, want)
		}
	}
}
