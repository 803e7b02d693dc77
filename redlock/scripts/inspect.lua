-- inspect.lua: reads one node's view of a lock (joined after lib.lua).
--
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] wait set, KEYS[4] readers, KEYS[5]
-- readers' tokens and values.
-- ARGV[1] waiter key prefix.
--
-- Returns {value or false, pttl, counter or '0', live waiters, readers}: the lock
-- value ("OWNER", "OWNER TOKEN" or "OWNER TOKEN VALUE"), its remaining TTL in ms
-- (negative if none), the node's fencing counter, the number of waiters in the wait
-- set whose place has not lapsed, and the live readers as a flat list of owner id,
-- "TOKEN" or "TOKEN VALUE", and remaining TTL in ms, in the order they lapse.
local lockKey, fenceKey, waitKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local waiterPrefix = ARGV[1]

local live = 0
for _, w in ipairs(redis.call('ZRANGE', waitKey, 0, -1)) do
  if redis.call('EXISTS', waiterPrefix .. w) == 1 then live = live + 1 end
end
local v, marked = lockValue(lockKey)
local rs = {}
if marked then
  local now = nowMs()
  local all = redis.call('ZRANGEBYSCORE', readKey, '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #all, 2 do
    local d = redis.call('HGET', readData, all[i])
    if d then
      rs[#rs + 1] = all[i]
      rs[#rs + 1] = d
      rs[#rs + 1] = tonumber(all[i + 1]) - now
    end
  end
end
local pttl = -2
if v then pttl = redis.call('PTTL', lockKey) end
return {v or false, pttl, redis.call('GET', fenceKey) or '0', live, rs}
