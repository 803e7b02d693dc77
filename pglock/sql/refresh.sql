{{/*
refresh extends $2's live grant of $1 by $3 µs. No result (rows affected tell).
*/ -}}
UPDATE {{.Table}} SET expires_at = now() + $3::bigint{{template "us"}}
	WHERE key = $1::text AND owner = $2::text AND NOT reserved AND expires_at > now()
