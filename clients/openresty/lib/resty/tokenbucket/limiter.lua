-- The limiter: its options and state, and the public calls, each made a
-- job (requests.lua: the checks, the commands, the denial cache), run
-- under the failure policy (policy.lua: the breaker, shedding, the
-- answers without Redis) on the backend the engine finds (engine.lua),
-- its leases counted and their upkeep off Redis answered, and reported to
-- the on_decision hook. The Python package's twin is _limiter.py (with
-- _sync.py and asyncio.py driving its plans), the Node package's
-- limiter.ts.
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
local contract = require "resty.tokenbucket.contract"
local engine_mod = require "resty.tokenbucket.engine"
local logonce = require "resty.tokenbucket.logonce"
local memdict = require "resty.tokenbucket.memdict"
local decision_mod = require "resty.tokenbucket.decision"
local policy = require "resty.tokenbucket.policy"
local penalty = require "resty.tokenbucket.penalty"
local requests = require "resty.tokenbucket.requests"

local type, pairs, pcall, setmetatable, tostring = type, pairs, pcall, setmetatable, tostring
local check_on_error, check_timeout = requests.check_on_error, requests.check_timeout

local _M = {}

-- The budget for Redis to answer a command, from when it is written (ms).
_M.DEFAULT_TIMEOUT_MS = 100
-- While the backend is unknown a call may load the Lua library, which
-- Redis compiles: such calls get at least this budget (ms).
_M.DETECT_TIMEOUT_MS = 1000
-- What a shed decision tells the client to wait (HTTP Retry-After: 1).
_M.SHED_RETRY_MS = policy.SHED_RETRY_MS
-- envoyproxy/ratelimit's NEAR_LIMIT_RATIO default: an admission that
-- leaves this share of a budget used is "near_limit" in the events.
_M.DEFAULT_NEAR_LIMIT_RATIO = 0.8
-- The key detect() peeks at, under `rl:` like the usual buckets.
_M.PROBE_KEY = "rl:probe"

local Limiter = {}
Limiter.__index = Limiter

local function default_new_id()
  -- 128 random bits, as a UUID's hex; /dev/urandom so that workers forked
  -- from one master never draw the same ids.
  local f = io.open("/dev/urandom", "rb")
  local raw = f and f:read(16)
  if f then f:close() end
  if not raw or #raw ~= 16 then error({ usage = "no /dev/urandom for lease ids: pass new_id" }, 0) end
  return (raw:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- The generated Lua library, or an error that says how to make it (the
-- module's search paths alone don't).
local function generated_library()
  local ok, library = pcall(require, "resty.tokenbucket.library")
  if ok then return library end
  error("resty.tokenbucket: no resty/tokenbucket/library.lua (the Lua library, generated from lua/tb.lua): "
    .. "run `make` in the repository, or `make install`, which writes it", 3)
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
    shadow = opts.shadow or false,
    near_limit_ratio = opts.near_limit_ratio or _M.DEFAULT_NEAR_LIMIT_RATIO,
    -- What delay() sleeps with (seconds): ngx.sleep in nginx.
    sleep = opts.sleep or (ngx and ngx.sleep),
    library = opts.library or generated_library(),
    held = {},
    n_held = 0,
  }, Limiter)
  if type(self.processes) ~= "number" or self.processes < 1 or self.processes % 1 ~= 0 then
    error("processes must be an integer >= 1", 2)
  end
  if type(self.shadow) ~= "boolean" then
    error("shadow must be true or false, got " .. tostring(self.shadow), 2)
  end
  local ratio = self.near_limit_ratio
  if type(ratio) ~= "number" or not (ratio > 0 and ratio <= 1) then
    error("near_limit_ratio must be a number in (0, 1], got " .. tostring(ratio), 2)
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

-- ---- running a call -------------------------------------------------------------

