{{/*
restamp follows fast_acquire in its transaction, on the same connection: it draws
the token of the row fast_acquire inserted ($1 key, $2 owner; its token is this
session's last draw, currval) again unless that token is still the sequence's
last value. Returns the new token; no row when the drawn one stands (or nothing
was inserted: a row of $2 another client made has another token).

fast_acquire draws its token before its insert reaches the unique index, where it
may wait while another client takes and releases the key, with a later draw. Any
draw after fast_acquire's shows in the sequence's last value: then this one is
drawn after the row is in the index, as stamp's is, and is above every token the
key had. When the last value is still the row's token, no draw came between it and
the insert, and every grant of the key after this one draws later. So the
uncontended path writes the row once, where stamp would write it twice.
*/ -}}
UPDATE {{.Table}} SET token = nextval({{.Seq}}::regclass)
	WHERE key = $1::text AND owner = $2::text AND token = currval({{.Seq}}::regclass)
		AND NOT coalesce(token >= pg_sequence_last_value({{.Seq}}::regclass), false)
	RETURNING token
