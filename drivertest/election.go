package drivertest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// observeEvery is the Observe interval of the suite's clients: how late a backend
// that cannot watch holders sees a change.
const observeEvery = 50 * time.Millisecond

// Values: a grant carries its request's value, also when the key is handed to a
// queued place; SetValue compares the owner; the next grant has its own value.
func (h Harness) testValues(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	v, ok := a.Backend().(driver.Valuer)
	if !ok {
		t.Skip("backend has no Valuer")
	}
	key := Key(t, "k")
	la, err := a.Campaign(ctx, key, []byte("addr-a"))
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	h.wantLeader(t, a, key, la.Owner(), la.Token(), "addr-a")
	if err := la.Proclaim(ctx, []byte("addr-a2")); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	h.wantLeader(t, a, key, la.Owner(), la.Token(), "addr-a2")
	if err := v.SetValue(ctx, key, "not-the-owner", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue by another owner = %v, want ErrNotHeld", err)
	}
	h.wantLeader(t, a, key, la.Owner(), la.Token(), "addr-a2")

	// A queued candidate's value comes with the grant handed to it.
	got := make(chan *dlock.Leadership, 1)
	go func() {
		lb, err := b.Campaign(ctx, key, []byte("addr-b"))
		if err != nil {
			t.Errorf("second Campaign: %v", err)
		}
		got <- lb
	}()
	waitQueued(t, ctx, a, key, 1)
	if err := la.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatalf("second Resign: %v", err)
	}
	if err := la.Proclaim(ctx, []byte("late")); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("Proclaim after Resign = %v, want ErrReleased", err)
	}
	lb := <-got
	if lb == nil {
		t.FailNow()
	}
	if h.Fencing && lb.Token() <= la.Token() {
		t.Fatalf("new leader's epoch %d not above %d", lb.Token(), la.Token())
	}
	h.wantLeader(t, a, key, lb.Owner(), lb.Token(), "addr-b")
	if err := lb.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if _, err := a.Leader(ctx, key); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader after the last Resign = %v, want ErrNoLeader", err)
	}
	// A plain lock of the name has no value, not the last leader's.
	l := MustLock(t, ctx, b, key)
	h.wantLeader(t, a, key, l.Owner(), l.Token(), "")
	h.Expire(t, key)
	if _, err := a.Leader(ctx, key); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader after expiry = %v, want ErrNoLeader", err)
	}
	_ = l.Release(ctx)
}

// wantLeader checks what Client.Leader reads.
func (h Harness) wantLeader(t *testing.T, c *dlock.Client, key, owner string, tok dlock.Token, value string) {
	t.Helper()
	ld, err := c.Leader(ctxT(t), key)
	if err != nil {
		t.Fatalf("Leader: %v", err)
	}
	if ld.Owner != owner || ld.Token != tok || !bytes.Equal(ld.Value, []byte(value)) || !ld.Exists() {
		t.Fatalf("Leader = owner %s token %d value %q; want %s, %d, %q", ld.Owner, ld.Token, ld.Value, owner, tok, value)
	}
	if ld.TTL < 0 || ld.TTL > time.Minute {
		t.Fatalf("Leader TTL %v", ld.TTL)
	}
}

