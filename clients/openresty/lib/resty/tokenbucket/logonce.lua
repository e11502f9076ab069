-- Log lines that can't flood the error log: the first of a kind at once,
-- then at most one line per `every` seconds for that kind, counting the
-- others, across every worker of a node when the dict is a
-- lua_shared_dict. A bad header sent on every request, or an outage,
-- shows up once, not once per request. Plain Lua (dict and log injected).

local setmetatable = setmetatable

local _M = {}

local LogOnce = {}
LogOnce.__index = LogOnce

-- `dict`: ngx.shared.DICT's API (add, get, set, incr); `log(level, text)`.
function _M.new(dict, log, prefix)
  return setmetatable({ dict = dict, log = log, prefix = (prefix or "") .. "log:" }, LogOnce)
end

-- Logs `text` at `level` unless a line of this `kind` went out within
-- `every` seconds; then it only counts it. Returns whether it logged.
function LogOnce:report(kind, every, level, text)
  local dict, key = self.dict, self.prefix .. kind
  local count_key = key .. ":more"
  if dict:add(key, true, every) then
    local more = dict:get(count_key) or 0
    if more > 0 then
      dict:set(count_key, 0)
      text = text .. " (" .. more .. " more since the last report)"
    end
    self.log(level, text)
    return true
  end
  dict:incr(count_key, 1, 0)
  return false
end

return _M
