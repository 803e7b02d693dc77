package mysqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
)

// statements is the SQL the backend sends, written for its table (newStatements).
type statements struct {
	acquire, acquireFast, heldTTL, owned, refresh, release, handoff string
	inspect, force                                                  string
	enqueue, requeue, mark, withdraw, withdrawMany, waitState       string
	grants, sleep, lapse                                            string
	queue, list, setValue                                           string
}

// prepared are the statements of the backend's hot paths, prepared once (on each
// connection of the pool as it first runs them): a statement with parameters is
// then one round trip (COM_STMT_EXECUTE), where database/sql would otherwise
// prepare, execute and close it every time (two round trips and a third packet).
type prepared map[string]*sql.Stmt

// prepare prepares the statements that the hot paths run with parameters (of
// semaphores too when they work). A server that holds max_prepared_stmt_count
// prepared statements already gets none (the backend then sends them as before).
func (b *Backend) prepare(ctx context.Context) (prepared, error) {
	q, sq := &b.q, &b.sq
	p := prepared{}
	all := []string{q.acquire, q.acquireFast, q.heldTTL, q.owned, q.refresh, q.release, q.handoff, q.force,
		q.enqueue, q.requeue, q.mark, q.withdraw, q.waitState, q.lapse, q.setValue}
	if b.semErr == nil {
		all = append(all, sq.lockRow, sq.insertRow, sq.places, sq.grant, sq.putPermit, sq.extend, sq.reenter,
			sq.mutexGrant, sq.updatePlace, sq.newPlace, sq.refresh, sq.owned, sq.setValue, sq.release, sq.isState,
			sq.reset, sq.clearPermits, sq.readGrant, sq.permitGrant, sq.quickRelease)
	}
	for _, s := range all {
		st, err := b.db.PrepareContext(ctx, s)
		if err != nil {
			p.close()
			if isErr(err, errTooManyPrepared) {
				return prepared{}, nil
			}
			return nil, err
		}
		p[s] = st
	}
	return p, nil
}

func (p prepared) close() {
	for _, st := range p {
		st.Close()
	}
}

// What acquireFast's LAST_INSERT_ID says when it refused (affected no row):
// refusedQueued, the row is free but marked queued (the full acquire decides);
// refusedHeld, held by another owner (or by the caller without Reenter), plus 1 if
// the row is marked queued. Tokens are far larger (server microseconds).
const (
	refusedQueued = 1
	refusedHeld   = 2
)

// released is the expiry of a released row: long past.
const released = "1000-01-01 00:00:00"

