local h = require "helpers"
local hold = require "resty.tokenbucket.hold"
local limiter = require "resty.tokenbucket.limiter"
local logonce = require "resty.tokenbucket.logonce"
local memdict = require "resty.tokenbucket.memdict"
local concurrency = require("resty.tokenbucket.bucket").concurrency

local T = {}
local C = concurrency({ limit = 2, lease_ms = 3000, name = "streams" })

-- A hold over a fake Redis, with timers the test fires by hand.
local function make()
  local clock = h.clock(100)
  local s = h.server({ wallclock = function() return 1764513600 + clock.at end })
  local logs = {}
  local log = function(level, text) logs[#logs + 1] = level .. " " .. text end
  local n = 0
  local lim = limiter.new({ send = s.send, clock = clock, log = log, on_error = "closed",
    new_id = function() n = n + 1; return "id-" .. n end })
  local timers = {}
  local k = hold.new({
    limiter = lim, clock = clock, logonce = logonce.new(memdict.new(clock), log),
    timer_at = function(delay, fn)
      timers[#timers + 1] = { at = clock.at + delay, fn = fn }
      return true
    end,
  })
  -- Fires the timers due by now, in order.
  local function run_due()
    table.sort(timers, function(a, b) return a.at < b.at end)
    local due = {}
    while timers[1] and timers[1].at <= clock.at do due[#due + 1] = table.remove(timers, 1) end
    for _, t in ipairs(due) do t.fn(false) end
  end
  return k, lim, s, clock, run_due, logs, timers
end

function T.a_held_lease_is_renewed_every_third_of_its_life()
  local k, lim, s, clock, run_due = make()
  local lease = lim:acquire("rl:streams:u", C)
  k:hold(lease, nil)
  for _ = 1, 6 do -- 6 s: twice the lease
    clock:add(1)
    run_due()
  end
  h.eq(lim:in_flight("rl:streams:u"), 1, "alive past its 3 s")
  local renews = 0
  for _, name in ipairs(s.sent) do if name == "tb.renew" then renews = renews + 1 end end
  h.eq(renews, 6)
  h.eq(k:len(), 1)
end

function T.done_releases_on_a_zero_timer_then_runs_after()
  local k, lim, _, _, run_due = make()
  local lease = lim:acquire("rl:streams:u", C)
  local after
  local handle = k:hold(lease, nil, function(l) after = l.released end)
  k:done(handle)
  h.eq(lim:in_flight("rl:streams:u"), 1, "not in the log phase itself")
  run_due()
  h.eq(lim:in_flight("rl:streams:u"), 0)
  h.eq(after, true)
  h.eq(k:len(), 0)
  k:done(handle) -- twice is harmless
end

function T.a_lost_lease_stops_being_renewed_and_says_so()
  local k, lim, _, clock, run_due, logs = make()
  local lease = lim:acquire("rl:streams:u", C)
  k:hold(lease, nil)
  clock:add(5) -- expired before the first renewal ran
  run_due()
  h.eq(lease.lost, true)
  h.eq(k:len(), 0)
  h.ok(logs[#logs]:find("was lost", 1, true), logs[#logs])
end

function T.a_renewal_that_fails_is_tried_again_the_lease_not_lost()
  local k, lim, s, clock, run_due, logs = make()
  local lease = lim:acquire("rl:streams:u", C)
  k:hold(lease, nil)
  clock:add(1)
  s.errors = { { socket = "connection refused", op = "connect" } }
  run_due()
  h.eq(lease.lost, false)
  h.ok(logs[#logs]:find("failed, trying again", 1, true), logs[#logs])
  clock:add(1)
  run_due()
  h.eq(lim:in_flight("rl:streams:u"), 1)
  h.eq(k:len(), 1)
end

function T.a_lease_whose_request_is_gone_without_done_is_let_go()
  local k, lim, _, clock, run_due, logs = make()
  local lease = lim:acquire("rl:streams:u", C)
  k:hold(lease, { request = true }) -- an ngx.ctx nobody else holds
  collectgarbage("collect")
  clock:add(1)
  run_due()
  h.eq(k:len(), 0)
  h.ok(logs[#logs]:find("log_by_lua_block", 1, true), logs[#logs])
end

-- nginx fires a timer at whole ms, a hair before its due, and ngx.now()
-- stands still through that pass of timers: the tick must renew (or arm at
-- least 1 ms ahead), never arm a timer that fires again in the same pass.
function T.a_timer_fired_a_hair_early_renews_and_never_spins()
  local k, lim, s, clock, _, _, timers = make()
  clock.at = 100.0004
  local lease = lim:acquire("rl:streams:u", C)
  k:hold(lease, nil)
  h.eq(#timers, 1)
  local due = timers[1].at -- 101.0004
  clock.at = math.floor(due * 1000) / 1000 -- the ms nginx fires it in
  local passes = 0
  while timers[1] and timers[1].at <= clock.at + 0.001 and passes < 10 do
    passes = passes + 1
    table.remove(timers, 1).fn(false)
  end
  h.eq(passes, 1, "one tick in this pass")
  local renews = 0
  for _, name in ipairs(s.sent) do if name == "tb.renew" then renews = renews + 1 end end
  h.eq(renews, 1, "renewed, a hair early")
  h.eq(#timers, 1)
  h.ok(timers[1].at >= clock.at + 0.9, "the next one a third of the lease on")
end

function T.one_timer_at_a_time_for_many_leases()
  local k, lim, _, _, _, _, timers = make()
  for i = 1, 50 do k:hold(lim:acquire("rl:streams:u" .. i, C), nil) end
  h.eq(#timers, 1)
end

return T
