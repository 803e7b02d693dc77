// Package drivertest is the conformance suite and the shared benchmarks that every
// dlock backend runs against a real server. A guarantee is stated once, here, and
// checked on every backend.
package drivertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// Harness tells the suite how to reach a backend.
type Harness struct {
	// Open returns a new, independent connection to the same server (a separate
	// client, as another process would have). The suite closes it.
	Open func(t testing.TB) driver.Backend
	// Expire makes the server drop key's current grant now, as TTL expiry or a
	// server that lost its data would (a crashed holder).
	Expire func(t testing.TB, key string)
	// Options are added to every client the suite makes.
	Options []dlock.Option
	// Fencing is true when the backend issues fencing tokens (non-zero).
	Fencing bool
	// FIFO is true when the backend hands a released key to the longest waiter.
	FIFO bool
	// RoundTrip, optional, makes the cheapest request the server answers (PING);
	// benchmarks use it to express latencies in round trips.
	RoundTrip func(ctx context.Context) error
	// Namespace opens a new connection to the same server whose locks live in the
	// namespace ns: the key prefix, root path or table that ns names (a root path
	// is "/" and ns). It returns an error matching driver.ErrInvalid if the backend
	// refuses ns as a namespace. The suite closes the backend. Nil only for a
	// backend without namespaces on one server (memlock, whose stores are apart).
	Namespace func(t testing.TB, ns string) (driver.Backend, error)
	// Ops, optional, returns a running total of the operations the server has
	// served (Redis commandstats calls, ZooKeeper packets received, ...), read on a
	// connection of its own; the cost tests and benchmarks report operations per
	// handoff with it.
	Ops func(ctx context.Context) (int64, error)
	// Floor, optional, takes and releases key the cheapest way the server allows,
	// without dlock (the least correct lock): the baseline BenchCycle compares the
	// backend with.
	Floor func(ctx context.Context, key string) error
}

// Wait bounds every "eventually" in the suite; it is a safety net against a hang,
// not a speed requirement.
const Wait = 20 * time.Second

// Key returns a key unique to this test run, so tests on a shared server do not meet.
func Key(t testing.TB, name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(t.Name(), "/", ".") + "." + name + "." + hex.EncodeToString(b[:])
}

// Client opens a client on a fresh connection, closed at the end of the test.
func (h Harness) Client(t testing.TB, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := dlock.New(h.Open(t), append(append([]dlock.Option{}, h.Options...), opts...)...)
	if err != nil {
		t.Fatalf("dlock.New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	t.Cleanup(cancel)
	return ctx
}

func mustLock(t testing.TB, ctx context.Context, c *dlock.Client, key string, opts ...dlock.Option) *dlock.Lease {
	t.Helper()
	l, err := c.Lock(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Lock(%q): %v", key, err)
	}
	return l
}

func mustRelease(t testing.TB, ctx context.Context, l *dlock.Lease) {
	t.Helper()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", l.Key(), err)
	}
}

func (h Harness) checkToken(t testing.TB, tok dlock.Token) {
	t.Helper()
	if h.Fencing && tok == 0 {
		t.Fatalf("token is 0 on a fencing backend")
	}
	if !h.Fencing && tok != 0 {
		t.Fatalf("token %d on a backend declared non-fencing", tok)
	}
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	t.Run("TryLockHeld", h.testTryLockHeld)
	t.Run("NotOwner", h.testNotOwner)
	t.Run("CrashedHolderExpires", h.testCrashedHolderExpires)
	t.Run("TTLExpiresOnServer", h.testTTLExpiresOnServer)
	t.Run("TokensIncrease", h.testTokensIncrease)
	t.Run("Reentrancy", h.testReentrancy)
	t.Run("Resume", h.testResume)
	t.Run("SameOwnerElsewhere", h.testSameOwnerElsewhere)
	t.Run("WaiterDeadlines", h.testWaiterDeadlines)
	t.Run("CancelledWaiter", h.testCancelledWaiter)
	t.Run("CancelDuringHandoff", h.testCancelDuringHandoff)
	t.Run("CancelRace", h.testCancelRace)
	t.Run("Handoff", h.testHandoff)
	t.Run("MutualExclusion", h.testMutualExclusion)
	t.Run("DoneOnServerDrop", h.testDoneOnServerDrop)
	t.Run("Bound", h.testBound)
	t.Run("Keys", h.testKeys)
	t.Run("Do", h.testDo)
	t.Run("CloseReleases", h.testCloseReleases)
	t.Run("Inspect", h.testInspect)
	t.Run("ForceRelease", h.testForceRelease)
	t.Run("HandoffCost", h.testHandoffCost)
	t.Run("Namespaces", h.testNamespaces)
	t.Run("ManyWaiters", h.testManyWaiters)
	if h.FIFO {
		t.Run("FIFO", h.testFIFO)
	}
}

func (h Harness) testTryLockHeld(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l := mustLock(t, ctx, a, key)
	h.checkToken(t, l.Token())
	if _, err := b.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock on a held key: got %v, want ErrLocked", err)
	}
	// A second Lock call on the same client without the owner id must not re-enter.
	if _, err := a.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock from the same client with a new owner: got %v, want ErrLocked", err)
	}
	mustRelease(t, ctx, l)
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
	mustRelease(t, ctx, l2)
}

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
	mustRelease(t, ctx, l)
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
	l := mustLock(t, ctx, c, key)
	mustRelease(t, ctx, l)
}

