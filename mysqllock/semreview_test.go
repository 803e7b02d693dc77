package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
)

// Adversarial tests of semaphores and read-write locks.
func TestSemReview(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	t.Run("ReenterReaderAsWriter", func(t *testing.T) { testReenterReaderAsWriter(t, srv) })
	t.Run("HandedGrantConverted", func(t *testing.T) { testHandedGrantConverted(t, srv) })
	t.Run("QuickReleaseLocksRow", func(t *testing.T) { testQuickReleaseLocksRow(t, srv) })
	t.Run("ForceReleaseExpired", func(t *testing.T) { testForceReleaseExpired(t, srv) })
	t.Run("StopPendingWakesNext", func(t *testing.T) { testStopPendingWakesNext(t, srv) })
	t.Run("ExpiredPermitNotCounted", func(t *testing.T) { testExpiredPermitNotCounted(t, srv) })
	t.Run("HandedGrantConvertedStop", func(t *testing.T) { testHandedGrantConvertedStop(t, srv) })
	t.Run("HandedGrantConvertedDuringStop", func(t *testing.T) { testHandedGrantConvertedDuringStop(t, srv) })
	t.Run("SameOwnerTwoClients", func(t *testing.T) { testSameOwnerTwoClients(t, srv) })
	t.Run("TokensStateMutexState", func(t *testing.T) { testTokensStateMutexState(t, srv) })
	t.Run("ForceReleaseWakesWriterFirst", func(t *testing.T) { testForceReleaseWakesWriterFirst(t, srv) })
	t.Run("CancelledLockLeavesNothing", func(t *testing.T) { testCancelledLockLeavesNothing(t, srv) })
	t.Run("AcquireAllFreeStateRow", func(t *testing.T) { testAcquireAllFreeStateRow(t, srv) })
	t.Run("LapsedSemPlaceHandedStop", func(t *testing.T) { testLapsedSemPlaceHandedStop(t, srv) })
	t.Run("HandedGrantDeliveredConverted", func(t *testing.T) { testHandedGrantDeliveredConverted(t, srv) })
	// Readers (two clients always, whose key the others keep converting from a
	// mutex's), writers and a semaphore's holders, under waits of moderate length.
	t.Run("Stress", func(t *testing.T) {
		grants := mixedLoad{
			key: "stress", clients: 6, semClients: 1, readers: 2, readOdds: 2,
			wait: [2]time.Duration{100 * time.Millisecond, 500 * time.Millisecond}, hold: 10 * time.Millisecond,
			ttl: 3 * time.Second, length: 3 * time.Second,
		}.run(t, srv)
		t.Logf("%d grants", grants)
	})
	t.Run("QuickReleaseSeesPlace", func(t *testing.T) { testQuickReleaseSeesPlace(t, srv) })
	t.Run("QuickAcquireSeesPlace", func(t *testing.T) { testQuickAcquireSeesPlace(t, srv) })
}

func reader(key, owner string) driver.Request {
	return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Shared: true}
}

func writer(key, owner string) driver.Request {
	return driver.Request{Key: key, Owner: owner, TTL: time.Minute}
}

// A reader's re-entry as a writer (Reenter, Shared false) while another reader
// holds must not be granted: a writer is never beside anyone.
func testReenterReaderAsWriter(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	const key = "reenter-rw"
	mustAcquire(t, b, reader(key, "a"))
	mustAcquire(t, b, reader(key, "b"))
	req := writer(key, "a")
	req.Reenter = true
	if _, err := b.Acquire(ctx, req); err == nil {
		_, hs, _ := b.Holders(ctx, key)
		t.Fatalf("a reader re-entering as a writer beside another reader was granted; holders %+v", hs)
	}
	// Alone, the reader's re-entry as a writer is granted, and makes it a
	// writer: a reader is then refused.
	if err := b.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	g := mustAcquire(t, b, req)
	_, hs, err := b.Holders(ctx, key)
	if err != nil || len(hs) != 1 || hs[0].Owner != "a" || hs[0].Shared || hs[0].Token != g.Token {
		t.Fatalf("Holders after the re-entry as a writer = %+v, %v; want a's writer's grant", hs, err)
	}
	if _, err := b.Acquire(ctx, reader(key, "c")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a reader beside a writer: %v, want ErrLocked", err)
	}
}

