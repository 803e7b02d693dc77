{{/*
hand_off frees the lock of key $1 when .Cond holds of its row (cur): it reserves it
for the first live place, deleting that place and the lapsed ones before it, and
notifies the place's client; or, when no place is live, deletes the row and every
place. $2 is the releasing owner ('' for a force release). It runs after lock_row in
the same transaction. .Cond is one of the fixed conditions of release, force
release and withdraw (statements.go), never input. Freeing a held row (not a
reservation passed on by a withdrawal) clears its value and notifies the key's
watches. Returns one row when .Cond held: (was the grant live, was the row written
(always), was a waiter notified).
*/ -}}
WITH cur AS (
	SELECT r.owner, r.expires_at, r.reserved FROM {{.Table}} r WHERE r.key = $1::text
), t0 AS (
	SELECT cur.expires_at > now() AS live, cur.reserved AS was_reserved FROM cur WHERE {{.Cond}}
), h AS MATERIALIZED (
	SELECT p.key AS pk, p.owner AS o, p.queue_channel[1] AS c, p.token AS pat
	FROM {{.Table}} p WHERE EXISTS (SELECT FROM t0) AND {{template "placeRange"}} AND p.owner <> $2::text AND {{template "placeLive"}}
	ORDER BY p.key LIMIT 1
), t AS (
	SELECT t0.live, t0.was_reserved, h.pk, h.o, h.c, h.pat FROM t0 LEFT JOIN h ON true
), gone AS (
	DELETE FROM {{.Table}} p USING t WHERE {{template "placeRange"}} AND (t.pk IS NULL OR p.key <= t.pk) RETURNING 1
), more AS (
	SELECT EXISTS (SELECT FROM {{.Table}} p, t WHERE {{template "placeRange"}} AND p.key > t.pk) AS yes
), del AS (
	DELETE FROM {{.Table}} r USING t WHERE r.key = $1::text AND t.pk IS NULL
	RETURNING CASE WHEN NOT t.was_reserved THEN {{template "notify" .}} END
), upd AS (
	UPDATE {{.Table}} r SET owner = t.o, reserved = true, expires_at = now() + t.pat{{template "us"}},
		queue_channel = ARRAY[t.c], queue_owner = CASE WHEN (SELECT yes FROM more) THEN '{+}'::text[] ELSE '{}' END,
		value = NULL
	FROM t WHERE r.key = $1::text AND t.pk IS NOT NULL
	RETURNING CASE WHEN NOT t.was_reserved THEN {{template "notify" .}} END
)
SELECT t.live, EXISTS (SELECT FROM del) OR EXISTS (SELECT FROM upd),
	CASE WHEN t.pk IS NOT NULL THEN pg_notify(t.c, t.o || ' ' || $1::text) IS NOT NULL ELSE false END
FROM t
