{{/*
inspect reads the live holder of key $1 (a mutex's: not a semaphore's state row). Returns (owner, token, µs left, live places,
value or NULL).
*/ -}}
SELECT owner, token, (extract(epoch FROM expires_at - now()) * 1000000)::bigint,
	(SELECT count(*) FROM {{.Table}} p WHERE {{template "placeRange"}} AND {{template "placeLive"}}),
	value
	FROM {{.Table}} WHERE key = $1::text AND expires_at > now() AND NOT reserved AND owner <> '#'
