package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

// TestReadersFast tests the readers' fast grant and release (read_acquire.sql,
// read_release.sql, read_last.sql) against the promises of a read-write lock.
func TestReadersFast(t *testing.T) {
	srv := testserver.StartPostgres(t, "-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track_planning=on")
	t.Run("Stress", func(t *testing.T) { testReadersStress(t, srv) })
	t.Run("LastReadersWakeWriter", func(t *testing.T) { testLastReadersWakeWriter(t, srv) })
	t.Run("Watch", func(t *testing.T) { testReadersWatch(t, srv) })
	t.Run("LeftRow", func(t *testing.T) { testReadersLeftRow(t, srv) })
	t.Run("NothingLeft", func(t *testing.T) { testReadersNothingLeft(t, srv) })
	t.Run("DeadRows", func(t *testing.T) { testReadersDeadRows(t, srv) })
	t.Run("WatchLockGivenBack", func(t *testing.T) { testReadersWatchLock(t, srv) })
	t.Run("PlannedOnce", func(t *testing.T) { testReadersPlanned(t, srv) })
	t.Run("WritersWaitForReaders", func(t *testing.T) { testWritersWaitForReaders(t, srv) })
}

// barrierID is the key of the readers' barrier lock of key $1 in the default
// table, as sql/fragments.sql (readerID) computes it.
const barrierID = `hashtextextended($1::text COLLATE "C", '` + pglock.DefaultTable + `'::regclass::oid::bigint + 4294967296)`

// readerInFlight begins a transaction that holds key's readers' barrier shared,
// as a reader's fast grant or release in flight does (read_lock.sql).
func readerInFlight(t *testing.T, ctx context.Context, b *pglock.Backend, key string) pgx.Tx {
	t.Helper()
	tx, err := b.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(`+barrierID+`)`, key); err != nil {
		t.Fatal(err)
	}
	return tx
}

// A writer's attempt, a release and a refresh of a writer's permit, and a set's
// attempt each wait for a reader's fast grant or release in flight (the key's
// readers' barrier held shared, as read_lock takes it, and no row lock) and
// decide only once it has committed.
func testWritersWaitForReaders(t *testing.T, srv *testserver.Postgres) {
	h := harness(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	c := h.Client(t)
	req := func(key, owner string, shared bool) driver.Request {
		return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Shared: shared}
	}
	// A writer holding a read-write key: a reader's queueing turns its mutex row
	// into a state row and a writer's permit.
	var queued []driver.Waiter
	defer func() {
		for _, w := range queued {
			w.Stop(ctx, false)
		}
	}()
	writerHolds := func(key string) error {
		if _, err := b.Acquire(ctx, req(key, "w", false)); err != nil {
			return err
		}
		queued = append(queued, queueRW(t, b, key, "r", true))
		return nil
	}
	for _, tc := range []struct {
		name  string
		setup func(key string) error
		op    func(key string) error
	}{
		{"writer's attempt", func(key string) error {
			_, err := b.Acquire(ctx, req(key, "r", true))
			return err
		}, func(key string) error {
			if _, err := b.Acquire(ctx, req(key, "w", false)); !errors.As(err, new(*driver.HeldError)) {
				return fmt.Errorf("writer beside a reader: %v, want held", err)
			}
			return nil
		}},
		{"release of a writer's permit", writerHolds, func(key string) error { return b.Release(ctx, key, "w") }},
		{"refresh of a writer's permit", writerHolds, func(key string) error { return b.Refresh(ctx, key, "w", time.Minute) }},
		{"set's attempt", func(string) error { return nil }, func(key string) error {
			m, err := c.TryLockAll(ctx, []string{key, key + "-other"})
			if err != nil {
				return err
			}
			return m.Release(ctx)
		}},
	} {
		key := drivertest.Key(t, "k")
		if err := tc.setup(key); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		tx := readerInFlight(t, ctx, b, key)
		done := make(chan error, 1)
		go func() { done <- tc.op(key) }()
		for waiting := false; !waiting; {
			select {
			case err := <-done:
				tx.Rollback(ctx)
				t.Fatalf("%s returned (%v) while a reader's transaction held the barrier", tc.name, err)
			case <-time.After(5 * time.Millisecond):
			}
			err := b.Pool().QueryRow(ctx, `WITH id AS (SELECT `+barrierID+` AS v)
				SELECT EXISTS (SELECT FROM pg_locks l, id WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
					AND l.classid = oid((id.v >> 32) & 4294967295) AND l.objid = oid(id.v & 4294967295))`, key).Scan(&waiting)
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("%s after the reader's transaction: %v", tc.name, err)
		}
	}
}

// A reader's statements after read_lock run on generic plans, made once per
// connection: left to choose, with a permit table of many rows (other keys', the
// statistics up to date) the server plans the last statement of a reader's
// release (read_wake, a long one) for its parameters on every run.
func testReadersPlanned(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	pool := admin(t, srv)
	exec(t, pool, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	exec(t, pool, `SELECT pg_stat_statements_reset()`)
	c := harness(t, srv).Client(t)
	key := drivertest.Key(t, "k")
	permits := pglock.DefaultTable + "_permits"
	exec(t, pool, `INSERT INTO `+permits+` (key, owner, token, expires_at, shared)
		SELECT 'other' || (i % 100), 'o' || i, i, now() + interval '1 minute', true FROM generate_series(1, 5000) i`)
	exec(t, pool, `ANALYZE `+permits)
	const reads = 40
	for range reads {
		l, err := c.Lock(ctx, key, dlock.WithShared())
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var calls, plans int64
	// read_wake, by its text with the constants replaced:
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0), coalesce(sum(plans), 0) FROM pg_stat_statements
		WHERE query LIKE '%AS lim%' AND query LIKE '%current_setting(%'`).Scan(&calls, &plans)
	if err != nil {
		t.Fatal(err)
	}
	if calls < reads || plans > calls/4 {
		t.Fatalf("a reader's release: %d runs, %d plans; want %d runs and at most a quarter as many plans", calls, plans, reads)
	}
}

