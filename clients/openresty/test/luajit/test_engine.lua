local h = require "helpers"
local engine = require "resty.tokenbucket.engine"
local library = require "resty.tokenbucket.library"
local bucket = require("resty.tokenbucket.bucket").bucket

local T = {}
local B = bucket({ max = 10, rate = 1 })
local G = { { "rl:k", B, 1 } }

local function make(opts)
  opts = opts or {}
  local logs = {}
  opts.library = library
  opts.log = function(level, text) logs[#logs + 1] = level .. " " .. text end
  return engine.new(opts), logs
end

function T.the_module_first()
  local s = h.server()
  local e = make()
  local r = assert(e:call(s.send, "consume", G))
  h.eq(r, { 1, 9, 0, 1000 })
  h.eq(e.backend, "module")
  h.eq(s.sent, { "tb.consume" })
end

function T.without_the_module_the_library_is_checked_loaded_and_used()
  local s = h.server({ module = false })
  local e = make()
  h.eq(assert(e:call(s.send, "consume", G)), { 1, 9, 0, 1000 })
  h.eq(e.backend, "functions")
  h.eq(s.sent, { "tb.consume", "fcall_ro", "function", "fcall" }, "refused, tb_version, FUNCTION LOAD, FCALL")
  h.eq(s.loads, 1)
  e:call(s.send, "consume", G)
  h.eq(#s.sent, 5, "one FCALL from then on")
end

function T.its_own_library_already_there_is_not_loaded_again()
  local s = h.server({ module = false, library_version = library.version })
  local e = make()
  e:call(s.send, "consume", G)
  h.eq(s.loads, 0)
end

function T.a_stale_or_foreign_library_is_replaced()
  for _, there in ipairs({ "0.0.1+000000000000", "someone else's" }) do
    local s = h.server({ module = false, library_version = there })
    local e = make()
    e:call(s.send, "consume", G)
    h.eq(s.loads, 1, there)
    h.eq(s.library_version, library.version)
  end
end

function T.where_function_is_refused_the_eval_script_with_noscript_then_eval()
  local s = h.server({ module = false, functions = false })
  local e = make()
  h.eq(assert(e:call(s.send, "consume", G)), { 1, 9, 0, 1000 })
  h.eq(e.backend, "eval")
  h.eq(s.sent, { "tb.consume", "fcall_ro", "evalsha", "eval" })
  e:call(s.send, "consume", G)
  h.eq(s.sent[#s.sent], "evalsha", "cached from then on")
end

function T.no_backend_at_all_is_a_usage_error_naming_each()
  local s = h.server({ module = false, functions = false, eval = false })
  local e = make()
  local r, err = e:call(s.send, "consume", G)
  h.eq(r, nil)
  h.ok(err.usage and err.no_backend, "usage")
  h.ok(err.usage:find("module: ERR unknown command", 1, true), err.usage)
  h.ok(err.usage:find("eval: NOPERM", 1, true), err.usage)
end

function T.a_burst_of_concurrent_first_calls_loads_the_library_once()
  local s = h.server({ module = false })
  local e = make()
  -- FUNCTION LOAD and tb_version yield, as a cosocket does.
  local waiting = {}
  local send = function(args, key)
    if args[1] == "FUNCTION" or args[2] == "tb_version" then
      waiting[#waiting + 1] = coroutine.running()
      coroutine.yield()
    end
    return s.send(args, key)
  end
  local results = {}
  local cos = {}
  for i = 1, 5 do
    cos[i] = coroutine.create(function() results[i] = e:call(send, "consume", { { "rl:k" .. i, B, 1 } }) end)
    assert(coroutine.resume(cos[i]))
  end
  while #waiting > 0 do assert(coroutine.resume(table.remove(waiting, 1))) end
  for i = 1, 5 do h.eq(results[i], { 1, 9, 0, 1000 }, "call " .. i) end
  h.eq(s.loads, 1)
  local evals = 0
  for _, name in ipairs(s.sent) do if name == "evalsha" or name == "eval" then evals = evals + 1 end end
  h.ok(evals >= 4, "the others answered through the EVAL script")
end

function T.a_backend_lost_is_found_again()
  local s = h.server()
  local e, logs = make()
  e:call(s.send, "consume", G)
  h.eq(e.backend, "module")
  s.module = false -- a failover to a node without the module
  h.eq(assert(e:call(s.send, "consume", G)), { 1, 8, 0, 2000 })
  h.eq(e.backend, "functions")
  h.ok(logs[#logs - 1]:find("gone", 1, true) or logs[#logs - 2]:find("gone", 1, true), "logged")
  s.library_version = nil -- FUNCTION FLUSH
  h.eq(assert(e:call(s.send, "consume", G)), { 1, 7, 0, 3000 })
  h.eq(s.loads, 2, "loaded again after the flush")
end

function T.a_library_lost_forgets_what_was_checked()
  local s = h.server({ module = false })
  local e = make()
  e:call(s.send, "consume", G)
  s.functions, s.module = false, true -- another node: the module, no FUNCTION
  e:call(s.send, "consume", G)
  h.eq(e.backend, "module")
  h.eq(next(e.checked), nil)
end

function T.a_forced_backend_that_is_refused_is_no_backend()
  local s = h.server({ module = false })
  local e = make({ backend = "module" })
  local _, err = e:call(s.send, "consume", G)
  h.ok(err.no_backend, "no backend")
end

function T.errors_that_are_not_refusals_are_returned_as_they_are()
  local s = h.server()
  local e = make()
  s.errors = { { socket = "connection refused", op = "connect" } }
  local r, err = e:call(s.send, "consume", G)
  h.eq(r, nil)
  h.eq(err.socket, "connection refused")
  h.eq(e.backend, nil, "still unknown")
end

function T.each_op_is_spelled_per_backend()
  local scripts = require "resty.tokenbucket.scripts"
  local g2 = { { "a", B, 1 }, { "b", B, 2.5 } }
  h.eq(scripts.module_args("mconsume", g2), { "tb.mconsume", "a", "10", "1", "1", "b", "10", "1", "2.5" })
  h.eq(scripts.fcall_args("mconsume", g2), { "FCALL", "tb_mconsume", "2", "a", "b", "10", "1", "1", "10", "1", "2.5" })
  h.eq(scripts.eval_tail("peek", { g2[1] }), { "1", "a", "peek", "10", "1", "1" })
  local lease = { "s", { "8", "30000", "id", "1" } }
  h.eq(scripts.module_args("acquire", g2, lease),
    { "tb.acquire", "s", "8", "30000", "id", "1", "BUCKET", "a", "10", "1", "1", "BUCKET", "b", "10", "1", "2.5" })
  h.eq(scripts.fcall_args("acquire", g2, lease),
    { "FCALL", "tb_acquire", "3", "s", "a", "b", "8", "30000", "id", "1", "10", "1", "1", "10", "1", "2.5" })
  h.eq(scripts.eval_tail("release", {}, { "s", { "id" } }), { "1", "s", "release", "id" })
end

return T
