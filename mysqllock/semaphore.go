package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Semaphores and read-write locks (see the package documentation, Semaphores and
// read-write locks). A key with permits has a state row in the lock table: owner
// stateOwner, value its limit in decimal, token the key's sequence, expires_at
// the latest expiry of its live permits, queued stateQueued. Its holders are rows
// of the permit table; its waiters are places in the queue table with their limit
// and kind (lim, shared), woken by a bump of their woken counter.

// permitSuffix names a table's permit table: table_sem.
const permitSuffix = "_sem"

// stateOwner is the owner of a state row (no owner id can be "#").
const stateOwner = "#"

// stateQueued is a state row's queued mark: acquireFast takes a row only when its
// mark is 0, and its refusal of a live state row says refusedHeld + stateQueued.
const stateQueued = 2

// errStateRow: a mutex attempt found the key's row a state row (the semaphore
// path decides). errMutexRow: an exclusive attempt on the semaphore path found a
// plain row (the mutex path decides). Neither leaves the package.
var (
	errStateRow = errors.New("mysqllock: the key's row is a state row")
	errMutexRow = errors.New("mysqllock: the key's row is a mutex's")
	errNoRow    = errors.New("mysqllock: the key has no row")
)

// semStatements is the SQL of semaphores and read-write locks.
type semStatements struct {
	lockRow, insertRow, places, grant, putPermit, extend, reenter            string
	mutexGrant, updatePlace, newPlace, toState, convertHolder, convertPlaces string
	reset, clearPermits, woke, refresh, owned, setValue, release             string
	isState, holders, readGrant, permitGrant, quickRelease                   string
	takenLocked, quickTail                                                   string
}

func newSemStatements(table string) semStatements {
	t := "`" + table + "`"
	qt := "`" + table + queueSuffix + "`"
	pt := "`" + table + permitSuffix + "`"
	const now = "UTC_TIMESTAMP(6)"
	return semStatements{
		lockRow:   "SELECT owner, IFNULL(value, ''), token, expires_at > " + now + ", handed FROM " + t + " WHERE lock_key = ? FOR UPDATE",
		insertRow: "INSERT IGNORE INTO " + t + " (lock_key, owner, token, expires_at) VALUES (?, '', FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000), '" + released + "')",
		// places: every place of the key, with whether it is live and not yet
		// handed the key by a mutex's handoff.
		// and (kind 1) its live permits, oldest first, in one read.
		places: "SELECT 0, id, owner, lim, shared, conn, expires_at > " + now + " AND id > ?, woken % 2, nonce FROM " + qt + " WHERE lock_key = ? " +
			"UNION ALL SELECT 1, token, owner, 0, shared, 0, 1, TIMESTAMPDIFF(MICROSECOND, " + now + ", expires_at), '' FROM " + pt +
			" WHERE lock_key = ? AND expires_at > " + now + " ORDER BY 1, 2",
		// grant makes the row a state row of the given limit (if it is not),
		// takes the next token and keeps the row's expiry at least the new
		// permit's (@dlock_exp, which putPermit writes).
		grant: "UPDATE " + t + " SET token = LAST_INSERT_ID(token + 1), owner = '" + stateOwner + "', value = ?, queued = " + strconv.Itoa(stateQueued) + ", " +
			"expires_at = GREATEST(expires_at, @dlock_exp := " + now + " + INTERVAL ? MICROSECOND) WHERE lock_key = ?",
		putPermit: "INSERT INTO " + pt + " (lock_key, owner, token, expires_at, value, shared) VALUES (?, ?, ?, @dlock_exp, ?, ?) " +
			"ON DUPLICATE KEY UPDATE token = VALUES(token), expires_at = VALUES(expires_at), value = VALUES(value), shared = VALUES(shared)",
		extend: "UPDATE " + t + " SET expires_at = GREATEST(expires_at, @dlock_exp := " + now + " + INTERVAL ? MICROSECOND) WHERE lock_key = ?",
		// reenter renews the caller's permit, and sets its kind (a reader's
		// re-entry as the key's one holder makes it a writer's, and back).
		reenter: "UPDATE " + pt + " SET expires_at = @dlock_exp, value = ?, shared = ? WHERE lock_key = ? AND owner = ?",
		// mutexGrant: a free state row becomes a mutex's grant.
		mutexGrant: "UPDATE " + t + " SET token = LAST_INSERT_ID(token + 1), owner = ?, value = ?, queued = 0, expires_at = " + now + " + INTERVAL ? MICROSECOND WHERE lock_key = ?",
		// updatePlace renews a place its waiter's refused attempt keeps: no
		// longer pending (an even woken count), so the next release that
		// admits it wakes it again.
		updatePlace: "UPDATE " + qt + " SET conn = ?, value = ?, ttl = ?, lim = ?, shared = ?, expires_at = " + now + " + INTERVAL ? MICROSECOND, " +
			"woken = woken + woken % 2 WHERE id = ?",
		newPlace: "REPLACE INTO " + qt + " (lock_key, owner, value, conn, ttl, nonce, expires_at, lim, shared) VALUES (?, ?, ?, ?, ?, ?, " +
			now + " + INTERVAL ? MICROSECOND, ?, ?)",
		// A mutex's row with a reader waiting becomes a state row of limit 1, its
		// holder a writer's permit, its places writers' places.
		toState: "UPDATE " + t + " SET owner = '" + stateOwner + "', value = '1', queued = " + strconv.Itoa(stateQueued) + " WHERE lock_key = ?",
		convertHolder: "INSERT INTO " + pt + " (lock_key, owner, token, expires_at, value, shared) SELECT lock_key, owner, token, expires_at, value, 0 FROM " + t +
			" WHERE lock_key = ? ON DUPLICATE KEY UPDATE token = VALUES(token), expires_at = VALUES(expires_at), value = VALUES(value), shared = 0",
		convertPlaces: "UPDATE " + qt + " SET lim = 1 WHERE lock_key = ? AND lim = 0",
		reset:         "UPDATE " + t + " SET owner = '', value = NULL, expires_at = '" + released + "', queued = 0 WHERE lock_key = ?",
		clearPermits:  "DELETE FROM " + pt + " WHERE lock_key = ?",
		// woke is followed by the ids: (?, ?, ...).
		// woke marks places woken (an odd count, pending) that are not
		// already; it is followed by the ids: (?, ?, ...).
		woke: "UPDATE " + qt + " SET woken = woken + 1 WHERE woken % 2 = 0 AND id IN ",
		// refresh extends a permit and its state row's expiry in one statement.
		refresh: "UPDATE " + t + " l STRAIGHT_JOIN " + pt + " p ON p.lock_key = l.lock_key SET p.expires_at = " + now + " + INTERVAL ? MICROSECOND, " +
			"l.expires_at = GREATEST(l.expires_at, " + now + " + INTERVAL ? MICROSECOND) " +
			"WHERE p.lock_key = ? AND p.owner = ? AND p.expires_at > " + now + " AND l.owner = '" + stateOwner + "'",
		owned:    "SELECT token FROM " + pt + " WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		setValue: "UPDATE " + pt + " SET value = ? WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		release:  "DELETE FROM " + pt + " WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		isState:  "SELECT owner = '" + stateOwner + "' FROM " + t + " WHERE lock_key = ?",
		// readGrant is a reader's grant on a read-write key with no writer's
		// permit, no live place and no permit of the caller's: the next token
		// and the row's expiry bound, in one statement (putPermit follows in
		// the same transaction).
		readGrant: "UPDATE " + t + " l SET l.token = LAST_INSERT_ID(l.token + 1), " +
			"l.expires_at = GREATEST(l.expires_at, @dlock_exp := " + now + " + INTERVAL ? MICROSECOND) " +
			"WHERE l.lock_key = ? AND l.owner = '" + stateOwner + "' AND l.value = '1' " +
			"AND NOT EXISTS (SELECT 1 FROM " + pt + " p WHERE p.lock_key = ? AND p.expires_at > " + now + " AND (p.shared = 0 OR p.owner = ?)) " +
			"AND NOT EXISTS (SELECT 1 FROM " + qt + " q WHERE q.lock_key = ? AND q.expires_at > " + now + " AND q.id > l.handed)",
		// permitGrant is the same for a permit of a semaphore whose limit is
		// the request's, with fewer live permits than the limit.
		permitGrant: "UPDATE " + t + " l SET l.token = LAST_INSERT_ID(l.token + 1), " +
			"l.expires_at = GREATEST(l.expires_at, @dlock_exp := " + now + " + INTERVAL ? MICROSECOND) " +
			"WHERE l.lock_key = ? AND l.owner = '" + stateOwner + "' AND l.value = ? " +
			"AND NOT EXISTS (SELECT 1 FROM " + pt + " p WHERE p.lock_key = ? AND p.owner = ? AND p.expires_at > " + now + ") " +
			"AND (SELECT COUNT(*) FROM " + pt + " p WHERE p.lock_key = ? AND p.expires_at > " + now + ") < ? " +
			"AND NOT EXISTS (SELECT 1 FROM " + qt + " q WHERE q.lock_key = ? AND q.expires_at > " + now + " AND q.id > l.handed)",
		// quickRelease deletes a permit when no place is queued (no one to
		// wake), in one statement. The row keeps its expiry bound (and stays a
		// state row: a free one, to every statement that decides).
		// The row is read (and share-locked) before the permit is locked,
		// as every statement of a key locks them (STRAIGHT_JOIN).
		quickRelease: "DELETE p FROM " + t + " l STRAIGHT_JOIN " + pt + " p ON p.lock_key = l.lock_key " +
			"WHERE p.lock_key = ? AND p.owner = ? AND p.expires_at > " + now + " AND l.owner = '" + stateOwner + "' " +
			"AND NOT EXISTS (SELECT 1 FROM " + qt + " q WHERE q.lock_key = ? AND q.expires_at > " + now + " AND q.id > l.handed)",
		// quickTail follows readGrant or permitGrant in quickBatch's request:
		// the permit, written only if the grant statement changed the row (with
		// the token and expiry it set), the count of permits written, the token,
		// and the commit.
		quickTail: "; INSERT INTO " + pt + " (lock_key, owner, token, expires_at, value, shared) SELECT ?, ?, LAST_INSERT_ID(), @dlock_exp, ?, ? FROM DUAL WHERE ROW_COUNT() = 1 " +
			"ON DUPLICATE KEY UPDATE token = VALUES(token), expires_at = VALUES(expires_at), value = VALUES(value), shared = VALUES(shared); " +
			"SELECT ROW_COUNT(), LAST_INSERT_ID(); COMMIT",
		// takenLocked says whether a key has a live permit or a live place,
		// read with share locks (the latest rows, kept until the commit).
		takenLocked: "(SELECT lock_key FROM " + pt + " WHERE lock_key = ? AND expires_at > " + now + " LIMIT 1 LOCK IN SHARE MODE) " +
			"UNION ALL (SELECT lock_key FROM " + qt + " WHERE lock_key = ? AND expires_at > " + now + " AND id > ? LIMIT 1 LOCK IN SHARE MODE)",
		holders: "SELECT owner, token, TIMESTAMPDIFF(MICROSECOND, " + now + ", expires_at), value, shared FROM " + pt +
			" WHERE lock_key = ? AND expires_at > " + now + " ORDER BY token",
	}
}

// mismatch is the error of an attempt whose limit differs from the key's.
func mismatch(key string, have, want int) error {
	return fmt.Errorf("mysqllock: acquire %q: %w: the key admits %d holders, the attempt asked for %d", key, driver.ErrLimitMismatch, have, max(want, 1))
}

// semRow is a key's row as the semaphore path reads it, locked.
type semRow struct {
	exists, live bool
	owner        string
	limit        int // a state row's
	token        uint64
	handed       uint64
}

func (r semRow) state() bool { return r.exists && r.owner == stateOwner }

type semPlace struct {
	id      uint64
	owner   string
	limit   int
	shared  bool
	conn    uint64
	live    bool // live and not yet handed the key by a mutex's handoff
	pending bool // woken, and its waiter has not attempted since
	nonce   []byte
}

type semPermit struct {
	owner  string
	token  uint64
	shared bool
	us     int64
}

// semState is what a semaphore statement reads of a key under its row's lock.
type semState struct {
	row     semRow
	places  []semPlace // live, in line order
	mine    *semPlace  // the caller's place, live or not
	permits []semPermit
}

// semTx runs fn in a transaction (b.tx), again (up to 16 times) if InnoDB chose it
// as a deadlock's victim or a statement waited longer than the session's lock wait
// timeout (the transaction is rolled back whole either way: see retryable).
func (b *Backend) semTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return retryTx(ctx, func() error { return b.tx(ctx, fn) })
}

