-- sem.lua: the semaphore helpers (a lock acquired with a limit N > 1). Included by
-- other scripts, after names.lua and only on their semaphore paths (a function
-- statement makes a closure each time a script runs it).
--
-- A semaphore's lock key is a hash instead of a string, so the mutex scripts find
-- it with the GET they make anyway (a WRONGTYPE error, caught) and a mutex attempt
-- costs nothing more. Its fields:
--   LIMITF        "N PLEN": the limit, and the length of the prefix (as " qN" in
--                 a mutex's lock key: release finds the queue from the lock key)
--   OWNER         "EXP TOKEN MARK" or "EXP TOKEN MARK VALUE": the holder's expiry
--                 (server clock, ms since the epoch), its fencing token, "-" or the
--                 channel of a queued place the permit was handed to and whose
--                 client has not claimed it since, and its value (any bytes)
-- The hash expires with its last holder or queued place (whichever is later: each
-- grant, refresh and waiting attempt pushes its expiry out, never in); every
-- script drops the holders whose expiry has passed on the server's TIME.
local LIMITF = '\31limit'

-- The server clock in ms.
local function sem_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A holder's field value.
local function sem_rec(exp, tok, mark, val)
  local r = string.format('%d', exp) .. ' ' .. tok .. ' ' .. mark
  if val and val ~= '' then r = r .. ' ' .. val end
  return r
end

-- The hash's limit and prefix length (nil if it has none) and its live holders,
-- each {owner, expiry, token, mark, value}, oldest grant (lowest token) first;
-- expired holders are deleted.
local function sem_state(lock, now)
  local all = redis.call('HGETALL', lock)
  local limit, plen
  local hs = {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if f == LIMITF then
      local l, p = string.match(v, '^(%d+) (%d+)$')
      limit, plen = tonumber(l), tonumber(p)
    else
      local exp, tok, mark, val = string.match(v, '^(%d+) (%d+) (%S+) ?(.*)$')
      if exp and tonumber(exp) > now then
        hs[#hs + 1] = {f, tonumber(exp), tok, mark, val}
      else
        redis.call('HDEL', lock, f)
      end
    end
  end
  table.sort(hs, function(a, b) return tonumber(a[3]) < tonumber(b[3]) end)
  return limit, plen, hs
end

-- Pushes the hash's expiry out to at (ms), never in.
local function sem_extend(lock, at)
  if redis.call('PEXPIRETIME', lock) < at then redis.call('PEXPIREAT', lock, at) end
end

-- The next fencing token of the key, from the one sequence a mutex uses too (see
-- token.lua), with the clock term from TIME (a hash has no one expiry to read).
local function sem_token(lock, now)
  local tk = lock .. TOKEN
  local n = redis.call('INCR', tk)
  if n < now * 1000 then
    n = now * 1000
    redis.call('SET', tk, string.format('%d', n))
  end
  return string.format('%d', n)
end

-- The number of live places in the queue.
local function sem_places(queue, wp)
  local n = 0
  for _, h in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if redis.call('EXISTS', wp .. h) == 1 then n = n + 1 end
  end
  return n
end

-- Hands up to free permits to the queue's first live places, in order: each gets
-- the TTL and value its place asked for, a token, and the grant on its client's
-- channel as "OWNER TOKEN SEQ TTL KEY" (as a mutex handoff). Dead places at the
-- head are dropped. It stops at the place of me (an owner, or nil), which it
-- drops, returning the permits left and true when one is left for me; otherwise
-- it returns the permits left (more than 0 only if the queue ran out) and false.
local function sem_pump(lock, queue, wp, key, free, me, now)
  while true do
    local h = redis.call('LINDEX', queue, 0)
    if not h then return free, false end
    local e = redis.call('GET', wp .. h)
    local seq, ttl, ch, val
    if e then seq, ttl, ch, val = string.match(e, '^(%d+) (%d+) (%S+) ?(.*)$') end
    if ch and free == 0 then return 0, false end
    redis.call('LPOP', queue)
    if e then redis.call('DEL', wp .. h) end
    if ch and h == me then return free, true end
    -- An owner that holds a permit already (its id in use elsewhere) loses the
    -- place rather than its permit; its next attempt queues again.
    if ch and not redis.call('HGET', lock, h) then
      local exp = now + tonumber(ttl)
      local n = sem_token(lock, now)
      redis.call('HSET', lock, h, sem_rec(exp, n, ch, val))
      sem_extend(lock, exp)
      redis.call('PUBLISH', ch, h .. ' ' .. n .. ' ' .. seq .. ' ' .. ttl .. ' ' .. key)
      redis.call('PUBLISH', lock .. HOLDER, '')
      free = free - 1
    end
  end
end

-- After holders left (count live ones remain): hands the free permits to queued
-- places, and deletes the hash when it has neither holders nor a queue left.
local function sem_settle(lock, limit, plen, count, now)
  if not limit then
    if count == 0 then redis.call('DEL', lock) end
    return
  end
  local prefix = string.sub(lock, 1, plen)
  local key = string.sub(lock, plen + #LOCK + 1)
  local queue = prefix .. QUEUE .. key
  local left = sem_pump(lock, queue, prefix .. WAITER .. key .. SEP, key, limit - count, nil, now)
  if left == limit and redis.call('LLEN', queue) == 0 then redis.call('DEL', lock) end
end

-- The semaphore paths of the scripts that act on one holder, each returning what
-- its script returns.
local function sem_release(lock, owner)
  local now = sem_now()
  local limit, plen, hs = sem_state(lock, now)
  if not redis.call('HGET', lock, owner) then return 0 end
  redis.call('HDEL', lock, owner)
  redis.call('PUBLISH', lock .. HOLDER, '')
  sem_settle(lock, limit, plen, #hs - 1, now)
  return 1
end

-- The live record of owner's permit: its expiry, token, mark and value; nil when
-- owner holds none (an expired record is deleted).
local function sem_get(lock, owner, now)
  local r = redis.call('HGET', lock, owner)
  if not r then return nil end
  local exp, tok, mark, val = string.match(r, '^(%d+) (%d+) (%S+) ?(.*)$')
  if not exp or tonumber(exp) <= now then
    redis.call('HDEL', lock, owner)
    return nil
  end
  return tonumber(exp), tok, mark, val
end

local function sem_refresh(lock, owner, ttl)
  local now = sem_now()
  local exp, tok, mark, val = sem_get(lock, owner, now)
  if not exp then return 0 end
  local at = now + tonumber(ttl)
  redis.call('HSET', lock, owner, sem_rec(at, tok, mark, val))
  sem_extend(lock, at)
  return 1
end

local function sem_set_value(lock, owner, val)
  local now = sem_now()
  local exp, tok, mark = sem_get(lock, owner, now)
  if not exp then return 0 end
  redis.call('HSET', lock, owner, sem_rec(exp, tok, mark, val))
  redis.call('PUBLISH', lock .. HOLDER, '')
  return 1
end

-- inspect.lua's reply for the oldest holder, or false when none is live.
local function sem_inspect(lock)
  local now = sem_now()
  local limit, plen, hs = sem_state(lock, now)
  local h = hs[1]
  if not h or not limit then return false end
  local prefix = string.sub(lock, 1, plen)
  local key = string.sub(lock, plen + #LOCK + 1)
  local val = false
  if h[5] ~= '' then val = h[5] end
  return {h[1], h[2] - now, h[3], sem_places(prefix .. QUEUE .. key, prefix .. WAITER .. key .. SEP), val}
end

local function sem_force_release(lock)
  local now = sem_now()
  local limit, plen, hs = sem_state(lock, now)
  if #hs == 0 then return 0 end
  for _, h in ipairs(hs) do redis.call('HDEL', lock, h[1]) end
  redis.call('PUBLISH', lock .. HOLDER, '')
  sem_settle(lock, limit, plen, 0, now)
  return 1
end

-- Passes on a permit handed to owner's place on the client of channel ch that
-- the client never claimed, and any permits left free.
local function sem_withdraw(lock, owner, ch)
  local now = sem_now()
  local limit, plen, hs = sem_state(lock, now)
  local count = #hs
  for _, h in ipairs(hs) do
    if h[1] == owner and h[4] == ch then
      redis.call('HDEL', lock, owner)
      redis.call('PUBLISH', lock .. HOLDER, '')
      count = count - 1
    end
  end
  sem_settle(lock, limit, plen, count, now)
  return 1
end
