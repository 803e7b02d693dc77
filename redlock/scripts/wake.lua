-- wake.lua: wake(waitKey, waiterPrefix, nonce, name, fenceKey, readersOnly), joined
-- in front of release.lua, force_release.lua and withdraw.lua. Defines no KEYS or
-- ARGV of its own.
--
-- wake wakes the oldest live waiter of this node, if any: it publishes
-- "NONCE OWNER COUNTER NAME" on the waiter's client channel (stored at
-- waiterPrefix .. OWNER, followed by " r" for a reader), COUNTER being this node's
-- fencing counter (0 if missing), so that the waiter's next attempt proposes a token
-- above it and settles it in one round; waiters whose place lapsed are dropped on
-- the way. When the oldest is a reader, the readers after it up to the first live
-- writer are woken too (they hold together). A woken waiter keeps its place until it
-- gets the lock or withdraws, so if another client beats it to the key it is first
-- again at the next release. nonce is the same on every node for one release; name
-- is the lock name. With readersOnly, a writer at the front is not woken (readers
-- hold). Returns the owner woken (the first, for a run of readers), or
-- nil.
local function wake(waitKey, waiterPrefix, nonce, name, fenceKey, readersOnly)
  local c = redis.call('GET', fenceKey) or '0'
  local first
  local i = 0
  while true do
    local w = redis.call('ZRANGE', waitKey, i, i)[1]
    if not w then return first end
    local ch = redis.call('GET', waiterPrefix .. w)
    if not ch then
      redis.call('ZREM', waitKey, w)
    else
      local reader = string.sub(ch, -2) == ' r'
      if (first or readersOnly) and not reader then return first end
      if reader then ch = string.sub(ch, 1, -3) end
      redis.call('PUBLISH', ch, nonce .. ' ' .. w .. ' ' .. c .. ' ' .. name)
      if not reader then return w end
      first = first or w
      i = i + 1
    end
  end
end
