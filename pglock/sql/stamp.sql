{{/*
stamp gives a row inserted for a grant (token 0) its token, right after the insert
in the same transaction, and notifies the key's watches. $1 key, $2 owner. Returns
the token.
*/ -}}
WITH s AS (
	UPDATE {{.Table}} SET token = nextval({{.Seq}}::regclass)
		WHERE key = $1::text AND owner = $2::text AND token = 0 RETURNING token
)
SELECT s.token FROM s WHERE s.token IS NULL OR {{template "notify" .}}