// retryTx runs try, again (up to 16 times) while it fails with a retryable error
// and ctx is not done, after a jittered pause that grows, so that the
// transactions that met do not meet again at once.
func retryTx(ctx context.Context, try func() error) error {
	for i := 0; ; i++ {
		err := try()
		if err == nil || i == 16 || !retryable(err) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(time.Duration(rand.Int64N(int64(i+1) * int64(time.Millisecond))))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// txStmt returns the prepared form of query for tx, or nil.
func (b *Backend) txStmt(ctx context.Context, tx *sql.Tx, query string) *sql.Stmt {
	if st := b.stmts[query]; st != nil {
		return tx.StmtContext(ctx, st)
	}
	return nil
}

func (b *Backend) txExec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	if st := b.txStmt(ctx, tx, query); st != nil {
		res, err := st.ExecContext(ctx, args...)
		if !isErr(err, errTooManyPrepared) {
			return res, err
		}
	}
	return tx.ExecContext(ctx, query, args...)
}

func (b *Backend) txQuery(ctx context.Context, tx *sql.Tx, query string, args ...any) (*sql.Rows, error) {
	if st := b.txStmt(ctx, tx, query); st != nil {
		rows, err := st.QueryContext(ctx, args...)
		if !isErr(err, errTooManyPrepared) {
			return rows, err
		}
	}
	return tx.QueryContext(ctx, query, args...)
}

// readState locks key's row and reads its live permits and places. The second
// read is a plain one: under the row's lock no grant can commit while its view is
// taken (see the package documentation, Semaphores and read-write locks).
func (b *Backend) readState(ctx context.Context, tx *sql.Tx, key, owner string) (semState, error) {
	var s semState
	var lim []byte
	rows, err := b.txQuery(ctx, tx, b.sq.lockRow, key)
	if err != nil {
		return s, err
	}
	if rows.Next() {
		s.row.exists = true
		err = rows.Scan(&s.row.owner, &lim, &s.row.token, &s.row.live, &s.row.handed)
	}
	err = driver.Join(err, rows.Err(), rows.Close())
	if err != nil || !s.row.exists {
		return s, err
	}
	if s.row.state() {
		s.row.limit, _ = strconv.Atoi(string(lim))
		s.row.limit = max(s.row.limit, 1)
	}
	rows, err = b.txQuery(ctx, tx, b.sq.places, s.row.handed, key, key)
	if err != nil {
		return s, err
	}
	for rows.Next() {
		var kind int
		var p semPlace
		var us int64
		if err = rows.Scan(&kind, &p.id, &p.owner, &p.limit, &p.shared, &p.conn, &p.live, &us, &p.nonce); err != nil {
			break
		}
		if kind == 1 {
			// The permits of a mutex's row are stale: a state row has them.
			if s.row.state() {
				s.permits = append(s.permits, semPermit{owner: p.owner, token: p.id, shared: p.shared, us: us})
			}
			continue
		}
		p.pending = us == 1
		p.limit = max(p.limit, 1)
		if p.owner == owner {
			s.mine = &p
		}
		if p.live {
			s.places = append(s.places, p)
		}
	}
	return s, driver.Join(err, rows.Err(), rows.Close())
}

// others are the live places of other owners; ahead, those before the caller's
// live place (all of them if it has none).
func (s *semState) others(owner string) (others, ahead []semPlace) {
	mineLive := s.mine != nil && s.mine.live
	for _, p := range s.places {
		if p.owner == owner {
			continue
		}
		others = append(others, p)
		if !mineLive || p.id < s.mine.id {
			ahead = append(ahead, p)
		}
	}
	return others, ahead
}

// wakeSet returns the live places that the key's permits now admit (the first
// free ones of a semaphore; of a read-write key, the first place, a writer, when
// no permit is left, or the leading run of readers when no writer holds).
func (s *semState) wakeSet() []semPlace {
	if len(s.places) == 0 {
		return nil
	}
	if s.row.limit > 1 {
		return s.places[:max(0, min(len(s.places), s.row.limit-len(s.permits)))]
	}
	for _, p := range s.permits {
		if !p.shared {
			return nil
		}
	}
	if !s.places[0].shared {
		if len(s.permits) == 0 {
			return s.places[:1]
		}
		return nil
	}
	n := 0
	for n < len(s.places) && s.places[n].shared {
		n++
	}
	return s.places[:n]
}

// semOutcome is what a semaphore attempt decided.
type semOutcome struct {
	granted bool
	mutex   bool          // granted as a mutex's grant (a free state row taken by a plain attempt)
	age     time.Duration // of a grant handed to the caller's place: since the place was written
	token   uint64
	placed  bool // refused and queued
	ahead   int
	retry   time.Duration
	wake    []semPlace // places to wake after the commit
	mis     error      // the request's limit is not the key's (nothing written)
}

// semAcquire is one attempt at a permit of req.Key (req.Limit > 1), a reader's
// grant (req.Shared) or a writer's grant of a key whose row is a state row.
func (b *Backend) semAcquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.semErr != nil {
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire %q: %w: %v", req.Key, driver.ErrUnsupported, b.semErr)
	}
	limit := max(req.Limit, 1)
	var conn uint64
	if req.Wait {
		id, err := b.lst.ensure(ctx)
		if err != nil {
			return driver.Grant{}, b.ctxErr(ctx, err)
		}
		conn = id
	}
	pk := placeKey{req.Key, req.Owner}
	if _, placed := b.places.Load(pk); !placed && (req.Shared || limit > 1) {
		tok, ok, err := b.quickAcquire(ctx, req, limit)
		if err != nil {
			return driver.Grant{}, b.ctxErr(ctx, err)
		}
		if ok {
			b.grants.Remember(req.Key, req.Owner, req.Shared)
			return driver.Grant{Token: tok}, nil
		}
	}
	var out semOutcome
	err := b.semTx(ctx, func(tx *sql.Tx) (err error) {
		out, err = b.semAttempt(ctx, tx, req, limit, conn)
		return err
	})
	if errors.Is(err, errNoRow) {
		// A new key: its row is made first, released, on its own (a locking
		// read of a missing row locks a gap, and many attempts inserting into
		// it at once deadlock), and the attempt runs again.
		if _, err = b.exec(ctx, b.sq.insertRow, req.Key); err == nil {
			err = b.semTx(ctx, func(tx *sql.Tx) (err error) {
				out, err = b.semAttempt(ctx, tx, req, limit, conn)
				return err
			})
		}
	}
	if err != nil {
		if errors.Is(err, errMutexRow) {
			return driver.Grant{}, err
		}
		return driver.Grant{}, b.ctxErr(ctx, err)
	}
	b.wakePlaces(ctx, out.wake)
	if out.mis != nil {
		return driver.Grant{}, out.mis
	}
	if out.granted {
		b.places.Delete(pk)
		if !out.mutex {
			b.grants.Remember(req.Key, req.Owner, req.Shared)
		}
		return driver.Grant{Token: out.token, Age: out.age}, nil
	}
	held := &driver.HeldError{RetryAfter: out.retry}
	if out.placed {
		held.Queued, held.Ahead = true, out.ahead
	}
	return driver.Grant{}, held
}