// A mutex's release hands the key to a queued writer; a reader then converts the
// key (the handed grant becomes a writer's permit). The writer's next attempt must
// get its grant, not wait for its own grant to expire.
func testHandedGrantConverted(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b, bw, br := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer b.Close()
	defer bw.Close()
	defer br.Close()
	const key = "handed-conv"
	mustAcquire(t, b, writer(key, "h"))
	semWaiter(t, bw, writer(key, "w"))
	// The writer's listener does not learn of the handoff before the reader
	// comes (a slow listener: its place names no listening connection).
	if _, err := admin(t, srv).ExecContext(ctx, "UPDATE dlock_locks_queue SET conn = 0 WHERE lock_key = ?", key); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	semWaiter(t, br, reader(key, "r"))
	req := writer(key, "w")
	req.Wait, req.Patience = true, time.Minute
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	g, err := bw.Acquire(actx, req)
	if err != nil {
		_, hs, _ := b.Holders(ctx, key)
		t.Fatalf("the writer handed the key, after a reader's conversion: %v; holders %+v", err, hs)
	}
	_, hs, err := b.Holders(ctx, key)
	if err != nil || len(hs) != 1 || hs[0].Owner != "w" || hs[0].Token != g.Token || g.Age <= 0 {
		t.Fatalf("grant %+v, Holders = %+v, %v; want w's writer's grant, with an age", g, hs, err)
	}
	if places, err := b.Queue(ctx, key); err != nil || len(places) != 1 || places[0].Owner != "r" {
		t.Fatalf("Queue = %+v, %v; want the reader alone", places, err)
	}
	if err := bw.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
}

