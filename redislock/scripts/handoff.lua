-- handoff.lua: defines hand_off(lock, prefix, key, novalue), which grants a lock
-- that is being freed to the first live queued waiter (its place names the TTL and
-- the value it asked for), issues its token and publishes the grant on the
-- waiter's channel as "OWNER TOKEN SEQ TTL KEY", dropping dead places on the way;
-- with no live waiter it deletes the lock. novalue says that the grant being freed
-- had no value (no " v" mark), so there is no value key to delete. A shared place
-- at the head turns the lock into a read-write lock's hash, held by the leading run
-- of shared places (sem.lua). Either way it publishes on the holder channel.
-- Included by other scripts, after names.lua and token.lua.
local function hand_off(lock, prefix, key, novalue)
  local queue = prefix .. QUEUE .. key
  local wp = prefix .. WAITER .. key .. SEP
  redis.call('PUBLISH', lock .. HOLDER, '')
  while true do
    local h = redis.call('LPOP', queue)
    if not h then
      redis.call('DEL', lock, lock .. VALUE)
      return
    end
    local e = redis.call('GETDEL', wp .. h)
    if e then
      -- "SEQ TTL CHANNEL", then a space and the value if there is one.
      local seq, ttl, ch, val = string.match(e, '^(%d+) (%d+) (%S+) ?(.*)$')
      if ch and string.byte(ch, 1) == 31 then
        -- A shared place (its channel marked by the byte 0x1f): the key becomes
        -- a read-write lock's hash (sem.lua), and the leading run of shared
        -- places holds it at once. The place goes back for rw_pump, which takes
        -- it again at once (the script runs alone).
        redis.call('LPUSH', queue, h)
        redis.call('SET', wp .. h, e, 'PX', 1000)
--#include sem.lua
        redis.call('DEL', lock, lock .. VALUE)
        redis.call('HSET', lock, LIMITF, '1 ' .. #prefix)
        rw_pump(lock, queue, wp, key, nil, nil, false, sem_now())
        return
      end
      if ch then
        -- Marked queued whether or not others wait: its release looks.
        local v = h .. ' h' .. ch .. ' q' .. #prefix
        if val ~= '' then
          redis.call('SET', lock, v .. ' v', 'PX', ttl)
          redis.call('SET', lock .. VALUE, val, 'PXAT', redis.call('PEXPIRETIME', lock))
        else
          redis.call('SET', lock, v, 'PX', ttl)
          if not novalue then redis.call('DEL', lock .. VALUE) end
        end
        local n = token(lock, ttl)
        redis.call('PUBLISH', ch, h .. ' ' .. string.format('%d', n) .. ' ' .. seq .. ' ' .. ttl .. ' ' .. key)
        return
      end
    end
  end
end