// semAttempt decides an attempt under the key's row lock (see semAcquire).
func (b *Backend) semAttempt(ctx context.Context, tx *sql.Tx, req driver.Request, limit int, conn uint64) (out semOutcome, err error) {
	exclusive := limit == 1 && !req.Shared
	s, err := b.readState(ctx, tx, req.Key, req.Owner)
	if err != nil {
		return out, err
	}
	ttl := micros(req.TTL)
	lim := strconv.Itoa(limit)
	if !s.row.exists {
		if exclusive {
			return out, errMutexRow
		}
		return out, errNoRow
	}
	others, ahead := s.others(req.Owner)
	if !s.row.state() {
		if exclusive {
			return out, errMutexRow
		}
		if s.row.live || len(ahead) > 0 {
			if limit > 1 {
				return semOutcome{mis: mismatch(req.Key, 1, limit)}, nil
			}
			// A reader behind a mutex's holder or its waiters: the key becomes a
			// read-write key (a state row, the holder a writer's permit) when the
			// reader waits.
			if !req.Wait {
				return semOutcome{retry: b.rowTTL(s)}, nil
			}
			if s.row.live {
				if _, err := b.txExec(ctx, tx, b.sq.convertHolder, req.Key); err != nil {
					return out, err
				}
				s.permits = append(s.permits, semPermit{owner: s.row.owner, token: s.row.token})
			}
			for _, q := range []string{b.sq.toState, b.sq.convertPlaces} {
				if _, err := b.txExec(ctx, tx, q, req.Key); err != nil {
					return out, err
				}
			}
			s.row.owner, s.row.limit = stateOwner, 1
			if out, err = b.semPlace(ctx, tx, req, s, limit, conn, len(ahead)); err != nil {
				return out, err
			}
			out.wake = notPending(s.wakeSet())
			return out, b.bump(ctx, tx, out.wake)
		}
		return b.semTake(ctx, tx, req, s, lim, ttl)
	}
	if len(s.permits) == 0 && len(others) == 0 {
		// Free: the attempt sets the key's limit.
		if exclusive {
			res, err := b.txExec(ctx, tx, b.sq.mutexGrant, req.Owner, value(req.Value), ttl, req.Key)
			if err == nil {
				_, err = b.txExec(ctx, tx, b.sq.clearPermits, req.Key)
			}
			if err == nil && s.mine != nil {
				_, err = b.txExec(ctx, tx, b.q.withdraw, req.Key, req.Owner)
			}
			if err != nil {
				return out, err
			}
			tok, _ := res.LastInsertId()
			return semOutcome{granted: true, mutex: true, token: uint64(tok)}, nil
		}
		return b.semTake(ctx, tx, req, s, lim, ttl)
	}
	if s.row.limit != limit {
		return semOutcome{mis: mismatch(req.Key, s.row.limit, limit)}, nil
	}
	writer := false
	for _, p := range s.permits {
		if p.owner == req.Owner {
			// A writer's permit that a mutex's handoff gave this client's place
			// (made a writer's by a reader since, so the mutex path no longer
			// finds it): claimed, as the mutex path claims a handed grant.
			// Its TTL started at the handoff, after the place was written:
			// the grant's Age is the place's.
			var since time.Time
			if v, ok := b.places.Load(placeKey{req.Key, req.Owner}); ok && exclusive && !p.shared && req.Wait &&
				s.mine != nil && s.mine.id == s.row.handed && len(s.mine.nonce) > 0 && string(s.mine.nonce) == v.(*place).nonce {
				since = v.(*place).since
			}
			if !req.Reenter && since.IsZero() {
				return semOutcome{retry: time.Duration(p.us) * time.Microsecond}, nil
			}
			if !since.IsZero() {
				if _, err := b.txExec(ctx, tx, b.q.withdraw, req.Key, req.Owner); err != nil {
					return out, err
				}
				return semOutcome{granted: true, token: p.token, age: max(time.Since(since), time.Nanosecond)}, nil
			}
			// A reader's re-entry as a writer is granted only to the key's one
			// holder: a writer is never beside anyone.
			if exclusive && p.shared && len(s.permits) > 1 {
				return semOutcome{retry: b.rowTTL(s)}, nil
			}
			_, err := b.txExec(ctx, tx, b.sq.extend, ttl, req.Key)
			if err == nil {
				_, err = b.txExec(ctx, tx, b.sq.reenter, value(req.Value), req.Shared, req.Key, req.Owner)
			}
			return semOutcome{granted: true, token: p.token}, err
		}
		writer = writer || !p.shared
	}
	var ok bool
	switch {
	case limit > 1:
		ok = len(s.permits)+len(ahead) < limit
	case req.Shared:
		ok = !writer
		for _, p := range ahead {
			ok = ok && p.shared
		}
	default:
		ok = len(s.permits) == 0 && len(ahead) == 0
	}
	if ok {
		res, err := b.txExec(ctx, tx, b.sq.grant, lim, ttl, req.Key)
		if err != nil {
			return out, err
		}
		tok, _ := res.LastInsertId()
		return b.semGrant(ctx, tx, req, s, uint64(tok))
	}
	if !req.Wait {
		return semOutcome{retry: b.rowTTL(s)}, nil
	}
	out, err = b.semPlace(ctx, tx, req, s, limit, conn, len(ahead))
	return out, err
}

