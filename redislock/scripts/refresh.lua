-- refresh.lua: extends the owner's grant.
-- KEYS[1]  the lock key
-- ARGV[1]  the owner id
-- ARGV[2]  the new TTL, in ms
-- Returns 1 when extended, 0 when the owner does not hold the key.
local owner = ARGV[1]
local v = redis.call('GET', KEYS[1])
-- The holder's value is its owner id, alone or followed by a space and marks.
if v == owner or v and string.sub(v, 1, #owner + 1) == owner .. ' ' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
