-- inspect.lua: reads one node's view of a lock.
--
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] wait set.
-- ARGV[1] waiter key prefix.
--
-- Returns {value or false, pttl, counter or '0', live waiters}: the lock value
-- ("OWNER", "OWNER TOKEN" or "OWNER TOKEN VALUE"), its remaining TTL in ms (negative if none), the
-- node's fencing counter, and the number of waiters in the wait set whose place
-- has not lapsed.
local lockKey, fenceKey, waitKey = KEYS[1], KEYS[2], KEYS[3]
local waiterPrefix = ARGV[1]

local live = 0
for _, w in ipairs(redis.call('ZRANGE', waitKey, 0, -1)) do
  if redis.call('EXISTS', waiterPrefix .. w) == 1 then live = live + 1 end
end
return {redis.call('GET', lockKey), redis.call('PTTL', lockKey),
  redis.call('GET', fenceKey) or '0', live}
