-- Buckets, concurrency limits and their arguments, checked with the
-- module's rules and error texts (contract/contract.json), so a bad limit
-- fails where it is written (when nginx loads the rules) instead of as an
-- error reply on a request path. Plain Lua: no ngx.

local contract = require "resty.tokenbucket.contract"

local type, tostring, tonumber = type, tostring, tonumber
local huge = math.huge
local format, find, match = string.format, string.find, string.match
local setmetatable, getmetatable, ipairs = setmetatable, getmetatable, ipairs

local _M = {}

-- An invalid argument: the module's message without its "ERR " prefix, as
-- an error value {field = ..., message = ...} that tostring() prints.
local Invalid = {}
Invalid.__index = Invalid
Invalid.__tostring = function(e) return e.message end
_M.Invalid = Invalid

local function invalid(field, name, values)
  local text = contract.message(name, values)
  return setmetatable({ field = field, message = (text:gsub("^ERR ", "")), usage = true }, Invalid)
end
_M.invalid = invalid

-- [+-] (digits [. digits] | . digits) [(e|E) [+-] digits]: the grammar the
-- module and the Lua library accept, checked piece by piece (Lua patterns
-- have no alternation).
local function decimal_text(s)
  local rest = s:gsub("^[+-]", "", 1)
  local mantissa, exponent = match(rest, "^([%d.]+)(.*)$")
  if not mantissa then return false end
  if not (find(mantissa, "^%d+$") or find(mantissa, "^%d+%.%d*$") or find(mantissa, "^%.%d+$")) then
    return false
  end
  return exponent == "" or find(exponent, "^[eE][+-]?%d+$") ~= nil
end

-- A finite decimal as a number, or raises Invalid naming `name`.
local function number(value, name, group)
  local n
  if type(value) == "number" then
    n = value
  elseif type(value) == "string" and decimal_text(value) then
    n = tonumber(value)
  end
  if n == nil or n ~= n or n == huge or n == -huge then
    error(invalid(name, "not_a_number", { arg = name, group = group }), 0)
  end
  return n
end
_M.number = number

