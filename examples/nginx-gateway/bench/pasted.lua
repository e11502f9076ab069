-- The recipe users paste: a token bucket as one Redis script, called from
-- nginx's access phase through lua-resty-redis (make bench-nginx's
-- baseline; never used by the module). As blog posts and gateway plugins
-- write it: the client's clock in ARGV, one hash per key, written on every
-- call (denials too), expiring after twice the fill time.
--
--   EVALSHA <sha> 1 key rate capacity now requested  ->  {allowed, tokens}
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])

local fill_time = capacity / rate
local ttl = math.floor(fill_time * 2)

local last_tokens = tonumber(redis.call("hget", key, "tokens"))
if last_tokens == nil then
  last_tokens = capacity
end
local last_refreshed = tonumber(redis.call("hget", key, "ts"))
if last_refreshed == nil then
  last_refreshed = 0
end

local delta = math.max(0, now - last_refreshed)
local filled_tokens = math.min(capacity, last_tokens + (delta * rate))
local allowed = filled_tokens >= requested
local new_tokens = filled_tokens
if allowed then
  new_tokens = filled_tokens - requested
end

redis.call("hset", key, "tokens", new_tokens, "ts", now)
redis.call("expire", key, ttl)

return { allowed and 1 or 0, math.floor(new_tokens) }
