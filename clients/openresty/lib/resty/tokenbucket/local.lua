-- The bounded fail-open of on_error = "local": while Redis is failing,
-- each nginx worker answers from token buckets of its own, with `max` and
-- `rate` divided by `processes` (how many workers, over every node, share
-- the limit), and from leases of its own, a limit divided likewise (at
-- least 1). The Python package's _local.py, in LuaJIT.
--
-- The arithmetic is not written again here: these buckets and leases run
-- the project's own Lua library (lua/tb.lua, which Redis runs as
-- Functions) in a sandbox. What this file adds is the part of Redis that
-- library touches: TIME, TYPE, HLEN, HGET, HMGET, HGETALL, HSET, HDEL,
-- DEL, PEXPIREAT and GET over a table.
--
-- Approximate by design: each worker sees only its own traffic, and a
-- bucket starts full in each worker when the breaker opens (what a client
-- already spent in Redis is not known here). Plain Lua: `wallclock`
-- (seconds since the epoch) is injected.

local bucket_mod = require "resty.tokenbucket.bucket"
local quota_mod = require "resty.tokenbucket.quota"
local scripts = require "resty.tokenbucket.scripts"

local type, tostring, floor, ceil, max = type, tostring, math.floor, math.ceil, math.max
local format, upper, setmetatable, pcall = string.format, string.upper, setmetatable, pcall

local _M = {}

-- Sweep out expired keys after this many writes (keys also expire when
-- next read), so memory follows the live keys.
local SWEEP_EVERY = 4096

local Local = {}
Local.__index = Local

-- This process's part of a bucket, or of a quota.
local function share(rule, processes)
  if processes == 1 then return rule end
  if rule.kind == "quota" then
    return quota_mod.quota({ limit = rule.limit / processes, period = rule.period, offset = rule.offset,
      name = rule.name })
  end
  return bucket_mod.bucket({ max = rule.max / processes, rate = rule.rate / processes, name = rule.name })
end

-- This process's part of a Concurrency limit: at least one slot.
function _M.share_limit(limit, processes)
  return max(1, floor(limit / processes))
end

-- The reply Redis would send for a Lua value: numbers truncated to
-- integers, {err = ...} an error reply, {ok = ...} a status, an array up
-- to its first nil, false a nil.
local function to_reply(v)
  local t = type(v)
  if t == "number" then return v >= 0 and floor(v) or ceil(v) end
  if t == "boolean" then return v and 1 or nil end
  if t ~= "table" then return v end
  if v.err then return nil, { reply = v.err } end
  if v.ok then return v.ok end
  local out = {}
  local i = 1
  while v[i] ~= nil do
    local r, err = to_reply(v[i])
    if err then return nil, err end
    out[i] = r == nil and false or r
    i = i + 1
  end
  return out
end

local function redis_error(text)
  error({ err = text }, 0)
end

function _M.new(library_source, processes, wallclock)
  local self = setmetatable({ processes = processes or 1, wallclock = wallclock, data = {}, writes = 0 }, Local)
  local functions = {}
  local call = function(...) return self:command(...) end
  local redis = {
    call = call,
    pcall = function(...)
      local ok, res = pcall(call, ...)
      if ok then return res end
      if type(res) == "table" then return res end
      return { err = tostring(res) }
    end,
    error_reply = function(text) return { err = text } end,
    status_reply = function(text) return { ok = text } end,
    register_function = function(f) functions[f.function_name] = f.callback end,
  }
  -- The shebang line is Redis's, not Lua's.
  local source = library_source:gsub("^#![^\n]*\n", "", 1)
  local chunk = assert(loadstring(source, "=tb.lua"))
  setfenv(chunk, setmetatable({ redis = redis }, { __index = _G }))
  chunk()
  self.functions = functions
  return self
end

-- ---- the Redis the library sees -----------------------------------------------

local function live(self, key, now_ms)
  local e = self.data[key]
  if e ~= nil and e.expires ~= nil and e.expires <= now_ms then
    self.data[key] = nil
    return nil
  end
  return e
end

