package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/memlock"
)

// Errors are one line each, with no sentence repeated, and still match their
// sentinels: a waiting Lock that gives up, and Do whose lease was lost.
func TestErrorsOneLine(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore(clock.Real)
	a, err := dlock.New(store.Backend(), dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := dlock.New(store.Backend())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	l, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	_, err = b.Lock(wctx, "k")
	cancel()
	oneLine(t, "Lock timeout", err, dlock.ErrLocked, context.DeadlineExceeded)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	err = a.Do(ctx, "d", func(ctx context.Context, l *dlock.Lease) error {
		store.Expire("d")
		<-ctx.Done()
		return context.Cause(ctx)
	})
	oneLine(t, "Do with a lost lease", err, dlock.ErrLeaseLost)
}

func oneLine(t *testing.T, what string, err error, want ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	text := err.Error()
	if strings.Contains(text, "\n") {
		t.Errorf("%s: error spans lines: %q", what, text)
	}
	for _, part := range strings.Split(text, "; ") {
		if strings.Count(text, part) > 1 {
			t.Errorf("%s: %q repeats %q", what, text, part)
		}
	}
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Errorf("%s: %q does not match %v", what, text, w)
		}
	}
	t.Logf("%s: %s", what, text)
}
