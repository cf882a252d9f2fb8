-- claim: the prelude of respond.lua and heartbeat.lua (prepended when they load).
--
-- A poller's blocking pop (BLMOVE, pipelined with the PEXPIRE that gives the take key its TTL)
-- moves a request's list element from {prefix:endpoint}:pending to the take key
-- {prefix:endpoint}:t:<take id>, a list of that one element: the pop and the move are one
-- step in Redis, so a crash after it leaves the request in a key with a TTL, never lost in
-- between (Halibut's LPOP then HMGET+DEL loses it). The claim then marks the state taken. It is
-- lazy: a request answered quickly is claimed by its response (one script, not two); one still
-- running after the claim delay by its processor's first heartbeat (an HTTP polling service's
-- first heartbeat, after the initial delay).
--
-- claim(state key, take key, request id, take id, processor node, state TTL ms, now ms): true
-- when this take now holds the request; false when the take key no longer holds it (never
-- held, or already claimed) or the state is no longer queued (withdrawn, lost). The element
-- leaves the take key either way, which then no longer exists.
local function claim(state, take, id, take_id, proc, ttl, now)
  local held = redis.call('LINDEX', take, -1)
  if not held or string.sub(held, 1, 32) ~= id then
    return false
  end
  redis.call('RPOP', take)
  if redis.call('HGET', state, 's') ~= 'q' then
    return false
  end
  redis.call('HSET', state, 's', 't', 'taker', take_id, 'proc', proc, 'tk', now, 'hp', now)
  redis.call('PEXPIRE', state, ttl)
  return true
end

local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
