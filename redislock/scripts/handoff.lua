-- handoff.lua: defines hand_off(lock, prefix, key), which grants a lock that is
-- being freed to the first live queued waiter (its place names the TTL it asked
-- for), issues its token and publishes the grant on the waiter's channel as
-- "OWNER TOKEN SEQ TTL KEY", dropping dead places on the way; with no live waiter
-- it deletes the lock. Included by other scripts, after names.lua and token.lua.
local function hand_off(lock, prefix, key)
  local queue = prefix .. QUEUE .. key
  local wp = prefix .. WAITER .. key .. SEP
  while true do
    local h = redis.call('LPOP', queue)
    if not h then
      redis.call('DEL', lock)
      return
    end
    local e = redis.call('GETDEL', wp .. h)
    if e then
      local seq, ttl, ch = string.match(e, '^(%d+) (%d+) (%S+)$')
      if ch then
        -- Marked queued whether or not others wait: its release looks.
        redis.call('SET', lock, h .. ' h' .. ch .. ' q' .. #prefix, 'PX', ttl)
        local n = token(lock, ttl)
        redis.call('PUBLISH', ch, h .. ' ' .. string.format('%d', n) .. ' ' .. seq .. ' ' .. ttl .. ' ' .. key)
        return
      end
    end
  end
end
