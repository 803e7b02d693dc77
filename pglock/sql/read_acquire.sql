{{/*
read_acquire is a reader's fast grant on key $1 by owner $2, after read_lock in
the same transaction: it writes only the reader's permit row (and, on a free key,
the key's state row), never an existing row of the lock table, so readers' grants
do not wait for each other. $3 TTL µs, $4 the value (NULL for none). It grants
when the key's row is a read-write state row (owner '#', token 1) whose
expires_at already bounds the new permit's expiry, or when the key has no row and
this statement inserts the state row (its bound two TTLs ahead, as sem_acquire
sets it for a reader); and then only when no live permit is a writer's (held or
reserved) or $2's own and no live place is queued. Anything else (a row another
transaction inserted first included) returns no row, and the caller runs the full
attempt (sem_lock, sem_acquire), which decides every case. The token comes from
the sequence like every grant's, so it is above every earlier grant of the key.
Returns (token) when granted.
*/ -}}
WITH cur AS (
	SELECT r.owner, r.token, r.expires_at FROM {{.Table}} r WHERE r.key = $1::text
), free AS (
	SELECT NOT EXISTS (SELECT FROM {{.Permits}} q WHERE q.key = $1::text AND q.expires_at > now() AND (NOT q.shared OR q.owner = $2::text))
		AND NOT EXISTS (SELECT FROM {{.Table}} p WHERE {{template "placeRange"}} AND {{template "placeLive"}}) AS yes
), mk AS (
	INSERT INTO {{.Table}} (key, owner, token, expires_at)
	SELECT $1::text, '#', 1, now() + (2 * $3::bigint){{template "us"}} FROM free WHERE free.yes AND NOT EXISTS (SELECT FROM cur)
	ON CONFLICT (key) DO NOTHING
	RETURNING 1
), ok AS (
	SELECT FROM cur, free WHERE free.yes AND cur.owner = '#' AND cur.token = 1 AND cur.expires_at >= now() + $3::bigint{{template "us"}}
	UNION ALL
	SELECT FROM mk
), g AS (
	INSERT INTO {{.Permits}} AS q (key, owner, token, expires_at, value, shared)
	SELECT $1::text, $2::text, nextval({{.Seq}}::regclass), now() + $3::bigint{{template "us"}}, $4::bytea, true FROM ok
	ON CONFLICT (key, owner) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at,
		reserved = false, channel = '', value = EXCLUDED.value, shared = true
		WHERE q.expires_at <= now()
	RETURNING q.token
)
SELECT g.token FROM g WHERE {{template "readNotify" .}}
