-- heartbeat: one side of a request says it is alive and learns how the other side is doing.
-- (claim.lua is prepended.)
--
-- KEYS[1]  {prefix:endpoint}:r:<id>        the request's state (see enqueue.lua)
-- KEYS[2]  processor: {prefix:endpoint}:t:<take id>, the take key; caller: the pending list
-- KEYS[3]  caller: its answer list {prefix:endpoint}:a:<id> (see respond.lua)
-- ARGV[1]  role: 'c' (the caller) or 'p' (the processor)
-- ARGV[2]  take id (processor) or '' (caller)
-- ARGV[3]  state TTL in ms while taken (refreshed here, so a live request never expires)
-- ARGV[4]  request id (processor) or the request's list element (caller)
-- ARGV[5]  processor node id (processor); caller: ms a request may stay popped and unclaimed
-- ARGV[6]  caller: the pending list's TTL in ms (the list may have to be created again);
--          processor: the take key's TTL in ms (a foreign request id's element goes back)
--
-- Halibut publishes heartbeats on per-request channels each side must subscribe to; here a
-- heartbeat is a timestamp in the state, so one command per interval both sends and checks,
-- and a missed pub/sub message cannot look like a dead node. The caller's beat is also its
-- pickup check and its response poll (a response whose message was missed is returned here).
-- The processor's first beat claims a request its response has not claimed yet. A queued request
-- the caller finds neither claimed nor in the pending list was popped by a node that has not
-- claimed it: the beat stamps mv, and once it has stayed so for ARGV[5] ms the request goes back
-- to the head of the pending list (the node died before handing it over, or its processor could
-- reach no node to claim it for that long: at least once), and the beat returns 'requeued'.
-- A caller's beat ends its answer-list wait (w): from then on a response is published on its node
-- channel, and a response pushed to the list meanwhile (returned here from the state) is removed.
-- (A list longer than POPPED_SCAN is not searched, for the cost: the pickup timeout's withdrawal
-- finds a popped request then.)
-- Returns {'missing'} when the state is gone; for the caller {state ('requeued' when it went
-- back), ms since the processor's last beat (taken), else 0, response or ''}; for the processor
-- {'not_taker'} when it does not hold the request, else {state, ms since the caller's last beat,
-- 1 if cancelled}.
local v = redis.call('HMGET', KEYS[1], 's', 'taker', 'hc', 'hp', 'x', 'resp', 'mv', 'w')
if not v[1] then
  if ARGV[1] == 'p' then
    take_out(KEYS[2], ARGV[4], ARGV[6])  -- drops the element it held
  end
  return {'missing'}
end
local POPPED_SCAN = 1000
local now = now_ms()
local stamp = string.format('%d', now)
if ARGV[1] == 'c' then
  redis.call('HSET', KEYS[1], 'hc', stamp)
  if v[8] then
    redis.call('HDEL', KEYS[1], 'w')
    redis.call('UNLINK', KEYS[3])
  end
  local silence = 0
  if v[1] == 't' then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    silence = now - tonumber(v[4])
  elseif v[1] == 'q' and v[7] then
    if now - tonumber(v[7]) > tonumber(ARGV[5]) then
      redis.call('LPUSH', KEYS[2], ARGV[4])
      redis.call('PEXPIRE', KEYS[2], ARGV[6])
      redis.call('HDEL', KEYS[1], 'mv')
      return {'requeued', 0, ''}
    end
  elseif v[1] == 'q' and redis.call('LLEN', KEYS[2]) <= POPPED_SCAN
      and not redis.call('LPOS', KEYS[2], ARGV[4], 'MAXLEN', POPPED_SCAN) then
    redis.call('HSET', KEYS[1], 'mv', stamp)
  end
  return {v[1], silence, v[6] or ''}
end
if v[1] == 'q' and take_out(KEYS[2], ARGV[4], ARGV[6]) then  -- the claim: the state taken
  v[1], v[2] = 't', ARGV[2]
  redis.call('HSET', KEYS[1], 's', 't', 'taker', ARGV[2], 'proc', ARGV[5], 'tk', stamp, 'hp', stamp)
elseif v[1] == 't' and v[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'hp', stamp)
else
  return {'not_taker'}
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local cancelled = 0
if v[5] == '1' then
  cancelled = 1
end
return {v[1], now - tonumber(v[3]), cancelled}
