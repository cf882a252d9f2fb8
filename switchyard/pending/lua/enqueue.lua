-- enqueue: a caller puts one request on an endpoint's queue (QueueAndWait's first step).
--
-- KEYS[1]  {prefix:endpoint}:r:<id>   hash: the request's state (fields below)
-- KEYS[2]  {prefix:endpoint}:pending  list: ids waiting for pickup, oldest first
-- ARGV[1]  request id
-- ARGV[2]  request message (JSON)
-- ARGV[3]  caller node id (its channel receives the response)
-- ARGV[4]  state TTL in ms (pickup timeout + 2 min)
-- ARGV[5]  pending list TTL in ms (1 day, refreshed on every push)
-- ARGV[6]  the endpoint's pulse channel
--
-- State fields: s = q (queued) | t (taken) | a (answered); req, resp; caller, proc (node ids);
-- taker (take id); at (enqueued), tk (taken), hc / hp (last caller / processor heartbeat), all
-- milliseconds of Redis's own clock (TIME), so node clocks never disagree; x = 1: caller cancelled.
--
-- Halibut writes the hash, its TTL, the list push, the list TTL and the pulse as five commands;
-- here they are one, so a crash never leaves a key without a TTL or a request nobody can take.
-- Idempotent: a retry whose first attempt ran (reply lost) changes nothing.
-- Returns 1 if queued now, 0 if this id was already queued.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
redis.call('HSET', KEYS[1], 's', 'q', 'req', ARGV[2], 'caller', ARGV[3], 'at', now, 'hc', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PUBLISH', ARGV[6], ARGV[1])
return 1
