{{/*
sem_lock makes sure key $1 has a row and locks it, first in a semaphore attempt's
transaction (see sem_acquire.sql): a free key gets a semaphore state row of limit
$2 (owner '#', which no owner id can be; token the limit; expires_at the latest
expiry of its permits, here none yet); an existing row, of either kind, is locked
and left as it is (ON CONFLICT DO UPDATE locks the row even when its WHERE is
false). No result.
*/ -}}
INSERT INTO {{.Table}} AS r (key, owner, token, expires_at) VALUES ($1::text, '#', $2::bigint, '-infinity')
	ON CONFLICT (key) DO UPDATE SET owner = r.owner WHERE false
