-- commit.lua: phase two of an acquire (joined after lib.lua): offers token t to a
-- node that granted the lock.
--
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] readers, KEYS[4] readers' tokens
-- and values (a reader's grant records its token there).
-- ARGV[1] owner, ARGV[2] t, ARGV[3] raise: 1 for a reader's token drawn by the
-- nodes (see acquire.lua): t, the largest of them, is recorded and the counter
-- raised to it if below, never rejected; 0 the register's rule.
--
-- Returns ACCEPTED (0) when t was above the counter (counter and lock now carry t,
-- and the holder channel is told), the counter (> 0) when t is not above it
-- (rejected), LOST (-1) when the owner no longer holds the lock here.
local lockKey, fenceKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, t, raise = ARGV[1], ARGV[2], ARGV[3] == '1'
local ACCEPTED, LOST = 0, -1

local v, marked = lockValue(lockKey)
local val
if v then
  local h, old
  h, old, val = parts(v)
  if h ~= owner then return LOST end
else
  if not marked or readers(lockKey, readKey, readData) == 0 then return LOST end
  local rt
  rt, val = readerTok(readData, owner)
  if not rt then return LOST end
end
local c = fence(fenceKey)
if tonumber(t) > c then
  redis.call('SET', fenceKey, t)
elseif not raise then
  return c
end
if v then
  redis.call('SET', lockKey, join(owner, t, val), 'KEEPTTL')
else
  redis.call('HSET', readData, owner, readerData(t, val))
end
redis.call('PUBLISH', lockKey .. HOLDER, '')
return ACCEPTED
