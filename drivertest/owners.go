package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

func (h Harness) testNotOwner(t *testing.T) {
	ctx := ctxT(t)
	b := h.Open(t)
	defer b.Close()
	key := Key(t, "k")
	ttl := 10 * time.Second
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: ttl}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Refresh(ctx, key, "mallory", ttl); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh by non-owner: %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, key, "mallory"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release by non-owner: %v, want ErrNotHeld", err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "mallory", TTL: ttl}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("Acquire by another owner: %v, want ErrLocked", err)
	}
	if err := b.Refresh(ctx, key, "alice", ttl); err != nil {
		t.Fatalf("Refresh by owner: %v", err)
	}
	if err := b.Release(ctx, key, "alice"); err != nil {
		t.Fatalf("Release by owner: %v", err)
	}
	if err := b.Release(ctx, key, "alice"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	if err := b.Refresh(ctx, key, "alice", ttl); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh after release: %v, want ErrNotHeld", err)
	}
	// After expiry.
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: ttl}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	h.Expire(t, key)
	if err := b.Refresh(ctx, key, "alice", ttl); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh after expiry: %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, key, "alice"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release after expiry: %v, want ErrNotHeld", err)
	}
}

func (h Harness) testReentrancy(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l1 := MustLock(t, ctx, a, key)
	l2 := MustLock(t, ctx, a, key, dlock.WithOwner(l1.Owner()))
	l3, err := a.TryLock(ctx, key, dlock.WithOwner(l1.Owner()))
	if err != nil {
		t.Fatalf("TryLock re-entry: %v", err)
	}
	if l2.Token() != l1.Token() || l3.Token() != l1.Token() {
		t.Fatalf("re-entry tokens %d %d differ from %d", l2.Token(), l3.Token(), l1.Token())
	}
	for i, l := range []*dlock.Lease{l1, l2} {
		MustRelease(t, ctx, l)
		if _, err := b.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("after %d of 3 releases: TryLock = %v, want ErrLocked", i+1, err)
		}
		if l3.Err() != nil {
			t.Fatalf("remaining lease ended early: %v", l3.Err())
		}
	}
	MustRelease(t, ctx, l3)
	l4, err := b.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after the last release: %v", err)
	}
	MustRelease(t, ctx, l4)
}

// A process restarted with a stable owner id resumes its grant explicitly
// (WithResume): same token, and releasing it frees the key.
func (h Harness) testResume(t *testing.T) {
	ctx := ctxT(t)
	before := h.Client(t, dlock.WithOwner("stable-owner-1"))
	key := Key(t, "k")
	l := MustLock(t, ctx, before, key)
	// "Crash": stop renewing without releasing, by resuming from another client.
	after := h.Client(t, dlock.WithOwner("stable-owner-1"))
	l2, err := after.TryLock(ctx, key, dlock.WithResume())
	if err != nil {
		t.Fatalf("resume with the same owner: %v", err)
	}
	if l2.Token() != l.Token() {
		t.Fatalf("resumed token %d, want %d", l2.Token(), l.Token())
	}
	MustRelease(t, ctx, l2)
	other := h.Client(t)
	l3, err := other.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after the resumed release: %v", err)
	}
	MustRelease(t, ctx, l3)
	// The first client's lease learns on its next renewal (or at release) that it
	// is gone; it must not report success.
	if err := l.Release(ctx); err == nil {
		t.Fatalf("releasing the pre-restart lease succeeded after the key was taken over")
	}
}

