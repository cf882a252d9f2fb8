-- heartbeat: one side of a request says it is alive and learns how the other side is doing.
--
-- KEYS[1]  {prefix:endpoint}:r:<id>   the request's state (see enqueue.lua)
-- ARGV[1]  role: 'c' (the caller) or 'p' (the processor)
-- ARGV[2]  take id (processor) or '' (caller)
-- ARGV[3]  state TTL in ms while taken (refreshed here, so a live request never expires)
--
-- Halibut publishes heartbeats on per-request channels each side must subscribe to; here a
-- heartbeat is a timestamp in the state, so one command per interval both sends and checks,
-- and a missed pub/sub message cannot look like a dead node. The caller's beat is also its
-- pickup check and its response poll (a response whose message was missed is returned here).
-- Returns {'missing'} when the state is gone; for the caller {state, ms since the processor's
-- last beat (0 unless taken), response or ''}; for the processor {'not_taker'} when it no
-- longer holds the request, else {state, ms since the caller's last beat, 1 if cancelled}.
local v = redis.call('HMGET', KEYS[1], 's', 'taker', 'hc', 'hp', 'x', 'resp')
if not v[1] then
  return {'missing'}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local stamp = string.format('%d', now)
if ARGV[1] == 'c' then
  redis.call('HSET', KEYS[1], 'hc', stamp)
  local silence = 0
  if v[1] == 't' then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    silence = now - tonumber(v[4])
  end
  return {v[1], silence, v[6] or ''}
end
if v[1] ~= 't' or v[2] ~= ARGV[2] then
  return {'not_taker'}
end
redis.call('HSET', KEYS[1], 'hp', stamp)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local cancelled = 0
if v[5] == '1' then
  cancelled = 1
end
return {v[1], now - tonumber(v[3]), cancelled}
