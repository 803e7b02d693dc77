package redislock

import (
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Key layout, for a lock named K under prefix P (0x1f is the ASCII unit separator,
// \31 in Lua):
//
//	P:lock 0x1f K    string  the holder's owner id, with the lease TTL (PX), then
//	                         space-separated marks: " hCHANNEL" when a release
//	                         handed the key to a queued waiter whose client
//	                         listens on CHANNEL and the owner has not been seen
//	                         by the server since; " qN" when waiters queued (or
//	                         may have: a handed grant always has it), N being
//	                         the length of P, so that release needs no more
//	                         than the lock key and the owner
//	P:lock 0x1f K 0x1f token
//	                 string  last fencing token issued for K; no TTL. Its name is
//	                         the lock key's and a suffix, so the scripts derive it
//	                         from the lock key without another argument (each
//	                         costs every call).
//	P:queue 0x1f K   list    owner ids of queued waiters, oldest first
//	P:waiter 0x1f K 0x1f OWNER
//	                 string  "SEQ TTL CHANNEL": the number of the waiter's latest
//	                         attempt, the TTL in ms of the grant it asked for, and
//	                         its client's channel; the key's own TTL is the
//	                         place's patience, renewed by each attempt
//	P:floor 0x1f K   string  the benchmark floor's lock (Backend.FloorCycle)
//	P:wake:ID        channel one per client: handoff messages
//	                         "OWNER TOKEN SEQ TTL K"
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
// channel ends in ID, 24 hex digits, so it too names its prefix. Key names still
// start with "P:", so an ACL key pattern P:* covers a prefix's keys.
//
// The uncontended path costs little more than the least correct lock: acquire is SET
// NX PX plus PEXPIRETIME and INCR of the token counter, release is GET plus DEL, each one script call
// with few arguments. Queue work happens only when someone waits: the queue and
// waiter keys are derived inside the scripts from the prefix (which the client passes
// only where needed, or which the scripts read from the channel and the " qN" mark:
// the key starts len(":lock")+1 = 6 bytes after the prefix), so the layout suits a
// single Redis instance, not Redis Cluster.
// Owner ids and prefixes cannot contain spaces, so the marks cannot be forged; a
// channel is the prefix, ":wake:" and 24 hex digits.

// Key names. The scripts derive the same names with Lua literals of their own
// (':queue\31', ':waiter\31', '\31'), and find the key in a lock key 6 bytes after
// the prefix, the length of lockPart; the tests check that the two agree.
const (
	lockPart   = ":lock\x1f"
	queuePart  = ":queue\x1f"
	waiterPart = ":waiter\x1f"
	floorPart  = ":floor\x1f"
	ownerSep   = "\x1f"
)

func lockKey(prefix, key string) string    { return prefix + lockPart + key }
func queueKey(prefix, key string) string   { return prefix + queuePart + key }
func floorKey(prefix, key string) string   { return prefix + floorPart + key }
func wakeChannel(prefix, id string) string { return prefix + ":wake:" + id }
func waiterKey(prefix, key, owner string) string {
	return prefix + waiterPart + key + ownerSep + owner
}

// tokenSuffix ends a lock key to name its token counter (see the key layout above),
// and luaTokenSuffix is the same as a Lua string literal.
const (
	tokenSuffix    = "\x1ftoken"
	luaTokenSuffix = `'\31token'`
)

// tokenLua returns Lua statements that issue the next fencing token of a key at a
// grant, right after the lock key (the Lua expression lock) was set to expire ttl ms
// from now, into the local n declared before them: max(last+1, server clock in ms x
// 1000), kept in the counter (the key tk). The clock term keeps tokens rising where the
// counter went back: a restart that lost it, or a promoted replica that had not
// received its last increments (the clock has moved on since those were issued, unless
// it was set back). The counter term keeps them strictly rising within a millisecond
// (up to 1000 grants in one before the counter runs ahead of the clock) and under a
// clock set back. The clock is read from the lock key's expiry (PEXPIRETIME, Redis
// 7.0) rather than TIME, which costs a script about a microsecond more; the counter
// is written again only when the millisecond has moved on past it.
//
// The uncontended acquire inlines these statements rather than calling luaToken's
// function: a Lua function statement makes a closure each time a script runs it.
func tokenLua(lock, tk, ttl string) string {
	return `
  n = redis.call('INCR', ` + tk + `)
  local now = (redis.call('PEXPIRETIME', ` + lock + `) - ` + ttl + `) * 1000
  if n < now then
    n = now
    redis.call('SET', ` + tk + `, string.format('%d', n))
  end
`
}

// luaToken defines token(lock, tk, ttl), which runs tokenLua's statements and
// returns the token.
var luaToken = `
local function token(lock, tk, ttl)
  local n` + tokenLua("lock", "tk", "ttl") + `  return n
end
`

// luaHandOff grants a lock that is being freed to the first live queued waiter (its
// place names the TTL it asked for), issues its token and publishes the grant on the
// waiter's channel, dropping dead places on the way; with no live waiter it deletes
// the lock.
var luaHandOff = luaToken + `
local function hand_off(lock, prefix, key)
  local queue = prefix .. ':queue\31' .. key
  local wp = prefix .. ':waiter\31' .. key .. '\31'
  while true do
    local h = redis.call('LPOP', queue)
    if not h then
      redis.call('DEL', lock)
      return
    end
    local e = redis.call('GETDEL', wp .. h)
    if e then
      local seq, ttl, ch = string.match(e, '^(%d+) (%d+) (%S+)$')
      if ch then
        -- Marked queued whether or not others wait: its release looks.
        redis.call('SET', lock, h .. ' h' .. ch .. ' q' .. #prefix, 'PX', ttl)
        local n = token(lock, lock .. ` + luaTokenSuffix + `, ttl)
        redis.call('PUBLISH', ch, h .. ' ' .. string.format('%d', n) .. ' ' .. seq .. ' ' .. ttl .. ' ' .. key)
        return
      end
    end
  end
end
`

// luaTakeFree is the acquire's fast path: a free key is set to the owner and
// granted with the next token. cond is empty or a Lua condition ending in "and "
// that must hold as well (the generic script's: the caller is not in the queue). The TTL is given as two Lua
// expressions: ttlArg for command arguments, ttlNum for arithmetic (a script with
// the TTL written in passes a string to the command and a number to the
// arithmetic, each the cheaper there).
func luaTakeFree(cond, ttlArg, ttlNum string) string {
	return `if ` + cond + `redis.call('SET', KEYS[1], owner, 'NX', 'PX', ` + ttlArg + `) then
  local n` + tokenLua("KEYS[1]", "KEYS[1] .. "+luaTokenSuffix, ttlNum) + `  return n
end
`
}

// luaReenter reads the holder into v and, if it is the owner, either refuses like
// luaHeld, changing nothing, or, when the Lua condition may holds, extends the
// grant to ttl (a Lua expression) and returns its token. may is true when the
// request says Reenter (driver.Request: the caller may hold the grant, or resumes
// it); the waiting attempt's adds a grant handed to this client's own queued place
// (its channel in the handed mark). An owner id may be in use by another client or
// process, which must not take over the holder's grant nor keep it alive.
func luaReenter(ttl, may string) string {
	return `local v = redis.call('GET', KEYS[1])
if v and (v == owner or string.sub(v, 1, #owner + 1) == owner .. ' ') then
  if not (` + may + `) then
    ` + strings.ReplaceAll(luaHeld, "\n", "\n    ") + `  end
  -- Re-entry, resume, or a grant handed to this owner: once the server has seen
  -- the owner, the handed mark goes, so that a waiter of the same owner elsewhere
  -- that gives up does not release it.
  if string.find(v, ' h', 1, true) then
    redis.call('SET', KEYS[1], (string.gsub(v, ' h%S+', '')), 'PX', ` + ttl + `)
  else
    redis.call('PEXPIRE', KEYS[1], ` + ttl + `)
  end
  return tonumber(redis.call('GET', KEYS[1] .. ` + luaTokenSuffix + `) or '0')
end
`
}

// luaHeld ends an attempt that found the key held.
const luaHeld = `local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then return -pttl - 1 end
return -1
`

// acquireScript makes one attempt.
// KEYS: lock. ARGV: owner, ttl ms, for a waiting attempt "Q PATIENCE SEQ CHANNEL"
// (else ""): Q is "q" when an earlier attempt of this wait queued (else "-"),
// PATIENCE the place's lifetime in ms, SEQ the attempt's number; and "x" when the
// request does not say Reenter (see luaReenter), absent when it does.
// Returns the token (> 0) on success; when held, -(pttl+1) with the remaining TTL
// in ms, or -1 when that is unknown; 0 when the owner holds the key but the token
// counter is gone.
var acquireScript = redis.NewScript(`local owner, w = ARGV[1], ARGV[3]
if w == '' then w = nil end
` + luaTakeFree("(not w or string.byte(w, 1) ~= 113) and ", "ARGV[2]", "ARGV[2]") + luaToken +
	luaReenter("ARGV[2]", "not ARGV[4] or w and string.find(v .. ' ', ' h' .. string.match(w, '(%S+)$') .. ' ', 1, true)") +
	`if w then
  local _, pat, seq, ch = string.match(w, '^(%S) (%d+) (%d+) (%S+)$')
  local prefix = string.sub(ch, 1, -31)
  local key = string.sub(KEYS[1], #prefix + 7)
  local queue = prefix .. ':queue\31' .. key
  local wk = prefix .. ':waiter\31' .. key .. '\31' .. owner
  if not v then
    -- Free (the holder's grant expired) and we are queued: take it and leave.
    redis.call('LREM', queue, 1, owner)
    redis.call('DEL', wk)
    local nv = owner
    if redis.call('LLEN', queue) > 0 then nv = owner .. ' q' .. #prefix end
    redis.call('SET', KEYS[1], nv, 'PX', ARGV[2])
    return token(KEYS[1], KEYS[1] .. ` + luaTokenSuffix + `, ARGV[2])
  end
  local old = redis.call('SET', wk, seq .. ' ' .. ARGV[2] .. ' ' .. ch, 'PX', pat, 'GET')
  if not old and not redis.call('LPOS', queue, owner) then
    redis.call('RPUSH', queue, owner)
  end
  redis.call('PEXPIRE', queue, pat)
  if not string.find(v, ' q', 1, true) then
    redis.call('SET', KEYS[1], v .. ' q' .. #prefix, 'KEEPTTL')
  end
end
` + luaHeld)

// tryScriptSource is the source of a plain (not waiting) attempt for one TTL, in ms,
// written into the script: acquireScript without a waiting attempt's argument and
// with the TTL a constant rather than an argument, which costs the uncontended cycle
// about 1% less (each argument of a script call is server work). Replies as
// acquireScript; KEYS: lock; ARGV: owner, and "x" when the request does not say
// Reenter (absent when it does, as with the default generated owner ids, so the
// usual attempt has no more arguments than before).
func tryScriptSource(ttl int64) string {
	n := strconv.FormatInt(ttl, 10)
	return `local owner = ARGV[1]
` + luaTakeFree("", "'"+n+"'", n) + luaReenter("'"+n+"'", "not ARGV[2]") + luaHeld
}

// refreshScript extends the owner's grant. KEYS: lock. ARGV: owner, ttl ms.
var refreshScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript frees the owner's grant, handing it to the next waiter if any.
// KEYS: lock. ARGV: owner. Returns 0 when the owner did not hold it.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if not v or string.sub(v, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ' then return 0 end
local n = string.match(v, ' q(%d+)')
if not n then
  redis.call('DEL', KEYS[1])
  return 1
end
` + luaHandOff + `
local prefix = string.sub(KEYS[1], 1, tonumber(n))
hand_off(KEYS[1], prefix, string.sub(KEYS[1], #prefix + 7))
return 1
`)

// withdrawScript gives up a waiter's place and passes on a grant handed to it (which
// its client never used), or a lock that is free while others wait.
// KEYS: lock. ARGV: owner, prefix, the waiter's channel.
var withdrawScript = redis.NewScript(luaHandOff + `
local owner, prefix, ch = ARGV[1], ARGV[2], ARGV[3]
local key = string.sub(KEYS[1], #prefix + 7)
local wk = prefix .. ':waiter\31' .. key .. '\31' .. owner
local e = redis.call('GET', wk)
if not e or string.sub(e, -#ch - 1) == ' ' .. ch then
  -- Our place (a waiter of the same owner on another client keeps its own).
  redis.call('LREM', prefix .. ':queue\31' .. key, 0, owner)
  if e then redis.call('DEL', wk) end
end
local v = redis.call('GET', KEYS[1])
local m = owner .. ' h' .. ch
if not v or v == m or string.sub(v, 1, #m + 1) == m .. ' ' then
  hand_off(KEYS[1], prefix, key)
end
return 1
`)

// forceReleaseScript frees the lock whatever its owner, handing it to the next
// waiter if any. KEYS: lock. ARGV: prefix. Returns 0 when the lock was not held.
var forceReleaseScript = redis.NewScript(luaHandOff + `
if not redis.call('GET', KEYS[1]) then return 0 end
hand_off(KEYS[1], ARGV[1], string.sub(KEYS[1], #ARGV[1] + 7))
return 1
`)

// inspectScript reads the holder. KEYS: lock. ARGV: prefix.
// Returns {owner, pttl, token, live waiters}, or false when nobody holds the lock.
var inspectScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
local key = string.sub(KEYS[1], #ARGV[1] + 7)
local wp = ARGV[1] .. ':waiter\31' .. key .. '\31'
local live = 0
for _, h in ipairs(redis.call('LRANGE', ARGV[1] .. ':queue\31' .. key, 0, -1)) do
  if redis.call('EXISTS', wp .. h) == 1 then live = live + 1 end
end
return {string.match(v, '^%S+'), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1] .. ` + luaTokenSuffix + `) or '0', live}
`)
