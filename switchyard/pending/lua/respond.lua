-- respond: the processing node stores the response and tells the caller's node (ApplyResponse).
--
-- KEYS[1]  {prefix:endpoint}:r:<id>        the request's state (see enqueue.lua)
-- KEYS[2]  {prefix:endpoint}:t:<take id>   the take's replay record (removed here)
-- ARGV[1]  take id the request was taken with (a stale or foreign responder is refused)
-- ARGV[2]  response message (JSON)
-- ARGV[3]  response TTL in ms (20 min)
-- ARGV[4]  node channel prefix (the caller's channel is this plus its node id)
-- ARGV[5]  sender heartbeat timeout in ms (a caller silent that long is gone)
-- ARGV[6]  request id
--
-- Store, TTL and publish are one step (Halibut: three commands). The message carries the
-- response, so the caller needs no read; the stored copy is for a caller that missed it.
-- Returns 'delivered' (also for a retry of a delivered response), 'cancelled' (the caller
-- cancelled: nothing stored), 'abandoned' (the caller stopped heartbeating: nothing stored),
-- 'gone' (no such request: Redis lost it or it expired) or 'not_taker' (another take holds it).
local v = redis.call('HMGET', KEYS[1], 's', 'taker', 'caller', 'hc', 'x')
if not v[1] then
  redis.call('DEL', KEYS[2])
  return 'gone'
end
if v[2] ~= ARGV[1] then
  return 'not_taker'
end
if v[1] == 'a' then
  return 'delivered'
end
redis.call('DEL', KEYS[2])
if v[5] == '1' then
  redis.call('DEL', KEYS[1])
  return 'cancelled'
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if now - tonumber(v[4]) > tonumber(ARGV[5]) then
  redis.call('DEL', KEYS[1])
  return 'abandoned'
end
-- The request's body is dropped in the same HSET (emptied), not by a separate HDEL.
redis.call('HSET', KEYS[1], 's', 'a', 'resp', ARGV[2], 'req', '')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4] .. v[3], 'r' .. ARGV[6] .. '\n' .. ARGV[2])
return 'delivered'
