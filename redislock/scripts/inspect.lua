-- inspect.lua: reads the holder of a lock.
-- KEYS[1]  the lock key
-- ARGV[1]  the key prefix
-- Returns {owner, pttl in ms, last token as a string, live queued waiters, value
-- or false}, with a sixth element 1 for a shared holder, or false (a nil reply)
-- when nobody holds the lock.
--#include names.lua
local v = redis.pcall('GET', KEYS[1])
if not v then return false end
-- A hash is a semaphore's lock key (sem.lua): its oldest holder.
if type(v) == 'table' then
--#include sem.lua
  return sem_inspect(KEYS[1])
end
local prefix = ARGV[1]
local key = string.sub(KEYS[1], #prefix + #LOCK + 1)
local wp = prefix .. WAITER .. key .. SEP
local live = 0
for _, h in ipairs(redis.call('LRANGE', prefix .. QUEUE .. key, 0, -1)) do
  if redis.call('EXISTS', wp .. h) == 1 then live = live + 1 end
end
-- The mark " v": the grant has a value.
local val = false
if string.find(v, ' v', 1, true) then val = redis.call('GET', KEYS[1] .. VALUE) end
-- The owner id is the value's first word (marks follow it).
return {string.match(v, '^%S+'), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1] .. TOKEN) or '0', live, val}
