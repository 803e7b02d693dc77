-- wake.lua: wake(waitKey, waiterPrefix, nonce, name, fenceKey, readersOnly) and
-- handOff(waitKey, waiterPrefix, nonce, name, fenceKey, lockKey), joined after
-- lib.lua in front of release.lua, force_release.lua and withdraw.lua. Defines no
-- KEYS or ARGV of its own.
--
-- wake wakes the oldest live waiter of this node, if any: it publishes
-- "NONCE OWNER COUNTER NAME" on the waiter's client channel (see lib.lua's
-- waiterEntry), COUNTER being this node's fencing counter (0 if missing), so that
-- the waiter's next attempt proposes a token above it and settles it in one round;
-- waiters whose place lapsed are dropped on the way. When the oldest is a reader,
-- the readers after it up to the first live writer are woken too (they hold
-- together). A woken waiter keeps its place until it gets the lock or withdraws,
-- so if another client beats it to the key it is first again at the next release.
-- nonce is the same on every node for one release; name is the lock name. With
-- readersOnly, a writer at the front is not woken (readers hold). Returns the
-- owner woken (the first, for a run of readers), or nil.
--
-- handOff is wake for a lock that was just freed on this node (no lock value, no
-- reader), except that a writer at the front whose place asks for a handoff (WID
-- above 0) is granted the lock here and then: the node draws its token (counter +
-- 1, as for a reader), sets the lock value with the place's TTL and value and the
-- HANDED mark "CHANNEL WID", removes the place, and publishes "+NONCE OWNER
-- TOKEN SEQ TTL WID NAME" on its channel (and on the holder channel). Its client
-- returns the grant without asking again when copies from a majority of nodes carry
-- one token (see handoff.go). Returns the owner woken, "+" and the owner granted,
-- or nil.
local function wake(waitKey, waiterPrefix, nonce, name, fenceKey, readersOnly, lockKey)
  local c
  local first
  local i = 0
  while true do
    local w = redis.call('ZRANGE', waitKey, i, i)[1]
    if not w then return first end
    local e = redis.call('GET', waiterPrefix .. w)
    if not e then
      redis.call('ZREM', waitKey, w)
    else
      local ch, reader, wid, seq, ttl, val = waiterEntry(e)
      if (first or readersOnly) and not reader then return first end
      if lockKey and not reader and wid and wid ~= '0' then
        -- The handoff (lockKey is given by handOff only).
        local t = string.format('%d', fence(fenceKey) + 1)
        redis.call('SET', fenceKey, t)
        redis.call('SET', lockKey, join(w, t, val), 'PX', ttl)
        redis.call('SET', lockKey .. HANDED, ch .. ' ' .. wid, 'PX', ttl)
        redis.call('ZREM', waitKey, w)
        redis.call('DEL', waiterPrefix .. w)
        redis.call('PUBLISH', lockKey .. HOLDER, '')
        redis.call('PUBLISH', ch, '+' .. nonce .. ' ' .. w .. ' ' .. t .. ' ' .. seq .. ' ' .. ttl .. ' ' .. wid .. ' ' .. name)
        return '+' .. w
      end
      c = c or redis.call('GET', fenceKey) or '0'
      redis.call('PUBLISH', ch, nonce .. ' ' .. w .. ' ' .. c .. ' ' .. name)
      if not reader then return w end
      first = first or w
      i = i + 1
    end
  end
end

local function handOff(waitKey, waiterPrefix, nonce, name, fenceKey, lockKey)
  return wake(waitKey, waiterPrefix, nonce, name, fenceKey, false, lockKey)
end
