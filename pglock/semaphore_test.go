package pglock_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

func TestSemaphores(t *testing.T) {
	srv := testserver.StartPostgres(t)
	t.Run("MismatchWithWaitersOnly", func(t *testing.T) { testMismatchWithWaitersOnly(t, srv) })
	t.Run("HandOffSeveral", func(t *testing.T) { testHandOffSeveral(t, srv) })
	t.Run("FirstFreedPermit", func(t *testing.T) { testFirstFreedPermit(t, srv) })
	t.Run("GiveUpPassesPermit", func(t *testing.T) { testGiveUpPassesPermit(t, srv) })
	t.Run("PermitValues", func(t *testing.T) { testPermitValues(t, srv) })
	t.Run("MutexAfterSemaphore", func(t *testing.T) { testMutexAfterSemaphore(t, srv) })
	t.Run("OldTableSet", func(t *testing.T) { testOldTableSet(t, srv) })
	t.Run("NoPermitTable", func(t *testing.T) { testNoPermitTable(t, srv) })
}

// waitWaiters waits until key has n live queued places.
func waitWaiters(t *testing.T, b *pglock.Backend, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(drivertest.Wait)
	for {
		var got int
		err := b.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+pglock.DefaultTable+` WHERE key > $1 || chr(2) AND key < $1 || chr(3)`, key).Scan(&got)
		if err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters never queued on %s (%d, %v)", n, key, got, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// queue registers a wait for owner on key and makes one waiting attempt, which
// must leave it queued.
func queue(t *testing.T, b *pglock.Backend, key, owner string, limit int) driver.Waiter {
	t.Helper()
	ctx := context.Background()
	w, err := b.Watch(ctx, key, owner)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: true, Patience: time.Minute, Limit: limit})
	var held *driver.HeldError
	if !errors.As(err, &held) || !held.Queued {
		t.Fatalf("waiting attempt of %s: %v, want queued", owner, err)
	}
	return w
}

// The limit binds a key that has only queued places left (its holders expired),
// for semaphores and mutexes alike; an attempt with another limit changes nothing.
func testMismatchWithWaitersOnly(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	pool := admin(t, srv)
	h := harness(t, srv)
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	for _, limit := range []int{1, 3} {
		key := drivertest.Key(t, "k")
		for _, o := range []string{"a", "b", "c"}[:limit] {
			if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: time.Minute, Limit: limit}); err != nil {
				t.Fatal(err)
			}
		}
		w := queue(t, b, key, "w", limit)
		h.Expire(t, key)
		if _, hs, err := b.Holders(ctx, key); err != nil || len(hs) != 0 {
			t.Fatalf("holders after expiry: %v, %v", hs, err)
		}
		var before int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pglock.DefaultTable+` WHERE key >= $1 AND key < $1 || chr(3)`, key).Scan(&before); err != nil {
			t.Fatal(err)
		}
		for _, other := range []int{0, 2, 4} {
			if max(other, 1) == limit {
				continue
			}
			for _, wait := range []bool{false, true} {
				_, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "x", TTL: time.Minute, Wait: wait, Patience: time.Minute, Limit: other})
				if !errors.Is(err, driver.ErrLimitMismatch) {
					t.Fatalf("limit %d on a key of %d with a waiter only: %v, want ErrLimitMismatch", other, limit, err)
				}
				t.Logf("%v", err)
			}
		}
		var after int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pglock.DefaultTable+` WHERE key >= $1 AND key < $1 || chr(3)`, key).Scan(&after); err != nil || after != before {
			t.Fatalf("rows of the key %d before the refused attempts, %d after (%v)", before, after, err)
		}
		// The waiter, next in line, takes the key with its own limit.
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "w", TTL: time.Minute, Wait: true, Patience: time.Minute, Limit: limit}); err != nil {
			t.Fatalf("the waiter's attempt: %v", err)
		}
		if err := w.Stop(ctx, true); err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, key, "w"); err != nil {
			t.Fatal(err)
		}
	}
}

