-- ack: a job is done: it leaves the worker's pending list and the queue's index.
--
-- KEYS[1]  the worker's pending list   KEYS[2]  p.."jobs:index:"..q
-- ARGV[1]  the job
redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
