package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/storeops"
	_ "github.com/dlockio/dlock/internal/storeops/pgops" // the store the harness measures with
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t testing.TB, rawURL string) *pglock.Backend {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pglock.Open(context.Background(), u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

// admin returns a superuser pool on srv, closed at the end of the test.
func admin(t testing.TB, srv *testserver.Postgres) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func exec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// withQuery adds query parameters to a URL.
func withQuery(rawURL string, kv ...string) string {
	u, _ := url.Parse(rawURL)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	// Spaces as %20: pgx, like libpq, reads "+" as a plus sign.
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}

func harness(t testing.TB, srv *testserver.Postgres, kv ...string) drivertest.Harness {
	pool := admin(t, srv)
	rawURL := withQuery(srv.URL(), kv...)
	table := pglock.DefaultTable
	if u, _ := url.Parse(rawURL); u.Query().Get("table") != "" {
		table = u.Query().Get("table")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := storeops.Open(ctx, rawURL)
	if err != nil {
		t.Fatalf("storeops: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return drivertest.Harness{
		Ops:   st.Ops,
		Floor: st.FloorCycle,
		Open:  func(t testing.TB) driver.Backend { return open(t, rawURL) },
		Expire: func(t testing.TB, key string) {
			exec(t, pool, `UPDATE `+table+` SET expires_at = now() - interval '1 second' WHERE key = $1`, key)
			exec(t, pool, `UPDATE `+table+`_permits SET expires_at = now() - interval '1 second' WHERE key = $1`, key)
		},
		Fencing:   true,
		FIFO:      true,
		RoundTrip: func(ctx context.Context) error { return pool.Ping(ctx) },
		Namespace: func(t testing.TB, ns string) (driver.Backend, error) {
			u, err := url.Parse(withQuery(rawURL, "table", ns))
			if err != nil {
				t.Fatal(err)
			}
			b, err := pglock.Open(context.Background(), u)
			if err != nil {
				return nil, err
			}
			return b, nil
		},
	}
}

// TestPostgres runs the tests that can share one server.
func TestPostgres(t *testing.T) {
	srv := testserver.StartPostgres(t)
	t.Run("Conformance", func(t *testing.T) { drivertest.Run(t, harness(t, srv)) })
	t.Run("SQLInjection", func(t *testing.T) { testSQLInjection(t, srv) })
	t.Run("URLParameters", func(t *testing.T) { testURLParameters(t, srv) })
	t.Run("BadCredentials", func(t *testing.T) { testBadCredentials(t, srv) })
	t.Run("NoCreatePrivilege", func(t *testing.T) { testNoCreatePrivilege(t, srv) })
	t.Run("ConcurrentSchemaCreation", func(t *testing.T) { testConcurrentSchemaCreation(t, srv) })
	t.Run("NotifyOnlyWhenWaited", func(t *testing.T) { testNotifyOnlyWhenWaited(t, srv) })
	t.Run("WokenByNotify", func(t *testing.T) { testWokenByNotify(t, srv) })
	t.Run("CrashedWaiter", func(t *testing.T) { testCrashedWaiter(t, srv) })
	t.Run("PlaceInQueue", func(t *testing.T) { testPlaceInQueue(t, srv) })
	t.Run("NewAndLinger", func(t *testing.T) { testNewAndLinger(t, srv) })
	t.Run("ConnectionLoss", func(t *testing.T) { testConnectionLoss(t, srv) })
	t.Run("LoginRevoked", func(t *testing.T) { testLoginRevoked(t, srv) })
	t.Run("TokenDrawnAfterInsert", func(t *testing.T) { testTokenDrawnAfterInsert(t, srv) })
	t.Run("SequenceCache", func(t *testing.T) { testSequenceCache(t, srv) })
	t.Run("RestampOnlyOwnInsert", func(t *testing.T) { testRestampOnlyOwnInsert(t, srv) })
	t.Run("RelockAfterHandoff", func(t *testing.T) { testRelockAfterHandoff(t, srv) })
	t.Run("Enqueue", func(t *testing.T) { testEnqueue(t, srv) })
	t.Run("RelockBehindQueue", func(t *testing.T) { testRelockBehindQueue(t, srv) })
	t.Run("WatchFirst", func(t *testing.T) { testWatchFirst(t, srv) })
}

// An uncontended Lock registers no wait, so it opens no listening connection; a
// key an attempt found held is waited for as before, registered before the first
// attempt from then on.
func testWatchFirst(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := harness(t, srv)
	a, holder := h.Client(t), h.Client(t)
	ab := a.Backend().(*pglock.Backend)
	free, held := drivertest.Key(t, "free"), drivertest.Key(t, "held")
	for range 3 {
		l, err := a.Lock(ctx, free)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ab.Listening() {
		t.Fatal("uncontended Locks started the listening connection")
	}
	if ab.WatchFirst(free) || ab.WatchFirst(held) {
		t.Fatal("WatchFirst true for a key never found held")
	}
	hl, err := holder.Lock(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := a.Lock(ctx, held) // refused, then waits
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	waitQueued(t, holder, held, 1)
	if !ab.WatchFirst(held) { // (the free key may share its slot: not asked)
		t.Fatal("WatchFirst false for a key just found held")
	}
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("a's Lock of the held key: %v", err)
	}
}

// A client that just handed a key to a waiter sends its next waiting Lock of the key
// straight to the full statement (no plain INSERT first): that statement must take
// the key when it is free again, with a token above the waiter's, and queue behind
// a holder.
func testRelockAfterHandoff(t *testing.T, srv *testserver.Postgres) {
	defer pglock.SetContendedFor(time.Minute)()
	ctx := context.Background()
	h := harness(t, srv)
	a, b := h.Client(t), h.Client(t)
	ab := a.Backend().(*pglock.Backend)
	key := drivertest.Key(t, "k")
	// handOff has holder release key to waiter's queued Lock and returns the
	// waiter's lease.
	handOff := func(holder *dlock.Lease, hc, waiter *dlock.Client) *dlock.Lease {
		t.Helper()
		got := lockAsync(ctx, t, waiter, key)
		waitQueued(t, hc, key, 1)
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if l == nil {
			t.FailNow()
		}
		if l.Token() <= holder.Token() {
			t.Fatalf("token %d after %d", l.Token(), holder.Token())
		}
		return l
	}
	la, err := a.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if ab.Contended(key) {
		t.Fatal("contended before any handoff")
	}
	lb := handOff(la, a, b)
	if !ab.Contended(key) {
		t.Fatal("not contended after handing the key to a waiter")
	}
	if err := lb.Release(ctx); err != nil { // no one waits: the key is free
		t.Fatal(err)
	}
	la, err = a.Lock(ctx, key)
	if err != nil {
		t.Fatalf("Lock of the free key right after a handoff: %v", err)
	}
	if la.Token() <= lb.Token() {
		t.Fatalf("token %d after %d", la.Token(), lb.Token())
	}
	// a hands it on again, and its next Lock queues behind b.
	lb = handOff(la, a, b)
	la = handOff(lb, b, a)
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The lighter statement a relock after a handoff tries first adds a place only
// behind a live grant of another owner whose row is marked queued; in every other
// state it writes nothing and leaves the decision to the full statement.
func testEnqueue(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	a, b, c := h.Client(t), h.Client(t), h.Client(t)
	ab := a.Backend().(*pglock.Backend)
	key := drivertest.Key(t, "k")
	req := driver.Request{Key: key, Owner: "enqueuer", TTL: 5 * time.Second, Wait: true}
	none := func(what string) {
		t.Helper()
		held, err := ab.Enqueue(ctx, req)
		if err != nil || held != nil {
			t.Fatalf("%s: got %v, %v; want nothing done", what, held, err)
		}
	}
	waiters := func(want int) {
		t.Helper()
		info, err := ab.Inspect(ctx, key)
		if want == 0 && errors.Is(err, driver.ErrNotHeld) {
			return // no row: no place either
		}
		if err != nil || info.Waiters != want {
			t.Fatalf("Inspect: %+v, %v; want %d waiters", info, err, want)
		}
	}
	none("a free key")
	waiters(0)
	lb, err := b.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	none("a held key with no one queued")
	waiters(0)
	own := req
	own.Owner = lb.Owner()
	got := lockAsync(ctx, t, c, key)
	waitQueued(t, b, key, 1)
	held, err := ab.Enqueue(ctx, own)
	if err != nil || held != nil {
		t.Fatalf("the holder's own owner id: got %v, %v; want nothing done", held, err)
	}
	held, err = ab.Enqueue(ctx, req)
	if err != nil || held == nil {
		t.Fatalf("behind a queued holder: got %v, %v; want a place", held, err)
	}
	if !held.Queued || held.Ahead != 1 || held.RetryAfter <= 0 || held.RetryAfter > lb.TTL() {
		t.Fatalf("behind a queued holder: %+v; want queued, 1 ahead, the holder's expiry", *held)
	}
	waiters(2)
	// The queue keeps its order: c first, then the place written here.
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lc := <-got
	if lc == nil {
		t.FailNow()
	}
	q, err := ab.Queue(ctx, key)
	if err != nil || len(q) != 1 || q[0].Owner != req.Owner {
		t.Fatalf("Queue after the handoff to c: %+v, %v; want the enqueued place alone", q, err)
	}
	if err := lc.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A client's waiting Lock right after it handed the key on, with others queued
// behind the waiter it handed it to, joins the end of the queue: FIFO holds.
func testRelockBehindQueue(t *testing.T, srv *testserver.Postgres) {
	defer pglock.SetContendedFor(time.Minute)()
	ctx := context.Background()
	h := harness(t, srv)
	a, b, c := h.Client(t), h.Client(t), h.Client(t)
	key := drivertest.Key(t, "k")
	type result struct {
		name string
		l    *dlock.Lease
	}
	order := make(chan result, 3)
	lock := func(name string, cl *dlock.Client) {
		go func() {
			l, err := cl.Lock(ctx, key)
			if err != nil {
				t.Error(err)
			}
			order <- result{name, l}
		}()
	}
	la, err := a.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	lock("b", b)
	waitQueued(t, a, key, 1)
	lock("c", c)
	waitQueued(t, a, key, 2)
	if err := la.Release(ctx); err != nil { // to b, c still queued
		t.Fatal(err)
	}
	if !a.Backend().(*pglock.Backend).Contended(key) {
		t.Fatal("not contended after handing the key on")
	}
	lock("a", a)
	waitQueued(t, a, key, 2) // c and a
	last := la.Token()
	for _, want := range []string{"b", "c", "a"} {
		r := <-order
		if r.l == nil {
			t.FailNow()
		}
		if r.name != want {
			t.Fatalf("%s got the key, want %s", r.name, want)
		}
		if r.l.Token() <= last {
			t.Fatalf("token %d after %d", r.l.Token(), last)
		}
		last = r.l.Token()
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// lockAsync runs c.Lock(ctx, key) on a goroutine and sends its lease on the channel
// it returns: nil after an error, which it reports.
func lockAsync(ctx context.Context, t *testing.T, c *dlock.Client, key string) <-chan *dlock.Lease {
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Lock(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	return got
}

// An INSERT computes its row before it reaches the unique index, and may wait there
// (or be descheduled) while another client takes the key and releases it. The
// token must still come out above that other grant's: the insert's token is drawn
// again after it (restamp.sql) once a later draw has been made. A trigger holds the
// slow insert at that point, on an advisory lock the test holds, until the fast
// client has locked and released.
func testTokenDrawnAfterInsert(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	pool := admin(t, srv)
	rawURL := withQuery(srv.URL(), "table", "token_order")
	slow, fast := open(t, rawURL), open(t, rawURL)
	defer slow.Close()
	defer fast.Close()
	exec(t, pool, `CREATE OR REPLACE FUNCTION token_order_gate() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF NEW.owner = 'slow' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
		RETURN NEW;
	END $$`)
	exec(t, pool, `CREATE OR REPLACE TRIGGER token_order_gate BEFORE INSERT ON token_order FOR EACH ROW EXECUTE FUNCTION token_order_gate()`)
	gate, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Release()
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	defer func() {
		if !unlocked {
			_, _ = gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
		}
	}()

	key := drivertest.Key(t, "k")
	type result struct {
		g   driver.Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := slow.Acquire(ctx, driver.Request{Key: key, Owner: "slow", TTL: time.Minute})
		done <- result{g, err}
	}()
	// Wait until the slow insert is held in its trigger.
	for deadline := time.Now().Add(drivertest.Wait); ; {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow insert never reached its trigger")
		}
		time.Sleep(5 * time.Millisecond)
	}
	g, err := fast.Acquire(ctx, driver.Request{Key: key, Owner: "fast", TTL: time.Minute})
	if err != nil {
		t.Fatalf("fast Acquire while the slow insert is held: %v", err)
	}
	if err := fast.Release(ctx, key, "fast"); err != nil {
		t.Fatal(err)
	}
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	unlocked = true
	r := <-done
	if r.err != nil {
		t.Fatalf("slow Acquire: %v", r.err)
	}
	if r.g.Token <= g.Token {
		t.Fatalf("the grant made after the fast one's release has token %d, not above its %d", r.g.Token, g.Token)
	}
	if err := slow.Release(ctx, key, "slow"); err != nil {
		t.Fatal(err)
	}
}

// The uncontended INSERT of a key that another client holds for the same owner id
// is refused, and the second draw that may follow it (restamp.sql) leaves that
// client's grant and token alone, although the refused insert drew a later token.
func testRestampOnlyOwnInsert(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	pool := admin(t, srv)
	rawURL := withQuery(srv.URL(), "table", "restamp_locks")
	a, b := open(t, rawURL), open(t, rawURL)
	defer a.Close()
	defer b.Close()
	key := drivertest.Key(t, "k")
	g, err := a.Acquire(ctx, driver.Request{Key: key, Owner: "x", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "x", TTL: time.Minute}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("Acquire of a key the owner id holds through another client = %v, want ErrLocked", err)
	}
	var token int64
	if err := pool.QueryRow(ctx, `SELECT token FROM restamp_locks WHERE key = $1`, key).Scan(&token); err != nil {
		t.Fatal(err)
	}
	if uint64(token) != g.Token {
		t.Fatalf("the holder's token is %d after a refused insert, was %d", token, g.Token)
	}
	if err := a.Release(ctx, key, "x"); err != nil {
		t.Fatal(err)
	}
}

// A token sequence whose sessions draw from blocks of their own (CACHE above 1)
// would hand a later grant a lower token: Open refuses it, and says what to run.
func testSequenceCache(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	pool := admin(t, srv)
	rawURL := withQuery(srv.URL(), "table", "cached_locks")
	open(t, rawURL).Close()
	exec(t, pool, `ALTER SEQUENCE cached_locks_token_seq CACHE 20`)
	u, _ := url.Parse(rawURL)
	b, err := pglock.Open(ctx, u)
	if err == nil {
		b.Close()
		t.Fatal("Open accepted a token sequence with CACHE 20")
	}
	if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "CACHE 20") || !strings.Contains(err.Error(), "CACHE 1") {
		t.Fatalf("unclear error: %v", err)
	}
	exec(t, pool, `ALTER SEQUENCE cached_locks_token_seq CACHE 1`)
	open(t, rawURL).Close()
}

func testSQLInjection(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	pool := admin(t, srv)
	c, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	exec(t, pool, `CREATE TABLE IF NOT EXISTS canary (x int)`)
	keys := []string{
		`'; DROP TABLE canary; --`,
		`x'); DROP TABLE canary; --`,
		`" OR 1=1 --`,
		`$1`, `$$; DROP TABLE canary; $$`,
		`\'; DROP TABLE canary; --`,
		`E'\x27'`,
		`%s %d %v`,
		`dlock_locks`,
		`key = key OR true`,
	}
	for _, key := range keys {
		l, err := c.TryLock(ctx, key)
		if err != nil {
			t.Fatalf("TryLock(%q): %v", key, err)
		}
		var stored string
		if err := pool.QueryRow(ctx, `SELECT key FROM dlock_locks WHERE key = $1`, key).Scan(&stored); err != nil || stored != key {
			t.Fatalf("key %q stored as %q (%v)", key, stored, err)
		}
		if _, err := other.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("key %q not exclusive: %v", key, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release(%q): %v", key, err)
		}
	}
	// Table names are identifiers checked before any SQL is built.
	for _, table := range []string{
		`x"; DROP TABLE canary; --`, `canary; DROP TABLE canary`, `canary--`, `a b`, `"quoted"`,
		`public.x.y`, `.x`, `x.`, `Upper`, `1abc`, `x'y`, strings.Repeat("t", 49), `pg_catalog.pg_class"`,
	} {
		if c, err := dlock.Open(ctx, withQuery(srv.URL(), "table", table)); !errors.Is(err, dlock.ErrInvalid) {
			if err == nil {
				c.Close()
			}
			t.Errorf("table %q: Open = %v, want ErrInvalid", table, err)
		}
	}
	// An existing table that is not a lock table is refused, not written to.
	if c, err := dlock.Open(ctx, withQuery(srv.URL(), "table", "canary")); err == nil {
		c.Close()
		t.Errorf("Open with table=canary (not a lock table) succeeded")
	} else if !strings.Contains(err.Error(), "not usable as a dlock table") {
		t.Errorf("Open with table=canary: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM canary`).Scan(&n); err != nil {
		t.Fatalf("canary table gone: %v", err)
	}
}

func testURLParameters(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	for _, u := range []string{
		withQuery(srv.URL(), "bogus", "1"),
		withQuery(srv.URL(), "sslmod", "require"),       // a typo pgx would send to the server
		withQuery(srv.URL(), "work_mem", "64MB"),        // a real setting, but not one we allow
		withQuery(srv.URL(), "sslmode", "verify-fulll"), // pgx rejects the value
		withQuery(srv.URL(), "table", ""),
		withQuery(srv.URL(), "synchronous_commit", "off"),
		withQuery(srv.URL(), "pool_max_conns", "x"),
		withQuery(srv.URL(), "connect_timeout", "soon"),
	} {
		c, err := dlock.Open(ctx, u)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", u)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", u, err)
		}
		if strings.Contains(err.Error(), srv.Password) {
			t.Errorf("error shows the password: %v", err)
		}
	}
	// Allowed settings, pgx and pool parameters, a schema-qualified table, postgresql://.
	pool := admin(t, srv)
	exec(t, pool, `CREATE SCHEMA IF NOT EXISTS app`)
	good := withQuery(strings.Replace(srv.URL(), "postgres://", "postgresql://", 1),
		"table", "app.locks", "application_name", "url test+1", "statement_timeout", "5s",
		"pool_max_conns", "3", "synchronous_commit", "on", "ttl", "7s", "default_query_exec_mode", "exec")
	c, err := dlock.Open(ctx, good)
	if err != nil {
		t.Fatalf("Open(%q): %v", good, err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL() != 7*time.Second {
		t.Fatalf("ttl from URL not applied: %v", l.TTL())
	}
	var owner, app string
	if err := pool.QueryRow(ctx, `SELECT owner FROM app.locks WHERE key = 'k'`).Scan(&owner); err != nil || owner != l.Owner() {
		t.Fatalf("row in app.locks: %q, %v", owner, err)
	}
	if err := pool.QueryRow(ctx, `SELECT application_name FROM pg_stat_activity WHERE application_name = 'url test+1' LIMIT 1`).Scan(&app); err != nil {
		t.Fatalf("application_name not applied: %v", err)
	}
	// Tables are separate namespaces.
	d, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ld, err := d.TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("table dlock_locks blocked by app.locks: %v", err)
	}
	_ = ld.Release(ctx)
	_ = l.Release(ctx)
}

func testBadCredentials(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool := admin(t, srv)
	cases := []struct{ name, url, want string }{
		{"wrong password", srv.URLFor("postgres", "not-the-password-x9", "postgres"), "password authentication failed"},
		{"missing database", srv.URLFor("postgres", srv.Password, "no_such_db"), `database "no_such_db" does not exist`},
		{"unknown user", srv.URLFor("nobody_here", "pw-secret-77", "postgres"), "password authentication failed"},
		{"closed port", "postgres://postgres:pw-secret-77@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2", "connect"},
	}
	for _, tc := range cases {
		c, err := dlock.Open(ctx, withQuery(tc.url, "table", "never_created"))
		if err == nil {
			c.Close()
			t.Errorf("%s: Open succeeded", tc.name)
			continue
		}
		msg := err.Error()
		t.Logf("%s: %v", tc.name, err)
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s: error %q does not say %q", tc.name, msg, tc.want)
		}
		for _, pw := range []string{"not-the-password-x9", "pw-secret-77", srv.Password} {
			if strings.Contains(msg, pw) {
				t.Errorf("%s: error shows a password: %v", tc.name, err)
			}
		}
		if strings.Count(msg, "pglock:") > 1 {
			t.Errorf("%s: error repeats itself: %v", tc.name, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'never_created%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d relations created by failed opens (%v)", n, err)
	}
}

// A role without CREATE on the schema gets one clear error and creates nothing; once an
// administrator creates the table, the same role works with the documented privileges.
func testNoCreatePrivilege(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	pool := admin(t, srv)
	exec(t, pool, `DROP ROLE IF EXISTS limited`)
	exec(t, pool, `CREATE ROLE limited LOGIN PASSWORD 'limited-pw'`)
	u := withQuery(srv.URLFor("limited", "limited-pw", "postgres"), "table", "limited_locks")
	_, err := dlock.Open(ctx, u)
	if err == nil {
		t.Fatal("Open without CREATE privilege succeeded")
	}
	t.Logf("no privilege: %v", err)
	if !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), "nothing was created") {
		t.Fatalf("unclear error: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'limited_locks%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d relations half-created (%v)", n, err)
	}
	// The administrator creates the schema (by opening once), then grants the
	// documented privileges.
	ac, err := dlock.Open(ctx, withQuery(srv.URL(), "table", "limited_locks"))
	if err != nil {
		t.Fatal(err)
	}
	ac.Close()
	exec(t, pool, `GRANT SELECT, INSERT, UPDATE, DELETE ON limited_locks TO limited`)
	exec(t, pool, `GRANT USAGE ON SEQUENCE limited_locks_token_seq TO limited`)
	a, err := dlock.Open(ctx, u)
	if err != nil {
		t.Fatalf("Open with the documented privileges: %v", err)
	}
	defer a.Close()
	b, err := dlock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l2, err := b.Lock(ctx, "k")
		if err == nil {
			err = l2.Release(ctx)
		}
		got <- err
	}()
	if _, err := b.Backend().(driver.Inspector).Inspect(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// Many clients starting at once on a new table all succeed and create it once.
func testConcurrentSchemaCreation(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	const n = 8
	u := withQuery(srv.URL(), "table", "race_locks")
	var wg sync.WaitGroup
	errs := make(chan error, n)
	clients := make(chan *dlock.Client, n)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			c, err := dlock.Open(ctx, u)
			if err != nil {
				errs <- err
				return
			}
			clients <- c
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	close(clients)
	for err := range errs {
		t.Errorf("concurrent Open: %v", err)
	}
	var tokens []dlock.Token
	for c := range clients {
		l, err := c.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, l.Token())
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens not rising: %v", tokens)
		}
	}
}

// listenRaw LISTENs on the backend's channel with a plain connection and returns a
// function that reports the notifications received within d.
func listenRaw(t *testing.T, srv *testserver.Postgres, channel string) func(d time.Duration) []string {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return func(d time.Duration) []string {
		var got []string
		for {
			wctx, cancel := context.WithTimeout(ctx, d)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return got
			}
			got = append(got, n.Payload)
		}
	}
}

// waitQueued waits until key has n queued waiters.
func waitQueued(t *testing.T, c *dlock.Client, key string, n int) {
	t.Helper()
	in := c.Backend().(driver.Inspector)
	deadline := time.Now().Add(drivertest.Wait)
	for {
		info, err := in.Inspect(context.Background(), key)
		if err == nil && info.Waiters == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters never queued (last Inspect %+v, %v)", n, info, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An uncontended release sends no NOTIFY; a release with a waiter queued sends one,
// on the waiter's client's channel, naming the waiter and the key.
func testNotifyOnlyWhenWaited(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	h := harness(t, srv)
	a, b := h.Client(t), h.Client(t)
	recvA := listenRaw(t, srv, a.Backend().(*pglock.Backend).Channel())
	recvB := listenRaw(t, srv, b.Backend().(*pglock.Backend).Channel())
	key := drivertest.Key(t, "k")
	l, err := a.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = a.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := lockAsync(ctx, t, b, key)
	waitQueued(t, a, key, 1)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	if l2 == nil {
		t.FailNow()
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := recvA(300 * time.Millisecond); len(n) != 0 {
		t.Fatalf("notifications on the holder's channel: %q", n)
	}
	// A direct handoff: "owner key", then chr(1) and the grant (hand_off.sql).
	if n := recvB(300 * time.Millisecond); len(n) != 1 || !strings.HasPrefix(n[0], l2.Owner()+" "+key+"\x01") {
		t.Fatalf("notifications on the waiter's channel: %q, want [%q + a grant]", n, l2.Owner()+" "+key)
	}
}

// With the fallback retry far beyond the test's deadline and the holder's TTL longer
// still, waiters (two of them in one client) can only be woken by NOTIFY.
func testWokenByNotify(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	h := harness(t, srv)
	slow := []dlock.Option{dlock.WithRetry(time.Minute, 2*time.Minute), dlock.WithTTL(5 * time.Minute)}
	holder := h.Client(t, slow...)
	waiters := h.Client(t, slow...)
	other := h.Client(t, slow...)
	key := drivertest.Key(t, "k") + ` it's "odd" 日本 ' OR ''='`
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 3)
	for _, c := range []*dlock.Client{waiters, waiters, other} {
		go func() {
			l, err := c.Lock(ctx, key)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
	}
	time.Sleep(300 * time.Millisecond) // let them queue (not needed for correctness)
	var inside atomic.Int32
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		nl := <-got
		if nl == nil {
			t.FailNow()
		}
		if inside.Add(1) != 1 {
			t.Fatal("two holders")
		}
		inside.Add(-1)
		if err := nl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A waiter that crashes at the head of the queue (it stops trying without giving up
// its place) holds up the lock only until its place lapses; the next waiter then gets
// it without a wake-up, when its own retry comes.
func testCrashedWaiter(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := harness(t, srv)
	key := drivertest.Key(t, "k")
	holder := h.Client(t)
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	crashed := h.Open(t)
	defer crashed.Close()
	// Its place lives 3 s: long enough for the next waiter to queue behind it on
	// a loaded machine, short enough to wait for.
	req := driver.Request{Key: key, Owner: "crashed-waiter", TTL: time.Minute, Wait: true, Patience: 3 * time.Second}
	if _, err := crashed.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("crashed waiter's attempt: %v", err)
	}
	next := h.Client(t, dlock.WithRetry(10*time.Millisecond, 300*time.Millisecond))
	got := lockAsync(ctx, t, next, key)
	waitQueued(t, holder, key, 2)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l2 := <-got:
		if l2 == nil {
			t.FailNow()
		}
		if l2.Token() <= l.Token() {
			t.Fatalf("token %d after %d", l2.Token(), l.Token())
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the lock stayed reserved for a crashed waiter")
	}
	// The crashed waiter's place is gone: the key is free again.
	if _, err := holder.Backend().(driver.Inspector).Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after the handoffs: %v", err)
	}
}

// A refused waiting attempt reports how many live places are ahead of the caller's
// (driver.HeldError.Ahead), counting a waiter the free lock is reserved for; an
// attempt that will not wait reports none.
func testPlaceInQueue(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b := harness(t, srv).Open(t)
	defer b.Close()
	key := drivertest.Key(t, "k")
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	ahead := func(owner string, wait bool) int {
		t.Helper()
		req := driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: wait}
		if wait {
			req.Patience = time.Minute
		}
		_, err := b.Acquire(ctx, req)
		var held *driver.HeldError
		if !errors.As(err, &held) {
			t.Fatalf("%s's attempt: %v, want a *driver.HeldError", owner, err)
		}
		return held.Ahead
	}
	for i, w := range []string{"w0", "w1", "w2"} {
		if got := ahead(w, true); got != i {
			t.Fatalf("%s queued with %d ahead, want %d", w, got, i)
		}
	}
	if got := ahead("w2", true); got != 2 {
		t.Fatalf("w2 again: %d ahead, want 2", got)
	}
	if got := ahead("other", false); got != 0 {
		t.Fatalf("an attempt that will not wait: %d ahead, want 0", got)
	}
	if err := b.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	// Reserved for w0, which is still ahead until it takes the lock.
	if got := ahead("w1", true); got != 1 {
		t.Fatalf("w1 with the lock reserved for w0: %d ahead, want 1", got)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "w0", TTL: time.Minute, Wait: true, Patience: time.Minute}); err != nil {
		t.Fatalf("w0 takes its reservation: %v", err)
	}
	if got := ahead("w1", true); got != 0 {
		t.Fatalf("w1 behind w0's grant: %d ahead, want 0", got)
	}
	if got := ahead("w2", true); got != 1 {
		t.Fatalf("w2 behind w0's grant: %d ahead, want 1", got)
	}
	// Down the chain, leaving nothing behind.
	for i, w := range []string{"w0", "w1", "w2"} {
		if i > 0 {
			if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: w, TTL: time.Minute, Wait: true, Patience: time.Minute}); err != nil {
				t.Fatalf("%s takes its reservation: %v", w, err)
			}
		}
		if err := b.Release(ctx, key, w); err != nil {
			t.Fatalf("%s releases: %v", w, err)
		}
	}
	if _, err := b.(driver.Inspector).Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after the chain: %v", err)
	}
}

// New works on the caller's pool and leaves it open; the listening connection opens
// for the first wait and closes once no one has waited for the linger time.
func testNewAndLinger(t *testing.T, srv *testserver.Postgres) {
	ctx := context.Background()
	pool := admin(t, srv)
	if _, err := pglock.New(ctx, pool, pglock.WithTable("Bad-Name")); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("New with a bad table: %v", err)
	}
	if _, err := pglock.New(ctx, pool, pglock.WithLinger(0)); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("New with linger 0: %v", err)
	}
	be, err := pglock.New(ctx, pool, pglock.WithTable("public.linger_locks"), pglock.WithLinger(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dlock.New(be)
	if err != nil {
		t.Fatal(err)
	}
	listeners := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = $1`,
			"LISTEN "+pgx.Identifier{be.Channel()}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := listeners(); n != 0 {
		t.Fatalf("%d listening connections before any wait", n)
	}
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if n := listeners(); n != 0 {
		t.Fatalf("%d listening connections after an uncontended Lock, want 0", n)
	}
	w, err := be.Watch(ctx, "k", "o") // a wait
	if err != nil {
		t.Fatal(err)
	}
	if n := listeners(); n != 1 {
		t.Fatalf("%d listening connections after a wait, want 1", n)
	}
	if err := w.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(drivertest.Wait)
	for listeners() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("listening connection still open long after the linger time")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("the caller's pool was closed: %v", err)
	}
}

// terminate ends the server connections with application_name app.
func terminate(t *testing.T, pool *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(),
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A client whose connections are all terminated (pool and listener) renews its lease
// on new connections, and its waiter is still woken; no one else gets in meanwhile.
func testConnectionLoss(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := admin(t, srv)
	key := drivertest.Key(t, "k")
	mk := func(app string, opts ...dlock.Option) *dlock.Client {
		c, err := dlock.Open(ctx, withQuery(srv.URL(), "application_name", app), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a := mk("loss-a", dlock.WithTTL(3*time.Second), dlock.WithRenewInterval(200*time.Millisecond))
	b := mk("loss-b", dlock.WithRetry(time.Minute, 2*time.Minute))
	c := mk("loss-c")
	l, err := a.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := lockAsync(ctx, t, b, key)
	time.Sleep(200 * time.Millisecond) // let b queue (not needed for correctness)
	if n := terminate(t, pool, "loss-a") + terminate(t, pool, "loss-b"); n < 2 {
		t.Fatalf("terminated %d connections, want at least 2", n)
	}
	// a renews on a new connection: its expiry moves on, and it stays the holder.
	before := l.Expiry()
	for l.Expiry().Equal(before) {
		select {
		case <-l.Done():
			t.Fatalf("lease lost after a connection loss: %v", l.Err())
		case <-ctx.Done():
			t.Fatal("lease never renewed after the connection loss")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := c.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock while a holds it: %v", err)
	}
	select {
	case <-got:
		t.Fatal("b got the key while a held it")
	default:
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after reconnect: %v", err)
	}
	// b's fallback is a minute away: only its re-established LISTEN can wake it.
	select {
	case l2 := <-got:
		if l2 == nil {
			t.FailNow()
		}
		if l2.Token() <= l.Token() {
			t.Fatalf("token %d after %d", l2.Token(), l.Token())
		}
		_ = l2.Release(ctx)
	case <-ctx.Done():
		t.Fatal("waiter not woken after its listening connection was terminated")
	}
}

// A holder that loses its connection and cannot reconnect (its login is revoked)
// learns that its lease is lost before anyone else can take the key: never two holders.
func testLoginRevoked(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := admin(t, srv)
	exec(t, pool, `DROP ROLE IF EXISTS revoked`)
	exec(t, pool, `CREATE ROLE revoked LOGIN PASSWORD 'revoked-pw'`)
	exec(t, pool, `GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_locks TO revoked`)
	exec(t, pool, `GRANT USAGE ON SEQUENCE dlock_locks_token_seq TO revoked`)
	a, err := dlock.Open(ctx, withQuery(srv.URLFor("revoked", "revoked-pw", "postgres"), "application_name", "revoked-a"),
		// A 10% drift allowance covers goroutine scheduling on a loaded test machine:
		// the lease must end on the client before the server-side expiry.
		dlock.WithTTL(2*time.Second), dlock.WithRenewInterval(200*time.Millisecond), dlock.WithDrift(0.1, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := drivertest.Key(t, "k")
	l, err := a.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `ALTER ROLE revoked NOLOGIN`)
	terminate(t, pool, "revoked-a")
	for {
		l2, err := c.TryLock(ctx, key)
		if err == nil {
			select {
			case <-l.Done():
			default:
				t.Fatal("another client got the key while the old holder still believed it held it")
			}
			if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
				t.Fatalf("old lease: %v, want ErrLeaseLost", l.Err())
			}
			if l2.Token() <= l.Token() {
				t.Fatalf("token %d after %d", l2.Token(), l.Token())
			}
			_ = l2.Release(ctx)
			break
		}
		if !errors.Is(err, dlock.ErrLocked) {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("key never freed")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
}

// TLS parameters reach pgx: verify-full against the right CA connects over TLS (the
// listening connection too); against another CA it fails, and says why.
func TestTLS(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	srv := testserver.StartPostgresTLS(t, files)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := srv.URLFor("postgres", srv.Password, "postgres")
	u := withQuery(base, "sslmode", "verify-full", "sslrootcert", files.CA, "application_name", "tls-test")
	c, err := dlock.Open(ctx, u)
	if err != nil {
		t.Fatalf("Open over TLS: %v", err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Backend().(driver.Notifier).Watch(ctx, "other", "o") // opens the listening connection
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx, false)
	var plain int
	if err := admin(t, srv).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.application_name = 'tls-test' AND NOT s.ssl`).Scan(&plain); err != nil {
		t.Fatal(err)
	}
	var tlsConns int
	if err := admin(t, srv).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.application_name = 'tls-test' AND s.ssl`).Scan(&tlsConns); err != nil {
		t.Fatal(err)
	}
	if plain != 0 || tlsConns < 2 {
		t.Fatalf("%d plain and %d TLS connections, want 0 and at least 2 (pool and listener)", plain, tlsConns)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := testserver.NewTLSFiles(t)
	bad := withQuery(base, "sslmode", "verify-full", "sslrootcert", other.CA)
	if c, err := dlock.Open(ctx, bad); err == nil {
		c.Close()
		t.Fatal("Open trusting another CA succeeded")
	} else if !strings.Contains(err.Error(), "certificate") || strings.Contains(err.Error(), srv.Password) {
		t.Fatalf("Open trusting another CA: %v", err)
	}
	if c, err := dlock.Open(ctx, withQuery(base, "sslmode", "verify-full", "sslrootcert", "/nonexistent/ca.pem")); err == nil {
		c.Close()
		t.Fatal("Open with a missing CA file succeeded")
	}
}

// The server crashes (SIGKILL) and restarts while a lock is held: the holder renews
// on new connections and stays the only holder, or loses the lease before anyone else
// gets in; tokens keep rising across the crash.
func TestServerRestart(t *testing.T) {
	srv := testserver.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mk := func(opts ...dlock.Option) *dlock.Client {
		c, err := dlock.Open(ctx, srv.URL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a := mk(dlock.WithTTL(5*time.Second), dlock.WithRenewInterval(200*time.Millisecond))
	c := mk()
	var maxTok dlock.Token
	for i := range 5 {
		l, err := c.Lock(ctx, fmt.Sprintf("warm-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		maxTok = max(maxTok, l.Token())
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l, err := a.Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= maxTok {
		t.Fatalf("token %d not above %d", l.Token(), maxTok)
	}
	maxTok = l.Token()

	// Crash and restart at once: the lease survives (the grant was committed) and
	// renews on new connections.
	srv.Kill()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	for !l.Expiry().After(restarted.Add(l.TTL() * 98 / 100)) {
		select {
		case <-l.Done():
			t.Fatalf("lease lost across a quick restart: %v", l.Err())
		case <-ctx.Done():
			t.Fatal("lease not renewed after the restart")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := c.TryLock(ctx, "held"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock of the held key after the restart: %v", err)
	}
	for i := range 3 {
		l2, err := c.Lock(ctx, fmt.Sprintf("after-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if l2.Token() <= maxTok {
			t.Fatalf("token after crash %d not above %d", l2.Token(), maxTok)
		}
		maxTok = l2.Token()
		_ = l2.Release(ctx)
	}

	// Down for longer than the TTL: the holder's lease ends on its own clock before
	// the server (back up) lets anyone else take the key.
	srv.Kill()
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("lease not lost while the server was down")
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("lease: %v, want ErrLeaseLost", l.Err())
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	l3, err := c.Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if l3.Token() <= maxTok {
		t.Fatalf("token %d after the second crash not above %d", l3.Token(), maxTok)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of the lost lease = %v", err)
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter that gives up while the server is down leaves no place behind once it
// is back (see drivertest.WithdrawAfterOutage): its client, still listening, would
// keep that place live however old it is.
func TestWithdrawAfterOutage(t *testing.T) {
	srv := testserver.StartPostgres(t)
	drivertest.WithdrawAfterOutage(t, harness(t, srv), srv.Stop, srv.Restart)
}
