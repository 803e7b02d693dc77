{{/*
fast_release deletes $2's grant of $1 when no one queued and it is not reserved (the
uncontended path), and notifies the key's watches. Returns whether the grant was
live.
*/ -}}
DELETE FROM {{.Table}} WHERE key = $1::text AND owner = $2::text AND NOT reserved AND queue_owner = '{}'
	RETURNING CASE WHEN {{template "notify" .}} THEN expires_at > now() END
