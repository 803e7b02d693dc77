package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
)

// Tests of semaphores (Limit > 1) at the driver level, for what the conformance
// suite does not reach: queued places alone keeping a limit, handoff of several
// permits, FIFO behind N holders, values and watches per holder, and the state a
// mutex client of an earlier version leaves.

func semReq(key, owner string, limit int) driver.Request {
	return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Limit: limit}
}

func mustAcquire(t *testing.T, b *Backend, req driver.Request) driver.Grant {
	t.Helper()
	g, err := b.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("Acquire %s of %q (limit %d): %v", req.Owner, req.Key, req.Limit, err)
	}
	return g
}

// semQueue registers a wait of owner on a semaphore key held to its limit and
// makes the waiting attempt that queues it.
func semQueue(t *testing.T, b *Backend, key, owner string, limit int) *waiter {
	t.Helper()
	ctx := context.Background()
	w, err := b.Watch(ctx, key, owner)
	if err != nil {
		t.Fatal(err)
	}
	req := semReq(key, owner, limit)
	req.Wait, req.Patience = true, time.Minute
	if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("waiting Acquire of %s: %v, want ErrLocked", owner, err)
	}
	return w.(*waiter)
}

// takeHanded returns the grant handed to w, failing if there is none.
func takeHanded(t *testing.T, b *Backend, w *waiter, limit int) driver.Grant {
	t.Helper()
	wake(t, w)
	req := semReq(w.key, w.owner, limit)
	req.Wait, req.Patience = true, time.Minute
	g, err := b.Acquire(context.Background(), req)
	if err != nil || g.Age <= 0 {
		t.Fatalf("%s's Acquire after the handoff = %+v, %v; want a handed grant", w.owner, g, err)
	}
	if err := w.Stop(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	return g
}

func wantMismatch(t *testing.T, err error, have, want int) {
	t.Helper()
	if !errors.Is(err, driver.ErrLimitMismatch) || !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("err = %v, want ErrLimitMismatch", err)
	}
	msg := err.Error()
	for _, s := range []string{"redislock", `"k"`, "limit " + strconv.Itoa(have), "request " + strconv.Itoa(want)} {
		if !strings.Contains(msg, s) {
			t.Fatalf("error %q does not name %s", msg, s)
		}
	}
}

