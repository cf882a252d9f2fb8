-- delete_topic: remove a topic and every subscription to it (queued events stay queued).
-- Only its publisher may (or root; an unclaimed topic the client whose subscription created it, or
-- root): Routemaster let any client delete any topic.
--
-- KEYS[1]  p.."topics"   KEYS[2]  p.."topic_events"
-- ARGV[1]  p   ARGV[2] topic   ARGV[3] caller token ("" for root)
--
-- Returns 1 if deleted, 0 no such topic, -1 not the caller's topic.
local p, topic, caller = ARGV[1], ARGV[2], ARGV[3]
local owner = redis.call('HGET', KEYS[1], topic)
if not owner then return 0 end
if caller ~= '' and owner ~= caller
    and not (owner == '' and redis.call('HGET', p .. 'topic_creator', topic) == caller) then
  return -1
end
forget_unclaimed(p, topic)
local subs = p .. 'subs:' .. topic
for _, token in ipairs(redis.call('SMEMBERS', subs)) do
  redis.call('SREM', p .. 'subtopics:' .. token, topic)
end
redis.call('DEL', subs)
redis.call('HDEL', KEYS[1], topic)
redis.call('HDEL', KEYS[2], topic)
return 1
