package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

// TestBarrier checks the key's readers' barrier (readerID in sql/fragments.sql)
// where a reader's transaction is in flight, held at a chosen point by a
// trigger or by a transaction of the test's.
func TestBarrier(t *testing.T) {
	srv := testserver.StartPostgres(t)
	t.Run("ReaderGrantInFlight", func(t *testing.T) { testReaderGrantInFlight(t, srv) })
	t.Run("WatchReaderInFlight", func(t *testing.T) { testWatchReaderInFlight(t, srv) })
	t.Run("BarrierBeforeRow", func(t *testing.T) { testBarrierBeforeRow(t, srv) })
	t.Run("ReleaseCutShort", func(t *testing.T) { testReleaseCutShort(t, srv) })
}

// gatePermits makes the insert of owner's permit into table's permit table wait
// (in a trigger, BEFORE or AFTER as when says) until the returned func is
// called: the transaction that inserts it keeps, meanwhile, what it took before.
func gatePermits(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table, when, owner string, id int64) (open func()) {
	t.Helper()
	fn := table + "_fn"
	exec(t, pool, fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF NEW.owner = %s THEN PERFORM pg_advisory_xact_lock(%d); END IF;
		RETURN NEW;
	END $$`, fn, pgxQuote(owner), id))
	exec(t, pool, fmt.Sprintf(`CREATE OR REPLACE TRIGGER %s %s INSERT ON %s_permits FOR EACH ROW EXECUTE FUNCTION %s()`, table, when, table, fn))
	gate, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock($1)`, id); err != nil {
		gate.Release()
		t.Fatal(err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			defer gate.Release()
			if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock($1)`, id); err != nil {
				t.Error(err)
			}
		})
	}
}

// pgxQuote quotes s as an SQL string literal.
func pgxQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// awaitLockWaiters waits until at least n statements wait for a lock that cond
// (an SQL condition on pg_locks) selects, or fails the test naming what.
func awaitLockWaiters(t *testing.T, ctx context.Context, pool *pgxpool.Pool, cond string, n int, what string) {
	t.Helper()
	for deadline := time.Now().Add(drivertest.Wait); ; {
		var got int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND `+cond).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d statements waiting for a lock after %v, want %d", what, got, drivertest.Wait, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A reader's fast grant in flight (past read_lock, its permit not yet written:
// held here by a trigger on the permit table) holds the key's readers' barrier
// shared, so a writer's attempt on the key, free meanwhile (the reader before
// released it), waits for it and then finds the reader's permit: the reader and
// the writer never both hold. Without read_lock's barrier the writer is
// granted beside the reader.
func testReaderGrantInFlight(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	pool := admin(t, srv)
	rawURL := withQuery(srv.URL(), "table", "barrier_gate")
	b := open(t, rawURL)
	defer b.Close()
	slow := open(t, rawURL)
	defer slow.Close()
	unlock := gatePermits(t, ctx, pool, "barrier_gate", "BEFORE", "slow", 4343)
	defer unlock()
	key := drivertest.Key(t, "k")
	// A first reader's fast grant makes the key a read-write key.
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r0", TTL: time.Minute, Shared: true}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	reader := make(chan result, 1)
	go func() {
		g, err := slow.Acquire(ctx, driver.Request{Key: key, Owner: "slow", TTL: time.Minute, Shared: true})
		reader <- result{g, err}
	}()
	awaitLockWaiters(t, ctx, pool, `locktype = 'advisory' AND objid = 4343`, 1, "the slow reader's permit")
	// The first reader leaves: the key has no live permit but the one in flight.
	if err := b.Release(ctx, key, "r0"); err != nil {
		t.Fatal(err)
	}
	writer := make(chan result, 1)
	go func() {
		g, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "w", TTL: time.Minute})
		writer <- result{g, err}
	}()
	// The writer waits for the barrier (or, without it, is answered at once).
	select {
	case w := <-writer:
		writer <- w
	case <-time.After(200 * time.Millisecond):
		awaitLockWaiters(t, ctx, pool, `locktype = 'advisory' AND objid <> 4343`, 1, "the writer")
	}
	unlock()
	r, w := <-reader, <-writer
	if r.err != nil {
		t.Fatalf("the slow reader: %v", r.err)
	}
	if w.err == nil {
		t.Fatalf("a writer granted (token %d) beside a reader whose grant was in flight (token %d)", w.g.Token, r.g.Token)
	}
	if !errors.As(w.err, new(*driver.HeldError)) {
		t.Fatalf("the writer: %v, want held", w.err)
	}
	if limit, hs, err := b.Holders(ctx, key); err != nil || limit != 1 || len(hs) != 1 || hs[0].Owner != "slow" {
		t.Fatalf("Holders: %d %+v %v; want the slow reader alone", limit, hs, err)
	}
	if err := slow.Release(ctx, key, "slow"); err != nil {
		t.Fatal(err)
	}
}

