-- enqueue: a caller puts one request on an endpoint's queue (QueueAndWait's first step).
--
-- KEYS[1]  {prefix:endpoint}:r:<id>   hash: the request's state (fields below)
-- KEYS[2]  {prefix:endpoint}:pending  list: requests waiting for pickup, oldest first
-- ARGV[1]  the list element: request id, caller's clock (ms), caller node id, then the request
--          message (JSON) after a newline. The element carries the whole request, so a poller's
--          blocking pop (BLMOVE) hands it over with no further read.
-- ARGV[2]  caller node id (its channel receives the response)
-- ARGV[3]  state TTL in ms (pickup timeout + 2 min)
-- ARGV[4]  pending list TTL in ms (1 day, refreshed on every push)
-- ARGV[5]  '1' when the caller waits for the response on its answer list (a blocking pop sent in
--          the same write as this script), else '0' (it waits on its node channel)
--
-- State fields: s = q (queued) | t (taken) | a (answered); resp; caller, proc (node ids); taker
-- (take id); at (enqueued), tk (taken), hc / hp (last caller / processor heartbeat), mv (when the
-- caller found its request popped but not yet claimed), all milliseconds of Redis's own clock
-- (TIME), so node clocks never disagree; x = 1: caller cancelled; w = 1: the response goes to
-- the caller's answer list {prefix:endpoint}:a:<id> (see respond.lua), not its node channel.
--
-- Halibut writes the hash, its TTL, the list push, the list TTL and the pulse as five commands;
-- here they are one, so a crash never leaves a key without a TTL or a request nobody can take.
-- No pulse: pollers wait in a blocking pop, which Redis wakes (one poller per request).
-- Idempotent: a retry whose first attempt ran (reply lost) changes nothing.
-- Returns 1 if queued now, 0 if this id was already queued.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 's', 'q', 'caller', ARGV[2], 'at', now, 'hc', now, 'w', '1')
else
  redis.call('HSET', KEYS[1], 's', 'q', 'caller', ARGV[2], 'at', now, 'hc', now)
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
