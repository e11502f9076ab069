local h = require "helpers"
local quota = require "resty.tokenbucket.quota"
local rules = require "resty.tokenbucket.rules"
local headers = require "resty.tokenbucket.headers"
local decision = require "resty.tokenbucket.decision"

local T = {}

local function err(f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end

function T.a_quota_is_checked_with_the_modules_messages()
  h.eq(err(quota.quota, { limit = 0, period = "day" }), "limit must be > 0 and <= 1e12")
  h.eq(err(quota.quota, { limit = 1, period = "fortnight" }),
    "period must be DAY, WEEK, MONTH, YEAR or whole seconds from 1 to 10000000000")
  h.eq(err(quota.quota, { limit = 1, period = 0 }),
    "period must be DAY, WEEK, MONTH, YEAR or whole seconds from 1 to 10000000000")
  h.eq(err(quota.quota, { limit = 1, period = "day", offset = 1440 }), "offset must be >= -1439 and <= 1439")
  h.eq(err(quota.quota, { limit = 1, period = "day", offset = 1.5 }), "offset must be an integer")
  h.eq(err(quota.check_cost, 11, quota.quota({ limit = 10, period = "day" })),
    "cost must not exceed limit, it could never pass")
end

function T.a_quota_spells_its_period_as_sent()
  local q = quota.quota({ limit = 10, period = "Month", offset = -300 })
  h.eq(q.args, { "10", "MONTH" })
  h.eq(q.after, { "OFFSET", "-300" })
  h.eq(quota.quota({ limit = 10, period = 3600 }).after, {})
  h.eq({ q.label, quota.quota({ limit = 1, period = 60 }).label }, { "month", "60s" })
  h.eq(q.kind, "quota")
end

function T.a_months_length_is_its_own()
  local march = 1835481600 -- 2028-03-01T00:00:00Z: February 2028 is a leap month
  h.eq(quota.quota({ limit = 1, period = "month" }):period_seconds(march), 29 * 86400)
  h.eq(quota.quota({ limit = 1, period = "year" }):period_seconds(march), 366 * 86400)
  h.eq(quota.quota({ limit = 1, period = "month", offset = 600 }):period_seconds(march - 600 * 60), 29 * 86400)
  h.eq(quota.quota({ limit = 1, period = "week" }):period_seconds(march), 7 * 86400)
  h.eq(quota.quota({ limit = 1, period = 90 }):period_seconds(march), 90)
end

function T.a_quota_rule_names_its_period_in_the_fields()
  local r = rules.new({ rules = { { name = "daily", quota = { limit = 5, period = "day" }, key = "$http_x_user" } } })
  local groups = r:evaluate(function(name) return name == "http_x_user" and "alice" or nil end, {})
  h.eq(groups[1][1], "rl:daily:alice")
  local d = decision.one({ 1, 4, 0, 3600000 }, groups[1], "consume")
  local fields = headers.rate_limit(d)
  h.eq(fields["RateLimit-Policy"], '"daily";q=5;w=86400')
  h.eq(fields["RateLimit"], '"daily";r=4;t=3600')
  local unnamed = decision.one({ 1, 9, 0, 1000 }, { "k", quota.quota({ limit = 10, period = 3600 }), 1 }, "consume")
  h.eq(headers.rate_limit(unnamed)["RateLimit-Policy"], '"3600s";q=10;w=3600')
end

return T
