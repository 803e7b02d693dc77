{{/*
Fragments shared by the statements. Data for every template: .Table (the lock
table, a validated identifier, "table" or "schema.table"), .Seq (the token
sequence as a quoted SQL string literal).

us: multiplies a bigint of microseconds into an interval.
placeRange: selects the place rows p of key $1 (key || chr(2) || place number).
placeLive: holds for a live place p: unexpired, or its client still holds its
advisory lock (a try that succeeds means no one holds it; the transaction's own
hold ends at commit).
*/}}
{{- define "us"}} * interval '1 microsecond'{{end -}}
{{- define "placeRange"}}p.key > $1::text || chr(2) AND p.key < $1::text || chr(3){{end -}}
{{- define "placeLive"}}(p.expires_at > now() OR NOT pg_try_advisory_xact_lock(('x' || substr(p.queue_channel[1], 7, 16))::bit(64)::bigint)){{end -}}
