-- scrub: workers unseen for longer than the limit are dead: their pending jobs go back to the
-- instant queue (a delivery in flight is redone: at-least-once) and they are forgotten.
--
-- KEYS[1]  p.."workers"
-- ARGV[1]  p   ARGV[2] unseen for more than this many ms   ARGV[3..] queue names
--
-- Returns {jobs put back, workers forgotten}.
local p, max_age = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local function dead(worker)
  local seen = tonumber(redis.call('HGET', KEYS[1], worker))
  return seen == nil or now - seen > max_age
end
local jobs, forgotten = 0, 0
for i = 3, #ARGV do
  local q = ARGV[i]
  local index = p .. 'jobs:pending_index:' .. q
  for _, worker in ipairs(redis.call('SMEMBERS', index)) do
    if dead(worker) then
      local pending = p .. 'jobs:pending:' .. q .. ':' .. worker
      while redis.call('RPOPLPUSH', pending, p .. 'jobs:instant:' .. q) do
        jobs = jobs + 1
      end
      redis.call('SREM', index, worker)
    end
  end
end
for _, worker in ipairs(redis.call('HKEYS', KEYS[1])) do
  if dead(worker) then
    local holds = false
    for i = 3, #ARGV do
      if redis.call('SISMEMBER', p .. 'jobs:pending_index:' .. ARGV[i], worker) == 1 then holds = true end
    end
    if not holds then
      redis.call('HDEL', KEYS[1], worker)
      forgotten = forgotten + 1
    end
  end
end
return {jobs, forgotten}