// HolderWatch: a watch is told of every change of holder or value made after it
// started.
func (h Harness) testHolderWatch(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	hw, ok := c.Backend().(driver.HolderWatcher)
	if !ok {
		t.Skip("backend has no HolderWatcher")
	}
	key := Key(t, "k")
	w, err := hw.WatchHolder(ctx, key)
	if err != nil {
		t.Fatalf("WatchHolder: %v", err)
	}
	defer w.Stop()
	other := h.Open(t)
	defer other.Close()
	notified := func(what string) {
		t.Helper()
		select {
		case <-w.C():
		case <-time.After(Wait):
			t.Fatalf("no notification after %s", what)
		}
		// Drain what the same change may have sent twice, so the next step waits
		// for a notification of its own.
		time.Sleep(20 * time.Millisecond)
		select {
		case <-w.C():
		default:
		}
	}
	req := driver.Request{Key: key, Owner: "watch-a", TTL: time.Minute}
	if _, err := other.Acquire(ctx, req); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	notified("a grant")
	if v, ok := other.(driver.Valuer); ok {
		if err := v.SetValue(ctx, key, "watch-a", []byte("v")); err != nil {
			t.Fatalf("SetValue: %v", err)
		}
		notified("SetValue")
	}
	if err := other.Release(ctx, key, "watch-a"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	notified("a release")
	if fr, ok := other.(driver.ForceReleaser); ok {
		req.Owner = "watch-b"
		if _, err := other.Acquire(ctx, req); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		notified("a grant")
		if err := fr.ForceRelease(ctx, key); err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		notified("a force release")
	}
}

// Observe: observers see every change in order, with rising tokens, and "no
// leader" when the last leader resigns or its grant expires.
func (h Harness) testObserve(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	key := Key(t, "k")
	octx, stop := context.WithCancel(ctx)
	defer stop()
	obs, err := h.Client(t, dlock.WithObserveInterval(observeEvery)).Observe(octx, key)
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	_, values := a.Backend().(driver.Valuer)
	val := func(s string) []byte {
		if !values {
			return nil
		}
		return []byte(s)
	}
	var top dlock.Token
	next := func(what string, want func(dlock.Leader) bool) dlock.Leader {
		t.Helper()
		for {
			select {
			case ld, ok := <-obs:
				if !ok {
					t.Fatalf("Observe closed while waiting for %s", what)
				}
				if ld.Exists() && h.Fencing && ld.Token < top {
					t.Fatalf("observed token %d after %d", ld.Token, top)
				}
				top = max(top, ld.Token)
				if want(ld) {
					return ld
				}
			case <-time.After(Wait):
				t.Fatalf("not observed: %s", what)
			}
		}
	}
	none := func(ld dlock.Leader) bool { return !ld.Exists() }
	next("no leader at first", none)
	la, err := a.Campaign(ctx, key, val("a"))
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	is := func(l *dlock.Leadership, v string) func(dlock.Leader) bool {
		return func(ld dlock.Leader) bool {
			return ld.Owner == l.Owner() && ld.Token == l.Token() && bytes.Equal(ld.Value, val(v))
		}
	}
	next("the first leader", is(la, "a"))
	if values {
		if err := la.Proclaim(ctx, val("a2")); err != nil {
			t.Fatalf("Proclaim: %v", err)
		}
		next("the proclaimed value", is(la, "a2"))
	}
	got := make(chan *dlock.Leadership, 1)
	go func() {
		lb, err := b.Campaign(ctx, key, val("b"))
		if err != nil {
			t.Errorf("second Campaign: %v", err)
		}
		got <- lb
	}()
	waitQueued(t, ctx, a, key, 1)
	if err := la.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	lb := <-got
	if lb == nil {
		t.FailNow()
	}
	next("the next leader", is(lb, "b"))
	if err := lb.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	next("no leader after the last Resign", none)
	lc, err := a.Campaign(ctx, key, val("c"))
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	next("a third leader", is(lc, "c"))
	h.Expire(t, key) // a crashed leader
	next("no leader after expiry", none)
	stop()
	for range obs { // closed when its context ends
	}
	_ = lc.Resign(ctx)
}

// ResignRetry: a Resign whose request fails ends the leadership locally, and
// Resign again frees the name on the server.
func (h Harness) testResignRetry(t *testing.T) {
	ctx := ctxT(t)
	a, b := h.Client(t), h.Client(t)
	key := Key(t, "k")
	l, err := a.Campaign(ctx, key, nil)
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	first := l.Resign(dead)
	if l.Err() == nil {
		t.Fatalf("leadership still on after Resign (err %v)", first)
	}
	if first == nil {
		// The backend released despite the cancelled context: nothing to retry.
		t.Log("Resign with a cancelled context succeeded")
	} else if _, err := b.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("after a failed Resign (%v) the name should still be held on the server; TryLock = %v", first, err)
	}
	if err := l.Resign(ctx); err != nil {
		t.Fatalf("Resign again: %v", err)
	}
	if err := l.Resign(ctx); err != nil {
		t.Fatalf("Resign a third time: %v", err)
	}
	lb, err := b.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after Resign: %v", err)
	}
	MustRelease(t, ctx, lb)
}
