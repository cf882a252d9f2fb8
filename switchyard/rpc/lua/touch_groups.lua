-- touch_groups: worker groups were seen (an orphan request or worker activity).
--
-- KEYS[1]  {prefix}groups      hash: worker key -> JSON {"s": status, "g": generation,
--                              "seen": last orphan/activity (ms), "since": entered status (ms)}
-- KEYS[2]  {prefix}generation  64-bit counter of expected-state generations
-- ARGV[1]  now, in milliseconds (the caller's clock: one process stamps a whole batch)
-- ARGV[2]  mode:
--            "orphan"   a request is waiting: every group becomes Active (a stopped one too)
--            "activity" (caller holds the keys' locks) Active, Unbound and unknown groups become
--                       or stay Active; a Stopped group stays stopped: a report that arrives after
--                       the stop must not start the group again (only a request may)
--            "seen"     (no locks) Active groups move "seen" forward; nothing else changes
-- ARGV[3..] worker keys
--
-- A group that becomes Active gets a new generation (the caller then binds its queue); an Active
-- group keeps its generation and only moves "seen" forward.
-- Returns a flat array: key, generation, code, ... with code
--   0 = was Active (seen moved), 1 = became Active now, 2 = not Active, left alone ("seen" mode),
--   3 = Stopped, left alone ("activity" and "seen" modes).
local now = tonumber(ARGV[1])
local mode = ARGV[2]
local out = {}
for i = 3, #ARGV do
  local key = ARGV[i]
  local raw = redis.call('HGET', KEYS[1], key)
  local group = raw and cjson.decode(raw) or nil
  local code
  if group and group.s == 'active' then
    if now > group.seen then
      group.seen = now
      redis.call('HSET', KEYS[1], key, cjson.encode(group))
    end
    code = 0
  elseif mode ~= 'orphan' and group and group.s == 'stopped' then
    code = 3
  elseif mode == 'seen' then
    code = 2
  else
    local gen = redis.call('INCR', KEYS[2])
    group = {s = 'active', g = gen, seen = now, since = now}
    redis.call('HSET', KEYS[1], key, cjson.encode(group))
    code = 1
  end
  table.insert(out, key)
  table.insert(out, group and group.g or 0)
  table.insert(out, code)
end
return out
