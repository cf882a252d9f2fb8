-- register_spare: a waiting spare (re)joins its pool's set, unless a key was handed to it already.
--
-- KEYS[1]  the pool's set of spares waiting for a key
-- KEYS[2]  that spare's assignment list
-- ARGV[1]  the spare's worker id
--
-- A claim removes the spare from the set and pushes a key onto its list in one script, so a spare
-- whose list holds a key was claimed: it must not be claimable again. Returns 1 if it is in the set.
if redis.call('LLEN', KEYS[2]) > 0 then
  return 0
end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