-- A bucket's denial as shadow mode answers it: admitted, marked shadow, no
-- wait (a copy: a cached answer may be shared). A denial nothing counted
-- (shed, or the failure policy's "closed") stands: on_error decides those,
-- not the limit.
local function let_through(self, d)
  if d.allowed or d.shed or (d.degraded and d.retry_after_ms == 0) then return d end
  local c = {}
  for k, v in pairs(d) do c[k] = v end
  c.allowed, c.retry_after_ms, c.delay_ms, c.shadow = true, 0, 0, true
  self.logonce:report("shadow", 60, "info", "rate limiter: shadow mode let through a request "
    .. tostring(decision_mod.rule(d) or "a rule") .. " would deny")
  return c
end

-- The event's outcome (envoyproxy/ratelimit's names for its stats) and the
-- name of the rule that decided ("" if unnamed).
local function judged(self, req, d)
  local decisions, rule, allowed = d.decisions, nil, d.allowed
  local used = {}
  if req.op == "acquire" then
    allowed = d.acquired
    -- A bucket decided only when it denied and a slot was free.
    if d.acquired or decision_mod.busy(d) or #decision_mod.denied_by(d) == 0 then rule = d.concurrency.name or "" end
    used[1] = { d.in_use, d.concurrency.limit }
  elseif decisions == nil then
    decisions = { d }
  end
  if rule == nil and #decisions > 0 then rule = decision_mod.tightest(decisions).bucket.name end
  rule = rule or ""
  if d.shadow then return "shadow_mode", rule end
  if not allowed then return "over_limit", rule end
  if d.degraded then return "within_limit", rule end
  for i = 1, #decisions do
    local b = decisions[i].bucket
    used[#used + 1] = { b.max - decisions[i].remaining, b.max }
  end
  for i = 1, #used do
    if used[i][1] >= self.near_limit_ratio * used[i][2] then return "near_limit", rule end
  end
  return "within_limit", rule
end

-- Counts a lease an acquire took as held, lets a shadow call's denial
-- through, and reports a decision to the on_decision hook (never raising
-- into the call).
local function settled(self, job, result, started, shadow)
  local req = job.req
  if req.op == "acquire" and result and result.acquired then
    local ident = req.key .. "\0" .. req.id
    if not self.held[ident] then
      self.held[ident] = true
      self.n_held = self.n_held + 1
    end
  end
  if shadow == nil then shadow = self.shadow end
  -- Only a charge is shadowed: peek, adjust and leases let nothing through.
  if shadow and result ~= nil and (req.op == "consume" or req.op == "mconsume") then
    result = let_through(self, result)
  end
  local hook = self.on_decision
  if hook == nil or result == nil or req.names == nil then return result end
  local allowed
  if req.op == "acquire" then allowed = result.acquired else allowed = result.allowed end
  local outcome, rule = judged(self, req, result)
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
    outcome = outcome,
    rule = rule,
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

local function run(self, job, shadow)
  local started = self.clock()
  if job.done ~= nil then return settled(self, job, job.done, started, shadow) end
  local transport, limit = self.send, budget(self, job)
  local send = function(args, key) return transport(args, key, limit) end
  local answer, err = policy.run(self, job, send)
  if answer == nil then return nil, err end
  return settled(self, job, answer, started, shadow)
end

-- ---- the calls ------------------------------------------------------------------

local function checked(f, ...)
  local ok, a, b = pcall(f, ...)
  if not ok then return nil, a end
  return a, b
end

-- Charges `cost` (default 1) if the bucket holds it (TB.CONSUME).
-- opts.shadow (default: the limiter's shadow): a bucket's denial is
-- answered admitted, with shadow = true.
-- opts.block_ms (buckets only): a penalty, a denial charged into debt
-- (TB.ADJUST) so the caller is refused for block_ms (penalty.lua); at most
-- 1000 * (max + cost) / rate.
function Limiter:consume(key, bucket, cost, opts)
  local block_ms, bad = penalty.check(opts and opts.block_ms, bucket, cost)
  if bad ~= nil then return nil, bad end
  local j, err = checked(requests.one, self, "consume", key, bucket, cost, opts)
  if j == nil then return nil, err end
  local d, e = run(self, j, opts and opts.shadow)
  if d == nil or block_ms == nil then return d, e end
  local charge = penalty.charge(d, block_ms)
  if charge <= 0 then return d end
  -- Failing open: Redis's denial stands whatever becomes of its penalty.
  local adjusted = self:adjust(key, d.bucket, -charge, { on_error = "open" })
  return penalty.penalized(d, adjusted, block_ms)
end

-- What consume would answer, without charging (TB.PEEK).
function Limiter:peek(key, bucket, cost, opts)
  local j, err = checked(requests.one, self, "peek", key, bucket, cost, opts)
  if j == nil then return nil, err end
  return run(self, j)
end

-- Refunds (delta > 0) or charges without asking (delta < 0, down to a debt
-- of -max) (TB.ADJUST).
function Limiter:adjust(key, bucket, delta, opts)
  local j, err = checked(requests.one, self, "adjust", key, bucket, delta, opts)
  if j == nil then return nil, err end
  return run(self, j)
end

-- Reserves `cost` tokens within `opts.max_wait_ms` (consume with WAIT)
-- and waits the reservation's delay_ms, as limit_req's `delay`: the
-- decision, and the seconds still to wait (0 once slept). With
-- `opts.sleep == false` it does not sleep: the caller waits the seconds
-- returned, as lua-resty-limit-traffic's `incoming` leaves it to. A
-- denial returns at once (never a retry loop), and so does a degraded or
-- shed answer.
function Limiter:delay(key, bucket, cost, opts)
  if not (opts and opts.max_wait_ms ~= nil) then
    return nil, { usage = "delay needs opts.max_wait_ms: the longest wait a reservation may take" }
  end
  local d, err = self:consume(key, bucket, cost, opts)
  if d == nil then return nil, err end
  local wait = (d.allowed and not d.degraded and d.delay_ms or 0) / 1000
  if wait > 0 and opts.sleep ~= false then
    self.sleep(wait)
    wait = 0
  end
  return d, wait
end

-- Charges every {key, bucket, cost} or none (TB.MCONSUME). With keys in
-- several Cluster slots (slot_of given), bucket by bucket with refunds
-- unless opts.atomic (then a usage error); opts.atomic == false always
-- goes bucket by bucket.
function Limiter:consume_many(groups, opts)
  local j, err = checked(requests.many, self, groups, opts)
  if j == nil then return nil, err end
  return run(self, j, opts and opts.shadow)
end

-- Takes a slot of `concurrency` on `key` (TB.ACQUIRE), with opts.buckets
-- ({key, bucket, cost} ...) charged in the same call, all or nothing;
-- opts.weight (default 1), opts.id (default: a new random id).
function Limiter:acquire(key, concurrency, opts)
  local j, err = checked(requests.acquire, self, key, concurrency, opts)
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
    local reply, err = policy.local_buckets(self):run_lease(op, lease.key, head, {})
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

-- Extends a lease to its lease_ms from now (TB.RENEW): true, or false (and
-- lease.lost) when it expired or was released. Sent even while the
-- breaker is open, never counted for it. Redis errors are returned: no
-- policy answers for an upkeep call.
function Limiter:renew(lease, opts)
  local j, head = requests.upkeep(self, "renew", lease, opts)
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
  local j, head = requests.upkeep(self, "release", lease, opts)
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
  return run(self, requests.inflight(self, k, opts))
end

-- A read-only probe of the backend, for readiness checks: its name, or
-- nil and the error (a usage error, a Redis failure, or shed).
function Limiter:detect(opts)
  return run(self, requests.detect(self, _M.PROBE_KEY, opts))
end

-- Deletes a bucket's key: it is full again. Whether there was one.
function Limiter:reset(key, opts)
  local ok, k = pcall(bucket_mod.check_key, key)
  if not ok then return nil, k end
  return run(self, requests.reset(self, k, opts))
end

return _M
