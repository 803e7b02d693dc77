{{/*
acquire is an attempt by owner $2 on key $1. $3 TTL µs, $4 will wait, $5 the
client's LISTEN channel, $6 patience µs, $7 the caller's place (its row's key) if
it has one, else '', $8 whether to renew the place's expiry (its client does not
hold its advisory lock now), $9 the request says Reenter (driver.Request), $10
the request's value (NULL for none), stored with a grant (a re-entry's too), $11
the number of the waiter's attempt (0 when it is not a tracked wait's).

A place records the request's TTL and the attempt's number after its channel
(queue_channel = {channel, TTL µs, number}) when $11 > 0: a release then grants
the key to that place directly (hand_off.sql), marking the key's row with the
place (queue_channel = {channel, place}) until the waiter claims it. The waiter
takes that grant from the notification without a statement; an attempt of its
(with $4 and its place $7) that finds the mark claims the grant as a re-entry
would (same token, TTL extended). Every grant made here drops the mark.

With .Lock (a waiting attempt, which may write its place) the key's row is locked
FOR UPDATE; without (an attempt that will not wait), the row is read from the
snapshot and written only if it is still the version read (xmin: a
compare-and-set), and no place is ever added.

The caller is granted the lock when there is no row; when the row is live and
reserved for its owner id, or is its own and $9 holds (re-entry: same token); or
when the row expired and no live waiter is queued ahead of it. A live grant of its
owner id without $9 (self) is refused and nothing is written. Otherwise a waiting
caller takes or renews its place in the queue. A semaphore's state row (owner '#',
token its limit, see sem_acquire.sql) that is live, or has a live place queued
ahead, refuses the attempt with nothing written (a limit mismatch); a dead one is
taken like an expired grant, except a read-write key's (limit 1), which is
refused the same way: the caller then asks as a holder of limit 1 (sem_acquire).

A grant made by the update notifies the key's watches (one made by the insert:
stamp does).

Returns (granted, must write, wrote, token, µs left on the holder's grant, live
places ahead of the caller's (at most 8 counted; all of them for a caller not yet
queued, who goes at the end), the caller's place or '', the semaphore's limit when
a semaphore refused it (else NULL), NULL (asyncUnless: a refused attempt commits
asynchronously)).
*/ -}}
WITH cur AS (
	SELECT r.xmin AS ver, r.owner, r.token, r.expires_at, r.reserved, r.queue_owner, r.queue_channel
	FROM {{.Table}} r WHERE r.key = $1::text{{if .Lock}} FOR UPDATE{{end}}
), me AS (
	SELECT p.key AS pk FROM {{.Table}} p WHERE p.key = $7::text AND p.owner = $2::text
), bound AS (
	SELECT coalesce((SELECT pk FROM me), $1::text || chr(3)) AS k
), d AS (
	SELECT cur.ver, cur.ver IS NULL AS absent, cur.owner AS cur_owner, cur.token AS cur_token, cur.token AS old_token,
		coalesce(cur.expires_at > now(), false) AS live, cur.expires_at,
		coalesce(cur.owner = $2::text AND cur.expires_at > now() AND NOT cur.reserved, false) AS reenter,
		coalesce(cur.owner = $2::text AND cur.expires_at > now() AND NOT cur.reserved AND NOT $9::boolean
			AND NOT ($4::boolean AND $7::text <> '' AND cur.queue_channel[2] IS NOT DISTINCT FROM $7::text), false) AS self,
		coalesce(cur.reserved AND cur.owner <> $2::text AND cur.expires_at > now(), false) AS other_reserved,
		coalesce(cur.queue_owner = '{}', true) AS unmarked,
		CASE WHEN cur.ver IS NULL THEN true
		     WHEN cur.expires_at > now() THEN cur.owner = $2::text AND (cur.reserved OR $9::boolean
			OR $4::boolean AND $7::text <> '' AND cur.queue_channel[2] IS NOT DISTINCT FROM $7::text)
		     ELSE NOT (cur.owner = '#' AND cur.token = 1) AND NOT EXISTS (SELECT FROM {{.Table}} p, bound WHERE {{template "placeRange"}} AND p.key < bound.k AND p.owner <> $2::text AND {{template "placeLive"}}) END AS granted
	FROM (SELECT) one LEFT JOIN cur ON true
), m AS (
	SELECT d.*, coalesce(d.cur_owner = '#' AND NOT d.granted, false) AS mismatch FROM d
), t AS (
	SELECT d.*, CASE WHEN NOT d.granted THEN NULL WHEN d.reenter THEN d.old_token
	                 WHEN d.absent THEN 0 ELSE nextval({{.Seq}}::regclass) END AS token
	FROM m d
), place AS (
	INSERT INTO {{.Table}} (key, owner, token, expires_at, queue_channel, value)
	SELECT $1::text || chr(2) || lpad(nextval({{.Seq}}::regclass)::text, 20, '0'), $2::text, $6::bigint,
		now() + $6::bigint{{template "us"}},
		CASE WHEN $11::bigint > 0 THEN ARRAY[$5::text, $3::bigint::text, $11::bigint::text] ELSE ARRAY[$5::text] END, $10::bytea
	FROM t WHERE NOT t.granted AND NOT t.absent AND $4::boolean AND NOT t.self AND NOT t.mismatch AND NOT EXISTS (SELECT FROM me){{if not .Lock}} AND false{{end}}
	RETURNING key
), renew AS (
	UPDATE {{.Table}} p SET expires_at = now() + $6::bigint{{template "us"}}, token = $6::bigint, value = $10::bytea,
		queue_channel = CASE WHEN $11::bigint > 0 THEN ARRAY[$5::text, $3::bigint::text, $11::bigint::text] ELSE ARRAY[$5::text] END
	FROM t WHERE p.key = $7::text AND p.owner = $2::text AND NOT t.granted AND $4::boolean AND NOT t.self AND NOT t.mismatch AND $8::boolean
	RETURNING 1
), dropped AS (
	DELETE FROM {{.Table}} p USING t WHERE p.key = $7::text AND p.owner = $2::text AND t.granted
	RETURNING 1
), ins AS (
	INSERT INTO {{.Table}} (key, owner, token, expires_at, value)
	SELECT $1::text, $2::text, t.token, now() + $3::bigint{{template "us"}}, $10::bytea FROM t WHERE t.absent
	ON CONFLICT (key) DO NOTHING
	RETURNING 1
), upd AS (
	UPDATE {{.Table}} r SET
		owner = CASE WHEN t.granted THEN $2::text ELSE r.owner END,
		token = coalesce(t.token, r.token),
		expires_at = CASE WHEN t.granted THEN now() + $3::bigint{{template "us"}} ELSE r.expires_at END,
		reserved = r.reserved AND NOT t.granted,
		queue_owner = CASE WHEN t.granted THEN r.queue_owner ELSE '{+}'::text[] END,
		value = CASE WHEN t.granted THEN $10::bytea ELSE r.value END,
		queue_channel = CASE WHEN t.granted THEN '{}'::text[] ELSE r.queue_channel END
	FROM t WHERE r.key = $1::text AND NOT t.absent
		AND (t.granted OR $4::boolean AND NOT t.self AND NOT t.mismatch AND r.queue_owner = '{}'){{if not .Lock}} AND r.xmin = t.ver{{end}}
	RETURNING CASE WHEN t.granted THEN {{template "notify" .}} END
)
SELECT t.granted, t.absent OR t.granted OR ($4::boolean AND t.unmarked AND NOT t.self AND NOT t.mismatch),
	EXISTS (SELECT FROM ins) OR EXISTS (SELECT FROM upd), t.token,
	CASE WHEN t.live THEN (extract(epoch FROM t.expires_at - now()) * 1000000)::bigint END,
	t.other_reserved::int + (SELECT count(*) FROM (SELECT FROM {{.Table}} p, bound WHERE {{template "placeRange"}} AND p.key < bound.k AND p.owner <> $2::text LIMIT 8) a),
	CASE WHEN t.granted THEN '' ELSE coalesce((SELECT key FROM place), (SELECT pk FROM me), '') END,
	CASE WHEN t.mismatch THEN t.cur_token END,
	{{template "asyncUnless" "t.granted"}}
FROM t