// A reader's grant and release take the key's watch lock for the session and give
// it back in the same expression (readNotify): after many readers, no connection
// holds it, and a watch can start.
func testReadersWatchLock(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	h := harness(t, srv)
	key := drivertest.Key(t, "k")
	cs := []*dlock.Client{h.Client(t), h.Client(t), h.Client(t)}
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			for range 40 {
				l, err := c.Lock(ctx, key, dlock.WithShared())
				if err != nil {
					t.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	var held int
	err := admin(t, srv).QueryRow(ctx, `SELECT count(*) FROM pg_locks l, (SELECT hashtextextended($1::text COLLATE "C", to_regclass($2)::oid::bigint) AS h) w
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.classid = oid((w.h >> 32) & 4294967295) AND l.objid = oid(w.h & 4294967295)`,
		key, pglock.DefaultTable).Scan(&held)
	if err != nil || held != 0 {
		t.Fatalf("the key's watch lock after the readers: %d holders, %v", held, err)
	}
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	w, err := b.WatchHolder(ctx, key)
	if err != nil {
		t.Fatalf("watch after the readers: %v", err)
	}
	w.Stop()
}

// A key whose permits churn leaves dead rows until VACUUM: the lookups of its
// permits on the backend's connections must be plain index scans, which mark the
// dead index entries they pass (a bitmap scan reads them all again each time), so
// that each lookup's cost follows the live permits, not the churn.
func testReadersDeadRows(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	b := open(t, srv.URL())
	defer b.Close()
	key := drivertest.Key(t, "k")
	pool := admin(t, srv)
	permits := pglock.DefaultTable + "_permits"
	exec(t, pool, `INSERT INTO `+permits+` (key, owner, token, expires_at, shared)
		SELECT $1, 'dead' || i, i, now() + interval '1 minute', true FROM generate_series(1, 3000) i`, key)
	exec(t, pool, `DELETE FROM `+permits+` WHERE key = $1`, key)
	var bitmap string
	if err := b.Pool().QueryRow(ctx, `SHOW enable_bitmapscan`).Scan(&bitmap); err != nil || bitmap != "off" {
		t.Fatalf("enable_bitmapscan on the backend's connection: %q, %v", bitmap, err)
	}
	var plan string
	err := b.Pool().QueryRow(ctx, `EXPLAIN (FORMAT TEXT) SELECT FROM `+permits+` WHERE key = $1::text AND expires_at > now()`, key).Scan(&plan)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, "Index Scan") {
		t.Fatalf("a key's permits are looked up with %q, not an index scan", plan)
	}
}

// keyRows counts the rows of key in the lock table (its own and its places') and
// in the permit table.
func keyRows(t *testing.T, b *pglock.Backend, key string) (rows, permits int) {
	t.Helper()
	err := b.Pool().QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+pglock.DefaultTable+` WHERE key >= $1 AND key < $1 || chr(3)),
		(SELECT count(*) FROM `+pglock.DefaultTable+`_permits WHERE key = $1)`, key).Scan(&rows, &permits)
	if err != nil {
		t.Fatal(err)
	}
	return rows, permits
}

