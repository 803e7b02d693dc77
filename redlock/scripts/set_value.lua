-- set_value.lua: replaces the value of the owner's lock on one node, leaving its
-- TTL as it is (joined after lib.lua).
--
-- KEYS[1] lock.
-- ARGV[1] owner, ARGV[2] the new value (any bytes, not empty); absent for none.
--
-- Returns SET (1), and publishes on the holder channel, when the owner holds the
-- lock here; NOT_HELD (0) otherwise.
local lockKey = KEYS[1]
local owner, val = ARGV[1], ARGV[2]
local NOT_HELD, SET = 0, 1

local v = redis.call('GET', lockKey)
if not v then return NOT_HELD end
local h, t = parts(v)
if h ~= owner then return NOT_HELD end
redis.call('SET', lockKey, join(owner, t, val), 'KEEPTTL')
redis.call('PUBLISH', lockKey .. HOLDER, '')
return SET
