{{/*
fast_acquire inserts the key's row for $2 when there is none (the uncontended
path), with a token drawn from the sequence, and notifies the key's watches. $1
key, $2 owner, $3 TTL µs; with .Value, $4 the value (without, the row has none: no
parameter is sent). Returns the token, and true, when it inserted; no row when the
key has one. The token is drawn before the insert reaches the unique index, where
it may wait: restamp, next in the same transaction, draws it again if any other
draw came after it.
*/ -}}
INSERT INTO {{.Table}} (key, owner, token, expires_at{{if .Value}}, value{{end}})
	VALUES ($1::text, $2::text, nextval({{.Seq}}::regclass), now() + $3::bigint{{template "us"}}{{if .Value}}, $4::bytea{{end}})
	ON CONFLICT (key) DO NOTHING
	RETURNING token, {{template "notify" .}}
