package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// TestRefusedWaitIsAsync checks which commits wait for the WAL flush: a waiting
// attempt that is refused (it writes only its place) does not, and a grant made by
// a waiting attempt does. It reads the server's WAL positions right after each call
// returns. The server runs with no other source of WAL (no autovacuum, no standby
// snapshots) and a WAL writer that, once it has flushed, waits 2 s before it
// flushes again: an asynchronous commit is still unflushed when the call returns.
func TestRefusedWaitIsAsync(t *testing.T) {
	srv := testserver.StartPostgres(t, "-c", "wal_level=minimal", "-c", "max_wal_senders=0",
		"-c", "autovacuum=off", "-c", "wal_writer_delay=2s")
	pool := admin(t, srv)
	be := open(t, srv.URL())
	defer be.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	key := drivertest.Key(t, "k")
	if _, err := be.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wait := func(owner string) error {
		_, err := be.Acquire(ctx, driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: true})
		return err
	}

	// The first asynchronous commit makes the WAL writer flush at once; wait for
	// that flush, after which it holds back for wal_writer_delay.
	if err := wait("w1"); !errors.As(err, new(*driver.HeldError)) {
		t.Fatalf("w1's attempt = %v, want a HeldError", err)
	}
	for unflushed(t, pool) {
		if ctx.Err() != nil {
			t.Fatal("the WAL writer never flushed the first refused attempt")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := wait("w2"); !errors.As(err, new(*driver.HeldError)) {
		t.Fatalf("w2's attempt = %v, want a HeldError", err)
	}
	if !unflushed(t, pool) {
		t.Fatal("a refused waiting attempt's commit waited for the WAL flush")
	}

	// A grant by a waiting attempt, of another key whose holder's grant lapsed.
	other := drivertest.Key(t, "other")
	if _, err := be.Acquire(ctx, driver.Request{Key: other, Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `UPDATE dlock_locks SET expires_at = now() - interval '1 second' WHERE key = $1`, other)
	if _, err := be.Acquire(ctx, driver.Request{Key: other, Owner: "w3", TTL: time.Minute, Wait: true}); err != nil {
		t.Fatalf("w3's attempt on the lapsed key: %v", err)
	}
	if unflushed(t, pool) {
		t.Fatal("a waiting attempt's grant returned before its commit was flushed")
	}
}

// unflushed reports whether WAL was written that is not yet flushed to disk.
func unflushed(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var behind bool
	err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()`).Scan(&behind)
	if err != nil {
		t.Fatal(err)
	}
	return behind
}
