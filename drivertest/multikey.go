package drivertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// setKey returns Key(t, name) after "{", a tag of t and "}": the keys of one test
// share the part up to their first '}', so that a backend that takes only some
// sets in one step (driver.SetChecker: on Redis Cluster, keys of one hash slot,
// which such a common "{...}" part gives) takes the suite's sets in one. The tag
// keeps the keys in the order of their names.
func setKey(t testing.TB, name string) string {
	return "{" + strings.ReplaceAll(t.Name(), "/", ".") + "}" + Key(t, name)
}

// MultiKey: a set is taken all or nothing: a set with one key held is refused
// naming that key, and the free keys stay free; a free set is granted whole, with
// a rising token per key and the set's owner holding each key; duplicates count
// once; Release frees every key and a second Release says ErrReleased.
func (h Harness) testMultiKey(t *testing.T) {
	ctx := ctxT(t)
	c, other := h.Client(t), h.Client(t)
	a, b, z := setKey(t, "a"), setKey(t, "b"), setKey(t, "c")
	hb := MustLock(t, ctx, other, b)
	_, err := c.TryLockAll(ctx, []string{z, b, a})
	if !errors.Is(err, dlock.ErrLocked) || !strings.Contains(err.Error(), b) {
		t.Fatalf("TryLockAll with %q held: %v, want ErrLocked naming it", b, err)
	}
	for _, k := range []string{a, z} {
		l, err := other.TryLock(ctx, k)
		if err != nil {
			t.Fatalf("%q after a refused TryLockAll: %v (left held)", k, err)
		}
		MustRelease(t, ctx, l)
	}
	MustRelease(t, ctx, hb)
	m, err := c.TryLockAll(ctx, []string{z, b, a, b})
	if err != nil {
		t.Fatalf("TryLockAll of a free set: %v", err)
	}
	if got := m.Keys(); !slices.Equal(got, []string{a, b, z}) {
		t.Fatalf("Keys = %q, want the three keys sorted once each", got)
	}
	toks := m.Tokens()
	for i, k := range m.Keys() {
		h.checkToken(t, toks[i])
		if m.Token(k) != toks[i] {
			t.Fatalf("Token(%q) = %d, Tokens()[%d] = %d", k, m.Token(k), i, toks[i])
		}
		if _, err := other.TryLock(ctx, k); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("TryLock(%q) while the set is held: %v, want ErrLocked", k, err)
		}
		if info, err := c.Inspect(ctx, k); err == nil && info.Owner != m.Owner() {
			t.Fatalf("Inspect(%q).Owner = %q, want the set's %q", k, info.Owner, m.Owner())
		}
	}
	if h.Fencing && m.Token(b) <= hb.Token() {
		t.Fatalf("token of %q in the set %d not above the earlier holder's %d", b, m.Token(b), hb.Token())
	}
	if m.Err() != nil || m.Context().Err() != nil {
		t.Fatalf("a held set: Err = %v, Context().Err() = %v", m.Err(), m.Context().Err())
	}
	if err := m.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := m.Release(ctx); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("second Release: %v, want ErrReleased", err)
	}
	if !errors.Is(context.Cause(m.Context()), dlock.ErrReleased) {
		t.Fatalf("cause after Release: %v", context.Cause(m.Context()))
	}
	m2, err := other.TryLockAll(ctx, []string{a, z, b})
	if err != nil {
		t.Fatalf("TryLockAll after Release: %v", err)
	}
	if h.Fencing && (m2.Token(a) <= m.Token(a) || m2.Token(z) <= m.Token(z)) {
		t.Fatalf("tokens %v not above the earlier set's %v", m2.Tokens(), m.Tokens())
	}
	if err := m2.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := c.LockAll(ctx, nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("LockAll of no keys: %v, want ErrInvalid", err)
	}
}