local function wrote(self, now_ms)
  self.writes = self.writes + 1
  if self.writes % SWEEP_EVERY == 0 then
    for k, e in pairs(self.data) do
      if e.expires ~= nil and e.expires <= now_ms then self.data[k] = nil end
    end
  end
end

function Local:command(name, ...)
  local args = { ... }
  name = upper(name)
  local now = self.wallclock()
  local now_ms = now * 1000
  if name == "TIME" then
    local us = floor(now * 1e6)
    return { format("%d", floor(us / 1e6)), format("%d", us % 1e6) }
  end
  local key = args[1]
  local e = live(self, key, now_ms)
  if name == "TYPE" then
    return { ok = e == nil and "none" or "hash" }
  elseif name == "HLEN" then
    if e == nil then return 0 end
    local n = 0
    for _ in pairs(e.fields) do n = n + 1 end
    return n
  elseif name == "HGET" then
    return (e and e.fields[args[2]]) or false
  elseif name == "HMGET" then
    local out = {}
    for i = 2, #args do out[i - 1] = (e and e.fields[args[i]]) or false end
    return out
  elseif name == "HGETALL" then
    local out = {}
    if e then
      for f, v in pairs(e.fields) do
        out[#out + 1] = f
        out[#out + 1] = v
      end
    end
    return out
  elseif name == "HDEL" then
    if e == nil then return 0 end
    local gone = 0
    for i = 2, #args do
      if e.fields[args[i]] ~= nil then
        e.fields[args[i]] = nil
        gone = gone + 1
      end
    end
    if next(e.fields) == nil then self.data[key] = nil end -- Redis deletes a hash left empty
    return gone
  elseif name == "HSET" then
    if e == nil then
      e = { fields = {} }
      self.data[key] = e
    end
    for i = 2, #args, 2 do e.fields[args[i]] = tostring(args[i + 1]) end
    wrote(self, now_ms)
    return floor((#args - 1) / 2)
  elseif name == "PEXPIREAT" then
    if e == nil then return 0 end
    e.expires = tonumber(args[2])
    return 1
  elseif name == "DEL" then
    if e == nil then return 0 end
    self.data[key] = nil
    return 1
  elseif name == "GET" then
    return false -- no key here ever holds a string
  end
  redis_error("ERR the local fallback does not run " .. name)
end

-- ---- what FCALL tb_<op> would answer, here ---------------------------------------

local function run(self, fn, keys, argv)
  local f = self.functions[fn]
  local ok, res = pcall(f, keys, argv)
  if not ok then
    if type(res) == "table" and res.err then return nil, { reply = res.err } end
    return nil, { reply = "ERR " .. tostring(res) }
  end
  return to_reply(res)
end

local function shared(self, groups)
  local out = {}
  for i = 1, #groups do
    local g = groups[i]
    out[i] = { g[1], share(g[2], self.processes), g[3] }
  end
  return out
end

-- FCALL's arguments (FCALL fn numkeys keys... argv...) run here.
local function run_fcall(self, args)
  local n = tonumber(args[3])
  local keys, argv = {}, {}
  for i = 1, n do keys[i] = args[3 + i] end
  for i = 4 + n, #args do argv[#argv + 1] = args[i] end
  return run(self, args[2], keys, argv)
end

-- A bucket (or quota) operation on this process's share of each rule, a
-- quota's own function for a quota; `after` as Redis would take it (WAIT
-- max_ms). A cost that can't fit a share is an error reply (the caller
-- denies).
function Local:run(op, groups, after)
  local local_groups = shared(self, groups)
  local args = scripts.fcall_args(scripts.wire_op(op, local_groups, after), local_groups, nil, after)
  return run_fcall(self, args)
end

-- A lease operation: an acquire's limit (at least 1) and buckets are this
-- process's share.
function Local:run_lease(op, key, head, groups)
  if op == "acquire" then
    local h = {}
    for i = 1, #head do h[i] = head[i] end
    h[1] = tostring(_M.share_limit(tonumber(head[1]), self.processes))
    head = h
  end
  local args = scripts.fcall_args(op, shared(self, groups or {}), { key, head })
  return run_fcall(self, args)
end

function Local:len()
  local n = 0
  for _ in pairs(self.data) do n = n + 1 end
  return n
end

return _M
