-- The failure policy (docs/failure-model.md): how a job (requests.lua)
-- runs through the breaker, and what the call answers when Redis can't.
-- An error is classified (classify.lua): a usage error is returned,
-- local overload is shed (refused, never admitted, never counted), a
-- Redis failure counts for the breaker and gets the call's policy:
-- "raise" (returned), "open" (admitted, degraded), "closed" (denied,
-- degraded), "local" (the worker's own buckets, local.lua). A lease's
-- renewals and release go out whatever the breaker says and never count
-- for it; an acquire that got no answer is followed by a best-effort
-- release of its id. The Python package's twin is _policy.py, the Node
-- package's policy.ts; clients/spec holds the scenarios all the clients
-- run.
--
-- `ctx` is the limiter (limiter.lua): its breaker, engine, logonce, and
-- what on_error "local" needs (library, processes, wallclock).

local bucket_mod = require "resty.tokenbucket.bucket"
local breaker_mod = require "resty.tokenbucket.breaker"
local classify_mod = require "resty.tokenbucket.classify"
local decision_mod = require "resty.tokenbucket.decision"
local local_mod = require "resty.tokenbucket.local"
local requests = require "resty.tokenbucket.requests"

local pcall, tostring = pcall, tostring
local classify, describe = classify_mod.classify, classify_mod.describe
local CALL, PROBE, SKIP = breaker_mod.CALL, breaker_mod.PROBE, breaker_mod.SKIP

local _M = {}

-- What a shed decision tells the client to wait (HTTP Retry-After: 1).
_M.SHED_RETRY_MS = 1000

local OUTCOME = { open = "admitted", closed = "denied", ["local"] = "local buckets" }

-- ---- answers without Redis ------------------------------------------------------

local function made_up(group, allowed, retry_ms, flag)
  local d = decision_mod.decision({ allowed and 1 or 0, 0, retry_ms, 0 }, group[1], group[2], group[3])
  d[flag] = true
  return d
end

local function made_up_all(groups, allowed, retry_ms, flag)
  local out = {}
  for i = 1, #groups do out[i] = made_up(groups[i], allowed, retry_ms, flag) end
  return out
end

local ONE = {
  policy = function(req, allowed) return made_up(req.group, allowed, 0, "degraded") end,
  shed = function(req) return made_up(req.group, false, _M.SHED_RETRY_MS, "shed") end,
  ["local"] = function(lb, req)
    local reply = lb:run(req.op, { req.group }, req.after)
    if reply == nil then return made_up(req.group, false, 0, "degraded") end -- above this worker's share
    local d = decision_mod.one(reply, req.group, req.op)
    d.degraded = true
    return d
  end,
}

local MANY
MANY = {
  policy = function(req, allowed)
    local m = decision_mod.multi(allowed, 0, made_up_all(req.groups, allowed, 0, "degraded"), not req.each)
    m.degraded = true
    return m
  end,
  shed = function(req)
    local m = decision_mod.multi(false, _M.SHED_RETRY_MS, made_up_all(req.groups, false, _M.SHED_RETRY_MS, "shed"),
      not req.each)
    m.shed = true
    return m
  end,
  ["local"] = function(lb, req)
    local reply = lb:run("mconsume", req.groups, req.after)
    local m = reply and decision_mod.many(reply, req.groups)
    if m == nil then return MANY.policy(req, false) end
    m.atomic = not req.each
    m.degraded = true
    for i = 1, #m.decisions do m.decisions[i].degraded = true end
    return m
  end,
}

local function lease_of(req, acquired, retry_ms, decisions, flag)
  local lease = {
    acquired = acquired,
    in_use = 0,
    retry_after_ms = retry_ms,
    expires_in_ms = 0,
    id = req.id,
    key = req.key,
    concurrency = req.concurrency,
    weight = req.weight,
    decisions = decisions,
    degraded = false,
    shed = false,
    lost = false,
    released = false,
    held = "none",
  }
  lease[flag] = true
  return lease
end

local LEASE
LEASE = {
  policy = function(req, allowed)
    return lease_of(req, allowed, 0, made_up_all(req.groups, allowed, 0, "degraded"), "degraded")
  end,
  shed = function(req)
    return lease_of(req, false, _M.SHED_RETRY_MS, made_up_all(req.groups, false, _M.SHED_RETRY_MS, "shed"), "shed")
  end,
  ["local"] = function(lb, req)
    local reply = lb:run_lease("acquire", req.key, req.head, req.groups)
    local lease = reply and decision_mod.lease(reply, req, true)
    if lease == nil then return LEASE.policy(req, false) end -- a weight above this worker's share
    -- What it was decided against: this worker's share.
    lease.concurrency = bucket_mod.concurrency({ limit = local_mod.share_limit(req.concurrency.limit, lb.processes),
      lease_ms = req.concurrency.lease_ms, name = req.concurrency.name })
    return lease
  end,
}

local NONE = {
  policy = function(req) return nil, { usage = req.what .. " has no answer without Redis" } end,
  shed = function(req) return nil, { shed = "too busy to get Redis's answer in time for " .. req.what } end,
}
NONE["local"] = NONE.policy

-- A job's `answers` names its answers without Redis.
local ANSWERS = { one = ONE, many = MANY, lease = LEASE, none = NONE }

-- ---- running a job --------------------------------------------------------------

-- The in-process buckets and leases of on_error "local", made on first use.
function _M.local_buckets(ctx)
  local lb = ctx.local_buckets
  if lb == nil then
    lb = local_mod.new(ctx.library.source, ctx.processes, ctx.wallclock)
    ctx.local_buckets = lb
  end
  return lb
end

-- The call's answer while Redis is failing (`err`), logged.
local function policy(ctx, job, err)
  local on_error = job.on_error
  if on_error == "raise" then return nil, err end
  ctx.logonce:report("degraded:" .. on_error, 1, "error", "rate limiter unavailable (fail-" .. on_error .. ": "
    .. OUTCOME[on_error] .. ") for " .. job.req.what .. ": " .. describe(err))
  if on_error == "local" then
    job.source = "local"
    return ANSWERS[job.answers]["local"](_M.local_buckets(ctx), job.req)
  end
  job.source = ""
  return ANSWERS[job.answers].policy(job.req, on_error == "open")
end

-- What an error of a call means: a usage error is returned, local
-- overload sheds, a Redis failure counts for the breaker and gets the
-- call's policy. A lease's upkeep (renew, release) never touches the
-- breaker.
local function failed(ctx, err, job, probe, send)
  local kind = classify(err)
  local breaker = not job.upkeep and ctx.breaker or nil
  if kind == "usage" then
    if breaker then breaker:success(probe) end -- Redis answered, if only to refuse
    return nil, err
  end
  if job.req.op == "acquire" and (kind == "failure" or err.answering) then
    requests.release_unanswered(ctx, send, job.req)
  end
  if kind == "shed" then
    if breaker then breaker:release(probe) end
    job.source = ""
    return ANSWERS[job.answers].shed(job.req)
  end
  if breaker then breaker:failure(probe) end
  return policy(ctx, job, err)
end

-- Runs a job's plan through the breaker, its commands sent with `send`;
-- what a failure means, answered: the answer, or nil and the error.
function _M.run(ctx, job, send)
  -- Renewals and releases are sent whatever the breaker says (a stream
  -- that ends must free its slot at once) and never count for it.
  local breaker = not job.upkeep and ctx.breaker or nil
  local mode = breaker and breaker:enter() or CALL
  if mode == SKIP then
    return policy(ctx, job, { circuit_open = true,
      message = "the breaker is open: Redis failed " .. breaker.failures .. " times lately" })
  end
  local ok, result, err = pcall(job.plan, ctx, send, job.req)
  if not ok then
    -- A bug, or a transport that raised: never admitted.
    err = { shed = "rate limiter error: " .. tostring(result) }
    ctx.logonce:report("raised", 60, "error", err.shed)
    result = nil
  end
  if result == nil then return failed(ctx, err, job, mode == PROBE, send) end
  if breaker and mode == PROBE then breaker:success(true) end
  return result
end

return _M
