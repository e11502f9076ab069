#!lua name=tbbare
--[[
The bare Lua token bucket: the baseline `make bench` measures the Lua
library's tb_consume against (docs/benchmarks.md, its targets). Not a limiter
to use: no argument checks, no key-type checks, no clock-step or rounding
care, plain tostring (14 digits) for the stored numbers.

  FCALL bare_consume 1 key max rate [cost]

Per call: HMGET, TIME, the refill arithmetic, and on an admitted call HSET
and PEXPIRE. bench/run.sh also runs this body through EVALSHA, with the
register_function line below replaced by `return bare_consume(KEYS, ARGV)`.
]]
local function bare_consume(keys, args)
  local key = keys[1]
  local max, rate, cost = tonumber(args[1]), tonumber(args[2]), tonumber(args[3] or 1)
  local f = redis.call('HMGET', key, 'tokens', 'ts')
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local tokens = max
  if f[1] then
    tokens = math.min(max, tonumber(f[1]) + (now - tonumber(f[2])) / 1000000 * rate)
  end
  local allowed, retry = tokens >= cost, 0
  if allowed then
    tokens = tokens - cost
    redis.call('HSET', key, 'tokens', tostring(tokens), 'ts', tostring(now))
    redis.call('PEXPIRE', key, math.ceil((max - tokens) / rate * 1000))
  else
    retry = math.ceil((cost - tokens) / rate * 1000)
  end
  return { allowed and 1 or 0, math.floor(tokens), retry, math.ceil((max - tokens) / rate * 1000) }
end
redis.register_function('bare_consume', bare_consume)
