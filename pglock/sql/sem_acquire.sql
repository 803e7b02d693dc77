{{/*
sem_acquire is a semaphore attempt by owner $2 on key $1, after sem_lock in the
same transaction (so its snapshot holds every permit and place committed before
the lock). $3 TTL µs, $4 will wait, $5 the client's LISTEN channel, $6 patience
µs, $7 the caller's place (its row's key) if it has one, else '', $8 whether to
renew the place's expiry, $9 the request says Reenter, $10 the request's value
(NULL for none), $11 the limit (> 1; 1 for a read-write key's attempt), $12 the
attempt is shared (a reader; only with limit 1).

The key's row is a semaphore state row (owner '#', token its limit) or a mutex's
row. The key is bound while it has a live grant (a semaphore's live permits, held
or reserved; a mutex's live row) or a live place of another owner; a bound key
of another limit (a mutex: 1) refuses the attempt with nothing written. An
unbound key takes limit $11 (a mutex's dead row becomes a state row, every
leftover permit row goes).

Within the limit: a permit reserved for $2 (handed over by a release) is taken
with a new token; $2's own live permit is re-entered (same token) when $9 holds,
and otherwise refused with nothing written; otherwise $2 is granted when the free
permits (limit minus the other owners' live permits, held or reserved) outnumber
the live places queued ahead of it, or, for a reader ($12), when no place is
queued ahead of it and every other live permit is shared.

Limit 1 makes the key a read-write key: its permits are marked shared (readers)
or not (writers), its places too (reserved, on a place row). A live mutex row
counts as a writer's permit (or a reservation for a writer); an attempt that
queues or is granted on it turns it into a state row of limit 1 and its holder
(or reservation) into a permit row, token, expiry and value kept. A waiting caller that is refused takes (or
renews) its place at the end of the queue, and marks the key's row (a new row
version, so that a mutex's compare-and-set on it fails).

A reader's grant sets the state row's bound two TTLs ahead, so that the readers
after it are granted by the fast read_acquire.sql (which needs the bound to
cover their permits) without writing the state row.

Returns (granted, the key's limit when it differs from $11 (else NULL), token, µs
left on the earliest-expiring other holder's permit when all are taken, live
places ahead of the caller (at most 8 counted), the caller's place or '', NULL
(asyncUnless: a refused attempt commits asynchronously)).
*/ -}}
WITH cur AS (
	SELECT r.owner, r.token, r.expires_at, r.reserved, r.queue_channel, r.value FROM {{.Table}} r WHERE r.key = $1::text
), perm AS (
	SELECT q.owner, q.token, q.expires_at, q.reserved, q.shared FROM {{.Permits}} q, cur
	WHERE q.key = $1::text AND q.expires_at > now() AND cur.owner = '#'
	UNION ALL
	SELECT cur.owner, cur.token, cur.expires_at, cur.reserved, false FROM cur
	WHERE cur.owner <> '#' AND cur.expires_at > now()
), me AS (
	SELECT p.key AS pk FROM {{.Table}} p WHERE p.key = $7::text AND p.owner = $2::text
), bound AS (
	SELECT coalesce((SELECT pk FROM me), $1::text || chr(3)) AS k
), d0 AS (
	SELECT cur.owner = '#' AS sem,
		CASE WHEN cur.owner = '#' THEN cur.token ELSE 1 END AS cur_limit,
		CASE WHEN cur.owner = '#' THEN EXISTS (SELECT FROM perm) ELSE cur.expires_at > now() END
			OR EXISTS (SELECT FROM {{.Table}} p WHERE {{template "placeRange"}} AND p.owner <> $2::text AND {{template "placeLive"}}) AS bound_state,
		(SELECT count(*) FROM perm WHERE perm.owner <> $2::text) AS used,
		EXISTS (SELECT FROM perm WHERE perm.owner <> $2::text AND NOT perm.shared) AS excl,
		(SELECT perm.token FROM perm WHERE perm.owner = $2::text AND NOT perm.reserved) AS own_token,
		EXISTS (SELECT FROM perm WHERE perm.owner = $2::text AND perm.reserved) AS handed,
		(SELECT min(perm.expires_at) FROM perm WHERE perm.owner <> $2::text) AS first_out,
		(SELECT count(*) FROM (SELECT FROM {{.Table}} p, bound WHERE {{template "placeRange"}} AND p.key < bound.k AND p.owner <> $2::text AND {{template "placeLive"}} LIMIT greatest($11::bigint + 1, 8)) a) AS ahead
	FROM cur
), d AS (
	SELECT d0.*, d0.bound_state AND d0.cur_limit <> $11::bigint AS mismatch,
		d0.own_token IS NOT NULL AND NOT $9::boolean AS self
	FROM d0
), g AS (
	SELECT d.*, NOT d.mismatch AND NOT d.self AND (d.handed OR d.own_token IS NOT NULL
		OR CASE WHEN $12::boolean THEN NOT d.excl AND d.ahead = 0 ELSE $11::bigint - d.used > d.ahead END) AS granted
	FROM d
), t AS (
	SELECT g.*, CASE WHEN NOT g.granted THEN NULL WHEN g.own_token IS NOT NULL THEN g.own_token
	                 ELSE nextval({{.Seq}}::regclass) END AS new_token
	FROM g
), tidy AS (
	DELETE FROM {{.Permits}} q USING t WHERE q.key = $1::text AND q.owner <> $2::text AND t.granted
		AND (NOT t.sem OR q.expires_at <= now())
	RETURNING 1
), grant_ AS (
	INSERT INTO {{.Permits}} AS q (key, owner, token, expires_at, value, shared)
	SELECT $1::text, $2::text, t.new_token, now() + $3::bigint{{template "us"}}, $10::bytea, $12::boolean FROM t WHERE t.granted
	ON CONFLICT (key, owner) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at,
		reserved = false, channel = '', value = EXCLUDED.value, shared = EXCLUDED.shared
	RETURNING 1
), dropped AS (
	DELETE FROM {{.Table}} p USING t WHERE p.key = $7::text AND p.owner = $2::text AND t.granted
	RETURNING 1
), place AS (
	INSERT INTO {{.Table}} (key, owner, token, expires_at, queue_channel, reserved, value)
	SELECT $1::text || chr(2) || lpad(nextval({{.Seq}}::regclass)::text, 20, '0'), $2::text, $6::bigint,
		now() + $6::bigint{{template "us"}}, ARRAY[$5::text], $12::boolean, $10::bytea
	FROM t WHERE NOT t.granted AND NOT t.mismatch AND NOT t.self AND $4::boolean AND NOT EXISTS (SELECT FROM me)
	RETURNING key
), renew AS (
	UPDATE {{.Table}} p SET expires_at = now() + $6::bigint{{template "us"}}, token = $6::bigint, value = $10::bytea
	FROM t WHERE p.key = $7::text AND p.owner = $2::text AND NOT t.granted AND NOT t.mismatch AND NOT t.self AND $4::boolean AND $8::boolean
	RETURNING 1
), conv AS (
	INSERT INTO {{.Permits}} AS q (key, owner, token, expires_at, reserved, channel, value, shared)
	SELECT $1::text, cur.owner, CASE WHEN cur.reserved THEN 0 ELSE cur.token END, cur.expires_at, cur.reserved,
		CASE WHEN cur.reserved THEN coalesce(cur.queue_channel[1], '') ELSE '' END, cur.value, false
	FROM cur, t WHERE NOT t.sem AND cur.expires_at > now() AND cur.owner <> $2::text AND (t.granted OR EXISTS (SELECT FROM place))
	ON CONFLICT (key, owner) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at,
		reserved = EXCLUDED.reserved, channel = EXCLUDED.channel, value = EXCLUDED.value, shared = false
	RETURNING 1
), st AS (
	UPDATE {{.Table}} r SET owner = '#', token = $11::bigint, reserved = false, value = NULL, queue_channel = '{}',
		expires_at = CASE WHEN t.granted THEN greatest(CASE WHEN t.sem THEN r.expires_at ELSE '-infinity' END,
			now() + (CASE WHEN $12::boolean THEN 2 ELSE 1 END * $3::bigint){{template "us"}})
		                  ELSE r.expires_at END,
		queue_owner = CASE WHEN t.granted THEN r.queue_owner ELSE '{+}'::text[] END
	FROM t WHERE r.key = $1::text AND (t.granted OR EXISTS (SELECT FROM place))
	RETURNING CASE WHEN t.granted THEN {{template "notify" .}} END
)
SELECT t.granted AND (EXISTS (SELECT FROM grant_) AND EXISTS (SELECT FROM st)),
	CASE WHEN t.mismatch THEN t.cur_limit END,
	t.new_token,
	CASE WHEN t.used >= $11::bigint THEN (extract(epoch FROM t.first_out - now()) * 1000000)::bigint END,
	least(t.ahead, 8),
	CASE WHEN t.granted THEN '' ELSE coalesce((SELECT key FROM place), (SELECT pk FROM me), '') END,
	{{template "asyncUnless" "t.granted"}}
FROM t
