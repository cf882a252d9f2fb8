-- take: claim a popped request at once (the HTTP long poll: its service answers from elsewhere).
-- (claim.lua is prepended.)
--
-- KEYS[1]  {prefix:endpoint}:r:<id>        the request's state (see enqueue.lua)
-- KEYS[2]  {prefix:endpoint}:t:<take id>   the take key holding the popped element
-- ARGV[1]  request id
-- ARGV[2]  take id
-- ARGV[3]  processor node id
-- ARGV[4]  state TTL in ms once taken (sender timeout + 2 min; heartbeats refresh it)
--
-- Idempotent: a retry after a lost reply finds the request taken by this same take.
-- Returns 1 if this take holds the request, 0 if it was withdrawn or lost before the claim.
if redis.call('HGET', KEYS[1], 'taker') == ARGV[2] then
  return 1
end
if claim(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], string.format('%d', now_ms())) then
  return 1
end
return 0
