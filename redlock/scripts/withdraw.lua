-- withdraw.lua: gives up a waiter's place on one node.
--
-- KEYS[1] wait set.
-- ARGV[1] owner, ARGV[2] waiter key prefix.
--
-- Returns 1.
local waitKey = KEYS[1]
local owner, waiterPrefix = ARGV[1], ARGV[2]

redis.call('ZREM', waitKey, owner)
redis.call('DEL', waiterPrefix .. owner)
return 1
