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
// they are missing). Tables made before the value columns existed get them at
// Open (ALTER TABLE ... ADD COLUMN, which needs the ALTER privilege once; so do
// the handoff columns handed, ttl and nonce; clients of a version before them must
// not share the tables with clients of this one):
//
//	CREATE TABLE dlock_locks (
//	    lock_key   VARBINARY(512) NOT NULL PRIMARY KEY,
//	    owner      VARBINARY(128) NOT NULL,  -- holder, empty when released
//	    value      VARBINARY(4096) NULL,     -- the grant's value (driver.Valuer)
//	    token      BIGINT UNSIGNED NOT NULL, -- fencing token of the last grant
//	    expires_at DATETIME(6) NOT NULL,     -- server clock, UTC: UTC_TIMESTAMP(6) + TTL
//	    queued     TINYINT NOT NULL DEFAULT 0, -- places may be queued
//	    handed     BIGINT UNSIGNED NOT NULL DEFAULT 0 -- id of the last place granted the key
//	) ENGINE=InnoDB;
//	CREATE TABLE dlock_locks_queue (
//	    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, -- line order
//	    lock_key   VARBINARY(512) NOT NULL,
//	    owner      VARBINARY(128) NOT NULL,  -- the waiter
//	    value      VARBINARY(4096) NULL,     -- the value its grant will have
//	    conn       BIGINT UNSIGNED NOT NULL, -- its client's listening connection
//	    ttl        BIGINT UNSIGNED NOT NULL DEFAULT 0, -- its grant's TTL (µs)
//	    nonce      VARBINARY(16) NOT NULL DEFAULT '', -- written by the place's insert
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
// the owner and sets the expiry in the past when no place is queued (the row's
// queued mark), so an uncontended cycle is two statements, like the INSERT +
// DELETE floor; otherwise it hands the key on (see Waiting). Expiry is computed by the server, UTC_TIMESTAMP(6) + TTL,
// so client clocks (and the session time zone) never matter.
//
// The statements with parameters that the hot paths run are prepared once on each
// connection that first runs them (server-side prepared statements, about 15 per
// connection of the pool, counted against the server's max_prepared_stmt_count,
// closed by Close), so that each is one round trip; database/sql would otherwise
// prepare, run and close every one of them (two round trips). A server at that
// limit gets the statement as before (prepared, run and closed).
//
// # Waiting
//
// MySQL has no LISTEN/NOTIFY. Each client keeps one listening connection (opened by
// its first wait, closed by Close) that sleeps in SELECT SLEEP(3600). A refused
// attempt that will wait upserts its place (its owner, that connection's
// CONNECTION_ID(), its grant's TTL and value, a random nonce written by the insert
// alone, and an expiry of its patience) in the queue table; a new place then reads
// the key's row (one read): a row not marked queued is marked and attempted once
// more (a release that came before the place handed the key to no one). A waiting
// Lock of a key this client handed on to a waiter less than 20 ms before queues
// at once, without first making the attempt that would most likely be refused.
//
// A release of a marked row (or of a key this client was just granted through its
// place) is one statement, a multi-table UPDATE, that hands the key directly to the
// first live place after the row's handed mark (driver.Waiter's direct handoff):
// the row becomes that place's grant, with the token plus one, the place's value
// and an expiry of the place's TTL on the server clock, and handed = the place's
// id (places are handed the key in id order, so every place up to that id has had
// its turn and none is handed the key twice); the statement returns that place's
// listening connection through LAST_INSERT_ID, and the releaser ends its sleep with
// KILL QUERY <connection id>. With no live place the row is released and
// unmarked. The woken listener reads the live grants handed to its places (one
// read, no write) and gives each to its waiter, whose next Acquire returns it
// without a statement, with Grant.Age counted from when the place was first
// written (the key was handed after that). The place, which had its turn, is
// deleted in the background, within 100 ms, in one statement with the other
// places of the client that had their turn meanwhile (one commit for them all);
// if its owner queues again on this client first, the new place replaces it
// (REPLACE, a new id at the end of the line), one write where a deletion and an
// insert were two. Until then it is passed over like any place that had its turn. The listener's sleep first checks for grants it has
// not delivered, so a KILL that came between two of its statements is not lost;
// a wake-up lost otherwise (a connection lost) is covered by the core's bounded
// fallback retry, whose attempt claims a grant handed to the caller's own place
// (the place's nonce is this client's), or re-enters it (Request.Reenter).
// Queued waiters' retries renew their place, one write each.
//
// A newcomer does not pass a live place not yet handed the key (FIFO), with one
// gap: two places inserted at once may commit out of id order, and if the later id
// is handed the key first, the earlier one falls behind the row's handed mark and is
// skipped; its next retry places it again at the end of the line (FIFO holds among
// the places committed before each handoff; no place is handed the key twice). A waiter
// that gives up makes its place lapse first (no release hands it the key after
// that), then hands on a grant already handed to its place, whether its Acquire
// returned it or not, and deletes the place. A crashed waiter's place lapses after
// its patience; a key handed to it before that is held for the place's TTL, like
// a crashed holder's grant, and then taken by the next waiter's retry.
//
// KILL QUERY needs no privilege for connections of the same MySQL user (the usual
// case: all clients share a user); for another user's it needs CONNECTION ADMIN or
// SUPER, and without it the wake-up is lost and the waiter falls back to its retry
// timer. Connection ids rise and are not reused (until 2^32 on older servers), so a
// place left by a crashed client names no other session while it lives.
//
// Costs: one connection per client for waiting, whatever the number of waiters (the
// pool's other connections are shared, at most max_conns in all). A handoff is one
// write (the release, which grants the key) and a KILL by the releaser, and one read
// by the woken listener; the waiter's place costs one write to make (and a read of
// the row), and a share of one to delete, off the handoff's path (none when its
// owner queues again first: the new place replaces it).
//
// # Several keys at once
//
// AcquireAll (driver.MultiAcquirer, dlock.Client.LockAll and the like) runs the
// acquire statement of every key in one transaction, in ascending key order, and
// commits only if every key was granted: a refused key rolls back the others (their
// tokens too), so no one ever sees part of a set held. A transaction chosen as a
// deadlock's victim is run again, at most 8 times.
//
// # Values and listing
//
// A grant's value (dlock.WithValue, Proclaim; driver.Valuer) is written by the
// granting statement itself, replaced by a re-entry or SetValue (one UPDATE comparing
// the owner), and cleared by the release; a waiter's place holds the value its grant
// will have.
//
// Queue (driver.Queuer, dlock.Client.Waiters) reads the live places of a key in line
// order, without the place of a waiter that was just granted the key and has not
// deleted its place yet. List (driver.Lister, dlock.Client.List) reads the live rows
// whose key starts with a prefix in one query, a range scan of the primary key, with
// each key's count of live places. Both are reads for administrators, not for a hot
// path.
//
// Not offered (yet): semaphores and read-write locks (a Lock with dlock.WithLimit
// above 1 or dlock.WithShared fails with an error matching dlock.ErrUnsupported,
// changing nothing), and a holder watch (dlock.Client.Observe reads the key every
// WithObserveInterval).
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
	"math/rand/v2"
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
// driver.Notifier, driver.Inspector, driver.ForceReleaser, driver.Valuer,
// driver.MultiAcquirer, driver.Queuer and driver.Lister, and is safe for concurrent
// use.
type Backend struct {
	config
	db       *sql.DB
	own      bool
	closed   atomic.Bool
	q        statements
	stmts    prepared // the hot statements of q, prepared
	lst      *listener
	places   sync.Map       // placeKey -> *place: places this client queued
	hot      sync.Map       // key -> struct{}: granted to a queued place (its release hands the key on at once)
	handedOn sync.Map       // key -> time.Time: when this client last handed the key to a waiter
	dropping sync.Map       // placeKey -> *drop: the deletion of a place that had its turn
	drops    sync.WaitGroup // deletions of places that had their turn, scheduled or under way
	dmu      sync.Mutex
	dq       []*drop     // deletions scheduled, under dmu
	dtimer   *time.Timer // runs them (runDrops), nil if none is scheduled; under dmu
}

