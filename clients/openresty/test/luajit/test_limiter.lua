local h = require "helpers"
local limiter = require "resty.tokenbucket.limiter"
local bucket = require("resty.tokenbucket.bucket").bucket
local concurrency = require("resty.tokenbucket.bucket").concurrency

local T = {}
local USER = bucket({ max = 2, rate = 0.001, name = "user" })
local IP = bucket({ max = 100, rate = 1, name = "ip" })
local STREAMS = concurrency({ limit = 2, lease_ms = 30000, name = "streams" })

local REFUSED = { socket = "connection refused", op = "connect" }

local function make(opts)
  opts = opts or {}
  local clock = h.clock(10)
  local s = h.server({ wallclock = function() return 1764513600 + clock.at end })
  local logs = {}
  local n = 0
  local lim = limiter.new({
    send = s.send,
    clock = clock,
    wallclock = function() return 1764513600 + clock.at end,
    on_error = opts.on_error,
    denial_cache = opts.denial_cache,
    breaker = opts.breaker,
    slot_of = opts.slot_of,
    log = function(level, text) logs[#logs + 1] = level .. " " .. text end,
    new_id = function() n = n + 1; return "id-" .. n end,
    on_decision = opts.on_decision,
    processes = opts.processes,
  })
  return lim, s, clock, logs
end

function T.redis_answers_exactly()
  local lim = make()
  local groups = { { "rl:user:a", USER }, { "rl:ip:1", IP } }
  h.eq(lim:consume_many(groups).allowed, true)
  h.eq(lim:consume_many(groups).allowed, true)
  local d = lim:consume_many(groups)
  h.eq(d.allowed, false)
  h.eq(d.decisions[1].allowed, false)
  h.eq(d.decisions[2].allowed, true)
  h.eq(d.decisions[2].remaining, 98, "nothing charged on a denial")
  h.eq(lim:backend(), "module")
end

function T.each_policy_while_redis_fails()
  for policy, allowed in pairs({ open = true, closed = false }) do
    local lim, s, _, logs = make({ on_error = policy })
    s.errors = { REFUSED }
    local d = lim:consume_many({ { "rl:user:a", USER } })
    h.eq(d.allowed, allowed, policy)
    h.eq(d.degraded, true, policy)
    h.eq(d.retry_after_ms, 0)
    h.ok(logs[#logs]:find("fail-" .. policy, 1, true), logs[#logs])
  end
  local lim, s = make({ on_error = "raise" })
  s.errors = { REFUSED }
  local d, err = lim:consume_many({ { "rl:user:a", USER } })
  h.eq(d, nil)
  h.eq(err.socket, "connection refused")
end

function T.local_policy_runs_this_workers_share()
  local lim, s = make({ on_error = "local", processes = 2, breaker = false })
  local B = bucket({ max = 4, rate = 0.001, name = "user" })
  local admitted = 0
  for _ = 1, 5 do
    s.errors = { REFUSED }
    local d = lim:consume_many({ { "rl:user:a", B } })
    h.eq(d.degraded, true)
    if d.allowed then admitted = admitted + 1 end
  end
  h.eq(admitted, 2, "max 4 over 2 processes")
  s.errors = { REFUSED }
  local d = lim:consume_many({ { "rl:user:a", B } })
  h.ok(d.retry_after_ms > 0, "a local denial has its wait")
  s.errors = { REFUSED }
  local big = lim:consume_many({ { "rl:user:b", B, 3 } })
  h.eq(big.allowed, false, "a cost above this worker's share is denied")
end

function T.local_overload_is_shed_under_every_policy_and_never_counted()
  for _, policy in ipairs({ "raise", "open", "closed", "local" }) do
    local lim, s = make({ on_error = policy })
    for _ = 1, 10 do
      s.errors = { { socket = "too many open files", op = "connect" } }
      local d = lim:consume_many({ { "rl:user:a", USER } })
      h.eq(d.allowed, false, policy)
      h.eq(d.shed, true, policy)
      h.eq(d.degraded, false, policy)
      h.eq(d.retry_after_ms, 1000)
    end
    h.eq(lim:breaker_state(), "closed", policy .. ": shed calls never open the breaker")
  end
end

function T.the_breaker_opens_and_answers_without_redis()
  local lim, s, clock = make({ on_error = "closed" })
  for _ = 1, 5 do
    s.errors = { REFUSED }
    lim:consume_many({ { "rl:user:a", USER } })
  end
  h.eq(lim:breaker_state(), "open")
  local before = #s.sent
  local d = lim:consume_many({ { "rl:user:a", USER } })
  h.eq(d.degraded, true)
  h.eq(#s.sent, before, "no network while open")
  clock:add(2)
  d = lim:consume_many({ { "rl:user:a", USER } }) -- the probe: Redis is back
  h.eq(d.degraded, false)
  h.eq(d.allowed, true)
  h.eq(lim:breaker_state(), "closed")
end

function T.usage_errors_are_returned_whatever_the_policy()
  local lim, s = make({ on_error = "open" })
  s.errors = { { reply = "WRONGTYPE Operation against a key holding the wrong kind of value" } }
  local d, err = lim:consume_many({ { "rl:user:a", USER } })
  h.eq(d, nil)
  h.ok(err.reply:find("WRONGTYPE"), "WRONGTYPE")
  local _, bad = lim:consume_many({ { "rl:user:a", { max = 0, rate = 1 } } })
  h.eq(bad.message, "max must be > 0 and <= 1e12 (group 1)")
  local _, dup = lim:consume_many({ { "k", USER }, { "k", IP } })
  h.eq(dup.message, "duplicate key: group 2 repeats the key of group 1")
  h.eq(#s.sent, 1, "nothing sent for a bad argument")
end

function T.a_reply_of_the_wrong_shape_is_a_usage_error_and_nothing_more_is_written()
  local lim, s = make({ on_error = "open", denial_cache = 100 })
  s.hook = function(args) if args[1] == "tb.mconsume" then return "OK" end end
  local d, err = lim:consume_many({ { "rl:user:a", USER }, { "rl:ip:1", IP } })
  h.eq(d, nil)
  h.ok(err.shape and err.shape:find("TB.MCONSUME", 1, true), err.shape)
  h.eq(#s.sent, 1)
  s.hook = function(args) if args[1] == "tb.mconsume" then return { 1, 0, { 1, 2, 3 }, { 1, 1, 0, 0 } } end end
  d, err = lim:consume_many({ { "rl:user:a", USER }, { "rl:ip:1", IP } })
  h.ok(err and err.shape, "a bucket reply of 3 integers")
end

function T.a_cached_denial_costs_no_round_trip_and_says_so()
  local lim, s, clock = make({ denial_cache = 100 })
  local g = { { "rl:user:a", USER } }
  lim:consume_many(g)
  lim:consume_many(g)
  local first = lim:consume_many(g)
  h.eq(first.allowed, false)
  local sent = #s.sent
  clock:add(1)
  local again = lim:consume_many(g)
  h.eq(again.cached, true)
  h.eq(again.allowed, false)
  h.eq(again.retry_after_ms, first.retry_after_ms - 1000)
  h.eq(#s.sent, sent)
end

function T.bucket_by_bucket_across_cluster_slots_refunds_on_a_denial()
  local lim, s = make({ slot_of = function(key) return #key end })
  local g = { { "rl:ip:1", IP }, { "rl:user:a", USER } }
  h.eq(lim:consume_many(g).atomic, false)
  lim:consume_many(g)
  local d = lim:consume_many(g)
  h.eq(d.allowed, false)
  h.eq(d.decisions[1].allowed, true)
  h.eq(d.decisions[1].remaining, 98, "ip refunded")
  local _, err = lim:consume_many(g, { atomic = true })
  h.ok(err.cross_slot, "atomic across slots is refused")
end

function T.a_lease_is_held_renewed_and_released()
  local lim = make()
  local a = lim:acquire("rl:streams:u", STREAMS, { buckets = { { "rl:user:u", USER } } })
  h.eq(a.acquired, true)
  h.eq(a.in_use, 1)
  h.eq(lim:leases_held(), 1)
  h.eq(lim:acquire("rl:streams:u", STREAMS).acquired, true)
  local busy = lim:acquire("rl:streams:u", STREAMS)
  h.eq(busy.acquired, false)
  h.eq(require("resty.tokenbucket.decision").busy(busy), true)
  h.eq(lim:renew(a), true)
  h.eq(lim:release(a), true)
  h.eq(lim:leases_held(), 1)
  h.eq(lim:in_flight("rl:streams:u"), 1)
  h.eq(lim:release(a), false, "twice is harmless")
end

function T.a_release_while_the_breaker_is_open_goes_out_and_frees_the_slot_at_once()
  local lim, s = make({ on_error = "closed" })
  local lease = lim:acquire("rl:streams:u", STREAMS)
  for _ = 1, 5 do
    s.errors = { REFUSED }
    lim:consume_many({ { "rl:user:a", USER } })
  end
  h.eq(lim:breaker_state(), "open")
  h.eq(lim:in_flight("rl:streams:u"), nil, "the breaker answers for a read")
  h.eq(lim:release(lease), true)
  h.eq(s.sent[#s.sent], "tb.release")
  h.eq(lim:leases_held(), 0)
  h.eq(lim:breaker_state(), "open", "the release counts for nothing")
  h.eq(s.send({ "tb.inflight", "rl:streams:u" }), 0, "the slot is free in Redis at once")
  h.eq(lim:renew(lease), false, "released: a renewal, sent too, finds it gone")
  h.eq(s.sent[#s.sent], "tb.renew")
end

function T.an_acquire_that_timed_out_gets_the_policy_and_its_release_frees_the_slot()
  local lim, s = make({ on_error = "closed", breaker = false })
  local ONE = concurrency({ limit = 1, lease_ms = 30000 })
  -- The acquire lands in Redis, its reply is lost.
  s.hook = function(args)
    if args[1] == "tb.acquire" and not s.landed then
      s.landed = true
      s.hook = nil
      s.send(args)
      return nil, { socket = "timeout", op = "command" }
    end
  end
  local lease = lim:acquire("rl:streams:u", ONE)
  h.eq(lease.acquired, false)
  h.eq(lease.degraded, true)
  h.eq(lim:leases_held(), 0)
  h.eq(s.sent[#s.sent], "tb.release", "its id released")
  h.eq(lim:in_flight("rl:streams:u"), 0, "no slot held")
  h.eq(lim:acquire("rl:streams:u", ONE).acquired, true)
end

function T.an_open_lease_holds_no_slot_and_a_local_one_holds_this_workers()
  local lim, s = make({ on_error = "open" })
  s.errors = { REFUSED }
  local lease = lim:acquire("rl:streams:u", STREAMS)
  h.eq(lease.acquired, true)
  h.eq(lease.held, "none")
  h.eq(lim:renew(lease), true)
  h.eq(lim:release(lease), true)
  h.eq(lim:release(lease), false)
  local l2, s2 = make({ on_error = "local" })
  local got = {}
  for i = 1, 3 do
    s2.errors = { REFUSED }
    got[i] = l2:acquire("rl:streams:u", STREAMS)
  end
  h.eq({ got[1].acquired, got[2].acquired, got[3].acquired }, { true, true, false })
  h.eq(got[1].held, "local")
  h.eq(l2:release(got[1]), true, "released where it was granted")
end

function T.a_local_key_past_eight_leases_reads_its_list_field()
  -- Past 8 leases the library keeps a summary and reads its list field
  -- (HGET) for a denial's wait: the local fallback runs it too.
  local lim, s = make({ on_error = "local" })
  local twelve = concurrency({ limit = 12, lease_ms = 60000, name = "streams" })
  local got = {}
  for i = 1, 13 do
    s.errors = { REFUSED }
    got[i] = lim:acquire("rl:streams:big", twelve)
  end
  for i = 1, 12 do h.eq(got[i].acquired, true, "lease " .. i) end
  h.eq(got[13].acquired, false)
  -- The fake clock stands still: the earliest lease ends in a minute.
  h.eq(got[13].retry_after_ms, 60000)
  h.eq(lim:release(got[1]), true)
  s.errors = { REFUSED }
  h.eq(lim:acquire("rl:streams:big", twelve).acquired, true)
end

function T.a_renewal_that_finds_the_lease_gone_marks_it_lost()
  local lim, _, clock = make()
  local lease = lim:acquire("rl:streams:u", concurrency({ limit = 2, lease_ms = 1000 }))
  clock:add(2)
  h.eq(lim:renew(lease), false)
  h.eq(lease.lost, true)
  h.eq(lim:leases_held(), 0)
end

function T.while_the_backend_is_unknown_a_call_gets_a_second()
  local lim, s = make()
  lim:consume("rl:k", USER)
  h.eq(s.last_budget, 1000)
  lim:consume("rl:k", USER)
  h.eq(s.last_budget, 100)
end

function T.decisions_are_reported_to_the_hook()
  local events = {}
  local lim = make({ on_decision = function(e) events[#events + 1] = e end })
  lim:consume_many({ { "rl:user:a", USER }, { "rl:ip:1", IP } })
  lim:acquire("rl:streams:u", STREAMS, { buckets = { { "rl:user:u", USER } } })
  h.eq(events[1].op, "consume_many")
  h.eq(events[1].policy, "user,ip")
  h.eq(events[1].backend, "module")
  h.eq(events[2].op, "acquire")
  h.eq(events[2].policy, "streams,user")
end

function T.detect_and_reset()
  local lim = make()
  h.eq(lim:detect(), "module")
  lim:consume("rl:k", USER)
  h.eq(lim:reset("rl:k"), true)
  h.eq(lim:reset("rl:k"), false)
end

function T.a_missing_generated_library_says_how_to_make_it()
  local saved_loaded, saved_preload = package.loaded["resty.tokenbucket.library"], package.preload["resty.tokenbucket.library"]
  package.loaded["resty.tokenbucket.library"] = nil
  package.preload["resty.tokenbucket.library"] = function() error("module 'resty.tokenbucket.library' not found") end
  local ok, err = pcall(require("resty.tokenbucket.limiter").new, { clock = os.time, send = function() end })
  package.loaded["resty.tokenbucket.library"], package.preload["resty.tokenbucket.library"] = saved_loaded, saved_preload
  h.eq(ok, false)
  h.eq(tostring(err):match("run `make` in the repository") ~= nil, true, tostring(err))
end

function T.near_limit_ratio_and_shadow_are_checked_naming_them()
  local s = h.server({})
  local base = { send = s.send, clock = h.clock(10) }
  for _, ratio in ipairs({ 0, -0.5, 1.5, "0.8", 0 / 0 }) do
    local ok, err = pcall(limiter.new, setmetatable({ near_limit_ratio = ratio }, { __index = base }))
    h.ok(not ok and tostring(err):find("near_limit_ratio must be a number in (0, 1]", 1, true), tostring(ratio))
  end
  local ok, err = pcall(limiter.new, setmetatable({ shadow = "yes" }, { __index = base }))
  h.ok(not ok and tostring(err):find("shadow must be true or false, got yes", 1, true), "shadow")
end

return T
