-- subscribe: create or update a subscriber and make its topic list exactly the given one
-- (topics not listed are unsubscribed; unknown topics are created unclaimed, at most ARGV[7]
-- of them per client at a time: each counts until it is claimed or deleted).
--
-- KEYS[1]  p.."subscribers"   KEYS[2]  p.."topics"
-- ARGV[1]  p   ARGV[2] token   ARGV[3] callback   ARGV[4] uuid
-- ARGV[5]  max ("" keeps the current value, default 100)
-- ARGV[6]  timeout in ms ("" keeps the current value, default 500)
-- ARGV[7]  how many unclaimed topics the client may have created
-- ARGV[8]  '1': the token must be registered (the API's: a revocation between its check and this
--          script leaves no subscriber behind), '': any token (tests and benchmarks)
-- ARGV[9..] topics
--
-- Returns 1; -1 when the token must be registered and is not (or no longer); -2 when the new topics would pass the bound
-- (nothing written). Health points survive a new subscription: re-subscribing is no way out of a
-- backoff.
local p, token = ARGV[1], ARGV[2]
if ARGV[8] == '1' and redis.call('HEXISTS', p .. 'tokens', token) == 0 then return -1 end
local created = p .. 'created:' .. token
local new = {}
for i = 9, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then new[#new + 1] = ARGV[i] end
end
if #new > 0 and redis.call('SCARD', created) + #new > tonumber(ARGV[7]) then return -2 end
local now = now_ms()
for _, topic in ipairs(new) do
  redis.call('HSET', KEYS[2], topic, '')
  redis.call('ZADD', p .. 'unclaimed', now, topic)
  redis.call('HSET', p .. 'topic_creator', topic, token)
  redis.call('SADD', created, topic)
end
local key = p .. 'sub:' .. token
redis.call('SADD', KEYS[1], token)
redis.call('HSET', key, 'callback', ARGV[3], 'uuid', ARGV[4])
if ARGV[5] ~= '' then redis.call('HSET', key, 'max', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', key, 'timeout', ARGV[6]) end
redis.call('HSETNX', key, 'hp', 100)
local own = p .. 'subtopics:' .. token
local wanted = {}
for i = 9, #ARGV do
  local topic = ARGV[i]
  wanted[topic] = true
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
schedule_delivery(p, token, now)
return 1
