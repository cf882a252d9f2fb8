-- _prelude: helpers prepended to every bus script (Redis scripts cannot include one another).
--
-- Key layout (p = ARGV[1] = "switchyard:bus:{<bus>}:"; the braces are a Redis Cluster hash tag,
-- so every key below, declared or built here from p, lives in the slot of the declared KEYS):
--   p.."tokens"                hash   API token -> client name
--   p.."topics"                hash   topic -> publisher token ("" while unclaimed)
--   p.."topic_events"          hash   topic -> events ever published
--   p.."unclaimed"             zset   unclaimed topic -> when it was created (or last seen
--                                     subscribed by housekeeping), ms
--   p.."topic_creator"         hash   unclaimed topic -> the token whose subscription created it
--   p.."created:"..token       set    unclaimed topics the token created (its bound counts these)
--   p.."subscribers"           set    subscriber tokens
--   p.."sub:"..token           hash   callback, uuid, max, timeout, hp, until (no delivery before,
--                                     ms), last (last attempt, ms)
--   p.."subs:"..topic          set    tokens subscribed to the topic
--   p.."subtopics:"..token     set    topics the token is subscribed to
--   p.."events:"..token        stream the subscriber's queued events, field "e" = delivery JSON;
--                                     entry ids are Redis time at acceptance, so order = acceptance
--   p.."jobs:index:"..q        set    every job of queue q in any state (uniqueness)
--   p.."jobs:scheduled:"..q    zset   job -> run time (ms)
--   p.."jobs:instant:"..q      list   jobs to run now (LPUSH in, taken from the right)
--   p.."jobs:pending:"..q..":"..worker  list  the job a worker runs (at most one)
--   p.."jobs:pending_index:"..q set   workers that may hold a pending job of queue q
--   p.."workers"               hash   worker id -> last heartbeat (ms)
--   p.."counters"              hash   cumulative counters (autodropped:<token>, ...)
-- All times are Redis's own clock (TIME), so Lambda functions and workers never disagree.

local function int(x)
  return string.format('%d', x)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The millisecond part of a stream entry id ("<ms>-<seq>").
local function id_ms(id)
  return tonumber(string.match(id, '^(%d+)'))
end

-- The id just after `id`: XTRIM MINID with it removes `id` and everything before.
local function id_after(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return ms .. '-' .. int(tonumber(seq) + 1)
end

-- Put `job` in the instant list if `run_at` has come, else in the scheduled set at `run_at`.
local function place(p, q, job, run_at, now)
  if run_at <= now then
    redis.call('LPUSH', p .. 'jobs:instant:' .. q, job)
  else
    redis.call('ZADD', p .. 'jobs:scheduled:' .. q, int(run_at), job)
  end
end

-- Make `job` run at `run_at` (ms) on queue `q` unless it is already queued to run sooner: a job
-- is in at most one state (scheduled, instant or pending) at a time; a scheduled one is brought
-- forward. Returns 1 if queued, 2 if brought forward, 0 if left alone.
local function enqueue(p, q, job, run_at, now)
  if redis.call('SADD', p .. 'jobs:index:' .. q, job) == 1 then
    place(p, q, job, run_at, now)
    return 1
  end
  local scheduled = p .. 'jobs:scheduled:' .. q
  local score = redis.call('ZSCORE', scheduled, job)
  if score and run_at < tonumber(score) then
    if run_at <= now then
      redis.call('ZREM', scheduled, job)
    end
    place(p, q, job, run_at, now)
    return 2
  end
  return 0
end

-- When a subscriber's next batch is due (ms), or nil if nothing waits: now when a full batch
-- waits, else when the oldest waiting event's timeout ends; never before its backoff ends.
local function delivery_due(p, token, now)
  local stream = p .. 'events:' .. token
  local len = redis.call('XLEN', stream)
  if len == 0 then
    return nil
  end
  local meta = redis.call('HMGET', p .. 'sub:' .. token, 'max', 'timeout', 'until')
  local max, timeout = tonumber(meta[1]) or 100, tonumber(meta[2]) or 500
  local due = now
  if len < max then
    local head = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
    due = id_ms(head[1][1]) + timeout
  end
  local backoff_until = tonumber(meta[3]) or 0
  if backoff_until > due then
    due = backoff_until
  end
  return due
end

-- A topic stops being unclaimed (claimed by its first publisher, or deleted): it no longer
-- counts against the client whose subscription created it.
local function forget_unclaimed(p, topic)
  redis.call('ZREM', p .. 'unclaimed', topic)
  local creator = redis.call('HGET', p .. 'topic_creator', topic)
  if creator then
    redis.call('SREM', p .. 'created:' .. creator, topic)
    redis.call('HDEL', p .. 'topic_creator', topic)
  end
end

local function schedule_delivery(p, token, now)
  local due = delivery_due(p, token, now)
  if due then
    enqueue(p, 'main', 'deliver:' .. token, due, now)
  end
end


-- A failed delivery of the subscriber `token` (an answer other than 2xx, or the worker that held
-- it died): it loses `damage` health points (within 0..100) and gets no delivery for
-- round(max_backoff * 2^-hp) ms. Returns the health points after the change.
local function record_failure(p, token, now, damage, max_backoff)
  local key = p .. 'sub:' .. token
  local hp = math.max(0, (tonumber(redis.call('HGET', key, 'hp')) or 100) - damage)
  local backoff = math.floor(max_backoff * 2 ^ (-hp) + 0.5)
  redis.call('HSET', key, 'hp', hp, 'until', int(now + backoff), 'last', int(now))
  return hp
end
