{{/*
Fragments shared by the statements. Data for every template: .Table (the lock
table, a validated identifier, "table" or "schema.table"), .Seq (the token
sequence as a quoted SQL string literal), .TableID (the table's oid, a number),
.WatchChannel (the table's holder-watch channel as a quoted SQL string literal).

us: multiplies a bigint of microseconds into an interval.
placeRange: selects the place rows p of key $1 (key || chr(2) || place number); called
with a string (template "placeRange" "k.key"), of the key that expression names.
placeLive: holds for a live place p: unexpired, or its client still holds its
advisory lock (a try that succeeds means no one holds it; the transaction's own
hold ends at commit).
notify (called with the data, template "notify" .): true, and on the way tells the
watches of key $1 (HolderWatcher) that its holder or value may have changed; called
with (.WithKey "g.key"), of the key that expression names (sqlData.WithKey). A
client watching the key holds a shared advisory lock on the key's hash (watchID
in watch.go) on its listening connection; only if this transaction cannot take
that lock exclusively does it pg_notify the table's watch channel with the key,
so a change no one watches costs a lock-table entry, not a NOTIFY. A try that
succeeds holds the lock to commit, and a watch takes its lock only after that:
a change that notifies no one is committed before the watch starts.
readNotify (called with the data): the notify of a reader's fast grant or
release, which must not NOTIFY just because another reader holds the watch lock
(transactions that NOTIFY commit one at a time). It runs after read_lock took the
barrier (readerID) in the same transaction. It tries the watch lock exclusively,
for the session, and gives it back at once, in one expression: unlike notify's
lock, held to commit, the readers of a key then seldom meet on it; when the try
fails it notifies only if a watch holds or awaits the lock (pg_locks, read only
then: it reads every backend's locks). The barrier, not the watch lock, orders a
reader's change before a watch: a watch, once it holds its lock, waits for the
barrier's exclusive lock (watch.go), that is for every reader's transaction in
flight, so a change that notified no one is committed before the watch starts.
(The dlock pool's connections hold no session lock otherwise; nothing between
the try and the give-back can fail.)
readerID: the key of the readers' barrier lock of key $1 (another seed than the
watch lock's, above every oid); called with (.WithKey "u.k"), of the key that
expression names. Readers' transactions hold it shared (read_lock); every
transaction that locks a key's row to decide for writers, handoffs or permits
(lock_row, sem_lock; not a mutex's release, lock_row .NoBarrier, which changes
no state row) holds it exclusively first, so those and readers wait for
each other in the lock manager, with no row lock of readers.
asyncUnless (called with a boolean expression, true when the attempt granted
something): NULL, and on the way, when the expression is false, the transaction
commits asynchronously (synchronous_commit=off, local to it). A waiting attempt
that was refused writes only queue bookkeeping (its place, the row's queued
mark), which a crash may lose without harm: the waiter's client queues again at
its next attempt. Its commit then does not wait for a WAL flush while it holds
the key's row lock, which the next handoff needs. A grant is committed
synchronously, and so is everything written before it in the WAL (a lost
asynchronous commit is always a suffix), the sequence's too: a token reported is
never reissued.
*/}}
{{- define "asyncUnless"}}CASE WHEN NOT ({{.}}) THEN set_config('synchronous_commit', 'off', true) END{{end -}}
{{- define "us"}} * interval '1 microsecond'{{end -}}
{{- define "placeRange"}}{{$k := or . "$1::text"}}p.key > {{$k}} || chr(2) AND p.key < {{$k}} || chr(3){{end -}}
{{- define "placeLive"}}(p.expires_at > now() OR NOT pg_try_advisory_xact_lock(('x' || substr(p.queue_channel[1], 7, 16))::bit(64)::bigint)){{end -}}
{{- define "notify"}}{{$k := or .Key "$1::text"}}(CASE WHEN pg_try_advisory_xact_lock(hashtextextended({{$k}} COLLATE "C", {{.TableID}})) THEN true ELSE pg_notify({{.WatchChannel}}, {{$k}}) IS NOT NULL END){{end -}}
{{- define "readerID"}}{{$k := or .Key "$1::text"}}hashtextextended({{$k}} COLLATE "C", {{.TableID}}::bigint + 4294967296){{end -}}
{{- define "readNotify"}}(CASE WHEN pg_try_advisory_lock(hashtextextended($1::text COLLATE "C", {{.TableID}}))
		THEN pg_advisory_unlock(hashtextextended($1::text COLLATE "C", {{.TableID}})) IS NOT NULL WHEN EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.mode = 'ShareLock'
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = oid((hashtextextended($1::text COLLATE "C", {{.TableID}}) >> 32) & 4294967295)
		AND l.objid = oid(hashtextextended($1::text COLLATE "C", {{.TableID}}) & 4294967295))
	THEN pg_notify({{.WatchChannel}}, $1::text) IS NOT NULL ELSE true END){{end -}}
