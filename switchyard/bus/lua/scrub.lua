-- scrub: workers unseen for longer than the limit are dead: their pending jobs are put back (a
-- delivery in flight is redone: at-least-once) and they are forgotten. A delivery the dead worker
-- held counts as a failed delivery of its subscriber (record_failure: health points, backoff), so
-- a subscriber whose answers kill workers is not retried at once by the next one.
--
-- KEYS[1]  p.."workers"
-- ARGV[1]  p   ARGV[2] unseen for more than this many ms   ARGV[3] damage rate
-- ARGV[4]  maximum backoff (ms)   ARGV[5..] queue names
--
-- Returns {jobs put back, workers forgotten}.
local p, max_age = ARGV[1], tonumber(ARGV[2])
local damage, max_backoff = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local function dead(worker)
  local seen = tonumber(redis.call('HGET', KEYS[1], worker))
  return seen == nil or now - seen > max_age
end
local function put_back(q, job)
  local token = string.sub(job, 9)
  if q == 'main' and string.sub(job, 1, 8) == 'deliver:' and redis.call('EXISTS', p .. 'sub:' .. token) == 1 then
    redis.call('SREM', p .. 'jobs:index:main', job)
    record_failure(p, token, now, damage, max_backoff)
    schedule_delivery(p, token, now)
  else
    redis.call('LPUSH', p .. 'jobs:instant:' .. q, job)
  end
end
local jobs, forgotten = 0, 0
for i = 5, #ARGV do
  local q = ARGV[i]
  local index = p .. 'jobs:pending_index:' .. q
  for _, worker in ipairs(redis.call('SMEMBERS', index)) do
    if dead(worker) then
      local pending = p .. 'jobs:pending:' .. q .. ':' .. worker
      local job = redis.call('RPOP', pending)
      while job do
        put_back(q, job)
        jobs = jobs + 1
        job = redis.call('RPOP', pending)
      end
      redis.call('SREM', index, worker)
    end
  end
end
for _, worker in ipairs(redis.call('HKEYS', KEYS[1])) do
  if dead(worker) then
    local holds = false
    for i = 5, #ARGV do
      if redis.call('SISMEMBER', p .. 'jobs:pending_index:' .. ARGV[i], worker) == 1 then holds = true end
    end
    if not holds then
      redis.call('HDEL', KEYS[1], worker)
      forgotten = forgotten + 1
    end
  end
end
return {jobs, forgotten}
