-- claim_spare: hand one waiting spare worker a key, atomically.
--
-- KEYS[1]  the pool's set of spares waiting for a key
-- KEYS[2]  that spare's assignment list (the spare waits on it with BLPOP)
-- ARGV[1]  the spare's worker id
-- ARGV[2]  the key
--
-- Returns 1 if this caller took the spare (it was waiting, and now has the key), 0 if another
-- caller took it first or it withdrew: whoever removes it from the set owns it, exactly one.
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
