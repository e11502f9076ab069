-- The baseline of `make bench-leases`: the counting semaphore most Redis
-- users write, a sorted set of holder ids scored by their expiry (ms), as
-- one script. Written here for the comparison, from the recipe's usual
-- shape; not part of the project.
--
--   EVALSHA <sha> 1 key limit lease_ms id  -> 1 acquired, 0 full
--   ZREM key id                             (release)
--
-- Expired holders are pruned on each acquire; the key expires lease_ms
-- after the last acquire.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[3])
redis.call('PEXPIRE', KEYS[1], lease_ms)
return 1
