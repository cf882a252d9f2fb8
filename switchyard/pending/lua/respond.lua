-- respond: the processing node stores the response and tells the caller's node (ApplyResponse).
-- (claim.lua is prepended.)
--
-- KEYS[1]  {prefix:endpoint}:r:<id>        the request's state (see enqueue.lua)
-- KEYS[2]  {prefix:endpoint}:t:<take id>   the take key (holds the request until it is claimed)
-- KEYS[3]  {prefix:endpoint}:a:<id>        the caller's answer list (used when the state has w)
-- ARGV[1]  take id the request was taken with (a stale or foreign responder is refused)
-- ARGV[2]  response message (JSON)
-- ARGV[3]  response TTL in ms (20 min)
-- ARGV[4]  node channel prefix (the caller's channel is this plus its node id)
-- ARGV[5]  sender heartbeat timeout in ms (a caller silent that long is gone)
-- ARGV[6]  request id
-- ARGV[7]  processor node id (recorded if this response is also the claim)
-- ARGV[8]  take key TTL in ms (a foreign request id's element goes back with it)
--
-- Claim (if not yet claimed), store, TTL and publish are one step (Halibut: three commands): a
-- response that claims writes the claim and the answer in one HSET (an answered state needs no
-- taken-state stamps). The message carries the response, so the caller needs no read; the
-- stored copy is for a caller that missed it. A caller waiting in a blocking pop on its answer
-- list (w) gets the response pushed there instead (with the list's TTL in the same step), which
-- Redis hands to that pop: no pub/sub message, no read of the caller's own. Returns 'delivered' (also for a retry of a
-- delivered response), 'cancelled' (the caller cancelled: nothing stored), 'abandoned' (the
-- caller stopped heartbeating: nothing stored), 'gone' (no such request: withdrawn, lost or
-- expired) or 'not_taker' (another take holds it).
local v = redis.call('HMGET', KEYS[1], 's', 'taker', 'caller', 'hc', 'x', 'w')
if not v[1] then
  take_out(KEYS[2], ARGV[6], ARGV[8])  -- drops the element it held
  return 'gone'
end
local claims = v[1] == 'q'
if claims then
  if not take_out(KEYS[2], ARGV[6], ARGV[8]) then
    return 'not_taker'
  end
  v[2] = ARGV[1]
end
if v[2] ~= ARGV[1] then
  return 'not_taker'
end
if v[1] == 'a' then
  return 'delivered'
end
if v[5] == '1' then
  redis.call('DEL', KEYS[1])
  return 'cancelled'
end
if now_ms() - tonumber(v[4]) > tonumber(ARGV[5]) then
  redis.call('DEL', KEYS[1])
  return 'abandoned'
end
if claims then
  redis.call('HSET', KEYS[1], 's', 'a', 'resp', ARGV[2], 'taker', ARGV[1], 'proc', ARGV[7])
else
  redis.call('HSET', KEYS[1], 's', 'a', 'resp', ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if v[6] then
  redis.call('LPUSH', KEYS[3], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
else
  redis.call('PUBLISH', ARGV[4] .. v[3], 'r' .. ARGV[6] .. '\n' .. ARGV[2])
end
return 'delivered'
