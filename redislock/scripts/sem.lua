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
-- A read-write lock (driver.Sharer) is the hash with limit 1: its holders are
-- either shared (read) holders together or one exclusive (write) holder alone.
-- A shared holder's MARK, and a shared queued place's CHANNEL, start with the
-- byte 0x1f (SHARED), which no channel does (a prefix has no control
-- characters); records and places without it are exclusive, as every record a
-- semaphore or an earlier version wrote.
-- The hash expires with its last holder or queued place (whichever is later: each
-- grant, refresh and waiting attempt pushes its expiry out, never in); every
-- script drops the holders whose expiry has passed on the server's TIME.
local LIMITF = '\31limit'

local SHARED = '\31'

-- Whether a mark (or a place's channel) is a shared one.
local function sem_shared(mark) return string.byte(mark, 1) == 31 end

-- The channel in a mark or a place's channel, without the shared byte.
local function sem_chan(mark)
  if string.byte(mark, 1) == 31 then return string.sub(mark, 2) end
  return mark
end

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
-- The counter expires RETAIN ms after the grant (later if it ran ahead of the
-- clock), as token.lua's: a holder keeps its token in the hash, so the counter
-- need not outlive the holders' leases.
local function sem_token(lock, now)
  local tk = lock .. TOKEN
  local n = redis.call('INCR', tk)
  if n < now * 1000 then
    n = now * 1000
    redis.call('SET', tk, string.format('%d', n), 'PX', RETAIN)
  else
    redis.call('PEXPIRE', tk, RETAIN + math.floor((n - now * 1000) / 1000) + 1)
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

-- Whether the hash at lock keeps the key from a newcomer: its limit, the key
-- prefix and its live holders (as sem_state) when it has a limit and holders or
-- live queued places; nil when the key is free (the hash may then be deleted).
local function sem_busy(lock, now)
  local limit, plen, hs = sem_state(lock, now)
  if not limit then return nil end
  local prefix = string.sub(lock, 1, plen)
  local key = string.sub(lock, plen + #LOCK + 1)
  if #hs > 0 or sem_places(prefix .. QUEUE .. key, prefix .. WAITER .. key .. SEP) > 0 then
    return limit, prefix, hs
  end
  return nil
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

-- A read-write lock's holders hs as a state: nil for none, 'r' for shared
-- holders, 'w' for an exclusive one.
local function rw_state(hs)
  if #hs == 0 then return nil end
  for _, h in ipairs(hs) do
    if not sem_shared(h[4]) then return 'w' end
  end
  return 'r'
end

-- Whether a grant, shared or not, fits beside a read-write lock's state st.
local function rw_fits(st, shared) return not st or (st == 'r' and shared) end

-- sem_pump for a read-write lock in state st: grants the queue's first live
-- places, in order, as long as each fits (the leading run of shared places
-- together, or one exclusive place when nobody holds). It stops at the place of
-- me, whose attempt is shared when myshared, dropping it when the grant fits.
-- Returns the state, whether me may take the grant, and whether the queue ran out.
local function rw_pump(lock, queue, wp, key, st, me, myshared, now)
  while true do
    local h = redis.call('LINDEX', queue, 0)
    if not h then return st, false, true end
    local e = redis.call('GET', wp .. h)
    local seq, ttl, ch, val
    if e then seq, ttl, ch, val = string.match(e, '^(%d+) (%d+) (%S+) ?(.*)$') end
    local sh = ch and sem_shared(ch)
    if h == me then sh = myshared end
    if ch and not rw_fits(st, sh) then return st, false, false end
    redis.call('LPOP', queue)
    if e then redis.call('DEL', wp .. h) end
    if ch and h == me then return st, true, false end
    if ch and not redis.call('HGET', lock, h) then
      local exp = now + tonumber(ttl)
      local n = sem_token(lock, now)
      redis.call('HSET', lock, h, sem_rec(exp, n, ch, val))
      sem_extend(lock, exp)
      redis.call('PUBLISH', sem_chan(ch), h .. ' ' .. n .. ' ' .. seq .. ' ' .. ttl .. ' ' .. key)
      redis.call('PUBLISH', lock .. HOLDER, '')
      if sh then st = 'r' else st = 'w' end
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
  if limit == 1 then
    local _, _, hs = sem_state(lock, now)
    local st = rw_pump(lock, queue, prefix .. WAITER .. key .. SEP, key, rw_state(hs), nil, false, now)
    if not st and redis.call('LLEN', queue) == 0 then redis.call('DEL', lock) end
    return
  end
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
  local r = {h[1], h[2] - now, h[3], sem_places(prefix .. QUEUE .. key, prefix .. WAITER .. key .. SEP), val}
  if sem_shared(h[4]) then r[6] = 1 end
  return r
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
    if h[1] == owner and sem_chan(h[4]) == ch then
      redis.call('HDEL', lock, owner)
      redis.call('PUBLISH', lock .. HOLDER, '')
      count = count - 1
    end
  end
  sem_settle(lock, limit, plen, count, now)
  return 1
end

-- Keeps owner's place in the queue for a waiting attempt w ("Q PATIENCE SEQ
-- CHANNEL") that asks for a grant of ttl ms, shared when shared, with value val;
-- returns the place's lifetime in ms.
local function sem_queue(queue, wp, owner, w, ttl, shared, val)
  local _, pat, seq, ch = string.match(w, '^(%S) (%d+) (%d+) (%S+)$')
  if shared then ch = SHARED .. ch end
  local place = seq .. ' ' .. ttl .. ' ' .. ch
  if val then place = place .. ' ' .. val end
  local old = redis.call('SET', wp .. owner, place, 'PX', pat, 'GET')
  if not old and not redis.call('LPOS', queue, owner) then
    redis.call('RPUSH', queue, owner)
  end
  redis.call('PEXPIRE', queue, pat)
  return tonumber(pat)
end

-- One attempt to take a permit of a semaphore of limit > 1, or a grant of a
-- read-write lock (limit 1), shared when shared; w is the waiting attempt's
-- argument or nil, nore "x" when the request does not say Reenter, val the value
-- or nil. Returns the token (> 0) when granted; when every permit is held (or
-- free ones are owed to places queued ahead, or the grant does not fit beside
-- the holders), -(ms + 1) with the time in ms until the first holder's grant
-- expires; "limit M" when the key is held, or waited for, with another limit M
-- (1: as a mutex, or a read-write lock), changing nothing. A grant publishes on
-- the holder channel.
local function sem_acquire(lock, owner, ttl, limit, shared, prefix, w, nore, val)
  local key = string.sub(lock, #prefix + #LOCK + 1)
  local queue = prefix .. QUEUE .. key
  local wp = prefix .. WAITER .. key .. SEP
  local now = sem_now()
  local t = redis.call('TYPE', lock)['ok']
  if t == 'string' then
    -- A mutex holds the key: a shared attempt waits behind it, its place marked
    -- shared; the release that reaches it makes the key a read-write lock's hash
    -- (handoff.lua).
    if not shared then return 'limit 1' end
    if w then
      sem_queue(queue, wp, owner, w, ttl, true, val)
      local v = redis.call('GET', lock)
      if v and not string.find(v, ' q', 1, true) then
        redis.call('SET', lock, v .. ' q' .. #prefix, 'KEEPTTL')
      end
    end
    local pttl = redis.call('PTTL', lock)
    if pttl > 0 then return -pttl - 1 end
    return -1
  end
  local have, hs, plen = nil, {}, nil
  if t == 'hash' then have, plen, hs = sem_state(lock, now) end
  if not have then
    -- No semaphore state: places queued without a lock key are a mutex's, whose
    -- holder's grant expired; a read-write lock takes them over.
    if limit ~= 1 and sem_places(queue, wp) > 0 then return 'limit 1' end
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

  local mark = '-'
  if shared then mark = SHARED .. '-' end
  for _, h in ipairs(hs) do
    if h[1] == owner then
      -- As for a mutex (acquire.lua): only Reenter, or the claim of a permit handed
      -- to this client's own queued place, may take the grant over; the request's
      -- value replaces the grant's. A grant of the other mode is not this one.
      if sem_shared(h[4]) ~= shared then return held() end
      local may = nore ~= 'x'
      if not may and w then may = sem_chan(h[4]) == string.match(w, '(%S+)$') end
      if not may then return held() end
      local exp = now + ttl
      redis.call('HSET', lock, owner, sem_rec(exp, h[3], mark, val))
      sem_extend(lock, exp)
      if val or h[5] ~= '' then redis.call('PUBLISH', lock .. HOLDER, '') end
      return tonumber(h[3])
    end
  end

  -- Free permits go to the places queued ahead first (their clients are told), then
  -- to this attempt if one is left.
  local me = nil
  if w then me = owner end
  local ok
  if limit == 1 then
    local st, mine, out = rw_pump(lock, queue, wp, key, rw_state(hs), me, shared, now)
    ok = mine or (out and rw_fits(st, shared))
  else
    local free, mine = sem_pump(lock, queue, wp, key, limit - #hs, me, now)
    ok = mine or free > 0
  end
  if ok then
    local exp = now + ttl
    local n = sem_token(lock, now)
    redis.call('HSET', lock, owner, sem_rec(exp, n, mark, val))
    sem_extend(lock, exp)
    redis.call('PUBLISH', lock .. HOLDER, '')
    return tonumber(n)
  end
  if w then
    -- Keep the place, as acquire.lua does; the hash lives at least as long, so the
    -- limit stays with the key while the place does.
    sem_extend(lock, now + sem_queue(queue, wp, owner, w, ttl, shared, val))
  end
  return held()
end
