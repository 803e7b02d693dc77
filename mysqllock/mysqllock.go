// Package mysqllock is the dlock backend for MySQL and MariaDB (URL schemes mysql://
// and mariadb://), on database/sql with the go-sql-driver/mysql driver.
//
//	mysql://user:password@127.0.0.1:3306/app?table=dlock_locks&ttl=10s
//	mysql://user:password@db.example:3306/app?tls=true
//
// Parameters: table (the lock table, default "dlock_locks", in the URL's database;
// lower-case letters, digits and "_"); max_conns (the pool's limit of open
// connections, default 32); these parameters of the Go MySQL driver, under its
// names: tls (true, skip-verify, preferred or false; the default is false),
// timeout, readTimeout, writeTimeout, allowCleartextPasswords, allowNativePasswords,
// allowFallbackToPlaintext, serverPubKey, compress, maxAllowedPacket,
// connectionAttributes, charset, collation; and the core's ttl, renew, drift, owner.
// Any other parameter is an error (the driver would send an unknown name to the
// server as a session variable; some of its own would change how replies read). The
// port defaults to 3306; the password is never printed (errors show the URL with
// it replaced).
//
// # Schema
//
// Open creates the tables if they do not exist (CREATE TABLE IF NOT EXISTS, which
// the server serialises on the table's metadata lock, so that many clients starting
// at once create them once; a client without the CREATE privilege works on tables an
// administrator made, and is refused with an error matching driver.ErrAuth when
// they are missing):
//
//	CREATE TABLE dlock_locks (
//	    lock_key   VARBINARY(512) NOT NULL PRIMARY KEY,
//	    owner      VARBINARY(128) NOT NULL,  -- holder, empty when released
//	    token      BIGINT UNSIGNED NOT NULL, -- fencing token of the last grant
//	    expires_at DATETIME(6) NOT NULL,     -- server clock, UTC: UTC_TIMESTAMP(6) + TTL
//	    queued     TINYINT NOT NULL DEFAULT 0 -- places may be queued
//	) ENGINE=InnoDB;
//	CREATE TABLE dlock_locks_queue (
//	    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, -- line order
//	    lock_key   VARBINARY(512) NOT NULL,
//	    owner      VARBINARY(128) NOT NULL,  -- the waiter
//	    conn       BIGINT UNSIGNED NOT NULL, -- its client's listening connection
//	    expires_at DATETIME(6) NOT NULL,     -- the place lapses: now + patience
//	    UNIQUE KEY place (lock_key, owner), KEY conn (conn)
//	) ENGINE=InnoDB;
//
// Using them needs SELECT, INSERT, UPDATE and DELETE on both tables; waking a waiter
// of another MySQL user needs the CONNECTION ADMIN (MySQL 8) or CONNECTION ADMIN /
// SUPER (MariaDB) privilege (see below). Keys and owners are compared as bytes.
//
// # Algorithm
//
// A key has one row, the lease, from its first grant on: it is kept after a release
// (empty owner, expires_at in the past), so that the row's token is the key's counter.
// Acquire is one statement, INSERT ... ON DUPLICATE KEY UPDATE, run by the server
// under the row's lock: a new key's row is inserted with a first token of the
// server's time in microseconds; an existing row that is free (released or
// expired) and has no live place of another owner queued ahead of the caller's
// (FIFO: a newcomer does not pass a waiter) is taken with its token plus one; the
// caller's own live row is re-entered (same token, TTL extended) only when the
// request says Reenter (driver.Request), and otherwise left as it is; a live row of
// another owner is left as it is. The statement hands the row's token back through
// LAST_INSERT_ID(), which the server returns in the statement's OK reply, and the
// number of affected rows (1 inserted, 2 updated, 0 unchanged) says whether the
// caller was granted: an uncontended acquire is one round trip (a refused one reads
// the holder's remaining TTL in a second, driver.HeldError.RetryAfter). Refresh and
// Release are one UPDATE each, comparing the owner and the expiry; Release clears
// the owner, sets the expiry in the past and returns the queued flag (through
// LAST_INSERT_ID again), so an uncontended cycle is two statements, like the
// INSERT + DELETE floor. Expiry is computed by the server, UTC_TIMESTAMP(6) + TTL,
// so client clocks (and the session time zone) never matter.
//
// # Waiting
//
// MySQL has no LISTEN/NOTIFY. Each client keeps one listening connection (opened by
// its first wait, closed by Close) that sleeps in DO SLEEP(3600). A refused attempt
// that will wait upserts its place (its owner, that connection's CONNECTION_ID()
// and an expiry of its patience) in the queue table, marks the key's row queued,
// and tries once more (a release that came before the place woke no one). A
// release or force release that finds the row marked reads the first live place of
// the key, if the key is still free, and ends that client's sleep with KILL QUERY
// <its connection id>: the listener then reads which of its places are first in
// line for a free key (one query) and wakes those waiters alone, which attempt and
// take the key; with no live place left the row is unmarked. A waiter that gives up
// deletes its place and wakes the next one the same way; a crashed waiter's place
// lapses after its patience (the key stays free, and newcomers refused, until
// then). A wake-up lost (the listener between two sleeps, a connection lost) is
// covered by the core's bounded fallback retry; queued waiters' retries renew their
// place, one write each.
//
// KILL QUERY needs no privilege for connections of the same MySQL user (the usual
// case: all clients share a user); for another user's it needs CONNECTION ADMIN or
// SUPER, and without it the wake-up is lost and the waiter falls back to its retry
// timer. Connection ids rise and are not reused (until 2^32 on older servers), so a
// place left by a crashed client names no other session while it lives.
//
// Costs: one connection per client for waiting, whatever the number of waiters (the
// pool's other connections are shared, at most max_conns in all). A handoff is the
// release, one read and a KILL by the releaser, one read by the woken listener, and
// the waiter's acquire and the deletion of its place.
//
// # Safety model
//
// Mutual exclusion holds on one server (or a primary whose failover promotes a
// replica that had every committed grant: semi-synchronous replication, or
// Galera/InnoDB Cluster, whose certification turns a conflicting grant into a
// failed statement): the row is the lock, a grant is committed (autocommit) before
// it is reported, and expiry uses only the server's clock. The client's local
// validity deadline (TTL minus drift, from when the request was sent) ends before
// the server-side expiry.
//
// Fencing tokens rise strictly for every grant of a key: each grant adds one to the
// token in the row it writes, in the same statement, and lease rows are never
// deleted by this package. They survive a crash or restart as long as commits are durable:
// innodb_flush_log_at_trx_commit=1 (the default; 0 or 2 may lose the last second of
// grants on an operating-system or server crash, and a lost grant's token could be
// issued again). A row deleted by hand is inserted again with the server time in
// microseconds, above its earlier tokens unless the server clock went back.
//
// What is NOT promised: with asynchronous replication, a failover to a replica that
// had not received a grant lets a second holder in and may reissue tokens. A server
// whose clock jumps forward expires grants early. In those cases only fencing (the
// protected resource checking tokens) keeps you safe.
//
// # MySQL and MariaDB
//
// The statements are the same on MySQL 8 and MariaDB 10.11+ (tests run on MariaDB).
// MySQL 8.0.20 and later warn that VALUES() in ON DUPLICATE KEY UPDATE is deprecated
// (it still works; the row alias that replaces it is unknown to MariaDB).
package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dlockio/dlock/driver"
)

