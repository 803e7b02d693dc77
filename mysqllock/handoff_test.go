package mysqllock_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
)

// queueWaiter registers a wait of owner on key and makes its first waiting
// attempt, which must be refused (the key is held).
func queueWaiter(t *testing.T, b driver.Backend, key, owner string, ttl time.Duration) driver.Waiter {
	t.Helper()
	ctx := context.Background()
	w, err := b.(driver.Notifier).Watch(ctx, key, owner)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, driver.Request{Key: key, Owner: owner, TTL: ttl, Wait: true, Patience: time.Minute})
	if !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("waiting attempt of %s = %v, want ErrLocked", owner, err)
	}
	return w
}

// woken fails the test unless w is signalled within 10 seconds.
func woken(t *testing.T, w driver.Waiter, failure string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(10 * time.Second):
		t.Fatal(failure)
	}
}

func TestHandoff(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	t.Run("HandedGrant", func(t *testing.T) { testHandedGrant(t, srv) })
	t.Run("CancelledWaiterHandsOn", func(t *testing.T) { testCancelledWaiterHandsOn(t, srv) })
	t.Run("CrashedWaiterLapses", func(t *testing.T) { testCrashedWaiterLapses(t, srv) })
	t.Run("RequeueGoesLast", func(t *testing.T) { testRequeueGoesLast(t, srv) })
	t.Run("NewcomerReadsMark", func(t *testing.T) { testNewcomerReadsMark(t, srv) })
	t.Run("AnchorLost", func(t *testing.T) { testAnchorLost(t, srv) })
	t.Run("FewestConnections", func(t *testing.T) { testFewestConnections(t, srv) })
	t.Run("SameOwnerPlace", func(t *testing.T) { testSameOwnerPlace(t, srv) })
	t.Run("SameOwnerGrantElsewhere", func(t *testing.T) { testSameOwnerGrantElsewhere(t, srv) })
}

