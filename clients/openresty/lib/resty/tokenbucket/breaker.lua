-- The circuit breaker (docs/failure-model.md): after `failures` Redis
-- failures within `window` seconds it opens, and every call gets its
-- policy at once, without a try and without a timeout's cost; after
-- `cooldown` seconds open, one call probes Redis (half-open) while the
-- others still get the policy; the probe's success closes it, its failure
-- opens it for another `cooldown`. Only Redis failures count: usage
-- errors and shed calls never do. The Python and Node packages' rules.
--
-- Its state lives in a dict with the API of ngx.shared.DICT (get, set,
-- add, delete, rpush, lpush, lpop, llen): a lua_shared_dict in nginx, so
-- every worker of a node sees one breaker; resty.tokenbucket.memdict
-- elsewhere (one worker, tests, the clients/spec scenarios). Each step
-- is a few dict operations, each atomic; two workers failing at the same
-- moment may each count, which only opens the breaker as soon.
--
-- Plain Lua: `clock` (seconds) is injected.

local setmetatable = setmetatable

local _M = {}

-- What enter() tells a call to do.
local CALL, PROBE, SKIP = 0, 1, 2
_M.CALL, _M.PROBE, _M.SKIP = CALL, PROBE, SKIP

local Breaker = {}
Breaker.__index = Breaker

local function positive(value, name)
  if type(value) ~= "number" or not (value > 0) or value == math.huge then
    error(name .. " must be a number > 0", 3)
  end
  return value
end

-- {dict = ..., clock = ..., prefix = "", failures = 5, window = 10, cooldown = 2}
function _M.new(opts)
  local failures = opts.failures or 5
  if type(failures) ~= "number" or failures < 1 or failures % 1 ~= 0 then
    error("failures must be an integer >= 1", 2)
  end
  local prefix = (opts.prefix or "") .. "breaker:"
  return setmetatable({
    dict = assert(opts.dict, "breaker: a dict is needed"),
    clock = assert(opts.clock, "breaker: a clock is needed"),
    failures = failures,
    window = positive(opts.window or 10, "window"),
    cooldown = positive(opts.cooldown or 2, "cooldown"),
    k_state = prefix .. "state",
    k_opened = prefix .. "opened_at",
    k_probe = prefix .. "probe",
    k_recent = prefix .. "recent",
  }, Breaker)
end

-- "closed", "open" or "half_open".
function Breaker:state()
  return self.dict:get(self.k_state) or "closed"
end

-- CALL, PROBE or SKIP for the call about to be made.
function Breaker:enter()
  local dict = self.dict
  local state = dict:get(self.k_state)
  if state == nil then return CALL end -- closed: the hot path, one read
  local now = self.clock()
  if state == "open" then
    if now - (dict:get(self.k_opened) or 0) < self.cooldown then return SKIP end
    dict:set(self.k_state, "half_open")
  end
  -- Half-open: one probe at a time (add is atomic across workers); a probe
  -- that never reported (its request went away) expires after a cooldown.
  if dict:add(self.k_probe, now, self.cooldown) then return PROBE end
  return SKIP
end

local function close(self)
  local dict = self.dict
  dict:delete(self.k_state)
  dict:delete(self.k_recent)
  dict:delete(self.k_probe)
end

local function open(self, now)
  local dict = self.dict
  dict:set(self.k_opened, now)
  dict:set(self.k_state, "open")
  dict:delete(self.k_probe)
  dict:delete(self.k_recent)
end

-- Redis answered (a decision, or a usage error: it is there).
function Breaker:success(probe)
  if not probe and self.dict:get(self.k_state) == nil then return end
  close(self)
end

-- Redis failed this call.
function Breaker:failure(probe)
  local dict, now = self.dict, self.clock()
  if probe or dict:get(self.k_state) ~= nil then
    open(self, now)
    return
  end
  local recent = self.k_recent
  dict:rpush(recent, now)
  -- Forget failures older than the window, oldest first.
  while true do
    local first = dict:lpop(recent)
    if first == nil then break end
    if now - first <= self.window then
      dict:lpush(recent, first)
      break
    end
  end
  if (dict:llen(recent) or 0) >= self.failures then open(self, now) end
end

-- The call ended without news of Redis (shed): let another probe.
function Breaker:release(probe)
  if probe then self.dict:delete(self.k_probe) end
end

return _M
