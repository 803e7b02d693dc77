package pglock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

// TestValues runs the tests of values and holder watches, on one server.
func TestValues(t *testing.T) {
	srv := testserver.StartPostgres(t)
	t.Run("HandedValue", func(t *testing.T) { testHandedValue(t, srv) })
	t.Run("SetValue", func(t *testing.T) { testSetValue(t, srv) })
	t.Run("WatchNotifies", func(t *testing.T) { testWatchNotifies(t, srv) })
	t.Run("NotifyOnlyWhenWatched", func(t *testing.T) { testNotifyOnlyWhenWatched(t, srv) })
	t.Run("WatchReconnect", func(t *testing.T) { testWatchReconnect(t, srv) })
	t.Run("WatchAfterChange", func(t *testing.T) { testWatchAfterChange(t, srv) })
	t.Run("AddValueColumn", func(t *testing.T) { testAddValueColumn(t, srv) })
	t.Run("AddValueColumnNotOwner", func(t *testing.T) { testAddValueColumnNotOwner(t, srv) })
}

func value(t *testing.T, b *pglock.Backend, key string) []byte {
	t.Helper()
	info, err := b.Inspect(context.Background(), key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return info.Value
}

func wantValue(t *testing.T, b *pglock.Backend, key string, want []byte) {
	t.Helper()
	if got := value(t, b, key); !bytes.Equal(got, want) || (want == nil) != (got == nil) {
		t.Fatalf("value %q, want %q", got, want)
	}
}

// A grant handed over to a queued waiter carries the waiter's value, not the
// releasing holder's; a grant taken over from an expired holder has its own value.
func testHandedValue(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	a, b := h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend)
	defer a.Close()
	defer b.Close()
	key := drivertest.Key(t, "k")
	req := func(owner, v string, wait bool) driver.Request {
		r := driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: wait}
		if wait {
			r.Patience = time.Minute
		}
		if v != "" {
			r.Value = []byte(v)
		}
		return r
	}
	if _, err := a.Acquire(ctx, req("a", "va", false)); err != nil {
		t.Fatal(err)
	}
	wantValue(t, a, key, []byte("va"))
	w, err := b.Watch(ctx, key, "b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, req("b", "vb", true)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("queued Acquire: %v", err)
	}
	if err := a.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	// The release granted the key to the waiter's place directly, with its value.
	if info, err := a.Inspect(ctx, key); err != nil || info.Owner != "b" {
		t.Fatalf("Inspect of a key handed to a waiter: %+v, %v", info, err)
	}
	wantValue(t, a, key, []byte("vb"))
	select {
	case <-w.C():
	case <-time.After(drivertest.Wait):
		t.Fatal("waiter not woken")
	}
	if _, err := b.Acquire(ctx, req("b", "vb", true)); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	wantValue(t, a, key, []byte("vb"))
	// Re-entry replaces the value, or clears it.
	r := req("b", "vb2", false)
	r.Reenter = true
	if _, err := b.Acquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	wantValue(t, a, key, []byte("vb2"))
	r.Value = nil
	if _, err := b.Acquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	wantValue(t, a, key, nil)
	r.Value = []byte("vb3")
	if _, err := b.Acquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	// A refused attempt (same owner, no re-entry) changes nothing.
	if _, err := b.Acquire(ctx, req("b", "other", false)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("Acquire of a held key: %v", err)
	}
	wantValue(t, a, key, []byte("vb3"))
	// b's grant expires; a's attempt takes the row over, without a value.
	h.Expire(t, key)
	if _, err := a.Acquire(ctx, req("a", "", false)); err != nil {
		t.Fatal(err)
	}
	wantValue(t, a, key, nil)
	if err := a.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	// A new row, with and without a value (the two fast-path statements).
	if _, err := a.Acquire(ctx, req("a", "new", false)); err != nil {
		t.Fatal(err)
	}
	wantValue(t, a, key, []byte("new"))
	if err := a.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, req("a", "", false)); err != nil {
		t.Fatal(err)
	}
	wantValue(t, a, key, nil)
}

// SetValue compares the owner, keeps the TTL, and reports ErrNotHeld for a key
// that is free, reserved for a waiter, or held by another owner.
func testSetValue(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	a := h.Open(t).(*pglock.Backend)
	defer a.Close()
	key := drivertest.Key(t, "k")
	if err := a.SetValue(ctx, key, "a", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue of a free key: %v", err)
	}
	if _, err := a.Acquire(ctx, driver.Request{Key: key, Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	before, err := a.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	err = a.SetValue(ctx, key, "b", []byte("x"))
	if !errors.Is(err, driver.ErrNotHeld) || !strings.Contains(err.Error(), key) {
		t.Fatalf("SetValue by another owner: %v", err)
	}
	big := bytes.Repeat([]byte{0, 0xff, 'v'}, driver.MaxValueLen/3)
	if err := a.SetValue(ctx, key, "a", big); err != nil {
		t.Fatal(err)
	}
	after, err := a.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(after.Value, big) || after.Owner != "a" || after.Token != before.Token {
		t.Fatalf("after SetValue: %+v", after)
	}
	if after.TTL > before.TTL {
		t.Fatalf("SetValue extended the TTL: %v, then %v", before.TTL, after.TTL)
	}
	if err := a.SetValue(ctx, key, "a", []byte{}); err != nil {
		t.Fatal(err)
	}
	wantValue(t, a, key, nil)
	h.Expire(t, key)
	if err := a.SetValue(ctx, key, "a", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue of an expired grant: %v", err)
	}
}

// recv waits for a notification on c.
func recv(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(drivertest.Wait):
		t.Fatalf("no notification after %s", what)
	}
}

// quiet checks that nothing arrives on c for a while.
func quiet(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
		t.Fatalf("notification after %s", what)
	case <-time.After(200 * time.Millisecond):
	}
}

