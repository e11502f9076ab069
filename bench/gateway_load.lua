-- wrk script: N users (API keys bench-key-0..N-1, round robin) on GET
-- /v1/models; counts the answers by kind and prints one RESULT line that
-- bench/gateway_load.py reads. It drives either gateway (nginx's or
-- FastAPI's, whose header names differ in case) and the nginx bench's
-- other setups.
-- Usage: wrk ... -s gateway_load.lua URL -- N
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  users = tonumber(args[1]) or 50
  sent = 0
  counts = { admitted = 0, denied = 0, degraded = 0, shed = 0, closed = 0, other = 0 }
end

function request()
  sent = sent + 1
  return wrk.format("GET", "/v1/models", { ["X-API-Key"] = "bench-key-" .. (sent % users) })
end

local function has(headers, name)
  for k in pairs(headers) do
    if string.lower(k) == name then return true end
  end
  return false
end

-- 200 with RateLimit fields: Redis admitted it; 200 without: admitted by
-- a fail-open policy (degraded) or by a limiter that sends no fields;
-- 503 "overloaded": shed; another 503: failing closed.
function response(status, headers, body)
  local kind = "other"
  if status == 200 then
    kind = has(headers, "ratelimit") and "admitted" or "degraded"
  elseif status == 429 then
    kind = "denied"
  elseif status == 503 then
    kind = string.find(body, "overloaded", 1, true) and "shed" or "closed"
  end
  counts[kind] = counts[kind] + 1
end

function done(summary, latency, requests)
  local t = { admitted = 0, denied = 0, degraded = 0, shed = 0, closed = 0, other = 0 }
  for _, thread in ipairs(threads) do
    local c = thread:get("counts")
    for k, v in pairs(c) do t[k] = t[k] + v end
  end
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d admitted=%d denied=%d degraded=%d shed=%d closed=%d other=%d socket_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    t.admitted, t.denied, t.degraded, t.shed, t.closed, t.other,
    e.connect + e.read + e.write + e.timeout))
end
