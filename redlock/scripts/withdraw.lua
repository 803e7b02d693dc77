-- withdraw.lua: gives up a waiter's place on one node (joined after lib.lua and
-- wake.lua). A grant a release handed to the place (the lock held by the owner,
-- with the HANDED mark naming the wait) is given back and handed on,
-- as by a release: a wait that gives up leaves nothing behind, even a grant still
-- on its way to it. A writer's place given up where the node has no lock value
-- wakes the run of readers that may now be at the front of the queue: a reader
-- waits behind a queued writer even while readers hold, and once that writer is
-- gone it can join them. Nothing else is woken (a woken mutex waiter that gives up
-- leaves the next one to its fallback timer, as before read-write locks).
--
-- KEYS[1] wait set, KEYS[2] lock, KEYS[3] fence counter (read for the wake-up),
-- KEYS[4] readers, KEYS[5] readers' tokens and values.
-- ARGV[1] owner, ARGV[2] waiter key prefix, ARGV[3] nonce (the same on every node
-- for one withdrawal), ARGV[4] the lock name, ARGV[5] the waiter's client channel
-- and the number its client gave the wait ("CHANNEL WID": a writer's place made by
-- another wait of the owner id is then left alone), or empty (the place, whatever
-- wait made it), ARGV[6] 1 to give back a grant handed to that wait and leave the
-- owner's place alone (a copy of a handoff to a wait that is over: the owner id may
-- wait again, with a new place), else 0.
--
-- Returns 1, or 2 when it gave back a grant handed to the waiter.
local waitKey, lockKey, fenceKey, readKey, readData = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, waiterPrefix, nonce, name, mark, handedOnly = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6] == '1'

local e
if not handedOnly then
  e = redis.call('GET', waiterPrefix .. owner)
  local ch, reader, wid
  if e then ch, reader, wid = waiterEntry(e) end
  if e and mark ~= '' and not reader and wid and wid ~= '0' and ch .. ' ' .. wid ~= mark then
    e = nil -- the place of another wait of the owner id (it waits again): left alone
  else
    redis.call('ZREM', waitKey, owner)
    redis.call('DEL', waiterPrefix .. owner)
  end
end
local v = lockValue(lockKey)
if v and holder(v) == owner and redis.call('GET', lockKey .. HANDED) == mark then
  redis.call('DEL', lockKey, lockKey .. HANDED)
  redis.call('PUBLISH', lockKey .. HOLDER, '')
  if redis.call('EXISTS', waitKey) == 1 then handOff(waitKey, waiterPrefix, nonce, name, fenceKey, lockKey) end
  return 2
end
if not e or select(2, waiterEntry(e)) then return 1 end
if v or redis.call('EXISTS', waitKey) == 0 then return 1 end
wake(waitKey, waiterPrefix, nonce, name, fenceKey, true)
return 1
