-- promote: scheduled jobs whose time has come become instant (oldest first).
--
-- KEYS[1]  p.."jobs:scheduled:"..q   KEYS[2]  p.."jobs:instant:"..q
-- ARGV[1]  at most this many
--
-- Returns how many were promoted.
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now_ms()), 'LIMIT', 0, tonumber(ARGV[1]))
if #items > 0 then
  redis.call('LPUSH', KEYS[2], unpack(items))
  redis.call('ZREM', KEYS[1], unpack(items))
end
return #items
