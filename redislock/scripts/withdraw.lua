-- withdraw.lua: gives up a waiter's place and passes on a grant handed to it
-- (which its client never used), or a lock that is free while others wait.
-- KEYS[1]  the lock key
-- ARGV[1]  the owner id
-- ARGV[2]  the key prefix
-- ARGV[3]  the wake-up channel of the waiter's client
-- Returns 1.
--#include names.lua
--#include token.lua
--#include handoff.lua
local owner, prefix, ch = ARGV[1], ARGV[2], ARGV[3]
local key = string.sub(KEYS[1], #prefix + #LOCK + 1)
local wk = prefix .. WAITER .. key .. SEP .. owner
local e = redis.call('GET', wk)
-- A place is "SEQ TTL CHANNEL" and maybe a value: ours if it names our channel (a
-- waiter of the same owner on another client keeps its own).
-- A shared place's channel starts with the byte 0x1f (sem.lua).
local pc = e and string.match(e, '^%d+ %d+ (%S+)')
if pc and string.byte(pc, 1) == 31 then pc = string.sub(pc, 2) end
if not e or pc == ch then
  redis.call('LREM', prefix .. QUEUE .. key, 0, owner)
  if e then redis.call('DEL', wk) end
end
local v = redis.pcall('GET', KEYS[1])
-- A hash is a semaphore's lock key (sem.lua).
if type(v) == 'table' then
--#include sem.lua
  return sem_withdraw(KEYS[1], owner, ch)
end
-- A grant handed to us: the owner id and the handed mark, alone or before others.
local m = owner .. ' h' .. ch
if not v or v == m or string.sub(v, 1, #m + 1) == m .. ' ' then
  hand_off(KEYS[1], prefix, key)
end
return 1
