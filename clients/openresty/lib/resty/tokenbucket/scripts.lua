-- How each operation is spelled on each backend: the one place that knows
-- the module's commands, the library's function names and the EVAL
-- script's calling convention (docs/fallback.md), as the Python package's
-- _scripts.py. A group is {key, bucket, amount} (checked); a lease head is
-- {key, args}: `limit lease_ms id weight` (acquire), `id` (release), `id
-- lease_ms` (renew), none (inflight). Plain Lua.

local contract = require "resty.tokenbucket.contract"
local encode = require("resty.tokenbucket.bucket").encode

local tostring = tostring

local _M = {}

-- FCALL_RO for the read-only ones, so they also run on replicas.
local FUNCTIONS = {
  consume = { "FCALL", "tb_consume" },
  peek = { "FCALL_RO", "tb_peek" },
  adjust = { "FCALL", "tb_adjust" },
  mconsume = { "FCALL", "tb_mconsume" },
  acquire = { "FCALL", "tb_acquire" },
  release = { "FCALL", "tb_release" },
  renew = { "FCALL", "tb_renew" },
  inflight = { "FCALL_RO", "tb_inflight" },
}
_M.FUNCTIONS = FUNCTIONS

-- FCALL_RO tb_version 0: the version of the library a server has loaded.
_M.VERSION_ARGS = { "FCALL_RO", "tb_version", "0" }

-- Each group's `max rate amount`, after its key when with_keys, and
-- after "BUCKET" when marked.
local function append_limits(out, groups, with_keys, mark)
  for i = 1, #groups do
    local g = groups[i]
    if mark then out[#out + 1] = mark end
    if with_keys then out[#out + 1] = g[1] end
    out[#out + 1] = g[2].args[1]
    out[#out + 1] = g[2].args[2]
    out[#out + 1] = encode(g[3])
  end
end

-- TB.<OP> key max rate amount [key max rate amount ...], or for a lease
-- operation TB.<OP> key head... [BUCKET bkey max rate cost ...].
function _M.module_args(op, groups, lease)
  local out = { contract.COMMANDS[op] }
  if lease then
    out[2] = lease[1]
    local head = lease[2]
    for i = 1, #head do out[#out + 1] = head[i] end
    append_limits(out, groups, true, "BUCKET")
    return out
  end
  append_limits(out, groups, true)
  return out
end

-- Lua takes keys and arguments apart: every key first (for a lease
-- operation the lease key, then the bucket keys), then the head, then one
-- `max rate amount` group per bucket key, in the same order.
local function keys_then_args(out, groups, lease)
  if lease then
    out[#out + 1] = tostring(1 + #groups)
    out[#out + 1] = lease[1]
  else
    out[#out + 1] = tostring(#groups)
  end
  for i = 1, #groups do out[#out + 1] = groups[i][1] end
  return out
end

-- FCALL tb_<op> numkeys key... [head...] max rate amount ...
function _M.fcall_args(op, groups, lease)
  local f = FUNCTIONS[op]
  local out = keys_then_args({ f[1], f[2] }, groups, lease)
  if lease then
    local head = lease[2]
    for i = 1, #head do out[#out + 1] = head[i] end
  end
  append_limits(out, groups)
  return out
end

-- What follows EVALSHA <sha> (or EVAL <source>): numkeys key... <op>
-- [head...] max rate amount ...: the operation named as in FCALL
-- tb_<op>. Plain EVALSHA for peek and inflight too (EVALSHA_RO needs
-- Redis 7; this backend is mostly for Redis 6.2).
function _M.eval_tail(op, groups, lease)
  local out = keys_then_args({}, groups, lease)
  out[#out + 1] = op
  if lease then
    local head = lease[2]
    for i = 1, #head do out[#out + 1] = head[i] end
  end
  append_limits(out, groups)
  return out
end

return _M
