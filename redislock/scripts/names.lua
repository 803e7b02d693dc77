-- names.lua: the parts of the key names (see the key layout in names.go, whose
-- constants spell the same bytes; \31 is the byte 0x1f). Included by other scripts.
-- For a lock named K under prefix P:
--   lock key        P .. LOCK .. K
--   token key       lock key .. TOKEN
--   value key       lock key .. VALUE
--   holder channel  lock key .. HOLDER
--   queue key       P .. QUEUE .. K
--   waiter key      P .. WAITER .. K .. SEP .. OWNER
--   wake channel    P .. ':wake:' .. 24 hex digits
-- RETAIN is how long, in ms, a key's token counter outlives its last grant (and
-- the holder's lease; see token.lua); the Go side may set it at load (scripts.go).
local RETAIN = 300000
local LOCK, QUEUE, WAITER, SEP, TOKEN, VALUE, HOLDER = ':lock\31', ':queue\31', ':waiter\31', '\31', '\31token', '\31value', '\31holder'
