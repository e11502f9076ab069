-- Who is calling: the API key's principal (by the key's SHA-256, as the
-- FastAPI example's auth.py) and the client's address as the IP bucket
-- names it. The raw key goes no further than key_id().

local ffi = require "ffi"

local _M = {}

-- OpenSSL's one-shot digest, from the libcrypto nginx is linked with.
ffi.cdef [[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_sha256(void);
int EVP_Digest(const void *data, size_t count, unsigned char *md, unsigned int *size, const EVP_MD *type,
               void *impl);
]]

-- In nginx the symbols are there already; under plain LuaJIT (tests) the
-- library is loaded.
local function crypto()
  if pcall(function() return ffi.C.EVP_sha256 end) then return ffi.C end
  local ok, lib = pcall(ffi.load, "crypto")
  return ok and lib or ffi.load("libcrypto.so.3")
end
local C = crypto()

local digest = ffi.new("unsigned char[32]")
local size = ffi.new("unsigned int[1]")
local SHA256 = C.EVP_sha256()

-- The SHA-256 of an API key, in hex: what the gateway stores and logs
-- instead of the key. A high-entropy key can't be recovered from it.
function _M.key_id(api_key)
  if C.EVP_Digest(api_key, #api_key, digest, size, SHA256, nil) ~= 1 then
    error("EVP_Digest failed")
  end
  return (ffi.string(digest, 32):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- The 8 groups of an IPv6 address, or nil.
local function groups6(text)
  local v4 = text:match("(%d+%.%d+%.%d+%.%d+)$")
  if v4 then
    local a, b, c, d = v4:match("(%d+)%.(%d+)%.(%d+)%.(%d+)")
    text = text:sub(1, #text - #v4) .. string.format("%x:%x", a * 256 + b, c * 256 + d)
  end
  local head, tail = text:match("^(.-)::(.*)$")
  local parts = {}
  local function split(s, out)
    if s == "" then return out end
    for g in (s .. ":"):gmatch("([^:]*):") do out[#out + 1] = tonumber(g, 16) or 0 end
    return out
  end
  if head then
    local h, t = split(head, {}), split(tail, {})
    for _, g in ipairs(h) do parts[#parts + 1] = g end
    for _ = 1, 8 - #h - #t do parts[#parts + 1] = 0 end
    for _, g in ipairs(t) do parts[#parts + 1] = g end
  else
    split(text, parts)
  end
  return parts
end

-- The /64 an IPv6 address is in, compressed as Python's ipaddress writes
-- it (so both gateways name one client's bucket alike).
local function net64(text)
  local g = groups6(text)
  for i = 5, 8 do g[i] = 0 end
  -- The longest run of zero groups (at least two, the first on a tie) becomes "::".
  local best, best_len, i = nil, 1, 1
  while i <= 8 do
    if g[i] ~= 0 then
      i = i + 1
    else
      local j = i
      while j <= 8 and g[j] == 0 do j = j + 1 end
      if j - i > best_len then best, best_len = i, j - i end
      i = j
    end
  end
  local hex = {}
  for k = 1, 8 do hex[k] = string.format("%x", g[k]) end
  if not best then return table.concat(hex, ":") .. "/64" end
  return table.concat(hex, ":", 1, best - 1) .. "::" .. table.concat(hex, ":", best + best_len, 8) .. "/64"
end

-- The client's address as the IP bucket names it: IPv4 as it is (an
-- IPv4-mapped IPv6 address too), IPv6 per /64 (one subscriber usually
-- holds a whole /64). nginx's realip module has already walked
-- X-Forwarded-For from trusted proxies (GATEWAY_TRUSTED_PROXIES).
function _M.client_ip(addr)
  if addr == nil or addr == "" then return "unknown" end
  local mapped = addr:lower():match("^::ffff:(%d+%.%d+%.%d+%.%d+)$")
  if mapped then return mapped end
  if addr:find(":", 1, true) then return net64(addr:lower()) end
  return addr
end

return _M
