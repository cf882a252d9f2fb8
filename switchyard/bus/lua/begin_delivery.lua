-- begin_delivery: what a delivery job needs, in one round trip: the subscriber's callback, uuid,
-- health points, end of backoff, Redis's clock, and the next batch (the head of its stream).
--
-- KEYS[1]  p.."sub:"..token   KEYS[2]  p.."events:"..token
--
-- Returns nil if the subscriber is gone, else {callback, uuid, hp, until, now, {{id, {"e", json}}, ...}}.
-- A stored max that is not a number is an error (the job is retried later, the worker goes on).
local meta = redis.call('HMGET', KEYS[1], 'callback', 'uuid', 'max', 'hp', 'until')
if not meta[1] then
  return nil
end
local max = 100
if meta[3] then
  max = tonumber(meta[3])
  if not max then
    return redis.error_reply('subscriber ' .. KEYS[1] .. ' has a max that is not a number')
  end
end
return {meta[1], meta[2] or '', tonumber(meta[4]) or 100, tonumber(meta[5]) or 0, now_ms(),
        redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', max)}
