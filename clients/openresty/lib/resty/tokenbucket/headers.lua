-- The HTTP answer for a decision or a lease, as the Python and Node
-- packages give it (docs/failure-model.md, HTTP answers):
--
--   admitted                 the route's status, RateLimit and RateLimit-Policy
--   denied by Redis          429, the fields, Retry-After, a problem+json body
--   shed (local overload)    503, Retry-After
--   degraded, "closed"       503, Retry-After: 1
--   degraded, "open"         the route's status, no fields
--   degraded, "local"        the route's, or 429 with Retry-After from the local bucket
--
-- The fields are draft-ietf-httpapi-ratelimit-headers-11's, as
-- structured-field lists with one item per bucket, in the same order in
-- both fields:
--
--   RateLimit-Policy: "user";q=10;w=59, "ip";q=600;w=20
--   RateLimit: "user";r=9;t=6, "ip";r=599;t=1
--
-- `q` the burst (max rounded down, at least 1), `w` the seconds to refill
-- it, `r` the whole tokens left (0 in debt), `t` the seconds until that
-- bucket stops limiting (its retry time when it denies, else until full).
-- A quota is named after its period unless named ("day", "3600s"), `q`
-- its limit, `w` the current period's length (a month's own days), `t`
-- the seconds until it resets.
-- A lease's Concurrency comes first, in the quota unit
-- "concurrent-requests": `"streams";q=8;qu="concurrent-requests"` and
-- `"streams";r=6` (with `;t=` only when no slot is free). Plain Lua.

local decision_mod = require "resty.tokenbucket.decision"

local floor, ceil, max, concat = math.floor, math.ceil, math.max, table.concat
local whole_seconds = decision_mod.whole_seconds

local _M = {}

_M.QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
_M.PROBLEM_JSON = "application/problem+json"

local function sf_string(text)
  return '"' .. text:gsub("\\", "\\\\"):gsub('"', '\\"') .. '"'
end

-- The wall clock, in seconds: a month's length depends on the date.
local function now()
  return ngx and ngx.now() or os.time()
end

-- A bucket's burst (a quota's limit) in whole tokens: rounded down, but never 0.
local function quota(bucket)
  return max(1, floor(bucket.max))
end

local function legacy_of(d)
  return quota(d.bucket), max(d.remaining, 0)
end

-- The fields for a response to the request `decision` answered (a
-- bucket's decision, a multi-bucket one, or a lease), as a table of
-- name -> value; empty for a degraded or shed one (Redis said nothing to
-- report). `legacy` adds X-RateLimit-Limit and -Remaining for the most
-- restrictive bucket (or the slots, when they deny).
function _M.rate_limit(decision, legacy)
  local out = {}
  if decision.degraded or decision.shed then return out end
  local policy, current = {}, {}
  local decisions, allowed, limit, left
  if decision.concurrency then
    local c = decision.concurrency
    local name = sf_string(c.name or "default")
    local busy = decision_mod.busy(decision)
    local remaining = decision_mod.remaining(decision)
    policy[1] = name .. ";q=" .. c.limit .. ';qu="concurrent-requests"'
    current[1] = name .. ";r=" .. remaining .. (busy and (";t=" .. whole_seconds(decision.retry_after_ms)) or "")
    decisions, allowed = decision.decisions, decision.acquired
    if busy or #decisions == 0 then
      limit, left = c.limit, remaining
    else
      limit, left = legacy_of(decision_mod.tightest(decisions))
    end
  elseif decision.decisions then
    decisions, allowed = decision.decisions, decision.allowed
    limit, left = legacy_of(decision_mod.tightest(decisions))
  else
    decisions, allowed = { decision }, decision.allowed
    limit, left = legacy_of(decision)
  end
  for i = 1, #decisions do
    local d = decisions[i]
    local rule, name, window = d.bucket, nil, nil
    if rule.kind == "quota" then
      -- Named after its period unless named; `w` the current period's length.
      name = sf_string(rule.name or rule.label)
      window = rule:period_seconds(now() + d.reset_after_ms / 1000)
    else
      name = sf_string(rule.name or "default")
      window = ceil(rule.max / rule.rate)
    end
    policy[#policy + 1] = name .. ";q=" .. quota(rule) .. ";w=" .. window
    current[#current + 1] = name .. ";r=" .. max(d.remaining, 0) .. ";t=" .. whole_seconds(decision_mod.wait_ms(d))
  end
  out["RateLimit-Policy"] = concat(policy, ", ")
  out["RateLimit"] = concat(current, ", ")
  if legacy then
    out["X-RateLimit-Limit"] = tostring(limit)
    out["X-RateLimit-Remaining"] = tostring(left)
  end
  if not allowed then out["Retry-After"] = tostring(whole_seconds(decision.retry_after_ms)) end
  return out
end

-- The refusal to send for a decision or a lease: {status, headers, body,
-- decision, violated, reason}, or nil to let the request through. `body`
-- is the RFC 9457 problem as a Lua table. `reason` is "limited" (429),
-- "shed" or "unavailable" (503).
function _M.refusal(decision, legacy)
  local lease = decision.concurrency ~= nil
  if lease and decision.acquired or not lease and decision.allowed then return nil end
  -- A denial with numbers is a bucket's (Redis's, or the in-process one of
  -- on_error "local"): 429. Without: shed, or failing closed: 503.
  if decision.shed or (decision.degraded and decision.retry_after_ms == 0) then
    local retry = decision.retry_after_ms > 0 and whole_seconds(decision.retry_after_ms) or 1
    return {
      status = 503,
      reason = decision.shed and "shed" or "unavailable",
      headers = { ["Retry-After"] = tostring(retry) },
      body = {
        type = "about:blank",
        title = "Service Unavailable",
        status = 503,
        detail = decision.shed and "The server is overloaded." or "The rate limiter is unavailable.",
      },
      decision = decision,
    }
  end
  local violated = {}
  local denied = decision_mod.denied_by(decision)
  -- A lease denied for want of a slot (or with no bucket to blame) names
  -- its Concurrency first.
  if lease and (decision_mod.busy(decision) or #denied == 0) then
    violated[1] = decision.concurrency.name or "default"
  end
  for i = 1, #denied do violated[#violated + 1] = denied[i].bucket.name or "default" end
  local headers = _M.rate_limit(decision, legacy)
  local retry = whole_seconds(decision.retry_after_ms)
  -- A degraded denial (on_error "local") has no RateLimit fields, but its wait.
  headers["Retry-After"] = headers["Retry-After"] or tostring(retry)
  return {
    status = 429,
    reason = "limited",
    headers = headers,
    body = {
      type = _M.QUOTA_EXCEEDED,
      title = "Request cannot be satisfied as assigned quota has been exceeded",
      status = 429,
      detail = "Rate limited by " .. concat(violated, ", ") .. ": retry in " .. retry .. " s.",
      ["violated-policies"] = violated,
    },
    decision = decision,
    violated = violated,
  }
end

return _M