// Scheme is the URL scheme of this backend, registered with package driver;
// SchemeAlias ("mariadb") is registered as well.
const (
	Scheme      = "mysql"
	SchemeAlias = "mariadb"
)

func init() {
	for _, s := range []string{Scheme, SchemeAlias} {
		driver.Register(s, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
			return Open(ctx, u)
		})
	}
}

// DefaultTable is the default lock table.
const DefaultTable = "dlock_locks"

// Backend is the MySQL/MariaDB backend. It implements driver.Backend,
// driver.Notifier, driver.Inspector and driver.ForceReleaser, and is safe for
// concurrent use.
type Backend struct {
	config
	db     *sql.DB
	own    bool
	closed atomic.Bool
	q      statements
	lst    *listener
	places sync.Map // driver.Holder-like placeKey -> struct{}: places this client queued
}

var (
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Notifier      = (*Backend)(nil)
)

type statements struct {
	acquire, heldTTL, owned, refresh, release, inspect, force string
	enqueue, mark, withdraw, next, unmark, firsts             string
}

// released is the expiry of a released row: long past.
const released = "1000-01-01 00:00:00"

func newStatements(table string) statements {
	t := "`" + table + "`"
	qt := "`" + table + queueSuffix + "`"
	const now = "UTC_TIMESTAMP(6)"
	return statements{
		acquire: "INSERT INTO " + t + " (lock_key, owner, token, expires_at) VALUES (?, ?, " +
			"LAST_INSERT_ID(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000)), " + now + " + INTERVAL ? MICROSECOND) " +
			"ON DUPLICATE KEY UPDATE " +
			// @dlock_free: the row is free (released or expired) and no live
			// place of another owner is queued ahead of the caller's (FIFO).
			"token = LAST_INSERT_ID(IF(@dlock_free := (expires_at <= " + now + " AND NOT EXISTS (SELECT 1 FROM " + qt +
			" a WHERE a.lock_key = ? AND a.owner <> ? AND a.expires_at > " + now +
			" AND a.id < IFNULL((SELECT m.id FROM " + qt + " m WHERE m.lock_key = ? AND m.owner = ?), 18446744073709551615))), token + 1, token)), " +
			// owner is assigned before expires_at, which still holds the old
			// expiry when its own condition is read (assignments run left to right).
			"owner = IF(@dlock_free, VALUES(owner), owner), " +
			"expires_at = IF(@dlock_free OR (? AND owner = VALUES(owner) AND expires_at > " + now + "), VALUES(expires_at), expires_at)",
		heldTTL: "SELECT TIMESTAMPDIFF(MICROSECOND, " + now + ", expires_at) FROM " + t + " WHERE lock_key = ? AND expires_at > " + now,
		owned:   "SELECT token FROM " + t + " WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		refresh: "UPDATE " + t + " SET expires_at = " + now + " + INTERVAL ? MICROSECOND WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		// The release hands back whether places were queued (queued, through
		// LAST_INSERT_ID), so that only a contended release looks for a waiter.
		release: "UPDATE " + t + " SET owner = '', expires_at = '" + released + "', queued = LAST_INSERT_ID(queued) WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		inspect: "SELECT owner, token, TIMESTAMPDIFF(MICROSECOND, " + now + ", expires_at), " +
			"(SELECT COUNT(*) FROM " + qt + " q WHERE q.lock_key = l.lock_key AND q.expires_at > " + now + ") FROM " + t + " l WHERE lock_key = ? AND expires_at > " + now,
		enqueue: "INSERT INTO " + qt + " (lock_key, owner, conn, expires_at) VALUES (?, ?, ?, " + now + " + INTERVAL ? MICROSECOND) " +
			"ON DUPLICATE KEY UPDATE conn = VALUES(conn), expires_at = VALUES(expires_at)",
		mark:     "UPDATE " + t + " SET queued = 1 WHERE lock_key = ? AND queued = 0",
		withdraw: "DELETE FROM " + qt + " WHERE lock_key = ? AND owner = ?",
		next: "SELECT q.conn FROM " + qt + " q JOIN " + t + " l ON l.lock_key = q.lock_key WHERE q.lock_key = ? AND q.expires_at > " + now +
			" AND l.expires_at <= " + now + " ORDER BY q.id LIMIT 1",
		firsts: "SELECT q.lock_key FROM " + qt + " q JOIN " + t + " l ON l.lock_key = q.lock_key WHERE q.conn = ? AND q.expires_at > " + now +
			" AND l.expires_at <= " + now + " AND NOT EXISTS (SELECT 1 FROM " + qt + " a WHERE a.lock_key = q.lock_key AND a.expires_at > " + now + " AND a.id < q.id)",
		unmark: "UPDATE " + t + " SET queued = 0 WHERE lock_key = ? AND NOT EXISTS (SELECT 1 FROM " + qt + " q WHERE q.lock_key = ? AND q.expires_at > " + now + ")",
		force:  "UPDATE " + t + " SET owner = '', expires_at = '" + released + "', queued = LAST_INSERT_ID(queued) WHERE lock_key = ? AND expires_at > " + now,
	}
}

