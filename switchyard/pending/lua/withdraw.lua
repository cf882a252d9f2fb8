-- withdraw: the caller takes its request back (pickup timeout) or cancels it.
--
-- KEYS[1]  {prefix:endpoint}:r:<id>   the request's state (see enqueue.lua)
-- KEYS[2]  {prefix:endpoint}:pending  list of waiting requests
-- ARGV[1]  request id
-- ARGV[2]  'timeout' (take back only if nobody took it) or 'cancel'
-- ARGV[3]  node channel prefix (the processor's channel is this plus its node id)
-- ARGV[4]  the request's list element (see enqueue.lua)
-- ARGV[5]  the endpoint's channel (nodes polling the endpoint: a popped, unclaimed request's
--          processor is not known yet)
--
-- Check and removal are one step, so a request is either withdrawn or taken, never both.
-- Returns {'withdrawn'} (it was still waiting: gone now), {'answered', response} (a response
-- beat the withdrawal: delivered, state removed), {'taken'} ('timeout': left to its processor;
-- a popped, unclaimed request is stamped mv, so the caller's beats can tell a processor that
-- died before claiming it), {'cancelled'} ('cancel' after pickup: flagged, the processor told on
-- its node's channel, or on the endpoint's while unclaimed) or {'missing'}.
local v = redis.call('HMGET', KEYS[1], 's', 'proc', 'resp', 'mv')
if not v[1] then
  return {'missing'}
end
if v[1] == 'q' then
  if redis.call('LREM', KEYS[2], 1, ARGV[4]) == 1 then
    redis.call('DEL', KEYS[1])
    return {'withdrawn'}
  end
  if ARGV[2] == 'timeout' then
    if not v[4] then
      local t = redis.call('TIME')
      redis.call('HSET', KEYS[1], 'mv', string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000)))
    end
    return {'taken'}
  end
  redis.call('HSET', KEYS[1], 'x', '1')
  redis.call('PUBLISH', ARGV[5], 'c' .. ARGV[1])
  return {'cancelled'}
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
