-- give_back: a closing node returns a request its interrupted pop may have moved into a take key
-- (the pop ran in Redis, its reply was lost to the shutdown), to the head of the pending list,
-- where it was the oldest: the next poller takes it, instead of the caller waiting out the
-- processor timeout for a node that is gone.
--
-- KEYS[1]  {prefix:endpoint}:pending        the endpoint's pending list
-- KEYS[2]  {prefix:endpoint}:t:<take id>   the take key of the interrupted pop
-- ARGV[1]  pending list TTL in ms (the list may have to be created again)
--
-- Returns 1 if a request was given back, 0 if the take key held none.
local element = redis.call('LMOVE', KEYS[2], KEYS[1], 'RIGHT', 'LEFT')
if not element then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
