package redlock

// Key layout on every node, for a lock named K under prefix P (0x1f is the ASCII
// unit separator):
//
//	P:lock 0x1f K     string  "OWNER", "OWNER TOKEN" or "OWNER TOKEN VALUE": the
//	                          holder on this node, the fencing token once it is
//	                          known ("0" before, when a value follows), and the
//	                          grant's value (driver.Valuer; any bytes, the rest of
//	                          the string) if it has one; TTL = the lease TTL. The
//	                          value goes wherever the grant goes: expiry, release,
//	                          force release. While readers hold, it is 0x1f
//	                          "readers" instead, with a TTL no shorter than the
//	                          last reader's (lib.lua's READERS).
//	P:fence 0x1f K    string  this node's fencing counter: the largest token it
//	                          accepted; no TTL, it must outlive every lock (see the
//	                          package documentation)
//	P:wait 0x1f K     zset    owner ids of waiters, scored by when they started
//	                          waiting (their client's clock, ms), oldest first
//	P:waiter 0x1f K 0x1f OWNER
//	                  string  the waiter's client wake-up channel, followed by
//	                          " r" for a reader, or for a writer by its wait's
//	                          and attempt's numbers and the TTL and value of the
//	                          grant it asks for (lib.lua's waiterEntry); its TTL
//	                          is the waiter's patience, renewed by each of its
//	                          attempts
//	P:wait 0x1f K 0x1f shortest
//	                  string  the shortest TTL (ms) a place in the wait set asked
//	                          for while the set lasted (lib.lua's enqueue); the
//	                          wait set's TTL
//	P:lock 0x1f K 0x1f handed
//	                  string  "CHANNEL WID" of the wait a release handed the lock
//	                          to (lib.lua's HANDED); the TTL of the handed grant
//	P:readers 0x1f K  zset    the owner ids of the readers (shared grants) on
//	                          this node, scored by the server time (ms) at which
//	                          each grant lapses; TTL = the longest of them
//	P:reader 0x1f K   hash    owner id -> "TOKEN" or "TOKEN VALUE" of each reader
//	                          (TOKEN "0" until it is known); the same TTL
//	P:floor 0x1f K    string  the benchmark floor's lock (internal/storeops, on the
//	                          first node); the backend never touches it
//
// A client's wake-up channel is P:wake:ID; a release publishes "NONCE OWNER
// COUNTER K" on the channel of the waiter it wakes (COUNTER: the node's fencing
// counter), or "+NONCE OWNER TOKEN SEQ TTL WID K" on the channel of the writer it
// hands the lock to (see handoff.go). A lock's holder channel is its lock key, the
// byte 0x1f and "holder" (lib.lua's HOLDER; Redis keeps channels apart from keys):
// every script that changes the lock on a node (grant with its token, token
// commit, restore, value change, release, force release) publishes an empty
// message there; an expiry does not.
//
// No prefix, key or owner id holds a control byte (WithPrefix, driver.ValidateKey,
// driver.ValidateOwner), so the first 0x1f of a key name ends "P:kind", whose kind
// follows the last ":" and P precedes it, and K runs to the next 0x1f or the end:
// two key names are equal only if their prefix, kind, key and owner are, and no
// prefix reaches another's keys. (Earlier versions used ":" in place of 0x1f, so
// prefix "a" with key "b:lock:c" and prefix "a:lock:b" with key "c" shared a lock.
// Clients of the older layout do not exclude clients of this one: stop every older
// client before starting new ones; the fence counters start again from the server
// clock, above the old tokens.) Key names start with "P:", so an ACL key pattern P:*
// covers a prefix's keys.
//
// Owner ids and tokens never contain a space (driver.ValidateOwner), so "OWNER
// TOKEN VALUE" splits unambiguously at its first two spaces and cannot be forged
// by a crafted owner id. Keys and values travel as KEYS and ARGV, never inside the
// script text, so any key is safe. Waiter keys and holder channels are computed
// inside the scripts, from the waiter key prefix the client passes and the lock
// key, which suits independent masters, not Redis Cluster.

const (
	lockPart   = ":lock\x1f"
	fencePart  = ":fence\x1f"
	waitPart   = ":wait\x1f"
	waiterPart = ":waiter\x1f"
	readPart   = ":readers\x1f"
	rdataPart  = ":reader\x1f"
	floorPart  = ":floor\x1f"
	ownerSep   = "\x1f"
	tokenSep   = " "          // between OWNER, TOKEN and VALUE in a lock value (lib.lua's SEP)
	holderPart = "\x1fholder" // ends a lock key to name its holder channel (lib.lua's HOLDER)
)

func lockKey(prefix, key string) string       { return prefix + lockPart + key }
func fenceKey(prefix, key string) string      { return prefix + fencePart + key }
func waitSetKey(prefix, key string) string    { return prefix + waitPart + key }
func readersKey(prefix, key string) string    { return prefix + readPart + key }
func readerDataKey(prefix, key string) string { return prefix + rdataPart + key }
func floorKey(prefix, key string) string      { return prefix + floorPart + key }
func waiterPrefix(prefix, key string) string  { return prefix + waiterPart + key + ownerSep }
func wakeChannel(prefix, id string) string    { return prefix + ":wake:" + id }
func holderChannel(prefix, key string) string { return lockKey(prefix, key) + holderPart }

// LockKey returns the Redis key, on every node, that holds the lock named key: the
// prefix, ":lock", the byte 0x1f and the key (see the key layout above).
func (b *Backend) LockKey(key string) string { return lockKey(b.cfg.prefix, key) }

// FenceKey returns the Redis key, on every node, that holds the fencing counter of key.
func (b *Backend) FenceKey(key string) string { return fenceKey(b.cfg.prefix, key) }

// keys returns the KEYS of the acquire and inspect scripts: lock, fence, wait set,
// readers, readers' data.
func (b *Backend) keys(key string) []string {
	p := b.cfg.prefix
	return []string{lockKey(p, key), fenceKey(p, key), waitSetKey(p, key), readersKey(p, key), readerDataKey(p, key)}
}

// grantKeys returns the KEYS of the commit and refresh scripts: lock, fence,
// readers, readers' data.
func (b *Backend) grantKeys(key string) []string {
	p := b.cfg.prefix
	return []string{lockKey(p, key), fenceKey(p, key), readersKey(p, key), readerDataKey(p, key)}
}

// valueKeys returns the KEYS of set_value.lua: lock, readers, readers' data.
func (b *Backend) valueKeys(key string) []string {
	p := b.cfg.prefix
	return []string{lockKey(p, key), readersKey(p, key), readerDataKey(p, key)}
}

// releaseKeys returns the KEYS of the release scripts: lock, wait set, fence,
// readers, readers' data.
func (b *Backend) releaseKeys(key string) []string {
	p := b.cfg.prefix
	return []string{lockKey(p, key), waitSetKey(p, key), fenceKey(p, key), readersKey(p, key), readerDataKey(p, key)}
}

// withdrawKeys returns the KEYS of withdraw.lua: wait set, lock, fence, readers,
// readers' data.
func (b *Backend) withdrawKeys(key string) []string {
	p := b.cfg.prefix
	return []string{waitSetKey(p, key), lockKey(p, key), fenceKey(p, key), readersKey(p, key), readerDataKey(p, key)}
}

func (b *Backend) waiterPrefix(key string) string { return waiterPrefix(b.cfg.prefix, key) }
