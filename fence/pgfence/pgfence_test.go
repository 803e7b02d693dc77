package pgfence_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence"
	"github.com/dlockio/dlock/fence/internal/fencetest"
	"github.com/dlockio/dlock/fence/pgfence"
	"github.com/dlockio/dlock/internal/testserver"
	_ "github.com/dlockio/dlock/pglock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pool(t testing.TB, srv *testserver.Postgres) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func exec(t testing.TB, db *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func guard(t testing.TB, db *pgxpool.Pool, opts ...pgfence.Option) *pgfence.Guard {
	t.Helper()
	g, err := pgfence.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Setup(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return g
}

func TestPostgres(t *testing.T) {
	srv := testserver.StartPostgres(t)
	db := pool(t, srv)
	t.Run("Setup", func(t *testing.T) { testSetup(t, db) })
	t.Run("Interleaved", func(t *testing.T) { testInterleaved(t, db) })
	t.Run("InterleavedBatch", func(t *testing.T) { testInterleavedBatch(t, db) })
	t.Run("PausedHolder", func(t *testing.T) { testPausedHolder(t, srv, db) })
	t.Run("FullRange", func(t *testing.T) { testFullRange(t, db) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, db) })
	t.Run("RolledBack", func(t *testing.T) { testRolledBack(t, db) })
	t.Run("Column", func(t *testing.T) { testColumn(t, db) })
	t.Run("DatabaseSQL", func(t *testing.T) { testDatabaseSQL(t, srv, db) })
	t.Run("DoForms", func(t *testing.T) { testDoForms(t, db) })
}

// Do on a pool releases its connection whatever happens (stale, fn error, panic),
// and inside a caller's transaction it runs in a savepoint.
func testDoForms(t *testing.T, db *pgxpool.Pool) {
	ctx := context.Background()
	g := guard(t, db)
	exec(t, db, `CREATE TABLE df (id int PRIMARY KEY, v text NOT NULL)`)
	exec(t, db, `INSERT INTO df VALUES (1, 'kept')`)
	if err := g.Do(ctx, db, "df", 10, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	upd := func(v string) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error { _, err := tx.Exec(ctx, "UPDATE df SET v = $1 WHERE id = 1", v); return err }
	}
	if err := g.Do(ctx, db, "df", 9, upd("stale")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale: %v", err)
	}
	boom := errors.New("boom")
	if err := g.Do(ctx, db, "df", 11, func(tx pgx.Tx) error { _ = upd("failed")(tx); return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn error: %v", err)
	}
	func() {
		defer func() { _ = recover() }()
		_ = g.Do(ctx, db, "df", 11, func(tx pgx.Tx) error { _ = upd("panicked")(tx); panic("fn panics") })
	}()
	if n := db.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
	// In a transaction of the caller: a savepoint; the outer transaction goes on.
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := g.Do(ctx, tx, "df", 9, upd("stale in tx")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale in tx: %v", err)
	}
	if err := g.Do(ctx, tx, "df", 10, upd("in tx")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.QueryRow(ctx, "SELECT v FROM df").Scan(&v); err != nil || v != "in tx" {
		t.Fatalf("v: %q %v", v, err)
	}
}

// database/sql through pgx's stdlib driver: g.SQL() first in the transaction, its
// error through g.Err.
func testDatabaseSQL(t *testing.T, srv *testserver.Postgres, db *pgxpool.Pool) {
	ctx := context.Background()
	g := guard(t, db)
	exec(t, db, `CREATE TABLE sq (id int PRIMARY KEY, v text NOT NULL)`)
	exec(t, db, `INSERT INTO sq VALUES (1, 'kept')`)
	sdb, err := sql.Open("pgx", srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	write := func(token uint64, v string) error {
		tx, err := sdb.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, g.SQL(), "sq", strconv.FormatUint(token, 10)); err != nil {
			return g.Err(err, "sq", token)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE sq SET v = $1 WHERE id = 1", v); err != nil {
			return err
		}
		return tx.Commit()
	}
	if err := write(1<<63+5, "new"); err != nil {
		t.Fatal(err)
	}
	var se *fence.StaleError
	if err := write(1<<63+4, "stale"); !errors.As(err, &se) || se.Current != 1<<63+5 {
		t.Fatalf("stale: %v", err)
	}
	var v string
	if err := db.QueryRow(ctx, "SELECT v FROM sq").Scan(&v); err != nil || v != "new" {
		t.Fatalf("v: %q %v", v, err)
	}
}

func testSetup(t *testing.T, db *pgxpool.Pool) {
	ctx := context.Background()
	g, err := pgfence.New(pgfence.WithTable("setup_fence"))
	if err != nil {
		t.Fatal(err)
	}
	// Before Setup: a clear error with the DDL, and the transaction did nothing.
	err = g.Do(ctx, db, "r", 1, func(pgx.Tx) error { t.Fatal("fn ran without a fence table"); return nil })
	if !errors.Is(err, pgfence.ErrNoTable) || !strings.Contains(err.Error(), "CREATE TABLE IF NOT EXISTS setup_fence") {
		t.Fatalf("missing table: %v", err)
	}
	// Concurrent Setup calls all succeed.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- g.Setup(ctx, db) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Setup: %v", err)
		}
	}
	if err := g.Do(ctx, db, "r", 1, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A table of the same name with a wrong column type is refused by Setup.
	exec(t, db, `CREATE TABLE wrong_fence (resource text PRIMARY KEY, token bigint NOT NULL)`)
	w, _ := pgfence.New(pgfence.WithTable("wrong_fence"))
	if err := w.Setup(ctx, db); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "column token has type bigint, want numeric(20,0)") {
		t.Fatalf("wrong type: %v", err)
	}
	// Schema-qualified tables work.
	exec(t, db, `CREATE SCHEMA IF NOT EXISTS app`)
	q := guard(t, db, pgfence.WithTable("app.fence"))
	if err := q.Do(ctx, db, "r", 3, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if q.Table() != "app.fence" {
		t.Fatal(q.Table())
	}
}

// committedLog reads a log table in insertion order: the fence row lock makes it
// commit order too.
func committedLog(db *pgxpool.Pool, table string) func(ctx context.Context) []uint64 {
	return func(ctx context.Context) []uint64 {
		rows, _ := db.Query(ctx, "SELECT token FROM "+table+" ORDER BY seq")
		out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			panic(err)
		}
		var u []uint64
		for _, v := range out {
			u = append(u, uint64(v))
		}
		return u
	}
}

