package redislock

import "github.com/redis/go-redis/v9"

// Key layout, for a lock named K under prefix P:
//
//	P:lock:K         string  the holder's owner id, with the lease TTL (PX), then
//	                         space-separated marks: " hCHANNEL" when a release
//	                         handed the key to a queued waiter whose client
//	                         listens on CHANNEL and the owner has not been seen
//	                         by the server since; " qN" when waiters queued (or
//	                         may have: a handed grant always has it), N being
//	                         the length of P, so that release needs no more
//	                         than the lock key and the owner
//	P:token:K        string  last fencing token issued for K; no TTL
//	P:queue:K        list    owner ids of queued waiters, oldest first
//	P:waiter:K:OWNER string  "SEQ TTL CHANNEL": the number of the waiter's latest
//	                         attempt, the TTL in ms of the grant it asked for, and
//	                         its client's channel; the key's own TTL is the
//	                         place's patience, renewed by each attempt
//	P:wake:ID        channel one per client: handoff messages
//	                         "OWNER TOKEN SEQ TTL K"
//
// The uncontended path costs little more than the least correct lock: acquire is SET
// NX PX plus PEXPIRETIME and INCR of the token counter, release is GET plus DEL, each one script call
// with few arguments. Queue work happens only when someone waits: the queue and
// waiter keys are derived inside the scripts from the prefix (which the client passes
// only where needed), so the layout suits a single Redis instance, not Redis Cluster.
// Owner ids and prefixes cannot contain spaces, so the marks cannot be forged; a
// channel is the prefix, ":wake:" and 24 hex digits.

// luaToken issues the next fencing token of a key at a grant, right after the lock key
// was set to expire ttl ms from now: max(last+1, server clock in ms x 1000), kept in
// the counter. The clock term keeps tokens rising where the counter went back: a
// restart that lost it, or a promoted replica that had not received its last
// increments (the clock has moved on since those were issued, unless it was set back).
// The counter term keeps them strictly rising within a millisecond (up to 1000 grants
// in one before the counter runs ahead of the clock) and under a clock set back. The
// clock is read from the lock key's expiry (PEXPIRETIME, Redis 7.0) rather than TIME,
// which costs a script about a microsecond more; the counter is written again only
// when the millisecond has moved on past it.
const luaToken = `
local function token(lock, tk, ttl)
  local now = (redis.call('PEXPIRETIME', lock) - tonumber(ttl)) * 1000
  local n = redis.call('INCR', tk)
  if n < now then
    n = now
    redis.call('SET', tk, string.format('%d', n))
  end
  return n
end
`

// luaHandOff grants a lock that is being freed to the first live queued waiter (its
// place names the TTL it asked for), issues its token and publishes the grant on the
// waiter's channel, dropping dead places on the way; with no live waiter it deletes
// the lock.
const luaHandOff = luaToken + `
local function hand_off(lock, prefix, key)
  local queue = prefix .. ':queue:' .. key
  local wp = prefix .. ':waiter:' .. key .. ':'
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
        local n = token(lock, prefix .. ':token:' .. key, ttl)
        redis.call('PUBLISH', ch, h .. ' ' .. string.format('%d', n) .. ' ' .. seq .. ' ' .. ttl .. ' ' .. key)
        return
      end
    end
  end
end
`

// acquireScript makes one attempt.
// KEYS: lock, token. ARGV: owner, ttl ms, and for a waiting attempt
// "Q PATIENCE SEQ CHANNEL": Q is "q" when an earlier attempt of this wait queued (else
// "-"), PATIENCE the place's lifetime in ms, SEQ the attempt's number.
// Returns the token (> 0) on success; when held, -(pttl+1) with the remaining TTL
// in ms, or -1 when that is unknown; 0 when the owner holds the key but the token
// counter is gone.
var acquireScript = redis.NewScript(luaToken + `
local owner, w = ARGV[1], ARGV[3]
if (not w or string.byte(w, 1) ~= 113) and redis.call('SET', KEYS[1], owner, 'NX', 'PX', ARGV[2]) then
  -- The fast path: a free key and a caller that is not in the queue.
  return token(KEYS[1], KEYS[2], ARGV[2])
end
local v = redis.call('GET', KEYS[1])
if v and (v == owner or string.sub(v, 1, #owner + 1) == owner .. ' ') then
  -- Re-entry, resume, or a grant handed to this owner: once the server has seen
  -- the owner, the handed mark goes, so that a waiter of the same owner elsewhere
  -- that gives up does not release it.
  if string.find(v, ' h', 1, true) then
    redis.call('SET', KEYS[1], (string.gsub(v, ' h%S+', '')), 'PX', ARGV[2])
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if w then
  local _, pat, seq, ch = string.match(w, '^(%S) (%d+) (%d+) (%S+)$')
  local prefix = string.sub(ch, 1, -31)
  local key = string.sub(KEYS[1], #prefix + 7)
  local queue = prefix .. ':queue:' .. key
  local wk = prefix .. ':waiter:' .. key .. ':' .. owner
  if not v then
    -- Free (the holder's grant expired) and we are queued: take it and leave.
    redis.call('LREM', queue, 1, owner)
    redis.call('DEL', wk)
    local nv = owner
    if redis.call('LLEN', queue) > 0 then nv = owner .. ' q' .. #prefix end
    redis.call('SET', KEYS[1], nv, 'PX', ARGV[2])
    return token(KEYS[1], KEYS[2], ARGV[2])
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
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then return -pttl - 1 end
return -1
`)

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
local wk = prefix .. ':waiter:' .. key .. ':' .. owner
local e = redis.call('GET', wk)
if not e or string.sub(e, -#ch - 1) == ' ' .. ch then
  -- Our place (a waiter of the same owner on another client keeps its own).
  redis.call('LREM', prefix .. ':queue:' .. key, 0, owner)
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

// inspectScript reads the holder. KEYS: lock, token. ARGV: prefix.
// Returns {owner, pttl, token, live waiters}, or false when nobody holds the lock.
var inspectScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
local key = string.sub(KEYS[1], #ARGV[1] + 7)
local wp = ARGV[1] .. ':waiter:' .. key .. ':'
local live = 0
for _, h in ipairs(redis.call('LRANGE', ARGV[1] .. ':queue:' .. key, 0, -1)) do
  if redis.call('EXISTS', wp .. h) == 1 then live = live + 1 end
end
return {string.match(v, '^%S+'), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0', live}
`)
