package drivertest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

func (h Harness) testTryLockHeld(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l := MustLock(t, ctx, a, key)
	h.checkToken(t, l.Token())
	if _, err := b.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock on a held key: got %v, want ErrLocked", err)
	}
	// A second Lock call on the same client without the owner id must not re-enter.
	if _, err := a.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock from the same client with a new owner: got %v, want ErrLocked", err)
	}
	MustRelease(t, ctx, l)
	if l.Err() == nil || !errors.Is(l.Err(), dlock.ErrReleased) {
		t.Fatalf("Err after Release = %v, want ErrReleased", l.Err())
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("second Release = %v, want ErrReleased", err)
	}
	l2, err := b.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after release: %v", err)
	}
	if h.Fencing && l2.Token() <= l.Token() {
		t.Fatalf("token did not rise: %d then %d", l.Token(), l2.Token())
	}
	MustRelease(t, ctx, l2)
}

// N clients on separate connections increment an unguarded counter under the lock;
// no update is lost and no two are ever inside at once.
func (h Harness) testMutualExclusion(t *testing.T) {
	ctx := ctxT(t)
	const clients, rounds = 4, 25
	key := Key(t, "k")
	var counter, inside, maxInside atomic.Int64
	var tokens sync.Map
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		c := h.Client(t)
		wg.Go(func() {
			for range rounds {
				err := c.Do(ctx, key, func(ctx context.Context, l *dlock.Lease) error {
					if n := inside.Add(1); n > maxInside.Load() {
						maxInside.Store(n)
					}
					if _, dup := tokens.LoadOrStore(l.Token(), true); dup && h.Fencing {
						return errors.New("token issued twice")
					}
					v := counter.Load()
					time.Sleep(100 * time.Microsecond)
					counter.Store(v + 1)
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Do: %v", err)
	}
	if got := counter.Load(); got != clients*rounds {
		t.Fatalf("counter = %d, want %d: updates were lost", got, clients*rounds)
	}
	if m := maxInside.Load(); m != 1 {
		t.Fatalf("%d holders inside at once", m)
	}
}

func (h Harness) testKeys(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	base := Key(t, "")
	good := []string{"a/b/c", "/leading", "trailing/", "..", ".", "with space", "ünï©ødé-日本",
		"{brace}", "*?[x]", "a:b:c", "quote'\"`", "100%", "semi;--", "back\\slash", "emoji-🔒",
		strings.Repeat("x", driver.MaxKeyLen-len(base))}
	for _, k := range good {
		key := base + k
		if len(key) > driver.MaxKeyLen {
			key = key[:driver.MaxKeyLen]
		}
		l, err := c.TryLock(ctx, key)
		if err != nil {
			t.Fatalf("TryLock(%q): %v", key, err)
		}
		if _, err := h.Client(t).TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("key %q not exclusive: %v", key, err)
		}
		MustRelease(t, ctx, l)
	}
	bad := []string{"", strings.Repeat("x", driver.MaxKeyLen+1), "nul\x00byte", "new\nline", "\xff\xfe"}
	for _, key := range bad {
		if _, err := c.TryLock(ctx, key); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryLock(%q) = %v, want ErrInvalid", key, err)
		}
	}
}

func (h Harness) testDo(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	key := Key(t, "k")
	want := errors.New("work failed")
	var sawKey string
	err := c.Do(ctx, key, func(ctx context.Context, l *dlock.Lease) error {
		sawKey = l.Key()
		return want
	})
	if !errors.Is(err, want) || sawKey != key {
		t.Fatalf("Do = %v (key %q), want the function's error", err, sawKey)
	}
	l, err := h.Client(t).TryLock(ctx, key)
	if err != nil {
		t.Fatalf("Do did not release: %v", err)
	}
	MustRelease(t, ctx, l)
}

func (h Harness) testCloseReleases(t *testing.T) {
	ctx := ctxT(t)
	c, err := dlock.New(h.Open(t), h.Options...)
	if err != nil {
		t.Fatal(err)
	}
	key := Key(t, "k")
	l := MustLock(t, ctx, c, key)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !errors.Is(l.Err(), dlock.ErrReleased) {
		t.Fatalf("lease Err after Close = %v, want ErrReleased", l.Err())
	}
	if _, err := c.TryLock(ctx, key); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryLock after Close = %v, want ErrClosed", err)
	}
	l2, err := h.Client(t).TryLock(ctx, key)
	if err != nil {
		t.Fatalf("key still held after the holder's client closed: %v", err)
	}
	MustRelease(t, ctx, l2)
}

func (h Harness) testInspect(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	in, ok := c.Backend().(driver.Inspector)
	if !ok {
		t.Skip("backend has no Inspector")
	}
	key := Key(t, "k")
	if _, err := in.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect of a free key = %v, want ErrNotHeld", err)
	}
	l := MustLock(t, ctx, c, key)
	info, err := in.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if info.Owner != l.Owner() || dlock.Token(info.Token) != l.Token() || info.TTL <= 0 || info.TTL > l.TTL() {
		t.Fatalf("Inspect = %+v; lease owner %s token %d ttl %v", info, l.Owner(), l.Token(), l.TTL())
	}
	MustRelease(t, ctx, l)
}

func (h Harness) testForceRelease(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t, dlock.WithRenewInterval(50*time.Millisecond))
	fr, ok := c.Backend().(driver.ForceReleaser)
	if !ok {
		t.Skip("backend has no ForceReleaser")
	}
	key := Key(t, "k")
	if err := fr.ForceRelease(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("ForceRelease of a free key = %v, want ErrNotHeld", err)
	}
	l := MustLock(t, ctx, c, key)
	if err := fr.ForceRelease(ctx, key); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	l2 := MustLock(t, ctx, h.Client(t), key)
	if h.Fencing && l2.Token() <= l.Token() {
		t.Fatalf("token after force release %d not above %d", l2.Token(), l.Token())
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatalf("old holder's Done did not close after a force release")
	}
	MustRelease(t, ctx, l2)
}
