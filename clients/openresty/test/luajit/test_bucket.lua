local h = require "helpers"
local b = require "resty.tokenbucket.bucket"

local T = {}

local function message(f, ...)
  local ok, err = pcall(f, ...)
  h.ok(not ok, "expected an error")
  return err.message
end

function T.buckets_are_checked_with_the_modules_messages()
  h.eq(message(b.bucket, { max = 0, rate = 1 }), "max must be > 0 and <= 1e12")
  h.eq(message(b.bucket, { max = 1e13, rate = 1 }), "max must be > 0 and <= 1e12")
  h.eq(message(b.bucket, { max = 10, rate = 0 }), "rate must be > 0 and <= 1e12")
  h.eq(message(b.bucket, { max = 1e12, rate = 1e-3 }), "rate is too low for max: max/rate must be <= 1e10 seconds")
  h.eq(message(b.bucket, { max = "0x10", rate = 1 }), "max must be a finite decimal number")
  h.eq(message(b.bucket, { max = 0 / 0, rate = 1 }), "max must be a finite decimal number")
  h.eq(message(b.bucket, { max = math.huge, rate = 1 }), "max must be a finite decimal number")
end

function T.numbers_in_the_grammar_are_taken_as_text_too()
  local x = b.bucket({ max = "10", rate = ".5" })
  h.eq({ x.max, x.rate }, { 10, 0.5 })
  h.eq(message(b.bucket, { max = " 10", rate = 1 }), "max must be a finite decimal number")
  h.eq(message(b.bucket, { max = "1e", rate = 1 }), "max must be a finite decimal number")
  h.eq(b.bucket({ max = "1e3", rate = "5." }).max, 1000)
end

function T.costs_are_checked()
  local x = b.bucket({ max = 10, rate = 1 })
  h.eq(message(b.check_cost, -1, x), "cost must be >= 0")
  h.eq(message(b.check_cost, 11, x, 3), "cost must not exceed max, it could never pass (group 3)")
  h.eq(message(b.check_cost, 1e-5, b.bucket({ max = 1e12, rate = 1000 })),
    "cost is too small to charge a bucket of this max: use 0 or at least max/2^53")
  h.eq(b.check_cost(0, x), 0)
  h.eq(b.check_cost(1e12 / 2 ^ 53, b.bucket({ max = 1e12, rate = 1000 })), 1e12 / 2 ^ 53)
end

function T.numbers_are_sent_as_their_shortest_round_trip()
  h.eq(b.encode(10), "10")
  h.eq(b.encode(0.17), "0.17")
  h.eq(b.encode(1 / 3), "0.3333333333333333")
  h.eq(b.encode(0.1 + 0.2), "0.30000000000000004")
  h.eq(b.encode(1e-7), "1e-07")
  for _, n in ipairs({ 1 / 3, 0.1 + 0.2, 1e-7, 123456.789, 2 ^ 60 }) do
    h.eq(tonumber(b.encode(n)), n, tostring(n))
  end
end

-- The grammar error after the limit it names (contract.json, as rendered).
local GRAMMAR = ": expected N/unit or N per [k] unit, units: second, minute, hour, day, month, year"

function T.limits_parse_as_token_buckets()
  local x = b.parse("10/minute", "user")
  h.eq({ x.max, x.rate, x.name }, { 10, 10 / 60, "user" })
  for _, case in ipairs({
    { "10/min", 10, 60 }, { "10 per minute", 10, 60 }, { "100/5minutes", 100, 300 },
    { "100 per 5 minutes", 100, 300 }, { "7 PER 2 Hrs", 7, 7200 }, { "1/mo", 1, 30 * 86400 },
    { "12/year", 12, 360 * 86400 }, { " 3 / second ", 3, 1 }, { "1e3/d", 1000, 86400 },
  }) do
    local y = b.parse(case[1])
    h.eq({ y.max, y.rate }, { case[2], case[2] / case[3] }, case[1])
  end
  for _, limit in ipairs({ "10/fortnight", "10 perminute", "10/0 minutes", "10/second;1000/day", "10/m\195\173nute" }) do
    local ok, err = pcall(b.parse, " " .. limit .. " ")
    h.ok(not ok, limit)
    h.eq({ err.field, err.message }, { "limit", "invalid limit '" .. limit .. "'" .. GRAMMAR })
  end
  h.eq(message(b.parse, "10/" .. string.rep("9", 5000) .. "s"), "invalid limit '10/" .. string.rep("9", 5000) .. "s'" .. GRAMMAR)
  h.eq(message(b.parse, "ten/minute"), "max must be a finite decimal number")
  h.eq(message(b.parse, "0/minute"), "max must be > 0 and <= 1e12")
  h.eq(message(b.parse, "1/400 years"), "rate is too low for max: max/rate must be <= 1e10 seconds")
end

function T.limit_lists_parse_in_order()
  local list = b.parse_many("10/second; 1000/day, 5 per hour|1/y")
  local got = {}
  for i, x in ipairs(list) do got[i] = { x.max, x.rate } end
  h.eq(got, { { 10, 10 }, { 1000, 1000 / 86400 }, { 5, 5 / 3600 }, { 1, 1 / (360 * 86400) } })
  h.eq(message(b.parse_many, "10/second;"), "invalid limit ''" .. GRAMMAR)
  h.eq(message(b.parse_many, "10/second; 1/fortnight"), "invalid limit '1/fortnight'" .. GRAMMAR)
end

function T.concurrency_and_weights()
  h.eq(message(b.concurrency, { limit = 0, lease_ms = 1 }), "limit must be >= 1 and <= 1000000")
  h.eq(message(b.concurrency, { limit = 1.5, lease_ms = 1 }), "limit must be an integer")
  h.eq(message(b.concurrency, { limit = 1, lease_ms = 86400001 }), "lease_ms must be >= 1 and <= 86400000")
  local c = b.concurrency({ limit = 2, lease_ms = 1000, name = "streams" })
  h.eq(message(c.check_weight, c, 3), "weight must not exceed limit, it could never fit")
  h.eq(message(c.check_weight, c, 0), "weight must be >= 1")
  h.eq(message(b.check_id, ""), "id must be 1 to 256 bytes")
end

function T.names_are_printable_ascii()
  h.eq(message(b.bucket, { max = 1, rate = 1, name = "\1x" }), "name must be a non-empty string of printable ASCII")
end

return T
