-- The OpenResty runner of clients/spec: every scenario of the behaviour
-- the clients share (clients/spec/README.md), under plain LuaJIT: a fake
-- clock, and a `send` that answers each command with the scenario's
-- scripted reply (a held reply yields the call's coroutine, as a cosocket
-- would). Scenarios for other clients only are left out, and counted.

local cjson = require "cjson.safe"
local h = require "helpers"
local breaker_mod = require "resty.tokenbucket.breaker"
local bucket_mod = require "resty.tokenbucket.bucket"
local cache_mod = require "resty.tokenbucket.cache"
local decision_mod = require "resty.tokenbucket.decision"
local classify = require("resty.tokenbucket.classify").classify
local library = require "resty.tokenbucket.library"
local limiter_mod = require "resty.tokenbucket.limiter"
local memdict = require "resty.tokenbucket.memdict"

local NULL = cjson.null
local CLIENT = "openresty"
local START_MS = 1000000
local SPEC = os.getenv("TB_SPEC") or "../spec"

local T = {}

-- ---- the fake clock: integer ms, read in seconds -------------------------------------

local function new_clock()
  local c = { ms = START_MS }
  setmetatable(c, { __call = function(self) return self.ms / 1000 end })
  return c
end

local function fail(where, text)
  error(where .. ": " .. text, 0)
end

-- Fields compared as the spec names them (the Lua answers use the same names).
local FIELDS = {
  allowed = true, remaining = true, retry_after_ms = true, reset_after_ms = true, degraded = true, shed = true,
  cached = true, acquired = true, in_use = true, expires_in_ms = true, held = true, lost = true, delay_ms = true,
  shadow = true, rule = true,
}

-- The event's fields, as the spec names them (the same words but latency).
local EVENT_FIELDS = {
  op = true, policy = true, allowed = true, degraded = true, shed = true, cached = true, backend = true,
  outcome = true, rule = true,
}

