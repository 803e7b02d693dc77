package zklock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/zklock"
)

func rwReq(key, owner string, shared, wait bool) driver.Request {
	r := driver.Request{Key: key, Owner: owner, TTL: time.Minute, Shared: shared, Wait: wait}
	if wait {
		r.Patience = time.Minute
	}
	return r
}

// quiet fails if w is woken within a short while.
func quiet(t testing.TB, w driver.Waiter, what string) {
	t.Helper()
	select {
	case <-w.C():
		t.Fatalf("a wake-up of %s", what)
	case <-time.After(200 * time.Millisecond):
	}
}

// rwWaiter is one waiting contender on a backend of its own.
type rwWaiter struct {
	b      *zklock.Backend
	w      driver.Waiter
	owner  string
	shared bool
}

func newRWWaiter(t testing.TB, ctx context.Context, srv *testserver.ZooKeeper, key, owner string, shared bool) *rwWaiter {
	t.Helper()
	b := open(t, srv.URL("/dlock"))
	t.Cleanup(func() { b.Close() })
	w, err := b.Watch(ctx, key, owner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(context.Background(), false) })
	return &rwWaiter{b: b, w: w, owner: owner, shared: shared}
}

func (x *rwWaiter) req(key string) driver.Request { return rwReq(key, x.owner, x.shared, true) }

// A writer's release hands the key to the whole run of readers queued behind it at
// once, each woken by the server and each with a token above the writer's; the
// writer queued behind them is not woken, and Holders lists the readers as shared.
func TestRWReadersHandedAtOnce(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, time.Minute)
	const key = "rw-run"
	hb := open(t, srv.URL("/dlock"))
	defer hb.Close()
	gw, err := hb.Acquire(ctx, rwReq(key, "w0", false, false))
	if err != nil {
		t.Fatal(err)
	}
	var readers []*rwWaiter
	for i, o := range []string{"r1", "r2", "r3"} {
		r := newRWWaiter(t, ctx, srv, key, o, true)
		mustQueue(t, ctx, r.b, r.req(key), i)
		readers = append(readers, r)
	}
	w1 := newRWWaiter(t, ctx, srv, key, "w1", false)
	mustQueue(t, ctx, w1.b, w1.req(key), 3)
	// A reader does not pass the queue, waiting or not.
	if _, err := hb.Acquire(ctx, rwReq(key, "late", true, false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("reader newcomer behind queued places: %v, want ErrLocked", err)
	}

	if err := hb.Release(ctx, key, "w0"); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for _, r := range readers {
		woken(t, r.w, r.owner+", after the writer released")
		g, err := r.b.Acquire(ctx, r.req(key))
		if err != nil {
			t.Fatalf("reader %s after the writer released: %v", r.owner, err)
		}
		if g.Token <= gw.Token || g.Token <= last {
			t.Fatalf("reader %s token %d not above %d and %d", r.owner, g.Token, gw.Token, last)
		}
		last = g.Token
	}
	quiet(t, w1.w, "the writer queued behind readers that all hold")
	if _, err := w1.b.Acquire(ctx, w1.req(key)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("writer behind holding readers: %v, want ErrLocked", err)
	}
	limit, hs, err := hb.Holders(ctx, key)
	if err != nil || limit != 1 || len(hs) != 3 {
		t.Fatalf("Holders = %d, %+v, %v; want 3 readers", limit, hs, err)
	}
	for i, h := range hs {
		if !h.Shared || h.Owner != readers[i].owner || h.Waiters != 1 {
			t.Fatalf("holder %d = %+v, want shared %s with 1 waiter", i, h, readers[i].owner)
		}
	}
	info, err := hb.Inspect(ctx, key)
	if err != nil || info.Owner != "r1" || !info.Shared || info.Waiters != 1 {
		t.Fatalf("Inspect = %+v, %v; want shared r1 with 1 waiter", info, err)
	}

	// The writer gets the key once the last reader is gone, whichever order
	// they go in.
	for _, i := range []int{2, 0, 1} {
		r := readers[i]
		if i == 1 {
			// Drop the wake-ups of the earlier releases, so that the one
			// awaited below is the last reader's.
			select {
			case <-w1.w.C():
			default:
			}
		}
		if err := r.b.Release(ctx, key, r.owner); err != nil {
			t.Fatal(err)
		}
		if i != 1 {
			if _, err := w1.b.Acquire(ctx, w1.req(key)); !errors.Is(err, driver.ErrLocked) {
				t.Fatalf("writer with readers left: %v, want ErrLocked", err)
			}
		}
	}
	woken(t, w1.w, "the writer, after the last reader released")
	g, err := w1.b.Acquire(ctx, w1.req(key))
	if err != nil {
		t.Fatalf("writer after the readers: %v", err)
	}
	if g.Token <= last {
		t.Fatalf("writer token %d not above the readers' %d", g.Token, last)
	}
	info, err = hb.Inspect(ctx, key)
	if err != nil || info.Owner != "w1" || info.Shared {
		t.Fatalf("Inspect = %+v, %v; want exclusive w1", info, err)
	}
	if err := w1.b.Release(ctx, key, "w1"); err != nil {
		t.Fatal(err)
	}
}

