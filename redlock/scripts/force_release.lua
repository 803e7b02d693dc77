-- force_release.lua: deletes the lock and every reader's grant on one node, whatever
-- their owners, and wakes a waiter (joined after lib.lua and wake.lua).
--
-- KEYS[1] lock, KEYS[2] wait set, KEYS[3] fence counter (read for the wake-up),
-- KEYS[4] readers, KEYS[5] readers' tokens and values.
-- ARGV[1] waiter key prefix, ARGV[2] nonce (the same on every node for one
-- release), ARGV[3] the lock name.
--
-- Returns DELETED (1) if a lock or a live reader was deleted (and publishes on the
-- holder channel), NONE (0) if there was none.
local lockKey, waitKey, fenceKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local waiterPrefix, nonce, name = ARGV[1], ARGV[2], ARGV[3]
local NONE, DELETED = 0, 1

local v, marked = lockValue(lockKey)
local n = 0
if marked then n = readers(lockKey, readKey, readData) end
if not v and n == 0 then return NONE end
redis.call('DEL', lockKey, readKey, readData, lockKey .. HANDED)
redis.call('PUBLISH', lockKey .. HOLDER, '')
if redis.call('EXISTS', waitKey) == 1 then wake(waitKey, waiterPrefix, nonce, name, fenceKey) end
return DELETED
