package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// A holder that crashed (acquired, then never renewed nor released) stops blocking
// others once its grant is gone.
func (h Harness) testCrashedHolderExpires(t *testing.T) {
	ctx := ctxT(t)
	crashed := h.Open(t)
	defer crashed.Close()
	key := Key(t, "k")
	g, err := crashed.Acquire(ctx, driver.Request{Key: key, Owner: "crashed", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	c := h.Client(t)
	if _, err := c.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock while held: %v", err)
	}
	h.Expire(t, key)
	l, err := c.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after the holder's grant expired: %v", err)
	}
	if h.Fencing && uint64(l.Token()) <= g.Token {
		t.Fatalf("token after expiry %d is not above the crashed holder's %d", l.Token(), g.Token)
	}
	MustRelease(t, ctx, l)
}

// The server itself expires a grant that is not renewed, and a waiting Lock gets it.
func (h Harness) testTTLExpiresOnServer(t *testing.T) {
	ctx := ctxT(t)
	crashed := h.Open(t)
	defer crashed.Close()
	key := Key(t, "k")
	if _, err := crashed.Acquire(ctx, driver.Request{Key: key, Owner: "crashed", TTL: 1500 * time.Millisecond}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	c := h.Client(t, dlock.WithRetry(10*time.Millisecond, 200*time.Millisecond))
	l := MustLock(t, ctx, c, key)
	MustRelease(t, ctx, l)
}

func (h Harness) testTokensIncrease(t *testing.T) {
	ctx := ctxT(t)
	cs := []*dlock.Client{h.Client(t), h.Client(t)}
	key := Key(t, "k")
	var last dlock.Token
	for i := range 20 {
		l := MustLock(t, ctx, cs[i%2], key)
		h.checkToken(t, l.Token())
		if h.Fencing && l.Token() <= last {
			t.Fatalf("grant %d: token %d not above %d", i, l.Token(), last)
		}
		last = l.Token()
		MustRelease(t, ctx, l)
	}
}

// When the server drops the grant, the holder's renewal is refused and Done closes
// with ErrLeaseLost; a new grant gets a larger token.
func (h Harness) testDoneOnServerDrop(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t, dlock.WithTTL(3*time.Second), dlock.WithRenewInterval(50*time.Millisecond))
	key := Key(t, "k")
	l := MustLock(t, ctx, c, key)
	h.Expire(t, key)
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatalf("Done did not close after the server dropped the grant")
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) || !errors.Is(context.Cause(l.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, cause = %v; want ErrLeaseLost", l.Err(), context.Cause(l.Context()))
	}
	l2 := MustLock(t, ctx, h.Client(t), key)
	if h.Fencing && l2.Token() <= l.Token() {
		t.Fatalf("token after loss %d not above %d", l2.Token(), l.Token())
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of a lost lease = %v, want ErrLeaseLost", err)
	}
	MustRelease(t, ctx, l2)
}

// testBound checks a driver.Bounder: a grant is bounded while held, the lease's
// expiry is no later than the bound, and a released grant has none.
func (h Harness) testBound(t *testing.T) {
	b := h.Open(t)
	bd, ok := b.(driver.Bounder)
	if !ok {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		t.Skip("the backend's grants are not kept alive by a session of its own")
	}
	c, err := dlock.New(b, h.Options...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxT(t)
	key := Key(t, "k")
	l := MustLock(t, ctx, c, key)
	left := time.Until(l.Expiry())
	d, ok := bd.Bound(key, l.Owner())
	if !ok || d <= 0 {
		t.Fatalf("Bound of a held grant = %v, %v; want a positive bound", d, ok)
	}
	// The bound is measured after the expiry, so it may be a little shorter.
	if d != driver.NoBound && left > d+20*time.Millisecond {
		t.Fatalf("the lease expires in %v, after the backend's bound %v", left, d)
	}
	if _, ok := bd.Bound(key, "someone-else"); ok {
		t.Fatalf("Bound for an owner that holds nothing reports a grant")
	}
	MustRelease(t, ctx, l)
	if d, ok := bd.Bound(key, l.Owner()); ok {
		t.Fatalf("Bound after release = %v, want no grant", d)
	}
}