// A force release of a full semaphore hands every freed permit to the queued
// waiters at once, in queue order, each woken by its own notification.
func testHandOffSeveral(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	h := harness(t, srv)
	key := drivertest.Key(t, "k")
	var leases []*dlock.Lease
	for range 3 {
		leases = append(leases, drivertest.MustLock(t, ctx, h.Client(t), key, dlock.WithLimit(3)))
	}
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	got := make(chan *dlock.Lease, 4)
	for i := range 4 {
		c := h.Client(t)
		go func() {
			l, err := c.Lock(ctx, key, dlock.WithLimit(3))
			if err != nil {
				t.Errorf("waiter: %v", err)
				got <- nil
				return
			}
			got <- l
		}()
		waitWaiters(t, b, key, i+1)
	}
	forced := time.Now()
	if err := b.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	var woken []*dlock.Lease
	for range 3 {
		select {
		case l := <-got:
			if l == nil {
				t.FailNow()
			}
			if d := time.Since(forced); d > time.Second {
				t.Errorf("a waiter got its permit %v after the force release: not handed over", d)
			}
			woken = append(woken, l)
		case <-time.After(drivertest.Wait / 2):
			t.Fatalf("only %d of 3 waiters got a permit", len(woken))
		}
	}
	limit, hs, err := b.Holders(ctx, key)
	if err != nil || limit != 3 || len(hs) != 3 {
		t.Fatalf("Holders = %d, %v, %v", limit, hs, err)
	}
	for _, l := range leases {
		if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("release by a forced-out holder: %v", err)
		}
		if uint64(l.Token()) >= hs[0].Token {
			t.Fatalf("a new holder's token %d not above the old %d", hs[0].Token, l.Token())
		}
	}
	if err := woken[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got // the fourth waiter, handed the released permit
	if l == nil {
		t.FailNow()
	}
	for _, l := range append(woken[1:], l) {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if limit, hs, err := b.Holders(ctx, key); err != nil || limit != 0 || len(hs) != 0 {
		t.Fatalf("Holders of a free key = %d, %v, %v", limit, hs, err)
	}
	var n int
	if err := b.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM `+pglock.DefaultTable+` WHERE key >= $1 AND key < $1 || chr(3)) + (SELECT count(*) FROM `+pglock.DefaultTable+`_permits WHERE key = $1)`, key).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows left for a free key (%v)", n, err)
	}
}

// A waiter queued behind N holders gets the first permit freed, by handoff: a
// newcomer that tries at once finds it taken.
func testFirstFreedPermit(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	h := harness(t, srv)
	key := drivertest.Key(t, "k")
	a := drivertest.MustLock(t, ctx, h.Client(t), key, dlock.WithLimit(2))
	bl := drivertest.MustLock(t, ctx, h.Client(t), key, dlock.WithLimit(2))
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	got := make(chan *dlock.Lease, 1)
	wc := h.Client(t)
	go func() {
		l, err := wc.Lock(ctx, key, dlock.WithLimit(2))
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	waitWaiters(t, b, key, 1)
	if err := bl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Client(t).TryLock(ctx, key, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("newcomer after the release, with a waiter queued: %v, want ErrLocked", err)
	}
	l := <-got
	if l == nil {
		t.FailNow()
	}
	if l.Token() <= bl.Token() {
		t.Fatalf("handed permit's token %d not above %d", l.Token(), bl.Token())
	}
	_, hs, err := b.Holders(ctx, key)
	if err != nil || len(hs) != 2 || hs[0].Owner != a.Owner() || hs[1].Owner != l.Owner() {
		t.Fatalf("Holders = %+v, %v; want %s then %s", hs, err, a.Owner(), l.Owner())
	}
	for _, x := range []*dlock.Lease{a, l} {
		if err := x.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Each permit has its own value, set by its grant and by SetValue, and a holder
// watch hears of every holder's changes.
func testPermitValues(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	key := drivertest.Key(t, "k")
	hw, err := b.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Stop()
	for _, o := range []string{"a", "b"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: time.Minute, Limit: 2, Value: []byte("v-" + o)}); err != nil {
			t.Fatal(err)
		}
		recv(t, hw.C(), "grant of "+o)
	}
	if err := b.SetValue(ctx, key, "b", []byte("w")); err != nil {
		t.Fatal(err)
	}
	recv(t, hw.C(), "SetValue")
	if err := b.SetValue(ctx, key, "c", []byte("w")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue by a non-holder: %v", err)
	}
	_, hs, err := b.Holders(ctx, key)
	if err != nil || len(hs) != 2 || string(hs[0].Value) != "v-a" || string(hs[1].Value) != "w" {
		t.Fatalf("Holders = %+v, %v", hs, err)
	}
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner != "a" {
		t.Fatalf("Inspect = %+v, %v; want the oldest holder", info, err)
	}
	// Another client, which did not take the permit, refreshes and releases it.
	o := h.Open(t).(*pglock.Backend)
	defer o.Close()
	if err := o.Refresh(ctx, key, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := o.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	recv(t, hw.C(), "release")
	if err := o.Refresh(ctx, key, "a", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh of a released permit: %v", err)
	}
	if err := b.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	recv(t, hw.C(), "last release")
}

// A semaphore key with no holder and no waiter left, released or expired, takes
// a mutex (and then another limit) again.
func testMutexAfterSemaphore(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	key := drivertest.Key(t, "k")
	for _, o := range []string{"a", "b"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: time.Minute, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	h.Expire(t, key) // crashed holders
	g, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "m", TTL: time.Minute})
	if err != nil {
		t.Fatalf("mutex on an expired semaphore: %v", err)
	}
	if limit, hs, err := b.Holders(ctx, key); err != nil || limit != 1 || len(hs) != 1 || hs[0].Token != g.Token {
		t.Fatalf("Holders = %d, %+v, %v", limit, hs, err)
	}
	if err := b.Refresh(ctx, key, "a", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh of an expired permit: %v", err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "s", TTL: time.Minute, Limit: 2}); !errors.Is(err, driver.ErrLimitMismatch) {
		t.Fatalf("semaphore on a held mutex: %v", err)
	}
	h.Expire(t, key)
	g2, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "s", TTL: time.Minute, Limit: 4})
	if err != nil || g2.Token <= g.Token {
		t.Fatalf("semaphore on an expired mutex: %v, %v", g2, err)
	}
	if err := b.Release(ctx, key, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "m", TTL: time.Minute}); err != nil {
		t.Fatalf("mutex on a released semaphore: %v", err)
	}
	if err := b.Release(ctx, key, "m"); err != nil {
		t.Fatal(err)
	}
}

// A table set made by an earlier version (no permit table) gets its permit table
// from Open; the older client's grant is kept and semaphores work.
func testOldTableSet(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	const table = "old_sem_locks"
	oldTable(t, srv, table)
	exec(t, admin(t, srv), `DROP TABLE IF EXISTS `+table+`_permits`)
	u, _ := url.Parse(withQuery(srv.URL(), "table", table))
	b, err := pglock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if info, err := b.Inspect(ctx, "held"); err != nil || info.Owner != "old" || info.Token != 999 {
		t.Fatalf("the older client's grant: %+v, %v", info, err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: "held", Owner: "x", TTL: time.Minute, Limit: 2}); !errors.Is(err, driver.ErrLimitMismatch) {
		t.Fatalf("semaphore on the older client's mutex: %v", err)
	}
	for _, o := range []string{"a", "b"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: "s", Owner: o, TTL: time.Minute, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: "s", Owner: "c", TTL: time.Minute, Limit: 2}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a third permit of 2: %v", err)
	}
}

// A role that may use a table set but not create the permit table keeps working
// for mutexes; a semaphore attempt says what is missing.
func testNoPermitTable(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	const table = "no_permits_locks"
	pool := admin(t, srv)
	oldTable(t, srv, table)
	exec(t, pool, `ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS value bytea`)
	exec(t, pool, `DROP TABLE IF EXISTS `+table+`_permits`)
	exec(t, pool, `DROP ROLE IF EXISTS nopermits`)
	exec(t, pool, `CREATE ROLE nopermits LOGIN PASSWORD 'nopermits-pw'`)
	exec(t, pool, `REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	exec(t, pool, `GRANT SELECT, INSERT, UPDATE, DELETE ON `+table+` TO nopermits`)
	exec(t, pool, `GRANT USAGE ON SEQUENCE `+table+`_token_seq TO nopermits`)
	u, _ := url.Parse(withQuery(srv.URLFor("nopermits", "nopermits-pw", "postgres"), "table", table))
	b, err := pglock.Open(ctx, u)
	if err != nil {
		t.Fatalf("Open without the privilege to create the permit table: %v", err)
	}
	defer b.Close()
	if _, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if limit, hs, err := b.Holders(ctx, "k"); err != nil || limit != 1 || len(hs) != 1 {
		t.Fatalf("Holders = %d, %v, %v", limit, hs, err)
	}
	if err := b.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, driver.Request{Key: "s", Owner: "a", TTL: time.Minute, Limit: 2})
	if !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("semaphore without a permit table: %v, want ErrUnsupported", err)
	}
	t.Logf("%v", err)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = '`+table+`_permits'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("permit table created (%d, %v)", n, err)
	}
}