// Each change of the holder or its value notifies the watches of the key, on
// another client too, and only of that key.
func testWatchNotifies(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	a, b, wb := h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend)
	defer a.Close()
	defer b.Close()
	defer wb.Close()
	key, other := drivertest.Key(t, "k")+` it's "odd" 日本`, drivertest.Key(t, "other")
	w1, err := wb.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := wb.WatchHolder(ctx, key) // two watches of one key share a lock
	if err != nil {
		t.Fatal(err)
	}
	wo, err := wb.WatchHolder(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	defer wo.Stop()
	both := func(what string) {
		t.Helper()
		recv(t, w1.C(), what)
		recv(t, w2.C(), what)
	}
	ttl := driver.Request{Key: key, TTL: time.Minute}
	r := ttl
	r.Owner = "a"
	if _, err := a.Acquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	both("a grant")
	if err := a.SetValue(ctx, key, "a", []byte("v")); err != nil {
		t.Fatal(err)
	}
	both("SetValue")
	if err := a.Refresh(ctx, key, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	quiet(t, w1.C(), "Refresh")
	// A queued waiter: the release grants the lock to its place (a new holder),
	// the waiter takes that grant without a statement (no change).
	wt, err := b.Watch(ctx, key, "b")
	if err != nil {
		t.Fatal(err)
	}
	rb := ttl
	rb.Owner, rb.Wait, rb.Patience = "b", true, time.Minute
	if _, err := b.Acquire(ctx, rb); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("queued Acquire: %v", err)
	}
	quiet(t, w1.C(), "queueing")
	if err := a.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	both("a handoff")
	recv(t, wt.C(), "a handoff (the waiter)")
	if _, err := b.Acquire(ctx, rb); err != nil {
		t.Fatal(err)
	}
	quiet(t, w1.C(), "the waiter's taking of its handed grant")
	if err := wt.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := a.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	both("ForceRelease")
	quiet(t, wo.C(), "changes of another key")
	// A stopped watch hears nothing more; the other still does.
	w2.Stop()
	if _, err := a.Acquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	recv(t, w1.C(), "a grant")
	if err := a.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	recv(t, w1.C(), "a release")
	quiet(t, w2.C(), "Stop")
	w1.Stop()
}

// watchChannel returns the watch channel of table.
func watchChannel(t *testing.T, srv *testserver.Postgres, table string) string {
	var oid uint32
	if err := admin(t, srv).QueryRow(context.Background(), `SELECT to_regclass($1)::oid`, table).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint("dlock_watch_", oid)
}

// An uncontended cycle sends no NOTIFY while no one watches the key, one per
// change, with the key, while someone does, and none again once the watch stopped.
func testNotifyOnlyWhenWatched(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	a, wb := h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend)
	defer a.Close()
	defer wb.Close()
	got := listenRaw(t, srv, watchChannel(t, srv, pglock.DefaultTable))
	key := drivertest.Key(t, "k")
	cycle := func() {
		t.Helper()
		if _, err := a.Acquire(ctx, driver.Request{Key: key, Owner: "a", TTL: time.Minute, Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		if err := a.SetValue(ctx, key, "a", []byte("w")); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx, key, "a"); err != nil {
			t.Fatal(err)
		}
	}
	cycle()
	if n := got(300 * time.Millisecond); len(n) != 0 {
		t.Fatalf("notifications without a watch: %q", n)
	}
	w, err := wb.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	cycle()
	if n := got(300 * time.Millisecond); len(n) != 3 || n[0] != key || n[1] != key || n[2] != key {
		t.Fatalf("notifications with a watch: %q, want 3 × %q", n, key)
	}
	w.Stop()
	deadline := time.Now().Add(drivertest.Wait)
	for { // the listener gives up the key's lock on its own goroutine
		cycle()
		n := got(100 * time.Millisecond)
		if len(n) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("notifications after Stop: %q", n)
		}
	}
}

