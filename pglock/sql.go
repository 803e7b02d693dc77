package pglock

import "strings"

// The lock table holds one row per key that is held, reserved for a waiter, or that
// has waiters; a key nobody holds or waits for has no row.
//
//	owner, token, expires_at  the holder, its fencing token and its expiry (server
//	                          clock); or, when reserved, the queued waiter the free
//	                          lock is handed to and how long it has to take it
//	reserved                  the lock is free but kept for owner, the longest waiter
//	queue_owner               waiting owner ids, oldest first
//	queue_channel             the LISTEN channel of each waiter's client
//	queue_expires             when each place lapses unless the waiter tries again
//
// Each statement reads the row, computes the new row in SQL, and writes it. A
// statement that may write locks the row as it reads it (FOR UPDATE): it waits for a
// concurrent writer and reads the version that writer left, which no one can change
// before it commits. (Its UPDATE or DELETE, which scans the statement's snapshot,
// reaches that version through PostgreSQL's re-check of concurrently updated rows.)
// An attempt that will not wait reads without a lock, so a refused attempt writes
// nothing; if it may take the lock, it writes only if the row is still the version it
// read (xmin unchanged), a compare-and-set. A statement that finds the row changed
// (that compare-and-set failed, or a row was inserted after its snapshot) writes
// nothing and reports it, and the caller runs it again. Refresh changes only the
// expiry of a row the caller holds, and needs neither.
type statements struct {
	stamp, fastAcquire, acquireWait, acquireTry, refresh, fastRelease, release, releaseLocked, forceRelease, withdraw, inspect, floorInsert, floorDelete string
}

const us = ` * interval '1 microsecond'`

// queueCols rebuilds the three queue arrays from the relation nq(o, c, e, i).
const queueCols = `queue_owner = (SELECT coalesce(array_agg(nq.o ORDER BY nq.i), '{}') FROM nq),
		queue_channel = (SELECT coalesce(array_agg(nq.c ORDER BY nq.i), '{}') FROM nq),
		queue_expires = (SELECT coalesce(array_agg(nq.e ORDER BY nq.i), '{}') FROM nq)`

// curCTE reads the row of key $1 and its live queue places (q), without owner $2.
// With lock, it locks the row (FOR UPDATE): the statement then waits for a concurrent
// writer of the row and reads the version that writer left, so its own write cannot
// lose the compare-and-set; only an attempt that may not write goes without the lock,
// so that it writes nothing.
func curCTE(lock bool) string {
	clause := ""
	if lock {
		clause = " FOR UPDATE"
	}
	return `cur AS (
	SELECT r.xmin AS ver, r.owner, r.token, r.expires_at, r.reserved, r.queue_owner, r.queue_channel, r.queue_expires
	FROM {T} r WHERE r.key = $1::text` + clause + `
), q AS (
	SELECT u.o, u.c, u.e, u.i
	FROM cur, unnest(cur.queue_owner, cur.queue_channel, cur.queue_expires) WITH ORDINALITY AS u(o, c, e, i)
	WHERE u.e > now() AND u.o <> $2::text
)`
}

// handOff frees the lock of the row t (selected by cond from cur): it reserves it
// for the longest live waiter and notifies that waiter's client, or deletes the row
// when no one waits. $1 key, $2 the owner whose place (if any) is dropped. The result
// is one row when cond held: (was the grant live, was the row written). Without lock,
// it writes only if the row is unchanged since its snapshot.
func handOff(cond string, lock bool) string {
	cas := ""
	if !lock {
		cas = " AND r.xmin = t.ver"
	}
	return `WITH ` + curCTE(lock) + `, h AS (
	SELECT q.o, q.c, q.e FROM q ORDER BY q.i LIMIT 1
), t AS (
	SELECT cur.ver, cur.expires_at > now() AS live, h.o AS ho, h.c AS hc, h.e AS he
	FROM cur LEFT JOIN h ON true WHERE ` + cond + `
), nq AS (
	SELECT q.o, q.c, q.e, q.i FROM q
), del AS (
	DELETE FROM {T} r USING t WHERE r.key = $1::text AND t.ho IS NULL` + cas + ` RETURNING 1
), upd AS (
	UPDATE {T} r SET owner = t.ho, reserved = true, expires_at = t.he,
		` + queueCols + `
	FROM t WHERE r.key = $1::text AND t.ho IS NOT NULL` + cas + ` RETURNING 1
)
SELECT t.live, EXISTS (SELECT FROM del) OR EXISTS (SELECT FROM upd),
	CASE WHEN EXISTS (SELECT FROM upd) THEN pg_notify(t.hc, t.ho || ' ' || $1::text) IS NOT NULL ELSE false END
FROM t`
}

