-- ingest: accept one event on a topic: claim the topic for its first publisher, append the event
-- to every subscriber's stream and make each subscriber's delivery job due (now if its batch is
-- full or its timeout is 0, else at the oldest event's timeout). One script, so an event is either
-- queued for every subscriber or for none, and the order of the streams is the order of acceptance.
--
-- KEYS[1]  p.."topics"        KEYS[2]  p.."topic_events"   KEYS[3]  p.."tokens"
-- ARGV[1]  p   ARGV[2] topic   ARGV[3] publisher token   ARGV[4] the event's delivery JSON
--
-- Returns {1, subscribers reached}, {0, owner} when another publisher owns the topic, or {-1, ""}
-- when the publisher's token is not (or no longer) registered: the API authenticates a publish
-- here, in the same round trip.
local p, topic, publisher, event = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('HEXISTS', KEYS[3], publisher) == 0 then
  return {-1, ''}
end
local owner = redis.call('HGET', KEYS[1], topic)
if owner and owner ~= '' and owner ~= publisher then
  return {0, owner}
end
if owner ~= publisher then
  redis.call('HSET', KEYS[1], topic, publisher)
  if owner == '' then forget_unclaimed(p, topic) end
end
redis.call('HINCRBY', KEYS[2], topic, 1)
local now = now_ms()
local subs = redis.call('SMEMBERS', p .. 'subs:' .. topic)
for _, token in ipairs(subs) do
  redis.call('XADD', p .. 'events:' .. token, '*', 'e', event)
  schedule_delivery(p, token, now)
end
return {1, #subs}
