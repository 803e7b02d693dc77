-- refresh.lua: extends the owner's lock on one node (joined after lib.lua).
--
-- KEYS[1] lock, KEYS[2] fence counter.
-- ARGV[1] owner
-- ARGV[2] ttl in ms
-- ARGV[3] token: the grant's fencing token, 0 if unknown; a known token also raises
--         the node's counter to it, repairing a counter lost in a restart
-- ARGV[4] restore: 1 re-create the lock for the owner if the key is absent, else 0
-- ARGV[5] with restore 1, the grant's value if it has one (absent otherwise)
--
-- Returns EXTENDED (1), OTHER (0) when another owner holds it, ABSENT (-1) when the
-- key is absent and restore is 0, RESTORED (2) when it was absent and re-created
-- (and the holder channel is told).
local lockKey, fenceKey = KEYS[1], KEYS[2]
local owner, ttl, token, restore = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local OTHER, EXTENDED, RESTORED, ABSENT = 0, 1, 2, -1
local tok = tonumber(token)

local function repair()
  if tok > 0 and fence(fenceKey) < tok then redis.call('SET', fenceKey, token) end
end

local v = redis.call('GET', lockKey)
if not v then
  if restore ~= '1' then return ABSENT end
  local t = '0'
  if tok > 0 then t = token end
  if not redis.call('SET', lockKey, join(owner, t, ARGV[5]), 'NX', 'PX', ttl) then return OTHER end
  repair()
  redis.call('PUBLISH', lockKey .. HOLDER, '')
  return RESTORED
end
if holder(v) ~= owner then return OTHER end
redis.call('PEXPIRE', lockKey, ttl)
repair()
return EXTENDED
