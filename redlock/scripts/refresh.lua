-- refresh.lua: extends the owner's lock on one node (joined after lib.lua).
--
-- KEYS[1] lock, KEYS[2] fence counter.
-- ARGV[1] owner
-- ARGV[2] ttl in ms
-- ARGV[3] token: the grant's fencing token, 0 if unknown; a known token also raises
--         the node's counter to it, repairing a counter lost in a restart
-- ARGV[4] restore: 1 re-create the lock for the owner if the key is absent, else 0
--
-- Returns EXTENDED (1), OTHER (0) when another owner holds it, ABSENT (-1) when the
-- key is absent and restore is 0, RESTORED (2) when it was absent and re-created.
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
  local val = owner
  if tok > 0 then val = owner .. SEP .. token end
  if not redis.call('SET', lockKey, val, 'NX', 'PX', ttl) then return OTHER end
  repair()
  return RESTORED
end
if holder(v) ~= owner then return OTHER end
redis.call('PEXPIRE', lockKey, ttl)
repair()
return EXTENDED
