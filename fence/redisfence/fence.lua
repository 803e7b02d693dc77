-- fence.lua: KEYS[1] = the fence key, KEYS[2..] = every key the commands use
-- ARGV[1] = the token, 20 decimal digits (zero-padded); then, per command: a mask of
-- one letter per argument ("k": the argument is an index into KEYS, "v": a value), the
-- command's name, its arguments.
-- Reply: the commands' replies, in order, when the token passed and they ran; the
-- error "DLOCKSTALE <stored>" when the fence key holds a higher token (nothing was
-- written).
--
-- Tokens are compared as two 10-digit halves: each half is below 10^10 < 2^53, so Lua's
-- doubles hold it exactly, and (hi, lo) orders like the 64-bit number.
local digits = 10
local kKey = string.byte('k')

local token = ARGV[1]
local stored = redis.call('GET', KEYS[1])
-- Equal tokens (one holder writing again, the common case) pass at once.
if stored ~= token then
	if stored then
		if #stored ~= 2 * digits or not string.match(stored, '^%d+$') then
			return redis.error_reply('dlock fence: key ' .. KEYS[1] .. ' holds "' .. stored .. '", not a fencing token')
		end
		local sh, th = tonumber(string.sub(stored, 1, digits)), tonumber(string.sub(token, 1, digits))
		if sh > th or (sh == th and tonumber(string.sub(stored, digits + 1)) > tonumber(string.sub(token, digits + 1))) then
			return redis.error_reply('DLOCKSTALE ' .. stored)
		end
	end
	-- The mark before the commands: should one fail half-way (Redis does not roll
	-- back), the writes that did happen are marked with their token.
	redis.call('SET', KEYS[1], token)
end

local replies = {}
local i = 2
while i <= #ARGV do
	local mask, name = ARGV[i], ARGV[i + 1]
	local n = #mask
	local args = {}
	for a = 1, n do
		local v = ARGV[i + 1 + a]
		if string.byte(mask, a) == kKey then
			v = KEYS[tonumber(v)]
		end
		args[a] = v
	end
	replies[#replies + 1] = redis.call(name, unpack(args))
	i = i + 2 + n
end
return replies