var (
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Valuer        = (*Backend)(nil)
)

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
	stmts, err := b.q.prepare(ctx, db)
	if err != nil {
		return nil, err
	}
	b.stmts = stmts
	b.lst = newListener(b)
	return b, nil
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
// no one. A waiting attempt first returns a grant a release handed to its place
// (see the package documentation, Waiting).
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	if req.Wait {
		if tok, nonce, ok := b.lst.takeHanded(req.Key, req.Owner); ok && b.ownPlace(req.Key, req.Owner, nonce) {
			if g, ok := b.handedGrant(req.Key, req.Owner, tok); ok {
				return g, nil
			}
		}
	}
	// The first waiting attempt on a key this client lately handed on queues
	// at once: the attempt would most likely be refused, after waiting for the
	// row's lock.
	var g driver.Grant
	var ok bool
	var err error
	skipped := req.Wait && b.lst.firstAttempt(req.Key, req.Owner) && b.contended(req.Key)
	if !skipped {
		if g, ok, err = b.attempt(ctx, req); err != nil {
			return driver.Grant{}, err
		}
		if !ok && !req.Wait {
			return driver.Grant{}, b.held(ctx, req.Key)
		}
	}
	if !ok {
		fresh, qerr := b.queue(ctx, req)
		if qerr != nil {
			return driver.Grant{}, qerr
		}
		var ws waitState
		g, ws, err = b.refused(ctx, req)
		if !errors.Is(err, driver.ErrLocked) || !fresh || (ws.queued && ws.us > 0 && !(skipped && ws.mine)) {
			return g, err
		}
		// A new place on a row not marked queued: mark it, so that its release
		// hands the key on (a row read as marked after the place was written
		// stays marked while the place is live: it is unmarked only by a
		// handoff that finds no live place). A release that ran before handed
		// the key to no one: attempt again.
		if !ws.queued {
			if _, err := b.exec(ctx, b.q.mark, req.Key); err != nil {
				return driver.Grant{}, b.ctxErr(ctx, err)
			}
		}
		if g, ok, err = b.attempt(ctx, req); err != nil {
			return driver.Grant{}, err
		}
		if !ok {
			return driver.Grant{}, &driver.HeldError{}
		}
	}
	if req.Wait {
		// The grant stands if this fails; the place then lapses after its
		// patience (and had its turn: no release hands it the key).
		b.dropPlaceAsync(req.Key, req.Owner)
	}
	return g, nil
}