func newBackend(ctx context.Context, db *sql.DB, opts []Option) (*Backend, error) {
	b := &Backend{db: db, config: config{table: DefaultTable}}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", driver.ErrInvalid)
		}
		if err := o(&b.config); err != nil {
			return nil, err
		}
	}
	if err := b.ensureSchema(ctx); err != nil {
		return nil, err
	}
	b.q = newStatements(b.table)
	b.lst = newListener(b)
	return b, nil
}

// ensureSchema creates the tables unless they exist. The existence check comes
// first so that a user without the CREATE privilege can use tables made for it.
func (b *Backend) ensureSchema(ctx context.Context) error {
	t, qt := "`"+b.table+"`", "`"+b.table+queueSuffix+"`"
	_, err1 := b.db.ExecContext(ctx, "SELECT lock_key, owner, token, expires_at, queued FROM "+t+" LIMIT 0")
	_, err2 := b.db.ExecContext(ctx, "SELECT id, lock_key, owner, conn, expires_at FROM "+qt+" LIMIT 0")
	if err1 == nil && err2 == nil {
		return nil
	}
	for _, err := range []error{err1, err2} {
		if err != nil && !isErr(err, 1146) { // ER_NO_SUCH_TABLE
			return fmt.Errorf("read table %s: %w", b.table, err)
		}
	}
	for _, ddl := range []string{
		"CREATE TABLE IF NOT EXISTS " + t + " (" +
			"lock_key VARBINARY(512) NOT NULL PRIMARY KEY, " +
			"owner VARBINARY(128) NOT NULL, " +
			"token BIGINT UNSIGNED NOT NULL, " +
			"expires_at DATETIME(6) NOT NULL, " +
			"queued TINYINT NOT NULL DEFAULT 0" +
			") ENGINE=InnoDB",
		"CREATE TABLE IF NOT EXISTS " + qt + " (" +
			"id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, " +
			"lock_key VARBINARY(512) NOT NULL, " +
			"owner VARBINARY(128) NOT NULL, " +
			"conn BIGINT UNSIGNED NOT NULL, " +
			"expires_at DATETIME(6) NOT NULL, " +
			"UNIQUE KEY place (lock_key, owner), KEY conn (conn)" +
			") ENGINE=InnoDB",
	} {
		if _, err := b.db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("create table %s: %w", b.table, err)
		}
	}
	return nil
}