// When the listening connection is lost, every watch receives once it is back,
// and later changes notify it again.
func testWatchReconnect(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	pool := admin(t, srv)
	h := harness(t, srv)
	a := h.Open(t).(*pglock.Backend)
	defer a.Close()
	u, _ := url.Parse(withQuery(srv.URL(), "application_name", "watch-rc"))
	wb, err := pglock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Close()
	key := drivertest.Key(t, "k")
	w, err := wb.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if n := terminate(t, pool, "watch-rc"); n < 1 {
		t.Fatalf("terminated %d connections", n)
	}
	recv(t, w.C(), "a reconnect")
	// Once the lock is taken again a change notifies; a change made before that
	// may be covered only by the reconnect's notification, so wait for quiet first.
	deadline := time.Now().Add(drivertest.Wait)
	for {
		select {
		case <-w.C():
			if time.Now().After(deadline) {
				t.Fatal("notifications never stop")
			}
			continue
		case <-time.After(300 * time.Millisecond):
		}
		break
	}
	if _, err := a.Acquire(ctx, driver.Request{Key: key, Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	recv(t, w.C(), "a grant after the reconnect")
}

// A change whose transaction found no watch (its try of the key's lock succeeded)
// and has not committed yet would notify no one: WatchHolder returns only after it
// committed, so that the caller's next read sees it.
func testWatchAfterChange(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	wb := h.Open(t).(*pglock.Backend)
	defer wb.Close()
	key := drivertest.Key(t, "k")
	tx, err := admin(t, srv).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var tried bool
	err = tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1::text COLLATE "C", to_regclass($2)::oid::bigint))`, key, pglock.DefaultTable).Scan(&tried)
	if err != nil || !tried {
		t.Fatalf("try the key's lock: %v, %v", tried, err)
	}
	done := make(chan error, 1)
	go func() {
		w, err := wb.WatchHolder(ctx, key)
		if err == nil {
			w.Stop()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("WatchHolder returned while a change of the key was in flight: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(drivertest.Wait):
		t.Fatal("WatchHolder never returned")
	}
}

// oldTable creates a lock table as versions before values did.
func oldTable(t *testing.T, srv *testserver.Postgres, table string) {
	pool := admin(t, srv)
	exec(t, pool, `DROP TABLE IF EXISTS `+table)
	exec(t, pool, `DROP SEQUENCE IF EXISTS `+table+`_token_seq`)
	exec(t, pool, `CREATE SEQUENCE `+table+`_token_seq AS bigint START WITH 1000`)
	exec(t, pool, `CREATE TABLE `+table+` (
	key        text COLLATE "C" PRIMARY KEY,
	owner      text NOT NULL,
	token      bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	reserved   boolean NOT NULL DEFAULT false,
	queue_owner   text[] NOT NULL DEFAULT '{}',
	queue_channel text[] NOT NULL DEFAULT '{}',
	queue_expires timestamptz[] NOT NULL DEFAULT '{}'
)`)
	// A grant of an older client.
	exec(t, pool, `INSERT INTO `+table+` (key, owner, token, expires_at) VALUES ('held', 'old', 999, now() + interval '1 hour')`)
}

// Clients opening at once on a table of an earlier version all succeed; the value
// column is added once, the older client's grant is kept, and values work.
func testAddValueColumn(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	const table = "old_locks"
	oldTable(t, srv, table)
	u, _ := url.Parse(withQuery(srv.URL(), "table", table))
	const n = 8
	var wg sync.WaitGroup
	backends := make([]*pglock.Backend, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			backends[i], errs[i] = pglock.Open(ctx, u)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Open on an old table: %v", err)
		}
		defer backends[i].Close()
	}
	b := backends[0]
	info, err := b.Inspect(ctx, "held")
	if err != nil || info.Owner != "old" || info.Token != 999 || info.Value != nil {
		t.Fatalf("the older client's grant: %+v, %v", info, err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "a", TTL: time.Minute, Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	wantValue(t, backends[1], "k", []byte("v"))
	// An older client's statements, which never name the column, still work.
	exec(t, admin(t, srv), `INSERT INTO `+table+` (key, owner, token, expires_at) VALUES ('old2', 'old', 1001, now() + interval '1 hour')`)
	wantValue(t, b, "old2", nil)
}

// A role that may use an old table but does not own it cannot add the column:
// Open says what the owner must run, and changes nothing.
func testAddValueColumnNotOwner(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	const table = "old_locks_not_owned"
	pool := admin(t, srv)
	oldTable(t, srv, table)
	exec(t, pool, `DROP ROLE IF EXISTS notowner`)
	exec(t, pool, `CREATE ROLE notowner LOGIN PASSWORD 'notowner-pw'`)
	exec(t, pool, `GRANT SELECT, INSERT, UPDATE, DELETE ON `+table+` TO notowner`)
	exec(t, pool, `GRANT USAGE ON SEQUENCE `+table+`_token_seq TO notowner`)
	u, _ := url.Parse(withQuery(srv.URLFor("notowner", "notowner-pw", "postgres"), "table", table))
	_, err := pglock.Open(ctx, u)
	if err == nil || !strings.Contains(err.Error(), "ADD COLUMN IF NOT EXISTS value bytea") {
		t.Fatalf("Open on an old table the role does not own: %v", err)
	}
	t.Logf("not owner: %v", err)
	exec(t, pool, `ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS value bytea`)
	b, err := pglock.Open(ctx, u)
	if err != nil {
		t.Fatalf("Open once the owner added the column: %v", err)
	}
	b.Close()
}
