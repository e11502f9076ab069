local h = require "helpers"
local cache_mod = require "resty.tokenbucket.cache"
local bucket = require("resty.tokenbucket.bucket").bucket

local T = {}
local B = bucket({ max = 10, rate = 1, name = "user" })

local function denial(key, retry, cost)
  return { allowed = false, remaining = 0, retry_after_ms = retry, reset_after_ms = 10000, key = key, bucket = B,
    cost = cost or 1, degraded = false, cached = false, shed = false }
end

local function admit(key, cost)
  return { allowed = true, remaining = 5, retry_after_ms = 0, reset_after_ms = 5000, key = key, bucket = B,
    cost = cost or 1 }
end

local function make()
  local clock = h.clock(50)
  return cache_mod.new(100, clock), clock
end

function T.a_denial_is_answered_until_its_retry_time_aged()
  local c, clock = make()
  local t = c:sent("consume", { "k" })
  c:answered(t, false, 1500, { denial("k", 1500) })
  clock:add(0.5)
  local hit = c:lookup({ "k" }, { B }, { 1 })
  h.eq(hit.retry_after_ms, 1000)
  h.eq(hit.decisions[1].retry_after_ms, 1000)
  h.eq(hit.decisions[1].reset_after_ms, 9500)
  h.eq(hit.decisions[1].cached, true)
  clock:add(1.0)
  h.eq(c:lookup({ "k" }, { B }, { 1 }), nil, "at the retry time: ask Redis")
  h.eq(c:len(), 0)
end

function T.the_deadline_counts_from_when_the_request_was_sent()
  local c, clock = make()
  local t = c:sent("consume", { "k" })
  clock:add(0.3) -- the answer took 300 ms
  c:answered(t, false, 1000, { denial("k", 1000) })
  clock:add(0.7)
  h.eq(c:lookup({ "k" }, { B }, { 1 }), nil)
end

function T.a_costlier_request_is_denied_a_cheaper_one_asks()
  local c = make()
  local t = c:sent("consume", { "k" })
  c:answered(t, false, 1000, { denial("k", 1000, 2) })
  h.ok(c:lookup({ "k" }, { B }, { 3 }) ~= nil, "costlier")
  h.eq(c:lookup({ "k" }, { B }, { 1 }), nil, "cheaper")
  h.eq(c:lookup({ "k" }, { bucket({ max = 20, rate = 1 }) }, { 2 }), nil, "other limits")
end

function T.a_write_forgets_the_key_and_a_denial_it_overtook_is_not_kept()
  local c = make()
  local denied = c:sent("consume", { "k" })
  local refund = c:sent("adjust", { "k" })
  c:answered(refund, true, 0, { admit("k", 5) }) -- the refund finished first
  c:answered(denied, false, 1000, { denial("k", 1000) })
  h.eq(c:lookup({ "k" }, { B }, { 1 }), nil, "overtaken by a refund: not remembered")
end

function T.a_write_whose_reply_is_lost_drops_the_entries_too()
  local c = make()
  local t = c:sent("consume", { "k" })
  c:answered(t, false, 5000, { denial("k", 5000) })
  local refund = c:sent("adjust", { "k" })
  c:failed(refund) -- sent, no answer: it may have written
  h.eq(c:lookup({ "k" }, { B }, { 1 }), nil)
end

function T.a_failed_peek_forgets_nothing()
  local c = make()
  local t = c:sent("consume", { "k" })
  c:answered(t, false, 5000, { denial("k", 5000) })
  c:failed(c:sent("peek", { "k" }))
  h.ok(c:lookup({ "k" }, { B }, { 1 }) ~= nil)
end

function T.an_admission_forgets_the_keys_it_charged()
  local c = make()
  local t = c:sent("mconsume", { "a", "b" })
  c:answered(t, false, 5000, { denial("a", 5000), admit("b") })
  h.ok(c:lookup({ "a", "b" }, { B, B }, { 1, 1 }) ~= nil)
  local other = c:sent("consume", { "b" })
  c:answered(other, true, 0, { admit("b") })
  h.eq(c:lookup({ "a", "b" }, { B, B }, { 1, 1 }), nil, "b was charged")
end

function T.reset_and_acquire_denials_are_never_kept()
  local c = make()
  local t = c:sent("acquire", { "k" })
  c:answered(t, false, 5000, { denial("k", 5000) })
  h.eq(c:lookup({ "k" }, { B }, { 1 }), nil)
  local d = c:sent("consume", { "k" })
  c:answered(d, false, 5000, { denial("k", 5000) })
  c:answered(c:sent("reset", { "k" }), true, 0, {})
  h.eq(c:lookup({ "k" }, { B }, { 1 }), nil)
end

function T.bucket_by_bucket_a_denial_wrote_the_buckets_before_it()
  local c = make()
  local t = c:sent("consume", { "a" })
  c:answered(t, false, 5000, { denial("a", 5000) })
  local each = c:sent("each", { "a", "b" })
  -- a charged then refunded, b denied
  c:answered(each, false, 5000, { admit("a"), denial("b", 5000) })
  h.eq(c:lookup({ "a" }, { B }, { 1 }), nil, "a was written by the refund")
end

function T.memory_is_bounded_least_recently_used_first()
  local clock = h.clock(0)
  local c = cache_mod.new(2, clock)
  for _, k in ipairs({ "a", "b" }) do
    c:answered(c:sent("consume", { k }), false, 5000, { denial(k, 5000) })
  end
  h.ok(c:lookup({ "a" }, { B }, { 1 }) ~= nil, "touch a")
  c:answered(c:sent("consume", { "c" }), false, 5000, { denial("c", 5000) })
  h.eq(c:len(), 2)
  h.eq(c:lookup({ "b" }, { B }, { 1 }), nil, "b was the least recently used")
  h.ok(c:lookup({ "a" }, { B }, { 1 }) ~= nil)
end

function T.a_clock_that_steps_back_drops_the_entry()
  local c, clock = make()
  c:answered(c:sent("consume", { "k" }), false, 5000, { denial("k", 5000) })
  clock:add(-10)
  h.eq(c:lookup({ "k" }, { B }, { 1 }), nil)
end

function T.keys_are_length_prefixed()
  local c = make()
  c:answered(c:sent("mconsume", { "a:b", "c" }), false, 5000, { denial("a:b", 5000), denial("c", 5000) })
  h.eq(c:lookup({ "a", "b:c" }, { B, B }, { 1, 1 }), nil)
end

return T
