-- holders.lua: lists the holders of a lock.
-- KEYS[1]  the lock key
-- ARGV[1]  the key prefix
-- Returns {limit, live queued waiters, then for each live holder, oldest grant
-- first: owner, pttl in ms, token as a string, value or false, 1 if shared
-- else 0}: limit 1 and one holder for a mutex, {0, 0} when nobody holds the lock.
--#include names.lua
local v = redis.pcall('GET', KEYS[1])
if not v then return {0, 0} end
local prefix = ARGV[1]
local key = string.sub(KEYS[1], #prefix + #LOCK + 1)
local queue, wp = prefix .. QUEUE .. key, prefix .. WAITER .. key .. SEP
--#include sem.lua
if type(v) ~= 'table' then
  -- A mutex (see inspect.lua).
  local val = false
  if string.find(v, ' v', 1, true) then val = redis.call('GET', KEYS[1] .. VALUE) end
  return {1, sem_places(queue, wp), string.match(v, '^%S+'), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1] .. TOKEN) or '0', val, 0}
end
local now = sem_now()
local limit, _, hs = sem_state(KEYS[1], now)
if not limit or #hs == 0 then return {0, 0} end
local r = {limit, sem_places(queue, wp)}
for _, h in ipairs(hs) do
  local val = false
  if h[5] ~= '' then val = h[5] end
  r[#r + 1] = h[1]
  r[#r + 1] = h[2] - now
  r[#r + 1] = h[3]
  r[#r + 1] = val
  if sem_shared(h[4]) then r[#r + 1] = 1 else r[#r + 1] = 0 end
end
return r
