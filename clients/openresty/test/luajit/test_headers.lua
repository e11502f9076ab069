local h = require "helpers"
local headers = require "resty.tokenbucket.headers"
local decision_mod = require "resty.tokenbucket.decision"
local bucket = require("resty.tokenbucket.bucket").bucket
local concurrency = require("resty.tokenbucket.bucket").concurrency

local T = {}
local USER = bucket({ max = 10, rate = 0.17, name = "user" })
local IP = bucket({ max = 600, rate = 30, name = "ip" })

local function many(allowed, retry, b1, b2)
  return decision_mod.many({ allowed, retry, b1, b2 }, { { "u", USER, 1 }, { "i", IP, 1 } })
end

function T.admitted_fields()
  local d = many(1, 0, { 1, 9, 0, 5883 }, { 1, 599, 0, 34 })
  h.eq(headers.rate_limit(d, true), {
    ["RateLimit-Policy"] = '"user";q=10;w=59, "ip";q=600;w=20',
    ["RateLimit"] = '"user";r=9;t=6, "ip";r=599;t=1',
    ["X-RateLimit-Limit"] = "10",
    ["X-RateLimit-Remaining"] = "9",
  })
  h.eq(headers.refusal(d), nil)
end

function T.a_denial_is_a_429_problem_with_the_fields()
  local d = many(0, 5883, { 0, 0, 5883, 58824 }, { 1, 600, 0, 0 })
  local r = headers.refusal(d, false)
  h.eq(r.status, 429)
  h.eq(r.headers, {
    ["RateLimit-Policy"] = '"user";q=10;w=59, "ip";q=600;w=20',
    ["RateLimit"] = '"user";r=0;t=6, "ip";r=600;t=0',
    ["Retry-After"] = "6",
  })
  h.eq(r.body, {
    type = "https://iana.org/assignments/http-problem-types#quota-exceeded",
    title = "Request cannot be satisfied as assigned quota has been exceeded",
    status = 429,
    detail = "Rate limited by user: retry in 6 s.",
    ["violated-policies"] = { "user" },
  })
end

function T.shed_and_failing_closed_are_503s_without_fields()
  local shed = many(0, 1000, { 0, 0, 1000, 0 }, { 0, 0, 1000, 0 })
  shed.shed = true
  local r = headers.refusal(shed)
  h.eq({ r.status, r.reason, r.headers }, { 503, "shed", { ["Retry-After"] = "1" } })
  h.eq(r.body.detail, "The server is overloaded.")
  local closed = many(0, 0, { 0, 0, 0, 0 }, { 0, 0, 0, 0 })
  closed.degraded = true
  r = headers.refusal(closed)
  h.eq({ r.status, r.reason, r.headers }, { 503, "unavailable", { ["Retry-After"] = "1" } })
  h.eq(headers.rate_limit(closed), {}, "no fields: Redis said nothing")
end

function T.a_busy_lease_names_its_concurrency_in_concurrent_requests()
  local req = { id = "x", key = "s", concurrency = concurrency({ limit = 2, lease_ms = 30000, name = "streams" }),
    weight = 1, groups = { { "u", USER, 1 } } }
  local lease = decision_mod.lease({ 0, 2, 29500, 0, { 1, 9, 0, 5883 } }, req, false)
  local r = headers.refusal(lease, true)
  h.eq(r.status, 429)
  h.eq(r.headers, {
    ["RateLimit-Policy"] = '"streams";q=2;qu="concurrent-requests", "user";q=10;w=59',
    ["RateLimit"] = '"streams";r=0;t=30, "user";r=9;t=6',
    ["X-RateLimit-Limit"] = "2",
    ["X-RateLimit-Remaining"] = "0",
    ["Retry-After"] = "30",
  })
  h.eq(r.body["violated-policies"], { "streams" })
  local ok = decision_mod.lease({ 1, 1, 0, 30000, { 1, 9, 0, 5883 } }, req, false)
  h.eq(headers.rate_limit(ok)["RateLimit"], '"streams";r=1, "user";r=9;t=6')
end

function T.names_are_sf_strings()
  local b = bucket({ max = 1, rate = 1, name = 'a"b\\c' })
  local d = decision_mod.one({ 1, 0, 0, 1000 }, { "k", b, 1 })
  h.eq(headers.rate_limit(d)["RateLimit-Policy"], '"a\\"b\\\\c";q=1;w=1')
end

return T
