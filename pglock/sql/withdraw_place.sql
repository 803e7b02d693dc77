{{/*
withdraw_place drops the place $3 of owner $2 on key $1. No result.
*/ -}}
DELETE FROM {{.Table}} p WHERE p.key = $3::text AND p.key > $1::text AND p.owner = $2::text
