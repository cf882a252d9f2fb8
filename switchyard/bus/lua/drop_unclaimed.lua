-- drop_unclaimed: remove unclaimed topics nobody subscribes to once they are old enough (a
-- client's subscriptions can create topics; without this, GET /topics grows for every client).
-- A topic still subscribed is seen again later (its age starts over); one claimed or deleted
-- meanwhile only leaves the index.
--
-- KEYS[1]  p.."topics"   KEYS[2]  p.."topic_events"
-- ARGV[1]  p   ARGV[2] age in ms   ARGV[3] at most this many topics looked at
--
-- Returns {topics dropped, topics looked at} (looked at = ARGV[3]: call again).
local p, age, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local index = p .. 'unclaimed'
local due = redis.call('ZRANGEBYSCORE', index, '-inf', int(now - age), 'LIMIT', 0, limit)
local dropped = 0
for _, topic in ipairs(due) do
  local owner = redis.call('HGET', KEYS[1], topic)
  if owner ~= '' then
    forget_unclaimed(p, topic)
  elseif redis.call('SCARD', p .. 'subs:' .. topic) > 0 then
    redis.call('ZADD', index, int(now), topic)
  else
    forget_unclaimed(p, topic)
    redis.call('HDEL', KEYS[1], topic)
    redis.call('HDEL', KEYS[2], topic)
    dropped = dropped + 1
  end
end
return {dropped, #due}
