-- acquire.lua: one attempt to take a lock.
-- KEYS[1]  the lock key (P:lock 0x1f K)
-- ARGV[1]  the owner id
-- ARGV[2]  the TTL of the grant, in ms
-- ARGV[3]  for a waiting attempt "Q PATIENCE SEQ CHANNEL", else "" or absent: Q is
--          "q" when an earlier attempt of this wait queued (else "-"), PATIENCE the
--          queued place's lifetime in ms, SEQ the attempt's number, CHANNEL the
--          wake-up channel of the waiter's client (P:wake:ID)
-- ARGV[4]  "x" when the request does not say Reenter; "" or absent when it does
-- ARGV[5]  the value of the grant (any bytes, not empty); absent for none
-- Returns the token (> 0) when granted; when the key is held, -(pttl + 1) with its
-- remaining TTL in ms, or -1 when that is unknown; 0 when the owner holds the key
-- but the token counter is gone; "limit N" when the key is a semaphore of N
-- permits (sem.lua) with holders or queued places, changing nothing; on a
-- read-write lock's hash (limit 1, sem.lua) what sem_acquire returns. A grant, and
-- a re-entry that sets or drops a value, publish on the holder channel.
--#include names.lua
local owner, ttl, w, val = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
if w == '' then w = nil end
-- The lock value of a new grant: the owner id, and the mark " v" if it has a value.
local nv = owner
if val then nv = owner .. ' v' end
-- An earlier attempt of this wait queued: a free key goes to the queue's head (the
-- waiting path below), not to whoever asks first.
local queued = w and string.sub(w, 1, 1) == 'q'
-- A plain attempt takes a free key with SET NX. A waiting one reads the key first
-- (below): the client sends one only for a key it found held lately, which most
-- often still is, and then the SET NX would be a call for nothing.
if not w and redis.call('SET', KEYS[1], nv, 'NX', 'PX', ttl) then
  local lk, n = KEYS[1], nil
--#include grant.lua
  return n
end
--#include token.lua

-- The reply of an attempt that found the key held.
local function held()
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then return -pttl - 1 end
  return -1
end

-- A hash is a semaphore's lock key (sem.lua): a GET of it fails, and pcall keeps
-- the cost of that check off the mutex path.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
--#include sem.lua
  local limit, prefix = sem_busy(KEYS[1], sem_now())
  if limit then
    -- Limit 1: a read-write lock's, which an exclusive attempt waits for as for a
    -- permit.
    if limit == 1 then return sem_acquire(KEYS[1], owner, tonumber(ttl), 1, false, prefix, w, ARGV[4], val) end
    return 'limit ' .. limit
  end
  -- A semaphore with neither holders nor queued places: the key is free.
  redis.call('DEL', KEYS[1])
  v = false
  if not w then
    redis.call('SET', KEYS[1], nv, 'PX', ttl)
    local lk, n = KEYS[1], nil
--#include grant.lua
    return n
  end
end
-- A waiting attempt that has not queued takes a free key as a plain one does.
if not v and w and not queued then
  redis.call('SET', KEYS[1], nv, 'PX', ttl)
  local lk, n = KEYS[1], nil
--#include grant.lua
  return n
end
-- The holder's value is its owner id, alone or followed by a space and marks.
if v and (v == owner or string.sub(v, 1, #owner + 1) == owner .. ' ') then
  -- An owner id may be in use by another client or process, which must not take
  -- over the holder's grant nor keep it alive: only a request that says Reenter,
  -- or a waiting attempt whose client's channel is in the handed mark (a grant
  -- handed to this client's own queued place), may re-enter.
  local may = ARGV[4] ~= 'x'
  if not may and w then
    local ch = string.match(w, '(%S+)$')
    may = string.find(v .. ' ', ' h' .. ch .. ' ', 1, true) ~= nil
  end
  if not may then return held() end
  -- Re-entry, resume, or a grant handed to this owner: once the server has seen
  -- the owner, the handed mark goes, so that a waiter of the same owner elsewhere
  -- that gives up does not release it. The request's value replaces the grant's.
  local had = string.find(v, ' v', 1, true)
  local mv = v
  if string.find(v, ' h', 1, true) then mv = string.gsub(v, ' h%S+', '') end
  if had and not val then
    mv = string.gsub(mv, ' v', '')
  elseif val and not had then
    mv = mv .. ' v'
  end
  redis.call('PEXPIRE', KEYS[1] .. TOKEN, ttl + RETAIN, 'GT')
  if mv ~= v then
    redis.call('SET', KEYS[1], mv, 'PX', ttl)
  else
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  if val then
    redis.call('SET', KEYS[1] .. VALUE, val, 'PXAT', redis.call('PEXPIRETIME', KEYS[1]))
  elseif had then
    redis.call('DEL', KEYS[1] .. VALUE)
  end
  if val or had then redis.call('PUBLISH', KEYS[1] .. HOLDER, '') end
  return tonumber(redis.call('GET', KEYS[1] .. TOKEN) or '0')
end
if w then
  local _, pat, seq, ch = string.match(w, '^(%S) (%d+) (%d+) (%S+)$')
  -- The channel is the prefix, ':wake:' and hex digits; the lock key is the
  -- prefix, LOCK and the key.
  local prefix = string.match(ch, '^(.*):wake:%x+$')
  local key = string.sub(KEYS[1], #prefix + #LOCK + 1)
  local queue = prefix .. QUEUE .. key
  local wk = prefix .. WAITER .. key .. SEP .. owner
  if not v then
    -- Free (the holder's grant expired) and we are queued: take it and leave.
    redis.call('LREM', queue, 1, owner)
    redis.call('DEL', wk)
    if redis.call('LLEN', queue) > 0 then nv = nv .. ' q' .. #prefix end
    redis.call('SET', KEYS[1], nv, 'PX', ttl)
    if val then redis.call('SET', KEYS[1] .. VALUE, val, 'PXAT', redis.call('PEXPIRETIME', KEYS[1])) end
    redis.call('PUBLISH', KEYS[1] .. HOLDER, '')
    return token(KEYS[1], ttl)
  end
  -- The place: the attempt's number, the TTL and value of the grant it asks
  -- for, and its client's channel, for a release to hand the key over.
  local place = seq .. ' ' .. ttl .. ' ' .. ch
  if val then place = place .. ' ' .. val end
  local old = redis.call('SET', wk, place, 'PX', pat, 'GET')
  if not old and not redis.call('LPOS', queue, owner) then
    redis.call('RPUSH', queue, owner)
  end
  redis.call('PEXPIRE', queue, pat)
  if not string.find(v, ' q', 1, true) then
    -- The mark " qN", N the length of the prefix, tells release that waiters
    -- queued and where the key starts in the lock key.
    redis.call('SET', KEYS[1], v .. ' q' .. #prefix, 'KEEPTTL')
  end
end
return held()
