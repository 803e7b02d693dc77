-- acquire_all.lua: takes every lock of a set at once if each is free, else none
-- (driver.MultiAcquirer).
-- KEYS     the lock keys (P:lock 0x1f K), distinct
-- ARGV[1]  the owner id, holding none of them
-- ARGV[2]  the TTL of every grant, in ms
-- Returns the tokens (each > 0), one per key in order, when every key is free as a
-- plain attempt of acquire.lua without Reenter finds it: no lock key, or a
-- semaphore's or read-write lock's hash with neither live holders nor live queued
-- places (lapsed ones do not count); a key a release handed to a queued place is
-- held. Each key is then granted as acquire.lua grants a free one: SET with PX,
-- a token from the key's own counter, a message on its holder channel. Otherwise
-- {0, I, PTTL}, changing nothing: I the index of the first key found taken, PTTL
-- the time in ms until its (earliest) holder's grant expires, or -1 if unknown.
--#include names.lua
local owner, ttl, val = ARGV[1], ARGV[2], nil
-- The GET of each lock key, up to the first held as a mutex: false for none, a
-- table (an error, caught) for a hash.
local vs, hashed, first = {}, false, nil
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) == 'table' then
    hashed = true
  elseif v then
    first = i
    break
  end
  vs[i] = v
end
if hashed then
--#include sem.lua
  local now = sem_now()
  for i = 1, (first or #KEYS + 1) - 1 do
    if vs[i] then
      local limit, _, hs = sem_busy(KEYS[i], now)
      if limit then
        local soon
        for _, h in ipairs(hs) do
          if not soon or h[2] < soon then soon = h[2] end
        end
        if soon then return {0, i, soon - now} end
        return {0, i, -1}
      end
    end
  end
  -- Hashes with neither holders nor queued places: those keys are free.
  if not first then
    for i = 1, #KEYS do
      if vs[i] then redis.call('DEL', KEYS[i]) end
    end
  end
end
if first then return {0, first, redis.call('PTTL', KEYS[first])} end
local ns = {}
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], owner, 'PX', ttl)
  local lk, n = KEYS[i], nil
--#include grant.lua
  ns[i] = n
end
return ns
