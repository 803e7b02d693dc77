{{/*
read_lock locks the row of key $1 FOR SHARE, first in a reader's fast grant or
release (read_acquire.sql, read_release.sql): readers run together, while every
statement that takes the row FOR UPDATE (a writer's attempt, a handoff) waits for
them and they for it, so each of them still decides on every permit and place
committed before its lock. It also takes the key's readers' barrier lock
(readerID) shared for the transaction, which a holder watch waits for
(readNotify in fragments.sql), and has the statements after it in the
transaction run on their generic plans (plan_cache_mode, local to the
transaction): left to choose, the server plans a reader's release for its
parameters on every run, at a cost in server CPU above that of running it (see
"Plans" in the package documentation). No result.
*/ -}}
SELECT pg_advisory_xact_lock_shared({{template "readerID" .}}), (SELECT true FROM {{.Table}} WHERE key = $1::text FOR SHARE),
	set_config('plan_cache_mode', 'force_generic_plan', true)
