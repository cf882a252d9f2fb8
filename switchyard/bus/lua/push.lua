-- push: queue a job to run `delay` ms from now; a no-op if the same job is already queued to run
-- sooner, in any state (job uniqueness).
--
-- KEYS[1]  p.."jobs:index:"..q
-- ARGV[1]  p   ARGV[2] queue   ARGV[3] job   ARGV[4] delay in ms (0: instant)
--
-- Returns 1 if queued, 2 if an already scheduled copy was brought forward, 0 if left alone.
local now = now_ms()
return enqueue(ARGV[1], ARGV[2], ARGV[3], now + tonumber(ARGV[4]), now)
