-- withdraw.lua: gives up a waiter's place on one node (joined after lib.lua and
-- wake.lua). A writer's place given up where the node has no lock value wakes the
-- run of readers that may now be at the front of the queue: a reader waits behind
-- a queued writer even while readers hold, and once that writer is gone it can join
-- them. Nothing else is woken (a woken mutex waiter that gives up leaves the next
-- one to its fallback timer, as before read-write locks).
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
local ch = redis.call('GETDEL', waiterPrefix .. owner)
if not ch or string.sub(ch, -2) == ' r' then return 1 end
if lockValue(lockKey) or redis.call('EXISTS', waitKey) == 0 then return 1 end
wake(waitKey, waiterPrefix, nonce, name, fenceKey, true)
return 1