// MultiKeyNoDeadlock: clients taking overlapping sets, each listing its keys in its
// own order, all finish, and never two hold one key at once.
func (h Harness) testMultiKeyNoDeadlock(t *testing.T) {
	ctx := ctxT(t)
	keys := make([]string, 4)
	for i := range keys {
		keys[i] = setKey(t, fmt.Sprint("k", i))
	}
	inside := make([]atomic.Int32, len(keys))
	const workers, rounds = 6, 12
	var wg sync.WaitGroup
	for w := range workers {
		c := h.Client(t)
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range rounds {
				idx := r.Perm(len(keys))[:2+r.IntN(len(keys)-1)]
				set := make([]string, len(idx))
				for i, j := range idx {
					set[i] = keys[j]
				}
				err := c.DoAll(ctx, set, func(ctx context.Context, m *dlock.MultiLease) error {
					for _, j := range idx {
						if n := inside[j].Add(1); n != 1 {
							t.Errorf("%d holders of %q at once", n, keys[j])
						}
					}
					time.Sleep(2 * time.Millisecond)
					for _, j := range idx {
						inside[j].Add(-1)
					}
					return nil
				})
				if err != nil {
					t.Errorf("worker %d: DoAll(%q): %v", w, set, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// MultiKeyCancel: a LockAll that gives up while part of its set is held leaves
// nothing behind: the keys it took are free again and no queued place of it holds
// up the next caller.
func (h Harness) testMultiKeyCancel(t *testing.T) {
	ctx := ctxT(t)
	c, holder, third := h.Client(t), h.Client(t), h.Client(t)
	a, b := setKey(t, "a"), setKey(t, "b")
	hb := MustLock(t, ctx, holder, b)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.LockAll(wctx, []string{b, a})
	cancel()
	if !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockAll past its deadline: %v, want ErrLocked and DeadlineExceeded", err)
	}
	la, err := third.TryLock(ctx, a)
	if err != nil {
		t.Fatalf("TryLock(%q) after the cancelled LockAll: %v", a, err)
	}
	MustRelease(t, ctx, hb)
	lb, err := third.TryLock(ctx, b)
	if err != nil {
		t.Fatalf("TryLock(%q) after its release, a cancelled LockAll having waited: %v", b, err)
	}
	MustRelease(t, ctx, la)
	MustRelease(t, ctx, lb)
}

// MultiKeyLoss: when the server drops one key's grant, the set's context ends
// with ErrLeaseLost and Release says so; the other keys are freed.
func (h Harness) testMultiKeyLoss(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t, dlock.WithTTL(3*time.Second), dlock.WithRenewInterval(50*time.Millisecond))
	a, b := setKey(t, "a"), setKey(t, "b")
	m, err := c.LockAll(ctx, []string{a, b})
	if err != nil {
		t.Fatalf("LockAll: %v", err)
	}
	h.Expire(t, b)
	select {
	case <-m.Done():
	case <-ctx.Done():
		t.Fatal("the set's Done did not close after the server dropped one key's grant")
	}
	if !errors.Is(m.Err(), dlock.ErrLeaseLost) || !errors.Is(context.Cause(m.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, cause = %v; want ErrLeaseLost", m.Err(), context.Cause(m.Context()))
	}
	if err := m.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of a set with a lost key = %v, want ErrLeaseLost", err)
	}
	l, err := h.Client(t).TryLock(ctx, a)
	if err != nil {
		t.Fatalf("TryLock(%q) after the set's Release: %v", a, err)
	}
	MustRelease(t, ctx, l)
}

// BenchMultiKey compares taking n keys as one set (LockAll, then Release) with
// taking them one Lock per key, in key order, then releasing each, on one client.
// It reports microseconds per set for both, and their ratio.
func BenchMultiKey(b *testing.B, h Harness, n int) {
	b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
		ctx := context.Background()
		c := h.Client(b)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = setKey(b, fmt.Sprint("k", i))
		}
		_, atomicSet := c.Backend().(driver.MultiAcquirer)
		held := make([]*dlock.Lease, n)
		var all, each time.Duration
		b.ResetTimer()
		for i := range b.N {
			if i%2 == 0 { // alternate, so drift in the server's speed hits both
				all += timed(b, func() error {
					m, err := c.LockAll(ctx, keys)
					if err != nil {
						return err
					}
					return m.Release(ctx)
				})
				continue
			}
			each += timed(b, func() error {
				for j, k := range keys {
					l, err := c.Lock(ctx, k)
					if err != nil {
						return err
					}
					held[j] = l
				}
				for _, l := range held {
					if err := l.Release(ctx); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if b.N < 2 {
			return
		}
		perAll := float64(all.Microseconds()) / float64((b.N+1)/2)
		perEach := float64(each.Microseconds()) / float64(b.N/2)
		b.ReportMetric(perAll, "µs/set")
		b.ReportMetric(perEach, "µs/per-key")
		b.ReportMetric(perAll/perEach, "set/per-key")
		if !atomicSet {
			b.Logf("%s: no atomic multi-key step; the set is taken key by key", b.Name())
		}
	})
}

func timed(b *testing.B, fn func() error) time.Duration {
	start := time.Now()
	if err := fn(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// AcquireAll checks a driver.MultiAcquirer directly: a set with a key held, or with
// a key reserved for a queued place, is refused naming that key and changes
// nothing; a free set is granted whole, each key's grant with a rising token that
// Refresh, Inspect and Release treat like any other.
func (h Harness) testAcquireAll(t *testing.T) {
	ctx := ctxT(t)
	be := h.Open(t)
	defer be.Close()
	multi, ok := be.(driver.MultiAcquirer)
	if !ok {
		t.Skip("backend is not a MultiAcquirer")
	}
	a, b, z := setKey(t, "a"), setKey(t, "b"), setKey(t, "c")
	const ttl = 10 * time.Second
	set := func(owner string, keys ...string) []driver.Request {
		reqs := make([]driver.Request, len(keys))
		for i, k := range keys {
			reqs[i] = driver.Request{Key: k, Owner: owner, TTL: ttl}
		}
		return reqs
	}
	gb, err := be.Acquire(ctx, driver.Request{Key: b, Owner: "x", TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire(%q): %v", b, err)
	}
	if _, err := multi.AcquireAll(ctx, set("y", a, b, z)); !errors.Is(err, driver.ErrLocked) || !strings.Contains(err.Error(), b) {
		t.Fatalf("AcquireAll with %q held: %v, want ErrLocked naming it", b, err)
	}
	for _, k := range []string{a, z} {
		if _, err := be.Acquire(ctx, driver.Request{Key: k, Owner: "z", TTL: ttl}); err != nil {
			t.Fatalf("Acquire(%q) after a refused AcquireAll: %v (left held)", k, err)
		}
		if err := be.Release(ctx, k, "z"); err != nil {
			t.Fatalf("Release(%q): %v", k, err)
		}
	}
	if _, ok := be.(driver.Notifier); ok {
		// A queued place on b: when x releases, b is the waiter's (or reserved
		// for it), not the set's.
		waiter := h.Open(t)
		defer waiter.Close()
		w, err := waiter.(driver.Notifier).Watch(ctx, b, "w")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		if _, err := waiter.Acquire(ctx, driver.Request{Key: b, Owner: "w", TTL: ttl, Wait: true, Patience: ttl}); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("queued Acquire: %v, want ErrLocked", err)
		}
		if err := be.Release(ctx, b, "x"); err != nil {
			t.Fatalf("Release(%q): %v", b, err)
		}
		if _, err := multi.AcquireAll(ctx, set("y", a, b)); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("AcquireAll with a waiter queued on %q: %v, want ErrLocked", b, err)
		}
		if err := w.Stop(ctx, false); err != nil {
			t.Fatalf("Stop: %v", err)
		}
	} else if err := be.Release(ctx, b, "x"); err != nil {
		t.Fatalf("Release(%q): %v", b, err)
	}
	var gs []driver.Grant
	deadline := time.Now().Add(Wait)
	for {
		// A withdrawn place may take a moment to pass on (a handed grant given back).
		if gs, err = multi.AcquireAll(ctx, set("y", a, b, z)); !errors.Is(err, driver.ErrLocked) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || len(gs) != 3 {
		t.Fatalf("AcquireAll of a free set: %d grants, %v", len(gs), err)
	}
	for i, k := range []string{a, b, z} {
		h.checkToken(t, dlock.Token(gs[i].Token))
		if err := be.Refresh(ctx, k, "y", ttl); err != nil {
			t.Fatalf("Refresh(%q): %v", k, err)
		}
		if in, ok := be.(driver.Inspector); ok {
			if info, err := in.Inspect(ctx, k); err != nil || info.Owner != "y" || info.Token != gs[i].Token {
				t.Fatalf("Inspect(%q) = %+v, %v; want owner y, token %d", k, info, err, gs[i].Token)
			}
		}
	}
	if h.Fencing && gs[1].Token <= gb.Token {
		t.Fatalf("token of %q %d not above the earlier grant's %d", b, gs[1].Token, gb.Token)
	}
	if _, err := multi.AcquireAll(ctx, set("v", z, a)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("AcquireAll of a held set: %v, want ErrLocked", err)
	}
	for _, k := range []string{a, b, z} {
		if err := be.Release(ctx, k, "y"); err != nil {
			t.Fatalf("Release(%q): %v", k, err)
		}
		if err := be.Release(ctx, k, "y"); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("second Release(%q): %v, want ErrNotHeld", k, err)
		}
	}
}
