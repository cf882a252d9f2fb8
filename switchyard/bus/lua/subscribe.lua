-- subscribe: create or update a subscriber and make its topic list exactly the given one
-- (topics not listed are unsubscribed; unknown topics are created unclaimed).
--
-- KEYS[1]  p.."subscribers"   KEYS[2]  p.."topics"
-- ARGV[1]  p   ARGV[2] token   ARGV[3] callback   ARGV[4] uuid
-- ARGV[5]  max ("" keeps the current value, default 100)
-- ARGV[6]  timeout in ms ("" keeps the current value, default 500)
-- ARGV[7..] topics
--
-- Health points survive a new subscription: re-subscribing is no way out of a backoff.
local p, token = ARGV[1], ARGV[2]
local key = p .. 'sub:' .. token
redis.call('SADD', KEYS[1], token)
redis.call('HSET', key, 'callback', ARGV[3], 'uuid', ARGV[4])
if ARGV[5] ~= '' then redis.call('HSET', key, 'max', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', key, 'timeout', ARGV[6]) end
redis.call('HSETNX', key, 'hp', 100)
local own = p .. 'subtopics:' .. token
local wanted = {}
for i = 7, #ARGV do
  local topic = ARGV[i]
  wanted[topic] = true
  redis.call('HSETNX', KEYS[2], topic, '')
  redis.call('SADD', p .. 'subs:' .. topic, token)
  redis.call('SADD', own, topic)
end
for _, topic in ipairs(redis.call('SMEMBERS', own)) do
  if not wanted[topic] then
    redis.call('SREM', own, topic)
    redis.call('SREM', p .. 'subs:' .. topic, token)
  end
end
-- max or timeout may have changed what is due
schedule_delivery(p, token, now_ms())
return 1