func (h Harness) testTokensIncrease(t *testing.T) {
	ctx := ctxT(t)
	cs := []*dlock.Client{h.Client(t), h.Client(t)}
	key := Key(t, "k")
	var last dlock.Token
	for i := range 20 {
		l := mustLock(t, ctx, cs[i%2], key)
		h.checkToken(t, l.Token())
		if h.Fencing && l.Token() <= last {
			t.Fatalf("grant %d: token %d not above %d", i, l.Token(), last)
		}
		last = l.Token()
		mustRelease(t, ctx, l)
	}
}

func (h Harness) testReentrancy(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l1 := mustLock(t, ctx, a, key)
	l2 := mustLock(t, ctx, a, key, dlock.WithOwner(l1.Owner()))
	l3, err := a.TryLock(ctx, key, dlock.WithOwner(l1.Owner()))
	if err != nil {
		t.Fatalf("TryLock re-entry: %v", err)
	}
	if l2.Token() != l1.Token() || l3.Token() != l1.Token() {
		t.Fatalf("re-entry tokens %d %d differ from %d", l2.Token(), l3.Token(), l1.Token())
	}
	for i, l := range []*dlock.Lease{l1, l2} {
		mustRelease(t, ctx, l)
		if _, err := b.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("after %d of 3 releases: TryLock = %v, want ErrLocked", i+1, err)
		}
		if l3.Err() != nil {
			t.Fatalf("remaining lease ended early: %v", l3.Err())
		}
	}
	mustRelease(t, ctx, l3)
	l4, err := b.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after the last release: %v", err)
	}
	mustRelease(t, ctx, l4)
}

// A process restarted with a stable owner id resumes its grant explicitly
// (WithResume): same token, and releasing it frees the key.
func (h Harness) testResume(t *testing.T) {
	ctx := ctxT(t)
	before := h.Client(t, dlock.WithOwner("stable-owner-1"))
	key := Key(t, "k")
	l := mustLock(t, ctx, before, key)
	// "Crash": stop renewing without releasing, by resuming from another client.
	after := h.Client(t, dlock.WithOwner("stable-owner-1"))
	l2, err := after.TryLock(ctx, key, dlock.WithResume())
	if err != nil {
		t.Fatalf("resume with the same owner: %v", err)
	}
	if l2.Token() != l.Token() {
		t.Fatalf("resumed token %d, want %d", l2.Token(), l.Token())
	}
	mustRelease(t, ctx, l2)
	other := h.Client(t)
	l3, err := other.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after the resumed release: %v", err)
	}
	mustRelease(t, ctx, l3)
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
	l := mustLock(t, ctx, a, key)
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

	// Two waiters of the owner id while it is free for one of them only.
	holder := mustLock(t, ctx, third, key)
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
	mustRelease(t, ctx, holder)
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
	r, err = third.TryLock(ctx, key, dlock.WithOwner(owner), dlock.WithResume())
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if r.Token() < first.l.Token() {
		t.Fatalf("resumed token %d, below the grant's %d", r.Token(), first.l.Token())
	}
	mustRelease(t, ctx, r)
	if err := first.l.Release(ctx); err == nil {
		t.Fatalf("releasing the taken-over lease succeeded")
	}
}

