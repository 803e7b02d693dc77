{{/*
fast_acquire inserts the key's row for $2 when there is none (the uncontended
path); token 0 until stamp. $1 key, $2 owner, $3 TTL µs. No result.
*/ -}}
INSERT INTO {{.Table}} (key, owner, token, expires_at)
	VALUES ($1::text, $2::text, 0, now() + $3::bigint{{template "us"}})
	ON CONFLICT (key) DO NOTHING
