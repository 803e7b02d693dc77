package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

// TestQueue runs the tests of waiting in line, on one server.
func TestQueue(t *testing.T) {
	srv := testserver.StartPostgres(t)
	t.Run("CancelledInFlight", func(t *testing.T) { testCancelledInFlight(t, srv) })
}

// A waiter that gives up while its first queueing statement is still on its way
// leaves no place behind. The statement is held up on the row (a transaction of the
// test's locks it) until the waiting attempt has been cancelled and has returned,
// then commits its place; the waiter's Stop must withdraw that place, so that the key
// is free for the next TryLock as soon as the holder releases it, not reserved for a
// ghost. (This is what the core does when a Lock's context ends: Acquire returns,
// then Waiter.Stop(ctx, false) runs.)
func testCancelledInFlight(t *testing.T, srv *testserver.Postgres) {
	ctx, cancelT := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancelT()
	pool := admin(t, srv)
	h := harness(t, srv)
	holder, next := h.Client(t), h.Client(t)
	wb := h.Open(t).(*pglock.Backend)
	defer wb.Close()
	key := drivertest.Key(t, "k")
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	rowLock := func() pgx.Tx {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT FROM `+pglock.DefaultTable+` WHERE key = $1 FOR UPDATE`, key); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	gate := rowLock()
	defer func() { _ = gate.Rollback(context.Background()) }()
	w, err := wb.Watch(ctx, key, "ghost")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := make(chan error, 1)
	go func() {
		_, err := wb.Acquire(wctx, driver.Request{Key: key, Owner: "ghost", TTL: time.Minute, Wait: true, Patience: time.Minute})
		res <- err
	}()
	// The waiter's queueing statement is in flight: it waits for the row lock.
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%cur AS%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the waiter's attempt never queued up behind the row lock")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled attempt: %v", err)
	}
	// Let the statement through, and wait until it is done: the row lock is granted
	// in turn, so the test's next lock on the row comes after the statement's.
	if err := gate.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rowLock().Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(ctx, false); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	info, err := holder.Backend().(driver.Inspector).Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Waiters != 0 {
		t.Fatalf("a cancelled waiter left %d place(s) in the queue", info.Waiters)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := next.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock right after the release: %v (the lock was reserved for a ghost)", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
