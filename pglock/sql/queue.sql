{{/*
queue lists the live places of key $1 in the order they will be served (the
place rows' keys, see placeRange), exactly the places the acquiring and handing
statements count as live (placeLive). Returns rows of (owner, shared: a reader's
place, µs until the place lapses unless its owner tries again or its client
still listens, value or NULL).
*/ -}}
SELECT p.owner, p.reserved, (extract(epoch FROM p.expires_at - now()) * 1000000)::bigint, p.value
	FROM {{.Table}} p WHERE {{template "placeRange"}} AND {{template "placeLive"}}
	ORDER BY p.key