// quickRelease share-locks the key's row: it waits for a transaction that holds
// the row's lock (as a semaphore attempt does).
func testQuickReleaseLocksRow(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	const key = "qr-lock"
	mustAcquire(t, b, permit(key, "a", 2))
	db := admin(t, srv)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var owner string
	if err := tx.QueryRowContext(ctx, "SELECT owner FROM dlock_locks WHERE lock_key = ? FOR UPDATE", key).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Release(ctx, key, "a") }()
	select {
	case err := <-done:
		t.Fatalf("the permit's release did not wait for the row's lock (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	_ = tx.Rollback()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// ForceRelease of a key whose only permit expired (a crashed holder's) says no
// one holds it.
func testForceReleaseExpired(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	const key = "force-expired"
	req := permit(key, "a", 2)
	req.TTL = 300 * time.Millisecond
	mustAcquire(t, b, req)
	time.Sleep(500 * time.Millisecond)
	if err := b.ForceRelease(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("ForceRelease of a key whose permit expired: %v, want ErrNotHeld", err)
	}
}

// A woken waiter that gives up (Stop) before it attempts passes its turn on to
// the next place.
func testStopPendingWakesNext(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b, b1, b2 := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer b.Close()
	defer b1.Close()
	defer b2.Close()
	const key = "stop-pending"
	mustAcquire(t, b, permit(key, "h1", 2))
	mustAcquire(t, b, permit(key, "h2", 2))
	w1 := semWaiter(t, b1, permit(key, "w1", 2))
	w2 := semWaiter(t, b2, permit(key, "w2", 2))
	if err := b.Release(ctx, key, "h1"); err != nil {
		t.Fatal(err)
	}
	woken(t, w1, "the first waiter was not woken")
	if err := w1.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	woken(t, w2, "the second waiter was not woken when the first gave up")
	req := permit(key, "w2", 2)
	req.Wait, req.Patience = true, time.Minute
	mustAcquire(t, b2, req)
	if places, err := b.Queue(ctx, key); err != nil || len(places) != 0 {
		t.Fatalf("Queue = %+v, %v; want none", places, err)
	}
}

// A permit that expired does not count: the key admits its limit of live
// permits, and the expired holder's release, refresh and value fail.
func testExpiredPermitNotCounted(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	const key = "expired-count"
	req := permit(key, "a", 2)
	req.TTL = 300 * time.Millisecond
	ga := mustAcquire(t, b, req)
	mustAcquire(t, b, permit(key, "b", 2))
	time.Sleep(500 * time.Millisecond)
	gc := mustAcquire(t, b, permit(key, "c", 2))
	if gc.Token <= ga.Token {
		t.Fatalf("token %d not above %d", gc.Token, ga.Token)
	}
	if _, err := b.Acquire(ctx, permit(key, "d", 2)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a third permit of 2: %v, want ErrLocked", err)
	}
	if err := b.Refresh(ctx, key, "a", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh of an expired permit: %v, want ErrNotHeld", err)
	}
	if err := b.SetValue(ctx, key, "a", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue of an expired permit: %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, key, "a"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release of an expired permit: %v, want ErrNotHeld", err)
	}
	limit, hs, err := b.Holders(ctx, key)
	if err != nil || limit != 2 || len(hs) != 2 {
		t.Fatalf("Holders = %d, %+v, %v; want b and c", limit, hs, err)
	}
	// The expired holder comes back: one permit of 2 is free to it only
	// once b or c goes.
	if _, err := b.Acquire(ctx, permit(key, "a", 2)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the expired holder's new attempt beside 2 live permits: %v, want ErrLocked", err)
	}
	if err := b.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	if g := mustAcquire(t, b, permit(key, "a", 2)); g.Token <= gc.Token {
		t.Fatalf("token %d not above %d", g.Token, gc.Token)
	}
	// Every permit gone: another limit takes the key; the stale rows do not count.
	if err := b.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"x", "y", "z"} {
		mustAcquire(t, b, permit(key, o, 3))
	}
	if _, err := b.Acquire(ctx, permit(key, "w", 3)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a fourth permit of 3: %v, want ErrLocked", err)
	}
}

// placeUnderLock runs, for the test, what a waiter's refused attempt does: in one
// transaction, lock key's row and queue a place of owner (limit lim). It returns
// the open transaction: the row stays locked until it ends.
func placeUnderLock(t *testing.T, db *sql.DB, key, owner string, lim int) *sql.Tx {
	t.Helper()
	ctx := semCtx(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	var o string
	if err := tx.QueryRowContext(ctx, "SELECT owner FROM dlock_locks WHERE lock_key = ? FOR UPDATE", key).Scan(&o); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO dlock_locks_queue (lock_key, owner, conn, ttl, nonce, expires_at, lim) "+
		"VALUES (?, ?, 0, 60000000, 'n', UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, ?)", key, owner, lim); err != nil {
		t.Fatal(err)
	}
	return tx
}

// A permit's release that waits for the row's lock, held by an attempt that
// queues a place, sees the place when it gets the lock, and wakes it.
func testQuickReleaseSeesPlace(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	db := admin(t, srv)
	const key = "qr-sees"
	mustAcquire(t, b, permit(key, "a", 2))
	mustAcquire(t, b, permit(key, "b", 2))
	tx := placeUnderLock(t, db, key, "w", 2)
	done := make(chan error, 1)
	go func() { done <- b.Release(ctx, key, "a") }()
	time.Sleep(300 * time.Millisecond)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var woken int
	if err := db.QueryRowContext(ctx, "SELECT woken FROM dlock_locks_queue WHERE lock_key = ? AND owner = 'w'", key).Scan(&woken); err != nil {
		t.Fatal(err)
	}
	if woken%2 != 1 {
		t.Fatalf("the place queued while the release waited was not woken (woken %d)", woken)
	}
}

// A newcomer's quick attempt that waits for the row's lock, held by an attempt
// that queues a place, sees the place when it gets the lock: it does not pass it.
func testQuickAcquireSeesPlace(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	db := admin(t, srv)
	for _, c := range []struct {
		key string
		req driver.Request
	}{{"qa-sees-sem", permit("qa-sees-sem", "n", 2)}, {"qa-sees-rw", reader("qa-sees-rw", "n")}} {
		lim := c.req.Limit
		if c.req.Shared {
			// The key a read-write key: a reader holds, a writer queues.
			mustAcquire(t, b, reader(c.key, "a"))
			lim = 1
		} else {
			mustAcquire(t, b, permit(c.key, "a", 2))
		}
		tx := placeUnderLock(t, db, c.key, "w", lim)
		done := make(chan error, 1)
		go func() { _, err := b.Acquire(ctx, c.req); done <- err }()
		time.Sleep(300 * time.Millisecond)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, driver.ErrLocked) {
			_, hs, _ := b.Holders(ctx, c.key)
			t.Fatalf("%s: a newcomer whose attempt waited for a place's insert: %v, want ErrLocked; holders %+v", c.key, err, hs)
		}
	}
}