// An owner id that holds the key through one client is refused through another
// (another process of the same owner id) unless it resumes explicitly: a refused
// attempt changes nothing on the server (the holder keeps the key and its token,
// its TTL is not extended), the refused caller cannot free the holder's grant, and
// two waiters of one owner id never hold at once.
func (h Harness) testSameOwnerElsewhere(t *testing.T) {
	ctx := ctxT(t)
	const owner = "shared-owner-1"
	// A long TTL, so that the holder's own renewal does not run during the test.
	opts := []dlock.Option{dlock.WithOwner(owner), dlock.WithTTL(time.Minute)}
	a, b, third := h.Client(t, opts...), h.Client(t, opts...), h.Client(t)
	key := Key(t, "k")
	l := MustLock(t, ctx, a, key)
	in, inspect := a.Backend().(driver.Inspector)
	var before driver.Info
	if inspect {
		var err error
		if before, err = in.Inspect(ctx, key); err != nil {
			t.Fatalf("Inspect: %v", err)
		}
	}
	if _, err := b.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock with the holder's owner id from another client = %v, want ErrLocked", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := b.Lock(wctx, key)
	cancel()
	if !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with the holder's owner id from another client = %v, want ErrLocked and DeadlineExceeded", err)
	}
	if inspect {
		after, err := in.Inspect(ctx, key)
		if err != nil {
			t.Fatalf("Inspect after the refused attempts: %v (the holder's grant is gone)", err)
		}
		if after.Owner != owner || after.Token != before.Token {
			t.Fatalf("after the refused attempts Inspect = %+v, before %+v", after, before)
		}
		if after.TTL > before.TTL {
			t.Fatalf("a refused attempt extended the holder's TTL: %v, before %v", after.TTL, before.TTL)
		}
	}
	if l.Err() != nil {
		t.Fatalf("the holder's lease ended: %v", l.Err())
	}
	if _, err := third.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("a third client's TryLock = %v, want ErrLocked (the holder's grant must stay)", err)
	}
	// With WithResume, the second client takes the grant over, with its token.
	r, err := b.TryLock(ctx, key, dlock.WithResume())
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if r.Token() != l.Token() {
		t.Fatalf("resumed token %d, want %d", r.Token(), l.Token())
	}
	if err := r.Release(ctx); err != nil {
		t.Fatalf("release of the resumed lease: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("release of the taken-over lease = %v, want ErrLeaseLost", err)
	}
	sameOwnerWaiters(t, ctx, a, b, third, key, owner)
}

// sameOwnerWaiters: two waiters of one owner id (clients a and b) while a third
// client holds key; when it is released, the key goes to one of them at most.
func sameOwnerWaiters(t *testing.T, ctx context.Context, a, b, third *dlock.Client, key, owner string) {
	holder := MustLock(t, ctx, third, key)
	type result struct {
		l   *dlock.Lease
		err error
	}
	results := make(chan result, 2)
	ctxs := make([]context.CancelFunc, 2)
	for i, c := range []*dlock.Client{a, b} {
		wctx, cancel := context.WithCancel(ctx)
		ctxs[i] = cancel
		go func() {
			l, err := c.Lock(wctx, key)
			results <- result{l, err}
		}()
	}
	defer func() {
		for _, cancel := range ctxs {
			cancel()
		}
	}()
	// Whether they queued yet or not, the key goes to one of them at most.
	MustRelease(t, ctx, holder)
	first := <-results
	if first.err != nil {
		t.Fatalf("waiter: %v", first.err)
	}
	// The other waiter must still be waiting: stop it, it must not hold.
	for _, cancel := range ctxs {
		cancel()
	}
	second := <-results
	if second.err == nil {
		t.Fatalf("two clients of one owner id hold the key at once, tokens %d and %d", first.l.Token(), second.l.Token())
	}
	if !errors.Is(second.err, dlock.ErrLocked) {
		t.Fatalf("the other waiter = %v, want ErrLocked", second.err)
	}
	if first.l.Err() != nil {
		t.Fatalf("the winner's lease ended: %v", first.l.Err())
	}
	// The winner is taken over by an explicit resume. (Its token is the same where
	// every node holds the grant, as testResume checks; a Redlock grant that a
	// majority made may get a larger one.)
	r, err := third.TryLock(ctx, key, dlock.WithOwner(owner), dlock.WithResume())
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if r.Token() < first.l.Token() {
		t.Fatalf("resumed token %d, below the grant's %d", r.Token(), first.l.Token())
	}
	MustRelease(t, ctx, r)
	if err := first.l.Release(ctx); err == nil {
		t.Fatalf("releasing the taken-over lease succeeded")
	}
}
