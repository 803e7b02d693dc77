{{/*
fast_acquire inserts the key's row for $2 when there is none (the uncontended
path); token 0 until stamp. $1 key, $2 owner, $3 TTL µs; with .Value, $4 the
value (without, the row has none: no parameter is sent). No result.
*/ -}}
INSERT INTO {{.Table}} (key, owner, token, expires_at{{if .Value}}, value{{end}})
	VALUES ($1::text, $2::text, 0, now() + $3::bigint{{template "us"}}{{if .Value}}, $4::bytea{{end}})
	ON CONFLICT (key) DO NOTHING
