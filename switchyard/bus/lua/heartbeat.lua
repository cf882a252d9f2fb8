-- heartbeat: these workers are alive now (Redis time).
--
-- KEYS[1]  p.."workers"
-- ARGV[1..] worker ids
local now = int(now_ms())
for i = 1, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], now)
end
return #ARGV
