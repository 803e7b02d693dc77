package redlock

import "github.com/redis/go-redis/v9"

// Key layout on every node, for a lock named K under prefix P (0x1f is the ASCII
// unit separator):
//
//	P:lock 0x1f K     string  "OWNER" or "OWNER TOKEN": the holder on this node and,
//	                          once the fencing token is known, the token; TTL = the
//	                          lease TTL
//	P:fence 0x1f K    string  this node's fencing counter: the largest token it
//	                          accepted; no TTL, it must outlive every lock (see the
//	                          package documentation)
//	P:wait 0x1f K     zset    owner ids of waiters, scored by when they started
//	                          waiting (their client's clock, ms), oldest first
//	P:waiter 0x1f K 0x1f OWNER
//	                  string  the waiter's client wake-up channel; its TTL is the
//	                          waiter's patience, renewed by each of its attempts
//	P:floor 0x1f K    string  the benchmark floor's lock (Backend.FloorCycle)
//
// A client's wake-up channel is P:wake:ID; a release publishes "NONCE OWNER K" on
// the channel of the waiter it wakes.
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
// Owner ids never contain a space (driver.ValidateOwner), so "OWNER TOKEN" splits
// unambiguously and cannot be forged by a crafted owner id. Keys and values travel as
// KEYS and ARGV, never inside the script text, so any key is safe. Waiter keys are
// computed inside the scripts, from the waiter key prefix the client passes, which
// suits independent masters, not Redis Cluster.

const (
	lockPart   = ":lock\x1f"
	fencePart  = ":fence\x1f"
	waitPart   = ":wait\x1f"
	waiterPart = ":waiter\x1f"
	floorPart  = ":floor\x1f"
	ownerSep   = "\x1f"
)

func lockKey(prefix, key string) string      { return prefix + lockPart + key }
func fenceKey(prefix, key string) string     { return prefix + fencePart + key }
func waitSetKey(prefix, key string) string   { return prefix + waitPart + key }
func floorKey(prefix, key string) string     { return prefix + floorPart + key }
func waiterPrefix(prefix, key string) string { return prefix + waiterPart + key + ownerSep }
func wakeChannel(prefix, id string) string   { return prefix + ":wake:" + id }

// luaCommon holds helpers shared by the scripts. fence() reads this node's counter;
// a missing counter (a new key, or a node that restarted without its data) starts
// from the server clock in microseconds, so that it is very likely above every token
// issued before the loss (a fallback: the fencing argument does not rely on it).
const luaCommon = `
local function fence()
  local c = redis.call('GET', KEYS[2])
  if c then return tonumber(c) end
  local t = redis.call('TIME')
  local n = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('SET', KEYS[2], string.format('%d', n))
  return n
end
local function holder(v)
  local sp = string.find(v, ' ', 1, true)
  if sp then return string.sub(v, 1, sp - 1), tonumber(string.sub(v, sp + 1)) end
  return v, 0
end
`

// acquireScript is phase one of an acquire on one node.
// KEYS: lock, fence, wait. ARGV: owner, ttl ms, proposal (a token to accept if it is
// above this node's counter, or 0), wait (0: no; 1: record the owner as a waiter if
// the key is held; 2: the same, and an earlier attempt may have recorded it, so a
// grant removes it), patience ms, waiter key prefix, wake channel, waiting since (ms),
// reenter (1: the request says Reenter, see driver.Request; 0: an owner that holds
// the key here is refused like another owner, and not recorded as a waiter, because
// the same owner id may be in use by another client or process).
// Returns {status, counter, x}:
//
//	{1, c, p}    the lock was free and is now the owner's; c is the counter before;
//	             p is the proposal if it was accepted (counter and lock now carry
//	             it), else 0
//	{2, c, t}    the owner already held it here and reenter is 1 (re-entry): TTL
//	             extended; t is the token recorded with it, 0 if none
//	{0, c, pttl, r}
//	             held by another owner; c is the counter (0 if missing); pttl its
//	             remaining TTL in ms (-1 if unknown); r the owner's rank in the
//	             wait set (0: oldest), -1 if it is not there. With wait=1 or 2 the
//	             owner is recorded as a waiter.
var acquireScript = redis.NewScript(luaCommon + `
local owner = ARGV[1]
local v = redis.call('GET', KEYS[1])
local function leave()
  if ARGV[4] == '2' then
    redis.call('ZREM', KEYS[3], owner)
    redis.call('DEL', ARGV[6] .. owner)
  end
end
if not v then
  local c = fence()
  leave()
  local p = tonumber(ARGV[3])
  if p > c then
    redis.call('SET', KEYS[2], ARGV[3])
    redis.call('SET', KEYS[1], owner .. ' ' .. ARGV[3], 'PX', ARGV[2])
    return {1, c, p}
  end
  redis.call('SET', KEYS[1], owner, 'PX', ARGV[2])
  return {1, c, 0}
end
local h, t = holder(v)
if h == owner and ARGV[9] ~= '1' then
  return {0, tonumber(redis.call('GET', KEYS[2]) or '0'), redis.call('PTTL', KEYS[1]), -1}
end
if h == owner then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  leave()
  return {2, fence(), t}
end
if ARGV[4] ~= '0' then
  redis.call('SET', ARGV[6] .. owner, ARGV[7], 'PX', ARGV[5])
  redis.call('ZADD', KEYS[3], 'NX', ARGV[8], owner)
  if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[5]) then
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
  end
end
return {0, tonumber(redis.call('GET', KEYS[2]) or '0'), redis.call('PTTL', KEYS[1]),
  redis.call('ZRANK', KEYS[3], owner) or -1}
`)