// A waiting Lock whose ctx ends, whether between attempts or during a request to
// the server, returns an error matching both ErrLocked and ctx.Err(); TryLock's
// matches ctx.Err().
func (h Harness) testWaiterDeadlines(t *testing.T) {
	ctx := ctxT(t)
	holder, c := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l := mustLock(t, ctx, holder, key)
	const n = 60
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			// Deadlines from 0 to 30ms, so many end during a request.
			wctx, cancel := context.WithTimeout(ctx, time.Duration(i)*time.Millisecond/2)
			defer cancel()
			_, err := c.Lock(wctx, key)
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock with a short deadline on a held key = %v, want ErrLocked and DeadlineExceeded", err)
		}
	}
	tctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.TryLock(tctx, key); !errors.Is(err, context.Canceled) {
		t.Errorf("TryLock with a cancelled ctx = %v, want context.Canceled", err)
	}
	mustRelease(t, ctx, l)
}

// A waiter that gives up leaves nothing behind: no queued place blocks the next taker.
func (h Harness) testCancelledWaiter(t *testing.T) {
	ctx := ctxT(t)
	a, b, c := h.Client(t), h.Client(t), h.Client(t)
	key := Key(t, "k")
	l := mustLock(t, ctx, a, key)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := b.Lock(wctx, key)
	cancel()
	if !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled Lock = %v, want ErrLocked and DeadlineExceeded", err)
	}
	mustRelease(t, ctx, l)
	l2, err := c.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after the waiter gave up and the holder released: %v", err)
	}
	if in, ok := c.Backend().(driver.Inspector); ok {
		info, err := in.Inspect(ctx, key)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if info.Waiters > 0 {
			t.Fatalf("Inspect shows %d waiters after the only waiter gave up", info.Waiters)
		}
	}
	mustRelease(t, ctx, l2)
}

// A waiter that gives up just as the holder releases passes the key on, whether the
// release handed the key to it or only woke it: the next waiter gets the key at
// once, long before any grant's TTL could run out.
func (h Harness) testCancelDuringHandoff(t *testing.T) {
	ctx := ctxT(t)
	key := Key(t, "k")
	const ttl = time.Minute // far beyond Wait: a grant left behind fails the test
	holder := h.Open(t)
	defer holder.Close()
	if _, err := holder.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: ttl}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	first := h.Open(t)
	defer first.Close()
	n, ok := first.(driver.Notifier)
	if !ok {
		t.Skip("backend has no Notifier")
	}
	w, err := n.Watch(ctx, key, "first-waiter")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	req := driver.Request{Key: key, Owner: "first-waiter", TTL: ttl, Wait: true, Patience: ttl}
	if _, err := first.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		w.Stop(ctx, false)
		t.Fatalf("waiting Acquire on a held key: %v, want ErrLocked", err)
	}
	// A second waiter, through the core, queues behind the first.
	c := h.Client(t, dlock.WithTTL(ttl))
	got := make(chan error, 1)
	go func() {
		l, err := c.Lock(ctx, key)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	waitQueued(t, ctx, c, key, 2)
	if err := holder.Release(ctx, key, "holder"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The release hands the key to the first waiter (or wakes it); it gives up
	// without acquiring.
	select {
	case <-w.C():
	case <-time.After(2 * time.Second):
	}
	if err := w.Stop(ctx, false); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("second waiter: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("the second waiter did not get the key after the first gave up")
	}
	l, err := h.Client(t).TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after both waiters: %v", err)
	}
	mustRelease(t, ctx, l)
}

// Waiters whose Lock is cancelled at about the moment the holder releases leave
// nothing held: after each round another client gets the key at once.
func (h Harness) testCancelRace(t *testing.T) {
	ctx := ctxT(t)
	key := Key(t, "k")
	const ttl = time.Minute
	a, b, c := h.Client(t, dlock.WithTTL(ttl)), h.Client(t, dlock.WithTTL(ttl)), h.Client(t, dlock.WithTTL(ttl))
	for i := range 10 {
		l := mustLock(t, ctx, a, key)
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan *dlock.Lease, 1)
		go func() {
			l2, _ := b.Lock(wctx, key)
			got <- l2
		}()
		waitQueued(t, ctx, b, key, 1)
		// Release and cancel at once, in either order.
		if i%2 == 0 {
			go cancel()
			mustRelease(t, ctx, l)
		} else {
			go func() { _ = l.Release(ctx) }()
			cancel()
		}
		if l2 := <-got; l2 != nil {
			mustRelease(t, ctx, l2)
		}
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		l3, err := c.Lock(cctx, key)
		ccancel()
		if err != nil {
			t.Fatalf("round %d: the key stayed held after the cancelled waiter returned: %v", i, err)
		}
		mustRelease(t, ctx, l3)
	}
}

