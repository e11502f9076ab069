#!lua name=tb
--[[
redis-tokenbucket, Lua fallback: the TB.* contract as a Redis Functions
library, for servers that cannot load the module (managed Redis/Valkey).

  FCALL    tb_consume  1 key max rate [cost]
  FCALL_RO tb_peek     1 key max rate [cost]
  FCALL    tb_mconsume N key1..keyN max1 rate1 cost1 ... maxN rateN costN
  FCALL    tb_adjust   1 key max rate delta
  FCALL    tb_cl_throttle 1 key max_burst count period [quantity]
  FCALL_RO tb_version  0                  -> the library's version

Load with: redis-cli -x FUNCTION LOAD REPLACE < lua/tb.lua

The module (core/src/*.rs, src/commands.rs, src/keyspace.rs) is the
authority. This file repeats its floating-point operations in the same
order, so replies and stored balances are bit-identical, and uses the same
hash layout, so both can serve the same keys.

The block between the "shared" markers is also the body of the EVAL
script, which lua/gen_eval.py builds from it (`make` writes it to
target/lua/tb-eval.lua): EVALSHA <sha> numkeys key... <operation> arg...
The block must only define locals.
]]

-- >>> shared: begin
local MAX_CAPACITY = 1e12
local MAX_RATE = 1e12
local MAX_FILL_SECONDS = 1e10
local MAX_GROUPS = 10000
-- The longest wait a reply reports, in ms (tb-core's MAX_WAIT_MS).
local MAX_WAIT_MS = 1e14
-- The smallest positive double, 2^-1074 (a literal: the library body runs
-- before `math` is reachable).
local TINY = 4.9406564584124654e-324

local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local NOT_A_BUCKET = 'ERR key is not a token bucket: '
local BAD_FIELDS = NOT_A_BUCKET .. 'the hash must hold exactly the fields tokens and ts'
local BAD_TOKENS = NOT_A_BUCKET .. 'field tokens is not a finite decimal number'
local BAD_TS = NOT_A_BUCKET .. 'field ts is not an integer of microseconds'

-- ---- errors (texts of core/src/args.rs) -----------------------------------

-- ' (group N)' in TB.MCONSUME messages, nothing otherwise.
local function in_group(g)
  if g then return ' (group ' .. g .. ')' end
  return ''
end

local function arity_error(name)
  return redis.error_reply("ERR wrong number of arguments for '" .. name .. "' command")
end

local function not_a_number(arg, g)
  return 'ERR ' .. arg .. ' must be a finite decimal number' .. in_group(g)
end

-- ---- numbers (core/src/number.rs) ------------------------------------------

-- The strict decimal grammar [+-]? (digits ["." digits*] | "." digits)
-- [(e|E) [+-]? digits]. tonumber alone would also take hex, "inf", "nan"
-- and surrounding spaces, so the text is checked first. Returns nil for
-- anything else, including values that overflow to infinity.
local function parse_decimal(s)
  local i = 1
  local sign = string.sub(s, 1, 1)
  if sign == '+' or sign == '-' then i = 2 end
  local rest = string.match(s, '^%d+%.?%d*()', i) or string.match(s, '^%.%d+()', i)
  if not rest then return nil end
  if rest <= #s and not string.find(s, '^[eE][+-]?%d+$', rest) then return nil end
  -- strtod underneath: correctly rounded, like Rust's parse.
  local v = tonumber(s)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return nil end
  return v
end

-- An optionally negative integer of at most 16 digits (the `ts` field), as
-- two exact halves {hi, lo} with value hi * 1e8 + lo: 16 digits can exceed
-- 2^53, and the module subtracts in exact integers before rounding once.
local function parse_int16(s)
  local neg, digits = string.match(s, '^(%-?)(%d+)$')
  if not digits or #digits > 16 then return nil end
  local cut = #digits - 8
  local hi = cut > 0 and tonumber(string.sub(digits, 1, cut)) or 0
  local lo = tonumber(string.sub(digits, cut > 0 and cut + 1 or 1))
  if neg == '-' then return { -hi, -lo } end
  return { hi, lo }
end

-- ---- arguments (core/src/args.rs, same order of checks) -------------------

-- max and rate, or nil and the error text.
local function parse_limits(max_s, rate_s, g)
  local max = parse_decimal(max_s)
  if not max then return nil, not_a_number('max', g) end
  if not (max > 0 and max <= MAX_CAPACITY) then
    return nil, 'ERR max must be > 0 and <= 1e12' .. in_group(g)
  end
  local rate = parse_decimal(rate_s)
  if not rate then return nil, not_a_number('rate', g) end
  if not (rate > 0 and rate <= MAX_RATE) then
    return nil, 'ERR rate must be > 0 and <= 1e12' .. in_group(g)
  end
  if max / rate > MAX_FILL_SECONDS then
    return nil, 'ERR rate is too low for max: max/rate must be <= 1e10 seconds' .. in_group(g)
  end
  return { max = max, rate = rate }
end

local function cost_above_max(g)
  return 'ERR cost must not exceed max, it could never pass' .. in_group(g)
end

-- Whether a positive cost is too small to charge a bucket of this max:
-- subtracting it from max, or from the double just below max, rounds back
-- to that balance (tb-core's charges_nothing). Lua lacks nextafter, so the
-- double below max is max minus the gap found from max's exponent.
local function charges_nothing(cost, max)
  -- Above max / 2^52 every cost charges (the gap below max is at most
  -- max / 2^52): skip the exponent work for ordinary costs.
  if cost * 4503599627370496 > max then return false end
  local m, e = math.frexp(max) -- max = m * 2^e, 0.5 <= m < 1
  local gap = math.ldexp(1, e - 53)
  if m == 0.5 then gap = gap / 2 end -- below a power of two the gap halves
  if gap < TINY then gap = TINY end -- subnormals: one step of 2^-1074
  local below = max - gap
  return cost > 0 and (max - cost == max or below - cost == below)
end

local function parse_cost(s, limits, g)
  local cost = parse_decimal(s)
  if not cost then return nil, not_a_number('cost', g) end
  if cost < 0 then return nil, 'ERR cost must be >= 0' .. in_group(g) end
  if cost > limits.max then return nil, cost_above_max(g) end
  if charges_nothing(cost, limits.max) then
    return nil, 'ERR cost is too small to charge a bucket of this max: use 0 or at least max/2^53' .. in_group(g)
  end
  return cost
end

-- ---- bucket arithmetic (core/src/bucket.rs, operation for operation) ------

local function refill(l, tokens, elapsed_us)
  return math.min(tokens + elapsed_us / 1000000 * l.rate, l.max)
end

-- Keeps a balance in [-max, max]: a lowered max clamps stored tokens.
local function clamp(l, tokens)
  return math.min(math.max(tokens, -l.max), l.max)
end

-- The balance at `now` of a bucket stored as `stored` (false: missing,
-- a full bucket): the one function every call evaluates. A ts ahead of
-- now counts as no time elapsed, so nothing refills until the clock
-- reaches it.
local function current_at(l, stored, hi, lo)
  local max = l.max
  if not stored then return max end
  -- (now - ts) rounded once: every partial result here is an exact integer.
  local elapsed = (hi - stored.ts[1]) * 1e8 + (lo - stored.ts[2])
  if elapsed < 0 then elapsed = 0 end
  -- clamp() and refill() written out: the times search calls this a few
  -- times per call, and a Lua call costs more than the arithmetic.
  local tokens = math.min(math.max(stored.tokens, -max), max)
  return math.min(tokens + elapsed / 1000000 * l.rate, max)
end

local function current(l, stored, now)
  return current_at(l, stored, now.hi, now.lo)
end

-- Whether a call `ms` whole milliseconds after `now` sees at least
-- `target`: now moved on as exact halves, with no table made per try.
local function passes(l, stored, now, ms, target)
  local hi = math.floor(ms / 100000)
  return current_at(l, stored, now.hi + hi, now.lo + (ms - hi * 100000) * 1000) >= target
end

-- The smallest m >= 1 that passes, for passes false at 0 and monotone:
-- gallop from the guess until the answer is bracketed, then bisect.
-- Gives up at MAX_WAIT_MS.
local function first_passing(guess, l, stored, now, target)
  local lo, hi
  local step = 1
  if passes(l, stored, now, guess, target) then
    hi, lo = guess, guess - 1
    while lo > 0 and passes(l, stored, now, lo, target) do
      hi = lo
      step = step * 2
      lo = math.max(hi - step, 0)
    end
  else
    lo, hi = guess, guess + 1
    while not passes(l, stored, now, hi, target) do
      if hi >= MAX_WAIT_MS then return MAX_WAIT_MS end
      lo = hi
      step = step * 2
      hi = math.min(lo + step, MAX_WAIT_MS)
    end
  end
  while hi - lo > 1 do
    local mid = lo + math.floor((hi - lo) / 2)
    if passes(l, stored, now, mid, target) then hi = mid else lo = mid end
  end
  return hi
end

-- Whole ms from `now` until a call on `stored`, with no traffic between,
-- sees at least `target`, including the wait until a future ts; `cur` is
-- the balance at now, which the caller knows. The search runs on
-- current() itself, the function the next call evaluates, so rounding
-- can't make the answer early or late; a closed form only guesses.
local function ms_from(l, stored, now, cur, target)
  if cur >= target then return 0 end
  if not stored then return 0 end
  -- The refill counts from ts, ahead of now (a wait first) or behind it.
  local from_ts = (stored.ts[1] - now.hi) * 1e8 + (stored.ts[2] - now.lo)
  local guess = math.ceil((from_ts + (target - clamp(l, stored.tokens)) / l.rate * 1000000) / 1000)
  if guess >= 1 then guess = math.min(guess, MAX_WAIT_MS) else guess = 1 end
  return first_passing(guess, l, stored, now, target)
end

-- An outcome: allowed, the balance after the call, retry and reset in ms,
-- and whether the call writes. Both times are measured on the state the
-- call leaves: a write restarts the refill at now, a call that writes
-- nothing leaves the stored state (and any wait until its ts) in place.
-- retry_for: the amount the retry time waits for (nil: retry 0).
local function settle(l, stored, now, allowed, tokens, writes, retry_for)
  local after = stored
  if writes then
    after = false
    if tokens < l.max then after = { tokens = tokens, ts = { now.hi, now.lo } } end
  end
  -- `tokens` is what `after` holds at now: the balance if nothing was
  -- written, else what was.
  local retry = 0
  if retry_for then retry = ms_from(l, after, now, tokens, retry_for) end
  return { allowed = allowed, tokens = tokens, retry = retry, reset = ms_from(l, after, now, tokens, l.max), writes = writes }
end

-- A consume (charge true) or a peek of `cost` against `cur`, the balance
-- of `stored` at `now`. A charge of 0 writes nothing.
local function charge(l, stored, now, cur, cost, charging)
  local allowed = cur >= cost
  local writes = charging and allowed and cost > 0
  local tokens = cur
  if writes then tokens = cur - cost end
  local retry_for = nil
  if not allowed then retry_for = cost end
  return settle(l, stored, now, allowed, tokens, writes, retry_for)
end

-- retry is for a request of cost 1, or max if smaller.
local function adjust(l, stored, now, delta)
  local tokens = clamp(l, current(l, stored, now) + delta)
  return settle(l, stored, now, true, tokens, true, math.min(l.max, 1))
end

-- {allowed, remaining, retry_after_ms, reset_after_ms}; all are already
-- whole numbers, so the integer replies are exact.
local function reply(o)
  return { o.allowed and 1 or 0, math.floor(o.tokens), o.retry, o.reset }
end

-- ---- the keyspace (src/keyspace.rs) ---------------------------------------

-- The server clock, read once per call. Exact integers throughout: us for
-- `ts`, hi/lo halves (us = hi * 1e8 + lo) for elapsed time, and the next
-- whole ms for expiry (the module rounds now up).
local function clock()
  local t = redis.call('TIME')
  local sec, usec = tonumber(t[1]), tonumber(t[2])
  return {
    us = sec * 1000000 + usec,
    sec = sec,
    usec = usec,
    hi = math.floor(sec / 100),
    lo = (sec % 100) * 1000000 + usec,
    ceil_ms = sec * 1000 + math.ceil(usec / 1000),
  }
end

-- A key's bucket: false if the key is missing, else {tokens, ts}. On error
-- nil and the message (state errors carry the group in TB.MCONSUME).
local function load(key, g)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then return false end
  if kind ~= 'hash' then return nil, WRONGTYPE end
  if redis.call('HLEN', key) ~= 2 then return nil, BAD_FIELDS .. in_group(g) end
  local f = redis.call('HMGET', key, 'tokens', 'ts')
  if not f[1] or not f[2] then return nil, BAD_FIELDS .. in_group(g) end
  local tokens = parse_decimal(f[1])
  if not tokens then return nil, BAD_TOKENS .. in_group(g) end
  local ts = parse_int16(f[2])
  if not ts then return nil, BAD_TS .. in_group(g) end
  return { tokens = tokens, ts = ts }
end

-- Stores a new balance, or deletes the key when the bucket is full (no key
-- is a full bucket). The expiry is when it would be full again.
local function save(key, existed, l, o, now)
  if o.tokens >= l.max then
    if existed then redis.call('DEL', key) end
    return
  end
  local tokens = o.tokens
  if tokens == 0 then tokens = 0 end -- never write "-0"
  -- %.17g round-trips a double (tostring would keep only 14 digits).
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens),
    'ts', string.format('%d', now.us))
  redis.call('PEXPIREAT', key, string.format('%d', now.ceil_ms + o.reset))
end

-- ---- the operations (src/commands.rs) -------------------------------------

-- CONSUME and PEEK arguments: limits and cost, or nil and an error reply.
local function single_args(name, keys, args)
  if #keys ~= 1 or #args < 2 or #args > 3 then return nil, nil, arity_error(name) end
  local l, err = parse_limits(args[1], args[2])
  if not l then return nil, nil, redis.error_reply(err) end
  local cost = 1
  if #args == 3 then
    cost, err = parse_cost(args[3], l)
    if not cost then return nil, nil, redis.error_reply(err) end
  elseif l.max < 1 then
    -- The default cost of 1 could never pass a bucket this small.
    return nil, nil, redis.error_reply(cost_above_max())
  end
  return l, cost
end

-- tb_consume (`charging`) and tb_peek: parse, load, charge or look, and
-- save what changed. A denied call, one of cost 0, or a peek writes nothing.
local function consume_or_peek(name, keys, args, charging)
  local l, cost, failed = single_args(name, keys, args)
  if not l then return failed end
  local now = clock()
  local stored, err = load(keys[1])
  if stored == nil then return redis.error_reply(err) end
  local o = charge(l, stored, now, current(l, stored, now), cost, charging)
  if o.writes then save(keys[1], stored, l, o, now) end
  return reply(o)
end

local function tb_consume(keys, args)
  return consume_or_peek('tb_consume', keys, args, true)
end

-- Read-only (registered no-writes): a peek never writes.
local function tb_peek(keys, args)
  return consume_or_peek('tb_peek', keys, args, false)
end

-- tb_adjust: refund (delta > 0) or late charge (delta < 0); always saves.
local function tb_adjust(keys, args)
  if #keys ~= 1 or #args ~= 3 then return arity_error('tb_adjust') end
  local l, err = parse_limits(args[1], args[2])
  if not l then return redis.error_reply(err) end
  local delta = parse_decimal(args[3])
  if not delta then return redis.error_reply(not_a_number('delta')) end
  local now = clock()
  local stored
  stored, err = load(keys[1])
  if stored == nil then return redis.error_reply(err) end
  local o = adjust(l, stored, now, delta)
  save(keys[1], stored, l, o, now)
  return reply(o)
end

-- tb_mconsume: all buckets are charged or none is. Keys are KEYS[1..N],
-- their numbers ARGV[3g-2..3g] (max, rate, cost of group g).
local function tb_mconsume(keys, args)
  local n = #keys
  if n == 0 or #args ~= 3 * n then return arity_error('tb_mconsume') end
  if n > MAX_GROUPS then
    return redis.error_reply('ERR too many buckets: at most ' .. MAX_GROUPS .. ' groups per call')
  end
  local limits, costs = {}, {}
  for g = 1, n do
    local l, err = parse_limits(args[3 * g - 2], args[3 * g - 1], g)
    if not l then return redis.error_reply(err) end
    local cost
    cost, err = parse_cost(args[3 * g], l, g)
    if not cost then return redis.error_reply(err) end
    limits[g], costs[g] = l, cost
  end
  local first = {}
  for g = 1, n do
    local seen = first[keys[g]]
    if seen then
      return redis.error_reply('ERR duplicate key: group ' .. g .. ' repeats the key of group ' .. seen)
    end
    first[keys[g]] = g
  end
  local now = clock()
  -- Group by group, as the module does: a bad key stops the call before
  -- any later key is read (and lazily expired).
  local stored, cur = {}, {}
  for g = 1, n do
    local s, err = load(keys[g], g)
    if s == nil then return redis.error_reply(err) end
    stored[g], cur[g] = s, current(limits[g], s, now)
  end
  local all = true
  for g = 1, n do
    if not (cur[g] >= costs[g]) then all = false end
  end
  local out = { all and 1 or 0, 0 }
  local retry = 0
  for g = 1, n do
    local o = charge(limits[g], stored[g], now, cur[g], costs[g], all)
    if o.writes then save(keys[g], stored[g], limits[g], o, now) end
    if o.retry > retry then retry = o.retry end
    out[g + 2] = reply(o)
  end
  out[2] = retry
  return out
end

-- ---- CL.THROTTLE (core/src/cell.rs) --------------------------------------

-- An integer as Rust's i64 parser reads it: optional sign, digits, in
-- range. Returns the number (a double: exact for every value the bounds
-- let through) or nil.
local function parse_i64(s)
  local sign, digits = string.match(s, '^([+-]?)(%d+)$')
  if not digits then return nil end
  digits = string.match(digits, '^0*(%d.*)$')
  if #digits > 19 then return nil end
  if #digits == 19 then
    local top = sign == '-' and '9223372036854775808' or '9223372036854775807'
    if digits > top then return nil end
  end
  local v = tonumber(digits)
  if sign == '-' then v = -v end
  return v
end

-- max_burst, count, period [, quantity], checked in the module's order.
-- Returns {limits, limit, quantity} or nil and the error text.
local function throttle_args(args)
  local function int(i, name, least)
    local v = parse_i64(args[i])
    if v == nil then return nil, 'ERR ' .. name .. ' must be an integer' end
    if v < least then return nil, 'ERR ' .. name .. ' must be >= ' .. least end
    return v
  end
  local burst, count, period, err
  burst, err = int(1, 'max_burst', 0)
  if not burst then return nil, err end
  count, err = int(2, 'count', 1)
  if not count then return nil, err end
  period, err = int(3, 'period', 1)
  if not period then return nil, err end
  local max = burst + 1
  if max > MAX_CAPACITY then return nil, 'ERR max_burst must be < 1e12' end
  local rate = count / period
  if rate > MAX_RATE then return nil, 'ERR count/period must be <= 1e12 per second' end
  if max / rate > MAX_FILL_SECONDS then
    return nil, 'ERR count/period is too low for max_burst: (max_burst+1)*period/count must be <= 1e10 seconds'
  end
  local quantity = 1
  if #args == 4 then
    quantity, err = int(4, 'quantity', 0)
    if not quantity then return nil, err end
  end
  return { limits = { max = max, rate = rate }, limit = max, quantity = quantity }
end

-- redis-cell's TAT: the digits of a u64, no sign, no leading zero; as
-- {seconds, nanoseconds}, both exact. nil for anything else.
local function parse_tat(s)
  if not string.find(s, '^%d+$') or #s > 20 or (#s > 1 and string.sub(s, 1, 1) == '0') then
    return nil
  end
  if #s == 20 and s > '18446744073709551615' then return nil end
  local cut = #s - 9
  local sec = cut > 0 and tonumber(string.sub(s, 1, cut)) or 0
  return { sec, tonumber(string.sub(s, cut > 0 and cut + 1 or 1)) }
end

-- The bucket a redis-cell key stands for now (false: full, the TAT has
-- passed), with tb-core's float operations in tb-core's order.
local function stored_from_tat(tat, l, now)
  local ahead = (tat[1] - now.sec) * 1e9 + (tat[2] - now.usec * 1000)
  if ahead <= 0 then return false end
  return { tokens = l.max - ahead / 1e9 * l.rate, ts = { now.hi, now.lo } }
end

-- tb_cl_throttle: CL.THROTTLE's reply
-- {limited, limit, remaining, retry_after_s, reset_after_s}; writes as
-- tb_consume does, replacing a redis-cell string with the bucket hash.
local function tb_cl_throttle(keys, args)
  if #keys ~= 1 or #args < 3 or #args > 4 then
    return redis.error_reply("ERR wrong number of arguments for 'cl.throttle' command")
  end
  local call, err = throttle_args(args)
  if not call then return redis.error_reply(err) end
  local l = call.limits
  local now = clock()
  local stored, was_string
  if redis.call('TYPE', keys[1])['ok'] == 'string' then
    local tat = parse_tat(redis.call('GET', keys[1]))
    if not tat then return redis.error_reply(WRONGTYPE) end
    stored, was_string = stored_from_tat(tat, l, now), true
  else
    stored, err = load(keys[1])
    if stored == nil then return redis.error_reply(err) end
  end
  local charged = call.quantity <= call.limit
  local o
  if charged then
    o = charge(l, stored, now, current(l, stored, now), call.quantity, true)
  else
    o = charge(l, stored, now, current(l, stored, now), 0, false)
  end
  if o.writes then
    if was_string then redis.call('DEL', keys[1]) end
    save(keys[1], stored or was_string, l, o, now)
  end
  local limited = not (charged and o.allowed)
  local retry = -1
  if limited and charged then retry = math.ceil(o.retry / 1000) end
  return { limited and 1 or 0, call.limit, math.max(0, math.floor(o.tokens)),
    retry, math.ceil(o.reset / 1000) }
end

-- ---- the operations, listed once -------------------------------------------

-- The library registers each one as FCALL tb_<name>; the EVAL script
-- (lua/gen_eval.py) takes the name as its first argument.
local OPERATIONS = {
  { name = 'consume', fn = tb_consume, flags = {} },
  { name = 'peek', fn = tb_peek, flags = { 'no-writes' } },
  { name = 'mconsume', fn = tb_mconsume, flags = {} },
  { name = 'adjust', fn = tb_adjust, flags = {} },
  { name = 'cl_throttle', fn = tb_cl_throttle, flags = {} },
}
-- <<< shared: end

-- A plain loop: FUNCTION LOAD runs this body before ipairs is reachable.
for i = 1, #OPERATIONS do
  local op = OPERATIONS[i]
  redis.register_function { function_name = 'tb_' .. op.name, callback = op.fn, flags = op.flags }
end

-- The library's version, the project's (Cargo.toml's): FCALL_RO tb_version 0.
-- A client compares it with the copy it ships, and loads its own when they
-- differ, so an upgraded client never runs on an older or foreign library.
local TB_VERSION = '0.1.0'
redis.register_function {
  function_name = 'tb_version',
  callback = function() return TB_VERSION end,
  flags = { 'no-writes' },
}
