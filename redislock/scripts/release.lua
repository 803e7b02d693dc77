-- release.lua: frees the owner's grant, handing it to the next live waiter if any.
-- KEYS[1]  the lock key
-- ARGV[1]  the owner id
-- Returns 1 when freed or handed over, 0 when the owner did not hold the key. A
-- release publishes on the holder channel. A semaphore's permit is freed alone, and
-- handed to the first queued place (sem.lua).
--#include names.lua
local owner = ARGV[1]
local v = redis.pcall('GET', KEYS[1])
if v == owner then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1] .. HOLDER, '')
  return 1
end
-- A hash is a semaphore's lock key (sem.lua): GET fails on it, caught by pcall.
if type(v) == 'table' then
--#include sem.lua
  return sem_release(KEYS[1], owner)
end
-- The holder's value is its owner id, alone or followed by a space and marks.
if not v or string.sub(v, 1, #owner + 1) ~= owner .. ' ' then return 0 end
-- The mark " qN": waiters queued, and the prefix is the lock key's first N bytes.
local n = string.match(v, ' q(%d+)')
if not n then
  redis.call('DEL', KEYS[1], KEYS[1] .. VALUE)
  redis.call('PUBLISH', KEYS[1] .. HOLDER, '')
  return 1
end
--#include token.lua
--#include handoff.lua
local prefix = string.sub(KEYS[1], 1, tonumber(n))
-- Without the mark " v" the grant has no value key. (Owner ids and prefixes
-- contain no spaces, so nothing else in the value can match.)
hand_off(KEYS[1], prefix, string.sub(KEYS[1], #prefix + #LOCK + 1), not string.find(v, ' v', 1, true))
return 1
