-- release.lua: deletes the owner's lock or reader's grant on one node and wakes a
-- waiter (joined after lib.lua and wake.lua).
--
-- KEYS[1] lock, KEYS[2] wait set, KEYS[3] fence counter (read for the wake-up),
-- KEYS[4] readers, KEYS[5] readers' tokens and values.
-- ARGV[1] owner, ARGV[2] waiter key prefix, ARGV[3] nonce (the same on every node
-- for one release), ARGV[4] the lock name, ARGV[5] wake: 1 wake a waiter, 0 not
-- (an attempt giving back a grant that lost to a majority held by another owner,
-- whose release wakes the waiters).
--
-- Returns the owner id of the waiter woken, else RELEASED (1) if released,
-- NOT_HELD (0) if the owner did not hold it here. A release publishes on the
-- holder channel. A reader's release wakes a waiter only when it was the last
-- reader.
local lockKey, waitKey, fenceKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, waiterPrefix, nonce, name, wakeOne = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local NOT_HELD, RELEASED = 0, 1

local v, marked = lockValue(lockKey)
local last = true -- no reader left (a node with a lock value has none)
if v then
  if holder(v) ~= owner then return NOT_HELD end
  redis.call('DEL', lockKey)
else
  if not marked or readers(lockKey, readKey, readData) == 0 or not readerTok(readData, owner) then
    return NOT_HELD
  end
  redis.call('ZREM', readKey, owner)
  redis.call('HDEL', readData, owner)
  last = redis.call('EXISTS', readKey) == 0
  if last then redis.call('DEL', lockKey, readData) end
end
redis.call('PUBLISH', lockKey .. HOLDER, '')
if wakeOne == '1' and last and redis.call('EXISTS', waitKey) == 1 then
  local woken = wake(waitKey, waiterPrefix, nonce, name, fenceKey)
  if woken then return woken end
end
return RELEASED
