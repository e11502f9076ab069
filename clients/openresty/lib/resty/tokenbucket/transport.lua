-- How a command reaches Redis from nginx: lua-resty-redis (Debian's
-- lua-nginx-redis, `nginx.redis`, or OpenResty's `resty.redis`) on
-- cosockets, from each worker's keepalive pool.
--
--   * A per-call budget: the connect (or the wait for a pooled connection)
--     and the command each get `budget_ms` (set_timeout before each). A
--     command with no reply within its budget is Redis's silence, and the
--     library closes that connection, so a late reply is never read as
--     another command's. Unless Redis answered other commands of this
--     worker meanwhile: then it is there, only slow for this one (a box
--     short of CPU, say), and the call is marked `answering` (shed, never
--     admitted: classify.lua).
--   * The pool: `pool_size` connections per worker at most, and `backlog`
--     connects waiting for one; a full queue, or a wait past the budget,
--     is local overload (classify.lua), never a Redis failure.
--   * Cluster: MOVED and ASK replies are followed (up to 5 hops) and the
--     slots learned from MOVED are remembered per worker, so a key's
--     commands go straight to its node. All keys of one call must share a
--     slot (a hash tag); commands that span slots get CROSSSLOT from Redis.
--   * AUTH (user and password) and SELECT on each new connection, from the
--     URL: redis://[[user]:password@]host[:port][/db], or
--     unix:/path/to/socket[?db=N].
--
-- Errors are returned as classify.lua's tables: {socket = text, op =
-- "connect" | "command"} from the cosocket, {reply = text} for an error
-- reply. Needs ngx (cosockets): the rest of the package is plain Lua.

local slot = require "resty.tokenbucket.slot"

local type, tonumber, tostring, unpack, setmetatable = type, tonumber, tostring, unpack, setmetatable
local lower, match, sub = string.lower, string.match, string.sub

local _M = {}

-- LuaJIT passes at most about 8000 values through unpack().
local MAX_ARGS = 7900
local MAX_HOPS = 5

local Transport = {}
Transport.__index = Transport

local function redis_library(name)
  if name then return require(name) end
  local ok, lib = pcall(require, "resty.redis")
  if ok then return lib end
  return require("nginx.redis")
end

