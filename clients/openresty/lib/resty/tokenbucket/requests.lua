-- Requests: every call's arguments checked before anything is sent (in
-- the module's order, with its messages), made into a job, and the job's
-- plan: the commands it sends (through the engine) and what it makes of
-- their replies, the denial cache's part included. How a job runs, and
-- what it answers when Redis can't, is policy.lua. The Python package's
-- twin is _requests.py, the Node package's requests.ts.
--
-- `ctx` is the limiter (limiter.lua): its engine, cache, slot_of,
-- new_id and default timeout_ms and on_error. A job is
--   {plan = fn(ctx, send, req), answers = "one" | "many" | "lease" | "none",
--    req = ..., timeout_ms, on_error, done = an answer known without Redis}
-- where `answers` names policy.lua's answers without Redis.

local bucket_mod = require "resty.tokenbucket.bucket"
local contract = require "resty.tokenbucket.contract"
local decision_mod = require "resty.tokenbucket.decision"
local quota_mod = require "resty.tokenbucket.quota"

local type, pcall, tostring, max = type, pcall, tostring, math.max

local _M = {}

local ON_ERROR = { raise = true, open = true, closed = true, ["local"] = true }

function _M.check_on_error(value)
  if not ON_ERROR[value] then
    error({ usage = "on_error must be one of raise, open, closed, local, got " .. tostring(value) }, 0)
  end
  return value
end
local check_on_error = _M.check_on_error

function _M.check_timeout(value)
  if value == false then return false end
  if type(value) ~= "number" or not (value > 0 and value < 1e12) then
    error({ usage = "timeout_ms must be a number > 0 (or false for the transport's own)" }, 0)
  end
  return value
end
local check_timeout = _M.check_timeout

-- ---- checks ---------------------------------------------------------------------

-- A bucket or a quota (a table with a `period`), checked; its amount.
local function rule_of(spec, group)
  if quota_mod.is_quota(spec) or (type(spec) == "table" and spec.period ~= nil and spec.rate == nil) then
    return quota_mod.quota(spec, group)
  end
  return bucket_mod.bucket(spec, group)
end
_M.rule_of = rule_of

local function check_amount(cost, rule, group)
  if rule.kind == "quota" then return quota_mod.check_cost(cost, rule, group) end
  return bucket_mod.check_cost(cost, rule, group)
end

-- `WAIT max_ms` for `opts.max_wait_ms`, or nil. Only buckets reserve: a
-- quota alone with a wait is an error (TB.CHARGE waits for the buckets
-- beside quotas).
local function reservation(opts, rules, many)
  local ms = opts and opts.max_wait_ms
  if ms == nil then return nil end
  if type(ms) ~= "number" or ms % 1 ~= 0 or ms < 0 or ms > contract.MAX_WAIT_MS then
    error({ usage = "max_wait_ms must be an integer from 0 to " .. contract.MAX_WAIT_MS }, 0)
  end
  if not many then
    for i = 1, #rules do
      if rules[i].kind == "quota" then
        error({ usage = "max_wait_ms is for buckets: a quota never reserves, it resets" }, 0)
      end
    end
  end
  return { "WAIT", string.format("%d", ms) }
end

-- Buckets and quotas given as {key, rule} or {key, rule, cost}, checked
-- in the module's order: their count, then each left to right, then (for
-- an acquire's, beside its lease key) a rule on the lease key, then
-- duplicates.
local function check_groups(given, lease_key)
  if type(given) ~= "table" then error({ usage = "groups must be a list of {key, bucket, cost}" }, 0) end
  if #given > contract.MAX_GROUPS then error(bucket_mod.invalid("groups", "too_many_groups"), 0) end
  local out = {}
  for i = 1, #given do
    local g = given[i]
    if type(g) ~= "table" then error({ usage = "group " .. i .. ": expected {key, bucket, cost}" }, 0) end
    local key = bucket_mod.check_key(g[1], i)
    local b = rule_of(g[2], i)
    local cost = g[3]
    if cost == nil then cost = 1 end
    out[i] = { key, b, check_amount(cost, b, i) }
  end
  local seen = {}
  for i = 1, #out do
    local key = out[i][1]
    if lease_key ~= nil and key == lease_key then
      error(bucket_mod.invalid("buckets", "bucket_is_lease_key", { group = i }), 0)
    end
  end
  for i = 1, #out do
    local key = out[i][1]
    if seen[key] then error(bucket_mod.invalid("key", "duplicate_key", { group = i, first = seen[key] }), 0) end
    seen[key] = i
  end
  return out