// A writer whose place a mutex's release handed the key, made a writer's permit
// by a reader since, gives up (Stop): the permit goes, and the reader is woken.
func testHandedGrantConvertedStop(t *testing.T, srv *testserver.MariaDB) {
	handedGrantConvertedStop(t, srv, "handed-conv-stop", false)
}

// The same, with the reader's conversion between the giving-up writer's read of its
// wait state (a mutex's row, handed to its place) and its handoff of that grant
// (which then finds no mutex's grant to hand on): the writer's permit goes all the
// same.
func testHandedGrantConvertedDuringStop(t *testing.T, srv *testserver.MariaDB) {
	handedGrantConvertedStop(t, srv, "handed-conv-during-stop", true)
}

func handedGrantConvertedStop(t *testing.T, srv *testserver.MariaDB, key string, during bool) {
	ctx := semCtx(t)
	b, bw, br := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer b.Close()
	defer bw.Close()
	defer br.Close()
	mustAcquire(t, b, writer(key, "h"))
	w := semWaiter(t, bw, writer(key, "w"))
	if _, err := admin(t, srv).ExecContext(ctx, "UPDATE dlock_locks_queue SET conn = 0 WHERE lock_key = ?", key); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	var r driver.Waiter
	convert := func() { r = semWaiter(t, br, reader(key, "r")) }
	if during {
		defer mysqllock.SetAfterWaitState(convert)()
	} else {
		convert()
	}
	if err := w.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if r == nil {
		t.Fatal("the waiter's Stop did not read a wait state")
	}
	if _, hs, err := b.Holders(ctx, key); err != nil || len(hs) != 0 {
		t.Fatalf("Holders after the handed writer gave up = %+v, %v; want none", hs, err)
	}
	woken(t, r, "the reader was not woken when the handed writer gave up")
	req := reader(key, "r")
	req.Wait, req.Patience = true, time.Minute
	mustAcquire(t, br, req)
}

// Two clients with one owner id: the second's attempt does not take over the
// first's permit without Reenter, and Refresh, SetValue and Release of (key,
// owner) act on that permit alone, from either client.
func testSameOwnerTwoClients(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b1, b2 := open(t, srv.URL()), open(t, srv.URL())
	defer b1.Close()
	defer b2.Close()
	const key = "same-owner"
	for _, req := range []driver.Request{permit(key, "o", 3), reader(key+"-rw", "o")} {
		g := mustAcquire(t, b1, req)
		mustAcquire(t, b1, driver.Request{Key: req.Key, Owner: "other", TTL: time.Minute, Limit: req.Limit, Shared: req.Shared})
		if _, err := b2.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("%s: the same owner's attempt from another client: %v, want ErrLocked", req.Key, err)
		}
		if err := b2.SetValue(ctx, req.Key, "o", []byte("v2")); err != nil {
			t.Fatal(err)
		}
		if err := b2.Refresh(ctx, req.Key, "o", 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		_, hs, err := b1.Holders(ctx, req.Key)
		if err != nil || len(hs) != 2 || hs[0].Owner != "o" || hs[0].Token != g.Token || string(hs[0].Value) != "v2" || hs[0].TTL < time.Minute+30*time.Second ||
			hs[1].TTL > time.Minute || len(hs[1].Value) != 0 {
			t.Fatalf("%s: Holders = %+v, %v", req.Key, hs, err)
		}
		if err := b2.Release(ctx, req.Key, "o"); err != nil {
			t.Fatal(err)
		}
		if err := b1.Release(ctx, req.Key, "o"); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("%s: second release: %v, want ErrNotHeld", req.Key, err)
		}
		if _, hs, err := b1.Holders(ctx, req.Key); err != nil || len(hs) != 1 || hs[0].Owner != "other" {
			t.Fatalf("%s: Holders = %+v, %v; want other's alone", req.Key, hs, err)
		}
	}
}

