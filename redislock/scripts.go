package redislock

import "github.com/redis/go-redis/v9"

// Key layout, for a lock named K under prefix P:
//
//	P:lock:K         string  the holder's owner id, with the lease TTL (PX); the
//	                         suffix " q" marks that waiters queued meanwhile; the
//	                         value "!OWNER" reserves a free lock for the queued
//	                         waiter OWNER, who was woken and is on its way
//	P:token:K        string  last fencing token issued for K; no TTL
//	P:queue:K        list    owner ids of queued waiters, oldest first
//	P:waiter:K:OWNER string  the waiter's wake-up channel; its TTL is the place's
//	                         patience, renewed by each of the waiter's attempts
//
// The uncontended path costs what the least correct lock costs: acquire is SET NX PX
// plus INCR of the token counter, release is GET plus DEL. Queue work happens only
// when someone waits. Waiter keys are computed inside the scripts, so the layout suits
// a single Redis instance, not Redis Cluster. Owner ids cannot contain " " or "!",
// so the markers cannot be forged.

// luaHandOff frees a lock with waiters: it reserves the lock for the first live
// waiter and publishes a wake-up on that waiter's channel, dropping dead places on
// the way; with no live waiter it deletes the lock.
const luaHandOff = `
local function hand_off(LOCK, QUEUE, WPREFIX, KEY)
  while true do
    local h = redis.call('LINDEX', QUEUE, 0)
    if not h then
      redis.call('DEL', LOCK)
      return
    end
    local ch = redis.call('GET', WPREFIX .. h)
    if ch then
      local left = redis.call('PTTL', WPREFIX .. h)
      if left < 100 then left = 100 end
      redis.call('SET', LOCK, '!' .. h, 'PX', left)
      redis.call('PUBLISH', ch, h .. ' ' .. KEY)
      return
    end
    redis.call('LPOP', QUEUE)
  end
end
`

// acquireScript makes one attempt.
// KEYS: lock, token, queue. ARGV: owner, ttl ms, wait (0/1), patience ms, waiter key
// prefix, wake channel, queued (1 if an earlier attempt of this wait queued).
// Returns the token (> 0) on success; when held, -(pttl+1) with the remaining TTL
// in ms, or -1 when that is unknown.
var acquireScript = redis.NewScript(`
local owner = ARGV[1]
if ARGV[7] ~= '1' and redis.call('SET', KEYS[1], owner, 'NX', 'PX', ARGV[2]) then
  -- The fast path, with no closures to build: a free key and a caller that is
  -- not in the queue.
  local n = redis.call('INCR', KEYS[2])
  if n > 1 then return n end
  local t = redis.call('TIME')
  n = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('SET', KEYS[2], string.format('%d', n))
  return n
end
local function token()
  local n = redis.call('INCR', KEYS[2])
  if n == 1 then
    -- A new or lost counter: continue from the server clock, in microseconds,
    -- so tokens stay above those issued before the loss.
    local t = redis.call('TIME')
    n = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', KEYS[2], string.format('%d', n))
  end
  return n
end
local function leave_queue()
  redis.call('LREM', KEYS[3], 1, owner)
  redis.call('DEL', ARGV[5] .. owner)
end
if ARGV[7] == '1' and redis.call('SET', KEYS[1], owner, 'NX', 'PX', ARGV[2]) then
  leave_queue()
  return token()
end
local v = redis.call('GET', KEYS[1])
if v == owner or v == owner .. ' q' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if v == '!' .. owner then
  leave_queue()
  local mark = ''
  if redis.call('LLEN', KEYS[3]) > 0 then mark = ' q' end
  redis.call('SET', KEYS[1], owner .. mark, 'PX', ARGV[2])
  return token()
end
if ARGV[3] == '1' then
  local old = redis.call('SET', ARGV[5] .. owner, ARGV[6], 'PX', ARGV[4], 'GET')
  if not old and not redis.call('LPOS', KEYS[3], owner) then
    redis.call('RPUSH', KEYS[3], owner)
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  if string.byte(v, 1) ~= 33 and string.sub(v, -2) ~= ' q' then
    redis.call('SET', KEYS[1], v .. ' q', 'KEEPTTL')
  end
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then return -pttl - 1 end
return -1
`)

// refreshScript extends the owner's grant. KEYS: lock. ARGV: owner, ttl ms.
var refreshScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == ARGV[1] .. ' q' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript frees the owner's grant and wakes the next waiter, if any.
// KEYS: lock, queue. ARGV: owner, waiter key prefix, key.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if v ~= ARGV[1] .. ' q' then return 0 end
` + luaHandOff + `
hand_off(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
return 1
`)

// withdrawScript gives up a waiter's place, passing a reservation for it on.
// KEYS: lock, queue. ARGV: owner, waiter key prefix, key.
var withdrawScript = redis.NewScript(luaHandOff + `
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('DEL', ARGV[2] .. ARGV[1])
if redis.call('GET', KEYS[1]) == '!' .. ARGV[1] then
  hand_off(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
end
return 1
`)

// forceReleaseScript frees the lock whatever its owner. KEYS: lock, queue.
// ARGV: waiter key prefix, key. Returns 0 when the lock was not held.
var forceReleaseScript = redis.NewScript(luaHandOff + `
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v, 1) == 33 then return 0 end
hand_off(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return 1
`)

// inspectScript reads the holder. KEYS: lock, token, queue. ARGV: waiter key prefix.
// Returns {owner, pttl, token, live waiters}, or false when nobody holds the lock.
var inspectScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v, 1) == 33 then return false end
if string.sub(v, -2) == ' q' then v = string.sub(v, 1, -3) end
local live = 0
for _, h in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  if redis.call('EXISTS', ARGV[1] .. h) == 1 then live = live + 1 end
end
return {v, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0', live}
`)
