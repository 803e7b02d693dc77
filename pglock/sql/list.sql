{{/*
list lists the live holders of every key from $1::text up to $2::text (the
successor of the prefix $1; NULL for no bound), in key order and, within a key,
the oldest grant first, as holders.sql decides them for one key: a mutex's
holder, or a semaphore's or readers' held permits (when .Permits is not "":
without a permit table, the mutex holders only). Place rows (key || chr(2) ||
number) are skipped. Returns rows of (key, owner, token, µs left, live places,
value or NULL, shared).
*/ -}}
WITH k AS (
	SELECT r.key, r.owner, r.token, r.expires_at, r.reserved, r.value FROM {{.Table}} r
	WHERE r.key >= $1::text AND ($2::text IS NULL OR r.key < $2::text) AND strpos(r.key, chr(2)) = 0
), h AS (
	SELECT k.key, k.owner, k.token, k.expires_at, k.value, false AS shared
		FROM k WHERE k.owner <> '#' AND k.expires_at > now() AND NOT k.reserved
{{- if .Permits}}
	UNION ALL
	SELECT k.key, q.owner, q.token, q.expires_at, q.value, q.shared
		FROM k JOIN {{.Permits}} q ON q.key = k.key
		WHERE k.owner = '#' AND NOT q.reserved AND q.expires_at > now()
{{- end}}
), w AS (
	SELECT d.key, (SELECT count(*) FROM {{.Table}} p WHERE {{template "placeRange" "d.key"}} AND {{template "placeLive"}}) AS n
		FROM (SELECT DISTINCT key FROM h) d
)
SELECT h.key, h.owner, h.token, (extract(epoch FROM h.expires_at - now()) * 1000000)::bigint, w.n, h.value, h.shared
	FROM h JOIN w ON w.key = h.key
	ORDER BY h.key, h.token
