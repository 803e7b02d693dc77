package zklock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/zklock"
)

// woken waits for a wake-up of w well within the 30 seconds after which a queued
// waiter lists the queue again on its own: a wake-up that only came from that
// recheck would be a lost one.
func woken(t testing.TB, w driver.Waiter, what string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(10 * time.Second):
		t.Fatalf("no wake-up: %s", what)
	}
}

func semReq(key, owner string, limit int, wait bool) driver.Request {
	r := driver.Request{Key: key, Owner: owner, TTL: time.Minute, Limit: limit, Wait: wait}
	if wait {
		r.Patience = time.Minute
	}
	return r
}

func mustQueue(t testing.TB, ctx context.Context, b driver.Backend, req driver.Request, ahead int) {
	t.Helper()
	_, err := b.Acquire(ctx, req)
	var held *driver.HeldError
	if !errors.As(err, &held) || !held.Queued || held.Ahead != ahead {
		t.Fatalf("waiting attempt of %s = %v (%+v), want queued with %d ahead", req.Owner, err, held, ahead)
	}
}

// A waiter queued behind N holders gets the first permit freed, whichever holder
// frees it, and the one behind it then becomes first in line and gets the next:
// each woken by the server, not by the periodic recheck. The grant of the first
// waiter wakes the second (its node's holding mark), which then watches the holders.
func TestSemaphoreWaiterGetsFirstFreedPermit(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, time.Minute)
	hb := open(t, srv.URL("/dlock"))
	defer hb.Close()
	b1 := open(t, srv.URL("/dlock"))
	defer b1.Close()
	b2 := open(t, srv.URL("/dlock"))
	defer b2.Close()
	const key = "sem-first-freed"
	var tokens []uint64
	for _, o := range []string{"a", "b"} {
		g, err := hb.Acquire(ctx, semReq(key, o, 2, false))
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, g.Token)
	}
	w1, err := b1.Watch(ctx, key, "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Stop(ctx, false)
	w2, err := b2.Watch(ctx, key, "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop(ctx, false)
	mustQueue(t, ctx, b1, semReq(key, "w1", 2, true), 0)
	mustQueue(t, ctx, b2, semReq(key, "w2", 2, true), 1)
	// A newcomer does not take a permit ahead of the queue.
	if _, err := hb.Acquire(ctx, semReq(key, "late", 2, false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("newcomer with a full semaphore: %v, want ErrLocked", err)
	}

	// The younger holder releases: the first in line watched it too.
	if err := hb.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	woken(t, w1, "the first in line, after a holder released")
	g1, err := b1.Acquire(ctx, semReq(key, "w1", 2, true))
	if err != nil {
		t.Fatalf("first in line after a release: %v", err)
	}
	if g1.Token <= tokens[1] {
		t.Fatalf("token %d not above %d", g1.Token, tokens[1])
	}
	// The grant's mark wakes the next, now first in line.
	woken(t, w2, "the next in line, after the one ahead took a permit")
	mustQueue(t, ctx, b2, semReq(key, "w2", 2, true), 0)
	select {
	case <-w2.C():
		t.Fatal("a wake-up of the first in line while both permits stay held")
	case <-time.After(200 * time.Millisecond):
	}
	// The older holder releases: the second waiter watches it now.
	if err := hb.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	woken(t, w2, "the first in line, after the oldest holder released")
	g2, err := b2.Acquire(ctx, semReq(key, "w2", 2, true))
	if err != nil {
		t.Fatalf("second waiter after the second release: %v", err)
	}
	if g2.Token <= g1.Token {
		t.Fatalf("token %d not above %d", g2.Token, g1.Token)
	}
	limit, hs, err := hb.Holders(ctx, key)
	if err != nil || limit != 2 || len(hs) != 2 || hs[0].Owner != "w1" || hs[1].Owner != "w2" || hs[0].Waiters != 0 {
		t.Fatalf("Holders = %d, %+v, %v; want w1 and w2 of 2", limit, hs, err)
	}
	for _, x := range []struct {
		b     driver.Backend
		owner string
	}{{b1, "w1"}, {b2, "w2"}} {
		if err := x.b.Release(ctx, key, x.owner); err != nil {
			t.Fatal(err)
		}
	}
}

// Several permits freed at once (a force release of every holder) go to as many
// waiters, in queue order, each with a larger token.
func TestSemaphoreSeveralPermitsAtOnce(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, time.Minute)
	const key, n = "sem-several", 3
	admin := newClient(t, open(t, srv.URL("/dlock")))
	var last dlock.Token
	for range n {
		l, err := newClient(t, open(t, srv.URL("/dlock"))).TryLock(ctx, key, dlock.WithLimit(n))
		if err != nil {
			t.Fatal(err)
		}
		last = max(last, l.Token())
	}
	var wg sync.WaitGroup
	got := make(chan *dlock.Lease, n)
	for range n {
		c := newClient(t, open(t, srv.URL("/dlock")))
		wg.Go(func() {
			l, err := c.Lock(ctx, key, dlock.WithLimit(n))
			if err != nil {
				t.Errorf("waiter: %v", err)
				return
			}
			got <- l
		})
	}
	eventually(t, "three waiters queue", func() bool {
		info, err := admin.Inspect(ctx, key)
		return err == nil && info.Waiters == n
	})
	start := time.Now()
	if err := admin.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(got)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the freed permits were taken only after %v", d)
	}
	for l := range got {
		if l.Token() <= last {
			t.Fatalf("token %d not above the force-released holders' %d", l.Token(), last)
		}
	}
	limit, hs, err := admin.Holders(ctx, key)
	if err != nil || limit != n || len(hs) != n || hs[0].Waiters != 0 {
		t.Fatalf("Holders = %d, %+v, %v; want %d holders", limit, hs, err, n)
	}
}

