{{/*
read_try_lock locks the state row of read-write key $1 FOR UPDATE if no other
transaction holds a lock on it (SKIP LOCKED: it never waits, nor makes anyone
wait), and then marks the transaction (dlock.wake) for read_wake, next in the
same transaction. Returns (locked).
*/ -}}
SELECT EXISTS (SELECT FROM (SELECT set_config('dlock.wake', $1::text, true) FROM (
	SELECT FROM {{.Table}} r WHERE r.key = $1::text AND r.owner = '#' FOR UPDATE SKIP LOCKED) l) m)