// Tokens rise as a key goes state row (a permit released on the short path),
// mutex row, state row, and past a crashed holder's expired permit.
func testTokensStateMutexState(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	const key = "tokens-smm"
	var last uint64
	next := func(req driver.Request) {
		t.Helper()
		g := mustAcquire(t, b, req)
		if g.Token <= last {
			t.Fatalf("%s's token %d not above %d", req.Owner, g.Token, last)
		}
		last = g.Token
	}
	next(permit(key, "s1", 2))
	if err := b.Release(ctx, key, "s1"); err != nil {
		t.Fatal(err)
	}
	next(writer(key, "m1"))
	if err := b.Release(ctx, key, "m1"); err != nil {
		t.Fatal(err)
	}
	next(reader(key, "r1"))
	next(reader(key, "r2"))
	if err := b.Release(ctx, key, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "r2"); err != nil {
		t.Fatal(err)
	}
	crashed := permit(key, "s2", 3)
	crashed.TTL = 200 * time.Millisecond
	next(crashed)
	time.Sleep(300 * time.Millisecond)
	next(writer(key, "m2"))
	if err := b.Release(ctx, key, "m2"); err != nil {
		t.Fatal(err)
	}
	crashed.Limit = 2
	next(crashed)
	time.Sleep(300 * time.Millisecond)
	next(permit(key, "s3", 2))
	next(reader(key+"x", "r3")) // another key: its own sequence
	last = 0
	next(permit(key, "s4", 2))
}

// ForceRelease of a read-write key with a writer queued before readers wakes the
// writer alone; the readers after it wait for it.
func testForceReleaseWakesWriterFirst(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b, bw, br := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer b.Close()
	defer bw.Close()
	defer br.Close()
	const key = "force-rw"
	mustAcquire(t, b, reader(key, "r0"))
	w := semWaiter(t, bw, writer(key, "w"))
	r := semWaiter(t, br, reader(key, "r1"))
	if _, err := b.Acquire(ctx, reader(key, "r2")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a reader behind a queued writer: %v, want ErrLocked", err)
	}
	if err := b.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	woken(t, w, "the writer was not woken by the force release")
	notWoken(t, r, 300*time.Millisecond, "a reader behind the writer was woken")
	req := writer(key, "w")
	req.Wait, req.Patience = true, time.Minute
	mustAcquire(t, bw, req)
	rreq := reader(key, "r1")
	rreq.Wait, rreq.Patience = true, time.Minute
	if _, err := br.Acquire(ctx, rreq); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a reader beside the writer: %v, want ErrLocked", err)
	}
	if err := bw.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
	woken(t, r, "the reader was not woken by the writer's release")
	mustAcquire(t, br, rreq)
}