func testInterleaved(t *testing.T, db *pgxpool.Pool) {
	g := guard(t, db)
	exec(t, db, `CREATE TABLE il_log (seq bigserial PRIMARY KEY, token bigint NOT NULL)`)
	exec(t, db, `CREATE TABLE il_item (id int PRIMARY KEY, last bigint NOT NULL)`)
	exec(t, db, `INSERT INTO il_item VALUES (1, 0)`)
	fencetest.Interleaved(t, 8, 40, func(ctx context.Context, tk uint64) error {
		return g.Do(ctx, db, "il", tk, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO il_log (token) VALUES ($1)", int64(tk)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "UPDATE il_item SET last = $1 WHERE id = 1", int64(tk))
			return err
		})
	}, committedLog(db, "il_log"))
	var last int64
	if err := db.QueryRow(context.Background(), "SELECT last FROM il_item").Scan(&last); err != nil || last != 40*7 {
		t.Fatalf("item: %d, %v", last, err)
	}
}

func testInterleavedBatch(t *testing.T, db *pgxpool.Pool) {
	g := guard(t, db)
	exec(t, db, `CREATE TABLE ib_log (seq bigserial PRIMARY KEY, token bigint NOT NULL)`)
	fencetest.Interleaved(t, 8, 40, func(ctx context.Context, tk uint64) error {
		b := &pgx.Batch{}
		b.Queue("INSERT INTO ib_log (token) VALUES ($1)", int64(tk))
		return g.SendBatch(ctx, db, "ib", tk, b)
	}, committedLog(db, "ib_log"))
}

