-- autodrop: delete the oldest queued batch of all subscribers (the first `max` events of the
-- subscriber whose oldest event is the oldest), counting the dropped events.
--
-- KEYS[1]  p.."subscribers"   KEYS[2]  p.."counters"
-- ARGV[1]  p
--
-- Returns {token, events dropped}, or {} when nothing is queued.
local p = ARGV[1]
local oldest, oldest_ms, oldest_seq
for _, token in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local head = redis.call('XRANGE', p .. 'events:' .. token, '-', '+', 'COUNT', 1)[1]
  if head then
    local ms, seq = string.match(head[1], '^(%d+)%-(%d+)$')
    ms, seq = tonumber(ms), tonumber(seq)
    if oldest == nil or ms < oldest_ms or (ms == oldest_ms and seq < oldest_seq) then
      oldest, oldest_ms, oldest_seq = token, ms, seq
    end
  end
end
if oldest == nil then return {} end
local stream = p .. 'events:' .. oldest
local max = tonumber(redis.call('HGET', p .. 'sub:' .. oldest, 'max')) or 100
local batch = redis.call('XRANGE', stream, '-', '+', 'COUNT', max)
redis.call('XTRIM', stream, 'MINID', id_after(batch[#batch][1]))
redis.call('HINCRBY', KEYS[2], 'autodropped:' .. oldest, #batch)
return {oldest, #batch}