// semTake takes a free row for the request's limit: the row becomes a state row
// with the next token, and stale permits go.
func (b *Backend) semTake(ctx context.Context, tx *sql.Tx, req driver.Request, s semState, lim string, ttl int64) (semOutcome, error) {
	res, err := b.txExec(ctx, tx, b.sq.grant, lim, ttl, req.Key)
	if err != nil {
		return semOutcome{}, err
	}
	tok, _ := res.LastInsertId()
	if _, err := b.txExec(ctx, tx, b.sq.clearPermits, req.Key); err != nil {
		return semOutcome{}, err
	}
	return b.semGrant(ctx, tx, req, s, uint64(tok))
}

// semGrant writes the caller's permit of token (the row's expiry and token are
// written) and deletes its place.
func (b *Backend) semGrant(ctx context.Context, tx *sql.Tx, req driver.Request, s semState, tok uint64) (semOutcome, error) {
	if _, err := b.txExec(ctx, tx, b.sq.putPermit, req.Key, req.Owner, tok, value(req.Value), req.Shared); err != nil {
		return semOutcome{}, err
	}
	if s.mine != nil {
		if _, err := b.txExec(ctx, tx, b.q.withdraw, req.Key, req.Owner); err != nil {
			return semOutcome{}, err
		}
	}
	return semOutcome{granted: true, token: tok}, nil
}

