{{/*
withdraw_owner drops every place of owner $2 on key $1 when $3 is ''. No result.
*/ -}}
DELETE FROM {{.Table}} p WHERE {{template "placeRange"}} AND p.owner = $2::text AND $3::text = ''
