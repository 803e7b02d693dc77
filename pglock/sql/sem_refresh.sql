{{/*
sem_refresh extends $2's live permit of semaphore key $1 by $3 µs, and the state
row's expires_at (the latest expiry of the key's permits) with it. It runs after
lock_row in the same transaction. No result (rows affected tell).
*/ -}}
WITH u AS (
	UPDATE {{.Permits}} q SET expires_at = now() + $3::bigint{{template "us"}}
	FROM {{.Table}} r WHERE r.key = $1::text AND r.owner = '#'
		AND q.key = $1::text AND q.owner = $2::text AND NOT q.reserved AND q.expires_at > now()
	RETURNING q.expires_at
)
UPDATE {{.Table}} r SET expires_at = greatest(r.expires_at, u.expires_at) FROM u WHERE r.key = $1::text
