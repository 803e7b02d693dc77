// Package pgfence is dlock's fencing guard for PostgreSQL, on pgx v5: the token
// check runs inside the caller's own transaction (or batch), so the caller's writes
// and the check commit or fail together.
//
// # Guarantees
//
//   - A write guarded with token t commits only if no transaction that committed
//     before it was guarded with a token greater than t on the same resource name.
//     Equal tokens pass (one holder writes many times under one grant).
//   - A stale token makes the check raise an error inside PostgreSQL (SQLSTATE
//     DL001): the transaction is aborted on the server, so the caller's writes in it
//     cannot commit even if the caller ignores the error (pgx's Commit then reports
//     a rollback).
//   - Concurrent guarded transactions on one resource serialise on its mark row:
//     a stale one waits for the newer one to commit, then fails.
//
// # Not promised
//
//   - Writes that do not go through the guard (another program, a forgotten code
//     path) are not fenced. Every writer of a resource must check the same resource
//     name in the same table.
//   - Under REPEATABLE READ or SERIALIZABLE a concurrent newer holder makes the check
//     fail with a serialization error (SQLSTATE 40001) rather than ErrStale; retry the
//     transaction, as with any serialization failure.
//
// # Algorithm
//
// A high-water-mark table (default dlock_fence) holds one row per resource name:
// (resource text primary key, token numeric(20,0)). numeric holds every uint64
// exactly; bigint is signed and would lose the top half of the range. Setup creates
// the table and a small PL/pgSQL function, <table>_check(resource, token), that runs
//
//	INSERT INTO t AS f (resource, token) VALUES ($1, $2)
//	ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
//	WHERE f.token <= EXCLUDED.token
//
// and, when that touched no row (a higher mark exists), reads the mark and raises
// SQLSTATE DL001 with the mark in the error's DETAIL. The guard adds no round trip in
// Do (BEGIN and the check go as one pgx batch) and SendBatch (the check is queued
// before the caller's statements; in an implicit or explicit transaction a failing
// statement stops the rest), and one statement in Check, for a transaction the
// caller began itself.
//
// Tables that carry their own fence column need no mark table: see Column.
package pgfence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/fence"
)

const guardName = "pgfence"

// DefaultTable is the mark table's name when WithTable is not given.
const DefaultTable = "dlock_fence"

// StaleCode is the SQLSTATE the check function raises for a stale token.
const StaleCode = "DL001"

// ErrNoTable: the mark table or its check function does not exist. The error's
// message carries the DDL to run (Guard.DDL); Guard.Setup runs it.
var ErrNoTable = errors.New("dlock: fence: pgfence: fence table missing")

// ErrNoRow: Column.Update found no row with the given key.
var ErrNoRow = errors.New("dlock: fence: pgfence: no such row")

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Option configures a Guard.
type Option func(*Guard) error

// WithTable sets the mark table, "table" or "schema.table": lower-case letters,
// digits and underscores, starting with a letter or an underscore, the table name
// at most 48 bytes (the check function is named <table>_check). Every writer of a
// resource must use the same table.
func WithTable(name string) Option {
	return func(g *Guard) error {
		schema, table, qualified := strings.Cut(name, ".")
		if !qualified {
			schema, table = "", name
		}
		if !identRE.MatchString(table) || len(table) > 48 || (qualified && (!identRE.MatchString(schema) || len(schema) > 63)) {
			return fence.Invalid(guardName, "table %q: want lower-case letters, digits and underscores, \"table\" or \"schema.table\", the table name at most 48 bytes", name)
		}
		g.schema, g.table = schema, table
		return nil
	}
}

// Guard checks fencing tokens against a mark table. It holds no connection and is
// safe for concurrent use.
type Guard struct {
	schema, table string
	qtable, qfunc string // qualified names
	check         string // the check statement
	ddl           string
}

// New returns a guard on the mark table (DefaultTable unless WithTable). It does not
// touch the database: call Setup once per database (or run DDL yourself).
func New(opts ...Option) (*Guard, error) {
	g := &Guard{table: DefaultTable}
	for _, o := range opts {
		if err := o(g); err != nil {
			return nil, err
		}
	}
	g.qtable, g.qfunc = g.table, g.table+"_check"
	if g.schema != "" {
		g.qtable, g.qfunc = g.schema+"."+g.qtable, g.schema+"."+g.qfunc
	}
	g.check = "SELECT " + g.qfunc + "($1, $2::text::numeric)"
	var b strings.Builder
	if err := ddlTemplate.Execute(&b, struct{ Table, Func string }{g.qtable, g.qfunc}); err != nil {
		return nil, err
	}
	g.ddl = strings.TrimSpace(b.String()[strings.Index(b.String(), "CREATE"):])
	return g, nil
}

// Table returns the mark table's (possibly schema-qualified) name.
func (g *Guard) Table() string { return g.qtable }

// SQL returns the check statement, with parameters $1 = resource name (text) and
// $2 = token (decimal text), for callers on database/sql through pgx's stdlib
// driver: run it first in the transaction and pass its error to Err.
func (g *Guard) SQL() string { return g.check }

