-- release.lua: deletes the owner's lock or reader's grant on one node and hands the
-- lock to the first waiter, or wakes it (joined after lib.lua and wake.lua: see
-- handOff).
--
-- KEYS[1] lock, KEYS[2] wait set, KEYS[3] fence counter (read for the wake-up),
-- KEYS[4] readers, KEYS[5] readers' tokens and values.
-- ARGV[1] owner, ARGV[2] waiter key prefix, ARGV[3] nonce (the same on every node
-- for one release), ARGV[4] the lock name, ARGV[5] wake: 1 hand the lock over
-- (handOff: to the first waiter if it is a writer, else wake the readers at the
-- front), 2 wake the first waiter without handing anything over (an attempt giving
-- back what it took), 0 neither (an attempt giving back a grant that lost to a
-- majority held by another owner, whose release wakes the waiters).
-- ARGV[6..12], optional, for a waiting writer's attempt that gives back what it took
-- (requeue): its waiting-since time, patience (ms), channel, WID, SEQ, TTL (ms)
-- and value (absent for none), as acquire.lua records them. The owner's place is
-- recorded again with the lock freed, and the lock handed to the oldest waiter
-- (perhaps the owner itself) whatever ARGV[5] says: a waiter that gave back its
-- grants keeps its turn on every node, where a node left free would go to the
-- next newcomer.
--
-- Returns the owner id of the waiter woken ("+" and the owner id of the waiter the
-- lock was handed to), else RELEASED (1) if released,
-- NOT_HELD (0) if the owner did not hold it here. A release publishes on the
-- holder channel. A reader's release wakes a waiter only when it was the last
-- reader.
local lockKey, waitKey, fenceKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, waiterPrefix, nonce, name, wakeMode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local requeue = ARGV[6] ~= nil
local NOT_HELD, RELEASED = 0, 1

local v, marked = lockValue(lockKey)
local last = true -- no reader left (a node with a lock value has none)
if v then
  if holder(v) ~= owner then return NOT_HELD end
  redis.call('DEL', lockKey, lockKey .. HANDED)
  if requeue then
    enqueue(waitKey, waiterPrefix .. owner, owner, ARGV[6], ARGV[7], writerEntry(ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]), ARGV[11])
    wakeMode = '1'
  end
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
if wakeMode ~= '0' and last and redis.call('EXISTS', waitKey) == 1 then
  local woken
  if wakeMode == '1' then
    woken = handOff(waitKey, waiterPrefix, nonce, name, fenceKey, lockKey)
  else
    woken = wake(waitKey, waiterPrefix, nonce, name, fenceKey)
  end
  if woken then return woken end
end
return RELEASED
