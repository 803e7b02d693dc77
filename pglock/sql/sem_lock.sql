{{/*
sem_lock takes the readers' barrier lock of key $1 exclusively (as lock_row does),
then makes sure the key has a row and locks it, first in a semaphore attempt's
transaction (see sem_acquire.sql): a free key gets a semaphore state row of limit
$2 (owner '#', which no owner id can be; token the limit; expires_at the latest
expiry of its permits, here none yet); an existing row, of either kind, is locked
and left as it is (ON CONFLICT DO UPDATE locks the row even when its WHERE is
false). The row to insert is made by the SELECT after it took the barrier. No result.
*/ -}}
INSERT INTO {{.Table}} AS r (key, owner, token, expires_at)
	SELECT $1::text, '#', $2::bigint, '-infinity' FROM (SELECT pg_advisory_xact_lock({{template "readerID" .}})) AS barrier
	ON CONFLICT (key) DO UPDATE SET owner = r.owner WHERE false