// A waiting Lock gets the key when the holder releases it.
func (h Harness) testHandoff(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l := mustLock(t, ctx, a, key)
	got := make(chan *dlock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l2, err := b.Lock(ctx, key)
		if err != nil {
			errc <- err
			return
		}
		got <- l2
	}()
	select {
	case l2 := <-got:
		t.Fatalf("waiter got the key while it was held (token %d)", l2.Token())
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	mustRelease(t, ctx, l)
	select {
	case l2 := <-got:
		if h.Fencing && l2.Token() <= l.Token() {
			t.Fatalf("handoff token %d not above %d", l2.Token(), l.Token())
		}
		mustRelease(t, ctx, l2)
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	}
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

// When the server drops the grant, the holder's renewal is refused and Done closes
// with ErrLeaseLost; a new grant gets a larger token.
func (h Harness) testDoneOnServerDrop(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t, dlock.WithTTL(3*time.Second), dlock.WithRenewInterval(50*time.Millisecond))
	key := Key(t, "k")
	l := mustLock(t, ctx, c, key)
	h.Expire(t, key)
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatalf("Done did not close after the server dropped the grant")
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) || !errors.Is(context.Cause(l.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, cause = %v; want ErrLeaseLost", l.Err(), context.Cause(l.Context()))
	}
	l2 := mustLock(t, ctx, h.Client(t), key)
	if h.Fencing && l2.Token() <= l.Token() {
		t.Fatalf("token after loss %d not above %d", l2.Token(), l.Token())
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of a lost lease = %v, want ErrLeaseLost", err)
	}
	mustRelease(t, ctx, l2)
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
	l := mustLock(t, ctx, c, key)
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
	mustRelease(t, ctx, l)
	if d, ok := bd.Bound(key, l.Owner()); ok {
		t.Fatalf("Bound after release = %v, want no grant", d)
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
		mustRelease(t, ctx, l)
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
	mustRelease(t, ctx, l)
}

func (h Harness) testCloseReleases(t *testing.T) {
	ctx := ctxT(t)
	c, err := dlock.New(h.Open(t), h.Options...)
	if err != nil {
		t.Fatal(err)
	}
	key := Key(t, "k")
	l := mustLock(t, ctx, c, key)
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
	mustRelease(t, ctx, l2)
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
	l := mustLock(t, ctx, c, key)
	info, err := in.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if info.Owner != l.Owner() || dlock.Token(info.Token) != l.Token() || info.TTL <= 0 || info.TTL > l.TTL() {
		t.Fatalf("Inspect = %+v; lease owner %s token %d ttl %v", info, l.Owner(), l.Token(), l.TTL())
	}
	mustRelease(t, ctx, l)
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
	l := mustLock(t, ctx, c, key)
	if err := fr.ForceRelease(ctx, key); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	l2 := mustLock(t, ctx, h.Client(t), key)
	if h.Fencing && l2.Token() <= l.Token() {
		t.Fatalf("token after force release %d not above %d", l2.Token(), l.Token())
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatalf("old holder's Done did not close after a force release")
	}
	mustRelease(t, ctx, l2)
}

// Waiters get the key in the order they started waiting, and the releaser does not
// win it back while others wait.
func (h Harness) testFIFO(t *testing.T) {
	ctx := ctxT(t)
	key := Key(t, "k")
	holder := h.Client(t)
	l := mustLock(t, ctx, holder, key)
	const n = 4
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		c := h.Client(t)
		started := make(chan struct{})
		wg.Go(func() {
			close(started)
			w, err := c.Lock(ctx, key)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			if err := w.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		})
		<-started
		waitQueued(t, ctx, c, key, i+1)
	}
	mustRelease(t, ctx, l)
	// The releaser asks again at once; it must queue behind the waiters.
	l2 := mustLock(t, ctx, holder, key)
	mustRelease(t, ctx, l2)
	wg.Wait()
	close(order)
	i := 0
	for got := range order {
		if got != i {
			t.Fatalf("waiter %d got the key in turn %d", got, i)
		}
		i++
	}
	if i != n {
		t.Fatalf("only %d of %d waiters got the key", i, n)
	}
}

// waitQueued waits until the backend reports n queued waiters, or, without an
// Inspector, gives the waiter time to queue.
func waitQueued(t *testing.T, ctx context.Context, c *dlock.Client, key string, n int) {
	in, ok := c.Backend().(driver.Inspector)
	if !ok {
		time.Sleep(100 * time.Millisecond)
		return
	}
	for {
		info, err := in.Inspect(ctx, key)
		if err == nil && info.Waiters >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiter %d never queued (last Inspect: %+v, %v)", n, info, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
