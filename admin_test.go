package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/memlock"
)

// bare is a backend with the required methods only: no Inspector, no ForceReleaser.
type bare struct{ driver.Backend }

// Inspect reports the holder, its token and time left; ForceRelease frees the key
// so that the next grant has a larger token; both say ErrNotHeld for a free key.
func TestInspectForceRelease(t *testing.T) {
	ctx := context.Background()
	c, err := dlock.New(memlock.NewStore(clock.Real).Backend(), dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Inspect(ctx, "k"); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Inspect of a free key: %v, want ErrNotHeld", err)
	}
	if err := c.ForceRelease(ctx, "k"); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("ForceRelease of a free key: %v, want ErrNotHeld", err)
	}
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "k" || info.Owner != l.Owner() || info.Token != l.Token() || info.TTL <= 0 || info.TTL > 10*time.Second || info.Waiters != 0 {
		t.Fatalf("Inspect = %+v, want key k, owner %s, token %d, TTL in (0, 10s], no waiters", info, l.Owner(), l.Token())
	}
	if err := c.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Inspect(ctx, "k"); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Inspect after ForceRelease: %v, want ErrNotHeld", err)
	}
	l2, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token after ForceRelease %d, want more than %d", l2.Token(), l.Token())
	}
	_ = l2.Release(ctx)
	_ = l.Release(ctx)

	for _, bad := range []string{"", "a\x00b"} {
		if _, err := c.Inspect(ctx, bad); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Inspect(%q): %v, want ErrInvalid", bad, err)
		}
		if err := c.ForceRelease(ctx, bad); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("ForceRelease(%q): %v, want ErrInvalid", bad, err)
		}
	}
}

// A backend without the capabilities makes both fail with ErrUnsupported, which is
// also errors.ErrUnsupported, and Close makes them fail with ErrClosed.
func TestInspectForceReleaseUnsupported(t *testing.T) {
	ctx := context.Background()
	c, err := dlock.New(bare{memlock.NewStore(clock.Real).Backend()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	_, ierr := c.Inspect(ctx, "k")
	ferr := c.ForceRelease(ctx, "k")
	for _, err := range []error{ierr, ferr} {
		if !errors.Is(err, dlock.ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("got %v, want an error matching dlock.ErrUnsupported and errors.ErrUnsupported", err)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after the refused ForceRelease: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Inspect(ctx, "k"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Inspect after Close: %v, want ErrClosed", err)
	}
	if err := c.ForceRelease(ctx, "k"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("ForceRelease after Close: %v, want ErrClosed", err)
	}
}
