-- force_release.lua: frees the lock whatever its owner, handing it to the next live
-- waiter if any, and publishes on the holder channel.
-- KEYS[1]  the lock key
-- ARGV[1]  the key prefix
-- A semaphore's permits are all freed and handed to queued places.
-- Returns 1 when freed or handed over, 0 when the lock was not held.
--#include names.lua
--#include token.lua
--#include handoff.lua
local v = redis.pcall('GET', KEYS[1])
if not v then return 0 end
-- A hash is a semaphore's lock key (sem.lua): every holder goes.
if type(v) == 'table' then
--#include sem.lua
  return sem_force_release(KEYS[1])
end
local prefix = ARGV[1]
hand_off(KEYS[1], prefix, string.sub(KEYS[1], #prefix + #LOCK + 1))
return 1