// Readers on separate clients (most grants and releases taking the fast path)
// and writers on others: no reader holds beside a writer, no two writers hold
// together, readers do hold together, and each writer's token is above every
// grant that returned before the writer asked.
func testReadersStress(t *testing.T, srv *testserver.Postgres) {
	h := harness(t, srv)
	key := drivertest.Key(t, "k")
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	var readers, writers, overlap atomic.Int64
	var maxDone atomic.Uint64 // the highest token of a grant that returned
	done := func(tok dlock.Token) {
		for {
			m := maxDone.Load()
			if uint64(tok) <= m || maxDone.CompareAndSwap(m, uint64(tok)) {
				return
			}
		}
	}
	var reads, writes atomic.Int64
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for i := range 10 {
		c := h.Client(t)
		writer := i < 2
		wg.Go(func() {
			for time.Now().Before(stop) && ctx.Err() == nil {
				if writer {
					before := maxDone.Load()
					l, err := c.Lock(ctx, key)
					if err != nil {
						t.Error(err)
						return
					}
					if uint64(l.Token()) <= before {
						t.Errorf("writer's token %d not above an earlier grant's %d", l.Token(), before)
					}
					if n := writers.Add(1); n != 1 || readers.Load() != 0 {
						t.Errorf("writer beside %d writers and %d readers", n-1, readers.Load())
					}
					time.Sleep(2 * time.Millisecond)
					writers.Add(-1)
					done(l.Token())
					if err := l.Release(ctx); err != nil {
						t.Error(err)
						return
					}
					writes.Add(1)
					time.Sleep(20 * time.Millisecond)
					continue
				}
				l, err := c.Lock(ctx, key, dlock.WithShared())
				if err != nil {
					t.Error(err)
					return
				}
				if n := readers.Add(1); n > 1 {
					overlap.Add(1)
				}
				if writers.Load() != 0 {
					t.Errorf("reader beside a writer")
				}
				time.Sleep(3 * time.Millisecond)
				readers.Add(-1)
				done(l.Token())
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
				reads.Add(1)
			}
		})
	}
	wg.Wait()
	if writes.Load() == 0 || reads.Load() == 0 || overlap.Load() == 0 {
		t.Errorf("writes %d, reads %d, reads beside another %d: want each > 0", writes.Load(), reads.Load(), overlap.Load())
	}
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	if _, permits := keyRows(t, b, key); permits != 0 {
		t.Errorf("%d permit rows left", permits)
	}
}

