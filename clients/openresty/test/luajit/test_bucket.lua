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

function T.limits_parse_as_token_buckets()
  local x = b.parse("10/minute", "user")
  h.eq({ x.max, x.rate, x.name }, { 10, 10 / 60, "user" })
  h.eq(message(b.parse, "10 per minute"), "limit must be N/second, N/minute, N/hour or N/day, got 10 per minute")
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
