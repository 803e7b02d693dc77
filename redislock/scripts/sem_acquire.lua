-- sem_acquire.lua: one attempt to take a permit of a semaphore (a limit N > 1; see
-- sem.lua for the hash that keeps the holders).
-- KEYS[1]  the lock key (P:lock 0x1f K)
-- ARGV[1]  the owner id
-- ARGV[2]  the TTL of the grant, in ms
-- ARGV[3]  the limit N
-- ARGV[4]  the key prefix P
-- ARGV[5]  for a waiting attempt "Q PATIENCE SEQ CHANNEL" (as for acquire.lua),
--          else ""
-- ARGV[6]  "x" when the request does not say Reenter, else ""
-- ARGV[7]  the value of the grant (any bytes, not empty); absent for none
-- Returns the token (> 0) when granted; when every permit is held (or free ones
-- are owed to places queued ahead), -(ms + 1) with the time in ms until the first
-- holder's grant expires; "limit M" when the key is held, or waited for, with
-- another limit M (1: as a mutex), changing nothing. A grant publishes on the
-- holder channel.
--#include names.lua
--#include sem.lua
local lock, owner, ttl, limit, prefix, w, val = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[7]
if w == '' then w = nil end
local key = string.sub(lock, #prefix + #LOCK + 1)
local queue = prefix .. QUEUE .. key
local wp = prefix .. WAITER .. key .. SEP
local now = sem_now()
local t = redis.call('TYPE', lock)['ok']
-- A mutex holds the key.
if t == 'string' then return 'limit 1' end
local have, hs, plen = nil, {}, nil
if t == 'hash' then have, plen, hs = sem_state(lock, now) end
if not have then
  -- No semaphore state: places queued without a lock key are a mutex's, whose
  -- holder's grant expired.
  if sem_places(queue, wp) > 0 then return 'limit 1' end
elseif have ~= limit then
  if #hs > 0 or sem_places(queue, wp) > 0 then return 'limit ' .. have end
  have = nil -- neither holders nor queued places: the new limit applies
end
if not have then
  if t == 'hash' then redis.call('DEL', lock) end
  hs = {}
  redis.call('HSET', lock, LIMITF, limit .. ' ' .. #prefix)
end

-- The reply of an attempt that found every permit taken.
local function held()
  local first
  for _, h in ipairs(hs) do
    if not first or h[2] < first then first = h[2] end
  end
  if first then return -(first - now) - 1 end
  return -1
end

for _, h in ipairs(hs) do
  if h[1] == owner then
    -- As for a mutex (acquire.lua): only Reenter, or the claim of a permit handed
    -- to this client's own queued place, may take the grant over; the request's
    -- value replaces the grant's.
    local may = ARGV[6] ~= 'x'
    if not may and w then may = h[4] == string.match(w, '(%S+)$') end
    if not may then return held() end
    local exp = now + ttl
    redis.call('HSET', lock, owner, sem_rec(exp, h[3], '-', val))
    sem_extend(lock, exp)
    if val or h[5] ~= '' then redis.call('PUBLISH', lock .. HOLDER, '') end
    return tonumber(h[3])
  end
end

-- Free permits go to the places queued ahead first (their clients are told), then
-- to this attempt if one is left.
local me = nil
if w then me = owner end
local free, mine = sem_pump(lock, queue, wp, key, limit - #hs, me, now)
if mine or free > 0 then
  local exp = now + ttl
  local n = sem_token(lock, now)
  redis.call('HSET', lock, owner, sem_rec(exp, n, '-', val))
  sem_extend(lock, exp)
  redis.call('PUBLISH', lock .. HOLDER, '')
  return tonumber(n)
end
if w then
  -- Keep the place, as acquire.lua does; the hash lives at least as long, so the
  -- limit stays with the key while the place does.
  local _, pat, seq, ch = string.match(w, '^(%S) (%d+) (%d+) (%S+)$')
  local place = seq .. ' ' .. ttl .. ' ' .. ch
  if val then place = place .. ' ' .. val end
  local old = redis.call('SET', wp .. owner, place, 'PX', pat, 'GET')
  if not old and not redis.call('LPOS', queue, owner) then
    redis.call('RPUSH', queue, owner)
  end
  redis.call('PEXPIRE', queue, pat)
  sem_extend(lock, now + tonumber(pat))
end
return held()
