-- claim: the prelude of respond.lua and heartbeat.lua (prepended when they load).
--
-- A poller's blocking pop (BLMOVE, pipelined with the PEXPIRE that gives the take key its TTL)
-- moves a request's list element from {prefix:endpoint}:pending to the take key
-- {prefix:endpoint}:t:<take id>, a list of that one element: the pop and the move are one
-- step in Redis, so a crash after it leaves the request in a key with a TTL, never lost in
-- between (Halibut's LPOP then HMGET+DEL loses it). The claim then marks the state taken. It is
-- lazy: a request answered quickly is claimed by its response (one script, not two: respond.lua
-- writes the claim and the answer in one HSET); one still running after the claim delay by its
-- processor's first heartbeat (an HTTP polling service's first heartbeat, after the initial
-- delay).
--
-- take_out(take key, request id, take key TTL ms): true when the take key held the request's
-- element, which leaves it (the key then no longer exists); false when it held none, or another
-- request's (a foreign request id with this take id: that element goes back, with its TTL).
local function take_out(take, id, take_ttl)
  local held = redis.call('RPOP', take)
  if not held then
    return false
  end
  if string.sub(held, 1, 32) ~= id then
    redis.call('RPUSH', take, held)
    redis.call('PEXPIRE', take, take_ttl)
    return false
  end
  return true
end

local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
