-- force_release.lua: frees the lock whatever its owner, handing it to the next live
-- waiter if any, and publishes on the holder channel.
-- KEYS[1]  the lock key
-- ARGV[1]  the key prefix
-- Returns 1 when freed or handed over, 0 when the lock was not held.
--#include names.lua
--#include token.lua
--#include handoff.lua
if not redis.call('GET', KEYS[1]) then return 0 end
local prefix = ARGV[1]
hand_off(KEYS[1], prefix, string.sub(KEYS[1], #prefix + #LOCK + 1))
return 1
