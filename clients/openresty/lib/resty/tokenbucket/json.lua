-- JSON for the bodies the limiter sends: objects in a stated key order
-- (problem bodies read as RFC 9457 writes them: type, title, status,
-- detail), compact, "/" left alone (lua-cjson 2.1.0 escapes it and has no
-- switch). Strings, numbers, booleans, arrays and objects. Plain Lua.

local type, pairs, tostring, concat, sort = type, pairs, tostring, table.concat, table.sort
local format, byte, gsub = string.format, string.byte, string.gsub

local _M = {}

-- Field order of the bodies this package sends; other keys follow, sorted.
local ORDER = { "type", "title", "status", "detail", "violated-policies", "error", "dimension", "retry_after",
  "reason", "ready", "backend", "breaker" }
local RANK = {}
for i, k in ipairs(ORDER) do RANK[k] = i end

local ESCAPES = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r",
  ["\t"] = "\\t" }

local function string_of(s)
  return '"' .. gsub(s, '[%c"\\]', function(c) return ESCAPES[c] or format("\\u%04x", byte(c)) end) .. '"'
end

local function is_array(t)
  local n = #t
  if n == 0 then return false end
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then return false end
  end
  return true
end

local encode

local function object(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  sort(keys, function(a, b)
    local ra, rb = RANK[a] or 1000, RANK[b] or 1000
    if ra ~= rb then return ra < rb end
    return a < b
  end)
  local parts = {}
  for i = 1, #keys do parts[i] = string_of(keys[i]) .. ":" .. encode(t[keys[i]]) end
  return "{" .. concat(parts, ",") .. "}"
end

encode = function(v)
  local t = type(v)
  if t == "string" then return string_of(v) end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return "null" end
    if v % 1 == 0 and v > -2 ^ 53 and v < 2 ^ 53 then return format("%d", v) end
    return format("%.17g", v)
  end
  if t == "boolean" then return tostring(v) end
  if t == "table" then
    if is_array(v) then
      local parts = {}
      for i = 1, #v do parts[i] = encode(v[i]) end
      return "[" .. concat(parts, ",") .. "]"
    end
    if next(v) == nil and getmetatable(v) == _M.array_mt then return "[]" end
    return object(v)
  end
  return "null"
end

-- An empty table marked with this metatable is sent as [] (else {}).
_M.array_mt = {}

function _M.encode(v)
  return encode(v)
end

-- A string as a JSON string.
_M.quote = string_of

return _M
