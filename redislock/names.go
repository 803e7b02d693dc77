package redislock

// Key layout, for a lock named K under prefix P (0x1f is the ASCII unit separator,
// \31 in Lua; scripts/names.lua spells the same parts):
//
//	P:lock 0x1f K    string  the holder's owner id, with the lease TTL (PX), then
//	                         space-separated marks: " hCHANNEL" when a release
//	                         handed the key to a queued waiter whose client
//	                         listens on CHANNEL and the owner has not been seen
//	                         by the server since; " qN" when waiters queued (or
//	                         may have: a handed grant always has it), N being
//	                         the length of P, so that release needs no more
//	                         than the lock key and the owner; " v" when the
//	                         grant has a value
//	P:lock 0x1f K    hash    instead, for a semaphore (limit N > 1; see
//	                         scripts/sem.lua): field 0x1f "limit" = "N PLEN"
//	                         (PLEN the length of P), and a field per holder,
//	                         OWNER = "EXPIRY TOKEN MARK" or "EXPIRY TOKEN MARK
//	                         VALUE": its expiry in ms on the server's clock, its
//	                         token, "-" or the channel of the queued place it
//	                         was handed to (as " h" above), and its value. The
//	                         key's own TTL is pushed out to the latest holder's
//	                         expiry or queued place's patience. A read-write
//	                         lock held by readers (or by a writer queued behind
//	                         them) is this hash with N = 1; a shared holder's
//	                         MARK starts with the byte 0x1f
//	P:lock 0x1f K 0x1f token
//	                 string  last fencing token issued for K, expiring
//	                         TokenRetention after the lease of its last grant
//	                         (pushed out by a mutex's Refresh and re-entry), and
//	                         never before the server clock x 1000 has passed it
//	                         (see scripts/token.lua). Its name is the lock key's
//	                         and a suffix, so the scripts derive it from the lock
//	                         key without another argument (each costs every call).
//	P:lock 0x1f K 0x1f value
//	                 string  the grant's value (driver.Valuer), set to expire
//	                         when the lock key does (PXAT its PEXPIRETIME) by the
//	                         script that sets or extends the lock key, replaced
//	                         and deleted with it. Only the " v" mark says it
//	                         belongs to the current grant: one left behind (the
//	                         lock key deleted by hand) is never read, and the
//	                         next grant with a value overwrites it.
//	P:queue 0x1f K   list    owner ids of queued waiters, oldest first
//	P:waiter 0x1f K 0x1f OWNER
//	                 string  "SEQ TTL CHANNEL" or "SEQ TTL CHANNEL VALUE": the
//	                         number of the waiter's latest attempt, the TTL in ms
//	                         of the grant it asked for, its client's channel, and
//	                         the value of that grant (the rest of the string, any
//	                         bytes), written again by each attempt; the key's own
//	                         TTL is the place's patience, renewed by each
//	                         attempt. A shared (read) place's CHANNEL starts
//	                         with the byte 0x1f
//	P:wake:ID        channel one per client (ID: 24 hex digits): handoff messages
//	                         "OWNER TOKEN SEQ TTL K"
//	P:lock 0x1f K 0x1f holder
//	                 channel an empty message at each change of K's holder or
//	                         value that a script makes (grant, release, handoff,
//	                         force release, SetValue); not at expiry
//
// Isolation. No prefix, key or owner id holds a control byte (WithPrefix,
// driver.ValidateKey, driver.ValidateOwner), so the first 0x1f of a key name ends
// "P:kind", whose kind is what follows its last ":" (a kind has none) and P what
// precedes it; K runs to the next 0x1f or the end. Every name thus spells out its
// prefix, kind, key and owner, and two of them are equal only if all four are: no
// prefix reaches another's keys, whatever the keys. (Earlier versions used ":" in
// place of 0x1f, so prefix "a" with key "b:lock:c" and prefix "a:lock:b" with key
// "c" shared a lock, and a waiter's key could be another key's and owner's; and the
// token counter was at P:token:K, then P:lock:K 0x1f token. Clients of an older
// layout do not exclude clients of this one: stop every older client before
// starting new ones. The server clock term keeps tokens rising across the move.) A
// wake channel ends in ":wake:" and hex digits, so it too names its prefix; a holder
// channel is spelt like a key (Redis keeps channels apart from keys) and names its
// prefix and key the same way. Names start with "P:", so an ACL key pattern P:*
// and channel pattern &P:* cover a prefix's keys and channels.
//
// The uncontended path costs little more than the least correct lock: acquire is SET
// NX PX plus PEXPIRETIME and INCR of the token counter, release is GET plus DEL, each
// one script call with few arguments, and each PUBLISHes to the holder channel (to
// nobody, unless someone watches: a lookup in the server's channel table). A value
// costs an argument and a SET, or DEL, of the value key where there is one. Queue work happens only when someone waits:
// the queue and waiter keys are derived inside the scripts from the prefix (which the
// client passes only where needed, or which the scripts read from the channel and
// the " qN" mark), so the layout suits a single Redis instance, not Redis Cluster.
// Owner ids and prefixes cannot contain spaces, so the marks cannot be forged.

// The parts of the key names; the tests check that the scripts derive the same.
const (
	lockPart     = ":lock\x1f"
	queuePart    = ":queue\x1f"
	waiterPart   = ":waiter\x1f"
	ownerSep     = "\x1f"
	tokenSuffix  = "\x1ftoken"  // ends a lock key to name its token counter
	valueSuffix  = "\x1fvalue"  // ends a lock key to name its value
	holderSuffix = "\x1fholder" // ends a lock key to name its holder channel
	wakePart     = ":wake:"
)

// wakeIDBytes is the number of random bytes in a wake-up channel's ID.
const wakeIDBytes = 12

func lockKey(prefix, key string) string    { return prefix + lockPart + key }
func queueKey(prefix, key string) string   { return prefix + queuePart + key }
func wakeChannel(prefix, id string) string { return prefix + wakePart + id }
func waiterKey(prefix, key, owner string) string {
	return prefix + waiterPart + key + ownerSep + owner
}
