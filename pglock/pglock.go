// Package pglock is the dlock backend for PostgreSQL (URL schemes postgres:// and
// postgresql://), on pgx v5 with a pgxpool connection pool.
//
//	postgres://user:password@db.example:5432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem
//	postgres://user:password@127.0.0.1:5432/app?table=dlock_locks&ttl=10s
//
// Parameters: table (the lock table, default "dlock_locks", optionally
// schema-qualified as "schema.table"; lower-case letters, digits and "_"); every libpq
// connection parameter that pgx understands (host, port, sslmode, sslrootcert, sslcert,
// sslkey, sslpassword, connect_timeout, target_session_attrs, channel_binding, ...);
// pgx's own (default_query_exec_mode, statement_cache_capacity, ...) and pgxpool's
// (pool_max_conns, pool_min_conns, pool_max_conn_lifetime, ...); the server settings
// application_name, search_path, statement_timeout, lock_timeout,
// idle_in_transaction_session_timeout, synchronous_commit and options; and the core's
// ttl, renew, drift, owner. Any other parameter is an error: pgx would send it to the
// server as a session setting, where a typo such as "sslmod=require" could go unnoticed
// or fail far from its cause, so Open rejects it instead. The PG* environment variables
// and ~/.pgpass apply as in libpq. Without sslmode, pgx uses "prefer", which falls back
// to plain text: say sslmode=verify-full for TLS you can rely on.
//
// # Schema
//
// Open creates the table and a sequence if they do not exist, in one transaction under
// a transaction-level advisory lock, so that many clients starting at once create them
// once, and a failure (such as missing privileges) leaves nothing behind:
//
//	CREATE SEQUENCE dlock_locks_token_seq AS bigint START WITH <server time in µs>;
//	CREATE TABLE dlock_locks (
//	    key           text COLLATE "C" PRIMARY KEY,
//	    owner         text NOT NULL,        -- holder (or waiter it is reserved for)
//	    token         bigint NOT NULL,      -- fencing token, from the sequence
//	    expires_at    timestamptz NOT NULL, -- server clock: now() + TTL
//	    reserved      boolean NOT NULL DEFAULT false,        -- free, kept for owner
//	    queue_owner   text[] NOT NULL DEFAULT '{}',          -- '{+}': places may exist
//	    queue_channel text[] NOT NULL DEFAULT '{}',          -- a place's client's channel
//	    queue_expires timestamptz[] NOT NULL DEFAULT '{}'    -- unused (earlier versions)
//	);
//
// Each waiter's place in a key's queue is a row of its own in the same table, under
// the key key || chr(2) || <20-digit place number, drawn from the sequence>: no
// dlock key contains a control character, so these never meet a key's row, and the
// primary key index keeps a key's places together in line order. A place row's owner
// is the waiter, token its patience in µs, expires_at when it lapses (unless its
// client is alive, see below), queue_channel its client's channel. (Versions before
// this layout kept the queue in the arrays of the key's row; clients of both kinds
// on one table still exclude each other, but do not see each other's waiters, who
// then fall back to their retry timer: upgrade them together.)
//
// Privileges: creating them needs CREATE on the schema (or let an administrator run
// the statements above once). Using them needs SELECT, INSERT, UPDATE and DELETE on
// the table and USAGE on the sequence; Open does not attempt DDL when both exist, and
// checks that an existing table has these columns. LISTEN and pg_notify need no
// privilege. The database should use the UTF8 encoding (keys are UTF-8 text). Never
// drop the sequence: it carries the fencing order. (If Open has to create it while the
// table exists, it starts above both the server time in microseconds and the largest
// token in the table, so tokens keep rising.)
//
// # Algorithm
//
// A key has a row while it is held, reserved or waited for. Acquire first tries a
// plain INSERT ... ON CONFLICT DO NOTHING with a new token: a free key costs one
// insert. If a row exists, one statement reads it and decides in SQL: a live row of
// the caller's own is re-entered (same token, TTL extended) when the request says
// Reenter (driver.Request), and otherwise refused with nothing written (another
// process may use the same owner id); a row the lock is reserved for the caller, or
// an expired row with no live waiter queued ahead, is taken with a new token.
// Otherwise a caller that will wait takes its place at the end of the key's queue (a
// place row), locking the key's row and marking it (queue_owner). A waiter already
// queued skips the INSERT, and while its client is alive its later attempts only
// read: they write only to take the lock.
// A token is drawn from the sequence only once the row is the caller's: an update
// draws it after locking (or compare-and-setting) the row, an insert is followed, in
// the same transaction and round trip, by an UPDATE that draws it. (An INSERT
// computes its values before it reaches the unique index, where it may wait while
// another client takes and releases the key; a token drawn before that wait would
// be lower than that client's. The sequence orders draws, so a later grant of the
// key always draws later.)
// Expiry is computed by the server, now() + TTL, so client clocks never matter.
// Refresh is an UPDATE of expires_at that compares the owner and the expiry. A
// refused attempt that will not wait writes nothing.
//
// Release first tries a plain DELETE of the caller's row, unmarked (no place queued).
// Otherwise it locks the row and, in a second statement of the same transaction
// (whose snapshot then holds every place added before the lock), hands the lock on:
// it reserves the free lock for the first live place (for that waiter's patience),
// deletes that place and the lapsed ones before it, and calls pg_notify on that
// waiter's client's channel, inside the same transaction, so the wake-up is sent
// only if the release commits; with no live place, it deletes the row. The first
// place is found through the primary key index: a handoff costs two writes (the
// release and the waiter's taking of its reservation) and one notification to one
// client, O(log N) whatever the number N of waiters; no one barges in ahead of the
// queue (waiting is FIFO), and an uncontended release sends no NOTIFY (which
// serialises committing transactions on a cluster-wide lock). Each Client keeps one
// dedicated connection that LISTENs on the client's own channel while it has waiters
// (and for a minute after, then closes it).
//
// That connection also holds a session-level advisory lock (its key: the first 64
// bits of the channel's random part). A place whose client holds it is live whatever
// its expiry, so a queued waiter need not renew its place: its fallback retries (the
// core's guard against a lost wake-up) are reads. A place whose client is gone (the
// lock is free: a handoff's pg_try_advisory_xact_lock succeeds) lapses at its expiry,
// the patience given by the waiter's last write (4 to 7 seconds with the core's
// defaults); a waiter whose client's listening connection is down renews its place
// on each attempt meanwhile. A notification for a waiter the client no longer has (it
// gave up) passes the lock on at once.
//
// A waiter that gives up withdraws its place and passes a reservation made for it to
// the next waiter, including a place its last attempt's statement may still be
// creating: waiting attempts run to their end even when the caller gives up, and the
// withdrawal comes after. A reservation for a crashed waiter lapses after its
// patience, and the next waiter takes the lock when its own retry comes.
// A wake-up lost to a dropped connection is covered by waking every local waiter once
// the listening connection is back, and by the core's bounded fallback retry. A grant
// that expires rather than being released notifies no one: waiters retry when the
// holder's TTL runs out.
//
// Costs: an uncontended cycle is one INSERT and one DELETE, like the plainest table
// lock. A handoff is two writes and one NOTIFY whatever the number of waiters; the
// NOTIFY travels to one client only, but PostgreSQL (15) signals every listening
// session of the database to look at it, so each client that is waiting adds a little
// server work to every handoff. Queueing is one write per waiter. Waiters' fallback
// retries are reads of the key's row and a few index entries (a refused attempt
// reports up to 8 places ahead, driver.HeldError.Ahead, and the core spaces the
// retries of a waiter further back further apart, 1 to 4 seconds by default), so
// thousands of waiters per key cost reads, not writes. LISTEN needs a session of its
// own: behind a transaction-pooling proxy (PgBouncer in transaction mode) wake-ups are
// lost, advisory locks do not hold, and waiters fall back to their retry timer.
//
// # Safety model
//
// Mutual exclusion holds on one PostgreSQL server (or a primary with synchronous
// replication, where failover promotes a standby that had every committed grant): the
// row is the lock, a grant is committed before it is reported, and expiry uses only the
// server's clock. The client's local validity deadline (TTL minus drift, from when the
// request was sent) ends before the server-side expiry, so a holder that cannot renew
// stops believing it holds the lock before anyone else can take it.
//
// Fencing tokens come from a sequence: strictly larger for every new grant of any key,
// never reused after a crash or restart, as long as commits are durable. Open refuses
// a session with synchronous_commit=off, where a crash could forget a grant and its
// token after the client was told about them.
//
// What is NOT promised: with fsync=off, an operating-system crash can lose grants and
// tokens; with asynchronous replication, a failover to a standby that had not received
// a grant lets a second holder in and may reissue tokens. A server whose clock jumps
// forward expires grants early. In those cases only fencing (the protected resource
// checking tokens) keeps you safe. Rows of crashed holders stay in the table until the
// key is taken again; deleting rows whose expires_at has passed never lets two holders
// in (it only drops the queue of waiters, who take new places on their next attempt).
package pglock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock/driver"
)

