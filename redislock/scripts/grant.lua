-- grant.lua: the rest of a new grant of the lock key lk to its owner, just SET
-- (with its marks) to expire ttl ms from now: issues the next fencing token into
-- n, sets the grant's value val (nil for none) to expire with the lock key, and
-- publishes on the holder channel. Included by other scripts, after names.lua,
-- inside a block whose locals lk, ttl and val it reads and that declares n.
--
-- The token is token(lk, ttl) of token.lua, inlined, with the expiry it reads
-- kept for the value key: a function statement makes a closure each time a
-- script runs it, and the uncontended path makes none. Keep the two alike.
local tk = lk .. TOKEN
n = redis.call('INCR', tk)
local at = redis.call('PEXPIRETIME', lk)
local now = (at - ttl) * 1000
if n < now then
  n = now
  redis.call('SET', tk, string.format('%d', n), 'PX', ttl + RETAIN)
else
  redis.call('PEXPIRE', tk, ttl + RETAIN + math.floor((n - now) / 1000) + 1)
end
-- The value key expires when the lock key does, to the millisecond (two PX in
-- one script may be a millisecond apart).
if val then redis.call('SET', lk .. VALUE, val, 'PXAT', at) end
redis.call('PUBLISH', lk .. HOLDER, '')