func newStatements(table string) statements {
	t := "`" + table + "`"
	qt := "`" + table + queueSuffix + "`"
	const now = "UTC_TIMESTAMP(6)"
	// mine is the caller's place (lock_key, owner, nonce): the place this client
	// made. A place of the same owner id made by another client is not the
	// caller's: a grant that counted it as had its turn (handed) would read, to
	// that client's waiter, as a grant handed to its place, and both clients
	// would hold the key (waitState's claim).
	mine := "(SELECT m.id FROM " + qt + " m WHERE m.lock_key = ? AND m.owner = ? AND m.nonce = ?)"
	// handoff releases the row of a key (comparing the owner, or not: ForceRelease)
	// and grants it to the first live place after the last one handed the key, in
	// one statement: the place's owner, value and TTL (on the server clock), a new
	// token, handed = the place's id. LAST_INSERT_ID returns that place's listening
	// connection (0: no live place, the row is released and unmarked). The
	// assignments do not read each other (a multi-table UPDATE does not promise
	// their order).
	handoff := func(where string) string {
		return "UPDATE " + t + " l LEFT JOIN " + qt + " p ON p.id = (SELECT q.id FROM " + qt + " q WHERE q.lock_key = l.lock_key" +
			" AND q.id > l.handed AND q.expires_at > " + now + " ORDER BY q.id LIMIT 1) SET " +
			"l.token = IF(p.id IS NULL, l.token, l.token + 1), " +
			"l.owner = IFNULL(p.owner, ''), l.value = p.value, " +
			"l.expires_at = IF(p.id IS NULL, '" + released + "', " + now + " + INTERVAL p.ttl MICROSECOND), " +
			"l.handed = IFNULL(p.id, l.handed), " +
			"l.queued = (LAST_INSERT_ID(IFNULL(p.conn, 0)) <> 0) " +
			"WHERE l.lock_key = ? AND " + where + "l.expires_at > " + now
	}
	// upsert inserts a new key's row, with a first token of the server time in
	// microseconds, or updates the existing row as the assignments that follow
	// say. Its parameters: key, owner, value, TTL in microseconds.
	upsert := "INSERT INTO " + t + " (lock_key, owner, value, token, expires_at) VALUES (?, ?, ?, " +
		"LAST_INSERT_ID(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000)), " + now + " + INTERVAL ? MICROSECOND) " +
		"ON DUPLICATE KEY UPDATE "
	// reentered: the row is the caller's live grant and the request says Reenter
	// (one parameter) (read before owner is assigned, or once @dlock_free is set).
	reentered := "(? AND owner = VALUES(owner) AND expires_at > " + now + ")"
	// take follows the token's assignment, which sets @dlock_free: the owner, and
	// (@dlock_set: granted, or re-entered) the request's value and expiry. owner
	// is assigned before expires_at, which still holds the old expiry when its own
	// condition is read (assignments run left to right).
	take := "owner = IF(@dlock_free, VALUES(owner), owner), " +
		"value = IF(@dlock_set := (@dlock_free OR " + reentered + "), VALUES(value), value), " +
		"expires_at = IF(@dlock_set, VALUES(expires_at), expires_at)"
	return statements{
		acquire: upsert +
			// @dlock_free: the row is free (released or expired) and no live
			// place of another owner, not yet handed the key, is queued ahead of
			// the caller's (FIFO).
			// A state row (owner '#', see semaphore.go) is never free here.
			"token = LAST_INSERT_ID(IF(@dlock_free := (expires_at <= " + now + " AND owner <> '" + stateOwner + "' AND NOT EXISTS (SELECT 1 FROM " + qt +
			" a WHERE a.lock_key = ? AND a.owner <> ? AND a.expires_at > " + now + " AND a.id > handed" +
			" AND a.id < IFNULL(" + mine + ", 18446744073709551615))), token + 1, token)), " +
			// The caller's place, if any, has had its turn: a release does not
			// hand the key to it again.
			"handed = IF(@dlock_free, GREATEST(handed, IFNULL(" + mine + ", 0)), handed), " + take,
		// acquireFast, for a caller with no place: free only if no place is
		// queued at all (the row's mark), without reading the queue table (each
		// subquery costs about as much as the rest of the statement). Refused,
		// it says why through LAST_INSERT_ID (see refusedHeld); re-entered, it
		// returns the token as acquire does.
		acquireFast: upsert +
			"token = IF(@dlock_free := (expires_at <= " + now + " AND queued = 0), LAST_INSERT_ID(token + 1), " +
			"token + 0 * LAST_INSERT_ID(IF(" + reentered + ", token, IF(expires_at > " + now + ", " +
			strconv.Itoa(refusedHeld) + " + queued, " + strconv.Itoa(refusedQueued) + ")))), " + take,
		heldTTL: "SELECT TIMESTAMPDIFF(MICROSECOND, " + now + ", expires_at) FROM " + t + " WHERE lock_key = ? AND expires_at > " + now,
		owned:   "SELECT token FROM " + t + " WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		refresh: "UPDATE " + t + " SET expires_at = " + now + " + INTERVAL ? MICROSECOND WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		// The plain release is for a row with no place queued; a queued row is
		// left to handoff.
		release: "UPDATE " + t + " SET owner = '', value = NULL, expires_at = '" + released + "' WHERE lock_key = ? AND owner = ? AND expires_at > " + now + " AND queued = 0",
		handoff: handoff("l.owner = ? AND "),
		// force leaves a state row (a semaphore's, see semaphore.go) alone.
		force: handoff("l.owner <> '" + stateOwner + "' AND "),
		inspect: "SELECT owner, value, token, TIMESTAMPDIFF(MICROSECOND, " + now + ", expires_at), " +
			"(SELECT COUNT(*) FROM " + qt + " q WHERE q.lock_key = l.lock_key AND q.expires_at > " + now + " AND q.id > l.handed) FROM " + t + " l WHERE lock_key = ? AND expires_at > " + now,
		// A place's nonce is written by the insert alone: a grant handed to the
		// place is claimed only by the waiter whose insert made it. So is its
		// connection, but by that waiter's renewals (a new listener): another
		// client's waiter of the same owner renewing the place must not take
		// the wake-up of a grant it cannot claim.
		enqueue: "INSERT INTO " + qt + " (lock_key, owner, value, conn, ttl, nonce, expires_at) VALUES (?, ?, ?, ?, ?, ?, " + now + " + INTERVAL ? MICROSECOND) " +
			"ON DUPLICATE KEY UPDATE conn = IF(nonce = VALUES(nonce), VALUES(conn), conn), value = VALUES(value), ttl = VALUES(ttl), expires_at = VALUES(expires_at)",
		// requeue makes a new place where the owner's last place, which had its
		// turn, may still be: REPLACE deletes that one and inserts the new one
		// with a new id (at the end of the line).
		requeue:  "REPLACE INTO " + qt + " (lock_key, owner, value, conn, ttl, nonce, expires_at) VALUES (?, ?, ?, ?, ?, ?, " + now + " + INTERVAL ? MICROSECOND)",
		mark:     "UPDATE " + t + " SET queued = 1 WHERE lock_key = ? AND queued = 0",
		withdraw: "DELETE FROM " + qt + " WHERE lock_key = ? AND owner = ?",
		// withdrawMany is followed by (lock_key = ? AND owner = ?) OR ... for
		// each place (deletePlaces).
		withdrawMany: "DELETE FROM " + qt + " WHERE ",
		// lapse ends a place that gives up: no handoff picks it after this.
		lapse: "UPDATE " + qt + " SET expires_at = '" + released + "' WHERE lock_key = ? AND owner = ?",
		// waitState, for a refused waiting attempt: the holder's TTL left, whether
		// the key was handed to the caller's place on this client's listening
		// connection (and its token), and whether that place has had its turn.
		waitState: "SELECT IF(l.expires_at > " + now + ", TIMESTAMPDIFF(MICROSECOND, " + now + ", l.expires_at), 0), " +
			"IFNULL(l.owner = ? AND l.expires_at > " + now + " AND m.id = l.handed, 0), IFNULL(m.nonce, ''), l.token, IFNULL(m.id <= l.handed, 0), l.queued <> 0, l.owner = ? AND l.expires_at > " + now + ", l.owner = '" + stateOwner + "' " +
			"FROM " + t + " l LEFT JOIN " + qt + " m ON m.lock_key = l.lock_key AND m.owner = ? WHERE l.lock_key = ?",
		// grants: the live grants handed to places of a listening connection.
		// sleep: the listener's wait, unless a grant not yet delivered is
		// there already (handed before the wait began, its KILL lost): 0, or
		// GET_LOCK of a name the client's anchor connection holds, which waits
		// until KILL QUERY ends it (NULL or error 1317), or returns 1 if the
		// anchor is gone. Not SLEEP(): MariaDB's SLEEP waits on one mutex shared
		// by every sleeping session, and a KILL QUERY that finds it taken
		// retries for up to seconds (seen: every KILL taking 1-2 s for minutes
		// under a hot key); a lock wait has a mutex of its own.
		// The places already delivered are a comma-separated list of ids
		// (FIND_IN_SET), so that the statement's text does not change and it
		// is prepared once.
		// The places woken by a semaphore's release (their woken count
		// bumped to an odd number, see semaphore.go) count like grants not yet
		// delivered: "id:woken" not in the list of those already delivered.
		sleep: "SELECT IF(EXISTS(SELECT 1 FROM " + qt + " q JOIN " + t + " l ON l.lock_key = q.lock_key AND l.handed = q.id AND l.owner = q.owner " +
			"WHERE q.conn = ? AND l.expires_at > " + now + " AND FIND_IN_SET(q.id, ?) = 0) OR EXISTS(SELECT 1 FROM " + qt + " w " +
			"WHERE w.conn = ? AND w.woken % 2 = 1 AND FIND_IN_SET(CONCAT(w.id, ':', w.woken), ?) = 0), 0, GET_LOCK(?, 3600))",
		grants: "SELECT q.id, q.lock_key, q.owner, q.nonce, l.token, 0 FROM " + qt + " q JOIN " + t + " l ON l.lock_key = q.lock_key AND l.handed = q.id AND l.owner = q.owner " +
			"WHERE q.conn = ? AND l.expires_at > " + now +
			" UNION ALL SELECT w.id, w.lock_key, w.owner, '', 0, w.woken FROM " + qt + " w WHERE w.conn = ? AND w.woken % 2 = 1",
		setValue: "UPDATE " + t + " SET value = ? WHERE lock_key = ? AND owner = ? AND expires_at > " + now,
		queue: "SELECT q.owner, q.value, TIMESTAMPDIFF(MICROSECOND, " + now + ", q.expires_at), q.shared FROM " + qt + " q WHERE q.lock_key = ? AND q.expires_at > " + now +
			" AND q.id > IFNULL((SELECT l.handed FROM " + t + " l WHERE l.lock_key = q.lock_key), 0) ORDER BY q.id",
		list: "SELECT lock_key, owner, value, token, TIMESTAMPDIFF(MICROSECOND, " + now + ", expires_at), " +
			"(SELECT COUNT(*) FROM " + qt + " q WHERE q.lock_key = l.lock_key AND q.expires_at > " + now + " AND q.id > l.handed) FROM " + t +
			" l WHERE lock_key >= ? AND LEFT(lock_key, ?) = ? AND expires_at > " + now + " ORDER BY lock_key",
	}
}

