-- fence.lua: KEYS[1] = the fence key, KEYS[2..] = every key the commands use
-- ARGV[1] = the token, 20 decimal digits (zero-padded); ARGV[2] = the number of commands;
-- then, per command: its argument count n, a mask of n letters ("k": the argument is an
-- index into KEYS, "v": a value), its name, its n arguments.
-- Reply: {1, {the commands' replies}} when the token passed and the commands ran;
-- {0, stored} when the fence key holds a higher token (nothing was written).
--
-- Tokens are compared as two 10-digit halves: each half is below 10^10 < 2^53, so Lua's
-- doubles hold it exactly, and (hi, lo) orders like the 64-bit number.
local digits = 10
local kKey = string.byte('k')

local token = ARGV[1]
local stored = redis.call('GET', KEYS[1])
if stored then
	if #stored ~= 2 * digits or not string.match(stored, '^%d+$') then
		return redis.error_reply('dlock fence: key ' .. KEYS[1] .. ' holds "' .. stored .. '", not a fencing token')
	end
	local sh, th = tonumber(string.sub(stored, 1, digits)), tonumber(string.sub(token, 1, digits))
	if sh > th or (sh == th and tonumber(string.sub(stored, digits + 1)) > tonumber(string.sub(token, digits + 1))) then
		return {0, stored}
	end
end
-- The mark first: should a command fail half-way (Redis does not roll back), the
-- writes that did happen are marked with their token.
if stored ~= token then
	redis.call('SET', KEYS[1], token)
end

local replies = {}
local i = 3
for c = 1, tonumber(ARGV[2]) do
	local n, mask, name = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
	local args = {}
	for a = 1, n do
		local v = ARGV[i + 2 + a]
		if string.byte(mask, a) == kKey then
			v = KEYS[tonumber(v)]
		end
		args[a] = v
	end
	replies[c] = redis.call(name, unpack(args))
	i = i + 3 + n
end
return {1, replies}