// A waiter a freed permit was reserved for that gives up passes it on to the next
// waiter; a newcomer meanwhile finds it taken.
func testGiveUpPassesPermit(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	b := h.Open(t).(*pglock.Backend)
	defer b.Close()
	key := drivertest.Key(t, "k")
	for _, o := range []string{"h1", "h2"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: time.Minute, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	wa := queue(t, b, key, "a", 2)
	wb := queue(t, b, key, "b", 2)
	defer func() { _ = wb.Stop(ctx, true) }()
	if err := b.Release(ctx, key, "h1"); err != nil {
		t.Fatal(err)
	}
	recv(t, wa.C(), "the handoff to a")
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "x", TTL: time.Minute, Limit: 2}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("newcomer while the permit is reserved for a: %v", err)
	}
	if err := wa.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	recv(t, wb.C(), "the permit passed to b")
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "b", TTL: time.Minute, Wait: true, Patience: time.Minute, Limit: 2}); err != nil {
		t.Fatalf("b takes the passed permit: %v", err)
	}
	_, hs, err := b.Holders(ctx, key)
	if err != nil || len(hs) != 2 || hs[0].Owner != "h2" || hs[1].Owner != "b" {
		t.Fatalf("Holders = %+v, %v", hs, err)
	}
	for _, o := range []string{"h2", "b"} {
		if err := b.Release(ctx, key, o); err != nil {
			t.Fatal(err)
		}
	}
}
