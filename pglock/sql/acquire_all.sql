{{/*
acquire_all is an attempt by owner $2 at every key of the array $1 at once (the
keys distinct, ascending), for driver.MultiAcquirer; $3 TTL µs. It runs after
lock_row (.Multi) in the same transaction, so its snapshot holds every place added
to a key before the key's row was locked. It locks the rows again, without
waiting (NOWAIT): the transaction's own locks are there already, and a row that
appeared meanwhile is locked too if it is free, else the statement fails
(lock_not_available). Waiting for it here, out of key order, could deadlock with
a set that waits in lock_row for a row this one holds.

A key is free as acquire.sql without waiting or re-entry finds it: it has no row;
or its row expired, is not a read-write key's state row (owner '#', limit 1), and
no live place is queued. With .Permits (the permit table exists), a read-write
key's state row is free when no live permit (held or reserved) and no live place
is left, whatever its expiry bound: a reader's fast release may leave such a row
(read_last.sql); taking it makes it a mutex row, and the dead permit rows left
are ignored, then dropped by the key's next semaphore grant. A live row, held or reserved for a waiter, is taken,
except the caller's own grant (a retry of a statement whose reply was lost: the
owner id is fresh, so no one else holds it), which is granted again with its
token. Only when every key is free does it write: it inserts a row (token 0,
for stamp .Multi to draw) for each key that has none, and takes each existing
row with a new token, notifying the key's watches. A plain INSERT: a key whose
row another transaction inserts meanwhile fails the statement
(unique_violation), and with it the whole transaction.

Returns one row per key, in the order of $1: (free, its token when granted (0: to
be stamped), µs left on the holder's grant, the key's limit when it is a
semaphore's or a read-write key's and not free (else NULL)).
*/ -}}
WITH k AS (
	SELECT k.key, k.i FROM unnest($1::text[]) WITH ORDINALITY AS k(key, i)
), cur AS (
	SELECT r.key, r.owner, r.token, r.expires_at, r.reserved
	FROM {{.Table}} r WHERE r.key = ANY($1::text[]) ORDER BY r.key FOR UPDATE NOWAIT
), d AS (
	SELECT k.key, k.i, cur.key IS NULL AS absent, cur.owner, cur.token AS old_token, cur.expires_at,
		coalesce(cur.expires_at > now(), false) AS live,
		coalesce(cur.owner = $2::text AND cur.expires_at > now() AND NOT cur.reserved, false) AS reenter,
		CASE WHEN cur.key IS NULL THEN true
{{- if .Permits}}
		     WHEN cur.owner = '#' AND cur.token = 1 THEN NOT EXISTS (SELECT FROM {{.Permits}} q WHERE q.key = k.key AND q.expires_at > now())
				AND NOT EXISTS (SELECT FROM {{.Table}} p WHERE {{template "placeRange" "k.key"}} AND {{template "placeLive"}})
{{- end}}
		     WHEN cur.expires_at > now() THEN cur.owner = $2::text AND NOT cur.reserved
		     ELSE NOT (cur.owner = '#' AND cur.token = 1) AND NOT EXISTS (SELECT FROM {{.Table}} p WHERE {{template "placeRange" "k.key"}} AND {{template "placeLive"}}) END AS free
	FROM k LEFT JOIN cur ON cur.key = k.key
), g AS (
	SELECT d.key, d.absent, CASE WHEN d.reenter THEN d.old_token WHEN d.absent THEN 0 ELSE nextval({{.Seq}}::regclass) END AS token
	FROM d WHERE (SELECT bool_and(free) FROM d)
), ins AS (
	INSERT INTO {{.Table}} (key, owner, token, expires_at)
	SELECT g.key, $2::text, 0, now() + $3::bigint{{template "us"}} FROM g WHERE g.absent ORDER BY g.key
	RETURNING 1
), upd AS (
	UPDATE {{.Table}} r SET owner = $2::text, token = g.token, expires_at = now() + $3::bigint{{template "us"}}, reserved = false, value = NULL
	FROM g WHERE r.key = g.key AND NOT g.absent
	RETURNING {{template "notify" (.WithKey "r.key")}}
)
SELECT d.free, g.token, CASE WHEN d.live THEN (extract(epoch FROM d.expires_at - now()) * 1000000)::bigint END,
	CASE WHEN d.owner = '#' AND NOT d.free THEN d.old_token END
FROM d LEFT JOIN g ON g.key = d.key
ORDER BY d.i
