-- commit.lua: phase two of an acquire (joined after lib.lua): offers token t to a
-- node that granted the lock.
--
-- KEYS[1] lock, KEYS[2] fence counter.
-- ARGV[1] owner, ARGV[2] t.
--
-- Returns ACCEPTED (0) when t was above the counter (counter and lock now carry t,
-- and the holder channel is told), the counter (> 0) when t is not above it
-- (rejected), LOST (-1) when the owner no longer holds the lock here.
local lockKey, fenceKey = KEYS[1], KEYS[2]
local owner, t = ARGV[1], ARGV[2]
local ACCEPTED, LOST = 0, -1

local v = redis.call('GET', lockKey)
if not v then return LOST end
local h, _, val = parts(v)
if h ~= owner then return LOST end
local c = fence(fenceKey)
if tonumber(t) <= c then return c end
redis.call('SET', fenceKey, t)
redis.call('SET', lockKey, join(owner, t, val), 'KEEPTTL')
redis.call('PUBLISH', lockKey .. HOLDER, '')
return ACCEPTED
