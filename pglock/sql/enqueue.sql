{{/*
enqueue adds owner $2's place at the end of key $1's queue when the key's row is a
live grant of another owner, not reserved and already marked queued: the case of
a client's waiting Lock right after it handed the key on (the row is the grant it
handed, or a later one, and places may be behind it). It locks the row FOR UPDATE,
as acquire.sql's waiting variant does, and writes nothing else; when the row is not
in that state (re-read after the lock wait) it writes nothing, and the caller runs
acquire.sql. $3 TTL µs, $4 the client's LISTEN channel, $5 patience µs, $6 the
request's value (NULL for none), $7 the number of the waiter's attempt (0 when it
is not a tracked wait's): the place is the one acquire.sql writes.

Returns (the new place's key or NULL, µs left on the holder's grant, live places
ahead of it, at most 8 counted, NULL (asyncUnless: it commits asynchronously)).
*/ -}}
WITH cur AS (
	SELECT r.expires_at FROM {{.Table}} r
	WHERE r.key = $1::text AND r.expires_at > now() AND NOT r.reserved AND r.owner <> $2::text
		AND r.owner <> '#' AND r.queue_owner <> '{}'
	FOR UPDATE
), place AS (
	INSERT INTO {{.Table}} (key, owner, token, expires_at, queue_channel, value)
	SELECT $1::text || chr(2) || lpad(nextval({{.Seq}}::regclass)::text, 20, '0'), $2::text, $5::bigint,
		now() + $5::bigint{{template "us"}},
		CASE WHEN $7::bigint > 0 THEN ARRAY[$4::text, $3::bigint::text, $7::bigint::text] ELSE ARRAY[$4::text] END, $6::bytea
	FROM cur
	RETURNING key
)
SELECT (SELECT key FROM place), (extract(epoch FROM cur.expires_at - now()) * 1000000)::bigint,
	(SELECT count(*) FROM (SELECT FROM {{.Table}} p WHERE {{template "placeRange"}} AND p.owner <> $2::text LIMIT 8) a),
	{{template "asyncUnless" "false"}}
FROM (SELECT) one LEFT JOIN cur ON true