// DDL returns the statements that create the mark table and its check function.
func (g *Guard) DDL() string { return g.ddl }

//go:embed ddl.sql
var ddlSQL string

var ddlTemplate = template.Must(template.New("ddl.sql").Parse(ddlSQL))

// Beginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// BatchSender sends batches: *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Setup creates the mark table and its check function if they do not exist, and
// checks the columns of an existing table. Concurrent calls are safe (they serialise
// on a transaction-level advisory lock). It needs the CREATE privilege; without it,
// have an administrator run DDL.
func (g *Guard) Setup(ctx context.Context, db Beginner) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "dlock-fence:"+g.qtable); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, g.DDL()); err != nil {
			return err
		}
		return g.checkColumns(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("dlock: fence: pgfence: set up %s: %w (the DDL, for an administrator to run:\n%s)", g.qtable, err, g.DDL())
	}
	return nil
}

func (g *Guard) checkColumns(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`, g.qtable)
	if err != nil {
		return err
	}
	types, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var c [2]string
		err := r.Scan(&c[0], &c[1])
		return c, err
	})
	if err != nil {
		return err
	}
	want := map[string]string{"resource": "text", "token": "numeric(20,0)"}
	for _, c := range types {
		if w, ok := want[c[0]]; ok {
			if c[1] != w {
				return fence.Invalid(guardName, "table %s: column %s has type %s, want %s", g.qtable, c[0], c[1], w)
			}
			delete(want, c[0])
		}
	}
	for c, w := range want {
		return fence.Invalid(guardName, "table %s has no column %s %s", g.qtable, c, w)
	}
	return nil
}

func args(resource string, token uint64) []any {
	return []any{resource, strconv.FormatUint(token, 10)}
}

func validate(resource string, token uint64) error {
	if err := fence.CheckToken(token); err != nil {
		return err
	}
	return fence.CheckResource(guardName, resource)
}

// Check records token as resource's mark inside tx, or fails: with a *fence.StaleError
// (matching fence.ErrStale) when the resource has accepted a higher token, and then
// tx is aborted on the server and can only be rolled back. Run it before the writes
// it guards (it also serialises concurrent holders on the mark row). Token 0 is
// refused with fence.ErrNoToken; a missing table with ErrNoTable.
func (g *Guard) Check(ctx context.Context, tx pgx.Tx, resource string, token uint64) error {
	if err := validate(resource, token); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, g.check, args(resource, token)...)
	return g.Err(err, resource, token)
}

// Do runs fn in a new transaction on db after Check, and commits if both succeed;
// any error (or a panic) rolls everything back. On a pool or a connection, BEGIN and
// the check go in one round trip (pgx.Batch.BeginTx), so the guard adds no round trip
// to the transaction; in a pgx.Tx, Do runs in a savepoint and the check costs one.
func (g *Guard) Do(ctx context.Context, db BatchSender, resource string, token uint64, fn func(tx pgx.Tx) error) error {
	if err := validate(resource, token); err != nil {
		return err
	}
	if parent, ok := db.(pgx.Tx); ok {
		return pgx.BeginFunc(ctx, parent, func(tx pgx.Tx) error {
			if err := g.Check(ctx, tx, resource, token); err != nil {
				return err
			}
			return fn(tx)
		})
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(g.check, args(resource, token)...)
	br := db.SendBatch(ctx, b)
	err := br.Close()
	tx := br.Tx()
	if tx == nil {
		return g.Err(err, resource, token)
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: ErrTxClosed, ignored
	if err != nil {
		return g.Err(err, resource, token)
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// SendBatch sends the check followed by the queries queued in b, in one round trip,
// and reads every result (running b's callbacks). On a pool or connection the batch
// is one implicit transaction: a stale token stops it before the caller's queries
// run, and nothing commits. In a pgx.Tx, the transaction is aborted instead. b is
// not modified.
func (g *Guard) SendBatch(ctx context.Context, db BatchSender, resource string, token uint64, b *pgx.Batch) error {
	if err := validate(resource, token); err != nil {
		return err
	}
	nb := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 1+b.Len())}
	nb.Queue(g.check, args(resource, token)...)
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	return g.Err(db.SendBatch(ctx, nb).Close(), resource, token)
}

// Err translates an error from the check statement: a stale token into a
// *fence.StaleError, a missing table or function into ErrNoTable with the DDL to
// run. Other errors, and nil, are returned as they are.
func (g *Guard) Err(err error, resource string, token uint64) error {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	switch {
	case pe.Code == StaleCode:
		cur, _ := strconv.ParseUint(pe.Detail, 10, 64)
		return &fence.StaleError{Resource: resource, Token: token, Current: cur}
	case pe.Code == "42P01" || (pe.Code == "42883" && strings.Contains(pe.Message, g.table+"_check")):
		return fmt.Errorf("%w: %s (%s): call Guard.Setup once, or run:\n%s", ErrNoTable, g.qtable, pe.Message, g.DDL())
	}
	return err
}