// A holder with a real pglock lease is "paused" past its lease (the lock is taken
// from it, as its expiry would), a new holder takes the lock and writes, and then the
// old holder's late write is refused while the new holder's data stands.
func testPausedHolder(t *testing.T, srv *testserver.Postgres, db *pgxpool.Pool) {
	ctx := context.Background()
	g := guard(t, db)
	exec(t, db, `CREATE TABLE ph_report (id int PRIMARY KEY, body text NOT NULL, token bigint NOT NULL)`)
	exec(t, db, `INSERT INTO ph_report VALUES (1, 'empty', 0)`)
	c, err := dlock.Open(ctx, srv.URL()+"&ttl=30s")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fencetest.PausedHolder(t, c, "report", func(l *dlock.Lease, body string) error {
		return g.Do(ctx, db, "report", uint64(l.Token()), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE ph_report SET body = $1, token = $2 WHERE id = 1", body, int64(l.Token()))
			return err
		})
	})
	var body string
	if err := db.QueryRow(ctx, "SELECT body FROM ph_report").Scan(&body); err != nil || body != "new, again" {
		t.Fatalf("report: %q, %v", body, err)
	}
}

func testFullRange(t *testing.T, db *pgxpool.Pool) {
	g := guard(t, db)
	fencetest.FullRange(t, func(ctx context.Context, tk uint64) error {
		return g.Do(ctx, db, "range", tk, func(pgx.Tx) error { return nil })
	})
	var s string
	if err := db.QueryRow(context.Background(), "SELECT token::text FROM dlock_fence WHERE resource = 'range'").Scan(&s); err != nil || s != "18446744073709551615" {
		t.Fatalf("stored: %s, %v", s, err)
	}
}

func testBadInput(t *testing.T, db *pgxpool.Pool) {
	ctx := context.Background()
	g := guard(t, db)
	ran := false
	fn := func(pgx.Tx) error { ran = true; return nil }
	if err := g.Do(ctx, db, "r", 0, fn); !errors.Is(err, fence.ErrNoToken) || !strings.Contains(err.Error(), "cannot protect") {
		t.Fatalf("token 0: %v", err)
	}
	for _, name := range []string{"", "a\x00b", "new\nline", "\xff\xfe", strings.Repeat("r", fence.MaxResourceLen+1)} {
		if err := g.Do(ctx, db, name, 1, fn); !errors.Is(err, fence.ErrInvalid) || !strings.HasPrefix(err.Error(), "dlock: invalid argument: pgfence: ") {
			t.Fatalf("resource %q: %v", name, err)
		}
	}
	if ran {
		t.Fatal("fn ran on bad input")
	}
	for _, table := range []string{"", "Fence", "a;drop table x", "a.b.c", "x" + strings.Repeat("y", 48), "1abc"} {
		if _, err := pgfence.New(pgfence.WithTable(table)); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("table %q: %v", table, err)
		}
	}
	// Quotes and SQL in a resource name are data.
	if err := g.Do(ctx, db, "x'); DROP TABLE dlock_fence; --", 1, fn); err != nil {
		t.Fatal(err)
	}
	if err := g.Do(ctx, db, "x'); DROP TABLE dlock_fence; --", 1, fn); err != nil {
		t.Fatal(err)
	}
}

// The guard's refusal rolls back the caller's writes made before the check in the
// same transaction, and even a caller that ignores the error and commits commits
// nothing.
func testRolledBack(t *testing.T, db *pgxpool.Pool) {
	ctx := context.Background()
	g := guard(t, db)
	exec(t, db, `CREATE TABLE rb_rows (id int PRIMARY KEY, v text NOT NULL)`)
	exec(t, db, `INSERT INTO rb_rows VALUES (1, 'kept')`)
	if err := g.Do(ctx, db, "rb", 10, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE rb_rows SET v = 'stale' WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO rb_rows VALUES (2, 'stale')"); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, tx, "rb", 9); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("Check: %v", err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) { // the careless caller
		t.Fatalf("Commit after a stale check: %v", err)
	}
	// The batch form: nothing after the check runs.
	b := &pgx.Batch{}
	b.Queue("UPDATE rb_rows SET v = 'stale batch' WHERE id = 1").Exec(func(pgconn.CommandTag) error { t.Error("callback ran after a stale check"); return nil })
	if err := g.SendBatch(ctx, db, "rb", 8, b); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("SendBatch: %v", err)
	}
	var n int
	var v string
	if err := db.QueryRow(ctx, "SELECT count(*), max(v) FROM rb_rows").Scan(&n, &v); err != nil || n != 1 || v != "kept" {
		t.Fatalf("rows: %d %q %v", n, v, err)
	}
	var mark string
	if err := db.QueryRow(ctx, "SELECT token::text FROM dlock_fence WHERE resource = 'rb'").Scan(&mark); err != nil || mark != "10" {
		t.Fatalf("mark: %s %v", mark, err)
	}
}

