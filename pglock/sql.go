package pglock

import "strings"

// The lock table holds one row per key that is held, reserved for a waiter, or that
// has waiters; a key nobody holds or waits for has no row. Each waiter's place in
// the queue is a row of its own, named after the key (see placeRange):
//
//	key || chr(2) || <20-digit place number>
//
// No dlock key contains a control character, so place rows never meet a key's own
// row, and the primary key index keeps a key's places together, in line order.
//
// The key's row:
//
//	owner, token, expires_at  the holder, its fencing token and its expiry (server
//	                          clock); or, when reserved, the queued waiter the free
//	                          lock is handed to and how long it has to take it
//	reserved                  the lock is free but kept for owner, the longest waiter
//	queue_owner               '{}' when no place was queued since the last handoff
//	                          that found none; '{+}' when places may exist
//	queue_channel             when reserved: the LISTEN channel of owner's client
//
// A place row: owner is the waiter, token its patience in µs (how long a
// reservation made for it lasts), expires_at when the place lapses unless the
// waiter's client is alive, queue_channel its client's LISTEN channel. A client
// holds a session-level advisory lock on its listening connection (placeLock), so a
// place whose client still listens is live whatever its expiry: a queued waiter's
// attempts need not renew it (they only read), and a handoff costs the same however
// many wait. A place whose client is gone lapses at its expiry, or at once if the
// expiry is past.
//
// A statement that adds a place locks the key's row (FOR UPDATE) and marks it
// (queue_owner), so the plain DELETE of an uncontended release, which re-checks the
// row it waited for, sees that someone queued. A handoff (release, withdrawal)
// locks the key's row in a first statement and decides in a second, in the same
// transaction: under READ COMMITTED the second statement's snapshot then holds
// every place added before the lock. An attempt that will not wait reads without a
// lock and writes only if the row is still the version it read (xmin unchanged), a
// compare-and-set; an attempt that finds the row changed reports it and runs again.
// Refresh changes only the expiry of a row the caller holds, and needs neither.
type statements struct {
	stamp, fastAcquire, acquireWait, acquireTry, refresh, fastRelease, lockRow, release, forceRelease, withdrawPlace, withdrawOwner, withdraw, inspect string
}

const us = ` * interval '1 microsecond'`

// placeRange selects the place rows p of key $1.
const placeRange = `p.key > $1::text || chr(2) AND p.key < $1::text || chr(3)`

// placeLive holds for a live place p: unexpired, or its client still holds its
// advisory lock (a try that succeeds means no one holds it; the transaction's own
// hold ends at commit).
const placeLive = `(p.expires_at > now() OR NOT pg_try_advisory_xact_lock(('x' || substr(p.queue_channel[1], 7, 16))::bit(64)::bigint))`

// handOff frees the lock of key $1 when cond holds of its row (cur): it reserves it
// for the first live place, deleting that place and the lapsed ones before it, and
// notifies the place's client; or, when no place is live, deletes the row and every
// place. $2 is the releasing owner. It runs after lockRow in the same transaction.
// The result is one row when cond held: (was the grant live, was the row written
// (always), was a waiter notified).
func handOff(cond string) string {
	return `WITH cur AS (
	SELECT r.owner, r.expires_at, r.reserved FROM {T} r WHERE r.key = $1::text
), t0 AS (
	SELECT cur.expires_at > now() AS live FROM cur WHERE ` + cond + `
), h AS MATERIALIZED (
	SELECT p.key AS pk, p.owner AS o, p.queue_channel[1] AS c, p.token AS pat
	FROM {T} p WHERE EXISTS (SELECT FROM t0) AND ` + placeRange + ` AND p.owner <> $2::text AND ` + placeLive + `
	ORDER BY p.key LIMIT 1
), t AS (
	SELECT t0.live, h.pk, h.o, h.c, h.pat FROM t0 LEFT JOIN h ON true
), gone AS (
	DELETE FROM {T} p USING t WHERE ` + placeRange + ` AND (t.pk IS NULL OR p.key <= t.pk) RETURNING 1
), more AS (
	SELECT EXISTS (SELECT FROM {T} p, t WHERE ` + placeRange + ` AND p.key > t.pk) AS yes
), del AS (
	DELETE FROM {T} r USING t WHERE r.key = $1::text AND t.pk IS NULL RETURNING 1
), upd AS (
	UPDATE {T} r SET owner = t.o, reserved = true, expires_at = now() + t.pat` + us + `,
		queue_channel = ARRAY[t.c], queue_owner = CASE WHEN (SELECT yes FROM more) THEN '{+}'::text[] ELSE '{}' END
	FROM t WHERE r.key = $1::text AND t.pk IS NOT NULL RETURNING 1
)
SELECT t.live, EXISTS (SELECT FROM del) OR EXISTS (SELECT FROM upd),
	CASE WHEN t.pk IS NOT NULL THEN pg_notify(t.c, t.o || ' ' || $1::text) IS NOT NULL ELSE false END
FROM t`
}

