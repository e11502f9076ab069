-- Calendar quotas: a budget of `limit` per period that resets at each
-- period's start (a UTC day, ISO week, month or year, or N seconds from
-- the epoch), shifted by a fixed `offset` in minutes, checked with the
-- module's rules and messages (core/src/quota/args.rs), as the Python
-- package's _quota.py and the Node package's quota.ts. A quota goes where
-- a bucket goes: consume, peek and adjust send TB.QUOTA, TB.QPEEK and
-- TB.QADJUST. Plain Lua: no ngx.

local bucket_mod = require "resty.tokenbucket.bucket"
local contract = require "resty.tokenbucket.contract"

local type, tostring, setmetatable, getmetatable = type, tostring, setmetatable, getmetatable
local floor, lower, upper, date = math.floor, string.lower, string.upper, os.date

local number, invalid, encode = bucket_mod.number, bucket_mod.invalid, bucket_mod.encode

local _M = {}

-- The calendar periods, and their length where it is fixed.
local NAMED = { day = 86400, week = 7 * 86400, month = false, year = false }

local Quota = { kind = "quota" }
Quota.__index = Quota
_M.Quota = Quota

local function usage(field, message)
  return setmetatable({ field = field, message = message, usage = true }, bucket_mod.Invalid)
end

local function check_period(period)
  if type(period) == "string" and NAMED[lower(period)] ~= nil then return lower(period) end
  if type(period) == "number" and period % 1 == 0 and period >= 1 and period <= contract.MAX_PERIOD_SECONDS then
    return period
  end
  error(invalid("period", "bad_period"), 0)
end

local function check_offset(offset)
  if offset == nil then return 0 end
  if type(offset) ~= "number" or offset % 1 ~= 0 then
    error(invalid("offset", "not_an_integer", { arg = "offset" }), 0)
  end
  local m = contract.MAX_OFFSET_MINUTES
  if offset < -m or offset > m then
    error(invalid("offset", "int_out_of_range", { arg = "offset", least = -m, most = m }), 0)
  end
  return offset
end

-- {limit = 1000000, period = "month", offset = 60, name = "tokens"}.
function _M.quota(spec, group)
  if getmetatable(spec) == Quota then return spec end
  if type(spec) ~= "table" then
    error(usage("quota", "a quota is a table {limit = ..., period = ...}, got " .. type(spec)), 0)
  end
  local limit = number(spec.limit, "limit", group)
  if not (limit > 0 and limit <= contract.MAX_CAPACITY) then
    error(invalid("limit", "limit_out_of_range", { group = group }), 0)
  end
  local period = check_period(spec.period)
  local offset = check_offset(spec.offset)
  if spec.name ~= nil then bucket_mod.check_name(spec.name) end
  local sent = type(period) == "string" and upper(period) or encode(period)
  return setmetatable({
    limit = limit, max = limit, period = period, offset = offset, name = spec.name,
    args = { encode(limit), sent },
    after = offset ~= 0 and { "OFFSET", tostring(offset) } or {},
    -- What the denial cache tells rules apart by (the name passes nothing).
    ident = "quota:" .. encode(limit) .. ":" .. sent .. ":" .. offset,
    label = type(period) == "string" and period or (encode(period) .. "s"),
  }, Quota)
end

function _M.is_quota(rule)
  return getmetatable(rule) == Quota
end

-- A cost for a quota, in the module's order of checks.
function _M.check_cost(cost, quota, group)
  local n = number(cost, "cost", group)
  if n < 0 then error(invalid("cost", "cost_negative", { group = group }), 0) end
  if n > quota.limit then error(invalid("cost", "cost_above_limit", { group = group }), 0) end
  if bucket_mod.charges_nothing(n, quota.limit) then
    error(invalid("cost", "quota_cost_too_small", { group = group }), 0)
  end
  return n
end

local function leap(y)
  return (y % 4 == 0 and y % 100 ~= 0) or y % 400 == 0
end
local DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }

-- The length in seconds of the period that ends at `ends_at` (Unix
-- seconds): fixed but for months and years, whose own number of days is
-- that of the calendar month or year (at UTC plus the offset) the day
-- before, which lies in the period whatever this clock's skew short of a
-- day.
function Quota:period_seconds(ends_at)
  if type(self.period) == "number" then return self.period end
  local fixed = NAMED[self.period]
  if fixed then return fixed end
  local day = date("!*t", floor(ends_at + self.offset * 60 - 86400))
  if self.period == "year" then return (leap(day.year) and 366 or 365) * 86400 end
  local days = DAYS[day.month]
  if day.month == 2 and leap(day.year) then days = 29 end
  return days * 86400
end

return _M
