-- token.lua: defines token(lock, ttl), which issues the next fencing token of the
-- lock key lock at a grant, right after lock was set to expire ttl ms from now, and
-- returns it. Included by other scripts, after names.lua.
--
-- The token is max(last + 1, server clock in ms x 1000), kept in the token counter.
-- The clock term keeps tokens rising where the counter went back: a restart that
-- lost it, or a promoted replica that had not received its last increments (the
-- clock has moved on since those were issued, unless it was set back). The counter
-- term keeps them strictly rising within a millisecond (up to 1000 grants in one
-- before the counter runs ahead of the clock) and under a clock set back. The clock
-- is read from the lock key's expiry (PEXPIRETIME, Redis 7.0) rather than TIME,
-- which costs a script about a microsecond more; the counter is written again only
-- when the millisecond has moved on past it.
--
-- The counter expires RETAIN ms after the lease its last grant made (a Refresh or
-- re-entry of a mutex pushes that out with the lease), and later still if it ran
-- ahead of the clock: never before the server clock, x 1000, has passed it. A
-- token issued after it expired is then the clock term, larger than every token
-- the counter held, so that a released key's state is bounded in time without
-- letting its tokens go down. In the common case (the millisecond moved on) the
-- expiry rides on the SET that was there anyway; otherwise it costs a PEXPIRE.
--
-- grant.lua, the uncontended path of acquire.lua and acquire_all.lua, has a copy
-- of these statements (a function statement makes a closure each time a script
-- runs it); keep the two alike.
local function token(lock, ttl)
  local tk = lock .. TOKEN
  local n = redis.call('INCR', tk)
  local now = (redis.call('PEXPIRETIME', lock) - ttl) * 1000
  if n < now then
    n = now
    redis.call('SET', tk, string.format('%d', n), 'PX', ttl + RETAIN)
  else
    redis.call('PEXPIRE', tk, ttl + RETAIN + math.floor((n - now) / 1000) + 1)
  end
  return n
end
