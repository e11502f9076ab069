-- redis-tokenbucket for nginx with lua-nginx-module (OpenResty, or Debian's
-- nginx with libnginx-mod-http-lua): one decision per request, in the
-- access phase, on buckets and leases shared by every worker and every
-- node through Redis.
--
--   http {
--     lua_shared_dict tokenbucket 1m;
--     init_by_lua_block { limit = require("resty.tokenbucket").new(require("limits")) }
--     server {
--       location /api/ {
--         access_by_lua_block { limit:access() }
--         log_by_lua_block { limit:log() }      # with a concurrency rule
--         proxy_pass http://app;
--       }
--     }
--   }
--
-- `limits` is a small Lua table (clients/openresty/README.md): the Redis
-- URL, the rules (rules.lua), the failure policy. The decision logic lives
-- in plain Lua modules (limiter.lua and what it requires); this file wires
-- them to nginx: variables, the shared dict, timers, the answer.

local classify_mod = require "resty.tokenbucket.classify"
local headers = require "resty.tokenbucket.headers"
local json = require "resty.tokenbucket.json"
local hold_mod = require "resty.tokenbucket.hold"
local limiter_mod = require "resty.tokenbucket.limiter"
local logonce = require "resty.tokenbucket.logonce"
local memdict = require "resty.tokenbucket.memdict"
local penalty = require "resty.tokenbucket.penalty"
local transport_mod = require "resty.tokenbucket.transport"
local rules_mod = require "resty.tokenbucket.rules"
local slot = require "resty.tokenbucket.slot"

local ngx = ngx
local type, pairs, ipairs, tostring, setmetatable = type, pairs, ipairs, tostring, setmetatable

local _M = { _VERSION = "0.1.0" }

local LEVELS = { debug = ngx.DEBUG, info = ngx.INFO, warn = ngx.WARN, error = ngx.ERR }

local function log(level, text)
  ngx.log(LEVELS[level] or ngx.ERR, text)
end

local function var(name)
  return ngx.var[name]
end

local function now()
  return ngx.now()
end

-- The seconds of a lua-nginx timer, as hold.lua takes it.
local function timer_at(delay, fn)
  return ngx.timer.at(delay, function(premature) fn(premature) end)
end

local Edge = {}
Edge.__index = Edge

-- `max_delay_ms`: a request the buckets can serve within it is delayed
-- (ngx.sleep) instead of refused, as limit_req's `delay`.
local function check_delay(ms)
  if ms ~= nil and not (type(ms) == "number" and ms >= 0 and ms % 1 == 0) then
    error("resty.tokenbucket: max_delay_ms must be an integer of milliseconds >= 0", 3)
  end
  return ms
end

-- Builds the limiter from its configuration table (README). Runs in
-- init_by_lua (no I/O here: connections are made on first use, in each
-- worker, which also finds the backend on its own first call).
function _M.new(config)
  if type(config) ~= "table" then error("resty.tokenbucket.new: expected the configuration table", 2) end
  local dict
  if config.shared_dict then
    dict = ngx.shared[config.shared_dict]
    if dict == nil then
      error("resty.tokenbucket: no lua_shared_dict named " .. tostring(config.shared_dict)
        .. " (add `lua_shared_dict " .. tostring(config.shared_dict) .. " 1m;` to the http block)", 2)
    end
  else
    dict = memdict.new(now) -- each worker its own breaker
  end
  local transport = transport_mod.new({
    url = config.redis,
    pool_size = config.pool_size,
    backlog = config.backlog,
    idle_ms = config.idle_ms,
    connect_timeout_ms = config.connect_timeout_ms,
    redis = config.redis_module,
  })
  -- Keys in the shared dict: limiters of one Redis share a breaker (the
  -- server is what fails); `name` separates them anyway.
  local prefix = "tb:" .. (config.name or transport.default) .. ":"
  local limiter = limiter_mod.new({
    send = transport:sender(),
    node_of = function(key) return transport:node_of(key) end,
    slot_of = config.cluster and slot.of or nil,
    clock = now,
    wallclock = now,
    dict = dict,
    prefix = prefix,
    log = log,
    on_error = config.on_error or "closed",
    timeout_ms = config.timeout_ms,
    denial_cache = config.denial_cache,
    breaker = config.breaker,
    processes = config.processes,
    backend = config.backend,
    on_decision = config.on_decision,
    shadow = config.shadow,
    near_limit_ratio = config.near_limit_ratio,
  })
  local notes = logonce.new(dict, log, prefix)
  local self = setmetatable({
    limiter = limiter,
    transport = transport,
    notes = notes,
    legacy = config.legacy_headers == true,
    max_delay_ms = check_delay(config.max_delay_ms),
    on_refusal = config.on_refusal,
    holds = hold_mod.new({ limiter = limiter, clock = now, timer_at = timer_at, logonce = notes }),
  }, Edge)
  if config.rules ~= nil or config.concurrency ~= nil then self.rules = rules_mod.new(config) end
  return self