// A holder watch that starts while a reader's fast grant is in flight, its
// notify (readNotify) already past and finding no watch, waits for that
// transaction (the key's readers' barrier, watch.go): either the watch starts
// after the grant committed, or it is told of it. Without the barrier the
// watch starts at once, reads no holder, and is never told of the reader.
func testWatchReaderInFlight(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	pool := admin(t, srv)
	rawURL := withQuery(srv.URL(), "table", "watch_gate")
	b := open(t, rawURL)
	defer b.Close()
	slow := open(t, rawURL)
	defer slow.Close()
	// An AFTER trigger runs at the end of the statement, after its notify.
	unlock := gatePermits(t, ctx, pool, "watch_gate", "AFTER", "late", 4344)
	defer unlock()
	key := drivertest.Key(t, "k")
	// The listening connection is up before the reader starts.
	w0, err := b.WatchHolder(ctx, key+"-other")
	if err != nil {
		t.Fatal(err)
	}
	w0.Stop()
	reader := make(chan error, 1)
	go func() {
		_, err := slow.Acquire(ctx, driver.Request{Key: key, Owner: "late", TTL: time.Minute, Shared: true})
		reader <- err
	}()
	awaitLockWaiters(t, ctx, pool, `locktype = 'advisory' AND objid = 4344`, 1, "the reader's grant at its trigger")
	type started struct {
		w       driver.HolderWatch
		holders int
		err     error
	}
	watch := make(chan started, 1)
	go func() {
		w, err := b.WatchHolder(ctx, key)
		if err != nil {
			watch <- started{err: err}
			return
		}
		_, hs, err := b.Holders(ctx, key)
		watch <- started{w, len(hs), err}
	}()
	var s started
	early := false
	select {
	case s = <-watch:
		early = true // started while the reader's grant was in flight
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	if err := <-reader; err != nil {
		t.Fatalf("the reader: %v", err)
	}
	if !early {
		s = <-watch
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer s.w.Stop()
	if s.holders == 1 {
		return // the watch started after the grant committed
	}
	select {
	case <-s.w.C():
	case <-time.After(drivertest.Wait):
		t.Fatalf("a watch that started (early: %v) while a reader's grant was in flight read no holder and was never told of the reader", early)
	}
}

// Every statement that takes both takes the key's readers' barrier before the
// key's row (lock_row.sql, its .Multi too, and sem_lock.sql): behind a reader in
// flight, a writer's attempt (sem_lock) queues for the barrier, then a refresh
// of a reader's permit (lock_row) or a set's attempt (lock_row .Multi) does; when
// the reader commits all finish, and the server saw no deadlock. Were either to
// lock the row first, it would hold the row while waiting for the barrier, which
// the writer's attempt gets first and then waits for the row: a deadlock (40P01)
// after deadlock_timeout (which AcquireAll retries unseen).
func testBarrierBeforeRow(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	h := harness(t, srv)
	pool := admin(t, srv)
	serverDeadlocks := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, second := range []string{"refresh", "set"} {
		before := serverDeadlocks()
		b := h.Open(t).(*pglock.Backend)
		key := drivertest.Key(t, second)
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r", TTL: time.Minute, Shared: true}); err != nil {
			t.Fatal(err)
		}
		tx := readerInFlight(t, ctx, b, key)
		writer := make(chan error, 1)
		go func() {
			_, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "w", TTL: time.Minute})
			writer <- err
		}()
		awaitLockWaiters(t, ctx, pool, "true", 1, "the writer's attempt")
		done := make(chan error, 1)
		go func() {
			if second == "refresh" {
				done <- b.Refresh(ctx, key, "r", time.Minute)
				return
			}
			_, err := b.AcquireAll(ctx, []driver.Request{{Key: key, Owner: "s", TTL: time.Minute}, {Key: key + "-z", Owner: "s", TTL: time.Minute}})
			if errors.As(err, new(*driver.HeldError)) {
				err = nil // the reader holds the key
			}
			done <- err
		}()
		awaitLockWaiters(t, ctx, pool, "true", 2, "the "+second)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Errorf("the %s: %v", second, err)
		}
		if err := <-writer; !errors.As(err, new(*driver.HeldError)) {
			t.Errorf("the writer's attempt beside the reader: %v, want held", err)
		}
		if err := b.Release(ctx, key, "r"); err != nil {
			t.Fatal(err)
		}
		b.Close() // its connections' backends report their statistics as they exit
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if serverDeadlocks() != before {
				break
			}
		}
		if n := serverDeadlocks() - before; n != 0 {
			t.Errorf("the %s behind a writer's attempt: the server detected %d deadlocks", second, n)
		}
	}
}

// A reader's fast release that finds a writer queued but cannot take the key's
// readers' barrier at once (another reader's transaction holds it) commits, then
// runs the handoff (lock_row, sem_wake) in a transaction of its own, which waits
// for the barrier. When the caller's context ends first, the handoff goes on in
// the background, and the writer is woken once the reader in flight commits (it
// was dropped before, and the writer waited for its own retry).
func testReleaseCutShort(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	h := harness(t, srv)
	b, bw := h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend)
	defer b.Close()
	defer bw.Close()
	key := drivertest.Key(t, "k")
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r1", TTL: time.Minute, Shared: true}); err != nil {
		t.Fatal(err)
	}
	w := queueRW(t, bw, key, "w", false)
	defer w.Stop(ctx, false)
	select {
	case <-w.C(): // a wake-up left by the queueing attempt
	default:
	}
	tx := readerInFlight(t, ctx, b, key)
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	err := b.Release(rctx, key, "r1")
	rcancel()
	t.Logf("the release beside a reader in flight: %v after %v; reserved %v", err, time.Since(start), reservedFor(t, b, pglock.DefaultTable, key))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
		t.Logf("woken %v after the release began; reserved %v", time.Since(start), reservedFor(t, b, pglock.DefaultTable, key))
	case <-time.After(drivertest.Wait):
		_, hs, _ := b.Holders(ctx, key)
		t.Fatalf("the queued writer was not woken %v after the last reader left (holders %+v, reserved %v)", drivertest.Wait, hs, reservedFor(t, b, pglock.DefaultTable, key))
	}
}
