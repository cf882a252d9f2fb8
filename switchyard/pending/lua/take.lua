-- take: a processing node takes the next request of an endpoint (Dequeue's pop + get-and-delete).
--
-- KEYS[1]  {prefix:endpoint}:pending  list of waiting ids
-- KEYS[2]  {prefix:endpoint}:t:<take id>  string: the id this take got (replay record)
-- ARGV[1]  state key prefix, {prefix:endpoint}:r: (state keys are built here from popped ids:
--          they carry KEYS[1]'s hash tag, so they live in its Redis Cluster slot)
-- ARGV[2]  take id (new per dequeue attempt; the lease the response must present)
-- ARGV[3]  processor node id (its channel receives cancellations)
-- ARGV[4]  state TTL in ms once taken (sender timeout + 2 min; heartbeats refresh it)
-- ARGV[5]  replay record TTL in ms (longer than the client's retry window)
--
-- Pop and claim are one step: Halibut's LPOP then HMGET+DEL loses a request when the process
-- dies between them, or when a retried DEL's reply was lost. A retry of a take whose reply was
-- lost finds its replay record and gets the same request again. Ids whose state is gone
-- (withdrawn, expired) are skipped.
-- Returns false (nothing waiting) or {id, request message, caller node, enqueued ms, ids still
-- waiting} (0 waiting lets the node skip its next take until a pulse says something arrived).
local prev = redis.call('GET', KEYS[2])
if prev then
  local v = redis.call('HMGET', ARGV[1] .. prev, 's', 'taker', 'req', 'caller', 'at')
  if v[1] == 't' and v[2] == ARGV[2] then
    return {prev, v[3], v[4], v[5], redis.call('LLEN', KEYS[1])}
  end
  return false
end
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
while true do
  local id = redis.call('LPOP', KEYS[1])
  if not id then
    return false
  end
  local state = ARGV[1] .. id
  local v = redis.call('HMGET', state, 's', 'req', 'caller', 'at')
  if v[1] == 'q' then
    redis.call('HSET', state, 's', 't', 'taker', ARGV[2], 'proc', ARGV[3], 'tk', now, 'hp', now)
    redis.call('PEXPIRE', state, ARGV[4])
    redis.call('SET', KEYS[2], id, 'PX', ARGV[5])
    return {id, v[2], v[3], v[4], redis.call('LLEN', KEYS[1])}
  end
end