func holderOwners(t *testing.T, b *Backend, key string) (int, []string) {
	t.Helper()
	limit, hs, err := b.Holders(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, h := range hs {
		owners = append(owners, h.Owner)
	}
	return limit, owners
}

// Queued places keep the key's limit when no one holds it: a mutex's waiters
// refuse a semaphore, and a semaphore's waiters a mutex, changing nothing.
func TestSemaphoreLimitKeptByQueuedPlaces(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b, other := openBackend(t, srv), openBackend(t, srv)
	rdb := b.Client()

	// A mutex whose holder expired, with a waiter still queued.
	mustAcquire(t, b, semReq("k", "holder", 0))
	w := semQueue(t, other, "k", "waiter", 0)
	if err := rdb.Del(ctx, b.LockKey("k")).Err(); err != nil { // the holder's grant expires
		t.Fatal(err)
	}
	_, err := b.Acquire(ctx, semReq("k", "sem", 3))
	wantMismatch(t, err, 1, 3)
	if n, err := rdb.Exists(ctx, b.LockKey("k")).Result(); err != nil || n != 0 {
		t.Fatalf("the refused attempt left a lock key (%d, %v)", n, err)
	}
	// The waiter still gets the key.
	req := semReq("k", "waiter", 0)
	req.Wait, req.Patience = true, time.Minute
	if _, err := other.Acquire(ctx, req); err != nil {
		t.Fatalf("the mutex waiter's next attempt: %v", err)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, "k", "waiter"); err != nil {
		t.Fatal(err)
	}

	// A semaphore of 2 whose holders' grants expired, with a waiter queued.
	short := semReq("k", "a", 2)
	short.TTL = 100 * time.Millisecond
	mustAcquire(t, b, short)
	short.Owner = "b"
	mustAcquire(t, b, short)
	w = semQueue(t, other, "k", "w", 2)
	time.Sleep(200 * time.Millisecond)
	_, err = b.Acquire(ctx, semReq("k", "m", 0))
	wantMismatch(t, err, 2, 1)
	_, err = b.Acquire(ctx, semReq("k", "m", 3))
	wantMismatch(t, err, 2, 3)
	// A newcomer of the same limit does not pass the queued place.
	if _, owners := holderOwners(t, b, "k"); len(owners) != 0 {
		t.Fatalf("holders %v after every grant expired", owners)
	}
	mustAcquire(t, b, semReq("k", "newcomer", 2)) // hands the first permit to w
	if g := takeHanded(t, other, w, 2); g.Token == 0 {
		t.Fatal("no token")
	}
	if limit, owners := holderOwners(t, b, "k"); limit != 2 || strings.Join(owners, ",") != "w,newcomer" {
		t.Fatalf("Holders = %d %v, want 2 [w newcomer]", limit, owners)
	}
	for _, o := range []string{"w", "newcomer"} {
		if err := b.Release(ctx, "k", o); err != nil {
			t.Fatal(err)
		}
	}
	// Free: nothing left behind, and any limit applies.
	if n, err := rdb.Exists(ctx, b.LockKey("k")).Result(); err != nil || n != 0 {
		t.Fatalf("a free semaphore left its hash (%d, %v)", n, err)
	}
	mustAcquire(t, b, semReq("k", "m", 0))
	_, err = b.Acquire(ctx, semReq("k", "s", 2))
	wantMismatch(t, err, 1, 2)
}

// A release that frees several permits at once (a force release) hands one to each
// of as many queued places, in order; a permit left over goes to a newcomer.
func TestSemaphoreHandsSeveralPermits(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b := openBackend(t, srv)
	ws := []*Backend{openBackend(t, srv), openBackend(t, srv)}
	var last uint64
	for _, o := range []string{"a", "b", "c"} {
		last = mustAcquire(t, b, semReq("k", o, 3)).Token
	}
	w1 := semQueue(t, ws[0], "k", "w1", 3)
	w2 := semQueue(t, ws[1], "k", "w2", 3)
	if _, err := b.Acquire(ctx, semReq("k", "late", 3)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a fourth holder: %v, want ErrLocked", err)
	}
	if err := b.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	g1, g2 := takeHanded(t, ws[0], w1, 3), takeHanded(t, ws[1], w2, 3)
	if g1.Token <= last || g2.Token <= g1.Token {
		t.Fatalf("handed tokens %d, %d after %d: want rising", g1.Token, g2.Token, last)
	}
	g3 := mustAcquire(t, b, semReq("k", "late", 3))
	if g3.Token <= g2.Token {
		t.Fatalf("token %d not above %d", g3.Token, g2.Token)
	}
	if limit, owners := holderOwners(t, b, "k"); limit != 3 || strings.Join(owners, ",") != "w1,w2,late" {
		t.Fatalf("Holders = %d %v, want 3 [w1 w2 late]", limit, owners)
	}
	info, err := b.Inspect(ctx, "k")
	if err != nil || info.Owner != "w1" || info.Token != g1.Token {
		t.Fatalf("Inspect = %+v, %v; want the oldest holder w1", info, err)
	}
}

// A waiter queued behind N holders gets the first permit freed, the one behind it
// the next; a newcomer meanwhile gets none. A waiter that gives up after a permit
// was handed to it passes the permit on.
func TestSemaphoreFIFOBehindHolders(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b := openBackend(t, srv)
	c1, c2, c3 := openBackend(t, srv), openBackend(t, srv), openBackend(t, srv)
	mustAcquire(t, b, semReq("k", "a", 2))
	mustAcquire(t, b, semReq("k", "b", 2))
	w1 := semQueue(t, c1, "k", "w1", 2)
	w2 := semQueue(t, c2, "k", "w2", 2)
	w3 := semQueue(t, c3, "k", "w3", 2)
	if err := b.Release(ctx, "k", "b"); err != nil {
		t.Fatal(err)
	}
	takeHanded(t, c1, w1, 2)
	if _, err := b.Acquire(ctx, semReq("k", "newcomer", 2)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a newcomer with places queued: %v, want ErrLocked", err)
	}
	req := semReq("k", "w2", 2)
	req.Wait, req.Patience = true, time.Minute
	if _, err := c2.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the second waiter before a second release: %v, want ErrLocked", err)
	}
	if err := b.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	wake(t, w2)
	// w2 gives up without taking it: the permit goes on to w3.
	if err := w2.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	takeHanded(t, c3, w3, 2)
	if _, owners := holderOwners(t, b, "k"); strings.Join(owners, ",") != "w1,w3" {
		t.Fatalf("holders %v, want [w1 w3]", owners)
	}
}

