-- queue.lua: lists the live queued places of a lock, in the order they will be
-- served. Read only.
-- KEYS[1]  the lock key
-- ARGV[1]  the key prefix
-- Returns, for each live place (its waiter key not expired, as sem_places and
-- the pumps count it), oldest first: owner, pttl of the place in ms, 1 if shared
-- else 0, value or false. A place handed a grant has left the queue: it is a
-- holder.
--#include names.lua
local prefix = ARGV[1]
local key = string.sub(KEYS[1], #prefix + #LOCK + 1)
local wp = prefix .. WAITER .. key .. SEP
local r = {}
for _, h in ipairs(redis.call('LRANGE', prefix .. QUEUE .. key, 0, -1)) do
  local e = redis.call('GET', wp .. h)
  local ch, val
  if e then _, _, ch, val = string.match(e, '^(%d+) (%d+) (%S+) ?(.*)$') end
  if ch then
    r[#r + 1] = h
    r[#r + 1] = redis.call('PTTL', wp .. h)
    if string.byte(ch, 1) == 31 then r[#r + 1] = 1 else r[#r + 1] = 0 end
    if val ~= '' then r[#r + 1] = val else r[#r + 1] = false end
  end
end
return r
