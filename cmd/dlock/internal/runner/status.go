package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/cmd/dlock/internal/errline"
)

// How often the runner asks the backend who holds the key while it waits. This is a
// display, not how the runner learns that the key is free: Lock does that.
const (
	statusFirst = 250 * time.Millisecond // a lock granted at once shows no status
	statusEvery = time.Second
)

// inspectTimeout bounds one Inspect made for the display or for an error message.
const inspectTimeout = 2 * time.Second

// status is the one line that says, while the runner waits for the lock, who holds
// it. On a terminal the line is rewritten in place and erased before any other
// message; elsewhere (a log file, a pipe) a line is printed each time the holder,
// its token or the queue changes, not for every tick of its TTL.
type status struct {
	w   io.Writer
	tty bool
	// place is this run's place in the server's queue (1: next in line) as the
	// last waiting attempt's reply said, 0 while the backend has not told.
	place atomic.Int64

	mu     sync.Mutex
	onTerm bool   // a line is on the terminal, to be erased
	last   string // what was last printed (not on a terminal)
}

func newStatus(w io.Writer) *status {
	f, ok := w.(*os.File)
	return &status{w: w, tty: ok && term.IsTerminal(int(f.Fd()))}
}

// show puts the status for info on screen. same is the part that, unchanged, prints
// no new line when the output is not a terminal.
func (s *status) show(line, same string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty {
		fmt.Fprintf(s.w, "\r\x1b[K%s", errline.Message(line))
		s.onTerm = true
		return
	}
	if same == s.last {
		return
	}
	s.last = same
	fmt.Fprintln(s.w, errline.Message(line))
}

// queued records a waiting attempt's place: ahead places in front of it. It is
// the lock call's dlock.WithQueueReport function.
func (s *status) queued(ahead int) { s.place.Store(int64(ahead) + 1) }

// clear erases the line from the terminal, so that the next message starts on a
// clean line.
func (s *status) clear() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onTerm {
		fmt.Fprint(s.w, "\r\x1b[K")
		s.onTerm = false
	}
}

// inspector tells who holds a key: a *dlock.Client.
type inspector interface {
	Inspect(ctx context.Context, key string) (dlock.Info, error)
}

// watch shows who holds keys (the first of them that is held) until ctx ends,
// asking in every period (after first). It stops asking if the backend cannot tell
// (dlock.ErrUnsupported).
func (s *status) watch(ctx context.Context, in inspector, keys []string, first, every time.Duration) {
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
		key, info, err := inspectFirst(ictx, in, keys)
		cancel()
		if errors.Is(err, dlock.ErrUnsupported) {
			return
		}
		if err == nil && ctx.Err() == nil {
			line := fmt.Sprintf("waiting for %q: held by owner %s", key, describe(info))
			if len(keys) > 1 {
				line = fmt.Sprintf("waiting for %q (one of %d keys): held by owner %s", key, len(keys), describe(info))
			}
			place := s.place.Load()
			if place > 0 {
				line += fmt.Sprintf("; this run is %s in the queue", ordinal(place))
			}
			s.show(line, fmt.Sprintf("%s/%s/%d/%d/%d", key, info.Owner, info.Token, info.Waiters, place))
		}
		t.Reset(every)
	}
}

// ordinal spells n as "1st", "2nd", "3rd", "4th", ... "11th", "21st".
func ordinal(n int64) string {
	suffix := "th"
	if n%100 < 11 || n%100 > 13 {
		switch n % 10 {
		case 1:
			suffix = "st"
		case 2:
			suffix = "nd"
		case 3:
			suffix = "rd"
		}
	}
	return fmt.Sprintf("%d%s", n, suffix)
}

// describe says who holds a key: `"X" (token N, TTL left 4.2s, 2 waiting)`.
func describe(info dlock.Info) string {
	s := fmt.Sprintf("%q (token %d", info.Owner, info.Token)
	if info.TTL > 0 {
		s += ", TTL left " + info.TTL.Round(100*time.Millisecond).String()
	}
	if info.Waiters >= 0 {
		s += fmt.Sprintf(", %d waiting", info.Waiters)
	}
	return s + ")"
}

// inspectFirst returns the first of keys that is held and its holder; an error
// matching dlock.ErrNotHeld if none is, or the first other error.
func inspectFirst(ctx context.Context, in inspector, keys []string) (string, dlock.Info, error) {
	for _, k := range keys {
		info, err := in.Inspect(ctx, k)
		if !errors.Is(err, dlock.ErrNotHeld) {
			return k, info, err
		}
	}
	return "", dlock.Info{}, dlock.ErrNotHeld
}

// heldKey returns the first of keys that is held and describes its holder; keys[0]
// and "" when the backend cannot tell (it cannot inspect, an error, or the keys
// were freed meanwhile).
func heldKey(in inspector, keys []string) (string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	key, info, err := inspectFirst(ctx, in, keys)
	if err != nil {
		return keys[0], ""
	}
	return key, describe(info)
}
