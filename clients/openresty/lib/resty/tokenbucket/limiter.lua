-- The limiter: every call's way from its arguments to its answer, with
-- the failure model of the Python and Node packages (docs/failure-model.md):
--
--   arguments checked first (nothing is sent for a bad one);
--   a denial the worker's cache knows is answered at once (cached);
--   the breaker open: the policy at once, no network;
--   else the backend is asked (engine.lua), and an error is classified
--   (classify.lua): a usage error is returned, local overload is shed
--   (refused, never admitted, never counted), a Redis failure counts for
--   the breaker and gets the call's policy: "raise" (returned), "open"
--   (admitted, degraded), "closed" (denied, degraded), "local" (the
--   worker's own buckets, local.lua);
--   a lease's renewals and release go out whatever the breaker says and
--   never count for it; an acquire that got no answer is followed by a
--   best-effort release of its id.
--
-- Calls return their answer, or nil and an error table (classify.lua's
-- shapes; an invalid argument is bucket.lua's Invalid, with `usage`).
--
-- I/O and time are injected, so the clients/spec scenarios (error
-- classification, breaker transitions, denial-cache timelines, backend
-- detection, a lease's life) drive it under plain LuaJIT:
--   send(args, key, budget_ms) -> reply | nil, err    the transport
--   node_of(key), slot_of(key)                          Cluster routing (optional)
--   clock() -> seconds                                  for the cache, breaker, latency
--   wallclock() -> seconds since the epoch              for on_error = "local"
-- resty.tokenbucket wires them to nginx (transport.lua, ngx.now).

local bucket_mod = require "resty.tokenbucket.bucket"
local breaker_mod = require "resty.tokenbucket.breaker"
local cache_mod = require "resty.tokenbucket.cache"
local classify_mod = require "resty.tokenbucket.classify"
local contract = require "resty.tokenbucket.contract"
local engine_mod = require "resty.tokenbucket.engine"
local local_mod = require "resty.tokenbucket.local"
local logonce = require "resty.tokenbucket.logonce"
local memdict = require "resty.tokenbucket.memdict"
local decision_mod = require "resty.tokenbucket.decision"

local type, pcall, setmetatable, tostring, max = type, pcall, setmetatable, tostring, math.max
local classify, describe = classify_mod.classify, classify_mod.describe
local CALL, PROBE, SKIP = breaker_mod.CALL, breaker_mod.PROBE, breaker_mod.SKIP

local _M = {}

-- The budget for Redis to answer a command, from when it is written (ms).
_M.DEFAULT_TIMEOUT_MS = 100
-- While the backend is unknown a call may load the Lua library, which
-- Redis compiles: such calls get at least this budget (ms).
_M.DETECT_TIMEOUT_MS = 1000
-- What a shed decision tells the client to wait (HTTP Retry-After: 1).
_M.SHED_RETRY_MS = 1000
-- The key detect() peeks at, under `rl:` like the usual buckets.
_M.PROBE_KEY = "rl:probe"

local ON_ERROR = { raise = true, open = true, closed = true, ["local"] = true }
local OUTCOME = { open = "admitted", closed = "denied", ["local"] = "local buckets" }

local Limiter = {}
Limiter.__index = Limiter

local function check_on_error(value)
  if not ON_ERROR[value] then
    error({ usage = "on_error must be one of raise, open, closed, local, got " .. tostring(value) }, 0)
  end
  return value
end

local function check_timeout(value)
  if value == false then return false end
  if type(value) ~= "number" or not (value > 0 and value < 1e12) then
    error({ usage = "timeout_ms must be a number > 0 (or false for the transport's own)" }, 0)
  end
  return value
end

local function default_new_id()
  -- 128 random bits, as a UUID's hex; /dev/urandom so that workers forked
  -- from one master never draw the same ids.
  local f = io.open("/dev/urandom", "rb")
  local raw = f and f:read(16)
  if f then f:close() end
  if not raw or #raw ~= 16 then error({ usage = "no /dev/urandom for lease ids: pass new_id" }, 0) end
  return (raw:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

function _M.new(opts)
  local clock = assert(opts.clock, "limiter: a clock is needed")
  local dict = opts.dict or memdict.new(clock)
  local prefix = opts.prefix or ""
  local log = opts.log or function() end
  local self = setmetatable({
    send = assert(opts.send, "limiter: send is needed"),
    node_of = opts.node_of,
    slot_of = opts.slot_of,
    clock = clock,
    wallclock = opts.wallclock or clock,
    dict = dict,
    log = log,
    logonce = logonce.new(dict, log, prefix),
    on_error = check_on_error(opts.on_error or "raise"),
    timeout_ms = check_timeout(opts.timeout_ms == nil and _M.DEFAULT_TIMEOUT_MS or opts.timeout_ms),
    processes = opts.processes or 1,
    new_id = opts.new_id or default_new_id,
    on_decision = opts.on_decision,
    library = opts.library or require("resty.tokenbucket.library"),
    held = {},
    n_held = 0,
  }, Limiter)
  if type(self.processes) ~= "number" or self.processes < 1 or self.processes % 1 ~= 0 then
    error("processes must be an integer >= 1", 2)
  end
  if self.library.version ~= contract.LIBRARY_VERSION then
    error("resty.tokenbucket.library is of the Lua library " .. tostring(self.library.version)
      .. ", the contract is of " .. contract.LIBRARY_VERSION .. ": run `make` to rebuild it", 2)
  end
  self.engine = engine_mod.new({ backend = opts.backend, library = self.library, log = log,
    node_of = opts.node_of })
  if opts.breaker ~= false then
    local b = opts.breaker or {}
    self.breaker = breaker_mod.new({ dict = dict, clock = clock, prefix = prefix, failures = b.failures,
      window = b.window, cooldown = b.cooldown })
  end
  local size = opts.denial_cache
  if size == true then size = cache_mod.DEFAULT_ENTRIES end
  if size and size ~= 0 then self.cache = cache_mod.new(size, clock) end
  return self
end

-- "closed", "open" or "half_open" ("closed" without a breaker).
function Limiter:breaker_state()
  return self.breaker and self.breaker:state() or "closed"
end

-- The backend in use ("module", "functions" or "eval"); nil until a call finds it.
function Limiter:backend()
  return self.engine.backend
end

-- How many leases this worker holds now: acquired and not given back.
function Limiter:leases_held()
  return self.n_held
end

-- ---- checks ---------------------------------------------------------------------

-- Buckets given as {key, bucket} or {key, bucket, cost}, checked in the
-- module's order: their count, then each left to right, then duplicates.
local function check_groups(given, lease_key)
  if type(given) ~= "table" then error({ usage = "groups must be a list of {key, bucket, cost}" }, 0) end
  if #given > contract.MAX_GROUPS then error(bucket_mod.invalid("groups", "too_many_groups"), 0) end
  local out = {}
  for i = 1, #given do
    local g = given[i]
    if type(g) ~= "table" then error({ usage = "group " .. i .. ": expected {key, bucket, cost}" }, 0) end
    local key = bucket_mod.check_key(g[1], i)
    local b = bucket_mod.bucket(g[2], i)
    local cost = g[3]
    if cost == nil then cost = 1 end
    out[i] = { key, b, bucket_mod.check_cost(cost, b, i) }
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

local function spans_slots(self, keys)
  local slot_of = self.slot_of
  if slot_of == nil or #keys < 2 then return false end
  local first = slot_of(keys[1])
  for i = 2, #keys do
    if slot_of(keys[i]) ~= first then return true end
  end
  return false
end

local function options(self, opts)
  local timeout, on_error = self.timeout_ms, self.on_error
  if opts then
    if opts.timeout_ms ~= nil then timeout = check_timeout(opts.timeout_ms) end
    if opts.on_error ~= nil then on_error = check_on_error(opts.on_error) end
  end
  return timeout, on_error
end

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
    local reply = lb:run(req.op, { req.group })
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
    local reply = lb:run("mconsume", req.groups)
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

-- ---- running a call -------------------------------------------------------------

local function local_buckets(self)
  local lb = self.local_buckets
  if lb == nil then
    lb = local_mod.new(self.library.source, self.processes, self.wallclock)
    self.local_buckets = lb
  end
  return lb
end

-- The call's answer while Redis is failing (`err`), logged.
local function policy(self, job, err)
  local on_error = job.on_error
  if on_error == "raise" then return nil, err end
  self.logonce:report("degraded:" .. on_error, 1, "error", "rate limiter unavailable (fail-" .. on_error .. ": "
    .. OUTCOME[on_error] .. ") for " .. job.req.what .. ": " .. describe(err))
  if on_error == "local" then
    job.source = "local"
    return job.answers["local"](local_buckets(self), job.req)
  end
  job.source = ""
  return job.answers.policy(job.req, on_error == "open")
end

-- An acquire that got no answer may have taken its slot all the same (a
-- timeout after the write, a connection lost with the command on it, a
-- reply late while Redis answered the worker's others): its id is
-- released, best effort (a release Redis can't take leaves the lease to
-- expire, as a crashed holder's).
local function release_unanswered(self, send, req)
  pcall(self.engine.call, self.engine, send, "release", {}, { req.key, { req.id } })
end

-- What an error of a call means: a usage error is returned, local
-- overload sheds, a Redis failure counts for the breaker and gets the
-- call's policy. A lease's upkeep (renew, release) never touches the
-- breaker.
local function failed(self, err, job, probe, send)
  local kind = classify(err)
  local breaker = not job.upkeep and self.breaker or nil
  if kind == "usage" then
    if breaker then breaker:success(probe) end -- Redis answered, if only to refuse
    return nil, err
  end
  if job.req.op == "acquire" and (kind == "failure" or err.answering) then release_unanswered(self, send, job.req) end
  if kind == "shed" then
    if breaker then breaker:release(probe) end
    job.source = ""
    return job.answers.shed(job.req)
  end
  if breaker then breaker:failure(probe) end
  return policy(self, job, err)
end

-- Counts a lease an acquire took as held, and reports a decision to the
-- on_decision hook (never raising into the call).
local function settled(self, job, result, started)
  local req = job.req
  if req.op == "acquire" and result and result.acquired then
    local ident = req.key .. "\0" .. req.id
    if not self.held[ident] then
      self.held[ident] = true
      self.n_held = self.n_held + 1
    end
  end
  local hook = self.on_decision
  if hook == nil or result == nil or req.names == nil then return result end
  local allowed
  if req.op == "acquire" then allowed = result.acquired else allowed = result.allowed end
  local event = {
    op = req.event_op or req.op,
    policy = req.names,
    allowed = allowed,
    degraded = result.degraded or false,
    shed = result.shed or false,
    cached = result.cached or false,
    backend = job.source or self.engine.backend or "",
    latency_s = self.clock() - started,
    breaker = self:breaker_state(),
  }
  local ok, err = pcall(hook, event)
  if not ok then
    self.logonce:report("hook", 60, "error", "rate limiter: the on_decision hook raised; the decision stands: "
      .. tostring(err))
  end
  return result
end

local function budget(self, job)
  local timeout = job.timeout_ms
  if timeout and timeout < _M.DETECT_TIMEOUT_MS and self.engine.backend == nil then
    return _M.DETECT_TIMEOUT_MS
  end
  return timeout
end

local function run(self, job)
  local started = self.clock()
  if job.done ~= nil then return settled(self, job, job.done, started) end
  -- Renewals and releases are sent whatever the breaker says (a stream
  -- that ends must free its slot at once) and never count for it.
  local breaker = not job.upkeep and self.breaker or nil
  local mode = breaker and breaker:enter() or CALL
  if mode == SKIP then
    local answer, err = policy(self, job, { circuit_open = true,
      message = "the breaker is open: Redis failed " .. breaker.failures .. " times lately" })
    if answer == nil then return nil, err end
    return settled(self, job, answer, started)
  end
  local transport, limit = self.send, budget(self, job)
  local send = function(args, key) return transport(args, key, limit) end
  local ok, result, err = pcall(job.plan, self, send, job.req)
  if not ok then
    -- A bug, or a transport that raised: never admitted.
    err = { shed = "rate limiter error: " .. tostring(result) }
    self.logonce:report("raised", 60, "error", err.shed)
    result = nil
  end
  if result == nil then
    local answer, aerr = failed(self, err, job, mode == PROBE, send)
    if answer == nil then return nil, aerr end
    return settled(self, job, answer, started)
  end
  if breaker and mode == PROBE then breaker:success(true) end
  return settled(self, job, result, started)
end

local function job(plan, answers, req, timeout, on_error)
  return { plan = plan, answers = answers, req = req, timeout_ms = timeout, on_error = on_error }
end

-- ---- plans: the I/O of each operation ---------------------------------------------

local function names_of(groups, first)
  local names = {}
  if first ~= nil then names[1] = first end
  for i = 1, #groups do names[#names + 1] = groups[i][2].name or "" end
  local text = table.concat(names, ",")
  return (text:gsub("^,+", ""):gsub(",+$", ""))
end

local function plan_one(self, send, req)
  local cache, ticket = self.cache
  if cache then ticket = cache:sent(req.op, { req.group[1] }) end
  local reply, err = self.engine:call(send, req.op, { req.group })
  local d
  if reply ~= nil then d, err = decision_mod.one(reply, req.group, req.op) end
  if d == nil then
    if ticket then cache:failed(ticket) end
    return nil, err
  end
  if ticket then cache:answered(ticket, d.allowed, d.retry_after_ms, { d }) end
  return d
end

-- All-or-nothing without TB.MCONSUME, for keys in several Cluster slots:
-- charge bucket by bucket in order; when one denies, refund those already
-- charged and peek at the rest, so the answer is the one TB.MCONSUME would
-- give. Not atomic: until the refunds land, the refunded tokens are
-- missing; and if Redis fails between a charge and its refund, the charge
-- stays.
local function plan_each(self, send, groups)
  local charged = {}
  for i = 1, #groups do
    local g = groups[i]
    local reply, err = self.engine:call(send, "consume", { g })
    if reply == nil then return nil, err end
    local d, serr = decision_mod.one(reply, g, "consume")
    if d == nil then return nil, serr end
    if not d.allowed then
      local decisions = {}
      for j = 1, #charged do
        local c = charged[j]
        if c.cost > 0 then
          local cg = { c.key, c.bucket, c.cost }
          local r, rerr = self.engine:call(send, "adjust", { cg })
          if r == nil then return nil, rerr end
          local refunded, ferr = decision_mod.one(r, cg, "consume")
          if refunded == nil then return nil, ferr end
          -- It could pay on its own, as TB.MCONSUME would report it.
          refunded.allowed, refunded.retry_after_ms = true, 0
          c = refunded
        end
        decisions[#decisions + 1] = c
      end
      decisions[#decisions + 1] = d
      local retry = d.retry_after_ms
      for j = i + 1, #groups do
        local r, perr = self.engine:call(send, "peek", { groups[j] })
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
  return decision_mod.multi(true, 0, charged, false)
end

local function plan_many(self, send, req)
  local cache, ticket = self.cache
  if cache then ticket = cache:sent(req.each and "each" or "mconsume", req.keys) end
  local result, err
  if req.each then
    result, err = plan_each(self, send, req.groups)
  else
    local reply
    reply, err = self.engine:call(send, "mconsume", req.groups)
    if reply ~= nil then result, err = decision_mod.many(reply, req.groups) end
  end
  if result == nil then
    if ticket then cache:failed(ticket) end
    return nil, err
  end
  if ticket then cache:answered(ticket, result.allowed, result.retry_after_ms, result.decisions) end
  return result
end

local function plan_acquire(self, send, req)
  -- The buckets it charges: cached denials of them are forgotten. An
  -- acquire's own denial is never cached (a release can free a slot at any
  -- time).
  local cache, ticket = self.cache
  if cache and #req.groups > 0 then ticket = cache:sent("acquire", req.keys) end
  local reply, err = self.engine:call(send, "acquire", req.groups, { req.key, req.head })
  local lease
  if reply ~= nil then lease, err = decision_mod.lease(reply, req, false) end
  if lease == nil then
    if ticket then cache:failed(ticket) end
    return nil, err
  end
  if ticket then cache:answered(ticket, lease.acquired, lease.retry_after_ms, lease.decisions) end
  return lease
end

local function plan_lease_op(self, send, req)
  local reply, err = self.engine:call(send, req.op, {}, { req.key, req.head })
  if reply == nil then return nil, err end
  if req.op == "inflight" then return decision_mod.count(reply) end
  return decision_mod.pair(reply, req.op == "renew" and "TB.RENEW" or "TB.RELEASE")
end

local function plan_detect(self, send, req)
  local reply, err = self.engine:call(send, "peek", { req.group })
  if reply == nil then return nil, err end
  return self.engine.backend or ""
end

local function plan_reset(self, send, req)
  local cache, ticket = self.cache
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

-- ---- the calls ------------------------------------------------------------------

local function checked(f, ...)
  local ok, a, b = pcall(f, ...)
  if not ok then return nil, a end
  return a, b
end

local function one(self, op, key, bucket, amount, opts)
  local timeout, on_error = options(self, opts)
  key = bucket_mod.check_key(key)
  local b = bucket_mod.bucket(bucket)
  if amount == nil then amount = 1 end
  local value = op == "adjust" and bucket_mod.check_delta(amount) or bucket_mod.check_cost(amount, b)
  local req = { op = op, group = { key, b, value }, names = b.name or "", what = op .. " " .. key }
  local j = job(plan_one, ONE, req, timeout, on_error)
  local cache = self.cache
  if cache and op ~= "adjust" then
    local hit = cache:lookup({ key }, { b }, { value })
    if hit then j.done = hit.decisions[1] end
  end
  return j
end

-- Charges `cost` (default 1) if the bucket holds it (TB.CONSUME).
function Limiter:consume(key, bucket, cost, opts)
  local j, err = checked(one, self, "consume", key, bucket, cost, opts)
  if j == nil then return nil, err end
  return run(self, j)
end

-- What consume would answer, without charging (TB.PEEK).
function Limiter:peek(key, bucket, cost, opts)
  local j, err = checked(one, self, "peek", key, bucket, cost, opts)
  if j == nil then return nil, err end
  return run(self, j)
end

-- Refunds (delta > 0) or charges without asking (delta < 0, down to a debt
-- of -max) (TB.ADJUST).
function Limiter:adjust(key, bucket, delta, opts)
  local j, err = checked(one, self, "adjust", key, bucket, delta, opts)
  if j == nil then return nil, err end
  return run(self, j)
end

local function many(self, groups, opts)
  local timeout, on_error = options(self, opts)
  if type(groups) == "table" and #groups == 0 then
    error({ usage = "consume_many needs at least one {key, bucket, cost}" }, 0)
  end
  local checked_groups = check_groups(groups)
  local keys = {}
  for i = 1, #checked_groups do keys[i] = checked_groups[i][1] end
  local atomic = opts and opts.atomic
  local split = spans_slots(self, keys)
  if split and atomic then
    error({ usage = "atomic consume_many needs every key in one Cluster hash slot: put the shared part in a "
      .. "hash tag ({...})", cross_slot = true }, 0)
  end
  local each = split or atomic == false
  local req = { op = "mconsume", event_op = "consume_many", groups = checked_groups, keys = keys, each = each,
    names = names_of(checked_groups), what = "consume_many " .. table.concat(keys, ", ") }
  local j = job(plan_many, MANY, req, timeout, on_error)
  local cache = self.cache
  if cache then
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

-- Charges every {key, bucket, cost} or none (TB.MCONSUME). With keys in
-- several Cluster slots (slot_of given), bucket by bucket with refunds
-- unless opts.atomic (then a usage error); opts.atomic == false always
-- goes bucket by bucket.
function Limiter:consume_many(groups, opts)
  local j, err = checked(many, self, groups, opts)
  if j == nil then return nil, err end
  return run(self, j)
end

local function acquire(self, key, concurrency, opts)
  opts = opts or {}
  local timeout, on_error = options(self, opts)
  key = bucket_mod.check_key(key)
  local c = bucket_mod.concurrency(concurrency)
  local id = opts.id
  if id == nil then id = self.new_id() end
  bucket_mod.check_id(id)
  local weight = c:check_weight(opts.weight or 1)
  local groups = check_groups(opts.buckets or {}, key)
  local keys = {}
  for i = 1, #groups do keys[i] = groups[i][1] end
  if #groups > 0 then
    local all = { key }
    for i = 1, #keys do all[i + 1] = keys[i] end
    if spans_slots(self, all) then
      error({ usage = "acquire needs the lease key and its buckets in one Cluster hash slot: put the shared "
        .. "part in a hash tag ({...})", cross_slot = true }, 0)
    end
  end
  local head = { tostring(c.limit), tostring(c.lease_ms), id, tostring(weight) }
  local req = { op = "acquire", key = key, concurrency = c, id = id, weight = weight, groups = groups, keys = keys,
    head = head, names = names_of(groups, c.name or ""), what = "acquire " .. key }
  return job(plan_acquire, LEASE, req, timeout, on_error)
end

-- Takes a slot of `concurrency` on `key` (TB.ACQUIRE), with opts.buckets
-- ({key, bucket, cost} ...) charged in the same call, all or nothing;
-- opts.weight (default 1), opts.id (default: a new random id).
function Limiter:acquire(key, concurrency, opts)
  local j, err = checked(acquire, self, key, concurrency, opts)
  if j == nil then return nil, err end
  return run(self, j)
end

local function unhold(self, lease)
  local ident = lease.key .. "\0" .. lease.id
  if self.held[ident] then
    self.held[ident] = nil
    self.n_held = self.n_held - 1
  end
end

-- Renewing or releasing a lease that holds no slot in Redis: a denied one
-- (nothing to do), one admitted by on_error "open" (no slot anywhere:
-- renewing keeps it, releasing ends it), or one of the worker's own
-- (on_error "local"), which answers for it.
local function off_redis(self, op, lease, head)
  if not lease.acquired then return false end
  if lease.held == "local" then
    local reply, err = local_buckets(self):run_lease(op, lease.key, head, {})
    if reply == nil then return nil, err end
    if op == "renew" then
      if reply[1] == 1 then
        lease.expires_in_ms = reply[2]
        return true
      end
      lease.lost = true
      unhold(self, lease)
      return false
    end
    lease.released = true
    return reply[1] == 1
  end
  if op == "renew" then
    -- Released since: the renewal finds it gone, as one in Redis would.
    if lease.released then lease.lost = true end
    return not lease.released
  end
  local released = not lease.released
  lease.released = true
  return released
end

local function lease_job(self, op, lease, opts)
  local timeout = options(self, opts)
  local head
  if op == "renew" then head = { lease.id, tostring(lease.concurrency.lease_ms) } else head = { lease.id } end
  local req = { op = op, key = lease.key, head = head, what = op .. " " .. lease.key }
  local j = job(plan_lease_op, NONE, req, timeout, "raise")
  j.upkeep = true
  return j, head
end

-- Extends a lease to its lease_ms from now (TB.RENEW): true, or false (and
-- lease.lost) when it expired or was released. Sent even while the
-- breaker is open, never counted for it. Redis errors are returned: no
-- policy answers for an upkeep call.
function Limiter:renew(lease, opts)
  local j, head = lease_job(self, "renew", lease, opts)
  if lease.held ~= "redis" or not lease.acquired then return off_redis(self, "renew", lease, head) end
  local reply, err = run(self, j)
  if reply == nil then return nil, err end
  if reply[1] == 1 then
    lease.expires_in_ms = reply[2]
    return true
  end
  lease.lost = true -- expired, or released by another: no longer held
  unhold(self, lease)
  return false
end

-- Gives a lease back (TB.RELEASE): whether it was live. Sent even while
-- the breaker is open, never counted for it. The worker holds it no more
-- whatever the answer: a release Redis can't take leaves the lease to
-- expire.
function Limiter:release(lease, opts)
  local j, head = lease_job(self, "release", lease, opts)
  if lease.acquired then unhold(self, lease) end
  if lease.held ~= "redis" or not lease.acquired then return off_redis(self, "release", lease, head) end
  local reply, err = run(self, j)
  if reply == nil then return nil, err end
  lease.released = true
  return reply[1] == 1
end

-- The live weight of a lease key (TB.INFLIGHT).
function Limiter:in_flight(key, opts)
  local ok, k = pcall(bucket_mod.check_key, key)
  if not ok then return nil, k end
  local req = { op = "inflight", key = k, head = {}, what = "in_flight " .. k }
  return run(self, job(plan_lease_op, NONE, req, (options(self, opts)), "raise"))
end

-- A read-only probe of the backend, for readiness checks: its name, or
-- nil and the error (a usage error, a Redis failure, or shed).
function Limiter:detect(opts)
  local probe = bucket_mod.bucket({ max = 1, rate = 1 })
  local req = { op = "peek", group = { _M.PROBE_KEY, probe, 1 }, what = "detect" }
  return run(self, job(plan_detect, NONE, req, (options(self, opts)), "raise"))
end

-- Deletes a bucket's key: it is full again. Whether there was one.
function Limiter:reset(key, opts)
  local ok, k = pcall(bucket_mod.check_key, key)
  if not ok then return nil, k end
  return run(self, job(plan_reset, NONE, { op = "reset", key = k, what = "reset " .. k },
    (options(self, opts)), "raise"))
end

return _M
