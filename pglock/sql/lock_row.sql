{{/*
lock_row takes the readers' barrier lock of key $1 (readerID) exclusively, then
locks the key's row, first in a release's, a withdrawal's or a permit's
transaction (see hand_off.sql, sem_hand_off.sql): the barrier waits for the
readers' fast grants and releases in flight and holds off new ones to commit
(read_lock.sql), so the statements after it decide on every permit committed.
With .Multi, it takes the barriers of every key of the array $1 (ascending, as
AcquireAll's keys are) and then locks the rows of those that have one, in
ascending key order (so that two such sets cannot deadlock), first in
acquire_all's transaction. The target list runs left to right: barrier first,
row second, like every statement that takes both. With .NoBarrier, the row lock
alone, for a mutex's release or force release (hand_off.sql), whose conditions
exclude a state row, so no reader meets it. No result.
*/ -}}
{{- if .NoBarrier}}
SELECT FROM {{.Table}} WHERE key = $1::text FOR UPDATE
{{- else if .Multi}}
SELECT (SELECT count(pg_advisory_xact_lock({{template "readerID" (.WithKey "u.k")}})) FROM unnest($1::text[]) AS u(k)),
	(SELECT count(*) FROM (SELECT FROM {{.Table}} WHERE key = ANY($1::text[]) ORDER BY key FOR UPDATE) r)
{{- else}}
SELECT pg_advisory_xact_lock({{template "readerID" .}}), (SELECT true FROM {{.Table}} WHERE key = $1::text FOR UPDATE)
{{- end}}
