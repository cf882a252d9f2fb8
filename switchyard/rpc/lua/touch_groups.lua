-- touch_groups: mark worker groups Active because a request or worker activity was seen.
--
-- KEYS[1]  {prefix}groups      hash: worker key -> JSON {"s": status, "g": generation,
--                              "seen": last orphan/activity (ms), "since": entered status (ms)}
-- KEYS[2]  {prefix}generation  64-bit counter of expected-state generations
-- ARGV[1]  now, in milliseconds (the caller's clock: one process stamps a whole batch)
-- ARGV[2..] worker keys
--
-- A group that is absent or Unbound becomes Active under a new generation (the caller then
-- binds its queue). An Active group keeps its generation and only moves "seen" forward.
-- Returns a flat array: key, generation, changed (1 if it became Active now, else 0), ...
local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local key = ARGV[i]
  local raw = redis.call('HGET', KEYS[1], key)
  local group = raw and cjson.decode(raw) or nil
  if group and group.s == 'active' then
    if now > group.seen then
      group.seen = now
      redis.call('HSET', KEYS[1], key, cjson.encode(group))
    end
    table.insert(out, key)
    table.insert(out, group.g)
    table.insert(out, 0)
  else
    local gen = redis.call('INCR', KEYS[2])
    redis.call('HSET', KEYS[1], key, cjson.encode({s = 'active', g = gen, seen = now, since = now}))
    table.insert(out, key)
    table.insert(out, gen)
    table.insert(out, 1)
  end
end
return out
