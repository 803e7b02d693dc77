{{/*
sem_hand_off frees the permits of semaphore key $1 that .Cond selects (q: a row
of the permit table; release: $2's held permit, force release: every live held
permit, withdraw: the permit reserved for $2) and hands the free permits on: each
of the first live places, as many as permits are free, gets a permit reserved for
its owner (for that waiter's patience), its place goes, and its client is
notified. When the key is left with no live permit and no live place, its state
row, its places and its permit rows go; otherwise the state row's expires_at
becomes the latest expiry of its live permits. $2 is '' for a force release. It
runs after lock_row in the same transaction. .Cond is one of the fixed
conditions in loadStatements, never input. Returns one row when .Cond selected a
permit: (was one live, number of waiters notified).

A read-write key (limit 1) hands the key on by mode: with no writer's permit
left live, the leading run of shared places (readers) each get a shared permit;
with no permit left live and no reader first, the first place (a writer) gets
the key. Each costs as many rows as it hands out, plus the first writer's place.

With .Wake (.Cond false) nothing is freed: on a read-write key only, the key is
handed on as after a release, to whom the live permits and places now admit (a
withdrawal runs it after dropping a place, so that readers queued behind a
writer that gave up are not left waiting for their retry); a key with no live
permit and no live place loses its rows. The state row's bound is kept if higher (readers'
fast grants need it to cover their permits). With .Guard too, it does so only
when read_release marked the transaction (dlock.wake is $1): read_wake, the last
statement of a reader's fast release.
*/ -}}
WITH cur AS (
	SELECT r.token AS lim FROM {{.Table}} r WHERE r.key = $1::text AND r.owner = '#'
), freed AS (
{{- if .Wake}}
	SELECT true AS live FROM cur WHERE cur.lim = 1{{if .Guard}} AND current_setting('dlock.wake', true) = $1::text{{end}}
{{- else}}
	DELETE FROM {{.Permits}} q USING cur WHERE q.key = $1::text AND ({{.Cond}})
	RETURNING q.expires_at > now() AS live
{{- end}}
), rest AS (
	SELECT q.owner, q.expires_at, q.shared FROM {{.Permits}} q, cur
	WHERE q.key = $1::text AND q.expires_at > now() AND NOT ({{.Cond}})
), sem_h AS MATERIALIZED (
	SELECT p.key AS pk, p.owner AS o, p.queue_channel[1] AS c, p.token AS pat, false AS sh
	FROM {{.Table}} p WHERE EXISTS (SELECT FROM freed) AND (SELECT cur.lim > 1 FROM cur) AND {{template "placeRange"}} AND p.owner <> $2::text
		AND NOT EXISTS (SELECT FROM rest WHERE rest.owner = p.owner) AND {{template "placeLive"}}
	-- (A Limit node computes its count first, whatever its filter: only when a permit is freed.)
	ORDER BY p.key LIMIT CASE WHEN EXISTS (SELECT FROM freed) THEN (SELECT greatest(cur.lim - (SELECT count(*) FROM rest), 0) FROM cur) ELSE 0 END
), xk AS MATERIALIZED (
	SELECT p.key AS pk, p.owner AS o, p.queue_channel[1] AS c, p.token AS pat, false AS sh
	FROM {{.Table}} p WHERE EXISTS (SELECT FROM freed) AND (SELECT cur.lim = 1 FROM cur) AND {{template "placeRange"}} AND NOT p.reserved
		AND p.owner <> $2::text AND NOT EXISTS (SELECT FROM rest WHERE rest.owner = p.owner) AND {{template "placeLive"}}
	ORDER BY p.key LIMIT 1
), run AS MATERIALIZED (
	SELECT p.key AS pk, p.owner AS o, p.queue_channel[1] AS c, p.token AS pat, true AS sh
	FROM {{.Table}} p WHERE EXISTS (SELECT FROM freed) AND (SELECT cur.lim = 1 FROM cur) AND {{template "placeRange"}} AND p.reserved
		AND p.key < coalesce((SELECT pk FROM xk), $1::text || chr(3)) AND NOT EXISTS (SELECT FROM rest WHERE NOT rest.shared)
		AND p.owner <> $2::text AND NOT EXISTS (SELECT FROM rest WHERE rest.owner = p.owner) AND {{template "placeLive"}}
), h AS (
	SELECT * FROM sem_h
	UNION ALL SELECT * FROM run
	UNION ALL SELECT * FROM xk WHERE EXISTS (SELECT FROM freed) AND NOT EXISTS (SELECT FROM rest) AND NOT EXISTS (SELECT FROM run)
), gone AS (
	DELETE FROM {{.Table}} p WHERE p.key IN (SELECT pk FROM h) RETURNING 1
), handed AS (
	INSERT INTO {{.Permits}} AS q (key, owner, token, expires_at, reserved, channel, shared)
	SELECT $1::text, h.o, 0, now() + h.pat{{template "us"}}, true, h.c, h.sh FROM h
	ON CONFLICT (key, owner) DO UPDATE SET token = 0, expires_at = EXCLUDED.expires_at, reserved = true,
		channel = EXCLUDED.channel, value = NULL, shared = EXCLUDED.shared WHERE q.expires_at <= now()
	RETURNING q.owner, q.expires_at, q.channel
), waits AS (
	SELECT EXISTS (SELECT FROM {{.Table}} p WHERE EXISTS (SELECT FROM freed) AND {{template "placeRange"}}
		AND p.key NOT IN (SELECT pk FROM h) AND {{template "placeLive"}}) AS yes
), empty AS (
	SELECT EXISTS (SELECT FROM freed) AND NOT EXISTS (SELECT FROM rest) AND NOT EXISTS (SELECT FROM h)
		AND NOT (SELECT yes FROM waits) AS yes
), drop_state AS (
	DELETE FROM {{.Table}} p WHERE (SELECT yes FROM empty)
		AND (p.key = $1::text AND p.owner = '#' OR {{template "placeRange"}})
	RETURNING CASE WHEN p.key = $1::text THEN {{template "notify" .}} END
), drop_permits AS (
	DELETE FROM {{.Permits}} q WHERE (SELECT yes FROM empty) AND q.key = $1::text
	RETURNING 1
), upd AS (
	UPDATE {{.Table}} r SET expires_at = {{if .Wake}}greatest(r.expires_at, {{end}}coalesce((SELECT max(x) FROM (
			SELECT rest.expires_at AS x FROM rest UNION ALL SELECT handed.expires_at FROM handed) a), '-infinity'){{if .Wake}}){{end}}
	WHERE r.key = $1::text AND r.owner = '#' AND EXISTS (SELECT FROM freed) AND NOT (SELECT yes FROM empty)
	RETURNING {{template "notify" .}}
)
SELECT bool_or(freed.live),
	(SELECT count(*) FROM handed WHERE pg_notify(handed.channel, handed.owner || ' ' || $1::text) IS NOT NULL)
FROM freed HAVING count(*) > 0