func init() {
	for _, s := range []string{"postgres", "postgresql"} {
		driver.Register(s, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
			return Open(ctx, u)
		})
	}
}

// DefaultTable is the default lock table.
const DefaultTable = "dlock_locks"

// DefaultLinger is how long a client keeps its listening connection after its last
// waiter stopped waiting.
const DefaultLinger = time.Minute

// Server settings that may be given as URL parameters; pgx sends them at connection
// start. Every other parameter pgx does not itself understand is rejected.
var allowedSettings = map[string]bool{
	"application_name":                    true,
	"search_path":                         true,
	"statement_timeout":                   true,
	"lock_timeout":                        true,
	"idle_in_transaction_session_timeout": true,
	"synchronous_commit":                  true,
	"options":                             true,
}

// Option configures a Backend.
type Option func(*Backend) error

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// seqSuffix names a table's token sequence: table_token_seq, in the table's schema.
const seqSuffix = "_token_seq"

// WithTable sets the lock table, "table" or "schema.table": lower-case letters, digits
// and underscores, starting with a letter or underscore; the table name at most 48
// bytes (the sequence is named table_token_seq), not ending in "_token_seq" or
// "_pkey", which name the sequence and the primary key index of another table.
// Clients that should contend for the same locks must use the same table; clients
// with different tables never meet.
func WithTable(name string) Option {
	return func(b *Backend) error {
		schema, table, qualified := strings.Cut(name, ".")
		if !qualified {
			schema, table = "", name
		}
		bad := !identRE.MatchString(table) || len(table) > 48 ||
			qualified && (!identRE.MatchString(schema) || len(schema) > 63)
		if bad {
			return fmt.Errorf("%w: table %q must be a lower-case identifier ([a-z_][a-z0-9_]*, at most 48 bytes), optionally schema-qualified", driver.ErrInvalid, name)
		}
		for _, suffix := range []string{seqSuffix, "_pkey"} {
			// Table x_token_seq and the sequence of table x are one relation name,
			// as are table x_pkey and the primary key index of table x.
			if strings.HasSuffix(table, suffix) {
				return fmt.Errorf("%w: table %q ends in %q, which names a relation of table %q", driver.ErrInvalid, name, suffix, strings.TrimSuffix(table, suffix))
			}
		}
		b.table = pgx.Identifier{table}
		b.seq = pgx.Identifier{table + seqSuffix}
		if qualified {
			b.table = pgx.Identifier{schema, table}
			b.seq = pgx.Identifier{schema, table + seqSuffix}
		}
		b.tableName = name
		return nil
	}
}

