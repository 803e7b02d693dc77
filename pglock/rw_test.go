package pglock_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

func TestReadWrite(t *testing.T) {
	srv := testserver.StartPostgres(t)
	t.Run("RunOfReaders", func(t *testing.T) { testRunOfReaders(t, srv) })
	t.Run("WriterGivesUp", func(t *testing.T) { testWriterGivesUp(t, srv) })
	t.Run("Mismatch", func(t *testing.T) { testRWMismatch(t, srv) })
	t.Run("OldPermitTable", func(t *testing.T) { testOldPermitTable(t, srv) })
}

// rwReq is a waiting request of owner on key, shared or not.
func rwReq(key, owner string, shared bool) driver.Request {
	return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: true, Patience: time.Minute, Limit: 1, Shared: shared}
}

// queueRW registers a wait for owner on key and makes one waiting attempt, which
// must leave it queued.
func queueRW(t *testing.T, b *pglock.Backend, key, owner string, shared bool) driver.Waiter {
	t.Helper()
	ctx := context.Background()
	w, err := b.Watch(ctx, key, owner)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, rwReq(key, owner, shared))
	var held *driver.HeldError
	if !errors.As(err, &held) || !held.Queued {
		t.Fatalf("waiting attempt of %s: %v, want queued", owner, err)
	}
	return w
}

