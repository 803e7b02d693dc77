{{/*
stamp gives a row inserted for a grant (token 0) its token, right after the insert
in the same transaction, and notifies the key's watches. $1 key, $2 owner. Returns
the token. With .Multi, $1 is an array of keys, and it returns (key, token) for
each row it stamped.
*/ -}}
WITH s AS (
	UPDATE {{.Table}} SET token = nextval({{.Seq}}::regclass)
		WHERE {{if .Multi}}key = ANY($1::text[]){{else}}key = $1::text{{end}} AND owner = $2::text AND token = 0 RETURNING {{if .Multi}}key, {{end}}token
)
SELECT {{if .Multi}}s.key, {{end}}s.token FROM s WHERE s.token IS NULL OR {{if .Multi}}{{template "notify" (.WithKey "s.key")}}{{else}}{{template "notify" .}}{{end}}