// WithLinger sets how long a client keeps its listening connection open after its
// last waiter stopped waiting (default one minute).
func WithLinger(d time.Duration) Option {
	return func(b *Backend) error {
		if d <= 0 {
			return fmt.Errorf("%w: linger must be positive, got %v", driver.ErrInvalid, d)
		}
		b.linger = d
		return nil
	}
}

// Backend is the PostgreSQL backend. It implements driver.Backend, driver.Notifier,
// driver.Inspector and driver.ForceReleaser, and
// is safe for concurrent use.
type Backend struct {
	pool      *pgxpool.Pool
	own       bool // close pool in Close
	table     pgx.Identifier
	seq       pgx.Identifier
	tableName string
	channel   string
	linger    time.Duration
	closed    atomic.Bool
	lst       *listener

	sql statements
}

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
)

// Open returns a backend for a postgres:// or postgresql:// URL; see the package
// documentation for its parameters. It connects, checks the session's settings and
// creates the table and sequence if needed, so a wrong password, a missing database
// or missing privileges are reported here.
func Open(ctx context.Context, u *url.URL) (*Backend, error) {
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("%w: pglock: scheme %q is not postgres or postgresql", driver.ErrInvalid, u.Scheme)
	}
	q, err := driver.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("pglock: %w", err)
	}
	p := driver.NewParams(q)
	table, err := p.String("table", DefaultTable)
	if err != nil {
		return nil, fmt.Errorf("pglock: %w", err)
	}
	for k, vs := range q {
		if len(vs) > 1 {
			return nil, fmt.Errorf("%w: pglock: URL parameter %q given %d times", driver.ErrInvalid, k, len(vs))
		}
	}
	rest := driver.Without(u, "table") // keeps the other parameters as written, for pgx
	cfg, err := pgxpool.ParseConfig(rest.String())
	if err != nil {
		return nil, fmt.Errorf("%w: pglock: URL %s: %v", driver.ErrInvalid, driver.Redact(u), parseError(err))
	}
	var unknown []string
	for k := range q {
		if _, setting := cfg.ConnConfig.RuntimeParams[k]; setting && !allowedSettings[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("%w: pglock: unknown URL parameter(s): %s (neither a dlock, pgx nor libpq parameter, nor one of the server settings %s)",
			driver.ErrInvalid, strings.Join(unknown, ", "), strings.Join(sortedKeys(allowedSettings), ", "))
	}
	if sc, ok := cfg.ConnConfig.RuntimeParams["synchronous_commit"]; ok && !durableCommit(sc) {
		return nil, fmt.Errorf("%w: pglock: synchronous_commit=%s could lose grants and reissue fencing tokens after a crash; use on, remote_write, remote_apply or local", driver.ErrInvalid, sc)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "dlock"
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		// libpq waits forever by default; a lock client should not.
		cfg.ConnConfig.ConnectTimeout = driver.DefaultOpenTimeout
	}
	octx, cancel := driver.OpenContext(ctx)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(octx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pglock: connect to %s: %w", driver.Redact(u), authErr(err))
	}
	b, err := newBackend(octx, pool, []Option{WithTable(table)})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("pglock: %s: %w", driver.Redact(u), authErr(err))
	}
	b.own = true
	return b, nil
}

