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
  quota = { "FCALL", "tb_quota" },
  qpeek = { "FCALL_RO", "tb_qpeek" },
  qadjust = { "FCALL", "tb_qadjust" },
  charge = { "FCALL", "tb_charge" },
}
_M.FUNCTIONS = FUNCTIONS

-- A call names the bucket operation; a quota is charged by its own
-- command, and several rules of which one is a quota (or with a wait) by
-- TB.CHARGE.
local QUOTA_OPS = { consume = "quota", peek = "qpeek", adjust = "qadjust" }
function _M.wire_op(op, groups, after)
  if op == "mconsume" then
    if after and #after > 0 then return "charge" end
    for i = 1, #groups do
      if groups[i][2].kind == "quota" then return "charge" end
    end
    return op
  end
  if #groups == 1 and groups[1][2].kind == "quota" then return QUOTA_OPS[op] or op end
  return op
end

-- A rule's arguments after its key: `max rate amount`, or a quota's
-- `limit period amount [OFFSET m]`; with `clause`, TB.CHARGE's keyword first.
local function append_rule(out, rule, amount, clause)
  if clause then out[#out + 1] = rule.kind == "quota" and "QUOTA" or "BUCKET" end
  out[#out + 1] = rule.args[1]
  out[#out + 1] = rule.args[2]
  out[#out + 1] = encode(amount)
  local after = rule.after
  for i = 1, #after do out[#out + 1] = after[i] end
end

local function append(out, list)
  if list then
    for i = 1, #list do out[#out + 1] = list[i] end
  end
  return out
end

-- ARGV of a bucket or quota operation: each group's rule and amount, then
-- `after` (WAIT max_ms); tb_charge's WAIT goes first, then its clauses.
local function append_arguments(out, op, groups, after)
  if op == "charge" then
    append(out, after)
    for i = 1, #groups do append_rule(out, groups[i][2], groups[i][3], true) end
  elseif #groups == 1 then
    append_rule(out, groups[1][2], groups[1][3])
    append(out, after)
  else
    for i = 1, #groups do append_rule(out, groups[i][2], groups[i][3]) end
  end
  return out
end

-- FCALL_RO tb_version 0: the version of the library a server has loaded.
_M.VERSION_ARGS = { "FCALL_RO", "tb_version", "0" }

-- Each group's `max rate amount`, after its key when with_keys.
local function append_limits(out, groups, with_keys)
  for i = 1, #groups do
    local g = groups[i]
    if with_keys then out[#out + 1] = g[1] end
    out[#out + 1] = g[2].args[1]
    out[#out + 1] = g[2].args[2]
    out[#out + 1] = encode(g[3])
  end
end

local function has_quota(groups)
  for i = 1, #groups do
    if groups[i][2].kind == "quota" then return true end
  end
  return false
end

-- tb_acquire's clauses: with a quota among them, as tb_charge's; of
-- buckets alone, `max rate cost` each, the form every version of the
-- library reads.
local function append_lease_clauses(out, groups)
  if not has_quota(groups) then return append_limits(out, groups) end
  for i = 1, #groups do append_rule(out, groups[i][2], groups[i][3], true) end
end

-- TB.<OP> key max rate amount [key max rate amount ...] (a quota's `key
-- limit period amount [OFFSET m]`) then `after` (WAIT max_ms); TB.CHARGE
-- numkeys key... [WAIT max_ms] clause...; for a lease operation TB.<OP>
-- key head... [BUCKET bkey max rate cost | QUOTA qkey limit period cost
-- [OFFSET m] ...].
function _M.module_args(op, groups, lease, after)
  local out = { contract.COMMANDS[op] }
  if lease then
    out[2] = lease[1]
    local head = lease[2]
    for i = 1, #head do out[#out + 1] = head[i] end
    for i = 1, #groups do
      local g = groups[i]
      out[#out + 1] = g[2].kind == "quota" and "QUOTA" or "BUCKET"
      out[#out + 1] = g[1]
      append_rule(out, g[2], g[3])
    end
    return out
  end
  if op == "charge" then
    out[2] = tostring(#groups)
    for i = 1, #groups do out[#out + 1] = groups[i][1] end
    return append_arguments(out, op, groups, after)
  end
  if #groups == 1 then
    out[2] = groups[1][1]
    return append_arguments(out, op, groups, after)
  end
  append_limits(out, groups, true)
  return out
end

-- Lua takes keys and arguments apart: every key first (for a lease
-- operation the lease key, then the clause keys), then the head, then
-- each key's rule, in the same order.
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

-- FCALL tb_<op> numkeys key... [head...] max rate amount ... [WAIT max_ms]
function _M.fcall_args(op, groups, lease, after)
  local f = FUNCTIONS[op]
  local out = keys_then_args({ f[1], f[2] }, groups, lease)
  if lease then
    append(out, lease[2])
    append_lease_clauses(out, groups)
    return out
  end
  return append_arguments(out, op, groups, after)
end

-- What follows EVALSHA <sha> (or EVAL <source>): numkeys key... <op>
-- [head...] max rate amount ...: the operation named as in FCALL
-- tb_<op>. Plain EVALSHA for peek and inflight too (EVALSHA_RO needs
-- Redis 7; this backend is mostly for Redis 6.2).
function _M.eval_tail(op, groups, lease, after)
  local out = keys_then_args({}, groups, lease)
  out[#out + 1] = op
  if lease then
    append(out, lease[2])
    append_lease_clauses(out, groups)
    return out
  end
  return append_arguments(out, op, groups, after)
end

return _M