// handedGrant returns the grant of token handed to the caller's place, with its
// Age: the key was handed after the insert that made the place (its nonce), sent
// after since.
func (b *Backend) handedGrant(key, owner string, tok uint64) (driver.Grant, bool) {
	v, ok := b.places.Load(placeKey{key, owner})
	if !ok {
		return driver.Grant{}, false
	}
	age := time.Since(v.(*place).since)
	if age <= 0 {
		age = time.Nanosecond
	}
	b.dropPlaceAsync(key, owner)
	return driver.Grant{Token: tok, Age: age}, true
}

// refused reads, for a refused waiting attempt, whether a release handed the key
// to the caller's place (a wake-up lost: the grant is claimed here), whether the
// place has had its turn otherwise (it is then made again at the end of the
// line), and the holder's TTL left.
// The grant is zero and err a HeldError otherwise.
func (b *Backend) refused(ctx context.Context, req driver.Request) (driver.Grant, waitState, error) {
	ws, err := b.waitState(ctx, req.Key, req.Owner)
	if err != nil {
		return driver.Grant{}, ws, b.ctxErr(ctx, err)
	}
	if ws.claim {
		if g, ok := b.handedGrant(req.Key, req.Owner, ws.tok); ok {
			return g, ws, nil
		}
	}
	if ws.consumed {
		if err := b.dropPlace(ctx, req.Key, req.Owner); err != nil {
			return driver.Grant{}, ws, b.ctxErr(ctx, err)
		}
	}
	return driver.Grant{}, ws, &driver.HeldError{RetryAfter: time.Duration(ws.us) * time.Microsecond}
}

// waitState reads the holder's TTL left, whether the key is handed to the
// caller's place made by this client (and its token), and whether that place has
// had its turn.
func (b *Backend) waitState(ctx context.Context, key, owner string) (ws waitState, err error) {
	var handed bool
	var nonce []byte
	err = b.queryRow(ctx, b.q.waitState, owner, owner, owner, key).Scan(&ws.us, &handed, &nonce, &ws.tok, &ws.consumed, &ws.queued, &ws.mine)
	if errors.Is(err, sql.ErrNoRows) {
		return waitState{}, nil
	}
	ws.claim = handed && b.ownPlace(key, owner, nonce)
	return ws, err
}

// waitState is what a waiter reads of its key: the holder's TTL left in
// microseconds (0: free), whether the key is handed to its place (claim, tok),
// whether the place had its turn otherwise, whether the row is marked queued, and
// whether the caller's owner holds the key (mine).
type waitState struct {
	us                     int64
	claim                  bool
	tok                    uint64
	consumed, queued, mine bool
}

// contendedFor is how long after this client handed a key on to a waiter its
// next waiting Lock of the key queues before attempting.
const contendedFor = 20 * time.Millisecond

// contended reports whether this client handed key on to a waiter lately.
func (b *Backend) contended(key string) bool {
	t, ok := b.handedOn.Load(key)
	return ok && time.Since(t.(time.Time)) < contendedFor
}

// ownPlace reports whether nonce is that of the caller's place this client made.
func (b *Backend) ownPlace(key, owner string, nonce []byte) bool {
	v, ok := b.places.Load(placeKey{key, owner})
	return ok && len(nonce) > 0 && string(nonce) == v.(*place).nonce
}

func (b *Backend) attempt(ctx context.Context, req driver.Request) (driver.Grant, bool, error) {
	res, err := b.exec(ctx, b.q.acquire, req.Key, req.Owner, value(req.Value), micros(req.TTL),
		req.Key, req.Owner, req.Key, req.Owner, req.Key, req.Owner, req.Reenter)
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
		err := b.queryRow(ctx, b.q.owned, req.Key, req.Owner).Scan(&tok)
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
	err := b.queryRow(ctx, b.q.heldTTL, key).Scan(&us)
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
	// Zero rows changed: not held, or the same expiry written again within a
	// microsecond.
	return b.updateOwned(ctx, key, owner, b.q.refresh, micros(ttl), key, owner)
}