// A key that frees itself (its holder's grant lapses) while a waiter of owner x
// on one client has a place is granted to an attempt of x on another client; that
// grant must not count the first client's place as served: the waiter, which reads
// a grant handed to its place as its own, must not hold the key too. (The
// conformance suite's SameOwnerElsewhere saw both hold, with one token, about 1 run
// in 200 under load.) The release hands the key on to that place.
func testSameOwnerGrantElsewhere(t *testing.T, srv *testserver.MariaDB) {
	h, a, b := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer h.Close()
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	if _, err := h.Acquire(ctx, driver.Request{Key: "sg", Owner: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w := queueWaiter(t, b, "sg", "x", 30*time.Second)
	defer w.Stop(ctx, false)
	exec(t, admin(t, srv), "UPDATE `"+mysqllock.DefaultTable+"` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE lock_key = ?", "sg")
	ga, err := a.Acquire(ctx, driver.Request{Key: "sg", Owner: "x", TTL: 30 * time.Second})
	if err != nil {
		t.Fatalf("an attempt of x through another client on the lapsed key: %v", err)
	}
	req := driver.Request{Key: "sg", Owner: "x", TTL: 30 * time.Second, Wait: true, Patience: time.Minute}
	if g, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the waiter's attempt while the other client holds = %+v, %v; want ErrLocked", g, err)
	}
	if err := a.Release(ctx, "sg", "x"); err != nil {
		t.Fatal(err)
	}
	woken(t, w, "the release did not hand the key to the waiter's place")
	if g, err := b.Acquire(ctx, req); err != nil || g.Token != ga.Token+1 {
		t.Fatalf("the waiter's attempt after the release = %+v, %v; want the handed grant, token %d", g, err, ga.Token+1)
	}
	if err := b.Release(ctx, "sg", "x"); err != nil {
		t.Fatal(err)
	}
}

// Waiters of one owner id on two clients share a place, made by the first. The
// release hands the key to it and wakes the client that made it, even though the
// second renewed the place since; the second's refused attempt leaves the place
// alone; the first claims the grant. (The conformance suite's SameOwnerElsewhere
// failed about 1 run in 30 under load: the wake-up went to the second client,
// whose attempt, refused, deleted the place, and the key stayed handed to no one
// for its TTL.)
func testSameOwnerPlace(t *testing.T, srv *testserver.MariaDB) {
	h, a, b := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer h.Close()
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	g0, err := h.Acquire(ctx, driver.Request{Key: "so", Owner: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	wa := queueWaiter(t, a, "so", "x", 30*time.Second)
	wb := queueWaiter(t, b, "so", "x", 30*time.Second)
	if err := h.Release(ctx, "so", "h"); err != nil {
		t.Fatal(err)
	}
	req := driver.Request{Key: "so", Owner: "x", TTL: 30 * time.Second, Wait: true, Patience: time.Minute}
	if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the second client's attempt = %v, want ErrLocked (the grant is the first's)", err)
	}
	woken(t, wa, "the client that made the place was not woken")
	g, err := a.Acquire(ctx, req)
	if err != nil || g.Token != g0.Token+1 {
		t.Fatalf("the first client's attempt = %+v, %v; want the handed grant, token %d", g, err, g0.Token+1)
	}
	for _, w := range []driver.Waiter{wa, wb} {
		if err := w.Stop(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Release(ctx, "so", "x"); err != nil {
		t.Fatal(err)
	}
}

// With the fewest connections allowed (max_conns=3: the listener, its anchor, and
// one for statements), a client hands a key on to its own waiter.
func testFewestConnections(t *testing.T, srv *testserver.MariaDB) {
	b := open(t, withQuery(srv.URL(), "max_conns", "3"))
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := b.Acquire(ctx, driver.Request{Key: "fc", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w := queueWaiter(t, b, "fc", "b", 30*time.Second)
	defer w.Stop(ctx, false)
	if err := b.Release(ctx, "fc", "a"); err != nil {
		t.Fatal(err)
	}
	woken(t, w, "the waiter was not woken")
	req := driver.Request{Key: "fc", Owner: "b", TTL: 30 * time.Second, Wait: true, Patience: time.Minute}
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatalf("woken waiter: %v", err)
	}
	if err := b.Release(ctx, "fc", "b"); err != nil {
		t.Fatal(err)
	}
}

// A listener whose anchor connection is lost (its wait for the anchor's lock then
// returns) starts again on new connections: its waiters are woken to queue again
// with the new connection, and the next release wakes the waiter through it.
func testAnchorLost(t *testing.T, srv *testserver.MariaDB) {
	a, b := open(t, srv.URL()), open(t, srv.URL())
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	req := driver.Request{Key: "al", Owner: "b", TTL: 30 * time.Second, Wait: true, Patience: time.Minute}
	if _, err := a.Acquire(ctx, driver.Request{Key: "al", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w := queueWaiter(t, b, "al", "b", 30*time.Second)
	defer w.Stop(ctx, false)
	lid, aid := mysqllock.ListenerIDs(b)
	if lid == 0 || aid == 0 || lid == aid {
		t.Fatalf("listener ids %d, %d; want two connections", lid, aid)
	}
	exec(t, admin(t, srv), "KILL CONNECTION "+strconv.FormatUint(aid, 10))
	woken(t, w, "the waiter was not woken when the listener's anchor went")
	if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("waiting attempt after the anchor went = %v, want ErrLocked", err)
	}
	if lid2, _ := mysqllock.ListenerIDs(b); lid2 == 0 || lid2 == lid {
		t.Fatalf("listener after the anchor went: %d (was %d), want a new one", lid2, lid)
	}
	if err := a.Release(ctx, "al", "a"); err != nil {
		t.Fatal(err)
	}
	woken(t, w, "the release did not wake the waiter through the new listener")
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatalf("woken waiter: %v", err)
	}
	if err := b.Release(ctx, "al", "b"); err != nil {
		t.Fatal(err)
	}
}

// A newcomer's attempt, which reads only the row's queued mark, does not pass a
// live place: the first waiter marks the row, and on a free row that is marked
// the queue decides (here: the row expired with a waiter queued). Once the place
// lapses, the newcomer is granted the key.
func testNewcomerReadsMark(t *testing.T, srv *testserver.MariaDB) {
	a, b, c := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer a.Close()
	defer b.Close()
	defer c.Close()
	ctx := context.Background()
	if _, err := a.Acquire(ctx, driver.Request{Key: "nm", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w := queueWaiter(t, b, "nm", "b", 30*time.Second)
	defer w.Stop(ctx, false)
	db := admin(t, srv)
	var queued int
	if err := db.QueryRow("SELECT queued FROM dlock_locks WHERE lock_key = 'nm'").Scan(&queued); err != nil || queued != 1 {
		t.Fatalf("row's mark with a waiter queued: %d, %v; want 1", queued, err)
	}
	exec(t, db, "UPDATE dlock_locks SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE lock_key = 'nm'")
	_, err := c.Acquire(ctx, driver.Request{Key: "nm", Owner: "c", TTL: time.Minute})
	if !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("newcomer on a free row with a live place = %v, want ErrLocked", err)
	}
	exec(t, db, "UPDATE dlock_locks_queue SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE lock_key = 'nm'")
	g, err := c.Acquire(ctx, driver.Request{Key: "nm", Owner: "c", TTL: time.Minute})
	if err != nil {
		t.Fatalf("newcomer once the place lapsed: %v", err)
	}
	if g2, err := c.Acquire(ctx, driver.Request{Key: "nm", Owner: "c", TTL: time.Minute, Reenter: true}); err != nil || g2.Token != g.Token {
		t.Fatalf("re-entry = %+v, %v; want token %d", g2, err, g.Token)
	}
	if _, err := a.Acquire(ctx, driver.Request{Key: "nm", Owner: "c", TTL: time.Minute}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the same owner without Reenter = %v, want ErrLocked", err)
	}
	if err := c.Release(ctx, "nm", "c"); err != nil {
		t.Fatal(err)
	}
}

// A waiter granted the key through its place that queues again at once (its old
// place not yet deleted: the new one replaces it) goes to the end of the line,
// behind a place made in between, and is handed the key after it.
func testRequeueGoesLast(t *testing.T, srv *testserver.MariaDB) {
	a, b, c := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer a.Close()
	defer b.Close()
	defer c.Close()
	ctx := context.Background()
	if _, err := a.Acquire(ctx, driver.Request{Key: "rq", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wb := queueWaiter(t, b, "rq", "b", 30*time.Second)
	if err := a.Release(ctx, "rq", "a"); err != nil {
		t.Fatal(err)
	}
	<-wb.C()
	req := driver.Request{Key: "rq", Owner: "b", TTL: 30 * time.Second, Wait: true, Patience: time.Minute}
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := wb.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	wc := queueWaiter(t, c, "rq", "c", 30*time.Second)
	if err := b.Release(ctx, "rq", "b"); err != nil {
		t.Fatal(err)
	}
	<-wc.C()
	wb = queueWaiter(t, b, "rq", "b", 30*time.Second)
	db := admin(t, srv)
	var places int
	if err := db.QueryRow("SELECT COUNT(*) FROM dlock_locks_queue WHERE lock_key = 'rq' AND owner = 'b'").Scan(&places); err != nil || places != 1 {
		t.Fatalf("places of b: %d, %v; want 1", places, err)
	}
	if _, err := c.Acquire(ctx, driver.Request{Key: "rq", Owner: "c", TTL: 30 * time.Second, Wait: true, Patience: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := wc.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "rq", "c"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wb.C():
	case <-time.After(5 * time.Second):
		t.Fatal("b, queued again, was not handed the key")
	}
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := wb.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "rq", "b"); err != nil {
		t.Fatal(err)
	}
}

// A release grants the key to the first place on the server (a new token, the
// place's TTL) and the woken waiter's attempt returns that grant with an Age.
func testHandedGrant(t *testing.T, srv *testserver.MariaDB) {
	a, b := open(t, srv.URL()), open(t, srv.URL())
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	g0, err := a.Acquire(ctx, driver.Request{Key: "h", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	w := queueWaiter(t, b, "h", "b", 30*time.Second)
	if err := a.Release(ctx, "h", "a"); err != nil {
		t.Fatal(err)
	}
	in, err := a.Inspect(ctx, "h")
	if err != nil || in.Owner != "b" || in.Token != g0.Token+1 || in.TTL > 30*time.Second || in.TTL < 20*time.Second {
		t.Fatalf("after the release: %+v, %v; want b's grant, token %d, TTL about 30s", in, err, g0.Token+1)
	}
	woken(t, w, "no wake-up")
	g, err := b.Acquire(ctx, driver.Request{Key: "h", Owner: "b", TTL: 30 * time.Second, Wait: true, Patience: time.Minute})
	if err != nil || g.Token != g0.Token+1 || g.Age <= 0 {
		t.Fatalf("waiter's attempt = %+v, %v; want the handed grant with an Age", g, err)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if q, err := a.Queue(ctx, "h"); err != nil || len(q) != 0 {
		t.Fatalf("Queue = %+v, %v; want none", q, err)
	}
	if err := b.Release(ctx, "h", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Inspect(ctx, "h"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("after the last release: %v, want ErrNotHeld", err)
	}
}

// A waiter that gives up after the key was handed to its place (its attempt never
// returned it) hands the key on to the next place.
func testCancelledWaiterHandsOn(t *testing.T, srv *testserver.MariaDB) {
	a, b, c := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer a.Close()
	defer b.Close()
	defer c.Close()
	ctx := context.Background()
	if _, err := a.Acquire(ctx, driver.Request{Key: "c", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wb := queueWaiter(t, b, "c", "b", time.Minute)
	wc := queueWaiter(t, c, "c", "c", time.Minute)
	if err := a.Release(ctx, "c", "a"); err != nil {
		t.Fatal(err)
	}
	if in, err := a.Inspect(ctx, "c"); err != nil || in.Owner != "b" {
		t.Fatalf("after the release: %+v, %v; want b's grant", in, err)
	}
	if err := wb.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if in, err := a.Inspect(ctx, "c"); err != nil || in.Owner != "c" {
		t.Fatalf("after b gave up: %+v, %v; want c's grant", in, err)
	}
	if err := wc.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Inspect(ctx, "c"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("after c gave up: %v, want the key free", err)
	}
	if q, err := a.Queue(ctx, "c"); err != nil || len(q) != 0 {
		t.Fatalf("Queue = %+v, %v; want none", q, err)
	}
	if _, err := a.Acquire(ctx, driver.Request{Key: "c", Owner: "n", TTL: time.Minute}); err != nil {
		t.Fatalf("a newcomer after both gave up: %v", err)
	}
}

// A key handed to the place of a waiter that crashed (its client gone without a
// Stop) stays held no longer than the TTL the place asked for, like a crashed
// holder's grant, and then passes to the next waiter.
func testCrashedWaiterLapses(t *testing.T, srv *testserver.MariaDB) {
	a, b, c := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer a.Close()
	defer c.Close()
	ctx := context.Background()
	if _, err := a.Acquire(ctx, driver.Request{Key: "x", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	queueWaiter(t, b, "x", "b", time.Second)
	b.Close() // crashed: no Stop
	wc := queueWaiter(t, c, "x", "c", time.Minute)
	defer wc.Stop(ctx, false)
	if err := a.Release(ctx, "x", "a"); err != nil {
		t.Fatal(err)
	}
	in, err := a.Inspect(ctx, "x")
	if err != nil || in.Owner != "b" || in.TTL > time.Second {
		t.Fatalf("after the release: %+v, %v; want b's grant, at most 1s", in, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err := c.Acquire(ctx, driver.Request{Key: "x", Owner: "c", TTL: time.Minute, Wait: true, Patience: time.Minute})
		if err == nil {
			if g.Token != in.Token+1 {
				t.Fatalf("c's token %d, want %d", g.Token, in.Token+1)
			}
			break
		}
		if !errors.Is(err, driver.ErrLocked) || time.Now().After(deadline) {
			t.Fatalf("c's attempt: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A server at its limit of prepared statements (max_prepared_stmt_count) gets the
// statements unprepared, as before they were prepared once: locking and handoffs
// work.
func TestPreparedStatementLimit(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	db := admin(t, srv)
	exec(t, db, "SET GLOBAL max_prepared_stmt_count = 10")
	a, b := open(t, srv.URL()), open(t, srv.URL())
	defer a.Close()
	defer b.Close()
	// The statements each Open prepared before the limit are closed (the
	// client does not wait for the server to have done so).
	for deadline := time.Now().Add(5 * time.Second); ; {
		var name string
		var n int
		if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Prepared_stmt_count'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d prepared statements left after Open at the limit", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx := context.Background()
	g0, err := a.Acquire(ctx, driver.Request{Key: "lim", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	w := queueWaiter(t, b, "lim", "b", 30*time.Second)
	if err := a.Release(ctx, "lim", "a"); err != nil {
		t.Fatal(err)
	}
	woken(t, w, "no wake-up")
	g, err := b.Acquire(ctx, driver.Request{Key: "lim", Owner: "b", TTL: 30 * time.Second, Wait: true, Patience: time.Minute})
	if err != nil || g.Token != g0.Token+1 {
		t.Fatalf("handed grant: %+v, %v; want token %d", g, err, g0.Token+1)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "lim", "b"); err != nil {
		t.Fatal(err)
	}
}