-- Compares the one event a call reported with the step's `event`, and
-- forgets the events.
local function check_event(events, step, where)
  local got = {}
  for i = 1, #events do got[i] = events[i]; events[i] = nil end
  if step.event == nil then return end
  h.eq(#got, 1, where .. ": events")
  for name, value in pairs(step.event) do
    if not EVENT_FIELDS[name] then fail(where, "the runner knows no event field " .. name) end
    h.eq(got[1][name], value, where .. ": event " .. name)
  end
end

local function expect_fields(got, want, where)
  if got == nil then fail(where, "no answer") end
  for name, value in pairs(want) do
    if name == "decisions" then
      for i, d in ipairs(value) do expect_fields(got.decisions[i], d, where .. ": decision " .. i) end
    else
      if not FIELDS[name] then fail(where, "the runner knows no field " .. name) end
      local v = got[name]
      -- The Lua answers are tables: a decision's rule is decision.rule's.
      if name == "rule" then v = decision_mod.rule(got) end
      if v == nil and (name == "degraded" or name == "shed" or name == "cached" or name == "lost" or name == "shadow") then
        v = false
      end
      h.eq(v, value, where .. ": " .. name)
    end
  end
end

-- ---- errors, as the cosocket and the module make them ----------------------------------

-- The error table the transport or the engine makes for `e`; nil if it is
-- another client's form (redis-py's, ioredis's, node-redis's, Node's).
local function error_of(e)
  if e.reply ~= nil then return { reply = e.reply } end
  if e.errno ~= nil then return { socket = e.message:lower(), op = e.syscall == "connect" and "connect" or "command" } end
  if e.timeout == "after_write" then return { socket = "timeout", op = "command" } end
  if e.package == "circuit_open" then return { circuit_open = true, message = "the breaker is open" } end
  if e.package == "shed" then return { shed = "too busy" } end
  if e.package == "no_backend" then return { usage = "no rate-limit backend answered (module: ...)", no_backend = true } end
  if e.package == "wrong_shape" then return { shape = "Redis answered TB.CONSUME with the text \"OK\"" } end
  if e.library == "lua-resty-redis" then return { socket = e.socket, op = e.op, answering = e.answering } end
  if e.package ~= nil then error("the runner can't make " .. cjson.encode(e)) end
  return nil
end

local function run_classify(s)
  local ran, others = 0, 0
  for i, c in ipairs(s.cases) do
    local err = error_of(c.error)
    if err ~= nil then
      ran = ran + 1
      h.eq(classify(err), c.kind, "case " .. i .. " " .. cjson.encode(c.error))
    elseif c.error.library ~= nil then
      others = others + 1 -- another Redis library's words
    end
  end
  h.eq(ran + others, #s.cases, "every case made or another library's")
end

-- ---- the breaker -------------------------------------------------------------------------

local ENTER = { call = breaker_mod.CALL, probe = breaker_mod.PROBE, skip = breaker_mod.SKIP }

local function run_breaker(s)
  local clock = new_clock()
  local b = s.breaker
  local breaker = breaker_mod.new({ dict = memdict.new(clock), clock = clock, failures = b.failures,
    window = b.window_ms / 1000, cooldown = b.cooldown_ms / 1000 })
  for i, step in ipairs(s.steps) do
    local where = "step " .. i
    if step.advance_ms then clock.ms = clock.ms + step.advance_ms
    elseif step.state then h.eq(breaker:state(), step.state, where)
    elseif step.enter then h.eq(breaker:enter(), ENTER[step.enter], where .. ": enter")
    elseif step.report then breaker[step.report](breaker, step.probe == true)
    else fail(where, "unknown step " .. cjson.encode(step)) end
  end
end

-- ---- the denial cache ----------------------------------------------------------------------

local function bucket_of(b)
  return bucket_mod.bucket({ max = b.max, rate = b.rate, name = b.name })
end

local function decision_of(d, key)
  return { allowed = d.allowed, remaining = d.remaining, retry_after_ms = d.retry_after_ms,
    reset_after_ms = d.reset_after_ms, key = key, bucket = bucket_of(d.bucket), cost = d.cost,
    degraded = false, cached = false, shed = false }
end

local function run_cache(s)
  local clock = new_clock()
  local cache = cache_mod.new(s.entries, clock)
  local tickets = {}
  for i, step in ipairs(s.steps) do
    local where = "step " .. i
    if step.advance_ms then clock.ms = clock.ms + step.advance_ms
    elseif step.sent then tickets[step.as] = cache:sent(step.sent, step.keys)
    elseif step.answered then
      local ticket = tickets[step.answered]
      local decisions = {}
      for j, d in ipairs(step.decisions) do decisions[j] = decision_of(d, ticket.keys[j]) end
      cache:answered(ticket, step.allowed, step.retry_after_ms, decisions)
    elseif step.failed then cache:failed(tickets[step.failed])
    elseif step.size then h.eq(cache:len(), step.size, where .. ": size")
    elseif step.lookup then
      local l = step.lookup
      local buckets = {}
      for j, b in ipairs(l.buckets) do buckets[j] = bucket_of(b) end
      local hit = cache:lookup(l.keys, buckets, l.costs)
      if step.expect == NULL then h.eq(hit, nil, where .. ": a miss")
      else
        h.ok(hit ~= nil, where .. ": a hit")
        expect_fields(hit, step.expect, where)
      end
    else fail(where, "unknown step " .. cjson.encode(step)) end
  end
end

-- ---- limiter scenarios: a send that answers from the script ----------------------------

-- The words after a one-key call's key that tell it apart (ARGV from
-- w[from]): a reservation's WAIT ms, a quota's period and OFFSET m.
local function single(op, w, from)
  if op == "consume" or op == "peek" or op == "adjust" then return { unpack(w, from + 3) } end
  if op == "quota" or op == "qpeek" or op == "qadjust" then return { w[from + 1], unpack(w, from + 3) } end
  return {}
end

-- A command as the spec names it (README.md, "Commands").
local function command_text(args)
  local w = {}
  for i = 1, #args do w[i] = tostring(args[i]) end
  local name = w[1]:upper()
  if name == "TB.CONSUME" or name == "TB.PEEK" or name == "TB.ADJUST" or name == "TB.INFLIGHT" then
    return table.concat({ name, w[2], unpack(w, 6) }, " ") -- and WAIT ms
  elseif name == "TB.QUOTA" or name == "TB.QPEEK" or name == "TB.QADJUST" then
    return table.concat({ name, w[2], w[4], unpack(w, 6) }, " ") -- the period, and OFFSET m
  elseif name == "TB.MCONSUME" then
    local out = { name }
    for i = 2, #w, 4 do out[#out + 1] = w[i] end
    return table.concat(out, " ")
  elseif name == "TB.CHARGE" then
    local n = tonumber(w[2])
    local out = { name, unpack(w, 3, 2 + n) }
    if w[3 + n] == "WAIT" then out[#out + 1] = "WAIT"; out[#out + 1] = w[4 + n] end
    return table.concat(out, " ")
  elseif name == "TB.ACQUIRE" then return name .. " " .. w[2] .. " " .. w[5]
  elseif name == "TB.RELEASE" or name == "TB.RENEW" then return name .. " " .. w[2] .. " " .. w[3]
  elseif name == "FCALL" or name == "FCALL_RO" then
    if tonumber(w[3]) > 0 then
      return table.concat({ name, w[2], w[4], unpack(single((w[2]:gsub("^tb_", "")), w, 5)) }, " ")
    end
    return name .. " " .. w[2]
  elseif name == "EVALSHA" or name == "EVAL" then
    local n = tonumber(w[3])
    local tail = n == 1 and single(w[4 + n], w, 5 + n) or {}
    return table.concat({ name, w[4 + n], w[4], unpack(tail) }, " ")
  elseif name == "FUNCTION" then return "FUNCTION " .. w[2]:upper()
  end
  w[1] = name
  return table.concat(w, " ")
end

local function words(text)
  local out = {}
  for word in text:gmatch("%S+") do out[#out + 1] = word end
  return out
end

-- Whether an expected command (words, `$x` capturing one) names `text`.
local function matches(expected, text, vars, bind)
  local want, got, bound = words(expected), words(text), {}
  if #want > #got then return false end
  for i, word in ipairs(want) do
    if word:sub(1, 1) == "$" then
      local known = vars[word] or bound[word]
      if known == nil then bound[word] = got[i] elseif known ~= got[i] then return false end
    elseif word ~= got[i] then return false end
  end
  if bind then for k, v in pairs(bound) do vars[k] = v end end
  return true
end

local function copy(v)
  if v == "$LIBRARY_VERSION" then return library.version end
  if type(v) ~= "table" then return v end
  local out = {}
  for i, x in ipairs(v) do out[i] = copy(x) end
  return out
end

local function new_redis()
  local r = { vars = {}, active = {}, unexpected = {}, sent = {} }

  function r.take(text)
    for _, step in ipairs(r.active) do
      local candidates = {}
      if step.burst then
        for _, e in ipairs(step.entries) do if e["repeat"] or e.used == 0 then candidates[#candidates + 1] = e end end
      else
        for _, e in ipairs(step.entries) do
          if not e["repeat"] and e.used == 0 then candidates[#candidates + 1] = e; break end
        end
        for _, e in ipairs(step.entries) do if e["repeat"] then candidates[#candidates + 1] = e end end
      end
      for _, e in ipairs(candidates) do
        if matches(e.command, text, r.vars, false) then
          matches(e.command, text, r.vars, true)
          e.used = e.used + 1
          return e, step
        end
      end
    end
  end

  function r.send(args)
    local text = command_text(args)
    r.sent[#r.sent + 1] = text
    local e, step = r.take(text)
    if e == nil then
      r.unexpected[#r.unexpected + 1] = text
      return nil, { usage = "the scenario expects no " .. text }
    end
    if e.hold then
      step.held[#step.held + 1] = coroutine.running()
      coroutine.yield()
    end
    if e.reply ~= nil then return copy(e.reply) end
    if e.error ~= nil then return nil, { reply = e.error } end
    local err = error_of(e.fail)
    if err == nil then error("the openresty runner can't make " .. cjson.encode(e.fail)) end
    return nil, err
  end

  function r.begin(step, burst)
    local entries = {}
    for i, e in ipairs(step.redis or {}) do
      local c = {}
      for k, v in pairs(e) do c[k] = v end
      c.used = 0
      entries[i] = c
    end
    local active = { entries = entries, held = {}, burst = burst }
    table.insert(r.active, 1, active)
    return active
  end

  function r.finish(active, where)
    for i, a in ipairs(r.active) do if a == active then table.remove(r.active, i); break end end
    local left = {}
    for _, e in ipairs(active.entries) do
      if not e["repeat"] and e.used == 0 then left[#left + 1] = e.command end
    end
    h.eq(left, {}, where .. ": scripted commands never sent")
    h.eq(r.unexpected, {}, where .. ": commands the scenario does not expect")
  end

  return r
end

local LIMITER_OPTIONS = {
  backend = true, on_error = true, timeout_ms = true, denial_cache = true, breaker = true, wait_replicas = true,
  wait_timeout_ms = true, shadow = true, near_limit_ratio = true,
}

local function limiter_of(s, redis, clock, events)
  local o = s.limiter or {}
  for name in pairs(o) do
    if not LIMITER_OPTIONS[name] then error("the runner knows no limiter option " .. name, 0) end
  end
  local b = o.breaker
  local breaker
  if b == false then breaker = false
  elseif b ~= nil then breaker = { failures = b.failures, window = b.window_ms / 1000, cooldown = b.cooldown_ms / 1000 }
  end
  local n = 0
  return limiter_mod.new({
    send = redis.send,
    clock = clock,
    wallclock = function() return 1764513600 + clock() end,
    on_error = o.on_error,
    timeout_ms = o.timeout_ms or 100,
    denial_cache = o.denial_cache,
    breaker = breaker,
    backend = o.backend,
    shadow = o.shadow,
    near_limit_ratio = o.near_limit_ratio,
    on_decision = function(event) events[#events + 1] = event end,
    log = function() end,
    new_id = function() n = n + 1; return "made-" .. n end,
    library = library,
    -- delay()'s sleep, faked: it moves the clock, and a call's total is its slept_ms.
    sleep = function(seconds)
      local ms = math.floor(seconds * 1000 + 0.5)
      clock.ms = clock.ms + ms
      clock.slept = (clock.slept or 0) + ms
    end,
  })
end

-- The step's bucket, or its quota: built by the limiter's own checks, so
-- that a rule it refuses is the call's usage error.
local function rule_of(step)
  if step.quota then
    local q = step.quota
    return { limit = q.limit, period = q.period, offset = q.offset, name = q.name }
  end
  return bucket_of(step.bucket)
end

-- A group's rule: a bucket, or a quota (it has a period), left for the
-- limiter to check.
local function group_of(g)
  if g[2].period ~= nil then
    return { g[1], { limit = g[2].limit, period = g[2].period, offset = g[2].offset, name = g[2].name }, g[3] }
  end
  return { g[1], bucket_of(g[2]), g[3] }
end

-- The call a step makes: its answer, or nil and the error.
local function invoke(lim, step, leases)
  local op = step.call
  if step.shadow ~= nil and op ~= "consume" and op ~= "consume_many" then
    error("shadow is a consume's or a consume_many's, not " .. tostring(op) .. "'s", 0)
  end
  if step.block_ms ~= nil and op ~= "consume" then error("block_ms is a consume's, not " .. tostring(op) .. "'s", 0) end
  local opts = (step.on_error or step.max_wait_ms or step.shadow ~= nil or step.block_ms)
    and { on_error = step.on_error, max_wait_ms = step.max_wait_ms, shadow = step.shadow, block_ms = step.block_ms }
    or nil
  if op == "consume" or op == "peek" then return lim[op](lim, step.key, rule_of(step), step.cost or 1, opts)
  elseif op == "wait" then return lim:delay(step.key, rule_of(step), step.cost or 1, opts)
  elseif op == "adjust" then return lim:adjust(step.key, rule_of(step), step.delta, opts)
  elseif op == "consume_many" then
    local groups = {}
    for i, g in ipairs(step.groups) do groups[i] = group_of(g) end
    return lim:consume_many(groups, opts)
  elseif op == "acquire" then
    local c = step.concurrency
    local buckets = {}
    for i, g in ipairs(step.buckets or {}) do buckets[i] = group_of(g) end
    return lim:acquire(step.key, { limit = c.limit, lease_ms = c.lease_ms, name = c.name },
      { weight = step.weight, id = step.id, buckets = buckets, on_error = step.on_error })
  elseif op == "renew" or op == "release" then return lim[op](lim, leases[step.lease])
  elseif op == "in_flight" then return lim:in_flight(step.key)
  elseif op == "reset" then return lim:reset(step.key)
  elseif op == "detect" then return lim:detect()
  end
  error("unknown call " .. tostring(op))
end

-- Starts a call in a coroutine: it runs until done or waiting for a held reply.
local function start(lim, step, leases)
  local run = {}
  run.co = coroutine.create(function() run.value, run.err = invoke(lim, step, leases); run.done = true end)
  local ok, err = coroutine.resume(run.co)
  if not ok then error(err, 0) end
  return run
end

local function resume_held(active)
  local held = active.held
  active.held = {}
  for _, co in ipairs(held) do
    local ok, err = coroutine.resume(co)
    if not ok then error(err, 0) end
  end
end

local function kind_of(err)
  if type(err) == "table" and err.circuit_open then return "circuit_open" end
  return classify(err)
end

local function with(t, k, v)
  local c = {}
  for a, b in pairs(t) do c[a] = b end
  c[k] = v
  return c
end

local function judge(run, step, want, leases, where, slept)
  want = want or {}
  if not run.done then fail(where, "the call never finished (a held reply never released?)") end
  if want.slept_ms ~= nil then
    h.eq(slept or 0, want.slept_ms, where .. ": slept_ms")
    want = with(want, "slept_ms", nil)
  end
  if want.raises then
    if run.value ~= nil then fail(where, "expected it to raise (" .. want.raises .. "), got " .. h.show(run.value)) end
    h.eq(kind_of(run.err), want.raises, where .. ": raised " .. h.show(run.err))
    return
  end
  if run.value == nil then fail(where, "raised " .. h.show(run.err)) end
  if step.as then leases[step.as] = run.value end
  local fields = {}
  for k, v in pairs(want) do if k ~= "result" then fields[k] = v end end
  if want.result ~= nil then h.eq(run.value, want.result, where .. ": result")
  else expect_fields(run.value, fields, where) end
end

local function check_state(lim, check, where)
  for name, value in pairs(check) do
    if value == NULL then value = nil end
    local got
    if name == "breaker" then got = lim:breaker_state()
    elseif name == "backend" then got = lim:backend()
    elseif name == "leases_held" then got = lim:leases_held()
    elseif name == "cache_size" then got = lim.cache:len()
    else fail(where, "the runner knows no state " .. name) end
    h.eq(got, value, where .. ": " .. name)
  end
end

local function run_limiter(s)
  local clock = new_clock()
  local redis = new_redis()
  local events = {}
  local lim = limiter_of(s, redis, clock, events)
  local leases, started = {}, {}
  for i, step in ipairs(s.steps) do
    local where = "step " .. i
    if step.advance_ms then clock.ms = clock.ms + step.advance_ms
    elseif step.check then check_state(lim, step.check, where)
    elseif step.inspect then expect_fields(leases[step.inspect], step.expect, where)
    elseif step.call then
      local active = redis.begin(step)
      clock.slept = 0
      local run = start(lim, step, leases)
      redis.finish(active, where)
      judge(run, step, step.expect, leases, where, clock.slept)
      check_event(events, step, where)
    elseif step.start then
      if step.event ~= nil then fail(where, "a started call's event is not compared") end
      local call = with(step, "call", step.start)
      local active = redis.begin(call)
      started[step.as] = { active = active, call = call, run = start(lim, call, leases) }
    elseif step.resume then
      local s0 = started[step.resume]
      resume_held(s0.active)
      redis.finish(s0.active, where)
      judge(s0.run, s0.call, step.expect, leases, where)
      check_event(events, {}, where)
    elseif step.burst then
      local active = redis.begin(step, true)
      local before = #redis.sent
      local runs = {}
      for j, call in ipairs(step.burst) do runs[j] = start(lim, call, leases) end
      while #active.held > 0 do resume_held(active) end
      redis.finish(active, where)
      for j, run in ipairs(runs) do
        if step.burst[j].event ~= nil then fail(where, "a burst's events are not compared") end
        judge(run, step.burst[j], step.expect_each, leases, where .. ", call " .. j)
      end
      check_event(events, {}, where)
      for command, n in pairs(step.counts or {}) do
        local count = 0
        for k = before + 1, #redis.sent do
          if matches(command, redis.sent[k], {}, false) then count = count + 1 end
        end
        h.eq(count, n, where .. ": " .. command .. " sent")
      end
    else fail(where, "unknown step " .. cjson.encode(step)) end
  end
end

-- ---- the scenarios, one test each ------------------------------------------------------

-- ---- limit strings --------------------------------------------------------------------

local LIMIT_CASE_FIELDS = { parse = true, parse_many = true, bucket = true, buckets = true, error = true, why = true,
  clients = true }

local function run_limit_strings(s)
  local ran = 0
  for i, c in ipairs(s.cases) do
    for k in pairs(c) do
      if not LIMIT_CASE_FIELDS[k] then error("the openresty runner can't read " .. k .. " in case " .. i) end
    end
    local applies = c.clients == nil
    for _, name in ipairs(c.clients or {}) do if name == CLIENT then applies = true end end
    if applies then
      ran = ran + 1
      local many = c.parse_many ~= nil
      local text = many and c.parse_many or c.parse
      local where = "case " .. i .. " " .. cjson.encode(text)
      local ok, res = pcall(many and bucket_mod.parse_many or bucket_mod.parse, text)
      if c.error ~= nil then
        h.ok(not ok, where .. ": expected an error")
        h.eq({ field = res.field, message = res.message }, c.error, where)
      else
        h.ok(ok, where .. ": " .. tostring(res))
        local list = many and res or { res }
        local got = {}
        -- Exact doubles: every client computes N / (k * unit seconds) alike.
        for j, b in ipairs(list) do got[j] = { max = b.max, rate = b.rate } end
        h.eq(got, many and c.buckets or { c.bucket }, where)
      end
    end
  end
  h.ok(ran > 0, "no case ran")
end

local RUN = { classify = run_classify, breaker = run_breaker, cache = run_cache, limiter = run_limiter,
  limit_strings = run_limit_strings }

local listing = io.popen("ls " .. SPEC .. "/*.json")
local files = {}
for path in listing:lines() do files[#files + 1] = path end
listing:close()
assert(#files > 0, "no scenarios in " .. SPEC)

local skipped = 0
for _, path in ipairs(files) do
  local f = assert(io.open(path))
  local spec = assert(cjson.decode(f:read("*a")), path .. ": not JSON")
  f:close()
  local area = path:match("([^/]+)%.json$")
  for _, s in ipairs(spec.scenarios) do
    local applies = s.clients == nil
    for _, c in ipairs(s.clients or {}) do if c == CLIENT then applies = true end end
    local run = RUN[s.subject]
    if run == nil then error(path .. ": " .. s.name .. ": unknown subject " .. tostring(s.subject)) end
    if applies then
      T[area .. ": " .. s.name] = function() run(s) end
    else
      skipped = skipped + 1
    end
  end
end
io.write("clients/spec: ", skipped, " scenarios for other clients only, left out\n")

return T