// Two readers hold (the second by the fast grant), a writer queues, a reader
// arriving after it waits, and the two readers release at the same moment (each
// by the fast release, on clients of their own): the writer is handed the key
// every time, whichever release ends last.
func testLastReadersWakeWriter(t *testing.T, srv *testserver.Postgres) {
	h := harness(t, srv)
	ctx := context.Background()
	b1, b2, bw := h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend)
	defer b1.Close()
	defer b2.Close()
	defer bw.Close()
	for i := range 15 {
		key := drivertest.Key(t, fmt.Sprint("k", i))
		if _, err := b1.Acquire(ctx, driver.Request{Key: key, Owner: "r1", TTL: time.Minute, Shared: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := b2.Acquire(ctx, driver.Request{Key: key, Owner: "r2", TTL: time.Minute, Shared: true}); err != nil {
			t.Fatal(err)
		}
		w := queueRW(t, bw, key, "w", false)
		// FIFO: a reader arriving after the queued writer waits, waiting or not.
		if _, err := b1.Acquire(ctx, driver.Request{Key: key, Owner: "r3", TTL: time.Minute, Shared: true}); !errors.As(err, new(*driver.HeldError)) {
			t.Fatalf("reader after a queued writer: %v, want held", err)
		}
		r4 := queueRW(t, b2, key, "r4", true)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, r := range []struct {
			b     *pglock.Backend
			owner string
		}{{b1, "r1"}, {b2, "r2"}} {
			wg.Go(func() {
				<-start
				if err := r.b.Release(ctx, key, r.owner); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		select {
		case <-w.C():
		case <-time.After(drivertest.Wait):
			t.Fatalf("round %d: the queued writer was not woken when the last readers left", i)
		}
		g, err := bw.Acquire(ctx, rwReq(key, "w", false))
		if err != nil {
			t.Fatalf("round %d: the writer's attempt after the readers left: %v", i, err)
		}
		if err := w.Stop(ctx, true); err != nil {
			t.Fatal(err)
		}
		if err := bw.Release(ctx, key, "w"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-r4.C():
		case <-time.After(drivertest.Wait):
			t.Fatalf("round %d: the reader queued behind the writer was not woken", i)
		}
		g4, err := b2.Acquire(ctx, rwReq(key, "r4", true))
		if err != nil || g4.Token <= g.Token {
			t.Fatalf("round %d: the reader behind the writer: %+v, %v (writer's token %d)", i, g4, err, g.Token)
		}
		if err := r4.Stop(ctx, true); err != nil {
			t.Fatal(err)
		}
		if err := b2.Release(ctx, key, "r4"); err != nil {
			t.Fatal(err)
		}
		if rows, permits := keyRows(t, b1, key); rows != 0 || permits != 0 {
			t.Fatalf("round %d: rows left of a free key: %d, %d permits", i, rows, permits)
		}
	}
}

// A holder watch sees the readers' fast grants and releases, each of them.
func testReadersWatch(t *testing.T, srv *testserver.Postgres) {
	h := harness(t, srv)
	ctx := context.Background()
	b, bw := h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend)
	defer b.Close()
	defer bw.Close()
	key := drivertest.Key(t, "k")
	w, err := bw.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	steps := []struct {
		name string
		do   func() error
	}{
		{"first reader", func() error {
			_, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r1", TTL: time.Minute, Shared: true})
			return err
		}},
		{"second reader", func() error {
			_, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r2", TTL: time.Minute, Shared: true})
			return err
		}},
		{"first reader's release", func() error { return b.Release(ctx, key, "r1") }},
		{"last reader's release", func() error { return b.Release(ctx, key, "r2") }},
	}
	for _, s := range steps {
		select { // drain a spurious wake-up
		case <-w.C():
		default:
		}
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		select {
		case <-w.C():
		case <-time.After(drivertest.Wait):
			t.Fatalf("%s: the holder watch was not notified", s.name)
		}
	}
}

// A reader's fast release that cannot take the key's readers' barrier at once
// (another reader's transaction holds it shared) leaves the state row, with no
// permit: that row is a free key to every statement, and the key's next use
// drops it.
func testReadersLeftRow(t *testing.T, srv *testserver.Postgres) {
	h := harness(t, srv)
	ctx := context.Background()
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	c := h.Client(t)
	for _, next := range []string{"mutex", "reader", "semaphore", "set"} {
		key := drivertest.Key(t, next)
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r1", TTL: time.Minute, Shared: true}); err != nil {
			t.Fatal(err)
		}
		tx := readerInFlight(t, ctx, b, key)
		if err := b.Release(ctx, key, "r1"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if rows, permits := keyRows(t, b, key); rows != 1 || permits != 0 {
			t.Fatalf("after a release beside another transaction: %d rows, %d permits; want the state row alone", rows, permits)
		}
		if limit, hs, err := b.Holders(ctx, key); err != nil || limit != 0 || len(hs) != 0 {
			t.Fatalf("Holders of the left row: %d, %+v, %v; want none", limit, hs, err)
		}
		if _, err := b.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Inspect of the left row: %v, want ErrNotHeld", err)
		}
		if infos, err := b.List(ctx, key); err != nil || len(infos) != 0 {
			t.Fatalf("List of the left row: %+v, %v; want none", infos, err)
		}
		if next == "set" {
			// A set with the key is taken at once, by one attempt.
			m, err := c.TryLockAll(ctx, []string{key, key + "-other"})
			if err != nil {
				t.Fatalf("TryLockAll over the left row: %v", err)
			}
			if err := m.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if rows, permits := keyRows(t, b, key); rows != 0 || permits != 0 {
				t.Fatalf("after a set's cycle on the left row: %d rows, %d permits; want none", rows, permits)
			}
			continue
		}
		req := driver.Request{Key: key, Owner: "o", TTL: time.Minute}
		switch next {
		case "reader":
			req.Shared = true
		case "semaphore":
			req.Limit = 3
		}
		if _, err := b.Acquire(ctx, req); err != nil {
			t.Fatalf("%s on the left row: %v", next, err)
		}
		if err := b.Release(ctx, key, "o"); err != nil {
			t.Fatal(err)
		}
		if rows, permits := keyRows(t, b, key); rows != 0 || permits != 0 {
			t.Fatalf("after a %s's cycle on the left row: %d rows, %d permits; want none", next, rows, permits)
		}
	}
}

// Many readers on clients of their own, all through: no permit is left, and the
// state row, if a release left it (see testReadersLeftRow), goes with the next
// reader's cycle.
func testReadersNothingLeft(t *testing.T, srv *testserver.Postgres) {
	h := harness(t, srv)
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for range 12 {
		c := h.Client(t)
		wg.Go(func() {
			for time.Now().Before(stop) {
				l, err := c.Lock(ctx, key, dlock.WithShared())
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Millisecond)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	rows, permits := keyRows(t, b, key)
	if rows > 1 || permits != 0 {
		t.Fatalf("after the readers: %d rows, %d permits; want at most the state row", rows, permits)
	}
	t.Logf("state rows left by the readers: %d", rows)
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r", TTL: time.Minute, Shared: true}); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "r"); err != nil {
		t.Fatal(err)
	}
	if rows, permits := keyRows(t, b, key); rows != 0 || permits != 0 {
		t.Fatalf("after one more reader: %d rows, %d permits; want none", rows, permits)
	}
}