// An attempt with another limit fails while the key has holders and queued places,
// whatever it asks (a waiting Lock, a TryLock, a mutex), names both limits and
// leaves no node behind; once the key is free the next attempt sets the limit.
func TestSemaphoreLimitMismatchWithWaiters(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	ctx := ctxT(t, time.Minute)
	const key = "sem-mismatch"
	hb := open(t, srv.URL("/dlock"))
	defer hb.Close()
	for _, o := range []string{"a", "b"} {
		if _, err := hb.Acquire(ctx, semReq(key, o, 2, false)); err != nil {
			t.Fatal(err)
		}
	}
	wb := open(t, srv.URL("/dlock"))
	defer wb.Close()
	w, err := wb.Watch(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	mustQueue(t, ctx, wb, semReq(key, "w", 2, true), 0)
	before := len(children(t, raw, key))
	xb := open(t, srv.URL("/dlock"))
	defer xb.Close()
	for _, r := range []driver.Request{semReq(key, "x", 3, false), semReq(key, "x", 3, true), semReq(key, "x", 0, false), semReq(key, "x", 1, true)} {
		_, err := xb.Acquire(ctx, r)
		if !errors.Is(err, driver.ErrLimitMismatch) || !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("limit %d (wait %v) on a key of 2: %v, want ErrLimitMismatch", r.Limit, r.Wait, err)
		}
		if want := "admits 2 holders, the attempt asked for " + string(rune('0'+max(r.Limit, 1))); !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
		if n := len(children(t, raw, key)); n != before {
			t.Fatalf("%d contenders after a mismatched attempt, want %d", n, before)
		}
	}
	// The holders go: the waiter holds, and the limit stays.
	for _, o := range []string{"a", "b"} {
		if err := hb.Release(ctx, key, o); err != nil {
			t.Fatal(err)
		}
	}
	woken(t, w, "the waiter, after the holders released")
	if _, err := wb.Acquire(ctx, semReq(key, "w", 2, true)); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := xb.Acquire(ctx, semReq(key, "x", 3, false)); !errors.Is(err, driver.ErrLimitMismatch) {
		t.Fatalf("limit 3 on a key of 2 with one holder: %v, want ErrLimitMismatch", err)
	}
	if err := wb.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
	// Free: a new limit applies.
	if _, err := xb.Acquire(ctx, semReq(key, "x", 3, false)); err != nil {
		t.Fatalf("limit 3 on a free key: %v", err)
	}
	if limit, hs, err := xb.Holders(ctx, key); err != nil || limit != 3 || len(hs) != 1 {
		t.Fatalf("Holders = %d, %+v, %v; want one holder of 3", limit, hs, err)
	}
	if err := xb.Release(ctx, key, "x"); err != nil {
		t.Fatal(err)
	}
}