func buildStatements(table, seq string) statements {
	var s statements
	// $1 key, $2 owner, $3 TTL µs, $4 will wait, $5 the client's channel, $6 patience µs
	// ($7, $8: see acquire below; $9: the request says Reenter, driver.Request).
	// The caller is granted the lock when there is no row; when the row is live and
	// reserved for its owner id, or is its own and $9 holds (re-entry: same token);
	// or when the row expired and no live waiter is queued ahead of it. A live grant
	// of its owner id without $9 (self) is refused and nothing is written: the same
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

	// $7 is the caller's place (its row's key) if it has one, else ''; $8 whether to
	// renew the place's expiry (its client does not hold its advisory lock now).
	acquire := func(lock bool) string {
		cas := ""
		if !lock {
			cas = " AND r.xmin = t.ver"
		}
		clause, addPlace := "", " AND false" // without the row lock, never add a place
		if lock {
			clause, addPlace = " FOR UPDATE", ""
		}
		return `WITH cur AS (
	SELECT r.xmin AS ver, r.owner, r.token, r.expires_at, r.reserved, r.queue_owner
	FROM {T} r WHERE r.key = $1::text` + clause + `
), me AS (
	SELECT p.key AS pk FROM {T} p WHERE p.key = $7::text AND p.owner = $2::text
), bound AS (
	SELECT coalesce((SELECT pk FROM me), $1::text || chr(3)) AS k
), d AS (
	SELECT cur.ver, cur.ver IS NULL AS absent, cur.token AS old_token,
		coalesce(cur.expires_at > now(), false) AS live, cur.expires_at,
		coalesce(cur.owner = $2::text AND cur.expires_at > now() AND NOT cur.reserved, false) AS reenter,
		coalesce(cur.owner = $2::text AND cur.expires_at > now() AND NOT cur.reserved AND NOT $9::boolean, false) AS self,
		coalesce(cur.reserved AND cur.owner <> $2::text AND cur.expires_at > now(), false) AS other_reserved,
		coalesce(cur.queue_owner = '{}', true) AS unmarked,
		CASE WHEN cur.ver IS NULL THEN true
		     WHEN cur.expires_at > now() THEN cur.owner = $2::text AND (cur.reserved OR $9::boolean)
		     ELSE NOT EXISTS (SELECT FROM {T} p, bound WHERE ` + placeRange + ` AND p.key < bound.k AND p.owner <> $2::text AND ` + placeLive + `) END AS granted
	FROM (SELECT) one LEFT JOIN cur ON true
), t AS (
	SELECT d.*, CASE WHEN NOT d.granted THEN NULL WHEN d.reenter THEN d.old_token
	                 WHEN d.absent THEN 0 ELSE nextval(` + literal(seq) + `::regclass) END AS token
	FROM d
), place AS (
	INSERT INTO {T} (key, owner, token, expires_at, queue_channel)
	SELECT $1::text || chr(2) || lpad(nextval(` + literal(seq) + `::regclass)::text, 20, '0'), $2::text, $6::bigint,
		now() + $6::bigint` + us + `, ARRAY[$5::text]
	FROM t WHERE NOT t.granted AND NOT t.absent AND $4::boolean AND NOT t.self AND NOT EXISTS (SELECT FROM me)` + addPlace + `
	RETURNING key
), renew AS (
	UPDATE {T} p SET expires_at = now() + $6::bigint` + us + `, token = $6::bigint
	FROM t WHERE p.key = $7::text AND p.owner = $2::text AND NOT t.granted AND $4::boolean AND NOT t.self AND $8::boolean
	RETURNING 1
), dropped AS (
	DELETE FROM {T} p USING t WHERE p.key = $7::text AND p.owner = $2::text AND t.granted
	RETURNING 1
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
		queue_owner = CASE WHEN t.granted THEN r.queue_owner ELSE '{+}'::text[] END
	FROM t WHERE r.key = $1::text AND NOT t.absent
		AND (t.granted OR $4::boolean AND NOT t.self AND r.queue_owner = '{}')` + cas + `
	RETURNING 1
)
SELECT t.granted, t.absent OR t.granted OR ($4::boolean AND t.unmarked AND NOT t.self),
	EXISTS (SELECT FROM ins) OR EXISTS (SELECT FROM upd), t.token,
	CASE WHEN t.live THEN (extract(epoch FROM t.expires_at - now()) * 1000000)::bigint END,
	t.other_reserved::int + (SELECT count(*) FROM (SELECT FROM {T} p, bound WHERE ` + placeRange + ` AND p.key < bound.k AND p.owner <> $2::text LIMIT 8) a),
	CASE WHEN t.granted THEN '' ELSE coalesce((SELECT key FROM place), (SELECT pk FROM me), '') END
FROM t`
	}
	// A waiting attempt may write (its place), so it locks the row; an attempt that
	// will not wait reads the snapshot and writes only to take the lock.
	s.acquireWait, s.acquireTry = acquire(true), acquire(false)

	s.refresh = `UPDATE {T} SET expires_at = now() + $3::bigint` + us + `
	WHERE key = $1::text AND owner = $2::text AND NOT reserved AND expires_at > now()`

	// Release: the caller's own grant, live or expired (no one else holds it then).
	// Each runs after lockRow, in the same transaction.
	s.lockRow = `SELECT FROM {T} WHERE key = $1::text FOR UPDATE`
	s.release = handOff(`cur.owner = $2::text AND NOT cur.reserved`)
	// Force release: whoever holds it ($2 is '', no owner's place is dropped).
	s.forceRelease = handOff(`NOT cur.reserved`)

	// Withdraw a waiter ($1 key, $2 owner) that gives up: drop its place ($3, or
	// every place of the owner's when $3 is ''), then, if the free lock was reserved
	// for it, hand it to the next live waiter or delete the row.
	s.withdrawPlace = `DELETE FROM {T} p WHERE p.key = $3::text AND p.key > $1::text AND p.owner = $2::text`
	s.withdrawOwner = `DELETE FROM {T} p WHERE ` + placeRange + ` AND p.owner = $2::text AND $3::text = ''`
	s.withdraw = handOff(`cur.reserved AND cur.owner = $2::text`)

	s.inspect = `SELECT owner, token, (extract(epoch FROM expires_at - now()) * 1000000)::bigint,
	(SELECT count(*) FROM {T} p WHERE ` + placeRange + ` AND ` + placeLive + `)
	FROM {T} WHERE key = $1::text AND expires_at > now() AND NOT reserved`

	for _, p := range []*string{&s.stamp, &s.fastAcquire, &s.acquireWait, &s.acquireTry, &s.refresh, &s.fastRelease, &s.lockRow, &s.release, &s.forceRelease, &s.withdrawPlace, &s.withdrawOwner, &s.withdraw, &s.inspect} {
		*p = strings.ReplaceAll(*p, "{T}", table)
	}
	return s
}

// literal quotes s as an SQL string literal. Table names are validated identifiers,
// so this is belt and braces.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
