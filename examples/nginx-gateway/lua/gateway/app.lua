-- The gateway: the FastAPI example (examples/fastapi-gateway/app.py) at
-- the edge, in nginx's phases. One decision per request in the access
-- phase, on the same Redis keys, tiers and answers:
--
--   every request: its user, API key and IP buckets in one TB.MCONSUME
--     (IP always, so a request without a valid key still pays it);
--   POST /v1/chat: the LLM reservation (prompt + max_tokens) in that same
--     call, settled with TB.ADJUST once the model answered;
--   POST /v1/chat with "stream": true: one of the user's `streams` slots
--     too, in one TB.ACQUIRE, renewed while the stream runs, released when
--     it ends (its last byte, the client gone, the model failing);
--   GET /v1/models fails open, POST /v1/chat fails closed; a busy gateway
--     sheds (503), never admits unchecked.
--
-- POST /v1/chat/completions is the same route as POST /v1/chat.

local cjson = require "cjson.safe"
local tb = require "resty.tokenbucket"
local bucket = require "resty.tokenbucket.bucket"
local classify = require "resty.tokenbucket.classify"
local headers = require "resty.tokenbucket.headers"
local json = require "resty.tokenbucket.json"
local decision_mod = require "resty.tokenbucket.decision"
local rules = require "resty.tokenbucket.rules"
local auth = require "gateway.auth"
local config = require "gateway.config"
local stub = require "gateway.stub"

local _M = {}

local Gateway = {}
Gateway.__index = Gateway

-- Built in init_by_lua: settings from the environment, checked; the
-- module's limiter (no I/O yet: each worker connects on first use).
function _M.new(getenv)
  local settings = config.from_env(getenv)
  local edge = tb.new({
    redis = settings.redis_url,
    shared_dict = "tokenbucket",
    timeout_ms = settings.redis_timeout * 1000,
    pool_size = settings.redis_max_connections,
    denial_cache = settings.denial_cache,
    breaker = { failures = settings.breaker_failures, window = settings.breaker_window,
      cooldown = settings.breaker_cooldown },
    cluster = settings.cluster_mode,
    on_error = "closed", -- each route says its own
  })
  -- Buckets made once, by tier: checked when nginx starts.
  local named = {}
  local function named_bucket(spec, name)
    local key = name .. ":" .. spec.max .. ":" .. spec.rate
    named[key] = named[key] or bucket.bucket({ max = spec.max, rate = spec.rate, name = name })
    return named[key]
  end
  local streams = {}
  for name, tier in pairs(settings.limits.tiers) do
    named_bucket(tier.user, "user")
    named_bucket(tier.key, "key")
    named_bucket(tier.llm, "llm")
    streams[name] = bucket.concurrency({ limit = tier.streams, lease_ms = settings.limits.stream_lease_ms,
      name = "streams" })
  end
  return setmetatable({ settings = settings, edge = edge, limiter = edge.limiter, named = named_bucket,
    streams = streams, ip = named_bucket(settings.limits.ip, "ip") }, Gateway)
end

-- ---- answers ------------------------------------------------------------------------

local function reply(status, body, extra)
  ngx.status = status
  for name, value in pairs(extra or {}) do ngx.header[name] = value end
  ngx.header["Content-Type"] = "application/json"
  ngx.print(json.encode(body))
  return ngx.exit(status)
end

local function set_fields(fields)
  for name, value in pairs(fields) do ngx.header[name] = value end
end

-- A call that returned an error: a usage error (no backend, a reply of
-- the wrong shape) is a 500, logged once per cause; anything else a 503.
function Gateway:failed(err)
  if classify.classify(err) == "usage" then
    local text = classify.describe(err)
    self.edge.notes:report("usage:" .. text, 60, "error", "gateway: " .. text)
    return reply(500, { error = "internal_error" })
  end
  return reply(503, { error = "rate_limiter_unavailable" }, { ["Retry-After"] = "1" })
end

