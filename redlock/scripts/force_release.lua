-- force_release.lua: deletes the lock on one node whatever its owner, and wakes a
-- waiter (joined after lib.lua and wake.lua).
--
-- KEYS[1] lock, KEYS[2] wait set, KEYS[3] fence counter (read for the wake-up).
-- ARGV[1] waiter key prefix, ARGV[2] nonce (the same on every node for one
-- release), ARGV[3] the lock name.
--
-- Returns DELETED (1) if a lock was deleted (and publishes on the holder channel),
-- NONE (0) if there was none.
local lockKey, waitKey, fenceKey = KEYS[1], KEYS[2], KEYS[3]
local waiterPrefix, nonce, name = ARGV[1], ARGV[2], ARGV[3]
local NONE, DELETED = 0, 1

if redis.call('DEL', lockKey) == 0 then return NONE end
redis.call('PUBLISH', lockKey .. HOLDER, '')
if redis.call('EXISTS', waitKey) == 1 then wake(waitKey, waiterPrefix, nonce, name, fenceKey) end
return DELETED
