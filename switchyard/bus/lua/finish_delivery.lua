-- finish_delivery: settle a delivery job in one step, so that no event accepted meanwhile can be
-- left without a job: record the outcome, release the job, and queue it again if events wait.
--
-- KEYS[1]  the worker's pending list
-- ARGV[1]  p   ARGV[2] the job ("deliver:<token>")
-- ARGV[3]  outcome: "ok" (ARGV[4] = id of the last delivered entry, "" if none), "fail" (the
--          subscriber loses health points and backs off), "wait" (too early: backing off)
-- ARGV[5]  heal rate   ARGV[6] damage rate   ARGV[7] maximum backoff (ms)
--
-- Health points stay within 0..100; the backoff after a failure is round(max * 2^-hp) ms
-- (record_failure, which the scrubber also applies when the worker holding a delivery died).
-- Returns the health points after the change, or -1 if the subscriber is gone.
local p, job, outcome, last_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local token = string.sub(job, 9)
local key, stream = p .. 'sub:' .. token, p .. 'events:' .. token
redis.call('LREM', KEYS[1], 0, job)
redis.call('SREM', p .. 'jobs:index:main', job)
local now = now_ms()
if redis.call('EXISTS', key) == 0 then
  redis.call('DEL', stream)
  return -1
end
local hp = tonumber(redis.call('HGET', key, 'hp')) or 100
if outcome == 'ok' then
  if last_id ~= '' then
    redis.call('XTRIM', stream, 'MINID', id_after(last_id))
  end
  hp = math.min(100, hp + tonumber(ARGV[5]))
  redis.call('HSET', key, 'hp', hp, 'until', 0, 'last', int(now))
elseif outcome == 'fail' then
  hp = record_failure(p, token, now, tonumber(ARGV[6]), tonumber(ARGV[7]))
end
schedule_delivery(p, token, now)
return hp
