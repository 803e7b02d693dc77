-- names.lua: the parts of the key names (see the key layout in names.go, whose
-- constants spell the same bytes; \31 is the byte 0x1f). Included by other scripts.
-- For a lock named K under prefix P:
--   lock key     P .. LOCK .. K
--   token key    lock key .. TOKEN
--   queue key    P .. QUEUE .. K
--   waiter key   P .. WAITER .. K .. SEP .. OWNER
--   wake channel P .. ':wake:' .. 24 hex digits
local LOCK, QUEUE, WAITER, SEP, TOKEN = ':lock\31', ':queue\31', ':waiter\31', '\31', '\31token'
