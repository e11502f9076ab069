-- The penalty (rate-limiter-flexible's blockDuration): a denied caller is
-- refused for `block_ms`, built on TB.ADJUST's debt. On a denial the
-- bucket is charged what lengthens the denial's wait to the block:
-- rate * (block_ms - retry_after_ms) / 1000 tokens, so a call of the same
-- cost passes block_ms after the denial.
--
-- The module floors a balance at -max, and a call of cost c passes once
-- the balance is back at c: from the floor that takes (max + c) / rate
-- seconds, the longest block the bucket can hold; a longer one is refused
-- when it is written. Python's twin is _penalty.py. Plain Lua.

local bucket_mod = require "resty.tokenbucket.bucket"

local type, tostring, tonumber, pairs, pcall = type, tostring, tonumber, pairs, pcall
local ceil, max, setmetatable = math.ceil, math.max, setmetatable

local _M = {}

local function invalid(message)
  return setmetatable({ field = "block_ms", message = message, usage = true }, bucket_mod.Invalid)
end

-- block_ms (nil: no penalty) checked against what the bucket's floor holds
-- for a call of `cost`: the number, or nil and the error. `spec` is a
-- bucket or its table; a quota (it has a period) takes no block.
function _M.check(block_ms, spec, cost)
  if block_ms == nil then return nil end
  local ok, ms = pcall(bucket_mod.number, block_ms, "block_ms")
  if not ok then return nil, ms end
  if not (ms > 0) then return nil, invalid("block_ms must be > 0, got " .. tostring(block_ms)) end
  if type(spec) ~= "table" or spec.period ~= nil or spec.kind == "quota" then
    return nil, invalid("block_ms needs a bucket: a quota's period ends when it ends")
  end
  local b
  ok, b = pcall(bucket_mod.bucket, spec)
  if not ok then return nil, b end
  local c = tonumber(cost) or 1
  local bound = 1000 * (b.max + c) / b.rate
  if ms > bound then
    return nil, invalid("block_ms " .. tostring(ms) .. " is longer than this bucket can hold: TB.ADJUST's debt"
      .. " stops at -max, so a call of cost " .. tostring(c) .. " waits at most 1000 * (max + cost) / rate = "
      .. tostring(bound) .. " ms")
  end
  return ms
end

-- The tokens to charge for this decision: 0 unless Redis denied it now
-- (not admitted, shadow, cached, shed or made up by the failure policy)
-- and the bucket is not in debt already (a block running: its denials
-- must not lengthen it).
function _M.charge(d, block_ms)
  if d.allowed or d.shadow or d.cached or d.shed or d.degraded then return 0 end
  local b = d.bucket
  if d.remaining < 0 or type(b) ~= "table" or b.kind ~= "bucket" then return 0 end
  local wait = block_ms - d.retry_after_ms
  return wait > 0 and b.rate * wait / 1000 or 0
end

-- The denial as the penalty left it: TB.ADJUST's balance and reset time,
-- and the block's wait. A penalty whose TB.ADJUST failed (nil, or the
-- failure policy's answer) leaves the denial as it was.
function _M.penalized(d, adjusted, block_ms)
  if adjusted == nil or adjusted.degraded or adjusted.shed then return d end
  local out = {}
  for k, v in pairs(d) do out[k] = v end
  out.remaining = adjusted.remaining
  out.reset_after_ms = adjusted.reset_after_ms
  out.retry_after_ms = max(d.retry_after_ms, ceil(block_ms))
  return out
end

return _M
