//go:build unix

package pglock_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

// An attempt that is not a tracked wait's (a TryLock, a Lock's first attempt) ends
// with its statement when its call ends first: its outcome is the caller's. Cut
// short, pgx sends a cancel request and closes the connection, but a statement the
// server has not begun when the cancel comes runs after it, and could grant the
// key after the caller had gone (seen in the conformance suite's
// SameOwnerElsewhere under load: a stable owner id's grant then stayed for its TTL,
// and another client of that owner id released it as its own). Here the server
// process of the client's one connection is stopped (SIGSTOP) while the attempt
// is sent and its call cancelled, and continued a moment later.
func TestAttemptOutlivesCancel(t *testing.T) {
	srv := testserver.StartPostgres(t)
	pool := admin(t, srv)
	b := open(t, withQuery(srv.URL(), "pool_max_conns", "1", "application_name", "dlock_outlive"))
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	key := drivertest.Key(t, "k")
	if _, err := b.Acquire(ctx, driver.Request{Key: drivertest.Key(t, "other"), Owner: "o", TTL: time.Minute}); err != nil {
		t.Fatal(err) // the client's connection is open, its statements prepared
	}
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'dlock_outlive'`)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		t.Fatalf("the client's server processes: %v, %v", pids, err)
	}
	signal := func(sig syscall.Signal) {
		for _, pid := range pids {
			_ = syscall.Kill(int(pid), sig)
		}
	}
	signal(syscall.SIGSTOP)
	defer signal(syscall.SIGCONT)
	actx, acancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(actx, driver.Request{Key: key, Owner: "late", TTL: time.Minute})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the attempt is sent
	acancel()
	time.Sleep(200 * time.Millisecond) // the cancel request is made
	signal(syscall.SIGCONT)
	err = <-done
	time.Sleep(500 * time.Millisecond) // a statement cut short has run by now
	var owner string
	if err := pool.QueryRow(ctx, `SELECT owner FROM `+pglock.DefaultTable+` WHERE key = $1 AND expires_at > now()`, key).Scan(&owner); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	t.Logf("attempt: %v; holder after: %q", err, owner)
	if err != nil && owner == "late" {
		t.Fatalf("the cancelled attempt returned %v, and then the key was granted to it", err)
	}
	if err == nil && owner != "late" {
		t.Fatalf("the cancelled attempt returned a grant, but the key is held by %q", owner)
	}
}