// ensureSchema creates the tables unless they exist. The existence check comes
// first so that a user without the CREATE privilege can use tables made for it.
func (b *Backend) ensureSchema(ctx context.Context) error {
	t, qt := "`"+b.table+"`", "`"+b.table+queueSuffix+"`"
	_, err1 := b.db.ExecContext(ctx, "SELECT lock_key, owner, value, token, expires_at, queued, handed FROM "+t+" LIMIT 0")
	_, err2 := b.db.ExecContext(ctx, "SELECT id, lock_key, owner, value, conn, ttl, nonce, expires_at, lim, shared, woken FROM "+qt+" LIMIT 0")
	if err1 == nil && err2 == nil {
		b.semErr = b.ensurePermits(ctx)
		return nil
	}
	// Columns added since the first version: tables made before get them here.
	added := [][]string{
		{"value VARBINARY(4096) NULL", "handed BIGINT UNSIGNED NOT NULL DEFAULT 0"},
		{"value VARBINARY(4096) NULL", "ttl BIGINT UNSIGNED NOT NULL DEFAULT 0", "nonce VARBINARY(16) NOT NULL DEFAULT ''",
			"lim INT NOT NULL DEFAULT 0", "shared TINYINT NOT NULL DEFAULT 0", "woken BIGINT UNSIGNED NOT NULL DEFAULT 0"},
	}
	for i, err := range []error{err1, err2} {
		if err != nil && isErr(err, 1054) { // ER_BAD_FIELD_ERROR: a table made before a column
			name := []string{t, qt}[i]
			for _, col := range added[i] {
				_, err = b.db.ExecContext(ctx, "ALTER TABLE "+name+" ADD COLUMN "+col)
				if err != nil && !isErr(err, 1060) { // ER_DUP_FIELDNAME: there already
					return fmt.Errorf("add a column to %s: %w", name, err)
				}
			}
		} else if err != nil && !isErr(err, 1146) { // ER_NO_SUCH_TABLE
			return fmt.Errorf("read table %s: %w", b.table, err)
		}
	}
	for _, ddl := range []string{
		"CREATE TABLE IF NOT EXISTS " + t + " (" +
			"lock_key VARBINARY(512) NOT NULL PRIMARY KEY, " +
			"owner VARBINARY(128) NOT NULL, " +
			"value VARBINARY(4096) NULL, " +
			"token BIGINT UNSIGNED NOT NULL, " +
			"expires_at DATETIME(6) NOT NULL, " +
			"queued TINYINT NOT NULL DEFAULT 0, " +
			"handed BIGINT UNSIGNED NOT NULL DEFAULT 0" +
			") ENGINE=InnoDB",
		"CREATE TABLE IF NOT EXISTS " + qt + " (" +
			"id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, " +
			"lock_key VARBINARY(512) NOT NULL, " +
			"owner VARBINARY(128) NOT NULL, " +
			"value VARBINARY(4096) NULL, " +
			"conn BIGINT UNSIGNED NOT NULL, " +
			"ttl BIGINT UNSIGNED NOT NULL DEFAULT 0, " +
			"nonce VARBINARY(16) NOT NULL DEFAULT '', " +
			"expires_at DATETIME(6) NOT NULL, " +
			"lim INT NOT NULL DEFAULT 0, " +
			"shared TINYINT NOT NULL DEFAULT 0, " +
			"woken BIGINT UNSIGNED NOT NULL DEFAULT 0, " +
			"UNIQUE KEY place (lock_key, owner), KEY conn (conn)" +
			") ENGINE=InnoDB",
	} {
		if _, err := b.db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("create table %s: %w", b.table, err)
		}
	}
	b.semErr = b.ensurePermits(ctx)
	return nil
}

// ensurePermits creates the permit table of semaphores and read-write locks
// unless it exists, and returns why they cannot work when it is missing and
// cannot be made (mutexes work without it).
func (b *Backend) ensurePermits(ctx context.Context) error {
	pt := "`" + b.table + permitSuffix + "`"
	if _, err := b.db.ExecContext(ctx, "SELECT lock_key, owner, token, expires_at, value, shared FROM "+pt+" LIMIT 0"); err == nil {
		return nil
	}
	_, err := b.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+pt+" ("+
		"lock_key VARBINARY(512) NOT NULL, "+
		"owner VARBINARY(128) NOT NULL, "+
		"token BIGINT UNSIGNED NOT NULL, "+
		"expires_at DATETIME(6) NOT NULL, "+
		"value VARBINARY(4096) NULL, "+
		"shared TINYINT NOT NULL DEFAULT 0, "+
		"PRIMARY KEY (lock_key, owner)"+
		") ENGINE=InnoDB")
	if err != nil {
		return fmt.Errorf("semaphores and read-write locks need the permit table %s, which this user could not create: %v", pt, err)
	}
	return nil
}
