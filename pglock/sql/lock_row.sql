{{/*
lock_row locks the row of key $1, first in a release's or a withdrawal's
transaction (see hand_off.sql). No result.
*/ -}}
SELECT FROM {{.Table}} WHERE key = $1::text FOR UPDATE