// rowTTL is the time until the first live permit expires (the holder's TTL for
// a mutex's row), an estimate of when a refused attempt may pass.
func (b *Backend) rowTTL(s semState) time.Duration {
	var us int64
	for _, p := range s.permits {
		if us == 0 || p.us < us {
			us = p.us
		}
	}
	return time.Duration(us) * time.Microsecond
}

// semPlace makes or renews the caller's place at the end of the line.
func (b *Backend) semPlace(ctx context.Context, tx *sql.Tx, req driver.Request, s semState, limit int, conn uint64, ahead int) (semOutcome, error) {
	patience := micros(req.Patience)
	if req.Patience <= 0 {
		patience = micros(req.TTL)
	}
	pk := placeKey{req.Key, req.Owner}
	var err error
	if s.mine != nil && s.mine.live {
		_, err = b.txExec(ctx, tx, b.sq.updatePlace, conn, value(req.Value), micros(req.TTL), limit, req.Shared, patience, s.mine.id)
		if _, ok := b.places.Load(pk); !ok {
			b.places.Store(pk, newPlace())
		}
	} else {
		b.settleDrop(pk)
		p := newPlace()
		b.places.Store(pk, p)
		_, err = b.txExec(ctx, tx, b.sq.newPlace, req.Key, req.Owner, value(req.Value), conn, micros(req.TTL), []byte(p.nonce), patience, limit, req.Shared)
	}
	if v, ok := b.places.Load(pk); ok {
		v.(*place).sem.Store(true)
	}
	return semOutcome{placed: true, ahead: ahead, retry: b.rowTTL(s)}, err
}
