-- What the unit tests share: assertions, a fake clock, and a fake Redis
-- that answers the module's commands and the library's functions by
-- running lua/tb.lua in process (local.lua's sandbox), with scripted
-- errors in between.

local local_mod = require "resty.tokenbucket.local"
local library = require "resty.tokenbucket.library"

local _M = {}

local function show(v)
  if type(v) == "table" then
    local parts = {}
    for k, x in pairs(v) do parts[#parts + 1] = tostring(k) .. "=" .. show(x) end
    table.sort(parts)
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return type(v) == "string" and string.format("%q", v) or tostring(v)
end
_M.show = show

local function deep_eq(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do if not deep_eq(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

function _M.eq(got, want, what)
  if not deep_eq(got, want) then
    error((what and (what .. ": ") or "") .. "got " .. show(got) .. ", want " .. show(want), 2)
  end
end

function _M.ok(v, what)
  if not v then error("expected true: " .. (what or "?"), 2) end
end

-- A clock the test moves: clock() in seconds, clock.at = ..., clock:add(s).
function _M.clock(start)
  local c = { at = start or 1000 }
  setmetatable(c, { __call = function(self) return self.at end })
  function c:add(s) self.at = self.at + s end
  return c
end

-- A fake Redis: `module` (TB.* answered) or not (FCALL, EVALSHA, FUNCTION
-- LOAD answered), on a wall clock. server.errors is a list of errors
-- (tables as classify.lua takes them) that the next commands get instead;
-- server.sent records every command's name. `library_version` is what
-- tb_version answers (nil: no library loaded yet).
function _M.server(opts)
  opts = opts or {}
  local wall = opts.wallclock or function() return 1764513600.5 end
  local s = {
    module = opts.module ~= false,
    functions = opts.functions ~= false,
    eval = opts.eval ~= false,
    library_version = opts.library_version,
    cached_scripts = {},
    errors = {},
    sent = {},
    loads = 0,
  }
  s.redis = local_mod.new(library.source, 1, wall)
  local FN = {}
  for op in pairs(require("resty.tokenbucket.scripts").FUNCTIONS) do FN["tb_" .. op] = op end

  local function lease_op(op)
    return op == "acquire" or op == "release" or op == "renew" or op == "inflight"
  end

  -- FCALL-shaped keys and args -> the sandbox's answer.
  local function run_fcall(op, keys, argv)
    local f = s.redis.functions["tb_" .. op]
    local ok, res = pcall(f, keys, argv)
    if not ok then return nil, { reply = type(res) == "table" and res.err or tostring(res) } end
    if type(res) == "table" and res.err then return nil, { reply = res.err } end
    local function conv(v)
      if type(v) == "number" then return v >= 0 and math.floor(v) or math.ceil(v) end
      if type(v) == "table" then
        local out = {}
        for i = 1, #v do out[i] = conv(v[i]) end
        return out
      end
      return v
    end
    return conv(res)
  end

  local MODULE = {
    ["tb.consume"] = "consume", ["tb.peek"] = "peek", ["tb.adjust"] = "adjust", ["tb.mconsume"] = "mconsume",
    ["tb.acquire"] = "acquire", ["tb.release"] = "release", ["tb.renew"] = "renew", ["tb.inflight"] = "inflight",
  }

  function s.send(args, key, budget)
    local name = string.lower(args[1])
    s.sent[#s.sent + 1] = name
    s.last_budget = budget
    if s.hook then
      local r, e = s.hook(args, key)
      if r ~= nil or e ~= nil then return r, e end
    end
    if #s.errors > 0 then
      local e = table.remove(s.errors, 1)
      if e ~= false then return nil, e end
    end
    local op = MODULE[name]
    if op then
      if not s.module then return nil, { reply = "ERR unknown command '" .. args[1] .. "', with args beginning with: " } end
      if op == "mconsume" then
        local keys, argv = {}, {}
        for i = 2, #args, 4 do
          keys[#keys + 1] = args[i]
          argv[#argv + 1], argv[#argv + 2], argv[#argv + 3] = args[i + 1], args[i + 2], args[i + 3]
        end
        return run_fcall(op, keys, argv)
      end
      if lease_op(op) then
        -- TB.ACQUIRE key limit lease_ms id weight [BUCKET k max rate cost]...
        local keys, argv, i = { args[2] }, {}, 3
        while i <= #args and args[i] ~= "BUCKET" do argv[#argv + 1] = args[i]; i = i + 1 end
        local limits = {}
        while i <= #args do
          keys[#keys + 1] = args[i + 1]
          limits[#limits + 1], limits[#limits + 2], limits[#limits + 3] = args[i + 2], args[i + 3], args[i + 4]
          i = i + 5
        end
        for _, v in ipairs(limits) do argv[#argv + 1] = v end
        return run_fcall(op, keys, argv)
      end
      local argv = {}
      for i = 3, #args do argv[#argv + 1] = args[i] end
      return run_fcall(op, { args[2] }, argv)
    end
    if name == "fcall" or name == "fcall_ro" then
      if not s.functions then return nil, { reply = "ERR unknown command 'FCALL'" } end
      if args[2] == "tb_version" then
        if s.library_version == nil then return nil, { reply = "ERR Function not found" } end
        return s.library_version
      end
      if s.library_version == nil then return nil, { reply = "ERR Function not found" } end
      local n = tonumber(args[3])
      local keys, argv = {}, {}
      for i = 1, n do keys[i] = args[3 + i] end
      for i = 4 + n, #args do argv[#argv + 1] = args[i] end
      return run_fcall(FN[args[2]], keys, argv)
    end
    if name == "function" then
      if not s.functions then return nil, { reply = "ERR unknown command 'FUNCTION'" } end
      s.loads = s.loads + 1
      s.library_version = library.version
      return "tb"
    end
    if name == "evalsha" or name == "eval" then
      if not s.eval then return nil, { reply = "NOPERM this user has no permissions to run the 'evalsha' command" } end
      if name == "evalsha" and not s.cached_scripts[args[2]] then
        return nil, { reply = "NOSCRIPT No matching script. Please use EVAL." }
      end
      s.cached_scripts[library.eval_sha] = true
      local n = tonumber(args[3])
      local keys, rest = {}, {}
      for i = 1, n do keys[i] = args[3 + i] end
      for i = 4 + n, #args do rest[#rest + 1] = args[i] end
      local op = table.remove(rest, 1)
      return run_fcall(op, keys, rest)
    end
    if name == "del" then return s.redis:command("DEL", args[2]) end
    return nil, { reply = "ERR unknown command '" .. args[1] .. "'" }
  end
  return s
end

return _M
