-- refresh.lua: extends the owner's lock or reader's grant on one node (joined after
-- lib.lua).
--
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] readers, KEYS[4] readers' tokens and
-- values.
-- ARGV[1] owner
-- ARGV[2] ttl in ms
-- ARGV[3] token: the grant's fencing token, 0 if unknown; a known token also raises
--         the node's counter to it, repairing a counter lost in a restart
-- ARGV[4] restore: 1 re-create the grant for the owner if it is absent, else 0
-- ARGV[5] with restore 1: 1 re-create it as a reader's, 0 as the lock value
-- ARGV[6] with restore 1, the grant's value if it has one (absent otherwise)
--
-- Returns EXTENDED (1), OTHER (0) when another owner holds it, ABSENT (-1) when the
-- owner's grant is absent and restore is 0, RESTORED (2) when it was absent and
-- re-created (and the holder channel is told). A grant is restored only where it
-- would have been granted: a lock value where the node has no live reader, a reader
-- where it has no lock value.
local lockKey, fenceKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl, token, restore, shared = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1'
local OTHER, EXTENDED, RESTORED, ABSENT = 0, 1, 2, -1
local tok = tonumber(token)

local function repair()
  if tok > 0 and fence(fenceKey) < tok then redis.call('SET', fenceKey, token) end
end

local v, marked = lockValue(lockKey)
if v then
  if holder(v) ~= owner then return OTHER end
  redis.call('PEXPIRE', lockKey, ttl)
  repair()
  return EXTENDED
end
local n = 0
if marked then n = readers(lockKey, readKey, readData) end
if n > 0 and readerTok(readData, owner) then
  putReader(lockKey, readKey, readData, owner, ttl, nil)
  repair()
  return EXTENDED
end
if restore ~= '1' then return ABSENT end
local t = '0'
if tok > 0 then t = token end
if shared then
  if n == 0 then redis.call('DEL', readKey, readData) end
  putReader(lockKey, readKey, readData, owner, ttl, readerData(t, ARGV[6]))
else
  if n > 0 then return OTHER end
  redis.call('SET', lockKey, join(owner, t, ARGV[6]), 'PX', ttl)
end
repair()
redis.call('PUBLISH', lockKey .. HOLDER, '')
return RESTORED
