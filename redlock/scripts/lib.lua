-- lib.lua: helpers joined in front of the scripts that read a lock value or a
-- fencing counter (see scripts.go). Defines no KEYS or ARGV of its own.
--
-- A lock value is "OWNER", "OWNER TOKEN" or "OWNER TOKEN VALUE": the holder, the
-- grant's fencing token once it is known ("0" before, when a value follows), and
-- the grant's value (any bytes, the rest of the string) if it has one. Owner ids
-- never contain a space, nor tokens, so the split is unambiguous.
-- SEP separates the parts; HOLDER ends the lock key to name the holder channel.
-- fence(fenceKey) returns this node's counter; a missing counter (a new key, or a
-- node that restarted without its data) starts from the server clock in
-- microseconds, so that it is very likely above every token issued before the loss
-- (a fallback: the fencing argument does not rely on it).
-- parts(v) splits a lock value into its owner, its token as written ('0' when it
-- has none) and its value (nil when it has none); holder(v) returns the owner and
-- the token as a number; join(owner, t, val) makes a lock value of them.
local SEP = ' '
local HOLDER = '\31holder'
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

local function readers(rk, dk)
  if redis.call('EXISTS', rk) == 0 then return 0 end
  local now = nowMs()
  local gone = redis.call('ZRANGEBYSCORE', rk, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', rk, '-inf', now)
    for _, o in ipairs(gone) do redis.call('HDEL', dk, o) end
  end
  return redis.call('ZCARD', rk)
end

local function readerTTL(rk)
  local last = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
  if #last == 0 then return -1 end
  return math.max(tonumber(last[2]) - nowMs(), 0)
end

local function putReader(rk, dk, owner, ttl, data)
  local ms = tonumber(ttl)
  redis.call('ZADD', rk, nowMs() + ms, owner)
  if data then redis.call('HSET', dk, owner, data) end
  local keep = math.max(redis.call('PTTL', rk), ms)
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
