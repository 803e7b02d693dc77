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
	cfg.statusFirst, cfg.statusEvery = 10*time.Millisecond, 50*time.Millisecond
	if code := e.run(t, cfg); code != ExitNotAcquired {
		t.Fatalf("exit %d, want %d", code, ExitNotAcquired)
	}
	out := e.errout.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one status line and one error, got %q", out)
	}
	if want := `dlock: waiting for "job": held by owner "holder-1" (token 1, TTL left `; !strings.HasPrefix(lines[0], want) || !strings.HasSuffix(lines[0], ", 1 waiting)") {
		t.Errorf("status line %q, want %q... 1 waiting)", lines[0], want)
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
