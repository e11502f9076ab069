-- What an error means for the failure policy (docs/failure-model.md), as
-- the Python and Node packages classify it:
--
--   "usage"    a bad argument, a key of the wrong kind, NOPERM, a wrong
--              password, no backend, a reply of the wrong shape: raised
--              (HTTP 500 or 400), never hidden by a policy;
--   "failure"  Redis failing: refused, reset, closed, no reply within the
--              budget of a written command, LOADING, READONLY, ...: the
--              route's policy answers, and the breaker counts it;
--   "shed"     this worker (or host) could not get Redis's answer for a
--              local reason: out of descriptors, ports, socket buffers or
--              memory, the connection pool's queue full, a connection not
--              up within the budget: refused with 503, never admitted,
--              never counted.
--
-- Anything in doubt between "Redis failed" and "we are overloaded" is
-- shed: a shed call is refused, never admitted.
--
-- An error is a table, as the transport and the engine make them:
--   {reply = "LOADING Redis is loading ..."}   an error reply from Redis
--   {socket = "connection refused", op = "connect" | "command"}
--                                               what the cosocket said
--                                               (lua-resty-redis passes
--                                               its text through as is);
--                                               `answering = true` on a
--                                               timeout while Redis
--                                               answered other commands
--   {shape = "..."}                             a reply of the wrong shape
--   {usage = "..."} / {shed = "..."}            decided where it arose
-- Plain Lua: the scenario runner of clients/spec drives it without nginx.

local contract = require "resty.tokenbucket.contract"

local type, lower, find, sub = type, string.lower, string.find, string.sub

local _M = {}

-- Error replies that say the server can't serve now (a failover, a
-- restart, a script that runs too long, a full memory, a snapshot that
-- failed, too few replicas for min-replicas-to-write, maxclients reached,
-- a slot moving): contract.json's, shared by every client.
local UNAVAILABLE = contract.UNAVAILABLE_REPLIES

-- This process or host out of a resource: descriptors (its own, the
-- system's), local ports, socket buffers, memory. nginx words errno as
-- strerror(3) in lower case: EMFILE, ENFILE, EADDRNOTAVAIL, ENOBUFS,
-- ENOMEM; "no memory" is its own allocation failing. Redis is not at
-- fault and may be fine: none of these may fail open or count.
local LOCAL_EXHAUSTION = {
  "too many open files",           -- EMFILE, and ENFILE's "... in system"
  "cannot assign requested address", -- EADDRNOTAVAIL
  "no buffer space available",     -- ENOBUFS
  "cannot allocate memory",        -- ENOMEM
  "out of memory",                 -- ENOMEM, as some libcs word it
  "no memory",                     -- nginx's own allocation
  "too many waiting connect operations", -- the pool's backlog is full
}

-- What the network says when Redis (or the way to it) is gone.
-- (And a Cluster whose redirects outlast transport.lua's hops: a reshard
-- or a failover under way.)
local REDIS_GONE = {
  "connection refused", "connection reset by peer", "broken pipe", "closed", "no route to host",
  "network is unreachable", "host is unreachable", "connection timed out", "could not be resolved",
  "too many cluster redirects",
}

local function starts_with_any(text, list)
  for i = 1, #list do
    local p = list[i]
    if sub(text, 1, #p) == p then return true end
  end
  return false
end

local function contains_any(text, list)
  for i = 1, #list do
    if find(text, list[i], 1, true) then return true end
  end
  return false
end

-- The errno of local exhaustion behind a socket error's text, or nil.
function _M.local_exhaustion(text)
  text = lower(text or "")
  return contains_any(text, LOCAL_EXHAUSTION)
end

function _M.classify(err)
  if type(err) ~= "table" then return "usage" end
  if err.shed then return "shed" end
  if err.circuit_open then return "failure" end -- known to be failing
  if err.usage or err.shape then return "usage" end
  if err.reply then
    return starts_with_any(err.reply, UNAVAILABLE) and "failure" or "usage"
  end
  local socket = err.socket
  if socket then
    local text = lower(socket)
    if contains_any(text, LOCAL_EXHAUSTION) then return "shed" end
    if text == "timeout" then
      -- A connection not up within the budget: waiting for the pool's
      -- queue, or a connect the worker may have seen late. A written
      -- command without a reply in time is Redis's silence, unless Redis
      -- answered other commands meanwhile (`answering`): then it is there,
      -- and only this call is late.
      return (err.op == "connect" or err.answering) and "shed" or "failure"
    end
    if contains_any(text, REDIS_GONE) then return "failure" end
    return "shed" -- in doubt: refused, never admitted
  end
  return "usage"
end

-- A one-line description of an error, for logs and 500 bodies.
function _M.describe(err)
  if type(err) ~= "table" then return tostring(err) end
  if err.message then return err.message end
  if err.reply then return err.reply end
  if err.socket then return (err.op or "redis") .. ": " .. err.socket end
  return err.shape or err.usage or err.shed or "error"
end

return _M