// reservedFor lists the owners key's permits are reserved for, shared or not.
func reservedFor(t *testing.T, b *pglock.Backend, table, key string) map[string]bool {
	t.Helper()
	rows, err := b.Pool().Query(context.Background(), `SELECT owner, shared FROM `+table+`_permits WHERE key = $1 AND reserved AND expires_at > now()`, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]bool{}
	for rows.Next() {
		var o string
		var shared bool
		if err := rows.Scan(&o, &shared); err != nil {
			t.Fatal(err)
		}
		got[o] = shared
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// A writer's release hands the key at once to the leading run of queued readers
// (each gets a reserved shared permit), not to the writer queued behind them nor
// the reader behind that writer; the readers' release hands it to the writer, and
// the writer's to the last reader. The first writer holds a plain mutex row,
// which the first reader's queueing turns into a read-write state row.
func testRunOfReaders(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	key := drivertest.Key(t, "k")
	w1, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "w1", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var waiters []driver.Waiter
	for _, q := range []struct {
		owner  string
		shared bool
	}{{"r1", true}, {"r2", true}, {"w2", false}, {"r3", true}} {
		waiters = append(waiters, queueRW(t, b, key, q.owner, q.shared))
	}
	defer func() {
		for _, w := range waiters {
			_ = w.Stop(ctx, true)
		}
	}()
	if limit, hs, err := b.Holders(ctx, key); err != nil || limit != 1 || len(hs) != 1 || hs[0].Owner != "w1" || hs[0].Shared || hs[0].Token != w1.Token || hs[0].Waiters != 4 {
		t.Fatalf("Holders with the writer holding = %d, %+v, %v", limit, hs, err)
	}
	if err := b.Release(ctx, key, "w1"); err != nil {
		t.Fatal(err)
	}
	if got := reservedFor(t, b, pglock.DefaultTable, key); len(got) != 2 || !got["r1"] || !got["r2"] {
		t.Fatalf("reserved after the writer's release: %v, want r1 and r2, shared", got)
	}
	var tokens []uint64
	for _, o := range []string{"r1", "r2"} {
		g, err := b.Acquire(ctx, rwReq(key, o, true))
		if err != nil {
			t.Fatalf("reader %s handed the key: %v", o, err)
		}
		tokens = append(tokens, g.Token)
	}
	// The reader behind the queued writer stays behind it.
	if _, err := b.Acquire(ctx, rwReq(key, "r3", true)); !errors.As(err, new(*driver.HeldError)) {
		t.Fatalf("reader behind a queued writer: %v, want held", err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r4", TTL: time.Minute, Shared: true}); !errors.As(err, new(*driver.HeldError)) {
		t.Fatalf("new reader while a writer is queued: %v, want held", err)
	}
	if _, hs, err := b.Holders(ctx, key); err != nil || len(hs) != 2 || !hs[0].Shared || !hs[1].Shared {
		t.Fatalf("Holders with two readers = %+v, %v", hs, err)
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Owner != "r1" || !info.Shared {
		t.Fatalf("Inspect = %+v, %v; want r1, shared", info, err)
	}
	if err := b.Release(ctx, key, "r1"); err != nil {
		t.Fatal(err)
	}
	if got := reservedFor(t, b, pglock.DefaultTable, key); len(got) != 0 {
		t.Fatalf("reserved with a reader still holding: %v", got)
	}
	if err := b.Release(ctx, key, "r2"); err != nil {
		t.Fatal(err)
	}
	if got := reservedFor(t, b, pglock.DefaultTable, key); len(got) != 1 || got["w2"] {
		t.Fatalf("reserved after the readers' release: %v, want w2, exclusive", got)
	}
	g, err := b.Acquire(ctx, rwReq(key, "w2", false))
	if err != nil || g.Token <= tokens[0] || g.Token <= tokens[1] {
		t.Fatalf("writer handed the key: %+v, %v (readers' tokens %v)", g, err, tokens)
	}
	if _, hs, err := b.Holders(ctx, key); err != nil || len(hs) != 1 || hs[0].Owner != "w2" || hs[0].Shared {
		t.Fatalf("Holders with the second writer = %+v, %v", hs, err)
	}
	if err := b.Release(ctx, key, "w2"); err != nil {
		t.Fatal(err)
	}
	if got := reservedFor(t, b, pglock.DefaultTable, key); len(got) != 1 || !got["r3"] {
		t.Fatalf("reserved after the second writer's release: %v, want r3, shared", got)
	}
	if _, err := b.Acquire(ctx, rwReq(key, "r3", true)); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "r3"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM `+pglock.DefaultTable+` WHERE key >= $1 AND key < $1 || chr(3)) + (SELECT count(*) FROM `+pglock.DefaultTable+`_permits WHERE key = $1)`, key).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows left of a free key: %d, %v", n, err)
	}
}

// A queued writer that gives up while readers hold hands the key at once to the
// readers queued behind it (up to the next writer), each woken.
func testWriterGivesUp(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	key := drivertest.Key(t, "k")
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r1", TTL: time.Minute, Shared: true}); err != nil {
		t.Fatal(err)
	}
	w1 := queueRW(t, b, key, "w1", false)
	r2 := queueRW(t, b, key, "r2", true)
	defer func() { _ = r2.Stop(ctx, true) }()
	w2 := queueRW(t, b, key, "w2", false)
	if err := w1.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := reservedFor(t, b, pglock.DefaultTable, key); len(got) != 1 || !got["r2"] {
		t.Fatalf("reserved after the writer gave up: %v, want r2, shared", got)
	}
	select {
	case <-r2.C():
	case <-time.After(drivertest.Wait):
		t.Fatal("the reader behind the writer was not woken")
	}
	if _, err := b.Acquire(ctx, rwReq(key, "r2", true)); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"r1", "r2"} {
		if err := b.Release(ctx, key, o); err != nil {
			t.Fatal(err)
		}
	}
	if got := reservedFor(t, b, pglock.DefaultTable, key); len(got) != 1 || got["w2"] {
		t.Fatalf("reserved after the readers' release: %v, want w2, exclusive", got)
	}
	if err := w2.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM `+pglock.DefaultTable+` WHERE key >= $1 AND key < $1 || chr(3)) + (SELECT count(*) FROM `+pglock.DefaultTable+`_permits WHERE key = $1)`, key).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows left once every waiter gave up: %d, %v", n, err)
	}
}

// A shared attempt on a semaphore's key, and a semaphore attempt on readers' key,
// fail with ErrLimitMismatch; a writer on readers' key is only refused.
func testRWMismatch(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	sem := drivertest.Key(t, "sem")
	if _, err := b.Acquire(ctx, driver.Request{Key: sem, Owner: "a", TTL: time.Minute, Limit: 2}); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []bool{false, true} {
		_, err := b.Acquire(ctx, driver.Request{Key: sem, Owner: "r", TTL: time.Minute, Wait: wait, Patience: time.Minute, Limit: 1, Shared: true})
		if !errors.Is(err, driver.ErrLimitMismatch) {
			t.Fatalf("reader on a semaphore's key (wait %v): %v, want ErrLimitMismatch", wait, err)
		}
	}
	rw := drivertest.Key(t, "rw")
	if _, err := b.Acquire(ctx, driver.Request{Key: rw, Owner: "r", TTL: time.Minute, Shared: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: rw, Owner: "s", TTL: time.Minute, Limit: 2}); !errors.Is(err, driver.ErrLimitMismatch) {
		t.Fatalf("semaphore on readers' key: %v, want ErrLimitMismatch", err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: rw, Owner: "w", TTL: time.Minute}); !errors.As(err, new(*driver.HeldError)) {
		t.Fatalf("writer on readers' key: %v, want held", err)
	}
	if err := b.Release(ctx, rw, "r"); err != nil {
		t.Fatal(err)
	}
	// Free again: the key is a mutex's.
	if _, err := b.Acquire(ctx, driver.Request{Key: rw, Owner: "w", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, rw, "w"); err != nil {
		t.Fatal(err)
	}
}

// A permit table of a version before read-write locks gets the shared column on
// Open; a reader then queues behind the older client's mutex grant, which becomes
// a writer's permit with its token, and takes the key when a force release frees it.
func testOldPermitTable(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	const table = "old_rw_locks"
	pool := admin(t, srv)
	oldTable(t, srv, table)
	exec(t, pool, `ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS value bytea`)
	exec(t, pool, `DROP TABLE IF EXISTS `+table+`_permits`)
	exec(t, pool, `CREATE TABLE `+table+`_permits (
	key        text COLLATE "C" NOT NULL,
	owner      text NOT NULL,
	token      bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	reserved   boolean NOT NULL DEFAULT false,
	channel    text NOT NULL DEFAULT '',
	value      bytea,
	PRIMARY KEY (key, owner)
)`)
	exec(t, pool, `INSERT INTO `+table+`_permits (key, owner, token, expires_at) VALUES ('sem', 'old', 998, now() + interval '1 hour')`)
	exec(t, pool, `INSERT INTO `+table+` (key, owner, token, expires_at) VALUES ('sem', '#', 2, now() + interval '1 hour')`)
	u, _ := url.Parse(withQuery(srv.URL(), "table", table))
	b, err := pglock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if limit, hs, err := b.Holders(ctx, "sem"); err != nil || limit != 2 || len(hs) != 1 || hs[0].Shared || hs[0].Token != 998 {
		t.Fatalf("the older client's permit: %d, %+v, %v", limit, hs, err)
	}
	w := queueRW(t, b, "held", "r", true)
	defer func() { _ = w.Stop(ctx, true) }()
	if limit, hs, err := b.Holders(ctx, "held"); err != nil || limit != 1 || len(hs) != 1 || hs[0].Owner != "old" || hs[0].Token != 999 || hs[0].Shared {
		t.Fatalf("the older client's grant behind a reader: %d, %+v, %v", limit, hs, err)
	}
	if err := b.ForceRelease(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, rwReq("held", "r", true))
	if err != nil || g.Token <= 999 {
		t.Fatalf("reader after the force release: %+v, %v", g, err)
	}
	if _, hs, err := b.Holders(ctx, "held"); err != nil || len(hs) != 1 || !hs[0].Shared {
		t.Fatalf("Holders = %+v, %v", hs, err)
	}
}