// Each holder has its own grant: Refresh, SetValue and Release act on it alone,
// re-entry returns its own token, and the holder channel tells of each change.
func TestSemaphorePerHolder(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b := openBackend(t, srv)
	hw, err := b.WatchHolder(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Stop()
	changed := func(what string) {
		t.Helper()
		select {
		case <-hw.C():
		case <-time.After(5 * time.Second):
			t.Fatalf("no holder notification after %s", what)
		}
	}
	ga := mustAcquire(t, b, semReq("k", "a", 2))
	changed("a grant")
	req := semReq("k", "b", 2)
	req.Value = []byte("b's value")
	gb := mustAcquire(t, b, req)
	changed("a grant")
	if _, err := b.Acquire(ctx, semReq("k", "a", 2)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a second attempt of a holder without Reenter: %v, want ErrLocked", err)
	}
	re := semReq("k", "a", 2)
	re.Reenter = true
	if g := mustAcquire(t, b, re); g.Token != ga.Token {
		t.Fatalf("re-entry token %d, want a's %d", g.Token, ga.Token)
	}
	if err := b.SetValue(ctx, "k", "a", []byte("a's value")); err != nil {
		t.Fatal(err)
	}
	changed("SetValue")
	if err := b.SetValue(ctx, "k", "nobody", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue of a non-holder: %v, want ErrNotHeld", err)
	}
	if err := b.Refresh(ctx, "k", "b", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx, "k", "nobody", time.Hour); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh of a non-holder: %v, want ErrNotHeld", err)
	}
	_, hs, err := b.Holders(ctx, "k")
	if err != nil || len(hs) != 2 {
		t.Fatalf("Holders: %v, %v", hs, err)
	}
	if hs[0].Owner != "a" || string(hs[0].Value) != "a's value" || hs[0].Token != ga.Token || hs[0].TTL > time.Minute {
		t.Fatalf("holder 0 = %+v", hs[0])
	}
	if hs[1].Owner != "b" || string(hs[1].Value) != "b's value" || hs[1].Token != gb.Token || hs[1].TTL <= time.Minute {
		t.Fatalf("holder 1 = %+v (refreshed to an hour)", hs[1])
	}
	if err := b.SetValue(ctx, "k", "b", nil); err != nil {
		t.Fatal(err)
	}
	changed("SetValue")
	if err := b.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	changed("a release")
	if err := b.Release(ctx, "k", "a"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("a second release: %v, want ErrNotHeld", err)
	}
	info, err := b.Inspect(ctx, "k")
	if err != nil || info.Owner != "b" || info.Value != nil || info.Token != gb.Token {
		t.Fatalf("Inspect = %+v, %v; want b without a value", info, err)
	}
	if err := b.Release(ctx, "k", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect of a free key: %v, want ErrNotHeld", err)
	}
	if err := b.ForceRelease(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("ForceRelease of a free key: %v, want ErrNotHeld", err)
	}
}

// A mutex as a client of an earlier version left it (the same layout: a string
// with marks, a queue, waiter places) refuses a semaphore, and its release still
// hands the key to its waiter.
func TestSemaphoreOnOldMutexState(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b, c := openBackend(t, srv), openBackend(t, srv)
	rdb := b.Client()
	w, err := c.Watch(ctx, "k", "waiter")
	if err != nil {
		t.Fatal(err)
	}
	ww := w.(*waiter)
	_, seq := ww.attempt()
	lock := b.LockKey("k")
	mark := " q" + strconv.Itoa(len(b.prefix))
	p := rdb.TxPipeline()
	p.Set(ctx, lock, "old"+mark, time.Minute)
	p.Set(ctx, lock+tokenSuffix, "41", 0)
	p.RPush(ctx, queueKey(b.prefix, "k"), "waiter")
	p.Set(ctx, waiterKey(b.prefix, "k", "waiter"), strings.Join([]string{strconv.FormatUint(seq, 10), "60000", c.wakeCh}, " "), time.Minute)
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, semReq("k", "sem", 2))
	wantMismatch(t, err, 1, 2)
	if limit, owners := holderOwners(t, b, "k"); limit != 1 || strings.Join(owners, ",") != "old" {
		t.Fatalf("Holders = %d %v, want 1 [old]", limit, owners)
	}
	if err := b.Release(ctx, "k", "old"); err != nil {
		t.Fatal(err)
	}
	wake(t, ww)
	if g, ok := ww.take(60000); !ok || g.Token < 42 {
		t.Fatalf("handed grant %+v, %v; want token above 41", g, ok)
	}
	if err := ww.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
}

// When the message of a handed permit is lost, the waiter's next attempt finds the
// permit handed to its place and claims it, with the token the release issued; a
// client with the same owner id but another channel cannot.
func TestSemaphoreLostHandoffMessage(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b, c, other := openBackend(t, srv), openBackend(t, srv), openBackend(t, srv)
	mustAcquire(t, b, semReq("k", "a", 2))
	mustAcquire(t, b, semReq("k", "b", 2))
	w := semQueue(t, c, "k", "w", 2)
	if err := b.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	wake(t, w)
	w.handed.Store(nil) // lost
	_, hs, err := b.Holders(ctx, "k")
	if err != nil || len(hs) != 2 || hs[1].Owner != "w" {
		t.Fatalf("Holders after the release: %+v, %v; want b and w", hs, err)
	}
	req := semReq("k", "w", 2)
	req.Wait, req.Patience = true, time.Minute
	if _, err := other.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the same owner id on another client: %v, want ErrLocked", err)
	}
	g, err := c.Acquire(ctx, req)
	if err != nil || g.Token != hs[1].Token || g.Age != 0 {
		t.Fatalf("claim = %+v, %v; want token %d and no Age", g, err, hs[1].Token)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "k", "w"); err != nil {
		t.Fatal(err)
	}
}
