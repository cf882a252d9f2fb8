-- retry: a job asks to run again later (or raised): pending -> scheduled, still in the index.
--
-- KEYS[1]  the worker's pending list   KEYS[2]  p.."jobs:scheduled:"..q   KEYS[3]  p.."jobs:index:"..q
-- ARGV[1]  the job   ARGV[2] delay in ms
redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], int(now_ms() + tonumber(ARGV[2])), ARGV[1])
return 1
