-- The gateway's settings, from the same GATEWAY_* variables and the same
-- JSON as the FastAPI example's config.py (buckets per tier, Redis, API
-- keys by SHA-256), checked with the module's rules when nginx starts: a
-- bad limit stops nginx with the module's message instead of turning into
-- an error per request.

local cjson = require "cjson.safe"
local tb = require "resty.tokenbucket.bucket"
local auth = require "gateway.auth"

local _M = {}

local function fail(text)
  error("gateway configuration: " .. text, 0)
end

local function checked(where, f, ...)
  local ok, res = pcall(f, ...)
  if not ok then fail(where .. ": " .. tostring(type(res) == "table" and res.message or res)) end
  return res
end

-- {max, rate} as the configuration spells a bucket.
local function token_bucket(spec, where)
  if type(spec) ~= "table" then fail(where .. ": expected {\"max\": ..., \"rate\": ...}") end
  checked(where, tb.bucket, { max = spec.max, rate = spec.rate })
  return { max = tonumber(spec.max), rate = tonumber(spec.rate) }
end

local function default_limits()
  return {
    tiers = {
      free = { user = { max = 10, rate = 0.17 }, key = { max = 10, rate = 0.17 },
        llm = { max = 20000, rate = 10 }, streams = 2 },
      standard = { user = { max = 60, rate = 1 }, key = { max = 60, rate = 1 },
        llm = { max = 200000, rate = 100 }, streams = 8 },
      -- An enterprise account spreads load over several keys.
      enterprise = { user = { max = 3000, rate = 50 }, key = { max = 1500, rate = 25 },
        llm = { max = 2000000, rate = 1000 }, streams = 64 },
    },
    -- One IP bucket for everybody, not per tier: rl:ip:<addr> is shared by
    -- every caller behind that address, whatever their tiers.
    ip = { max = 600, rate = 30 },
    stream_lease_ms = 30000,
  }
end

local function limits(raw)
  local out = { tiers = {} }
  if type(raw.tiers) ~= "table" then fail("limits.tiers must be an object of tiers") end
  for name, t in pairs(raw.tiers) do
    local where = "limits.tiers." .. name
    if type(t) ~= "table" then fail(where .. ": expected an object") end
    local streams = t.streams == nil and 2 or t.streams
    checked(where .. ".streams", tb.concurrency, { limit = streams, lease_ms = 1 })
    out.tiers[name] = {
      user = token_bucket(t.user, where .. ".user"),
      key = token_bucket(t.key, where .. ".key"),
      llm = token_bucket(t.llm, where .. ".llm"),
      streams = streams,
    }
  end
  if out.tiers.free == nil then fail("limits.tiers must define 'free', the fallback tier") end
  out.ip = token_bucket(raw.ip or { max = 600, rate = 30 }, "limits.ip")
  out.stream_lease_ms = raw.stream_lease_ms == nil and 30000 or raw.stream_lease_ms
  checked("limits.stream_lease_ms", tb.concurrency, { limit = 1, lease_ms = out.stream_lease_ms })
  return out
end

local function json(getenv, name, default)
  local text = getenv(name)
  if text == nil then return default end
  local value, err = cjson.decode(text)
  if value == nil then fail(name .. " is not JSON: " .. tostring(err)) end
  return value
end

local function number(getenv, name, default, least, integer)
  local text = getenv(name)
  if text == nil then return default end
  local n = tonumber(text)
  if n == nil or n ~= n or n < least or (integer and n % 1 ~= 0) then
    fail(name .. " must be " .. (integer and "an integer" or "a number") .. " >= " .. least .. ", got " .. text)
  end
  return n
end

local TRUE = { ["1"] = true, ["true"] = true, yes = true, on = true }
local FALSE = { ["0"] = true, ["false"] = true, no = true, off = true }

local function boolean(getenv, name)
  local text = getenv(name)
  if text == nil then return false end
  if TRUE[text:lower()] then return true end
  if FALSE[text:lower()] then return false end
  fail(name .. " must be true or false, got " .. text)
end

-- Raw demo keys -> principals, for `run.sh` out of the box; set
-- GATEWAY_API_KEYS for anything real.
local DEMO = { ["demo-free"] = { "alice", "free" }, ["demo-standard"] = { "bob", "standard" },
  ["demo-enterprise"] = { "carol", "enterprise" } }

-- The settings, from `getenv` (os.getenv by default).
function _M.from_env(getenv)
  getenv = getenv or os.getenv
  local s = {
    redis_url = getenv("GATEWAY_REDIS_URL") or "redis://127.0.0.1:6379/0",
    -- The limiter's budget for Redis to answer (s), from the write.
    redis_timeout = number(getenv, "GATEWAY_REDIS_TIMEOUT", 0.1, 0.001),
    -- Connections to Redis per worker; more connects wait their turn
    -- within the budget, then are shed (503).
    redis_max_connections = number(getenv, "GATEWAY_REDIS_MAX_CONNECTIONS", 100, 1, true),
    denial_cache = number(getenv, "GATEWAY_DENIAL_CACHE", 10000, 0, true),
    breaker_failures = number(getenv, "GATEWAY_BREAKER_FAILURES", 5, 1, true),
    breaker_window = number(getenv, "GATEWAY_BREAKER_WINDOW", 10, 0.001),
    breaker_cooldown = number(getenv, "GATEWAY_BREAKER_COOLDOWN", 2, 0.001),
    cluster_mode = boolean(getenv, "GATEWAY_CLUSTER_MODE"),
    stub_token_delay_ms = number(getenv, "GATEWAY_STUB_TOKEN_DELAY_MS", 0, 0),
    limits = limits(json(getenv, "GATEWAY_LIMITS", default_limits())),
    api_keys = {},
  }
  local keys = json(getenv, "GATEWAY_API_KEYS", nil)
  if keys == nil then
    for raw, p in pairs(DEMO) do s.api_keys[auth.key_id(raw)] = { user_id = p[1], tier = p[2] } end
  else
    if type(keys) ~= "table" then fail("GATEWAY_API_KEYS must be an object of key hashes") end
    for hash, p in pairs(keys) do
      if type(p) ~= "table" or type(p.user_id) ~= "string" or p.user_id == "" then
        fail("GATEWAY_API_KEYS[" .. hash .. "]: user_id must be a non-empty string")
      end
      s.api_keys[hash] = { user_id = p.user_id, tier = type(p.tier) == "string" and p.tier or nil }
    end
  end
  return s
end

-- A missing or unknown tier gets the free limits, never none.
function _M.for_tier(settings, tier)
  return settings.limits.tiers[tier or "free"] or settings.limits.tiers.free
end

return _M