-- How a checked number is sent: an integer below 2^53 as digits, else the
-- shortest of %.15g, %.16g and %.17g that reads back as the same double
-- (what Python's repr does), which the module's grammar always accepts.
local function encode(n)
  if n % 1 == 0 and n > -9007199254740992 and n < 9007199254740992 then
    return format("%d", n)
  end
  for digits = 15, 17 do
    local text = format("%." .. digits .. "g", n)
    if tonumber(text) == n then return text end
  end
  return format("%.17g", n)
end
_M.encode = encode

-- The largest double below x > 0.
local function below(x)
  local m, e = math.frexp(x)
  local ulp = (m == 0.5) and 2 ^ (e - 54) or 2 ^ (e - 53)
  if ulp < 2 ^ -1074 then ulp = 2 ^ -1074 end
  return x - ulp
end

-- A positive cost so small that taking it from a balance near `max`
-- rounds back to that balance: admitted forever, charging nothing (the
-- module's rule, core/src/args.rs).
local function charges_nothing(cost, max)
  if cost > max * 2 ^ -50 then return false end
  local b = below(max)
  return cost > 0 and (max - cost == max or b - cost == b)
end
_M.charges_nothing = charges_nothing

function _M.check_cost(cost, bucket, group)
  local n = number(cost, "cost", group)
  if n < 0 then error(invalid("cost", "cost_negative", { group = group }), 0) end
  if n > bucket.max then error(invalid("cost", "cost_above_max", { group = group }), 0) end
  if charges_nothing(n, bucket.max) then error(invalid("cost", "cost_too_small", { group = group }), 0) end
  return n
end

function _M.check_delta(delta)
  return number(delta, "delta")
end

-- Policy names are sf-strings in the RateLimit fields: printable ASCII.
local function check_name(name)
  if type(name) ~= "string" or name == "" or find(name, "[^\32-\126]") then
    error(setmetatable({ field = "name", message = "name must be a non-empty string of printable ASCII",
      usage = true }, Invalid), 0)
  end
  return name
end
_M.check_name = check_name

-- A Quota (quota.lua) has `kind` "quota" and arguments `after` the
-- amount (its OFFSET); a bucket has none.
local Bucket = { kind = "bucket", after = {} }
Bucket.__index = Bucket
_M.Bucket = Bucket

-- `max` tokens of burst refilled at `rate` tokens per second, named `name`
-- in the RateLimit fields: {max = 10, rate = 0.17, name = "user"}.
function _M.bucket(spec, group)
  if type(spec) ~= "table" then
    error(setmetatable({ field = "bucket", message = "a bucket is a table {max = ..., rate = ...}, got "
      .. type(spec), usage = true }, Invalid), 0)
  end
  if getmetatable(spec) == Bucket then return spec end
  local max = number(spec.max, "max", group)
  if not (max > 0 and max <= contract.MAX_CAPACITY) then
    error(invalid("max", "max_out_of_range", { group = group }), 0)
  end
  local rate = number(spec.rate, "rate", group)
  if not (rate > 0 and rate <= contract.MAX_RATE) then
    error(invalid("rate", "rate_out_of_range", { group = group }), 0)
  end
  if max / rate > contract.MAX_FILL_SECONDS then
    error(invalid("rate", "fill_too_slow", { group = group }), 0)
  end
  if spec.name ~= nil then check_name(spec.name) end
  return setmetatable({ max = max, rate = rate, name = spec.name, args = { encode(max), encode(rate) },
    ident = encode(max) .. ":" .. encode(rate) }, Bucket)
end

-- Limit strings (contract.lua's LIMIT_*), in the same steps as the Python
-- and Node parsers, so all three read a string alike. %s is ASCII
-- whitespace here (the C locale), as the others read it.
local UNIT_SECONDS = {}
for _, unit in ipairs(contract.LIMIT_UNITS) do UNIT_SECONDS[unit[1]] = unit[2] end
local MULTIPLE_DIGITS = #tostring(contract.LIMIT_MULTIPLE_MOST)

local function limit_error(limit)
  local text = type(limit) == "string" and match(limit, "^%s*(.-)%s*$") or tostring(limit)
  local message = contract.LIMIT_ERROR:gsub("{limit}", function() return text end)
  error(setmetatable({ field = "limit", message = message, usage = true }, Invalid), 0)
end

-- A limit string's N (as written) and its k units in seconds, or raises
-- the grammar's error naming it.
local function read_limit(limit)
  if type(limit) ~= "string" or find(limit, "[\128-\255]") then limit_error(limit) end
  local count, rest = match(match(limit, "^%s*(.-)%s*$"), "^([^/%s]+)%s*(.*)$")
  if not count then limit_error(limit) end
  rest = rest:lower()
  local multiple, alias
  for _, per in ipairs(contract.LIMIT_PER) do
    -- A word needs a space after it ("10 per minute", not "10 perminute");
    -- one before it is there already, N ending at the first space.
    local after = rest:sub(#per + 1)
    if rest:sub(1, #per) == per and (per == "/" or find(after, "^%s")) then
      multiple, alias = match(after, "^%s*(%d*)%s*(%l+)$")
      break
    end
  end
  local unit = alias and contract.LIMIT_ALIASES[alias]
  if not unit then limit_error(limit) end
  local digits = multiple:gsub("^0+", "")
  if digits == "" and multiple ~= "" then digits = "0" end
  -- Too many digits is out of range already.
  if #digits > MULTIPLE_DIGITS then limit_error(limit) end
  local k = digits == "" and 1 or tonumber(digits)
  if k < contract.LIMIT_MULTIPLE_LEAST or k > contract.LIMIT_MULTIPLE_MOST then limit_error(limit) end
  return count, k * UNIT_SECONDS[unit]
end

-- A limit string as the `limits` library (and slowapi) writes it: "N/unit",
-- "N/k units", "N per unit" or "N per k units" (units second, minute,
-- hour, day, month, year, plural or s, sec, m, min, h, hr, d, mo, y; case
-- ignored), as a burst of N, then one token every (k units)/N: a token
-- bucket, not a window, and "1000/day" no budget reset at midnight (that
-- is a quota).
function _M.parse(limit, name)
  local count, seconds = read_limit(limit)
  local n = number(count, "max")
  return _M.bucket({ max = n, rate = n / seconds, name = name })
end

-- What joins several limit strings, as a set.
local SEPARATORS = {}
for _, sep in ipairs(contract.LIMIT_SEPARATORS) do SEPARATORS[sep] = true end

-- Several limit strings joined by ";", "," or "|" ("10/second;1000/day"),
-- as limits' parse_many reads them: a list of buckets, in order. Each needs
-- a key of its own (a key holds one bucket).
function _M.parse_many(limits)
  if type(limits) ~= "string" then limit_error(limits) end
  local out, from = {}, 1
  for i = 1, #limits + 1 do
    if i > #limits or SEPARATORS[limits:sub(i, i)] then
      out[#out + 1] = _M.parse(limits:sub(from, i - 1))
      from = i + 1
    end
  end
  return out
end

-- An integer argument within bounds, with the module's messages.
local function check_int(value, name, least, most)
  if type(value) ~= "number" or value % 1 ~= 0 or value ~= value then
    error(invalid(name, "not_an_integer", { arg = name }), 0)
  end
  if most == nil then
    if value < least then error(invalid(name, "too_small", { arg = name, least = least }), 0) end
  elseif value < least or value > most then
    error(invalid(name, "int_out_of_range", { arg = name, least = least, most = most }), 0)
  end
  return value
end
_M.check_int = check_int

local Concurrency = {}
Concurrency.__index = Concurrency
_M.Concurrency = Concurrency

-- At most `limit` slots in flight per key, each lease living `lease_ms`
-- without a renewal: {limit = 8, lease_ms = 30000, name = "streams"}.
function _M.concurrency(spec)
  if type(spec) ~= "table" then
    error(setmetatable({ field = "concurrency", message = "a concurrency is a table {limit = ..., lease_ms = ...}",
      usage = true }, Invalid), 0)
  end
  if getmetatable(spec) == Concurrency then return spec end
  local limit = check_int(spec.limit, "limit", 1, contract.MAX_LEASE_LIMIT)
  local lease_ms = check_int(spec.lease_ms, "lease_ms", 1, contract.MAX_LEASE_MS)
  if spec.name ~= nil then check_name(spec.name) end
  return setmetatable({ limit = limit, lease_ms = lease_ms, name = spec.name }, Concurrency)
end

function Concurrency:check_weight(weight)
  local n = check_int(weight, "weight", 1)
  if n > self.limit then error(invalid("weight", "weight_above_limit"), 0) end
  return n
end

function _M.check_id(id)
  if type(id) ~= "string" or #id < 1 or #id > contract.MAX_LEASE_ID_BYTES then
    error(invalid("id", "bad_id"), 0)
  end
  return id
end

-- A key is any byte string Redis takes; a number stands for its decimal text.
function _M.check_key(key, group)
  local t = type(key)
  if t == "string" then return key end
  if t == "number" and key % 1 == 0 then return format("%d", key) end
  local where = group and (" (group " .. group .. ")") or ""
  error(setmetatable({ field = "key", message = "key must be a string" .. where .. ", got " .. t, usage = true },
    Invalid), 0)
end

return _M
