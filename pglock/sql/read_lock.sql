{{/*
read_lock locks the row of key $1 FOR SHARE, first in a reader's fast grant or
release (read_acquire.sql, read_release.sql): readers run together, while every
statement that takes the row FOR UPDATE (a writer's attempt, a handoff) waits for
them and they for it, so each of them still decides on every permit and place
committed before its lock. It also takes the key's readers' barrier lock
(readerID) shared for the transaction, which a holder watch waits for
(readNotify in fragments.sql). No result.
*/ -}}
SELECT pg_advisory_xact_lock_shared({{template "readerID" .}}), (SELECT true FROM {{.Table}} WHERE key = $1::text FOR SHARE)