func testColumn(t *testing.T, db *pgxpool.Pool) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE acct (id int PRIMARY KEY, balance int NOT NULL, fence numeric(20,0) NOT NULL DEFAULT 0)`)
	exec(t, db, `CREATE TABLE acct_log (seq bigserial PRIMARY KEY, token bigint NOT NULL)`)
	exec(t, db, `INSERT INTO acct (id, balance) VALUES (1, 0)`)
	col := pgfence.Column{Table: "acct", Key: "id", Fence: "fence"}
	fencetest.Interleaved(t, 8, 40, func(ctx context.Context, tk uint64) error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := col.Update(ctx, tx, 1, tk, "balance = balance + $1", 1); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO acct_log (token) VALUES ($1)", int64(tk))
			return err
		})
	}, committedLog(db, "acct_log"))
	// Outside a transaction the statement is its own: still guarded.
	if err := col.Update(ctx, db, 1, 7, "balance = 0"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale on the pool: %v", err)
	}
	var se *fence.StaleError
	if err := col.Update(ctx, db, 1, 8, ""); !errors.As(err, &se) || se.Current != 280 {
		t.Fatalf("stale current: %v", err)
	}
	if err := col.Update(ctx, db, 2, 500, "balance = 1"); !errors.Is(err, pgfence.ErrNoRow) {
		t.Fatalf("no row: %v", err)
	}
	exec(t, db, `INSERT INTO acct (id, balance) VALUES (3, 0)`)
	fencetest.FullRange(t, func(ctx context.Context, tk uint64) error {
		return col.Update(ctx, db, 3, tk, "")
	})
	// A bigint fence column takes tokens below 2^63 and refuses larger ones clearly.
	exec(t, db, `CREATE TABLE small (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`)
	exec(t, db, `INSERT INTO small VALUES (1, 0)`)
	sc := pgfence.Column{Table: "small", Key: "id", Fence: "fence"}
	if err := sc.Update(ctx, db, 1, 1<<63-1, ""); err != nil {
		t.Fatal(err)
	}
	if err := sc.Update(ctx, db, 1, 1<<63, ""); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "numeric(20,0)") {
		t.Fatalf("bigint overflow: %v", err)
	}
	if err := sc.Update(ctx, db, 1, 0, ""); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("token 0: %v", err)
	}
	for _, bad := range []pgfence.Column{{Table: "x;y", Key: "id", Fence: "f"}, {Table: "t", Key: "ID", Fence: "f"}, {Table: "t", Key: "id", Fence: ""}} {
		if err := bad.Update(ctx, db, 1, 1, ""); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}

// The psql job of docs/fencing.md, as dlock run would start it.
func TestPsqlJob(t *testing.T) {
	psql := testserver.Require(t, "postgres", "psql", "apt-get install postgresql-client")
	srv := testserver.StartPostgres(t)
	db := pool(t, srv)
	guard(t, db)
	exec(t, db, `CREATE TABLE report (day date PRIMARY KEY, total int NOT NULL, token numeric(20,0) NOT NULL)`)
	run := func(token string) (string, int) {
		cmd := osexec.Command("./testdata/report.sh")
		cmd.Env = append(os.Environ(), "PGURL="+srv.URL(), "DLOCK_TOKEN="+token, "DLOCK_KEY=nightly-report", "DLOCK_HELD=1",
			"PATH="+filepath.Dir(psql)+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		var ee *osexec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	if out, code := run("18446744073709551000"); code != 0 {
		t.Fatalf("first run: %d %s", code, out)
	}
	out, code := run("9")
	if code != 3 || !strings.Contains(out, "stale token") || !strings.Contains(out, "18446744073709551000") {
		t.Fatalf("stale run: exit %d: %s", code, out)
	}
	var tok string
	if err := db.QueryRow(context.Background(), "SELECT token::text FROM report").Scan(&tok); err != nil || tok != "18446744073709551000" {
		t.Fatalf("report token %s %v", tok, err)
	}
	if out, code := run("18446744073709551000"); code != 0 { // the same holder again
		t.Fatalf("equal run: %d %s", code, out)
	}
	if out, code := run("0"); code != 3 || !strings.Contains(out, "invalid token") {
		t.Fatalf("token 0: %d %s", code, out)
	}
}