local function unescape(s)
  return s and (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- {host, port, path, user, password, db, tls}, or nil and why not.
function _M.parse_url(url)
  if type(url) ~= "string" then return nil, "the Redis URL must be a string" end
  local path, query = match(url, "^unix:(/[^?]*)%??(.*)$")
  if path then
    local db = match(query or "", "db=(%d+)")
    return { path = "unix:" .. path, db = tonumber(db) or 0 }
  end
  local scheme, rest = match(url, "^(rediss?)://(.*)$")
  if not scheme then return nil, "the Redis URL must be redis://host:port[/db], rediss://... or unix:/path" end
  local auth, hostport, db = match(rest, "^([^@]*)@([^/]*)/?(%d*)$")
  if not auth then
    hostport, db = match(rest, "^([^/@]*)/?(%d*)$")
  end
  if not hostport then return nil, "the Redis URL could not be read: " .. url end
  local user, password
  if auth then
    user, password = match(auth, "^([^:]*):(.*)$")
    if not user then password = auth end
  end
  local host, port = match(hostport, "^%[([^%]]+)%]:?(%d*)$")
  if not host then host, port = match(hostport, "^([^:]*):?(%d*)$") end
  if not host or host == "" then return nil, "the Redis URL names no host: " .. url end
  return {
    host = host,
    port = tonumber(port) or 6379,
    user = (user ~= "" and unescape(user)) or nil,
    password = (password ~= "" and unescape(password)) or nil,
    db = tonumber(db) or 0,
    tls = scheme == "rediss",
  }
end

-- {url, pool_size = 100, backlog = 1000, idle_ms = 60000, connect_timeout_ms
-- (default: the call's budget), redis = module name}
function _M.new(opts)
  local target, err = _M.parse_url(opts.url or "redis://127.0.0.1:6379/0")
  if not target then error(err, 2) end
  local lib = redis_library(opts.redis)
  if target.tls and (tonumber(lib._VERSION) or 0) < 0.28 then
    error("rediss:// needs lua-resty-redis >= 0.28 (this is " .. tostring(lib._VERSION) .. ")", 2)
  end
  local pool_size = opts.pool_size or 100
  local self = setmetatable({
    lib = lib,
    target = target,
    pool_size = pool_size,
    backlog = opts.backlog or 1000,
    idle_ms = opts.idle_ms or 60000,
    connect_timeout_ms = opts.connect_timeout_ms,
    slots = nil, -- slot -> "host:port", learned from MOVED (a Cluster)
    nodes = {}, -- "host:port" -> {host, port}
    replied_at = nil, -- when a reply last came (ngx.now()), from any node
  }, Transport)
  self.default = target.path or (target.host .. ":" .. target.port)
  self.nodes[self.default] = target.path and { host = target.path } or { host = target.host, port = target.port }
  return self
end

-- The node a key's commands go to ("host:port").
function Transport:node_of(key)
  local slots = self.slots
  if slots == nil or key == nil then return self.default end
  return slots[slot.of(key)] or self.default
end

-- A new connection: AUTH and SELECT as the URL says.
local function prepare(self, red)
  local t = self.target
  if t.password then
    local ok, err
    if t.user then ok, err = red:auth(t.user, t.password) else ok, err = red:auth(t.password) end
    if not ok then return nil, err end
  end
  if t.db ~= 0 then
    local ok, err = red:select(t.db)
    if not ok then return nil, err end
  end
  return true
end

-- One try on one node: the reply, or nil and an error, or nil, nil and a
-- redirect {node, asking}.
local function once(self, node, args, budget_ms, asking)
  local red = self.lib:new()
  local where = self.nodes[node]
  local t = self.target
  local options = where.options
  if options == nil then
    options = {
      pool = "tokenbucket:" .. node .. ":" .. (t.user or "") .. ":" .. t.db,
      pool_size = self.pool_size,
      backlog = self.backlog,
      ssl = t.tls or nil,
      server_name = t.tls and t.host or nil,
    }
    where.options = options
  end
  red:set_timeout(self.connect_timeout_ms or budget_ms or 60000)
  local ok, err
  if where.port then
    ok, err = red:connect(where.host, where.port, options)
  else
    ok, err = red:connect(where.host, options) -- unix:/path
  end
  if not ok then return nil, { socket = err, op = "connect" } end
  red:set_timeout(budget_ms or 60000)
  if red:get_reused_times() == 0 then
    local ready, perr = prepare(self, red)
    if not ready then
      if perr == "timeout" or perr == "closed" or not perr then
        red:close()
        return nil, { socket = perr or "closed", op = "command" }
      end
      red:close()
      return nil, { reply = perr } -- WRONGPASS, NOAUTH, ...: usage
    end
  end
  local cmd = lower(args[1])
  local res
  local sent = ngx.now()
  if asking then
    red:init_pipeline(2)
    red:asking()
    red[cmd](red, unpack(args, 2))
    local all
    all, err = red:commit_pipeline()
    if all then
      res = all[2]
      if type(res) == "table" and res[1] == false then res, err = false, res[2] end
    end
  else
    res, err = red[cmd](red, unpack(args, 2))
  end
  if res == nil then
    -- The connection is broken or timed out (the library closed it then).
    red:close()
    local answering = err == "timeout" and (self.replied_at or 0) > sent
    return nil, { socket = err or "closed", op = "command", answering = answering or nil }
  end
  self.replied_at = ngx.now()
  red:set_keepalive(self.idle_ms, self.pool_size)
  if res == false then
    local moved_slot, moved_to = match(err, "^MOVED (%d+) (%S+)$")
    if moved_slot then return nil, nil, { node = moved_to, slot = tonumber(moved_slot) } end
    local ask_to = match(err, "^ASK %d+ (%S+)$")
    if ask_to then return nil, nil, { node = ask_to, asking = true } end
    return nil, { reply = err }
  end
  return res
end

local function learn(self, node)
  if self.nodes[node] == nil then
    local host, port = match(node, "^(.*):(%d+)$")
    if not host then return false end
    if sub(host, 1, 1) == "[" then host = sub(host, 2, -2) end
    self.nodes[node] = { host = host, port = tonumber(port) }
  end
  return true
end

-- Sends one command, routed by `key`, with `budget_ms` for the connect and
-- for the reply: the reply, or nil and an error table.
function Transport:send(args, key, budget_ms)
  if #args > MAX_ARGS then
    return nil, { usage = "a call of " .. #args .. " arguments: from nginx at most " .. MAX_ARGS }
  end
  local node = self:node_of(key)
  local asking = false
  for _ = 1, MAX_HOPS do
    local reply, err, redirect = once(self, node, args, budget_ms, asking)
    if redirect == nil then return reply, err end
    if not learn(self, redirect.node) then return nil, { reply = "ERR bad redirect: " .. redirect.node } end
    if redirect.slot then
      self.slots = self.slots or {}
      self.slots[redirect.slot] = redirect.node
    end
    node, asking = redirect.node, redirect.asking or false
  end
  return nil, { socket = "too many Cluster redirects", op = "command" }
end

-- The send function the limiter takes.
function Transport:sender()
  return function(args, key, budget_ms) return self:send(args, key, budget_ms) end
end

return _M
