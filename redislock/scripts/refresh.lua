-- refresh.lua: extends the owner's grant, and its value with it.
-- KEYS[1]  the lock key
-- ARGV[1]  the owner id
-- ARGV[2]  the new TTL, in ms
-- Returns 1 when extended, 0 when the owner does not hold the key.
--#include names.lua
local owner = ARGV[1]
local v = redis.pcall('GET', KEYS[1])
-- A mutex's token counter (token.lua) is pushed out with the lease (GT: never
-- shortened), since a re-entry and Inspect read the token there.
if v == owner then
  redis.call('PEXPIRE', KEYS[1] .. TOKEN, ARGV[2] + RETAIN, 'GT')
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
-- A hash is a semaphore's lock key (sem.lua): GET fails on it, caught by pcall.
if type(v) == 'table' then
--#include sem.lua
  return sem_refresh(KEYS[1], owner, ARGV[2])
end
-- The holder's value is its owner id, followed by a space and marks; " v" says
-- the grant has a value, whose key expires with the lock key, to the millisecond.
if v and string.sub(v, 1, #owner + 1) == owner .. ' ' then
  redis.call('PEXPIRE', KEYS[1] .. TOKEN, ARGV[2] + RETAIN, 'GT')
  local n = redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if string.find(v, ' v', 1, true) then
    redis.call('PEXPIREAT', KEYS[1] .. VALUE, redis.call('PEXPIRETIME', KEYS[1]))
  end
  return n
end
return 0
