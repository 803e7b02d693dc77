-- lib.lua: helpers joined in front of the scripts that read a lock value or a
-- fencing counter (see scripts.go). Defines no KEYS or ARGV of its own.
--
-- A lock value is "OWNER", "OWNER TOKEN" or "OWNER TOKEN VALUE": the holder, the
-- grant's fencing token once it is known ("0" before, when a value follows), and
-- the grant's value (any bytes, the rest of the string) if it has one. Owner ids
-- never contain a space, nor tokens, so the split is unambiguous.
-- SEP separates the parts; HOLDER ends the lock key to name the holder channel;
-- HANDED ends it to name the key that marks a grant a release handed to a queued
-- writer (see wake.lua's handOff): "CHANNEL WID" of the waiter's place, with the
-- lock's TTL as the handoff set it, so that that wait, and only it, may claim the
-- grant with an attempt or give it back.
-- fence(fenceKey) returns this node's counter; a missing counter (a new key, or a
-- node that restarted without its data) starts from the server clock in
-- microseconds, so that it is very likely above every token issued before the loss
-- (a fallback: the fencing argument does not rely on it).
-- parts(v) splits a lock value into its owner, its token as written ('0' when it
-- has none) and its value (nil when it has none); holder(v) returns the owner and
-- the token as a number; join(owner, t, val) makes a lock value of them.
--
-- Readers (shared grants) live beside the lock key: a sorted set of owner ids scored
-- by the server time (ms) at which each reader's grant lapses, and a hash from owner
-- id to "TOKEN" or "TOKEN VALUE". While a node has live readers, the lock key holds
-- READERS (no owner id can: they hold no control byte) with a TTL no shorter than
-- any reader's, so a writer's attempt sees them in the GET it makes anyway, and a
-- node never holds a lock value and a live reader at once. lockValue(lk) returns
-- the lock value (nil if none) and whether the marker is there; readers(lk, rk, dk)
-- drops the readers whose grant lapsed, and the marker with the last, and returns
-- how many are left; readerTTL(rk) is the ms left of the last to lapse (-1 when
-- none); putReader(lk, rk, dk, owner, ttl, data) records or extends a reader and the
-- marker; readerTok(dk, owner) returns a live reader's token as written and its
-- value (nil when it is not a reader here; call readers first).
--
-- A waiter key holds "CHANNEL r" for a reader, and "CHANNEL WID SEQ TTL" or
-- "CHANNEL WID SEQ TTL VALUE" for a writer: its client's wake-up channel, the
-- number its client gave the wait (unique in the client) and the attempt that wrote
-- it, the TTL in ms and the value of the grant it asks for (a writer's "CHANNEL"
-- alone, or WID 0, asks for no handoff: it is woken). waiterEntry(e) returns the
-- channel, whether it is a reader's, and a writer's WID, SEQ, TTL and value (nil
-- when absent); writerEntry(ch, wid, seq, ttl, val) makes a writer's.
-- enqueue(waitKey, waiterKey, owner, since, patience, e, ttl) records or renews a
-- place: the owner in the wait set scored since (kept if there), its waiter key e,
-- both lasting patience ms at least; and returns the shortest TTL (ms) any place
-- asked for while the wait set lasted, this one's ttl included, which it keeps
-- beside the wait set (its key ends in SHORTEST, with the wait set's expiry, so
-- it may outlive the place that asked for it by the wait set's patience): a place
-- ahead that is granted the lock and never releases it (a crash) holds it that
-- long, so a waiter behind it asks the nodes again that often (see the client's
-- localWindow). A shorter value than needed only makes waiters ask more often.
local SEP = ' '
local HOLDER = '\31holder'
local HANDED = '\31handed'
local READERS = '\31readers'
local SHORTEST = '\31shortest'
local MICROS_PER_SECOND = 1000000

local function fence(fenceKey)
  local c = redis.call('GET', fenceKey)
  if c then return tonumber(c) end
  local t = redis.call('TIME') -- {seconds, microseconds}
  local n = tonumber(t[1]) * MICROS_PER_SECOND + tonumber(t[2])
  redis.call('SET', fenceKey, string.format('%d', n))
  return n
end

local function parts(v)
  local at = string.find(v, SEP, 1, true)
  if not at then return v, '0', nil end
  local at2 = string.find(v, SEP, at + 1, true)
  if not at2 then return string.sub(v, 1, at - 1), string.sub(v, at + 1), nil end
  return string.sub(v, 1, at - 1), string.sub(v, at + 1, at2 - 1), string.sub(v, at2 + 1)
end

local function holder(v)
  local h, t = parts(v)
  return h, tonumber(t)
end

local function join(owner, t, val)
  if val then return owner .. SEP .. t .. SEP .. val end
  if t ~= '0' then return owner .. SEP .. t end
  return owner
end

local function nowMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function lockValue(lk)
  local v = redis.call('GET', lk)
  if v == READERS then return nil, true end
  return v, false
end

local function readers(lk, rk, dk)
  local now = nowMs()
  local gone = redis.call('ZRANGEBYSCORE', rk, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', rk, '-inf', now)
    for _, o in ipairs(gone) do redis.call('HDEL', dk, o) end
  end
  local n = redis.call('ZCARD', rk)
  if n == 0 then redis.call('DEL', lk, dk) end
  return n
end

local function readerTTL(rk)
  local last = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
  if #last == 0 then return -1 end
  return math.max(tonumber(last[2]) - nowMs(), 0)
end

local function putReader(lk, rk, dk, owner, ttl, data)
  local ms = tonumber(ttl)
  redis.call('ZADD', rk, nowMs() + ms, owner)
  if data then redis.call('HSET', dk, owner, data) end
  local keep = math.max(redis.call('PTTL', lk), ms)
  redis.call('SET', lk, READERS, 'PX', keep)
  redis.call('PEXPIRE', rk, keep)
  redis.call('PEXPIRE', dk, keep)
end

local function readerTok(dk, owner)
  local d = redis.call('HGET', dk, owner)
  if not d then return nil end
  local at = string.find(d, SEP, 1, true)
  if not at then return d, nil end
  return string.sub(d, 1, at - 1), string.sub(d, at + 1)
end

local function readerData(t, val)
  if val then return t .. SEP .. val end
  return t
end

local function waiterEntry(e)
  local ch = string.match(e, '^(%S+) r$')
  if ch then return ch, true end
  local c, wid, seq, ttl, val = string.match(e, '^(%S+) (%d+) (%d+) (%d+) ?(.*)$')
  if not c then return e, false end
  if val == '' then val = nil end
  return c, false, wid, seq, ttl, val
end

local function writerEntry(ch, wid, seq, ttl, val)
  local e = ch .. ' ' .. wid .. ' ' .. seq .. ' ' .. ttl
  if val then e = e .. ' ' .. val end
  return e
end

local function enqueue(waitKey, waiterKey, owner, since, patience, e, ttl)
  redis.call('SET', waiterKey, e, 'PX', patience)
  redis.call('ZADD', waitKey, 'NX', since, owner)
  local keep = redis.call('PTTL', waitKey)
  if keep < tonumber(patience) then
    redis.call('PEXPIRE', waitKey, patience)
    keep = patience
  end
  local sk = waitKey .. SHORTEST
  local s, was = tonumber(ttl), tonumber(redis.call('GET', sk) or '')
  if was and was < s then s = was end
  redis.call('SET', sk, s, 'PX', keep)
  return s
end