end

-- ---- answers --------------------------------------------------------------------

local function send_body(status, hdrs, body, content_type)
  ngx.status = status
  for name, value in pairs(hdrs or {}) do ngx.header[name] = value end
  if type(body) == "table" then
    ngx.header["Content-Type"] = content_type or headers.PROBLEM_JSON
    body = json.encode(body)
  elseif content_type then
    ngx.header["Content-Type"] = content_type
  end
  ngx.print(body or "")
  return ngx.exit(status)
end

-- Sends a refusal (headers.refusal's): its status, fields and body, or
-- what config.on_refusal(refusal) returns for it (a table is sent as JSON,
-- a string as it is).
function Edge:refuse(refusal)
  local body, content_type = refusal.body, nil
  if self.on_refusal then
    local custom, ctype = self.on_refusal(refusal)
    if custom ~= nil then
      body, content_type = custom, ctype or (type(custom) == "table" and "application/json" or nil)
    end
  end
  return send_body(refusal.status, refusal.headers, body, content_type)
end

local function problem(status, title, detail)
  return { type = "about:blank", title = title, status = status, detail = detail }
end

-- The answer for a call that returned an error: a usage error (a bad
-- argument, no backend, a reply of the wrong shape) is a 500 and logged,
-- once per cause and minute; a Redis failure under on_error "raise", or a
-- shed upkeep call, a 503.
function Edge:fail(err)
  local kind = classify_mod.classify(err)
  if kind == "usage" then
    local text = classify_mod.describe(err)
    self.notes:report("usage:" .. text, 60, "error", "rate limiter: " .. text)
    return send_body(500, nil, problem(500, "Internal Server Error", "The rate limiter failed: see the error log."))
  end
  return send_body(503, { ["Retry-After"] = "1" }, problem(503, "Service Unavailable",
    kind == "shed" and "The server is overloaded." or "The rate limiter is unavailable."))
end

-- A request the rules refuse before anything is sent (rules.lua's
-- {status, cause, detail}): logged once per cause and minute, never with
-- the request's bytes.
function Edge:bad_request(bad)
  self.notes:report("bad:" .. bad.cause, 60, bad.status >= 500 and "error" or "warn", "rate limiter: " .. bad.cause)
  local title = bad.status == 400 and "Bad Request" or "Internal Server Error"
  return send_body(bad.status, nil, problem(bad.status, title, bad.detail))
end

-- Puts a decision's RateLimit fields on the response (admitted; a
-- degraded admission has none).
function Edge:fields(decision)
  for name, value in pairs(headers.rate_limit(decision, self.legacy)) do ngx.header[name] = value end
end

-- ---- leases held while a request runs --------------------------------------------

