-- wake.lua: wake(waitKey, waiterPrefix, nonce, name, fenceKey), joined in front of
-- release.lua and force_release.lua. Defines no KEYS or ARGV of its own.
--
-- wake wakes the oldest live waiter of this node, if any: it publishes
-- "NONCE OWNER COUNTER NAME" on the waiter's client channel (stored at
-- waiterPrefix .. OWNER), COUNTER being this node's fencing counter (0 if missing),
-- so that the waiter's next attempt proposes a token above it and settles it in one
-- round; waiters whose place lapsed are dropped on the way. The woken waiter keeps
-- its place until it gets the lock or withdraws, so if another client beats it to
-- the key it is first again at the next release. nonce is the same on every node for one release;
-- name is the lock name. Returns the owner woken, or nil.
local function wake(waitKey, waiterPrefix, nonce, name, fenceKey)
  while true do
    local first = redis.call('ZRANGE', waitKey, 0, 0)[1]
    if not first then return nil end
    local ch = redis.call('GET', waiterPrefix .. first)
    if ch then
      local c = redis.call('GET', fenceKey) or '0'
      redis.call('PUBLISH', ch, nonce .. ' ' .. first .. ' ' .. c .. ' ' .. name)
      return first
    end
    redis.call('ZREM', waitKey, first)
  end
end
