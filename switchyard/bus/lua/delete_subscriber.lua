-- delete_subscriber: a subscriber leaves: its subscriptions, settings and queued events go.
-- Its delivery job is removed unless a worker holds it (then the worker's finish drops it: the
-- job stays in the index meanwhile, so a new subscription under the same token cannot get a
-- second job delivering beside the first).
--
-- With ARGV[3] = '1' the token is revoked in the same step (Routemaster's rule: the subscriber
-- goes with its token; no delivery is made to a revoked token's callback afterwards).
--
-- KEYS[1]  p.."subscribers"
-- ARGV[1]  p   ARGV[2] token   ARGV[3] '1' to revoke the token too, else ''
--
-- Returns 1, or 0 if there was no such subscriber.
local p, token = ARGV[1], ARGV[2]
if ARGV[3] == '1' then
  redis.call('HDEL', p .. 'tokens', token)
  redis.call('DEL', p .. 'created:' .. token)  -- its topics stay, unclaimed, until housekeeping
end
if redis.call('SREM', KEYS[1], token) == 0 then return 0 end
local own = p .. 'subtopics:' .. token
for _, topic in ipairs(redis.call('SMEMBERS', own)) do
  redis.call('SREM', p .. 'subs:' .. topic, token)
end
redis.call('DEL', own, p .. 'sub:' .. token, p .. 'events:' .. token)
local job = 'deliver:' .. token
local removed = redis.call('ZREM', p .. 'jobs:scheduled:main', job)
  + redis.call('LREM', p .. 'jobs:instant:main', 0, job)
if removed > 0 then
  redis.call('SREM', p .. 'jobs:index:main', job)
end
return 1
