{{/*
read_last follows read_release in a reader's fast release of key $1 (owner $2): the
key may have to be handed on (a live place is queued: a writer may now be let in)
or freed (no other live permit is left whose row no transaction is deleting:
xmax unset; a reader's release deletes its row before this statement, so of two
last readers releasing together the later one to get here sees the other's
deletion). Then, if no other transaction holds the key's readers' barrier
(readerID, which this one holds shared since read_lock: no other reader's grant
or release in flight, and no writer's transaction holding or awaiting it), it
takes the barrier exclusively and locks the state row FOR UPDATE (SKIP LOCKED:
nor a statement that locks the row without the barrier, a mutex attempt that
refuses a state row), and marks the transaction (dlock.wake) for read_wake, next
in the same transaction, which decides under those locks with a snapshot taken
after them. Both are tries: a transaction that holds the barrier shared and
waited for it here could deadlock with another. Returns (whether the
key may need it and its row lock was taken; whether a live place is queued). When
both hold, the caller runs the full handoff, lock_row then sem_wake, in a
transaction of its own, which waits for the transactions in flight, so a queued
writer is never left waiting (of two last readers, each sees the place). When
only the first holds, nothing more is done: another reader's grant or release is
in flight, and the state row, perhaps left with no permit and no place, is a
free key to every statement (an attempt of any kind takes it, Holders, Inspect
and List show no holder) until a later release or handoff that finds the key
alone drops it.
*/ -}}
WITH w AS (
	SELECT EXISTS (SELECT FROM {{.Table}} p WHERE {{template "placeRange"}} AND {{template "placeLive"}}) AS places
), need AS (
	SELECT w.places, w.places
		OR NOT EXISTS (SELECT FROM {{.Permits}} q WHERE q.key = $1::text AND q.owner <> $2::text AND q.expires_at > now() AND q.xmax = '0'::xid) AS yes
	FROM w
), mine AS (
	SELECT set_config('dlock.wake', $1::text, true) AS k FROM (
		SELECT FROM {{.Table}} r, need WHERE r.key = $1::text
			AND CASE WHEN need.yes AND r.owner = '#' THEN pg_try_advisory_xact_lock({{template "readerID" .}}) ELSE false END
		FOR UPDATE OF r SKIP LOCKED) l
)
SELECT need.yes AND NOT EXISTS (SELECT FROM mine), need.places FROM need