// A reader queued behind a writer that waits for readers waits for the writer too:
// it holds only once the writer has had the key and released it.
func TestRWReaderBehindWriterBehindReaders(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, time.Minute)
	const key = "rw-behind"
	hb := open(t, srv.URL("/dlock"))
	defer hb.Close()
	for _, o := range []string{"r1", "r2"} {
		if _, err := hb.Acquire(ctx, rwReq(key, o, true, false)); err != nil {
			t.Fatalf("reader %s: %v", o, err)
		}
	}
	w := newRWWaiter(t, ctx, srv, key, "w", false)
	mustQueue(t, ctx, w.b, w.req(key), 0)
	r3 := newRWWaiter(t, ctx, srv, key, "r3", true)
	mustQueue(t, ctx, r3.b, r3.req(key), 1)

	for _, o := range []string{"r1", "r2"} {
		if err := hb.Release(ctx, key, o); err != nil {
			t.Fatal(err)
		}
	}
	woken(t, w.w, "the writer, after the readers released")
	gw, err := w.b.Acquire(ctx, w.req(key))
	if err != nil {
		t.Fatalf("writer after the readers: %v", err)
	}
	if _, err := r3.b.Acquire(ctx, r3.req(key)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("reader behind the holding writer: %v, want ErrLocked", err)
	}
	if err := w.b.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
	woken(t, r3.w, "the reader, after the writer released")
	g, err := r3.b.Acquire(ctx, r3.req(key))
	if err != nil {
		t.Fatalf("reader after the writer: %v", err)
	}
	if g.Token <= gw.Token {
		t.Fatalf("reader token %d not above the writer's %d", g.Token, gw.Token)
	}
	if err := r3.b.Release(ctx, key, "r3"); err != nil {
		t.Fatal(err)
	}
}

// A shared attempt counts as limit 1: it mismatches a semaphore's key, and a
// semaphore's attempt mismatches a key held by readers; a writer's attempt does
// not mismatch readers.
func TestRWLimitMismatch(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, time.Minute)
	b := open(t, srv.URL("/dlock"))
	defer b.Close()
	if _, err := b.Acquire(ctx, semReq("rw-sem", "s1", 2, false)); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []bool{false, true} {
		if _, err := b.Acquire(ctx, rwReq("rw-sem", "r", true, wait)); !errors.Is(err, driver.ErrLimitMismatch) {
			t.Fatalf("reader on a semaphore (wait %v): %v, want ErrLimitMismatch", wait, err)
		}
	}
	if _, err := b.Acquire(ctx, rwReq("rw-read", "r", true, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, semReq("rw-read", "s", 2, false)); !errors.Is(err, driver.ErrLimitMismatch) {
		t.Fatalf("semaphore on a read-locked key: %v, want ErrLimitMismatch", err)
	}
	_, err := b.Acquire(ctx, rwReq("rw-read", "w", false, false))
	if !errors.Is(err, driver.ErrLocked) || errors.Is(err, driver.ErrLimitMismatch) {
		t.Fatalf("writer on a read-locked key: %v, want ErrLocked", err)
	}
	if _, err := b.Acquire(ctx, rwReq("rw-read", "r2", true, false)); err != nil {
		t.Fatalf("second reader: %v", err)
	}
	// Nothing was left behind by the refused attempts.
	limit, hs, err := b.Holders(ctx, "rw-read")
	if err != nil || limit != 1 || len(hs) != 2 || !hs[0].Shared || !hs[1].Shared || hs[0].Waiters != 0 {
		t.Fatalf("Holders = %d, %+v, %v; want readers r and r2", limit, hs, err)
	}
}

// An older version's child (a mutex's, written without the reader's mark) is a
// writer's: a reader waits behind it and is woken when it goes, and Holders lists
// it as exclusive.
func TestRWOldFormatChild(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, time.Minute)
	b := open(t, srv.URL("/dlock"))
	defer b.Close()
	const key = "rw-old"
	raw := rawConn(t, srv.Addr())
	parent := b.LockPath(key)
	if _, err := raw.Create("/dlock", nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		t.Fatal(err)
	}
	if _, err := raw.CreateContainer(parent, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	old, err := raw.Create(parent+"/lock-old-0123456789abcdef0123456789abcdef-", []byte("60000"),
		zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	_, hs, err := b.Holders(ctx, key)
	if err != nil || len(hs) != 1 || hs[0].Owner != "old" || hs[0].Shared {
		t.Fatalf("Holders = %+v, %v; want the older version's exclusive child", hs, err)
	}
	r := newRWWaiter(t, ctx, srv, key, "r", true)
	mustQueue(t, ctx, r.b, r.req(key), 0)
	if err := raw.Delete(old, -1); err != nil {
		t.Fatal(err)
	}
	woken(t, r.w, "the reader, after the older version's child went")
	if _, err := r.b.Acquire(ctx, r.req(key)); err != nil {
		t.Fatalf("reader after the older child went: %v", err)
	}
	if err := r.b.Release(ctx, key, "r"); err != nil {
		t.Fatal(err)
	}
}

// An owner id that reads through one client is refused a second read grant through
// another (driver.Request), keeping no place; through the same backend an attempt
// in the other mode is refused without a change.
func TestRWSameOwner(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, time.Minute)
	b1 := open(t, srv.URL("/dlock"))
	defer b1.Close()
	b2 := open(t, srv.URL("/dlock"))
	defer b2.Close()
	const key = "rw-owner"
	if _, err := b1.Acquire(ctx, rwReq(key, "o", true, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Acquire(ctx, rwReq(key, "o", true, false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("second reader of the same owner id: %v, want ErrLocked", err)
	}
	if _, err := b1.Acquire(ctx, rwReq(key, "o", false, false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("writer of the reading owner id: %v, want ErrLocked", err)
	}
	_, hs, err := b1.Holders(ctx, key)
	if err != nil || len(hs) != 1 || hs[0].Owner != "o" || !hs[0].Shared || hs[0].Waiters != 0 {
		t.Fatalf("Holders = %+v, %v; want reader o alone", hs, err)
	}
	if err := b1.Release(ctx, key, "o"); err != nil {
		t.Fatal(err)
	}
}
