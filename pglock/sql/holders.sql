{{/*
holders lists the live holders of key $1, the oldest grant first: a mutex's
holder, or a semaphore's held permits (reserved ones are not held yet). Returns
rows of (limit, owner, token, µs left, live places, value or NULL, shared).
*/ -}}
WITH w AS (
	SELECT count(*) AS n FROM {{.Table}} p WHERE {{template "placeRange"}} AND {{template "placeLive"}}
)
SELECT 1::bigint, r.owner, r.token, (extract(epoch FROM r.expires_at - now()) * 1000000)::bigint, w.n, r.value, false
	FROM {{.Table}} r, w WHERE r.key = $1::text AND r.owner <> '#' AND r.expires_at > now() AND NOT r.reserved
UNION ALL
SELECT r.token, q.owner, q.token, (extract(epoch FROM q.expires_at - now()) * 1000000)::bigint, w.n, q.value, q.shared
	FROM {{.Table}} r, {{.Permits}} q, w
	WHERE r.key = $1::text AND r.owner = '#' AND q.key = $1::text AND NOT q.reserved AND q.expires_at > now()
ORDER BY 3