-- Keeps `lease` renewed while this request runs, and releases it when it
-- ends (log()); `after(lease)` runs after the release (to settle a token
-- budget, say). A lease that was not acquired is left alone.
function Edge:hold(lease, after)
  if not lease.acquired then return end
  local ctx = ngx.ctx
  local handles = ctx.tokenbucket_leases
  if handles == nil then
    handles = {}
    ctx.tokenbucket_leases = handles
  end
  handles[#handles + 1] = self.holds:hold(lease, ctx, after)
end

-- log_by_lua: the request is over (sent, aborted, or its upstream failed):
-- its leases are released now, on a timer of 0 s.
function Edge:log()
  local handles = ngx.ctx.tokenbucket_leases
  if handles == nil then return end
  for i = 1, #handles do self.holds:done(handles[i]) end
  ngx.ctx.tokenbucket_leases = nil
end

-- ---- the access phase --------------------------------------------------------------

-- Charges the shadow rules' groups in a call of their own, so that a
-- shadow denial never stops an enforced charge (the decision is all or
-- nothing) and an enforced denial never stops a shadow count. Under
-- on_error "open": a shadow rule never refuses, whatever Redis does. Its
-- decision goes to on_decision and the log only. The enforced groups are
-- returned.
function Edge:shadow_rules(groups)
  local enforced, shadow = {}, {}
  for i = 1, #groups do
    local g = groups[i]
    if g.shadow then shadow[#shadow + 1] = g else enforced[#enforced + 1] = g end
  end
  if #shadow == 0 then return groups end
  local _, err = self.limiter:consume_many(shadow, { shadow = true, on_error = "open" })
  if err ~= nil then
    self.notes:report("shadow", 60, "error", "rate limiter: a shadow rule's call failed: " .. classify_mod.describe(err))
  end
  return enforced
end

-- The penalties of a denial (a rule's block_ms): each bucket that denied
-- it, whose rule has a block, charged into debt (TB.ADJUST, failing open:
-- the denial stands whatever becomes of it). An admitted, shadow, cached
-- or degraded decision is charged nothing.
function Edge:penalize(groups, decision)
  if decision.allowed or decision.cached or decision.degraded or decision.shed then return decision end
  local decisions, changed = {}, false
  for i, d in ipairs(decision.decisions) do
    local g = groups[i]
    local block_ms = g and g.block_ms
    local charge = block_ms and penalty.charge(d, block_ms) or 0
    if charge > 0 then
      local adjusted = self.limiter:adjust(g[1], d.bucket, -charge, { on_error = "open" })
      d, changed = penalty.penalized(d, adjusted, block_ms), true
    end
    decisions[i] = d
  end
  if not changed then return decision end
  local out = {}
  for k, v in pairs(decision) do out[k] = v end
  out.decisions = decisions
  for i = 1, #decisions do out.retry_after_ms = math.max(out.retry_after_ms, decisions[i].retry_after_ms) end
  return out
end

-- access_by_lua: this request's decision under the rules. Admitted: the
-- request goes on, with its RateLimit fields; else the refusal is sent
-- (429 with the fields and a problem body, 503 shed or failing closed,
-- 400 for a bad key, 500 for a usage error).
function Edge:access()
  local rules = self.rules
  if rules == nil then error("resty.tokenbucket: access() needs rules or a concurrency in the configuration", 2) end
  local groups, lease_spec = rules:evaluate(var, ngx.ctx)
  if groups == nil then
    -- A deny rule's 429, made before anything is sent.
    if lease_spec.refusal then return self:refuse(lease_spec.refusal) end
    return self:bad_request(lease_spec)
  end
  local limiter = self.limiter
  groups = self:shadow_rules(groups)
  if lease_spec then
    local lease, err = limiter:acquire(lease_spec.key, lease_spec.concurrency,
      { weight = lease_spec.weight, buckets = groups })
    if lease == nil then return self:fail(err) end
    local refusal = headers.refusal(lease, self.legacy)
    if refusal then return self:refuse(refusal) end
    self:fields(lease)
    self:hold(lease)
    return lease
  end
  if #groups == 0 then return nil end -- every rule skipped: nothing to limit
  local delay = self.max_delay_ms
  local decision, err = limiter:consume_many(groups, delay and { max_wait_ms = delay } or nil)
  if decision == nil then return self:fail(err) end
  decision = self:penalize(groups, decision)
  local refusal = headers.refusal(decision, self.legacy)
  if refusal then return self:refuse(refusal) end
  self:fields(decision)
  -- A reservation: the request goes on after its turn, never before.
  if decision.delay_ms > 0 and not decision.degraded then ngx.sleep(decision.delay_ms / 1000) end
  return decision
end

-- ---- readiness -------------------------------------------------------------------

-- {ready, backend, breaker, reason}: whether Redis answers a read-only
-- probe with a backend this limiter can use.
function Edge:ready()
  local backend, err = self.limiter:detect()
  local state = self.limiter:breaker_state()
  if backend == nil then
    return { ready = false, reason = classify_mod.describe(err), breaker = state }
  end
  return { ready = true, backend = backend, breaker = state }
end

return _M