// Lock calls (the core's) that give up while waiting for a permit or a reader's
// or writer's grant leave no place and no permit.
func testCancelledLockLeavesNothing(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	const key = "cancelled"
	mustAcquire(t, b, permit(key, "h", 2))
	mustAcquire(t, b, permit(key, "h2", 2))
	mustAcquire(t, b, writer(key+"-rw", "h"))
	c, err := dlock.New(open(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, k := range []struct {
		key  string
		opts []dlock.Option
	}{{key, []dlock.Option{dlock.WithLimit(2)}}, {key + "-rw", []dlock.Option{dlock.WithShared()}}, {key + "-rw", nil}} {
		for _, d := range []time.Duration{time.Millisecond, 20 * time.Millisecond, 300 * time.Millisecond} {
			lctx, cancel := context.WithTimeout(ctx, d)
			if _, err := c.Lock(lctx, k.key, k.opts...); err == nil {
				t.Fatalf("%s: granted", k.key)
			}
			cancel()
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, k := range []string{key, key + "-rw"} {
		if places, err := b.Queue(ctx, k); err != nil || len(places) != 0 {
			t.Fatalf("%s: Queue = %+v, %v; want none", k, places, err)
		}
		if _, hs, err := b.Holders(ctx, k); err != nil || len(hs) < 1 || len(hs) > 2 {
			t.Fatalf("%s: Holders = %+v, %v", k, hs, err)
		}
	}
	if err := b.Release(ctx, key+"-rw", "h"); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, b, reader(key+"-rw", "r"))
}

// AcquireAll grants a key that a semaphore's and a reader's holders have left
// free (its row still a state row), as Acquire does, and refuses one with a
// live permit or place, changing nothing.
func testAcquireAllFreeStateRow(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b := open(t, srv.URL())
	defer b.Close()
	const k1, k2, k3 = "all-1", "all-2", "all-3"
	mustAcquire(t, b, permit(k1, "s", 2))
	mustAcquire(t, b, reader(k2, "r"))
	if _, err := b.AcquireAll(ctx, []driver.Request{writer(k1, "x"), writer(k2, "x"), writer(k3, "x")}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("AcquireAll beside a permit: %v, want ErrLocked", err)
	}
	if err := b.Release(ctx, k1, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AcquireAll(ctx, []driver.Request{writer(k1, "x"), writer(k2, "x"), writer(k3, "x")}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("AcquireAll beside a reader: %v, want ErrLocked", err)
	}
	if _, hs, err := b.Holders(ctx, k2); err != nil || len(hs) != 1 || hs[0].Owner != "r" {
		t.Fatalf("Holders = %+v, %v", hs, err)
	}
	if err := b.Release(ctx, k2, "r"); err != nil {
		t.Fatal(err)
	}
	gs, err := b.AcquireAll(ctx, []driver.Request{writer(k1, "x"), writer(k2, "x"), writer(k3, "x")})
	if err != nil {
		t.Fatalf("AcquireAll of keys left free by permits: %v", err)
	}
	for i, k := range []string{k1, k2, k3} {
		info, err := b.Inspect(ctx, k)
		if err != nil || info.Owner != "x" || info.Token != gs[i].Token {
			t.Fatalf("%s: Inspect = %+v, %v; want x's grant %d", k, info, err, gs[i].Token)
		}
		if _, err := b.Acquire(ctx, reader(k, "r2")); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("%s: a reader beside AcquireAll's grant: %v, want ErrLocked", k, err)
		}
		if err := b.Release(ctx, k, "x"); err != nil {
			t.Fatal(err)
		}
	}
}

// A writer's place made on a read-write key lapses; the key becomes a mutex's,
// the writer queues again behind its holder (the mutex path), whose release
// hands it the key; the writer gives up (Stop): the handed grant goes on, not
// left held for a TTL.
func testLapsedSemPlaceHandedStop(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b, bw := open(t, srv.URL()), open(t, srv.URL())
	defer b.Close()
	defer bw.Close()
	db := admin(t, srv)
	const key = "lapsed-sem-place"
	mustAcquire(t, b, reader(key, "r0"))
	w := semWaiter(t, bw, writer(key, "w"))
	if _, err := db.ExecContext(ctx, "UPDATE dlock_locks_queue SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE lock_key = ?", key); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "r0"); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, b, writer(key, "m"))
	req := writer(key, "w")
	req.Wait, req.Patience = true, time.Minute
	if _, err := bw.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the writer's attempt beside the mutex's holder: %v, want ErrLocked", err)
	}
	if err := b.Release(ctx, key, "m"); err != nil {
		t.Fatal(err)
	}
	// The release handed the key on: a newcomer does not pass the place.
	if _, err := b.Acquire(ctx, writer(key, "newcomer")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a newcomer after the holder's release, the writer queued: %v, want ErrLocked", err)
	}
	woken(t, w, "the writer was not handed the key")
	if err := w.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if info, err := b.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after the handed writer gave up = %+v, %v; want ErrNotHeld", info, err)
	}
}

// A writer handed the key (its listener delivered the grant) before a reader
// made it a writer's permit: the writer's grant, its Refresh and its Release work,
// and the release wakes the reader.
func testHandedGrantDeliveredConverted(t *testing.T, srv *testserver.MariaDB) {
	ctx := semCtx(t)
	b, bw, br := open(t, srv.URL()), open(t, srv.URL()), open(t, srv.URL())
	defer b.Close()
	defer bw.Close()
	defer br.Close()
	const key = "handed-delivered"
	mustAcquire(t, b, writer(key, "h"))
	w := semWaiter(t, bw, writer(key, "w"))
	if err := b.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	woken(t, w, "the writer was not woken by the handoff")
	r := semWaiter(t, br, reader(key, "r"))
	req := writer(key, "w")
	req.Wait, req.Patience = true, time.Minute
	g := mustAcquire(t, bw, req)
	_ = w.Stop(ctx, true)
	if err := bw.Refresh(ctx, key, "w", time.Minute); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if _, hs, err := b.Holders(ctx, key); err != nil || len(hs) != 1 || hs[0].Owner != "w" || hs[0].Token != g.Token {
		t.Fatalf("Holders = %+v, %v; want w's grant %d", hs, err, g.Token)
	}
	if err := bw.Release(ctx, key, "w"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	woken(t, r, "the reader was not woken by the writer's release")
	rreq := reader(key, "r")
	rreq.Wait, rreq.Patience = true, time.Minute
	if rg := mustAcquire(t, br, rreq); rg.Token <= g.Token {
		t.Fatalf("reader's token %d not above the writer's %d", rg.Token, g.Token)
	}
}
