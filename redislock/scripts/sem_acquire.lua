-- sem_acquire.lua: one attempt to take a permit of a semaphore (a limit N > 1; see
-- sem.lua for the hash that keeps the holders), or a shared grant of a read-write
-- lock.
-- KEYS[1]  the lock key (P:lock 0x1f K)
-- ARGV[1]  the owner id
-- ARGV[2]  the TTL of the grant, in ms
-- ARGV[3]  the limit N, or "r" for a shared (read) grant (limit 1)
-- ARGV[4]  the key prefix P
-- ARGV[5]  for a waiting attempt "Q PATIENCE SEQ CHANNEL" (as for acquire.lua),
--          else ""
-- ARGV[6]  "x" when the request does not say Reenter, else ""
-- ARGV[7]  the value of the grant (any bytes, not empty); absent for none
-- Returns what sem_acquire of sem.lua returns.
--#include names.lua
--#include sem.lua
local limit, shared = tonumber(ARGV[3]), false
if ARGV[3] == 'r' then limit, shared = 1, true end
local w = ARGV[5]
if w == '' then w = nil end
return sem_acquire(KEYS[1], ARGV[1], tonumber(ARGV[2]), limit, shared, ARGV[4], w, ARGV[6], ARGV[7])
