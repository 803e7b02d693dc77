{{/*
lock_row locks the row of key $1, first in a release's or a withdrawal's
transaction (see hand_off.sql). With .Multi, it locks the rows of every key of the
array $1 that has one, in ascending key order (so that two such sets cannot
deadlock), first in acquire_all's transaction. No result.
*/ -}}
SELECT FROM {{.Table}} WHERE {{if .Multi}}key = ANY($1::text[]) ORDER BY key{{else}}key = $1::text{{end}} FOR UPDATE
