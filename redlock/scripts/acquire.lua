-- acquire.lua: phase one of an acquire on one node (joined after lib.lua).
--
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] wait set, KEYS[4] readers, KEYS[5]
-- readers' tokens and values (see lib.lua).
-- ARGV[1] owner
-- ARGV[2] ttl in ms
-- ARGV[3] proposal: a token to accept if it is above this node's counter, or 0
-- ARGV[4] wait: 0 no; 1 record the owner as a waiter if the key is held; 2 the same,
--         and an earlier attempt may have recorded it, so a grant removes it
-- ARGV[5] patience in ms: the expiry of the waiter's place
-- ARGV[6] waiter key prefix (the waiter's key is the prefix and the owner)
-- ARGV[7] the client's wake-up channel
-- ARGV[8] waiting since (ms): the waiter's score in the wait set
-- ARGV[9] reenter: 1 the request says Reenter (driver.Request); 0 an owner that holds
--         the key here is refused like another owner, and not recorded as a waiter,
--         because the same owner id may be in use by another client or process
-- ARGV[10] shared: 1 a reader's attempt, 0 a writer's (or a mutex's)
-- ARGV[11] the number the client gave the wait, recorded with a writer's place so
--          that a release can hand it the lock (wake.lua's handOff); 0 for none
-- ARGV[12] the number the client gave this attempt, recorded with the place
-- ARGV[13] the grant's value (any bytes, not empty); absent for none
--
-- A writer is granted when the node has neither a lock value nor a live reader
-- (while readers hold, the lock key holds lib.lua's READERS). A reader is granted
-- when the node has no lock value and no live writer waits ahead of it (every live
-- writer in the wait set when the reader is not in it), so a stream of readers
-- cannot pass a queued writer. A waiter's key is described in lib.lua.
--
-- A writer's waiting attempt of the wait a release handed the lock to (the HANDED
-- mark names its channel and WID) claims it: the handed grant is taken as a free
-- lock and granted afresh (with the attempt's proposal, TTL and value), so that an
-- attempt that fails gives it back like any fresh grant.
--
-- Returns {status, counter, x[, rank]}:
--   {FRESH, c, p}      the lock was free and is now the owner's; c is the counter
--                      before; p is the proposal if it was accepted (counter and
--                      lock now carry it), else 0 for a writer, and for a reader
--                      c+1, a token the node drew (counter and entry carry it)
--   {REENTRY, c, t}    the owner already held it here (as the same kind: writer or
--                      reader) and reenter is 1: TTL
--                      extended, value replaced by the request's; t is the token
--                      recorded with it, 0 if none
--   {HELD, c, pttl, r[, s]}
--                      held by another owner; c is the counter (0 if missing); pttl
--                      its remaining TTL in ms (the readers': the last to lapse; -1 if
--                      unknown or only a queued writer is ahead); r the owner's rank in
--                      the wait set (0: oldest), NOT_QUEUED if it is not there. With
--                      wait 1 or 2 the owner is recorded as a waiter, and s is the
--                      shortest TTL in ms a place asked for (lib.lua's enqueue), -1
--                      when the owner was not recorded.
-- A grant whose proposal was accepted, and a re-entry that changes the value,
-- publish on the holder channel (a grant without a token is announced by the
-- commit that settles it).
local lockKey, fenceKey, waitKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, ttl, proposal, wait = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local patience, waiterPrefix, channel, since, reenter = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local shared, wid, seq, val = ARGV[10] == '1', ARGV[11], ARGV[12], ARGV[13]
local HELD, FRESH, REENTRY = 0, 1, 2
local NOT_QUEUED = -1

-- leave removes the owner's place, if an earlier attempt may have recorded one.
local function leave()
  if wait == '2' then
    redis.call('ZREM', waitKey, owner)
    redis.call('DEL', waiterPrefix .. owner)
  end
end

-- counter reads the counter without creating it.
local function counter()
  return tonumber(redis.call('GET', fenceKey) or '0')
end

-- held records the owner as a waiter if it waits, and returns HELD.
local function held(pttl)
  local shortest = -1
  if wait ~= '0' then
    local e = channel .. ' r'
    if not shared then e = writerEntry(channel, wid, seq, ttl, val) end
    shortest = enqueue(waitKey, waiterPrefix .. owner, owner, since, patience, e, ttl)
  end
  return {HELD, counter(), pttl, redis.call('ZRANK', waitKey, owner) or NOT_QUEUED, shortest}
end

-- writerAhead reports whether a live writer waits ahead of the owner (anywhere in
-- the wait set if the owner is not in it).
local function writerAhead()
  local i = 0
  while true do
    local w = redis.call('ZRANGE', waitKey, i, i)[1]
    if not w or w == owner then return false end
    local e = redis.call('GET', waiterPrefix .. w)
    if e and not select(2, waiterEntry(e)) then return true end
    i = i + 1
  end
end

-- grant takes the free lock for the owner: the lock value for a writer, a reader's
-- entry for a reader.
local function grant()
  local c = fence(fenceKey)
  leave()
  local p = tonumber(proposal)
  local t = '0'
  local accepted = p > c
  if accepted then
    redis.call('SET', fenceKey, proposal)
    t = proposal
  elseif shared then
    -- Readers that start together would reject each other's proposals round
    -- after round: the node draws a token for the reader instead, and the
    -- client raises the largest it got on a majority (commit.lua, raise).
    p = c + 1
    t = string.format('%d', p)
    redis.call('SET', fenceKey, t)
  else
    p = 0
  end
  if shared then
    putReader(lockKey, readKey, readData, owner, ttl, readerData(t, val))
  else
    redis.call('SET', lockKey, join(owner, t, val), 'PX', ttl)
  end
  -- A grant is announced once its token is known: here if the proposal was
  -- accepted, else by the commit (a reader told now would read token 0).
  if accepted then redis.call('PUBLISH', lockKey .. HOLDER, '') end
  return {FRESH, c, p}
end

local v, marked = lockValue(lockKey)
if not v then
  local n = 0
  if marked then n = readers(lockKey, readKey, readData) end
  if not shared then
    if n > 0 then return held(readerTTL(readKey)) end
    return grant()
  end
  local t, old
  if n > 0 then t, old = readerTok(readData, owner) end
  if not t then
    if writerAhead() then return held(-1) end
    -- The first reader: entries left without the marker (deleted by hand) are gone.
    if n == 0 then redis.call('DEL', readKey, readData) end
    return grant()
  end
  if reenter ~= '1' then return {HELD, counter(), readerTTL(readKey), NOT_QUEUED} end
  putReader(lockKey, readKey, readData, owner, ttl, readerData(t, val))
  if old ~= val then redis.call('PUBLISH', lockKey .. HOLDER, '') end
  leave()
  return {REENTRY, fence(fenceKey), tonumber(t)}
end
local h, t, old = parts(v)
if h == owner and not shared and wid ~= '0' and redis.call('GET', lockKey .. HANDED) == channel .. ' ' .. wid then
  redis.call('DEL', lockKey, lockKey .. HANDED)
  return grant()
end
if h == owner and (reenter ~= '1' or shared) then
  return {HELD, counter(), redis.call('PTTL', lockKey), NOT_QUEUED}
end
if h == owner then
  if old == val then
    redis.call('PEXPIRE', lockKey, ttl)
  else
    redis.call('SET', lockKey, join(owner, t, val), 'PX', ttl)
    redis.call('PUBLISH', lockKey .. HOLDER, '')
  end
  leave()
  return {REENTRY, fence(fenceKey), tonumber(t)}
end
return held(redis.call('PTTL', lockKey))
