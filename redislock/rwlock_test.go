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

// Tests of read-write locks (Request.Shared) at the driver level, for what the
// conformance suite does not reach: a run of readers handed the key at once by a
// mutex release, a reader queued behind a writer behind readers, mismatches with
// semaphores, and state an earlier version left.

func rwReq(key, owner string, shared bool) driver.Request {
	return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Shared: shared}
}

// rwQueue registers a wait of owner on a held key and makes the waiting attempt
// that queues it.
func rwQueue(t *testing.T, b *Backend, key, owner string, shared bool) *waiter {
	t.Helper()
	ctx := context.Background()
	w, err := b.Watch(ctx, key, owner)
	if err != nil {
		t.Fatal(err)
	}
	req := rwReq(key, owner, shared)
	req.Wait, req.Patience = true, time.Minute
	if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("waiting Acquire of %s: %v, want ErrLocked", owner, err)
	}
	return w.(*waiter)
}

// rwTake returns the grant handed to w, failing if there is none.
func rwTake(t *testing.T, b *Backend, w *waiter, shared bool) driver.Grant {
	t.Helper()
	wake(t, w)
	req := rwReq(w.key, w.owner, shared)
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

// rwHolders returns the key's holders as "owner" or "owner(r)" for readers.
func rwHolders(t *testing.T, b *Backend, key string) string {
	t.Helper()
	limit, hs, err := b.Holders(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) > 0 && limit != 1 {
		t.Fatalf("Holders limit %d, want 1", limit)
	}
	var s []string
	for _, h := range hs {
		if h.Shared {
			s = append(s, h.Owner+"(r)")
		} else {
			s = append(s, h.Owner)
		}
	}
	return strings.Join(s, ",")
}

func wantHolders(t *testing.T, b *Backend, key, want string) {
	t.Helper()
	if got := rwHolders(t, b, key); got != want {
		t.Fatalf("holders %q, want %q", got, want)
	}
}

// A mutex's release hands the key to the leading run of queued readers at once
// (the key becomes a hash); a writer queued behind them waits for them all, and a
// reader queued behind the writer waits for the writer. Tokens rise throughout.
func TestRWRunOfReadersHanded(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b := openBackend(t, srv)
	c := []*Backend{openBackend(t, srv), openBackend(t, srv), openBackend(t, srv), openBackend(t, srv)}
	g0 := mustAcquire(t, b, rwReq("k", "w0", false))
	r1 := rwQueue(t, c[0], "k", "r1", true)
	r2 := rwQueue(t, c[1], "k", "r2", true)
	w1 := rwQueue(t, c[2], "k", "w1", false)
	r3 := rwQueue(t, c[3], "k", "r3", true)
	wantHolders(t, b, "k", "w0")

	if err := b.Release(ctx, "k", "w0"); err != nil {
		t.Fatal(err)
	}
	g1, g2 := rwTake(t, c[0], r1, true), rwTake(t, c[1], r2, true)
	if g1.Token <= g0.Token || g2.Token <= g1.Token {
		t.Fatalf("handed tokens %d, %d after %d: want rising", g1.Token, g2.Token, g0.Token)
	}
	wantHolders(t, b, "k", "r1(r),r2(r)")
	info, err := b.Inspect(ctx, "k")
	if err != nil || info.Owner != "r1" || !info.Shared || info.Waiters != 2 {
		t.Fatalf("Inspect = %+v, %v; want the shared holder r1 and 2 waiters", info, err)
	}
	// A newcomer reader does not pass the queued writer.
	if _, err := b.Acquire(ctx, rwReq("k", "late", true)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a reader with a writer queued: %v, want ErrLocked", err)
	}

	if err := c[0].Release(ctx, "k", "r1"); err != nil {
		t.Fatal(err)
	}
	wantHolders(t, b, "k", "r2(r)")
	if err := c[1].Release(ctx, "k", "r2"); err != nil {
		t.Fatal(err)
	}
	gw := rwTake(t, c[2], w1, false)
	if gw.Token <= g2.Token {
		t.Fatalf("writer's token %d not above %d", gw.Token, g2.Token)
	}
	wantHolders(t, b, "k", "w1")
	info, err = b.Inspect(ctx, "k")
	if err != nil || info.Owner != "w1" || info.Shared {
		t.Fatalf("Inspect = %+v, %v; want the exclusive holder w1", info, err)
	}
	// The writer, held in the hash, refreshes and sets its value as any holder.
	if err := c[2].Refresh(ctx, "k", "w1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c[2].SetValue(ctx, "k", "w1", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := c[2].Release(ctx, "k", "w1"); err != nil {
		t.Fatal(err)
	}
	g3 := rwTake(t, c[3], r3, true)
	if g3.Token <= gw.Token {
		t.Fatalf("token %d not above %d", g3.Token, gw.Token)
	}
	wantHolders(t, b, "k", "r3(r)")
	if err := c[3].Release(ctx, "k", "r3"); err != nil {
		t.Fatal(err)
	}
	// Free again: nothing left, and the mutex fast path applies.
	if n, err := b.Client().Exists(ctx, b.LockKey("k")).Result(); err != nil || n != 0 {
		t.Fatalf("a free read-write lock left its hash (%d, %v)", n, err)
	}
	if g := mustAcquire(t, b, rwReq("k", "m", false)); g.Token <= g3.Token {
		t.Fatalf("token %d not above %d", g.Token, g3.Token)
	}
	if typ, err := b.Client().Type(ctx, b.LockKey("k")).Result(); err != nil || typ != "string" {
		t.Fatalf("a mutex on a free key is a %s (%v), want a string", typ, err)
	}
}

// Readers holding (a hash): a writer queues behind them, readers behind the
// writer; the last reader's release hands the key to the writer, the writer's to
// every reader behind it; a reader that gives up its handed grant gives it back.
func TestRWReaderBehindWriterBehindReaders(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b := openBackend(t, srv)
	c := []*Backend{openBackend(t, srv), openBackend(t, srv), openBackend(t, srv)}
	mustAcquire(t, b, rwReq("k", "a", true))
	mustAcquire(t, b, rwReq("k", "b", true))
	wantHolders(t, b, "k", "a(r),b(r)")
	if _, err := b.Acquire(ctx, rwReq("k", "x", false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a writer while readers hold: %v, want ErrLocked", err)
	}
	w := rwQueue(t, c[0], "k", "w", false)
	r1 := rwQueue(t, c[1], "k", "r1", true)
	r2 := rwQueue(t, c[2], "k", "r2", true)
	if err := b.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	wantHolders(t, b, "k", "b(r)")
	if err := b.Release(ctx, "k", "b"); err != nil {
		t.Fatal(err)
	}
	rwTake(t, c[0], w, false)
	wantHolders(t, b, "k", "w")
	if err := c[0].Release(ctx, "k", "w"); err != nil {
		t.Fatal(err)
	}
	rwTake(t, c[1], r1, true)
	wantHolders(t, b, "k", "r1(r),r2(r)")
	// A reader that gives up after the key was handed to it gives its grant
	// back; the other reader keeps its own, and a new reader joins it.
	wake(t, r2)
	if err := r2.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	wantHolders(t, b, "k", "r1(r)")
	mustAcquire(t, b, rwReq("k", "r3", true))
	wantHolders(t, b, "k", "r1(r),r3(r)")
}

// A shared attempt counts as limit 1: it fails on a semaphore's key, and a
// semaphore's attempt on readers' key; a writer on readers' key only waits.
func TestRWLimitMismatch(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b := openBackend(t, srv)
	mustAcquire(t, b, semReq("k", "s", 2))
	_, err := b.Acquire(ctx, rwReq("k", "r", true))
	wantMismatch(t, err, 2, 1)
	if err := b.Release(ctx, "k", "s"); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, b, rwReq("k", "r", true))
	_, err = b.Acquire(ctx, semReq("k", "s", 3))
	wantMismatch(t, err, 1, 3)
	if _, err := b.Acquire(ctx, rwReq("k", "x", false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a writer while a reader holds: %v, want ErrLocked", err)
	}
	// One owner's grant is of one mode: a shared grant is not re-entered as an
	// exclusive one.
	req := rwReq("k", "r", false)
	req.Reenter = true
	if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("exclusive re-entry of a shared grant: %v, want ErrLocked", err)
	}
	req.Shared = true
	mustAcquire(t, b, req)
}

// State an earlier version left: a mutex held, with a waiter's place in the old
// format (an exclusive one) ahead of a reader's; the release hands the key to the
// old place as a mutex, and that one's release to the reader. And a mutex's
// places whose holder expired: a reader's attempt takes them over, handing the key
// to the old place first.
func TestRWOnOldMutexState(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b, c, d := openBackend(t, srv), openBackend(t, srv), openBackend(t, srv)
	rdb := b.Client()
	oldState := func() *waiter {
		w, err := c.Watch(ctx, "k", "waiter")
		if err != nil {
			t.Fatal(err)
		}
		ww := w.(*waiter)
		_, seq := ww.attempt()
		p := rdb.TxPipeline()
		p.Set(ctx, b.LockKey("k"), "old q"+strconv.Itoa(len(b.prefix)), time.Minute)
		p.Set(ctx, b.LockKey("k")+tokenSuffix, "41", 0)
		p.RPush(ctx, queueKey(b.prefix, "k"), "waiter")
		p.Set(ctx, waiterKey(b.prefix, "k", "waiter"), strings.Join([]string{strconv.FormatUint(seq, 10), "60000", c.wakeCh}, " "), time.Minute)
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		return ww
	}

	ww := oldState()
	r := rwQueue(t, d, "k", "reader", true)
	if err := b.Release(ctx, "k", "old"); err != nil {
		t.Fatal(err)
	}
	g := rwTake(t, c, ww, false)
	if g.Token < 42 {
		t.Fatalf("handed token %d, want above 41", g.Token)
	}
	if typ, err := rdb.Type(ctx, b.LockKey("k")).Result(); err != nil || typ != "string" {
		t.Fatalf("the old waiter holds a %s (%v), want a mutex's string", typ, err)
	}
	wantHolders(t, b, "k", "waiter")
	if err := c.Release(ctx, "k", "waiter"); err != nil {
		t.Fatal(err)
	}
	gr := rwTake(t, d, r, true)
	if gr.Token <= g.Token {
		t.Fatalf("reader's token %d not above %d", gr.Token, g.Token)
	}
	wantHolders(t, b, "k", "reader(r)")
	if err := d.Release(ctx, "k", "reader"); err != nil {
		t.Fatal(err)
	}

	// The old holder's grant expired with its waiter queued: a reader's attempt
	// hands the key to the waiter and waits.
	ww = oldState()
	if err := rdb.Del(ctx, b.LockKey("k")).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, rwReq("k", "r", true)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a reader behind a queued writer: %v, want ErrLocked", err)
	}
	rwTake(t, c, ww, false)
	wantHolders(t, b, "k", "waiter")
}
