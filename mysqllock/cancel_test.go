package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
)

// TestLockWait: a statement of dlock's waits at most about a second for a key's row
// lock (innodb_lock_wait_timeout on its sessions). A call cut short while its
// statement waits leaves that statement on the server (the driver closes the
// connection, which the server sees only when the statement ends): it must not
// linger there, holding a connection, for the server's default 50 s. A call that
// does not give up runs its statement again and is granted once the row is free.
func TestLockWait(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	db := admin(t, srv)
	b := open(t, srv.URL())
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	key := drivertest.Key(t, "k")
	req := driver.Request{Key: key, Owner: "first", TTL: 10 * time.Second}
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "first"); err != nil {
		t.Fatal(err)
	}

	tx := holdRow(ctx, t, db, key) // another session holds the key's row
	defer tx.Rollback()

	short, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := b.Acquire(short, driver.Request{Key: key, Owner: "gone", TTL: 10 * time.Second})
	stop()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an acquire cut short behind a held row: %v, want DeadlineExceeded", err)
	}
	// Its statement ends on the server within the lock wait timeout (well before
	// the server's default of 50 s).
	waitGone(ctx, t, db, "%INTO `"+mysqllock.DefaultTable+"`%")

	// A call that waits longer than the lock wait timeout runs its statement
	// again, and is granted once the row is free.
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "patient", TTL: 10 * time.Second})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("granted while another session holds the row: %v", err)
	case <-time.After(2500 * time.Millisecond): // past two lock wait timeouts
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("an acquire that outwaited the lock wait timeout: %v, want granted", err)
	}
}

// TestKilled: a transaction whose call is cut short while it waits for a key's row
// lock is ended on the server at once (KILL QUERY), whatever the session's lock wait
// timeout: the pool here keeps the server's default of 50 s (New leaves a pool's
// settings alone). A semaphore's attempt and AcquireAll run as transactions.
func TestKilled(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	db := admin(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	b, err := mysqllock.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, tc := range []struct {
		name    string
		acquire func(ctx context.Context, key string) error
	}{
		{"Semaphore", func(ctx context.Context, key string) error {
			_, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "gone", TTL: 10 * time.Second, Limit: 2})
			return err
		}},
		{"AcquireAll", func(ctx context.Context, key string) error {
			_, err := b.AcquireAll(ctx, []driver.Request{
				{Key: key, Owner: "gone", TTL: 10 * time.Second},
				{Key: key + "~", Owner: "gone", TTL: 10 * time.Second},
			})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := drivertest.Key(t, "k")
			if err := tc.acquire(ctx, key); err != nil { // the key's row exists
				t.Fatal(err)
			}
			if err := b.Release(ctx, key, "gone"); err != nil {
				t.Fatal(err)
			}
			if err := b.Release(ctx, key+"~", "gone"); err != nil && !errors.Is(err, driver.ErrNotHeld) {
				t.Fatal(err)
			}
			tx := holdRow(ctx, t, db, key) // another session holds the key's row
			defer tx.Rollback()
			short, stop := context.WithTimeout(ctx, 100*time.Millisecond)
			err := tc.acquire(short, key)
			stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a call cut short behind a held row: %v, want DeadlineExceeded", err)
			}
			waitGone(ctx, t, db, "%`"+mysqllock.DefaultTable+"`%")
		})
	}
}

// waitGone waits until no session but the caller's runs a statement like pattern,
// and fails the test if one still does after 10 s.
func waitGone(ctx context.Context, t *testing.T, db *sql.DB, pattern string) {
	t.Helper()
	waitStatements(ctx, t, db, pattern, false, "a statement of a call cut short still runs on the server after 10 s")
}

// waitStatements waits up to 10 s until statements whose text matches pattern (LIKE)
// run on the server (running) or none does, and fails the test with failure if
// that does not come.
func waitStatements(ctx context.Context, t *testing.T, db *sql.DB, pattern string, running bool, failure string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE id <> CONNECTION_ID() AND command <> 'Sleep' AND info LIKE ?",
			pattern).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if (n > 0) == running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(failure)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKilledFullPool: calls cut short together while they hold every connection of
// the pool return at once. The KILL QUERY of each needs a connection of the pool;
// a call must not keep its own while it waits for its KILL (which would then wait
// for a free connection, up to its bound, while every call waits for its KILL).
func TestKilledFullPool(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	db := admin(t, srv)
	b := open(t, withQuery(srv.URL(), "max_conns", "3"))
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	key := drivertest.Key(t, "k")
	sem := func(ctx context.Context, owner string) error {
		_, err := b.Acquire(ctx, driver.Request{Key: key, Owner: owner, TTL: 10 * time.Second, Limit: 5})
		return err
	}
	if err := sem(ctx, "first"); err != nil { // the key's row exists
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "first"); err != nil {
		t.Fatal(err)
	}
	tx := holdRow(ctx, t, db, key) // another session holds the key's row
	defer tx.Rollback()
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	took := make([]time.Duration, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			errs[i] = sem(short, "gone"+string(rune('a'+i)))
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("call %d cut short behind a held row: %v, want DeadlineExceeded", i, err)
		}
		if took[i] > 4*time.Second { // 5.3 s when each waits killWithin for a connection
			t.Errorf("call %d cut short after 300ms returned after %v", i, took[i].Round(time.Millisecond))
		}
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, db, "%`"+mysqllock.DefaultTable+"`%")
}

// holdRow locks key's row in a transaction of db, which the caller ends.
func holdRow(ctx context.Context, t *testing.T, db *sql.DB, key string) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "SELECT token FROM `"+mysqllock.DefaultTable+"` WHERE lock_key = ? FOR UPDATE", key); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	return tx
}

// TestPlaceWriteOutlivesCancel: a waiter whose call ends while the insert of its
// place is under way on the server leaves no place behind. Cut short, the insert
// would lose only its reply: the server runs it on, and it could make the place
// after the wait's Stop withdrew it (finding nothing). That place would stay live,
// first in line, for its patience, and a release would hand the key to it: held
// by no one for its TTL. Here another session's gap lock holds the insert on the
// server while the call is cancelled, and lets it go after a moment.
func TestPlaceWriteOutlivesCancel(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	db := admin(t, srv)
	b := open(t, srv.URL())
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	key := drivertest.Key(t, "k")
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	queue := "`" + mysqllock.DefaultTable + "_queue`"
	// A locking read of the waiter's place, which is not there yet, locks the gap
	// it would go in: the insert waits, the withdrawal's statements do not.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var id int64
	if err := tx.QueryRowContext(ctx, "SELECT id FROM "+queue+" WHERE lock_key = ? AND owner = ? FOR UPDATE", key, "w").Scan(&id); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("locking read of the place: %v", err)
	}
	w, err := b.Watch(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(wctx, driver.Request{Key: key, Owner: "w", TTL: time.Minute, Wait: true, Patience: time.Minute})
		done <- err
	}()
	waitStatements(ctx, t, db, "%INTO "+queue+"%", true, "the insert of the place never waited for the gap lock")
	time.Sleep(100 * time.Millisecond)
	wcancel()
	go func() { // the insert goes on after a moment
		time.Sleep(300 * time.Millisecond)
		_ = tx.Commit()
	}()
	if err := <-done; err == nil {
		t.Fatal("the cancelled waiting attempt was granted")
	}
	if err := w.Stop(ctx, false); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	time.Sleep(500 * time.Millisecond) // an insert cut short lands by now
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+queue+" WHERE lock_key = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d places left behind by a cancelled waiter", n)
	}
}