func buildStatements(table, seq string) statements {
	var s statements
	// $1 key, $2 owner, $3 TTL µs, $4 will wait, $5 the client's channel, $6 patience µs,
	// $7 the request says Reenter (driver.Request).
	// The caller is granted the lock when there is no row; when the row is live and
	// reserved for its owner id, or is its own and $7 holds (re-entry: same token);
	// or when the row expired and no live waiter is queued ahead of it. A live grant
	// of its owner id without $7 (self) is refused and nothing is written: the same
	// owner id may be in use by another client or process. Otherwise a waiting caller
	// takes or renews its place in the queue. Result: (granted, must write, wrote, token,
	// µs left on the holder's grant, live places ahead of the caller's: all of them
	// for a caller not yet queued, who goes at the end).
	// The uncontended paths, tried first: they cost what the plainest table lock
	// costs, and write nothing when they do not apply (a row exists; waiters queued).
	// A row inserted for a grant carries the placeholder token 0 until stamp, run
	// right after in the same transaction (one round trip: a pipeline with one
	// Sync), gives it its token. The token must be drawn after the insert got past
	// the unique index: an INSERT computes its values first and may then wait on a
	// concurrent writer of the key, and a token drawn before that wait could be
	// lower than the token of a grant made and released while it waited. A row that
	// exists is locked (or compare-and-set) before its token is drawn, so updates
	// draw it in the statement itself. No one ever sees token 0: the row and its
	// stamp commit together.
	s.stamp = `UPDATE {T} SET token = nextval(` + literal(seq) + `::regclass)
	WHERE key = $1::text AND owner = $2::text AND token = 0 RETURNING token`
	s.fastAcquire = `INSERT INTO {T} (key, owner, token, expires_at)
	VALUES ($1::text, $2::text, 0, now() + $3::bigint` + us + `)
	ON CONFLICT (key) DO NOTHING`
	s.fastRelease = `DELETE FROM {T} WHERE key = $1::text AND owner = $2::text AND NOT reserved AND queue_owner = '{}'
	RETURNING expires_at > now()`

	acquire := func(lock bool) string {
		cas := ""
		if !lock {
			cas = " AND r.xmin = t.ver"
		}
		return `WITH ` + curCTE(lock) + `, me AS (
	SELECT min(u.i) AS i FROM cur, unnest(cur.queue_owner, cur.queue_expires) WITH ORDINALITY AS u(o, e, i)
	WHERE u.o = $2::text AND u.e > now()
), d AS (
	SELECT cur.ver, cur.ver IS NULL AS absent, cur.token AS old_token,
		coalesce(cur.expires_at > now(), false) AS live, cur.expires_at,
		coalesce(cur.owner = $2::text AND cur.expires_at > now() AND NOT cur.reserved, false) AS reenter,
		coalesce(cur.owner = $2::text AND cur.expires_at > now() AND NOT cur.reserved AND NOT $7::boolean, false) AS self,
		CASE WHEN cur.ver IS NULL THEN true
		     WHEN cur.expires_at > now() THEN cur.owner = $2::text AND (cur.reserved OR $7::boolean)
		     ELSE NOT EXISTS (SELECT FROM q WHERE me.i IS NULL OR q.i < me.i) END AS granted
	FROM me LEFT JOIN cur ON true
), t AS (
	SELECT d.*, CASE WHEN NOT d.granted THEN NULL WHEN d.reenter THEN d.old_token
	                 WHEN d.absent THEN 0 ELSE nextval(` + literal(seq) + `::regclass) END AS token
	FROM d
), nq AS (
	SELECT q.o, q.c, q.e, q.i FROM q
	UNION ALL
	SELECT $2::text, $5::text, now() + $6::bigint` + us + `, coalesce(me.i, 9223372036854775807)
	FROM me, t WHERE NOT t.granted AND $4::boolean AND NOT t.self
), ins AS (
	INSERT INTO {T} (key, owner, token, expires_at)
	SELECT $1::text, $2::text, t.token, now() + $3::bigint` + us + ` FROM t WHERE t.absent
	ON CONFLICT (key) DO NOTHING
	RETURNING 1
), upd AS (
	UPDATE {T} r SET
		owner = CASE WHEN t.granted THEN $2::text ELSE r.owner END,
		token = coalesce(t.token, r.token),
		expires_at = CASE WHEN t.granted THEN now() + $3::bigint` + us + ` ELSE r.expires_at END,
		reserved = r.reserved AND NOT t.granted,
		` + queueCols + `
	FROM t WHERE r.key = $1::text AND NOT t.absent AND (t.granted OR $4::boolean AND NOT t.self)` + cas + `
	RETURNING 1
)
SELECT t.granted, t.absent OR t.granted OR $4::boolean AND NOT t.self,
	EXISTS (SELECT FROM ins) OR EXISTS (SELECT FROM upd), t.token,
	CASE WHEN t.live THEN (extract(epoch FROM t.expires_at - now()) * 1000000)::bigint END,
	(SELECT count(*) FROM q, me WHERE me.i IS NULL OR q.i < me.i)
FROM t`
	}
	// A waiting attempt writes (its place) unless granted, so it locks the row; an
	// attempt that will not wait reads the snapshot and writes only to take the lock.
	s.acquireWait, s.acquireTry = acquire(true), acquire(false)

	s.refresh = `UPDATE {T} SET expires_at = now() + $3::bigint` + us + `
	WHERE key = $1::text AND owner = $2::text AND NOT reserved AND expires_at > now()`

	// Release: the caller's own grant, live or expired (no one else holds it then).
	// The first try goes without the row lock (the uncontended release is then a
	// plain DELETE); a try that finds the row changed runs again with it.
	released := `cur.owner = $2::text AND NOT cur.reserved`
	s.release, s.releaseLocked = handOff(released, false), handOff(released, true)
	// Force release: whoever holds it ($2 is '', no owner's place is dropped).
	s.forceRelease = handOff(`NOT cur.reserved`, true)

	// Withdraw a waiter ($1 key, $2 owner) that gives up: drop its place, and if the
	// free lock was reserved for it, hand it to the next live waiter or delete the row.
	s.withdraw = `WITH ` + curCTE(true) + `, h AS (
	SELECT q.o, q.c, q.e FROM q ORDER BY q.i LIMIT 1
), t AS (
	SELECT cur.ver, cur.reserved AND cur.owner = $2::text AS resme, h.o AS ho, h.c AS hc, h.e AS he
	FROM cur LEFT JOIN h ON true
	WHERE (cur.reserved AND cur.owner = $2::text) OR $2::text = ANY (cur.queue_owner)
), nq AS (
	SELECT q.o, q.c, q.e, q.i FROM q
), del AS (
	DELETE FROM {T} r USING t WHERE r.key = $1::text AND t.resme AND t.ho IS NULL RETURNING 1
), upd AS (
	UPDATE {T} r SET
		owner = CASE WHEN t.resme THEN t.ho ELSE r.owner END,
		expires_at = CASE WHEN t.resme THEN t.he ELSE r.expires_at END,
		` + queueCols + `
	FROM t WHERE r.key = $1::text AND NOT (t.resme AND t.ho IS NULL) RETURNING 1
)
SELECT EXISTS (SELECT FROM del) OR EXISTS (SELECT FROM upd),
	CASE WHEN t.resme AND EXISTS (SELECT FROM upd) THEN pg_notify(t.hc, t.ho || ' ' || $1::text) IS NOT NULL ELSE false END
FROM t`

	s.inspect = `SELECT owner, token, (extract(epoch FROM expires_at - now()) * 1000000)::bigint,
	(SELECT count(*) FROM unnest(queue_expires) AS e WHERE e > now())
	FROM {T} WHERE key = $1::text AND expires_at > now() AND NOT reserved`

	s.floorInsert = `INSERT INTO {T} (key, owner, token, expires_at) VALUES ($1::text, $2::text, 0, now() + interval '15 seconds')`
	s.floorDelete = `DELETE FROM {T} WHERE key = $1::text AND owner = $2::text`

	for _, p := range []*string{&s.stamp, &s.fastAcquire, &s.acquireWait, &s.acquireTry, &s.refresh, &s.fastRelease, &s.release, &s.releaseLocked, &s.forceRelease, &s.withdraw, &s.inspect, &s.floorInsert, &s.floorDelete} {
		*p = strings.ReplaceAll(*p, "{T}", table)
	}
	return s
}

// literal quotes s as an SQL string literal. Table names are validated identifiers,
// so this is belt and braces.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
