{{/*
sem_set_value replaces the value of $2's live permit of semaphore key $1 with $3
(NULL for none), leaving its expiry, and notifies the key's watches. No result
(rows affected tell).
*/ -}}
UPDATE {{.Permits}} SET value = $3::bytea
	WHERE key = $1::text AND owner = $2::text AND NOT reserved AND expires_at > now()
	RETURNING {{template "notify" .}}
