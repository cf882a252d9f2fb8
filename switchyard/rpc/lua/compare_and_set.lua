-- compare_and_set: change one worker group's state only if nobody changed it since it was read.
--
-- KEYS[1]  {prefix}groups   hash: worker key -> JSON state (see touch_groups.lua)
-- ARGV[1]  worker key
-- ARGV[2]  the JSON exactly as read
-- ARGV[3]  the new JSON, or "" to remove the group
--
-- Returns 1 if applied, 0 if the state had changed (an orphan or activity arrived meanwhile).
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1