end

local function spans_slots(ctx, keys)
  local slot_of = ctx.slot_of
  if slot_of == nil or #keys < 2 then return false end
  local first = slot_of(keys[1])
  for i = 2, #keys do
    if slot_of(keys[i]) ~= first then return true end
  end
  return false
end

local function options(ctx, opts)
  local timeout, on_error = ctx.timeout_ms, ctx.on_error
  if opts then
    if opts.timeout_ms ~= nil then timeout = check_timeout(opts.timeout_ms) end
    if opts.on_error ~= nil then on_error = check_on_error(opts.on_error) end
  end
  return timeout, on_error
end

local function job(plan, answers, req, timeout, on_error)
  return { plan = plan, answers = answers, req = req, timeout_ms = timeout, on_error = on_error }
end

-- An acquire that got no answer may have taken its slot all the same (a
-- timeout after the write, a connection lost with the command on it, a
-- reply late while Redis answered the worker's others): its id is
-- released, best effort (a release Redis can't take leaves the lease to
-- expire, as a crashed holder's).
function _M.release_unanswered(ctx, send, req)
  pcall(ctx.engine.call, ctx.engine, send, "release", {}, { req.key, { req.id } })
end

-- ---- plans: the I/O of each operation ---------------------------------------------

local function names_of(groups, first)
  local names = {}
  if first ~= nil then names[1] = first end
  for i = 1, #groups do names[#names + 1] = groups[i][2].name or "" end
  local text = table.concat(names, ",")
  return (text:gsub("^,+", ""):gsub(",+$", ""))
end

local function plan_one(ctx, send, req)
  -- A reservation is kept out of the denial cache: a plain denial says
  -- nothing of it, nor its denial of a plain call.
  local cache, ticket = not req.after and ctx.cache or nil
  if cache then ticket = cache:sent(req.op, { req.group[1] }) end
  local reply, err = ctx.engine:call(send, req.op, { req.group }, nil, req.after)
  local d
  if reply ~= nil then d, err = decision_mod.one(reply, req.group, req.op) end
  if d == nil then
    if ticket then cache:failed(ticket) end
    return nil, err
  end
  if ticket then cache:answered(ticket, d.allowed, d.retry_after_ms, { d }) end
  return d
end

-- Gives back what a decision key by key charged before a later key
-- denied: each charge refunded (TB.ADJUST, or TB.QADJUST for a quota),
-- its decision what the all-or-nothing call would report. The decisions,
-- or nil and the error.
local function refund(ctx, send, charged)
  local out = {}
  for j = 1, #charged do
    local c = charged[j]
    if c.cost > 0 then
      local cg = { c.key, c.bucket, c.cost }
      local r, rerr = ctx.engine:call(send, "adjust", { cg })
      if r == nil then return nil, rerr end
      local refunded, ferr = decision_mod.one(r, cg, "consume")
      if refunded == nil then return nil, ferr end
      -- It could pay on its own, as TB.MCONSUME would report it; ADJUST's
      -- retry time (for cost 1) means nothing here.
      refunded.allowed, refunded.retry_after_ms, refunded.delay_ms = true, 0, 0
      c = refunded
    end
    out[#out + 1] = c
  end
  return out
end

-- All-or-nothing without TB.MCONSUME, for keys in several Cluster slots:
-- charge bucket by bucket in order; when one denies, refund those already
-- charged and peek at the rest, so the answer is the one TB.MCONSUME would
-- give. Not atomic: until the refunds land, the refunded tokens are
-- missing; and if Redis fails between a charge and its refund, the charge
-- stays.
local function plan_each(ctx, send, groups, after)
  local charged = {}
  for i = 1, #groups do
    local g = groups[i]
    -- A wait reserves bucket tokens; a quota never waits.
    local reply, err = ctx.engine:call(send, "consume", { g }, nil, g[2].kind == "bucket" and after or nil)
    if reply == nil then return nil, err end
    local d, serr = decision_mod.one(reply, g, "consume")
    if d == nil then return nil, serr end
    if not d.allowed then
      local decisions, rerr = refund(ctx, send, charged)
      if decisions == nil then return nil, rerr end
      decisions[#decisions + 1] = d
      local retry = d.retry_after_ms
      for j = i + 1, #groups do
        local r, perr = ctx.engine:call(send, "peek", { groups[j] })
        if r == nil then return nil, perr end
        local p, pserr = decision_mod.one(r, groups[j], "peek")
        if p == nil then return nil, pserr end
        decisions[#decisions + 1] = p
      end
      for j = 1, #decisions do retry = max(retry, decisions[j].retry_after_ms) end
      return decision_mod.multi(false, retry, decisions, false)
    end
    charged[#charged + 1] = d
  end
  local retry = 0
  for j = 1, #charged do retry = max(retry, charged[j].retry_after_ms) end
  return decision_mod.multi(true, retry, charged, false)
end

-- A multi-key call refused because its slot is moving (TRYAGAIN, or ASK,
-- before anything ran): the keys are not all on one node until it has
-- moved.
local function migrating(err)
  local reply = type(err) == "table" and err.reply
  return type(reply) == "string" and (reply:sub(1, 8) == "TRYAGAIN" or reply:sub(1, 4) == "ASK ")
end
_M.migrating = migrating

local function plan_many(ctx, send, req)
  local cache, ticket = not req.after and ctx.cache or nil
  if cache then ticket = cache:sent(req.each and "each" or "mconsume", req.keys) end
  local result, err
  if req.each then
    result, err = plan_each(ctx, send, req.groups, req.after)
  else
    local reply
    reply, err = ctx.engine:call(send, "mconsume", req.groups, nil, req.after)
    if reply ~= nil then
      result, err = decision_mod.many(reply, req.groups)
    elseif migrating(err) then
      -- Key by key while the slot moves; the ticket says so (refunds write).
      if ticket then ticket.op = "each" end
      result, err = plan_each(ctx, send, req.groups, req.after)
    end
  end
  if result == nil then
    if ticket then cache:failed(ticket) end
    return nil, err
  end
  if ticket then cache:answered(ticket, result.allowed, result.retry_after_ms, result.decisions) end
  return result
end

-- An acquire whose rules are in a slot that is moving: the rules charged
-- key by key (all or none, as plan_each), then the lease alone, whose
-- being busy gives them back. TB.ACQUIRE's answer, not atomic.
local function plan_acquire_each(ctx, send, req)
  local many, err = plan_each(ctx, send, req.groups)
  if many == nil then return nil, err end
  local alone = { key = req.key, concurrency = req.concurrency, id = req.id, weight = req.weight, groups = {},
    head = req.head }
  if not many.allowed then
    -- Denied by a bucket: no lease taken; in_use as the key has it.
    local in_use, ierr = ctx.engine:call(send, "inflight", {}, { req.key, {} })
    if in_use == nil then return nil, ierr end
    local lease, lerr = decision_mod.lease({ 0, in_use, many.retry_after_ms, 0 }, alone, false)
    if lease == nil then return nil, lerr end
    lease.decisions = many.decisions
    return lease
  end
  local reply, aerr = ctx.engine:call(send, "acquire", {}, { req.key, req.head })
  if reply == nil then return nil, aerr end
  local lease, lerr = decision_mod.lease(reply, alone, false)
  if lease == nil then return nil, lerr end
  local decisions = many.decisions
  if not lease.acquired then
    -- Busy: the rules are given back, and could pay, as TB.ACQUIRE reports them.
    local rerr
    decisions, rerr = refund(ctx, send, decisions)
    if decisions == nil then return nil, rerr end
  end
  lease.decisions = decisions
  return lease
end

local function plan_acquire(ctx, send, req)
  -- The buckets it charges: cached denials of them are forgotten. An
  -- acquire's own denial is never cached (a release can free a slot at any
  -- time).
  local cache, ticket = ctx.cache
  if cache and #req.groups > 0 then ticket = cache:sent("acquire", req.keys) end
  local reply, err = ctx.engine:call(send, "acquire", req.groups, { req.key, req.head })
  local lease
  if reply ~= nil then
    lease, err = decision_mod.lease(reply, req, false)
  elseif #req.groups > 0 and migrating(err) then
    lease, err = plan_acquire_each(ctx, send, req)
  end
  if lease == nil then
    if ticket then cache:failed(ticket) end
    return nil, err
  end
  if ticket then cache:answered(ticket, lease.acquired, lease.retry_after_ms, lease.decisions) end
  return lease
end

local function plan_lease_op(ctx, send, req)
  local reply, err = ctx.engine:call(send, req.op, {}, { req.key, req.head })
  if reply == nil then return nil, err end
  if req.op == "inflight" then return decision_mod.count(reply) end
  return decision_mod.pair(reply, req.op == "renew" and "TB.RENEW" or "TB.RELEASE")
end

-- CONFIG GET's one value: the second word of its reply.
local function config_value(reply)
  if type(reply) ~= "table" or reply[2] == nil then return "" end
  return tostring(reply[2])
end

-- The module's warning (core/src/eviction.rs, contract.json's "warnings")
-- where `policy` with `maxmemory` can evict the limiter's keys, or nil.
function _M.eviction_warning(policy, maxmemory)
  local p = policy:lower()
  if maxmemory == 0 or p == "" or p == "noeviction" then return nil end
  local what = p:sub(1, 9) == "volatile-" and contract.WARNINGS.eviction_volatile or contract.WARNINGS.eviction_allkeys
  return (contract.WARNINGS.eviction:gsub("{(%w+)}", { policy = policy, maxmemory = tostring(maxmemory), what = what }))
end

local function plan_detect(ctx, send, req)
  local reply, err = ctx.engine:call(send, "peek", { req.group })
  if reply == nil then return nil, err end
  local backend = ctx.engine.backend or ""
  -- The Lua library can't say that the server may evict its keys, as the
  -- module does: the readiness probe looks, once per worker (a refused
  -- CONFIG, an ACL's or a managed service's, leaves it unsaid).
  if (backend == "functions" or backend == "eval") and not ctx.engine.memory_checked then
    ctx.engine.memory_checked = true
    local policy = send({ "CONFIG", "GET", "maxmemory-policy" })
    local maxmemory = policy and send({ "CONFIG", "GET", "maxmemory" })
    local warning = maxmemory and _M.eviction_warning(config_value(policy), tonumber(config_value(maxmemory)) or 0)
    if warning then ctx.log("warn", warning) end
  end
  return backend
end

local function plan_reset(ctx, send, req)
  local cache, ticket = ctx.cache
  if cache then ticket = cache:sent("reset", { req.key }) end
  -- No key is a full bucket.
  local reply, err = send({ "DEL", req.key }, req.key)
  if reply == nil then
    if ticket then cache:failed(ticket) end
    return nil, err
  end
  if ticket then cache:answered(ticket, true, 0, {}) end
  return reply == 1
end

-- ---- jobs: each call's arguments checked and made a job -----------------------------

-- consume, peek or adjust of one bucket; a denial the cache knows is done.
function _M.one(ctx, op, key, bucket, amount, opts)
  local timeout, on_error = options(ctx, opts)
  key = bucket_mod.check_key(key)
  local b = rule_of(bucket)
  if amount == nil then amount = 1 end
  local value = op == "adjust" and bucket_mod.check_delta(amount) or check_amount(amount, b)
  local after = op ~= "adjust" and reservation(opts, { b }) or nil
  local req = { op = op, group = { key, b, value }, after = after, names = b.name or "", what = op .. " " .. key }
  local j = job(plan_one, "one", req, timeout, on_error)
  local cache = ctx.cache
  if cache and op ~= "adjust" and not after then
    local hit = cache:lookup({ key }, { b }, { value })
    if hit then j.done = hit.decisions[1] end
  end
  return j
end

-- consume_many: all or nothing, or bucket by bucket across Cluster slots.
function _M.many(ctx, groups, opts)
  local timeout, on_error = options(ctx, opts)
  if type(groups) == "table" and #groups == 0 then
    error({ usage = "consume_many needs at least one {key, bucket, cost}" }, 0)
  end
  local checked_groups = check_groups(groups)
  local keys = {}
  for i = 1, #checked_groups do keys[i] = checked_groups[i][1] end
  local atomic = opts and opts.atomic
  local split = spans_slots(ctx, keys)
  if split and atomic then
    error({ usage = "atomic consume_many needs every key in one Cluster hash slot: put the shared part in a "
      .. "hash tag ({...})", cross_slot = true }, 0)
  end
  local each = split or atomic == false
  local after = reservation(opts, {}, true)
  local req = { op = "mconsume", event_op = "consume_many", groups = checked_groups, keys = keys, each = each,
    after = after, names = names_of(checked_groups), what = "consume_many " .. table.concat(keys, ", ") }
  local j = job(plan_many, "many", req, timeout, on_error)
  local cache = ctx.cache
  if cache and not after then
    local buckets, costs = {}, {}
    for i = 1, #checked_groups do
      buckets[i], costs[i] = checked_groups[i][2], checked_groups[i][3]
    end
    local hit = cache:lookup(keys, buckets, costs)
    if hit then
      local m = decision_mod.multi(false, hit.retry_after_ms, hit.decisions, not each)
      m.cached = true
      j.done = m
    end
  end
  return j
end

-- A lease's acquire, with the buckets and quotas it charges in the same call.
function _M.acquire(ctx, key, concurrency, opts)
  opts = opts or {}
  local timeout, on_error = options(ctx, opts)
  key = bucket_mod.check_key(key)
  local c = bucket_mod.concurrency(concurrency)
  local id = opts.id
  if id == nil then id = ctx.new_id() end
  bucket_mod.check_id(id)
  local weight = c:check_weight(opts.weight or 1)
  local groups = check_groups(opts.buckets or {}, key)
  local keys = {}
  for i = 1, #groups do keys[i] = groups[i][1] end
  if #groups > 0 then
    local all = { key }
    for i = 1, #keys do all[i + 1] = keys[i] end
    if spans_slots(ctx, all) then
      error({ usage = "acquire needs the lease key and its rules' keys in one Cluster hash slot: put the shared "
        .. "part in a hash tag ({...})", cross_slot = true }, 0)
    end
  end
  local head = { tostring(c.limit), tostring(c.lease_ms), id, tostring(weight) }
  local req = { op = "acquire", key = key, concurrency = c, id = id, weight = weight, groups = groups, keys = keys,
    head = head, names = names_of(groups, c.name or ""), what = "acquire " .. key }
  return job(plan_acquire, "lease", req, timeout, on_error)
end

-- A lease's renew or release: no policy answers for it, nor the breaker.
function _M.upkeep(ctx, op, lease, opts)
  local timeout = options(ctx, opts)
  local head
  if op == "renew" then head = { lease.id, tostring(lease.concurrency.lease_ms) } else head = { lease.id } end
  local req = { op = op, key = lease.key, head = head, what = op .. " " .. lease.key }
  local j = job(plan_lease_op, "none", req, timeout, "raise")
  j.upkeep = true
  return j, head
end

-- The lease key's live weight; the backend probe; a bucket's key deleted.
function _M.inflight(ctx, key, opts)
  local req = { op = "inflight", key = key, head = {}, what = "in_flight " .. key }
  return job(plan_lease_op, "none", req, (options(ctx, opts)), "raise")
end

function _M.detect(ctx, probe_key, opts)
  local probe = bucket_mod.bucket({ max = 1, rate = 1 })
  local req = { op = "peek", group = { probe_key, probe, 1 }, what = "detect" }
  return job(plan_detect, "none", req, (options(ctx, opts)), "raise")
end

function _M.reset(ctx, key, opts)
  return job(plan_reset, "none", { op = "reset", key = key, what = "reset " .. key }, (options(ctx, opts)), "raise")
end

return _M
