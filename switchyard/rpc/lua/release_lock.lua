-- release_lock: delete lock keys only where this holder's token is still the value.
--
-- KEYS[1..n]  lock keys
-- ARGV[1]     the holder's token
--
-- Returns how many locks were released (a lock that expired and was taken by another holder
-- is left alone).
local released = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    released = released + 1
  end
end
return released
