local h = require "helpers"
local rules = require "resty.tokenbucket.rules"

local T = {}

local function vars(t) return function(name) return t[name] end end

local CONFIG = {
  rules = {
    { name = "ip", limit = "600/minute", key = "$binary_remote_addr" },
    { name = "user", max = 10, rate = 0.17, key = "$http_x_user", optional = true },
    { name = "llm", bucket = function(ctx) return ctx.tier == "pro" and { max = 1000, rate = 10 } or nil end,
      key = function(ctx) return ctx.user end, cost = function(ctx) return ctx.tokens end, optional = true },
  },
  concurrency = { name = "streams", limit = 2, lease_ms = 30000, key = "$http_x_user", optional = true,
    hash_tag = true },
}

function T.a_rules_limit_is_any_limit_string()
  local r = rules.new({ rules = { { name = "burst", limit = "100 per 5 minutes", key = "$x" } } })
  local groups = r:evaluate(vars({ x = "a" }), {})
  h.eq({ groups[1][1], groups[1][2].max, groups[1][2].rate, groups[1][2].name }, { "rl:burst:a", 100, 100 / 300, "burst" })
end

function T.keys_from_variables_and_functions()
  local r = rules.new(CONFIG)
  local groups, lease = r:evaluate(vars({ binary_remote_addr = "\127\0\0\1", http_x_user = "alice" }),
    { tier = "pro", user = "alice", tokens = 42 })
  h.eq(#groups, 3)
  h.eq(groups[1][1], "rl:ip:\127\0\0\1", "binary keys from $binary_ variables")
  h.eq({ groups[1][2].max, groups[1][2].rate, groups[1][2].name }, { 600, 10, "ip" })
  h.eq(groups[2][1], "rl:user:alice")
  h.eq({ groups[3][1], groups[3][2].max, groups[3][3] }, { "rl:llm:alice", 1000, 42 })
  h.eq(lease.key, "rl:streams:{alice}")
  h.eq({ lease.concurrency.limit, lease.weight }, { 2, 1 })
end

function T.optional_rules_are_skipped_others_refuse_with_400()
  local r = rules.new(CONFIG)
  local groups, lease = r:evaluate(vars({ binary_remote_addr = "\1\2\3\4" }), {})
  h.eq(#groups, 1, "user and llm skipped")
  h.eq(lease, nil)
  local none, bad = r:evaluate(vars({}), {})
  h.eq(none, nil)
  h.eq(bad.status, 400)
  h.eq(bad.cause, "rule ip: missing ($binary_remote_addr)")
  h.eq(bad.detail, "The ip key is missing.")
end

function T.huge_and_binary_identities_are_refused()
  local r = rules.new({ rules = { { name = "key", max = 1, rate = 1, key = "$http_x_api_key" } } })
  local _, bad = r:evaluate(vars({ http_x_api_key = string.rep("a", 1025) }), {})
  h.eq(bad.cause, "rule key: too long (over 1024 bytes) ($http_x_api_key)")
  _, bad = r:evaluate(vars({ http_x_api_key = "ab\1cd" }), {})
  h.eq(bad.cause, "rule key: not text ($http_x_api_key)")
  _, bad = r:evaluate(vars({ http_x_api_key = "ab\255cd" }), {})
  h.eq(bad.cause, "rule key: not text ($http_x_api_key)", "invalid UTF-8")
  local ok = r:evaluate(vars({ http_x_api_key = "clé-é" }), {})
  h.eq(ok[1][1], "rl:key:clé-é")
  local first = r:evaluate(vars({ http_x_api_key = { "one", "two" } }), {})
  h.eq(first[1][1], "rl:key:one", "a header sent twice: the first")
end

function T.a_key_function_that_raises_is_a_500_naming_the_rule()
  local r = rules.new({ rules = { { name = "u", max = 1, rate = 1, key = function() error("boom") end } } })
  local _, bad = r:evaluate(vars({}), {})
  h.eq(bad.status, 500)
  h.ok(bad.cause:find("rule u: its key function raised", 1, true), bad.cause)
end

function T.rules_are_checked_when_loaded()
  local function err(config)
    local ok, e = pcall(rules.new, config)
    h.ok(not ok, "expected an error")
    return e
  end
  h.eq(err({ rules = { { name = "u", max = 0, rate = 1, key = "$x" } } }),
    "resty.tokenbucket rules: rule u: max must be > 0 and <= 1e12")
  h.eq(err({ rules = { { name = "u", max = 1, rate = 1, key = "x" } } }),
    'resty.tokenbucket rules: rule u: key must be an nginx variable ("$http_x_api_key") or a function, got x')
  h.eq(err({ rules = { { name = "u", max = 1, rate = 1, limit = "1/second", key = "$x" } } }),
    'resty.tokenbucket rules: rule u: give one of bucket, limit ("N/minute"), max and rate, quota ({limit, period}) or deny')
  h.eq(err({ rules = { { name = "u", limit = "10/fortnight", key = "$x" } } }),
    "resty.tokenbucket rules: rule u: invalid limit '10/fortnight': expected N/unit or N per [k] unit, units: second, "
      .. "minute, hour, day, month, year")
  h.eq(err({ rules = { { name = "u", max = 1, rate = 1, key = "$x" }, { name = "u", max = 2, rate = 1, key = "$y" } } }),
    "resty.tokenbucket rules: rule u: two rules of one name would share their Redis keys")
  h.eq(err({ rules = {} }), "resty.tokenbucket rules: no rules and no concurrency: nothing to limit")
  h.eq(err({ rules = { { name = "u", max = 1, rate = 1, cost = 2, key = "$x" } } }),
    "resty.tokenbucket rules: rule u: cost must not exceed max, it could never pass")
  h.eq(err({ concurrency = { name = "s", limit = 0, lease_ms = 1, key = "$x" } }),
    "resty.tokenbucket rules: concurrency s: limit must be >= 1 and <= 1000000")
end

function T.block_ms_is_checked_against_the_floor_when_written()
  local function refused(rule)
    local ok, e = pcall(rules.new, { rules = { rule } })
    h.eq(ok, false)
    return e
  end
  -- From -max to a cost of 1: 1000 * (1 + 1) / 0.01 = 200000 ms.
  local r = rules.new({ rules = { { name = "k", max = 1, rate = 0.01, key = "$x", block_ms = 200000 } } })
  h.eq(r:evaluate(vars({ x = "a" }), {})[1].block_ms, 200000)
  h.eq(refused({ name = "k", max = 1, rate = 0.01, key = "$x", block_ms = 200001 }),
    "resty.tokenbucket rules: rule k: block_ms 200001 is longer than this bucket can hold: TB.ADJUST's debt"
    .. " stops at -max, so a call of cost 1 waits at most 1000 * (max + cost) / rate = 200000 ms")
  h.eq(refused({ name = "k", max = 1, rate = 0.01, key = "$x", block_ms = 0 }),
    "resty.tokenbucket rules: rule k: block_ms must be > 0, got 0")
  h.eq(refused({ name = "q", quota = { limit = 5, period = "day" }, key = "$x", block_ms = 10 }),
    "resty.tokenbucket rules: rule q: block_ms needs a bucket: a quota's period ends when it ends")
  h.eq(refused({ name = "b", deny = true, key = "$x", block_ms = 10 }),
    "resty.tokenbucket rules: rule b: a deny rule takes no block_ms and is never shadow")
  h.eq(refused({ name = "b", deny = true, key = "$x", retry_after = 0 }),
    "resty.tokenbucket rules: rule b: retry_after is a whole number of seconds >= 1, got 0")
end

function T.a_deny_rule_refuses_with_429_and_trusted_callers_skip()
  local r = rules.new({ rules = {
    { name = "banned", deny = true, key = "$peer", skip = { "10.0.0.7" }, retry_after = 60 },
    { name = "user", max = 5, rate = 1, key = "$user", skip = function(ctx) return ctx.internal end },
  } })
  local groups, bad = r:evaluate(vars({ peer = "10.0.0.8", user = "u" }), {})
  h.eq(groups, nil)
  h.eq({ bad.status, bad.refusal.status, bad.refusal.headers["Retry-After"], bad.refusal.headers["RateLimit-Policy"] },
    { 429, 429, "60", '"banned";q=0' })
  h.eq(bad.refusal.body["violated-policies"], { "banned" })
  groups = r:evaluate(vars({ peer = "10.0.0.7", user = "u" }), {})
  h.eq({ #groups, groups[1][1] }, { 1, "rl:user:u" })
  groups = r:evaluate(vars({ peer = "10.0.0.7", user = "u" }), { internal = true })
  h.eq(#groups, 0, "both rules skipped: nothing to send")
end

return T
