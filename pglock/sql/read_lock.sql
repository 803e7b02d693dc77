{{/*
read_lock takes the key's readers' barrier lock (readerID) shared for the
transaction, first in a reader's fast grant or release (read_acquire.sql,
read_release.sql): readers run together, while every transaction that locks the
key's row to decide for a writer, a handoff or a permit (lock_row, sem_lock; a
mutex's release changes no state row and locks the row alone) takes that lock
exclusively first, so it waits for the readers in flight and they for it, and
each of them still decides on every permit and place committed before its lock.
No row lock: a reader taking the row FOR SHARE joined a MultiXact that the next
reader in flight had to copy (16 readers ran fewer reads with it: see
docs/lock-types.md). A holder watch waits for the barrier too (readNotify in
fragments.sql). It also has the statements after it in the transaction run on
their generic plans (plan_cache_mode, local to the transaction): left to choose,
the server plans a reader's release for its parameters on every run, at a cost
in server CPU above that of running it (see "Plans" in the package
documentation). No result.
*/ -}}
SELECT pg_advisory_xact_lock_shared({{template "readerID" .}}), set_config('plan_cache_mode', 'force_generic_plan', true)
