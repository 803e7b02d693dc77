-- withdraw.lua: gives up a waiter's place on one node, and, if asked, the key's
-- reservation if it is the waiter's (joined after lib.lua).
--
-- KEYS[1] wait set.
-- ARGV[1] owner, ARGV[2] waiter key prefix, ARGV[3] 1: drop the reservation (a
-- waiter that gives up), 0: keep it (a waiter granted on a majority, whose
-- reservation keeps newcomers off this node until it lapses).
--
-- Returns 1.
local waitKey = KEYS[1]
local owner, waiterPrefix, drop = ARGV[1], ARGV[2], ARGV[3]

redis.call('ZREM', waitKey, owner)
redis.call('DEL', waiterPrefix .. owner)
if drop == '1' and redis.call('GET', waitKey .. RESERVED) == owner then redis.call('DEL', waitKey .. RESERVED) end
return 1