// DB returns the connection pool.
func (b *Backend) DB() *sql.DB { return b.db }

// Table returns the lock table's name.
func (b *Backend) Table() string { return b.table }

func micros(d time.Duration) int64 {
	us := d.Microseconds()
	if us < 1 {
		us = 1
	}
	return us
}

// ctxErr makes an error of a request whose context ended wrap the context's error.
func (b *Backend) ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if b.closed.Load() && !errors.Is(err, driver.ErrClosed) {
		return fmt.Errorf("%w: %v", driver.ErrClosed, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("mysqllock: %w (%v)", cerr, err)
	}
	return fmt.Errorf("mysqllock: %w", authErr(err))
}

// Acquire implements driver.Backend: one INSERT ... ON DUPLICATE KEY UPDATE. A
// refused attempt that will wait takes (or renews) its place in the key's queue and
// then tries once more, since a release that ran before the place was there woke
// no one.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	g, ok, err := b.attempt(ctx, req)
	if err == nil && !ok && req.Wait {
		fresh, qerr := b.queue(ctx, req)
		if qerr != nil {
			return driver.Grant{}, qerr
		}
		if fresh {
			g, ok, err = b.attempt(ctx, req)
		}
	}
	if err != nil {
		return driver.Grant{}, err
	}
	if !ok {
		return driver.Grant{}, b.held(ctx, req.Key)
	}
	if req.Wait {
		// The grant stands if this fails; the place then lapses after its
		// patience.
		_ = b.dropPlace(ctx, req.Key, req.Owner)
	}
	return g, nil
}

