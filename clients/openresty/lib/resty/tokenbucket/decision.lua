-- What a call answers: decisions and leases made from Redis's replies,
-- each reply's shape checked first. A reply of the wrong shape (a foreign
-- script answering, a proxy that mangles) is an error {shape = ...}, a
-- usage error: nothing is made up from it, and nothing more is written.
-- The replies are the same on every backend (docs/commands.md). Plain Lua.

local type, ceil, max = type, math.ceil, math.max

local _M = {}

local function integer(v)
  return type(v) == "number" and v % 1 == 0
end

local function flag(v)
  return v == 0 or v == 1
end

local function bad(what, reply)
  local t = type(reply)
  local shown
  if t == "table" then
    shown = "an array of " .. #reply
  elseif t == "string" then
    shown = "the text " .. string.format("%q", reply:sub(1, 40))
  else
    shown = tostring(reply)
  end
  return { shape = "Redis answered " .. what .. " with " .. shown .. ", not the reply of docs/commands.md" }
end

-- [allowed, remaining, retry_after_ms, reset_after_ms]
local function bucket_reply(r)
  return type(r) == "table" and #r == 4 and flag(r[1]) and integer(r[2]) and integer(r[3]) and integer(r[4])
    and r[3] >= 0 and r[4] >= 0
end

function _M.whole_seconds(ms)
  return ceil(ms / 1000)
end

-- One bucket's answer, with the request that produced it.
local function decision(r, key, bucket, cost)
  return {
    allowed = r[1] == 1,
    remaining = r[2],
    retry_after_ms = r[3],
    reset_after_ms = r[4],
    key = key,
    bucket = bucket,
    cost = cost,
    degraded = false,
    cached = false,
    shed = false,
    -- A bucket's denial let through by shadow mode: admitted, no wait.
    shadow = false,
    -- An admitted reservation's wait before proceeding; 0 for all else.
    delay_ms = r[1] == 1 and r[3] or 0,
  }
end
_M.decision = decision

-- TB.CONSUME / TB.PEEK's reply.
function _M.one(reply, group, op)
  if not bucket_reply(reply) then return nil, bad(op or "a bucket call", reply) end
  local d = decision(reply, group[1], group[2], group[3])
  if op == "adjust" then
    -- ADJUST always applies: `allowed` is about the next request of cost 1.
    d.allowed, d.delay_ms = d.retry_after_ms == 0, 0
  end
  return d
end

-- A MultiDecision: all buckets charged, or none.
local function multi(allowed, retry_after_ms, decisions, atomic)
  return {
    allowed = allowed,
    retry_after_ms = retry_after_ms,
    delay_ms = allowed and retry_after_ms or 0,
    decisions = decisions,
    atomic = atomic ~= false,
    degraded = false,
    cached = false,
    shed = false,
    shadow = false,
  }
end
_M.multi = multi

-- TB.MCONSUME's reply: [allowed, retry_after_ms, b1, b2, ...].
function _M.many(reply, groups)
  if not (type(reply) == "table" and #reply == 2 + #groups and flag(reply[1]) and integer(reply[2])
      and reply[2] >= 0) then
    return nil, bad("TB.MCONSUME", reply)
  end
  local decisions = {}
  for i = 1, #groups do
    local r = reply[2 + i]
    if not bucket_reply(r) then return nil, bad("TB.MCONSUME's bucket " .. i, r) end
    local g = groups[i]
    decisions[i] = decision(r, g[1], g[2], g[3])
  end
  return multi(reply[1] == 1, reply[2], decisions, true)
end

-- TB.ACQUIRE's reply: [acquired, in_use, retry_after_ms, expires_in_ms, b1, ...].
function _M.lease(reply, req, degraded)
  if not (type(reply) == "table" and #reply == 4 + #req.groups and flag(reply[1]) and integer(reply[2])
      and integer(reply[3]) and integer(reply[4]) and reply[2] >= 0 and reply[3] >= 0 and reply[4] >= 0) then
    return nil, bad("TB.ACQUIRE", reply)
  end
  local decisions = {}
  for i = 1, #req.groups do
    local r = reply[4 + i]
    if not bucket_reply(r) then return nil, bad("TB.ACQUIRE's bucket " .. i, r) end
    local g = req.groups[i]
    decisions[i] = decision(r, g[1], g[2], g[3])
    decisions[i].degraded = degraded or false
  end
  local acquired = reply[1] == 1
  return {
    acquired = acquired,
    in_use = reply[2],
    retry_after_ms = reply[3],
    expires_in_ms = reply[4],
    id = req.id,
    key = req.key,
    concurrency = req.concurrency,
    weight = req.weight,
    decisions = decisions,
    degraded = degraded or false,
    shed = false,
    lost = false,
    released = false,
    held = acquired and (degraded and "local" or "redis") or "none",
  }
end

-- TB.RENEW's [renewed, expires_in_ms] and TB.RELEASE's [released, in_use].
function _M.pair(reply, what)
  if not (type(reply) == "table" and #reply == 2 and flag(reply[1]) and integer(reply[2]) and reply[2] >= 0) then
    return nil, bad(what, reply)
  end
  return reply
end

-- TB.INFLIGHT's in_use.
function _M.count(reply)
  if not (integer(reply) and reply >= 0) then return nil, bad("TB.INFLIGHT", reply) end
  return reply
end

-- ---- what a decision says ----------------------------------------------------

-- Until this bucket matters again: the retry time when it denies, else the
-- time until it is full.
function _M.wait_ms(d)
  return d.allowed and d.reset_after_ms or d.retry_after_ms
end

-- The buckets that could not pay.
function _M.denied_by(decision)
  local out = {}
  local list = decision.decisions
  for i = 1, #list do
    if not list[i].allowed then out[#out + 1] = list[i] end
  end
  return out
end

-- The most restrictive bucket: a denying one with the longest wait, else
-- the one with the smallest share of its capacity left.
function _M.tightest(decisions)
  local best, bk1, bk2, bk3
  for i = 1, #decisions do
    local d = decisions[i]
    local k1, k2, k3 = d.allowed and 0 or 1, d.retry_after_ms, -d.remaining / d.bucket.max
    if best == nil or k1 > bk1 or (k1 == bk1 and (k2 > bk2 or (k2 == bk2 and k3 > bk3))) then
      best, bk1, bk2, bk3 = d, k1, k2, k3
    end
  end
  return best
end

-- The name of the rule that decided a decision (one bucket's, or a
-- MultiDecision's tightest), or nil.
function _M.rule(decision)
  if decision.decisions == nil then return decision.bucket.name end
  local d = _M.tightest(decision.decisions)
  return d and d.bucket.name
end

-- A lease denied for want of a slot (not only by a bucket).
function _M.busy(lease)
  return not lease.acquired and lease.in_use + lease.weight > lease.concurrency.limit
end

-- Slots still free after the call.
function _M.remaining(lease)
  return max(lease.concurrency.limit - lease.in_use, 0)
end

return _M
