-- set_value.lua: replaces the value of the owner's grant, leaving its TTL as it is.
-- KEYS[1]  the lock key
-- ARGV[1]  the owner id
-- ARGV[2]  the new value (any bytes, not empty); absent for none
-- Returns 1 when replaced, 0 when the owner does not hold the key. It publishes on
-- the holder channel.
--#include names.lua
local owner, val = ARGV[1], ARGV[2]
local v = redis.pcall('GET', KEYS[1])
-- A hash is a semaphore's lock key (sem.lua): GET fails on it, caught by pcall.
if type(v) == 'table' then
--#include sem.lua
  return sem_set_value(KEYS[1], owner, val)
end
-- The holder's value is its owner id, alone or followed by a space and marks.
if not v or v ~= owner and string.sub(v, 1, #owner + 1) ~= owner .. ' ' then return 0 end
local had = string.find(v, ' v', 1, true)
if val then
  -- The value key expires when the lock key does, to the millisecond.
  redis.call('SET', KEYS[1] .. VALUE, val, 'PXAT', redis.call('PEXPIRETIME', KEYS[1]))
  if not had then redis.call('SET', KEYS[1], v .. ' v', 'KEEPTTL') end
elseif had then
  redis.call('DEL', KEYS[1] .. VALUE)
  redis.call('SET', KEYS[1], (string.gsub(v, ' v', '')), 'KEEPTTL')
end
redis.call('PUBLISH', KEYS[1] .. HOLDER, '')
return 1
