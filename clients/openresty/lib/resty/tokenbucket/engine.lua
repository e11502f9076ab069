-- Sends one operation on the backend in use, and finds that backend: on
-- first use, and again when a reply says it is gone (a failover to a node
-- without the module, FUNCTION FLUSH, a restart). One engine per nginx
-- worker (the limiter's), so each worker finds it once.
--
--   1. the module's TB.* commands, if the server answers them;
--   2. else the Functions library, checked with FCALL_RO tb_version 0 and
--      loaded with FUNCTION LOAD REPLACE when missing, stale or foreign;
--   3. else, where FUNCTION is refused (Redis 6.2, an ACL without it), the
--      EVAL script through EVALSHA, sent with EVAL after NOSCRIPT.
--
-- The call itself is the probe: a refusal means nothing ran, so nothing is
-- charged twice. While one call checks or loads the library on a node,
-- the worker's other calls to that node answer through the EVAL script
-- (the same code, the same replies), so a burst of first calls loads it
-- once. A backend that is lost forgets what was checked, as the new node
-- may hold another library. The library state is kept per node (a
-- Cluster's primaries each hold their own).
--
-- I/O is injected: send(args, key) returns the reply, or nil and an error
-- table ({reply = text} for an error reply, {socket = text, op = ...}
-- for the connection); node_of(key) names the node a key's command goes
-- to. So the clients/spec scenarios drive it with scripted replies, and a
-- send that yields (a coroutine, as nginx's cosockets do) runs concurrent
-- calls. Plain Lua.

local scripts = require "resty.tokenbucket.scripts"

local lower, find, sub, setmetatable = string.lower, string.find, string.sub, setmetatable

local _M = {}

local BACKENDS = { "module", "functions", "eval" }
_M.BACKENDS = BACKENDS

local Engine = {}
Engine.__index = Engine

-- {backend = nil | "module" | "functions" | "eval" (forced), library =
-- {source, version, eval, eval_sha}, log = function(level, text), node_of}
function _M.new(opts)
  local forced = opts.backend
  if forced ~= nil and forced ~= "module" and forced ~= "functions" and forced ~= "eval" then
    error("backend must be one of module, functions, eval (or nil to detect it)", 2)
  end
  return setmetatable({
    forced = forced,
    backend = forced,
    library = assert(opts.library, "engine: the library is needed"),
    log = opts.log or function() end,
    node_of = opts.node_of or function() return "" end,
    checked = {}, -- node -> the library there is ours
    checking = {}, -- node -> a call is checking or loading it now
  }, Engine)
end

-- The server says this command doesn't exist here, or that this user may
-- not run it: nothing ran.
local function refused(err)
  local text = err and err.reply
  if not text then return false end
  text = lower(text)
  return find(text, "unknown command", 1, true) ~= nil or find(text, "no permissions to run", 1, true) ~= nil
end
_M.refused = refused

local function function_missing(err)
  local text = err and err.reply
  return text ~= nil and find(lower(text), "function not found", 1, true) ~= nil
end

local function noscript(err)
  return err and err.reply and sub(err.reply, 1, 8) == "NOSCRIPT"
end

-- This backend can't serve this server: try the next one.
local function unavailable(backend, cause)
  return { unavailable = backend, cause = cause }
end

local function eval(self, send, tail, key)
  local lib = self.library
  local args = { "EVALSHA", lib.eval_sha }
  for i = 1, #tail do args[#args + 1] = tail[i] end
  local reply, err = send(args, key)
  if reply ~= nil then return reply end
  if noscript(err) then
    -- Not cached on this node (restart, failover, SCRIPT FLUSH): EVAL runs
    -- the script and caches it for the next EVALSHA.
    args[1], args[2] = "EVAL", lib.eval
    reply, err = send(args, key)
    if reply ~= nil then return reply end
  end
  if refused(err) then return nil, unavailable("eval", err) end
  return nil, err
end

local function load_library(self, send, key, node)
  -- REPLACE: idempotent when workers or gateways race.
  local reply, err = send({ "FUNCTION", "LOAD", "REPLACE", self.library.source }, key)
  if reply == nil then
    -- Refused (Redis 6.2, an ACL without FUNCTION, a managed service that
    -- disables it), or a library that does not compile there: the EVAL
    -- script needs no loading.
    if err and err.reply then return nil, unavailable("functions", err) end
    return nil, err
  end
  self.checked[node] = true
  self.log("info", "rate limiter: loaded the Lua library " .. self.library.version .. " (FUNCTION LOAD)")
  return true
end

-- Before the first FCALL on a node: the library there must be this
-- package's copy, as tb_version tells. None, an older one, or a foreign
-- one (no tb_version) is replaced by it.
local function check_library(self, send, key, node)
  local reply, err = send(scripts.VERSION_ARGS, key)
  if reply == nil then
    if refused(err) then return nil, unavailable("functions", err) end
    if not function_missing(err) then return nil, err end
  end
  if reply ~= self.library.version then
    return load_library(self, send, key, node)
  end
  self.checked[node] = true
  return true
end

local function fcall(self, send, op, groups, lease, after)
  local key = lease and lease[1] or groups[1][1]
  local node = self.node_of(key)
  if self.checking[node] then
    -- Another call is checking or loading the library right now: a burst
    -- of first calls must not each load it (FUNCTION LOAD compiles it
    -- while Redis waits). The EVAL script answers the same.
    return eval(self, send, scripts.eval_tail(op, groups, lease, after), key)
  end
  if not self.checked[node] then
    self.checking[node] = true
    local ok, err = check_library(self, send, key, node)
    self.checking[node] = nil
    if not ok then return nil, err end
  end
  local args = scripts.fcall_args(op, groups, lease, after)
  local reply, err = send(args, key)
  if reply ~= nil then return reply end
  if refused(err) then return nil, unavailable("functions", err) end
  if not function_missing(err) then return nil, err end
  -- Flushed since it was checked (FUNCTION FLUSH, a failover, a restart).
  self.checked[node] = nil
  self.checking[node] = true
  local ok, lerr = load_library(self, send, key, node)
  self.checking[node] = nil
  if not ok then return nil, lerr end
  return send(args, key)
end

local function send_on(self, backend, send, op, groups, lease, after)
  if backend == "module" then
    local key = lease and lease[1] or groups[1][1]
    local reply, err = send(scripts.module_args(op, groups, lease, after), key)
    if reply == nil and refused(err) then return nil, unavailable("module", err) end
    return reply, err
  end
  if backend == "functions" then return fcall(self, send, op, groups, lease, after) end
  local key = lease and lease[1] or groups[1][1]
  return eval(self, send, scripts.eval_tail(op, groups, lease, after), key)
end

local function no_backend(causes)
  local parts = {}
  for i = 1, #causes do
    local c = causes[i]
    parts[i] = c[1] .. ": " .. ((c[2] and (c[2].reply or c[2].socket)) or "?")
  end
  return { usage = "no rate-limit backend answered (" .. table.concat(parts, "; ") .. ")", no_backend = true }
end

local function detect(self, send, op, groups, lease, after)
  local causes = {}
  for i = 1, #BACKENDS do
    local name = BACKENDS[i]
    local reply, err = send_on(self, name, send, op, groups, lease, after)
    if reply ~= nil then
      self.backend = name
      self.log("info", "rate limiter: using the " .. name .. " backend")
      return reply
    end
    if not (err and err.unavailable) then return nil, err end
    causes[#causes + 1] = { name, err.cause }
  end
  return nil, no_backend(causes)
end

-- Sends `op` on its groups (a lease operation: on its key and head, with
-- the groups as its buckets; a quota's operation for a quota), `after`
-- behind them (WAIT max_ms), and returns the reply, or nil and the error.
function Engine:call(send, op, groups, lease, after)
  if not lease then op = scripts.wire_op(op, groups, after) end
  local backend = self.backend
  if backend ~= nil then
    local reply, err = send_on(self, backend, send, op, groups, lease, after)
    if reply ~= nil or not (err and err.unavailable) then return reply, err end
    if self.forced then return nil, no_backend({ { backend, err.cause } }) end
    self.log("warn", "rate limiter: the " .. backend .. " backend is gone ("
      .. tostring(err.cause and (err.cause.reply or err.cause.socket)) .. "), detecting again")
    self.backend = nil
    self.checked = {}
  end
  return detect(self, send, op, groups, lease, after)
end

return _M