func (b *Backend) attempt(ctx context.Context, req driver.Request) (driver.Grant, bool, error) {
	res, err := b.exec(ctx, b.q.acquire, req.Key, req.Owner, micros(req.TTL),
		req.Key, req.Owner, req.Key, req.Owner, req.Reenter)
	if err != nil {
		return driver.Grant{}, false, b.ctxErr(ctx, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return driver.Grant{}, false, b.ctxErr(ctx, err)
	}
	if n == 1 || n == 2 {
		tok, err := res.LastInsertId()
		if err != nil {
			return driver.Grant{}, false, b.ctxErr(ctx, err)
		}
		return driver.Grant{Token: uint64(tok)}, true, nil
	}
	if req.Reenter {
		// A re-entry that set the same expiry (within the same microsecond)
		// changed nothing: read whether the row is the caller's.
		var tok uint64
		err := b.db.QueryRowContext(ctx, b.q.owned, req.Key, req.Owner).Scan(&tok)
		if err == nil {
			return driver.Grant{Token: tok}, true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return driver.Grant{}, false, b.ctxErr(ctx, err)
		}
	}
	return driver.Grant{}, false, nil
}

// held returns the HeldError of a refused attempt, with the holder's TTL left.
func (b *Backend) held(ctx context.Context, key string) error {
	var us int64
	err := b.db.QueryRowContext(ctx, b.q.heldTTL, key).Scan(&us)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return b.ctxErr(ctx, err)
	}
	return &driver.HeldError{RetryAfter: time.Duration(us) * time.Microsecond}
}

// Refresh implements driver.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	res, err := b.exec(ctx, b.q.refresh, micros(ttl), key, owner)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return b.ctxErr(ctx, err)
	} else if n == 1 {
		return nil
	}
	// Zero rows: not held, or the same expiry written again within a microsecond.
	var tok uint64
	err = b.db.QueryRowContext(ctx, b.q.owned, key, owner).Scan(&tok)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.ErrNotHeld
	}
	return b.ctxErr(ctx, err)
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	res, err := b.exec(ctx, b.q.release, key, owner)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return b.ctxErr(ctx, err)
	} else if n == 0 {
		return driver.ErrNotHeld
	}
	if queued, _ := res.LastInsertId(); queued != 0 {
		b.wakeNext(ctx, key)
	}
	return nil
}

// Inspect implements driver.Inspector; Waiters counts the live queued places.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	var owner []byte
	var tok uint64
	var us int64
	var waiters int
	err := b.db.QueryRowContext(ctx, b.q.inspect, key).Scan(&owner, &tok, &us, &waiters)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, b.ctxErr(ctx, err)
	}
	return driver.Info{Key: key, Owner: string(owner), Token: tok, TTL: time.Duration(us) * time.Microsecond, Waiters: waiters}, nil
}

// ForceRelease implements driver.ForceReleaser.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	res, err := b.exec(ctx, b.q.force, key)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return b.ctxErr(ctx, err)
	} else if n == 0 {
		return driver.ErrNotHeld
	}
	if queued, _ := res.LastInsertId(); queued != 0 {
		b.wakeNext(ctx, key)
	}
	return nil
}

// Close implements driver.Backend: when the backend was made by Open, it closes the
// pool. Grants still held stay until they expire.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.lst.close()
	if b.own {
		return b.db.Close()
	}
	return nil
}

// exec runs one autocommitted statement, again if InnoDB chose it as a deadlock's
// victim (it was then rolled back whole, so running it again is safe). The reads
// of the queue table inside the acquire statement take shared locks (REPEATABLE
// READ), which can meet a waiter's upsert of its place.
func (b *Backend) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	for i := 0; ; i++ {
		res, err := b.db.ExecContext(ctx, query, args...)
		if err == nil || i == 8 || !isErr(err, 1213) || ctx.Err() != nil {
			return res, err
		}
	}
}

func isErr(err error, number uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == number
}
