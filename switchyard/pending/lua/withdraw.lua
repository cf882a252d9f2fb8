-- withdraw: the caller takes its request back (pickup timeout) or cancels it.
--
-- KEYS[1]  {prefix:endpoint}:r:<id>   the request's state (see enqueue.lua)
-- KEYS[2]  {prefix:endpoint}:pending  list of waiting ids
-- ARGV[1]  request id
-- ARGV[2]  'timeout' (take back only if nobody took it) or 'cancel'
-- ARGV[3]  node channel prefix (the processor's channel is this plus its node id)
--
-- Check and removal are one step, so a request is either withdrawn or taken, never both.
-- Returns {'withdrawn'} (it was still waiting: gone now), {'answered', response} (a response
-- beat the withdrawal: delivered, state removed), {'taken'} ('timeout': left to its processor),
-- {'cancelled'} ('cancel' after pickup: flagged, the processor's node told) or {'missing'}.
local v = redis.call('HMGET', KEYS[1], 's', 'proc', 'resp')
if not v[1] then
  return {'missing'}
end
if v[1] == 'q' then
  redis.call('DEL', KEYS[1])
  redis.call('LREM', KEYS[2], 1, ARGV[1])
  return {'withdrawn'}
end
if v[1] == 'a' then
  redis.call('DEL', KEYS[1])
  return {'answered', v[3]}
end
if ARGV[2] == 'timeout' then
  return {'taken'}
end
redis.call('HSET', KEYS[1], 'x', '1')
redis.call('PUBLISH', ARGV[3] .. v[2], 'c' .. ARGV[1])
return {'cancelled'}
