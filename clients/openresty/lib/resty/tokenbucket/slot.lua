-- Redis Cluster key slots: CRC16 (XMODEM) of the key, or of its hash tag
-- (the part between the first "{" and the next "}", when not empty),
-- modulo 16384. Keys that share a tag share a slot, so one TB.MCONSUME or
-- TB.ACQUIRE can reach them all: rl:streams:{alice}, rl:user:{alice}.
-- Plain Lua (LuaJIT's bit library).

local bit = require "bit"

local band, bxor, lshift, rshift = bit.band, bit.bxor, bit.lshift, bit.rshift
local byte, find, sub = string.byte, string.find, string.sub

local _M = {}

local TABLE = {}
for i = 0, 255 do
  local crc = lshift(i, 8)
  for _ = 1, 8 do
    if band(crc, 0x8000) ~= 0 then
      crc = band(bxor(lshift(crc, 1), 0x1021), 0xffff)
    else
      crc = band(lshift(crc, 1), 0xffff)
    end
  end
  TABLE[i] = crc
end

function _M.crc16(s)
  local crc = 0
  for i = 1, #s do
    crc = band(bxor(lshift(crc, 8), TABLE[bxor(rshift(crc, 8), byte(s, i))]), 0xffff)
  end
  return crc
end

-- The part of `key` Redis hashes.
function _M.hashed(key)
  local open = find(key, "{", 1, true)
  if open then
    local close = find(key, "}", open + 1, true)
    if close and close > open + 1 then return sub(key, open + 1, close - 1) end
  end
  return key
end

function _M.of(key)
  return _M.crc16(_M.hashed(key)) % 16384
end

return _M
