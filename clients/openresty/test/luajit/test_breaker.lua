local h = require "helpers"
local breaker = require "resty.tokenbucket.breaker"
local memdict = require "resty.tokenbucket.memdict"

local CALL, PROBE, SKIP = breaker.CALL, breaker.PROBE, breaker.SKIP
local T = {}

local function make(opts)
  local clock = h.clock(100)
  local dict = memdict.new(clock)
  opts = opts or {}
  opts.dict, opts.clock = dict, clock
  return breaker.new(opts), clock, dict
end

function T.opens_after_failures_within_the_window()
  local b, clock = make()
  for _ = 1, 4 do
    h.eq(b:enter(), CALL)
    b:failure(false)
    clock:add(1)
  end
  h.eq(b:state(), "closed", "4 failures")
  b:failure(false)
  h.eq(b:state(), "open", "the 5th within 10 s")
  h.eq(b:enter(), SKIP)
end

function T.failures_older_than_the_window_do_not_count()
  local b, clock = make()
  for _ = 1, 4 do
    b:failure(false)
    clock:add(3)
  end
  -- the first is 12 s old now
  b:failure(false)
  h.eq(b:state(), "closed")
  b:failure(false)
  h.eq(b:state(), "open")
end

function T.a_success_in_closed_state_keeps_the_count()
  local b = make({ failures = 2 })
  b:failure(false)
  b:success(false)
  b:failure(false)
  h.eq(b:state(), "open", "successes don't reset the window, as in Python and Node")
end

function T.half_open_lets_one_probe_and_its_success_closes()
  local b, clock = make()
  for _ = 1, 5 do b:failure(false) end
  clock:add(1.9)
  h.eq(b:enter(), SKIP, "cooling down")
  clock:add(0.2)
  h.eq(b:enter(), PROBE, "after the cooldown")
  h.eq(b:state(), "half_open")
  h.eq(b:enter(), SKIP, "one probe at a time (another worker too)")
  b:success(true)
  h.eq(b:state(), "closed")
  h.eq(b:enter(), CALL)
end

function T.a_failed_probe_opens_for_another_cooldown()
  local b, clock = make()
  for _ = 1, 5 do b:failure(false) end
  clock:add(2)
  h.eq(b:enter(), PROBE)
  b:failure(true)
  h.eq(b:state(), "open")
  clock:add(1)
  h.eq(b:enter(), SKIP)
  clock:add(1)
  h.eq(b:enter(), PROBE)
end

function T.a_probe_that_never_reports_is_replaced_after_a_cooldown()
  local b, clock = make()
  for _ = 1, 5 do b:failure(false) end
  clock:add(2)
  h.eq(b:enter(), PROBE)
  clock:add(1.5)
  h.eq(b:enter(), SKIP)
  clock:add(0.5)
  h.eq(b:enter(), PROBE, "the first probe's request went away")
end

function T.a_shed_probe_lets_another_probe_at_once()
  local b, clock = make()
  for _ = 1, 5 do b:failure(false) end
  clock:add(2)
  h.eq(b:enter(), PROBE)
  b:release(true)
  h.eq(b:enter(), PROBE)
end

function T.a_usage_error_on_a_probe_closes_it()
  local b, clock = make()
  for _ = 1, 5 do b:failure(false) end
  clock:add(2)
  h.eq(b:enter(), PROBE)
  b:success(true) -- Redis answered, if only to refuse
  h.eq(b:state(), "closed")
end

function T.workers_sharing_a_dict_share_the_breaker()
  local clock = h.clock(0)
  local dict = memdict.new(clock)
  local a = breaker.new({ dict = dict, clock = clock })
  local b = breaker.new({ dict = dict, clock = clock })
  for _ = 1, 3 do a:failure(false) end
  for _ = 1, 2 do b:failure(false) end
  h.eq(a:state(), "open")
  h.eq(b:enter(), SKIP)
end

function T.arguments_are_checked()
  local clock = h.clock(0)
  h.ok(not pcall(breaker.new, { dict = memdict.new(clock), clock = clock, failures = 0 }), "failures 0")
  h.ok(not pcall(breaker.new, { dict = memdict.new(clock), clock = clock, cooldown = -1 }), "cooldown < 0")
end

return T