// A contender node of an older version (its GUID carries no limit) is a mutex's
// holder: a semaphore attempt fails with ErrLimitMismatch, Holders reports the limit
// 1; and a semaphore's node name keeps the layout an older version parses.
func TestSemaphoreOldFormat(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	ctx := ctxT(t, time.Minute)
	const key = "sem-old"
	b := open(t, srv.URL("/dlock"))
	defer b.Close()
	if _, err := raw.Create("/dlock", nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		t.Fatal(err)
	}
	if _, err := raw.Create(lockPath(key), nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	old, err := raw.Create(lockPath(key)+"/lock-old-"+strings.Repeat("0123456789abcdef", 2)+"-", []byte("30000"),
		zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, semReq(key, "new", 2, false)); !errors.Is(err, driver.ErrLimitMismatch) ||
		!strings.Contains(err.Error(), "admits 1 holders, the attempt asked for 2") {
		t.Fatalf("semaphore attempt on an older version's mutex: %v, want ErrLimitMismatch", err)
	}
	if _, err := b.Acquire(ctx, semReq(key, "new", 1, false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("mutex attempt on an older version's mutex: %v, want ErrLocked", err)
	}
	limit, hs, err := b.Holders(ctx, key)
	if err != nil || limit != 1 || len(hs) != 1 || hs[0].Owner != "old" || hs[0].TTL <= 0 {
		t.Fatalf("Holders = %d, %+v, %v; want the older version's holder", limit, hs, err)
	}
	if err := raw.Delete(old, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, semReq(key, "new", 2, false)); err != nil {
		t.Fatal(err)
	}
	names := children(t, raw, key)
	if len(names) != 1 {
		t.Fatalf("children %v", names)
	}
	// An older version's parser: lock-<owner>-<32 characters>-<10 digits>.
	n := names[0]
	if !strings.HasPrefix(n, "lock-new-") || len(n) != len("lock-new-")+32+1+10 || n[len(n)-11] != '-' || n[len(n)-44] != '-' {
		t.Fatalf("semaphore node %q does not keep the older layout", n)
	}
	if err := b.Release(ctx, key, "new"); err != nil {
		t.Fatal(err)
	}
}

// The holder watch of a semaphore sends when any holder changes or sets its value,
// not only the oldest.
func TestSemaphoreHolderWatch(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, time.Minute)
	const key = "sem-watch"
	wb := open(t, srv.URL("/dlock"))
	defer wb.Close()
	b := open(t, srv.URL("/dlock"))
	defer b.Close()
	hw, err := wb.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Stop()
	for _, o := range []string{"a", "b"} {
		if _, err := b.Acquire(ctx, semReq(key, o, 2, false)); err != nil {
			t.Fatal(err)
		}
		expectNotice(t, ctx, hw, "grant of "+o)
	}
	if err := b.Refresh(ctx, key, "b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.SetValue(ctx, key, "b", []byte("v")); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "the second holder's SetValue")
	_, hs, err := wb.Holders(ctx, key)
	if err != nil || len(hs) != 2 || string(hs[1].Value) != "v" || hs[0].Value != nil {
		t.Fatalf("Holders = %+v, %v; want the second with its value", hs, err)
	}
	// Another connection of the owner id sets the value too.
	if err := wb.SetValue(ctx, key, "b", []byte("w")); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "the second holder's SetValue through another connection")
	if err := b.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "the second holder's release")
	if err := b.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "the first holder's release")
}

var _ driver.Semaphorer = (*zklock.Backend)(nil)

// Under churn (holders releasing out of grant order, waiters queueing behind),
// every Lock gets its permit long before the periodic recheck of a queued place
// (30s). A smoke test: TestSemaphoreWaiterGetsFirstFreedPermit is the one that
// fails when a grant does not wake the place behind it.
func TestSemaphoreNoLostWakeUp(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, 2*time.Minute)
	const key, clients, rounds, n = "sem-churn", 8, 8, 3
	var wg sync.WaitGroup
	for i := range clients {
		c := newClient(t, open(t, srv.URL("/dlock")))
		wg.Go(func() {
			for r := range rounds {
				start := time.Now()
				l, err := c.Lock(ctx, key, dlock.WithLimit(n))
				if err != nil {
					t.Errorf("Lock: %v", err)
					return
				}
				if d := time.Since(start); d > 15*time.Second {
					t.Errorf("a Lock waited %v: a lost wake-up", d)
				}
				// Holders release out of grant order.
				time.Sleep(time.Duration((i*7+r*3)%5) * 5 * time.Millisecond)
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// An owner id that holds a permit through one client is refused another through a
// second client, with free permits and also waiting: no place is kept, and the
// waiter is woken when the first client's grant goes.
func TestSemaphoreSameOwnerElsewhere(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	ctx := ctxT(t, time.Minute)
	const key, owner = "sem-same-owner", "shared"
	a := open(t, srv.URL("/dlock"))
	defer a.Close()
	b := open(t, srv.URL("/dlock"))
	defer b.Close()
	if _, err := a.Acquire(ctx, semReq(key, owner, 3, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, semReq(key, owner, 3, false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryLock of the same owner id elsewhere: %v, want ErrLocked", err)
	}
	w, err := b.Watch(ctx, key, owner)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx, false)
	_, err = b.Acquire(ctx, semReq(key, owner, 3, true))
	var held *driver.HeldError
	if !errors.As(err, &held) || held.Queued {
		t.Fatalf("waiting attempt of the same owner id elsewhere: %v, want a HeldError without a place", err)
	}
	if n := len(children(t, raw, key)); n != 1 {
		t.Fatalf("%d contenders after the refused attempts, want 1", n)
	}
	select {
	case <-w.C():
		t.Fatal("the refused waiter was woken while the other grant holds")
	case <-time.After(200 * time.Millisecond):
	}
	if err := a.Release(ctx, key, owner); err != nil {
		t.Fatal(err)
	}
	woken(t, w, "the refused waiter, after the other grant went")
	if _, err := b.Acquire(ctx, semReq(key, owner, 3, true)); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, owner); err != nil {
		t.Fatal(err)
	}
}