// commitScript is phase two: it offers token t to a node that granted the lock.
// KEYS: lock, fence. ARGV: owner, t.
// Returns 0 when accepted (t was above the counter; counter and lock now carry t),
// the counter when t is not above it (rejected), -1 when the owner no longer holds
// the lock here.
var commitScript = redis.NewScript(luaCommon + `
local v = redis.call('GET', KEYS[1])
if not v then return -1 end
if holder(v) ~= ARGV[1] then return -1 end
local c = fence()
if tonumber(ARGV[2]) <= c then return c end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], 'KEEPTTL')
return 0
`)

// refreshScript extends the owner's lock on one node.
// KEYS: lock, fence. ARGV: owner, ttl ms, token (0 if unknown), reset (0/1).
// Returns 1 when extended, 0 when another owner holds it, -1 when the key is absent
// (with reset=1 it is then re-created for the owner and 2 is returned). A known token
// also raises the node's counter to it, repairing a counter lost in a restart.
var refreshScript = redis.NewScript(luaCommon + `
local tok = tonumber(ARGV[3])
local function repair()
  if tok > 0 and fence() < tok then redis.call('SET', KEYS[2], ARGV[3]) end
end
local v = redis.call('GET', KEYS[1])
if not v then
  if ARGV[4] ~= '1' then return -1 end
  local val = ARGV[1]
  if tok > 0 then val = val .. ' ' .. ARGV[3] end
  if not redis.call('SET', KEYS[1], val, 'NX', 'PX', ARGV[2]) then return 0 end
  repair()
  return 2
end
if holder(v) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
repair()
return 1
`)

// luaWake wakes the oldest live waiter of this node, if any: it publishes on the
// waiter's client channel, dropping waiters whose place lapsed on the way. The woken
// waiter keeps its place until it gets the lock or withdraws, so if another client
// beats it to the key it is first again at the next release.
// KEYS[2]: wait set. ARGV[2]: waiter key prefix, ARGV[3]: nonce (the same on every
// node for one release), ARGV[4]: the lock name. Returns the owner woken, or nil.
const luaWake = `
local function wake()
  while true do
    local h = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not h then return nil end
    local ch = redis.call('GET', ARGV[2] .. h)
    if ch then
      redis.call('PUBLISH', ch, ARGV[3] .. ' ' .. h .. ' ' .. ARGV[4])
      return h
    end
    redis.call('ZREM', KEYS[2], h)
  end
end
`

// releaseScript deletes the owner's lock on one node and wakes a waiter.
// KEYS: lock, wait. ARGV: owner, waiter key prefix, nonce, lock name. Returns the
// owner id of the waiter woken, else 1 if released, 0 if not held.
var releaseScript = redis.NewScript(luaWake + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local sp = string.find(v, ' ', 1, true)
if sp then v = string.sub(v, 1, sp - 1) end
if v ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  local w = wake()
  if w then return w end
end
return 1
`)

// forceReleaseScript deletes the lock whatever its owner and wakes a waiter.
// KEYS: lock, wait. ARGV: unused, waiter key prefix, nonce, lock name. Returns 1 if
// a lock was deleted, 0 if there was none.
var forceReleaseScript = redis.NewScript(luaWake + `
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then wake() end
return 1
`)

// withdrawScript gives up a waiter's place. KEYS: wait. ARGV: owner, waiter key prefix.
var withdrawScript = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', ARGV[2] .. ARGV[1])
return 1
`)

// inspectScript reads one node's view. KEYS: lock, fence, wait. ARGV: waiter key
// prefix. Returns {value or false, pttl, counter or '0', live waiters}.
var inspectScript = redis.NewScript(`
local live = 0
for _, h in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  if redis.call('EXISTS', ARGV[1] .. h) == 1 then live = live + 1 end
end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]) or '0', live}
`)
