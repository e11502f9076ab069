-- An in-process stand-in for ngx.shared.DICT: the operations the breaker
-- and the log limiter use (get, set, add, delete, incr, rpush, lpush,
-- lpop, llen), with expiry on an injected clock. The breaker's store when
-- no lua_shared_dict is configured (then each worker has its own), and in
-- tests and the clients/spec scenarios. Plain Lua.

local setmetatable = setmetatable

local _M = {}

local Dict = {}
Dict.__index = Dict

-- `clock`: seconds, as the breaker's.
function _M.new(clock)
  return setmetatable({ clock = clock or os.time, values = {}, expires = {} }, Dict)
end

local function live(self, key)
  local at = self.expires[key]
  if at ~= nil and self.clock() >= at then
    self.values[key], self.expires[key] = nil, nil
  end
  return self.values[key]
end

function Dict:get(key)
  local v = live(self, key)
  if type(v) == "table" then return nil, "value is a list" end
  return v
end

function Dict:set(key, value, exptime)
  self.values[key] = value
  self.expires[key] = (exptime and exptime > 0) and self.clock() + exptime or nil
  return true
end

function Dict:add(key, value, exptime)
  if live(self, key) ~= nil then return false, "exists" end
  return self:set(key, value, exptime)
end

function Dict:delete(key)
  self.values[key], self.expires[key] = nil, nil
  return true
end

function Dict:incr(key, value, init, init_ttl)
  local v = live(self, key)
  if v == nil then
    if init == nil then return nil, "not found" end
    self:set(key, init + value, init_ttl)
    return init + value
  end
  self.values[key] = v + value
  return v + value
end

local function list(self, key)
  local v = live(self, key)
  if v == nil then
    v = {}
    self.values[key] = v
  end
  return v
end

function Dict:rpush(key, value)
  local l = list(self, key)
  l[#l + 1] = value
  return #l
end

function Dict:lpush(key, value)
  local l = list(self, key)
  table.insert(l, 1, value)
  return #l
end

function Dict:lpop(key)
  local l = live(self, key)
  if l == nil or #l == 0 then return nil end
  local v = table.remove(l, 1)
  if #l == 0 then self.values[key] = nil end
  return v
end

function Dict:llen(key)
  local l = live(self, key)
  return l and #l or 0
end

return _M
