-- The upkeep of the leases a worker holds for requests in flight (a
-- streamed response holding a slot): renewed about every lease_ms / 3
-- while the request runs, released when it ends.
--
-- nginx has no cosockets in the log phase (where a request ends, however
-- it ends: its last byte sent, the client gone, the upstream failed), so
-- done() schedules the release on a timer of 0 s; renewals run on one
-- timer per worker, armed for the next lease due, whatever the number of
-- leases. A renewal that finds the lease gone marks it lost and stops; one
-- that fails is logged and tried again a third of a lease later (a failure
-- is not a lost lease). A release that fails is logged, and the lease left
-- to expire, as a crashed holder's.
--
-- A lease whose request ended without done() (log_by_lua not configured)
-- is noticed when the request's ngx.ctx is collected: it is no longer
-- renewed, expires by itself, and the log says why, once. An internal
-- redirect (error_page, try_files, ngx.exec) drops ngx.ctx too: its
-- leases are then left to expire.
--
-- Plain Lua: timer_at(delay_s, fn) (fn(premature)), the clock and the
-- limiter are injected, so the tests drive it under LuaJIT.

local setmetatable, pairs, pcall, tostring, max = setmetatable, pairs, pcall, tostring, math.max

local _M = {}

local Keeper = {}
Keeper.__index = Keeper

-- {limiter, clock, timer_at, logonce}
function _M.new(opts)
  return setmetatable({
    limiter = assert(opts.limiter),
    clock = assert(opts.clock),
    timer_at = assert(opts.timer_at),
    logonce = assert(opts.logonce),
    held = {}, -- handle -> true
    count = 0,
    armed_at = nil,
    generation = 0,
  }, Keeper)
end

local function third(lease)
  return lease.concurrency.lease_ms / 3000
end

local tick

-- nginx runs timers at whole ms, and ngx.now() stands still while it runs
-- a pass of them: a delay under 1 ms would fire in that same pass, still
-- before its due, and arm again, forever, starving the worker's I/O. So a
-- delay is at least 1 ms, and a lease within 1 ms of its due is due.
local MS = 0.001

local function arm(self, at)
  if self.armed_at ~= nil and self.armed_at <= at then return end
  self.generation = self.generation + 1
  local generation = self.generation
  self.armed_at = at
  local delay = max(MS, at - self.clock())
  local ok, err = self.timer_at(delay, function(premature) tick(self, generation, premature) end)
  if not ok then
    self.armed_at = nil
    self.logonce:report("keeper-timer", 60, "error", "rate limiter: no timer to renew leases (" .. tostring(err)
      .. "): raise lua_max_pending_timers; leases expire unrenewed")
  end
end

local function rearm(self)
  local next_due
  for handle in pairs(self.held) do
    -- A lease being renewed is armed again by the tick renewing it.
    if not handle.renewing and (next_due == nil or handle.due < next_due) then next_due = handle.due end
  end
  if next_due ~= nil then arm(self, next_due) end
end

local function drop(self, handle)
  if self.held[handle] then
    self.held[handle] = nil
    self.count = self.count - 1
  end
end

tick = function(self, generation, premature)
  if generation ~= self.generation then return end -- superseded by an earlier one
  self.armed_at = nil
  if premature then return end -- the worker is exiting: its leases expire
  local now = self.clock()
  local due = {}
  for handle in pairs(self.held) do
    if handle.owner ~= nil and handle.owner[1] == nil then
      drop(self, handle)
      self.logonce:report("keeper-orphan", 60, "warn", "rate limiter: a lease of " .. handle.lease.key
        .. " outlived its request and was left to expire: is log_by_lua_block { limit:log() } missing?")
    elseif handle.due <= now + MS and not handle.renewing then
      due[#due + 1] = handle
    end
  end
  for i = 1, #due do
    local handle = due[i]
    handle.renewing = true
    local ok, err = self.limiter:renew(handle.lease)
    handle.renewing = false
    handle.due = self.clock() + third(handle.lease)
    if ok == false then
      drop(self, handle)
      self.logonce:report("keeper-lost", 60, "warn", "rate limiter: the lease " .. handle.lease.id .. " of "
        .. handle.lease.key .. " was lost (it expired, or was released elsewhere) while its request ran")
    elseif ok == nil then
      self.logonce:report("keeper-renew", 10, "warn", "rate limiter: renewing a lease of " .. handle.lease.key
        .. " failed, trying again in " .. third(handle.lease) .. " s: " .. tostring(err and (err.message
        or err.reply or err.socket or err.shed or err.usage)))
    end
  end
  rearm(self)
end

-- Keeps `lease` renewed until done(handle). `owner` is the request's
-- ngx.ctx (held weakly: see above); `after` runs after the release.
function Keeper:hold(lease, owner, after)
  local handle = { lease = lease, due = self.clock() + third(lease), after = after }
  if owner ~= nil then handle.owner = setmetatable({ owner }, { __mode = "v" }) end
  self.held[handle] = true
  self.count = self.count + 1
  arm(self, handle.due)
  return handle
end

local function release(self, handle)
  local ok, err = self.limiter:release(handle.lease)
  if ok == nil then
    self.logonce:report("keeper-release", 10, "warn", "rate limiter: releasing a lease of " .. handle.lease.key
      .. " failed; it expires in at most " .. handle.lease.concurrency.lease_ms .. " ms: "
      .. tostring(err and (err.message or err.reply or err.socket or err.shed or err.usage)))
  end
  if handle.after then
    local fine, ferr = pcall(handle.after, handle.lease)
    if not fine then
      self.logonce:report("keeper-after", 60, "error", "rate limiter: a lease's after() raised: " .. tostring(ferr))
    end
  end
end

-- The request is over: stop renewing, release on a timer of 0 s.
function Keeper:done(handle)
  if handle.finished then return end
  handle.finished = true
  drop(self, handle)
  local ok, err = self.timer_at(0, function() release(self, handle) end)
  if not ok then
    self.logonce:report("keeper-timer", 60, "error", "rate limiter: no timer to release a lease (" .. tostring(err)
      .. "): raise lua_max_pending_timers; it expires by itself")
  end
end

-- Leases held for requests in flight in this worker.
function Keeper:len()
  return self.count
end


return _M
