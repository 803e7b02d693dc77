{{/*
read_release is a reader's fast release of its held shared permit of read-write
key $1 (owner $2), after read_lock in the same transaction: it deletes the permit
row and leaves the state row alone; read_last then decides whether the key must
be handed on or freed. Returns (was the permit live, true) when it deleted one; no
row when the caller holds no shared permit here (the full release decides).
*/ -}}
WITH freed AS (
	DELETE FROM {{.Permits}} q USING {{.Table}} r
	WHERE r.key = $1::text AND r.owner = '#' AND r.token = 1
		AND q.key = $1::text AND q.owner = $2::text AND q.shared AND NOT q.reserved
	RETURNING q.expires_at > now() AS live
)
SELECT freed.live, {{template "readNotify" .}} FROM freed
