-- withdraw.lua: gives up a waiter's place on one node (joined after lib.lua and
-- wake.lua), and wakes the waiters that its place held back: when the node has no
-- lock value, the oldest live waiter if no reader holds, else the run of readers at
-- the front of the queue (a reader waits behind a queued writer even while readers
-- hold; once that writer gives up, it can join them).
--
-- KEYS[1] wait set, KEYS[2] lock, KEYS[3] fence counter (read for the wake-up),
-- KEYS[4] readers, KEYS[5] readers' tokens and values.
-- ARGV[1] owner, ARGV[2] waiter key prefix, ARGV[3] nonce (the same on every node
-- for one withdrawal), ARGV[4] the lock name.
--
-- Returns 1.
local waitKey, lockKey, fenceKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, waiterPrefix, nonce, name = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

redis.call('ZREM', waitKey, owner)
redis.call('DEL', waiterPrefix .. owner)
if redis.call('EXISTS', lockKey) == 1 or redis.call('EXISTS', waitKey) == 0 then return 1 end
wake(waitKey, waiterPrefix, nonce, name, fenceKey, readers(readKey, readData) > 0)
return 1