-- ---- who is calling -------------------------------------------------------------------

-- Sets ctx.principal, ctx.user_id, ctx.tier, ctx.key_id (the key's
-- SHA-256) and ctx.client_ip. A key header that no key can be (over 1 KB,
-- or not text) is a 400 before anything is written.
function Gateway:identify(ctx)
  local raw = ngx.var.http_x_api_key
  if raw ~= nil and raw ~= "" then
    if #raw > rules.MAX_KEY_BYTES or not rules.is_text(raw) then
      self.edge.notes:report("bad-key", 60, "warn", "gateway: an X-API-Key header over 1024 bytes or not text")
      return reply(400, { error = "bad_request", detail = "X-API-Key is not a valid key" })
    end
    local kid = auth.key_id(raw)
    local principal = self.settings.api_keys[kid]
    if principal then
      ctx.principal, ctx.key_id, ctx.user_id, ctx.tier = principal, kid, principal.user_id, principal.tier
    end
  end
  ctx.client_ip = auth.client_ip(ngx.var.remote_addr)
end

function Gateway:tier(ctx)
  return config.for_tier(self.settings, ctx.tier)
end

-- The request's buckets: user and key when authenticated, IP always.
function Gateway:request_groups(ctx)
  local groups = {}
  if ctx.user_id then
    local tier = self:tier(ctx)
    groups[#groups + 1] = { "rl:user:" .. ctx.user_id, self.named(tier.user, "user"), 1 }
    groups[#groups + 1] = { "rl:key:" .. ctx.key_id, self.named(tier.key, "key"), 1 }
  end
  groups[#groups + 1] = { "rl:ip:" .. ctx.client_ip, self.ip, 1 }
  return groups
end

-- One all-or-nothing check of every bucket of the request, under the
-- route's policy ("open" or "closed"). Returns the decision (nil when the
-- limiter is down and the route fails open), or sends the refusal.
function Gateway:enforce(ctx, on_error, extra)
  local groups = self:request_groups(ctx)
  for i = 1, #(extra or {}) do groups[#groups + 1] = extra[i] end
  local decision, err = self.limiter:consume_many(groups, { on_error = on_error,
    atomic = self.settings.cluster_mode and false or nil })
  if decision == nil then return self:failed(err) end
  if decision.shed then
    return reply(503, { error = "overloaded" }, { ["Retry-After"] = tostring(decision_mod.whole_seconds(decision.retry_after_ms)) })
  end
  if decision.degraded then
    if not decision.allowed then
      return reply(503, { error = "rate_limiter_unavailable" }, { ["Retry-After"] = "1" })
    end
    return nil
  end
  local fields = headers.rate_limit(decision, true)
  if not decision.allowed then
    local tightest = decision_mod.tightest(decision.decisions)
    return reply(429, { error = "rate_limited", dimension = tightest.bucket.name,
      retry_after = decision_mod.whole_seconds(decision.retry_after_ms) }, fields)
  end
  set_fields(fields)
  return decision
end

local function require_principal(ctx)
  if ctx.principal == nil then
    return reply(401, { error = "unauthorized", detail = "missing or unknown X-API-Key" })
  end
end

-- ---- routes ---------------------------------------------------------------------------

-- GET /v1/models: fail open; limit first (a bad key still pays its IP
-- bucket), then require a valid key.
function Gateway:models()
  local ctx = ngx.ctx
  self:identify(ctx)
  self:enforce(ctx, "open")
  require_principal(ctx)
end

-- GET /readyz: ready when Redis answers a read-only probe with a backend.
function Gateway:readyz()
  local state = self.edge:ready()
  if state.ready then
    return reply(200, { ready = true, backend = state.backend, breaker = state.breaker })
  end
  return reply(503, { ready = false, reason = state.reason, breaker = state.breaker })
end

-- Returns unused tokens (delta > 0) or charges an overrun (delta < 0), on
-- a timer (the request is over). Fails open: the answer is already paid
-- for upstream; a lost settlement only skews the budget until it refills.
local function settle(limiter, budget, delta)
  if delta == 0 then return end
  local ok, err = limiter:adjust(budget[1], budget[2], delta, { on_error = "open" })
  if ok == nil then ngx.log(ngx.WARN, "gateway: settling ", budget[1], " failed: ", classify.describe(err)) end
end

local function chat_body()
  ngx.req.read_body()
  local data = ngx.req.get_body_data()
  local body = data and cjson.decode(data)
  if type(body) ~= "table" then return nil, "the body must be a JSON object" end
  if type(body.prompt) ~= "string" or body.prompt == "" then return nil, "prompt: a non-empty string" end
  if type(body.max_tokens) ~= "number" or body.max_tokens % 1 ~= 0 or body.max_tokens <= 0 then
    return nil, "max_tokens: an integer > 0"
  end
  if body.stream ~= nil and type(body.stream) ~= "boolean" then return nil, "stream: true or false" end
  return body
end

-- A streamed chat's answer when its lease was not acquired.
local function refuse_lease(lease)
  if lease.shed then
    return reply(503, { error = "overloaded" }, { ["Retry-After"] = tostring(decision_mod.whole_seconds(lease.retry_after_ms)) })
  end
  if lease.degraded then
    return reply(503, { error = "rate_limiter_unavailable" }, { ["Retry-After"] = "1" })
  end
  local dimension = "streams"
  if not decision_mod.busy(lease) then
    local worst
    for _, d in ipairs(decision_mod.denied_by(lease)) do
      if worst == nil or d.retry_after_ms > worst.retry_after_ms then worst = d end
    end
    dimension = worst.bucket.name
  end
  return reply(429, { error = "rate_limited", dimension = dimension,
    retry_after = decision_mod.whole_seconds(lease.retry_after_ms) }, headers.rate_limit(lease, true))
end

-- One of the user's `streams` slots, with every bucket of the request and
-- the LLM reservation charged in the same TB.ACQUIRE, all or nothing. In
-- cluster mode the buckets live in other slots than the lease key: the
-- slot first, then the buckets one by one, and the slot given back if
-- they deny.
function Gateway:take_stream_slot(ctx, budget)
  local limiter = self.limiter
  local key = "rl:streams:" .. ctx.user_id
  local streams = self.streams[ctx.tier] or self.streams.free
  if not self.settings.cluster_mode then
    local groups = self:request_groups(ctx)
    groups[#groups + 1] = budget
    local lease, err = limiter:acquire(key, streams, { buckets = groups, on_error = "closed" })
    if lease == nil then return self:failed(err) end
    if not lease.acquired then return refuse_lease(lease) end
    set_fields(headers.rate_limit(lease, true))
    return lease
  end
  local lease, err = limiter:acquire(key, streams, { on_error = "closed" })
  if lease == nil then return self:failed(err) end
  if not lease.acquired then return refuse_lease(lease) end
  local groups = self:request_groups(ctx)
  groups[#groups + 1] = budget
  local decision, derr = limiter:consume_many(groups, { on_error = "closed", atomic = false })
  if decision == nil or not decision.allowed then
    limiter:release(lease)
    if decision == nil then return self:failed(derr) end
    return self:enforce_refusal(decision)
  end
  local fields = headers.rate_limit(lease)
  for name, value in pairs(headers.rate_limit(decision, true)) do
    fields[name] = fields[name] and (fields[name] .. ", " .. value) or value
  end
  set_fields(fields)
  return lease
end

-- The refusal enforce() sends for a decision that did not admit.
function Gateway:enforce_refusal(decision)
  if decision.shed then return reply(503, { error = "overloaded" }, { ["Retry-After"] = "1" }) end
  if decision.degraded then
    return reply(503, { error = "rate_limiter_unavailable" }, { ["Retry-After"] = "1" })
  end
  local tightest = decision_mod.tightest(decision.decisions)
  return reply(429, { error = "rate_limited", dimension = tightest.bucket.name,
    retry_after = decision_mod.whole_seconds(decision.retry_after_ms) }, headers.rate_limit(decision, true))
end

-- POST /v1/chat (and /v1/chat/completions), access phase: reserves
-- prompt + max_tokens LLM tokens in the same all-or-nothing check as the
-- request buckets (a stream also takes a slot), then nginx proxies to the
-- model; body_filter() counts what it generated, log() settles.
function Gateway:chat()
  local ctx = ngx.ctx
  self:identify(ctx)
  local body, why = chat_body()
  if body == nil then return reply(422, { detail = why }) end
  local prompt_tokens = stub.count_tokens(body.prompt)
  local reserved = prompt_tokens + body.max_tokens
  local chat = { stream = body.stream == true, prompt_tokens = prompt_tokens, reserved = reserved, generated = 0,
    tail = "", kept = {} }
  if ctx.principal ~= nil then
    local budget = self:tier(ctx).llm
    if reserved > budget.max then -- could never pass; Redis would reject it as an error
      return reply(413, { error = "over_budget",
        detail = string.format("%d tokens exceed the budget of %g", reserved, budget.max) })
    end
    chat.budget = { "rl:llm:user:" .. ctx.user_id, self.named(budget, "llm"), reserved }
    if chat.stream then
      local lease = self:take_stream_slot(ctx, chat.budget)
      ngx.req.set_header("X-Reserved-Tokens", tostring(reserved))
      ctx.chat = chat
      local limiter = self.limiter
      -- Released when the request ends, however it ends; then settled
      -- with what was generated (all of it back if nothing was).
      self.edge:hold(lease, function()
        local used = chat.generated > 0 and (chat.prompt_tokens + chat.generated) or 0
        settle(limiter, chat.budget, reserved - used)
      end)
      return
    end
  end
  local decision = self:enforce(ctx, "closed", chat.budget and { chat.budget } or nil)
  require_principal(ctx)
  chat.charged = decision ~= nil
  ngx.req.set_header("X-Reserved-Tokens", tostring(reserved))
  ctx.chat = chat
end

local TOKEN = 'data: {"token"'

-- body_filter: counts the tokens a stream sent, or keeps a whole answer
-- (to read its usage). Never changes the body.
function Gateway.body_filter()
  local chat = ngx.ctx.chat
  if chat == nil then return end
  local chunk = ngx.arg[1]
  if chunk == nil or chunk == "" then return end
  if chat.stream then
    -- An event may arrive in pieces: look across the chunk's edge.
    local text = chat.tail .. chunk
    local from = 1
    while true do
      local at = text:find(TOKEN, from, true)
      if at == nil then break end
      chat.generated = chat.generated + 1
      from = at + #TOKEN
    end
    chat.tail = text:sub(math.max(from, #text - #TOKEN + 2))
  elseif #chat.kept < 256 then
    chat.kept[#chat.kept + 1] = chunk
  end
end

-- log: the chat is over. A stream's slot goes back (edge:log()); a whole
-- answer's reservation is settled with its usage (all of it back when the
-- model failed).
function Gateway:log()
  self.edge:log()
  local ctx = ngx.ctx
  local chat = ctx.chat
  if chat == nil or chat.stream or not chat.charged or chat.budget == nil then return end
  local used = 0
  if ngx.status == 200 then
    local answer = cjson.decode(table.concat(chat.kept))
    local u = type(answer) == "table" and answer.usage
    if type(u) == "table" then used = (u.prompt_tokens or 0) + (u.completion_tokens or 0) end
  end
  local limiter, budget, delta = self.limiter, chat.budget, chat.reserved - used
  if delta ~= 0 then
    local ok, err = ngx.timer.at(0, function() settle(limiter, budget, delta) end)
    if not ok then ngx.log(ngx.WARN, "gateway: no timer to settle ", budget[1], ": ", err) end
  end
end

return _M
