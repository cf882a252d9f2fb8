-- unsubscribe: remove one subscriber from one topic. Queued events stay queued.
--
-- KEYS[1]  p.."subscribers"   KEYS[2]  p.."topics"
-- ARGV[1]  p   ARGV[2] token   ARGV[3] topic
--
-- Returns 1 if unsubscribed, -1 no such subscriber, -2 no such topic, -3 not subscribed.
local p, token, topic = ARGV[1], ARGV[2], ARGV[3]
if redis.call('SISMEMBER', KEYS[1], token) == 0 then return -1 end
if redis.call('HEXISTS', KEYS[2], topic) == 0 then return -2 end
if redis.call('SREM', p .. 'subs:' .. topic, token) == 0 then return -3 end
redis.call('SREM', p .. 'subtopics:' .. token, topic)
return 1