// updateOwned runs stmt, an UPDATE of the row of key that compares owner and its
// expiry, and returns nil if it changed the row or the row is the owner's live
// grant anyway (the statement wrote what was there), ErrNotHeld otherwise.
func (b *Backend) updateOwned(ctx context.Context, key, owner, stmt string, args ...any) error {
	res, err := b.exec(ctx, stmt, args...)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return b.ctxErr(ctx, err)
	} else if n == 1 {
		return nil
	}
	var tok uint64
	err = b.queryRow(ctx, b.q.owned, key, owner).Scan(&tok)
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
	if _, hot := b.hot.LoadAndDelete(key); !hot {
		res, err := b.exec(ctx, b.q.release, key, owner)
		if err != nil {
			return b.ctxErr(ctx, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return b.ctxErr(ctx, err)
		} else if n == 1 {
			return nil
		}
	}
	// Not held, or places are queued (or were lately): hand the key to the
	// first live place, if any.
	return b.handOn(ctx, b.q.handoff, key, owner)
}

// handOn runs the handoff statement (handoff or force) and wakes the client of the
// place it handed the key to.
func (b *Backend) handOn(ctx context.Context, query string, args ...any) error {
	res, err := b.exec(ctx, query, args...)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return b.ctxErr(ctx, err)
	} else if n == 0 {
		return driver.ErrNotHeld
	}
	conn, _ := res.LastInsertId()
	if conn != 0 {
		b.handedOn.Store(args[0], time.Now())
		b.wake(ctx, uint64(conn))
	} else {
		b.handedOn.Delete(args[0])
	}
	return nil
}

// Inspect implements driver.Inspector; Waiters counts the live queued places.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	var owner, val []byte
	var tok uint64
	var us int64
	var waiters int
	err := b.queryRow(ctx, b.q.inspect, key).Scan(&owner, &val, &tok, &us, &waiters)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, b.ctxErr(ctx, err)
	}
	return driver.Info{Key: key, Owner: string(owner), Token: tok, TTL: time.Duration(us) * time.Microsecond, Waiters: waiters, Value: val}, nil
}

// SetValue implements driver.Valuer: one UPDATE comparing the owner and the expiry.
func (b *Backend) SetValue(ctx context.Context, key, owner string, v []byte) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	// Zero rows changed: not held, or the same value written again.
	return b.updateOwned(ctx, key, owner, b.q.setValue, value(v), key, owner)
}

// value is the column value of a grant's value: NULL for none.
func value(v []byte) any {
	if len(v) == 0 {
		return nil
	}
	return v
}

// ForceRelease implements driver.ForceReleaser.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return b.handOn(ctx, b.q.force, key)
}

// Close implements driver.Backend: when the backend was made by Open, it closes the
// pool. Grants still held stay until they expire.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.lst.close()
	b.flushDrops()
	b.drops.Wait()
	b.stmts.close()
	if b.own {
		return b.db.Close()
	}
	return nil
}

// exec runs one autocommitted statement, again (up to 16 times, after a short
// random pause) if InnoDB chose it as a deadlock's victim (it was then rolled back
// whole, so running it again is safe). The reads
// of the queue table inside the acquire statement take shared locks (REPEATABLE
// READ), which can meet a waiter's upsert of its place.
func (b *Backend) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	for i := 0; ; i++ {
		var res sql.Result
		var err error
		if st := b.stmts[query]; st != nil {
			res, err = st.ExecContext(ctx, args...)
		}
		if st := b.stmts[query]; st == nil || isErr(err, errTooManyPrepared) {
			res, err = b.db.ExecContext(ctx, query, args...)
		}
		if err == nil || i == 16 || !isErr(err, 1213) || ctx.Err() != nil {
			return res, err
		}
		// After a jittered pause that grows, so that the transactions that met
		// do not meet again at once.
		t := time.NewTimer(time.Duration(rand.Int64N(int64(i+1) * int64(time.Millisecond))))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return res, err
		}
	}
}

// errTooManyPrepared is ER_MAX_PREPARED_STMT_COUNT_REACHED: the server holds
// max_prepared_stmt_count prepared statements already.
const errTooManyPrepared = 1461

func isErr(err error, number uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == number
}

// queryRow runs a query of one row, prepared if it is one of the hot statements.
func (b *Backend) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	if st := b.stmts[query]; st != nil {
		if r := st.QueryRowContext(ctx, args...); !isErr(r.Err(), errTooManyPrepared) {
			return r
		}
	}
	return b.db.QueryRowContext(ctx, query, args...)
}
