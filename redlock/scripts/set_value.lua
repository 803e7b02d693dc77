-- set_value.lua: replaces the value of the owner's lock or reader's grant on one
-- node, leaving its TTL as it is (joined after lib.lua).
--
-- KEYS[1] lock, KEYS[2] readers, KEYS[3] readers' tokens and values.
-- ARGV[1] owner, ARGV[2] the new value (any bytes, not empty); absent for none.
--
-- Returns SET (1), and publishes on the holder channel, when the owner holds the
-- lock or a reader's grant here; NOT_HELD (0) otherwise.
local lockKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3]
local owner, val = ARGV[1], ARGV[2]
local NOT_HELD, SET = 0, 1

local v, marked = lockValue(lockKey)
if v then
  local h, t = parts(v)
  if h ~= owner then return NOT_HELD end
  redis.call('SET', lockKey, join(owner, t, val), 'KEEPTTL')
else
  if not marked or readers(lockKey, readKey, readData) == 0 then return NOT_HELD end
  local t = readerTok(readData, owner)
  if not t then return NOT_HELD end
  redis.call('HSET', readData, owner, readerData(t, val))
end
redis.call('PUBLISH', lockKey .. HOLDER, '')
return SET
