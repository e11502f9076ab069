-- The rules of nginx.conf's limiter: a small Lua table, checked when nginx
-- loads it, and evaluated per request into the buckets of one all-or-
-- nothing decision (and, with a concurrency rule, the slot it takes).
--
--   rules = {
--     { name = "ip",   limit = "600/minute",   key = "$binary_remote_addr" },
--     { name = "user", max = 10, rate = 0.17,   key = "$http_x_user", optional = true },
--     { name = "llm",  bucket = function(ctx) return TIERS[ctx.tier] end,
--       key = function(ctx) return ctx.user end, cost = function(ctx) return ctx.tokens end },
--     { name = "daily", quota = { limit = 10000, period = "day", offset = 60 }, key = "$http_x_user" },
--   },
--   concurrency = { name = "streams", limit = 8, lease_ms = 30000, key = "$http_x_user" },
--
-- A key is an nginx variable ("$name") or a function of the request's
-- ngx.ctx; the Redis key is `prefix:name:identity` (`prefix:name:{identity}`
-- with hash_tag = true, so a user's buckets and slots share a Cluster
-- slot). A rule whose identity is missing refuses the request (400) unless
-- it is `optional`, then it is skipped. An identity must be at most
-- `max_key_bytes` (1024) bytes, and text: control bytes or invalid UTF-8
-- refuse the request, unless the rule says `binary = true` (the default for
-- $binary_* variables). Nothing is written to Redis for a refused request.
-- A `shadow = true` rule is charged in a call of its own and never refuses
-- (a request without its identity skips it): its denials are let through,
-- reported "shadow_mode" to on_decision and logged.
--
-- `block_ms` is a penalty (rate-limiter-flexible's blockDuration): a
-- request the bucket denies charges it into debt with TB.ADJUST so that
-- the caller is refused for block_ms (penalty.lua), at most
-- 1000 * (max + cost) / rate, checked here. `deny = true` in place of a
-- bucket is a limit of zero (envoyproxy/ratelimit's requests_per_unit: 0):
-- every request the rule applies to is refused with a 429, Retry-After
-- `retry_after` seconds (3600 by default), without calling Redis. `skip`
-- lets trusted callers through before anything is sent: a function of
-- ngx.ctx answering true, or a list of identities (what `key` gives).
-- Plain Lua: the variable lookup is injected.

local bucket_mod = require "resty.tokenbucket.bucket"
local quota_mod = require "resty.tokenbucket.quota"
local penalty = require "resty.tokenbucket.penalty"

local type, tostring, pcall, find, byte = type, tostring, pcall, string.find, string.byte
local setmetatable = setmetatable

local _M = {}

_M.MAX_KEY_BYTES = 1024

local Rules = {}
Rules.__index = Rules

local function fail(text)
  error("resty.tokenbucket rules: " .. text, 0)
end

-- A key spec: "$variable" or a function.
local function key_spec(spec, where)
  if type(spec) == "function" then return { fn = spec } end
  if type(spec) == "string" then
    local var = spec:match("^%$([%w_]+)$")
    if var then return { var = var, binary = var:find("^binary_") ~= nil } end
  end
  fail(where .. ": key must be an nginx variable (\"$http_x_api_key\") or a function, got " .. tostring(spec))
end

local function check_prefix(prefix, where)
  if type(prefix) ~= "string" or prefix == "" or find(prefix, "{", 1, true) then
    fail(where .. ": prefix must be a non-empty string without '{'")
  end
  return prefix
end

local function with_where(f, where, ...)
  local ok, res = pcall(f, ...)
  if not ok then fail(where .. ": " .. tostring(type(res) == "table" and res.message or res)) end
  return res
end

local function check_rule(rule, i, prefix)
  local where = "rule " .. i
  if type(rule) ~= "table" then fail(where .. ": expected a table") end
  if type(rule.name) ~= "string" then fail(where .. ": name is needed (it names the policy and the Redis key)") end
  with_where(bucket_mod.check_name, where, rule.name)
  if find(rule.name, "{", 1, true) then fail(where .. ": name must not contain '{'") end
  where = "rule " .. rule.name
  local out = { name = rule.name, optional = rule.optional == true, hash_tag = rule.hash_tag == true,
    shadow = rule.shadow == true, prefix = check_prefix(rule.prefix or prefix, where) }
  if rule.shadow ~= nil and type(rule.shadow) ~= "boolean" then fail(where .. ": shadow must be true or false") end
  local sources = (rule.bucket ~= nil and 1 or 0) + (rule.limit ~= nil and 1 or 0) + (rule.max ~= nil and 1 or 0)
    + (rule.quota ~= nil and 1 or 0) + (rule.deny ~= nil and 1 or 0)
  if sources ~= 1 then
    fail(where .. ": give one of bucket, limit (\"N/minute\"), max and rate, quota ({limit, period}) or deny")
  end
  local skip = rule.skip
  if type(skip) == "function" then
    out.skip_fn = skip
  elseif type(skip) == "table" then
    out.skip = {}
    for i = 1, #skip do
      if type(skip[i]) ~= "string" then fail(where .. ": skip is a function or a list of identities") end
      out.skip[skip[i]] = true
    end
  elseif skip ~= nil then
    fail(where .. ": skip is a function or a list of identities, got " .. type(skip))
  end
  if rule.deny ~= nil then
    if rule.deny ~= true then fail(where .. ": deny must be true") end
    if rule.block_ms ~= nil or out.shadow then fail(where .. ": a deny rule takes no block_ms and is never shadow") end
    local retry = rule.retry_after == nil and 3600 or rule.retry_after
    if type(retry) ~= "number" or retry % 1 ~= 0 or retry < 1 then
      fail(where .. ": retry_after is a whole number of seconds >= 1, got " .. tostring(rule.retry_after))
    end
    out.deny, out.retry_after = true, retry
    out.key = key_spec(rule.key, where)
    if rule.binary ~= nil then out.key.binary = rule.binary == true end
    return out
  end
  if rule.quota ~= nil then
    local q = rule.quota
    if type(q) ~= "table" then fail(where .. ": quota is a table {limit = ..., period = ..., offset = ...}") end
    out.bucket = with_where(quota_mod.quota, where, { limit = q.limit, period = q.period, offset = q.offset,
      name = rule.name })
  elseif type(rule.bucket) == "function" then
    out.bucket_fn = rule.bucket
  elseif rule.bucket ~= nil then
    out.bucket = with_where(bucket_mod.bucket, where, { max = rule.bucket.max, rate = rule.bucket.rate, name = rule.name })
  elseif rule.limit ~= nil then
    out.bucket = with_where(bucket_mod.parse, where, rule.limit, rule.name)
  else
    out.bucket = with_where(bucket_mod.bucket, where, { max = rule.max, rate = rule.rate, name = rule.name })
  end
  if type(rule.cost) == "function" then
    out.cost_fn = rule.cost
  elseif rule.cost ~= nil then
    if out.bucket and out.bucket.kind == "quota" then
      with_where(quota_mod.check_cost, where, rule.cost, out.bucket)
    elseif out.bucket then
      with_where(bucket_mod.check_cost, where, rule.cost, out.bucket)
    end
    out.cost = rule.cost
  end
  if rule.block_ms ~= nil then
    if out.bucket then
      local _, bad = penalty.check(rule.block_ms, out.bucket, out.cost_fn and 0 or out.cost or 1)
      if bad ~= nil then fail(where .. ": " .. tostring(bad.message or bad)) end
    end
    out.block_ms = rule.block_ms
  end
  out.key = key_spec(rule.key, where)
  if rule.binary ~= nil then out.key.binary = rule.binary == true end
  return out
end

-- {rules = {...}, concurrency = {...}, prefix = "rl", max_key_bytes = 1024}
function _M.new(config)
  local prefix = check_prefix(config.prefix or "rl", "prefix")
  local list = config.rules or {}
  if type(list) ~= "table" then fail("rules must be a list") end
  local self = setmetatable({ rules = {}, max_key_bytes = config.max_key_bytes or _M.MAX_KEY_BYTES }, Rules)
  local seen = {}
  for i = 1, #list do
    local r = check_rule(list[i], i, prefix)
    if seen[r.name] then fail("rule " .. r.name .. ": two rules of one name would share their Redis keys") end
    seen[r.name] = true
    self.rules[i] = r
  end
  local c = config.concurrency
  if c ~= nil then
    if type(c) ~= "table" or type(c.name) ~= "string" then
      fail("concurrency: expected {name = ..., limit = ..., lease_ms = ..., key = ...}")
    end
    local where = "concurrency " .. c.name
    if seen[c.name] then fail(where .. ": a rule has this name already") end
    local out = { name = c.name, optional = c.optional == true, hash_tag = c.hash_tag == true,
      prefix = check_prefix(c.prefix or prefix, where), key = key_spec(c.key, where) }
    if type(c.limit) == "function" then
      out.limit_fn, out.lease_ms = c.limit, c.lease_ms
    else
      out.concurrency = with_where(bucket_mod.concurrency, where, { limit = c.limit, lease_ms = c.lease_ms,
        name = c.name })
    end
    if type(c.weight) == "function" then
      out.weight_fn = c.weight
    elseif c.weight ~= nil then
      if out.concurrency then with_where(out.concurrency.check_weight, where, out.concurrency, c.weight) end
      out.weight = c.weight
    end
    if c.binary ~= nil then out.key.binary = c.binary == true end
    self.concurrency = out
  end
  if #self.rules == 0 and self.concurrency == nil then fail("no rules and no concurrency: nothing to limit") end
  if type(self.max_key_bytes) ~= "number" or self.max_key_bytes < 1 then fail("max_key_bytes must be >= 1") end
  return self
end

-- Text: no control bytes, and valid UTF-8.
local function is_text(s)
  if find(s, "[%z\1-\31\127]") then return false end
  local i, n = 1, #s
  while i <= n do
    local c = byte(s, i)
    local extra
    if c < 0x80 then extra = 0
    elseif c >= 0xC2 and c <= 0xDF then extra = 1
    elseif c >= 0xE0 and c <= 0xEF then extra = 2
    elseif c >= 0xF0 and c <= 0xF4 then extra = 3
    else return false end
    for j = i + 1, i + extra do
      local d = byte(s, j)
      if d == nil or d < 0x80 or d > 0xBF then return false end
    end
    i = i + extra + 1
  end
  return true
end
_M.is_text = is_text

-- A bad request: {status = 400, cause = "...", detail = "..."}; `cause`
-- names the rule and what was wrong, without the request's own bytes.
local function refused(rule, what, spec)
  local source = spec.var and ("$" .. spec.var) or "its key function"
  return {
    status = 400,
    cause = "rule " .. rule.name .. ": " .. what .. " (" .. source .. ")",
    detail = "The " .. rule.name .. " key is " .. what .. ".",
  }
end

-- The identity of `rule` for this request: the text, or nil to skip the
-- rule, or false and a refusal, or false and an error (a key function
-- that raised).
local function identity(self, rule, var, ctx)
  local spec = rule.key
  local value
  if spec.var then
    value = var(spec.var)
  else
    local ok, res = pcall(spec.fn, ctx)
    if not ok then return false, { status = 500, cause = "rule " .. rule.name .. ": its key function raised: "
      .. tostring(res), detail = "The rate limiter's rules failed." } end
    value = res
  end
  if type(value) == "table" then value = value[1] end -- a header sent twice: the first
  if value == nil or value == "" then
    if rule.optional or rule.shadow then return nil end
    return false, refused(rule, "missing", spec)
  end
  if type(value) == "number" then value = tostring(value) end
  if type(value) ~= "string" then
    return false, { status = 500, cause = "rule " .. rule.name .. ": its key function returned a " .. type(value),
      detail = "The rate limiter's rules failed." }
  end
  if #value > self.max_key_bytes then
    return false, refused(rule, "too long (over " .. self.max_key_bytes .. " bytes)", spec)
  end
  if not spec.binary and not is_text(value) then return false, refused(rule, "not text", spec) end
  return value
end

local function redis_key(rule, id)
  if rule.hash_tag then return rule.prefix .. ":" .. rule.name .. ":{" .. id .. "}" end
  return rule.prefix .. ":" .. rule.name .. ":" .. id
end

local function called(rule, what, f, ctx)
  local ok, res = pcall(f, ctx)
  if not ok then
    return false, { status = 500, cause = "rule " .. rule.name .. ": its " .. what .. " function raised: "
      .. tostring(res), detail = "The rate limiter's rules failed." }
  end
  return res
end

-- A 429 for a deny rule, sent before anything goes to Redis.
local function denied(rule)
  local name, retry = rule.name, rule.retry_after
  return {
    status = 429,
    refusal = {
      status = 429,
      reason = "limited",
      headers = {
        ["RateLimit-Policy"] = '"' .. name .. '";q=0',
        ["RateLimit"] = '"' .. name .. '";r=0;t=' .. retry,
        ["Retry-After"] = tostring(retry),
      },
      body = {
        type = "https://iana.org/assignments/http-problem-types#quota-exceeded",
        title = "Request cannot be satisfied as assigned quota has been exceeded",
        status = 429,
        detail = "Rate limited by " .. name .. ": retry in " .. retry .. " s.",
        ["violated-policies"] = { name },
      },
    },
  }
end

-- Whether a trusted caller's request skips the rule: its skip function
-- answers true, or its identity is in the skip list.
local function skips(self, rule, var, ctx)
  if rule.skip_fn then
    local yes, bad = called(rule, "skip", rule.skip_fn, ctx)
    if yes == false and bad then return nil, bad end
    return yes == true
  end
  if rule.skip then
    local id = identity(self, { name = rule.name, key = rule.key, optional = true }, var, ctx)
    return id ~= nil and id ~= false and rule.skip[id] == true
  end
  return false
end

-- This request's groups {key, bucket, cost, shadow = true for a shadow
-- rule's, block_ms} and its lease {key,
-- concurrency, weight} (or nil), or nil and a refusal {status, cause,
-- detail}. `var(name)` reads an nginx variable; functions get `ctx`.
function Rules:evaluate(var, ctx)
  local groups = {}
  for i = 1, #self.rules do
    local rule = self.rules[i]
    local skipped, bad = skips(self, rule, var, ctx)
    if skipped == nil then return nil, bad end
    local id
    if skipped then id = nil else id, bad = identity(self, rule, var, ctx) end
    if id == false then return nil, bad end
    if id ~= nil and rule.deny then return nil, denied(rule) end
    if id ~= nil then
      local b = rule.bucket
      if b == nil then
        local spec
        spec, bad = called(rule, "bucket", rule.bucket_fn, ctx)
        if spec == false then return nil, bad end
        if spec == nil then goto continue end -- no bucket for this request: the rule is skipped
        local ok, res = pcall(bucket_mod.bucket, { max = spec.max, rate = spec.rate, name = rule.name })
        if not ok then
          return nil, { status = 500, cause = "rule " .. rule.name .. ": its bucket function gave "
            .. tostring(res), detail = "The rate limiter's rules failed." }
        end
        b = res
      end
      local cost = rule.cost
      if rule.cost_fn then
        cost, bad = called(rule, "cost", rule.cost_fn, ctx)
        if cost == false then return nil, bad end
      end
      if rule.block_ms ~= nil and (rule.bucket_fn or rule.cost_fn) then
        local _, wrong = penalty.check(rule.block_ms, b, cost == nil and 1 or cost)
        if wrong ~= nil then
          return nil, { status = 500, cause = "rule " .. rule.name .. ": " .. tostring(wrong.message or wrong),
            detail = "The rate limiter's rules failed." }
        end
      end
      groups[#groups + 1] = { redis_key(rule, id), b, cost == nil and 1 or cost, shadow = rule.shadow or nil,
        block_ms = rule.block_ms }
    end
    ::continue::
  end
  local c = self.concurrency
  if c == nil then return groups end
  local id, bad = identity(self, c, var, ctx)
  if id == false then return nil, bad end
  if id == nil then return groups end
  local concurrency = c.concurrency
  if concurrency == nil then
    local limit
    limit, bad = called(c, "limit", c.limit_fn, ctx)
    if limit == false then return nil, bad end
    local ok, res = pcall(bucket_mod.concurrency, { limit = limit, lease_ms = c.lease_ms, name = c.name })
    if not ok then
      return nil, { status = 500, cause = "concurrency " .. c.name .. ": " .. tostring(res),
        detail = "The rate limiter's rules failed." }
    end
    concurrency = res
  end
  local weight = c.weight
  if c.weight_fn then
    weight, bad = called(c, "weight", c.weight_fn, ctx)
    if weight == false then return nil, bad end
  end
  return groups, { key = redis_key(c, id), concurrency = concurrency, weight = weight or 1 }
end

return _M
