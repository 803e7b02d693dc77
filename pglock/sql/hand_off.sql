{{/*
hand_off frees the lock of key $1 when .Cond holds of its row (cur): it reserves it
for the first live place, deleting that place and the lapsed ones before it, and
notifies the place's client; or, when no place is live, deletes the row and every
place. $2 is the releasing owner ('' for a force release). It runs after lock_row in
the same transaction. .Cond is one of the fixed conditions of release, force
release and withdraw (statements.go), never input. Freeing a held row (not a
reservation passed on by a withdrawal) clears its value and notifies the key's
watches. Returns one row when .Cond held: (was the grant live, was the row written
(always), was a waiter notified). $3 is the place a withdrawing waiter had ('' if
unknown, or not a withdrawal), which .Cond may name.

A place that recorded its request's TTL and attempt number (queue_channel =
{channel, TTL µs, number}, see acquire.sql) is granted the key directly: the row
becomes its owner's grant, with a new token from the sequence (drawn here, after
the row lock), its TTL from now on the server's clock, the place's value, and the
handed mark queue_channel = {channel, place}; the notification, "owner key" then
chr(1) "token number TTL place-number more", lets the waiter take it without a
statement (more: 1 when places remain behind it). A place without them (a client
of an earlier version) is only reserved, for its patience, as before.
*/ -}}
WITH cur AS (
	SELECT r.owner, r.expires_at, r.reserved, r.queue_channel FROM {{.Table}} r WHERE r.key = $1::text
), t0 AS (
	SELECT cur.expires_at > now() AS live, cur.reserved AS was_reserved, $3::text AS hp FROM cur WHERE {{.Cond}}
), h AS MATERIALIZED (
	SELECT p.key AS pk, p.owner AS o, p.queue_channel[1] AS c, p.token AS pat,
		CASE WHEN p.queue_channel[2] ~ '^[0-9]+$' AND p.queue_channel[3] ~ '^[0-9]+$' THEN p.queue_channel[2]::bigint END AS ttl,
		p.queue_channel[3] AS seq, p.value AS pv
	FROM {{.Table}} p WHERE EXISTS (SELECT FROM t0) AND {{template "placeRange"}} AND p.owner <> $2::text AND {{template "placeLive"}}
	ORDER BY p.key LIMIT 1
), t AS MATERIALIZED (
	SELECT t0.live, t0.was_reserved, h.pk, h.o, h.c, h.pat, h.ttl, h.seq, h.pv, h.ttl IS NOT NULL AS direct,
		CASE WHEN h.ttl IS NOT NULL THEN nextval({{.Seq}}::regclass) END AS tok
	FROM t0 LEFT JOIN h ON true
), gone AS (
	DELETE FROM {{.Table}} p USING t WHERE {{template "placeRange"}} AND (t.pk IS NULL OR p.key <= t.pk) RETURNING 1
), more AS (
	SELECT EXISTS (SELECT FROM {{.Table}} p, t WHERE {{template "placeRange"}} AND p.key > t.pk) AS yes
), del AS (
	DELETE FROM {{.Table}} r USING t WHERE r.key = $1::text AND t.pk IS NULL
	RETURNING CASE WHEN NOT t.was_reserved THEN {{template "notify" .}} END
), upd AS (
	UPDATE {{.Table}} r SET owner = t.o, reserved = NOT t.direct,
		expires_at = now() + (CASE WHEN t.direct THEN t.ttl ELSE t.pat END){{template "us"}},
		token = coalesce(t.tok, r.token),
		queue_channel = CASE WHEN t.direct THEN ARRAY[t.c, t.pk] ELSE ARRAY[t.c] END,
		queue_owner = CASE WHEN (SELECT yes FROM more) THEN '{+}'::text[] ELSE '{}' END,
		value = CASE WHEN t.direct THEN t.pv END
	FROM t WHERE r.key = $1::text AND t.pk IS NOT NULL
	RETURNING CASE WHEN NOT t.was_reserved OR t.direct THEN {{template "notify" .}} END
)
SELECT t.live, EXISTS (SELECT FROM del) OR EXISTS (SELECT FROM upd),
	CASE WHEN t.pk IS NOT NULL THEN pg_notify(t.c, t.o || ' ' || $1::text || CASE WHEN t.direct
		THEN chr(1) || t.tok || ' ' || t.seq || ' ' || t.ttl || ' ' || substr(t.pk, length($1::text) + 2) || ' ' || (SELECT yes FROM more)::int
		ELSE '' END) IS NOT NULL ELSE false END
FROM t