// authErr marks the server refusing the credentials (SQLSTATE class 28) or a
// privilege (42501) with driver.ErrAuth.
func authErr(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "28") || pe.Code == "42501") {
		return fmt.Errorf("%w: %w", driver.ErrAuth, err)
	}
	return err
}

// parseError returns pgx's reason without the connection string it repeats.
func parseError(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if inner := errors.Unwrap(pe); inner != nil {
			return inner.Error()
		}
		// pgx keeps the message private; its Error() redacts the password.
		return "invalid connection parameters: " + err.Error()
	}
	return err.Error()
}

func durableCommit(v string) bool {
	switch strings.ToLower(v) {
	case "on", "true", "yes", "1", "remote_write", "remote_apply", "local":
		return true
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	s := make([]string, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// New returns a backend on an existing pool, which the caller keeps owning (Close does
// not close it). Like Open, it checks the session's settings and creates the table and
// sequence if needed. Waiters listen on a dedicated connection made with the pool's
// connection configuration.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Backend, error) {
	b, err := newBackend(ctx, pool, opts)
	if err != nil {
		return nil, fmt.Errorf("pglock: %w", err)
	}
	return b, nil
}

func newBackend(ctx context.Context, pool *pgxpool.Pool, opts []Option) (*Backend, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pgxpool.Pool", driver.ErrInvalid)
	}
	b := &Backend{pool: pool, linger: DefaultLinger}
	if err := WithTable(DefaultTable)(b); err != nil {
		return nil, err
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", driver.ErrInvalid)
		}
		if err := o(b); err != nil {
			return nil, err
		}
	}
	var id [12]byte
	_, _ = rand.Read(id[:])
	b.channel = "dlock_" + hex.EncodeToString(id[:])
	b.sql = buildStatements(b.table.Sanitize(), b.seq.Sanitize())
	if err := b.ensureSchema(ctx); err != nil {
		return nil, err
	}
	b.lst = newListener(pool.Config().ConnConfig, b.channel, b.linger)
	b.lst.withdraw = b.withdraw
	return b, nil
}

