-- lib.lua: helpers joined in front of the scripts that read a lock value or a
-- fencing counter (see scripts.go). Defines no KEYS or ARGV of its own.
--
-- SEP separates owner and token in a lock value "OWNER" or "OWNER TOKEN" (owner ids
-- never contain a space, so the split is unambiguous).
-- fence(fenceKey) returns this node's counter; a missing counter (a new key, or a
-- node that restarted without its data) starts from the server clock in
-- microseconds, so that it is very likely above every token issued before the loss
-- (a fallback: the fencing argument does not rely on it).
-- holder(v) splits a lock value into its owner and token (0 when it has none).
local SEP = ' '
local MICROS_PER_SECOND = 1000000

local function fence(fenceKey)
  local c = redis.call('GET', fenceKey)
  if c then return tonumber(c) end
  local t = redis.call('TIME') -- {seconds, microseconds}
  local n = tonumber(t[1]) * MICROS_PER_SECOND + tonumber(t[2])
  redis.call('SET', fenceKey, string.format('%d', n))
  return n
end

local function holder(v)
  local at = string.find(v, SEP, 1, true)
  if at then
    return string.sub(v, 1, at - 1), tonumber(string.sub(v, at + #SEP))
  end
  return v, 0
end