// Pool returns the connection pool.
func (b *Backend) Pool() *pgxpool.Pool { return b.pool }

// Table returns the lock table's name as given ("table" or "schema.table").
func (b *Backend) Table() string { return b.tableName }

// Channel returns the LISTEN/NOTIFY channel on which this client's waiters are woken.
func (b *Backend) Channel() string { return b.channel }

// ensureSchema checks the session's durability setting and creates the table and
// sequence when they are missing.
func (b *Backend) ensureSchema(ctx context.Context) error {
	t, seq := b.table.Sanitize(), b.seq.Sanitize()
	var syncCommit string
	var haveTable, haveSeq bool
	err := b.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		t, seq).Scan(&syncCommit, &haveTable, &haveSeq)
	if err != nil {
		return b.ctxErr(ctx, fmt.Errorf("connect: %w", err))
	}
	if !durableCommit(syncCommit) {
		return fmt.Errorf("the session's synchronous_commit is %q: a crash could lose grants and reissue fencing tokens; add synchronous_commit=on to the URL or fix the role's or server's setting", syncCommit)
	}
	if haveTable && haveSeq {
		return b.checkTable(ctx)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		h := fnv.New64a()
		h.Write([]byte("dlock schema " + t))
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(h.Sum64())); err != nil {
			return err
		}
		// Re-check under the lock: another client may have just created them.
		var haveTable bool
		start := int64(1)
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`, t).Scan(&haveTable, &start); err != nil {
			return err
		}
		if haveTable {
			if err := checkColumns(ctx, tx, t); err != nil {
				return err
			}
			var maxTok *int64
			if err := tx.QueryRow(ctx, `SELECT max(token) FROM `+t).Scan(&maxTok); err != nil {
				return err
			}
			if maxTok != nil && *maxTok >= start {
				start = *maxTok + 1
			}
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE SEQUENCE IF NOT EXISTS %s AS bigint START WITH %d`, seq, start)); err != nil {
			return fmt.Errorf("create sequence %s: %w", seq, err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
	key        text COLLATE "C" PRIMARY KEY,
	owner      text NOT NULL,
	token      bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	reserved   boolean NOT NULL DEFAULT false,
	queue_owner   text[] NOT NULL DEFAULT '{}',
	queue_channel text[] NOT NULL DEFAULT '{}',
	queue_expires timestamptz[] NOT NULL DEFAULT '{}'
)`); err != nil {
			return fmt.Errorf("create table %s: %w", t, err)
		}
		return nil
	})
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			return fmt.Errorf("create the lock table (nothing was created; grant CREATE on the schema, or have an administrator create the table and sequence shown in the pglock documentation): %w", err)
		}
		if errors.Is(err, errNotLockTable) {
			return b.ctxErr(ctx, err)
		}
		return b.ctxErr(ctx, fmt.Errorf("create the lock table: %w", err))
	}
	return b.checkTable(ctx)
}

// checkTable makes sure an existing table has the columns pglock uses.
func (b *Backend) checkTable(ctx context.Context) error {
	return b.ctxErr(ctx, checkColumns(ctx, b.pool, b.table.Sanitize()))
}

var errNotLockTable = errors.New("not usable as a dlock table")

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func checkColumns(ctx context.Context, q querier, table string) error {
	rows, err := q.Query(ctx, `SELECT key, owner, token, expires_at, reserved, queue_owner, queue_channel, queue_expires FROM `+table+` WHERE false`)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		return fmt.Errorf("table %s is %w: %w", table, errNotLockTable, err)
	}
	return nil
}

func micros(d time.Duration) int64 {
	return max(int64((d+time.Microsecond-1)/time.Microsecond), 1)
}

func wrap(op, key string, err error) error {
	return fmt.Errorf("pglock: %s %q: %w", op, key, err)
}

// ctxErr makes sure an error caused by the end of ctx matches ctx.Err().
func (b *Backend) ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return errors.Join(err, ctx.Err())
	}
	return err
}

// retry runs f up to three times while it fails on a broken connection (a pooled
// connection whose server went away, or that was terminated) and ctx lasts. Every
// statement here may run twice for its owner: Acquire re-enters the grant a lost reply
// may have made (same token), Refresh extends again, and a repeated Release finds
// nothing and reports ErrNotHeld, the cautious answer.
func retry(ctx context.Context, f func() error) error {
	err := f()
	for i := 0; i < 2 && err != nil && ctx.Err() == nil && connBroken(err); i++ {
		err = f()
	}
	return err
}

// connBroken reports whether err says the connection failed rather than the statement.
func connBroken(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // a new connection failed (retrying at once will not help), or ctx ended
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// FATAL ends the session; 57P01-57P05: administrator command, crash or
		// idle-session shutdown; class 08: connection exception.
		return pe.Severity == "FATAL" || strings.HasPrefix(pe.Code, "57P") || strings.HasPrefix(pe.Code, "08")
	}
	return !errors.Is(err, pgx.ErrNoRows) // an I/O error on a pooled connection
}

// casAttempts bounds how often a statement that lost a compare-and-set race is run
// again within one call.
const casAttempts = 8

// stamped is a batch of stmt (with args) and the statement that gives a row stmt
// inserted its token (see statements.stamp); pgx runs a batch in one implicit
// transaction and one round trip.
func (b *Backend) stamped(req driver.Request, stmt string, args ...any) *pgx.Batch {
	batch := &pgx.Batch{}
	batch.Queue(stmt, args...)
	batch.Queue(b.sql.stamp, req.Key, req.Owner)
	return batch
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	if req.Wait {
		if w := b.lst.lookup(req.Key, req.Owner); w != nil {
			return w.attempt(ctx, req) // tracked, so that Stop can withdraw what it leaves
		}
	}
	return b.acquire(ctx, req)
}

// acquire is one attempt of Acquire.
func (b *Backend) acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	patience := req.Patience // how long a queued place lasts without another attempt
	if patience <= 0 {
		patience = req.TTL
	}
	place := ""
	if req.Wait {
		place = b.lst.place(req.Key, req.Owner)
	}
	if place == "" {
		// No row: the key is free, and a plain INSERT takes it.
		var token int64
		err := retry(ctx, func() error {
			br := b.pool.SendBatch(ctx, b.stamped(req, b.sql.fastAcquire, req.Key, req.Owner, micros(req.TTL)))
			_, err := br.Exec()
			if err == nil {
				err = br.QueryRow().Scan(&token)
			}
			return errors.Join(err, br.Close())
		})
		if err == nil {
			return driver.Grant{Token: uint64(token)}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return driver.Grant{}, b.ctxErr(ctx, wrap("acquire", req.Key, err))
		}
	}
	// A place whose client holds its advisory lock stays live without renewal: the
	// attempt of a waiter that has one then only reads, unless it takes the lock
	// (compare-and-set), like an attempt that will not wait. An attempt that may
	// add or renew a place locks the row.
	renew := req.Wait && !b.lst.guards(req.Key, req.Owner)
	sql := b.sql.acquireTry
	if req.Wait && (place == "" || renew) {
		sql = b.sql.acquireWait
	}
	for range casAttempts {
		var granted, mustWrite, wrote bool
		var token, left *int64
		var ahead int64
		var newPlace string
		err := retry(ctx, func() error {
			br := b.pool.SendBatch(ctx, b.stamped(req, sql, req.Key, req.Owner, micros(req.TTL), req.Wait, b.channel, micros(patience), place, renew, req.Reenter))
			err := br.QueryRow().Scan(&granted, &mustWrite, &wrote, &token, &left, &ahead, &newPlace)
			if err == nil && granted && wrote && token != nil && *token == 0 {
				err = br.QueryRow().Scan(token) // the row was inserted: its token
			}
			return errors.Join(err, br.Close())
		})
		if err != nil {
			return driver.Grant{}, b.ctxErr(ctx, wrap("acquire", req.Key, err))
		}
		if req.Wait {
			b.lst.setPlace(req.Key, req.Owner, newPlace)
			if place = newPlace; place == "" && !granted && sql != b.sql.acquireWait {
				sql = b.sql.acquireWait // the place lapsed: queue again, with the row lock
				continue
			}
		}
		if mustWrite && !wrote {
			continue // the row changed under us: decide again on the new version
		}
		if granted {
			return driver.Grant{Token: uint64(*token)}, nil
		}
		var after time.Duration
		if left != nil {
			after = time.Duration(max(*left, 1)) * time.Microsecond
		}
		held := &driver.HeldError{RetryAfter: after}
		if req.Wait {
			held.Ahead = int(ahead) // the places still ahead of the caller's (at most 8)
		}
		return driver.Grant{}, held
	}
	return driver.Grant{}, &driver.HeldError{RetryAfter: time.Microsecond}
}

// Refresh implements driver.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = b.pool.Exec(ctx, b.sql.refresh, key, owner, micros(ttl))
		return err
	})
	if err != nil {
		return b.ctxErr(ctx, wrap("refresh", key, err))
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// handOff locks key's row and runs a release-like statement (see the function
// handOff in sql.go), after the statements pre (with args key, owner and extra), in
// one transaction. It returns ErrNotHeld when the grant had expired or the statement
// found nothing to do.
func (b *Backend) handOff(ctx context.Context, op, sql, key, owner string, pre ...string) error {
	var live, wrote, notified bool
	err := retry(ctx, func() error {
		batch := &pgx.Batch{}
		batch.Queue(b.sql.lockRow, key)
		for i := 0; i+1 < len(pre); i += 2 {
			batch.Queue(pre[i], key, owner, pre[i+1])
		}
		batch.Queue(sql, key, owner)
		br := b.pool.SendBatch(ctx, batch)
		var err error
		for range 1 + len(pre)/2 {
			if _, err = br.Exec(); err != nil {
				break
			}
		}
		if err == nil {
			err = br.QueryRow().Scan(&live, &wrote, &notified)
		}
		return errors.Join(err, br.Close())
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.ErrNotHeld
	}
	if err != nil {
		return b.ctxErr(ctx, wrap(op, key, err))
	}
	if !live {
		return driver.ErrNotHeld
	}
	return nil
}

// Release implements driver.Backend. With waiters queued, the lock is reserved for
// the longest-waiting live one and its client is notified; otherwise the row goes.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	// No one waits: a plain DELETE frees the key.
	var live bool
	err := retry(ctx, func() error {
		return b.pool.QueryRow(ctx, b.sql.fastRelease, key, owner).Scan(&live)
	})
	switch {
	case err == nil && live:
		return nil
	case err == nil:
		return driver.ErrNotHeld // it had expired
	case !errors.Is(err, pgx.ErrNoRows):
		return b.ctxErr(ctx, wrap("release", key, err))
	}
	return b.handOff(ctx, "release", b.sql.release, key, owner)
}

// ForceRelease implements driver.ForceReleaser: it frees key whoever holds it, and
// hands it to the longest waiter like Release. The old holder learns at its next
// renewal; its fencing token is below every later grant's.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return b.handOff(ctx, "force release", b.sql.forceRelease, key, "")
}

// withdraw gives up owner's place in key's queue, passing a reservation on.
func (b *Backend) withdraw(ctx context.Context, key, owner string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	place := b.lst.place(key, owner)
	drop := b.sql.withdrawOwner // the place is not known: every place of owner's
	if place != "" {
		drop = b.sql.withdrawPlace
	}
	err := b.handOff(ctx, "withdraw waiter", b.sql.withdraw, key, owner, drop, place)
	if err != nil && !errors.Is(err, driver.ErrNotHeld) {
		return err
	}
	b.lst.setPlace(key, owner, "")
	return nil
}

// Inspect implements driver.Inspector. Waiters counts the live places in the queue.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	var owner string
	var token, left, waiters int64
	err := b.pool.QueryRow(ctx, b.sql.inspect, key).Scan(&owner, &token, &left, &waiters)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, b.ctxErr(ctx, wrap("inspect", key, err))
	}
	return driver.Info{Key: key, Owner: owner, Token: uint64(token), TTL: time.Duration(max(left, 0)) * time.Microsecond, Waiters: int(waiters)}, nil
}

// Watch implements driver.Notifier. The client's listening connection is opened (and
// LISTEN issued) by the first wait, and shared by every later one; Watch returns once
// it listens, so no wake-up after the caller's next attempt can be missed.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	w, err := b.lst.watch(ctx, b, key, owner)
	if err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	return w, nil
}

// Close implements driver.Backend: it closes the listening connection and, when the
// backend was made by Open, the pool. Grants still held stay until they expire.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.lst.close()
	if b.own {
		b.pool.Close()
	}
	return nil
}
