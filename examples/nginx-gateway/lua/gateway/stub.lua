-- The stub model the gateway proxies chats to, served by the same nginx
-- (its own server on a unix socket): it echoes the prompt backwards, one
-- token per word, at most max_tokens, as the FastAPI example's llm.py
-- does, whole or as server-sent events. Deterministic, no network.
--
-- Test hooks, sent by the gateway's tests through the gateway:
--   X-Stub-Fail-After: N   the model dies after N tokens: the connection
--                          is cut mid-answer, as a crashed model server's.

local cjson = require "cjson.safe"
local json = require "resty.tokenbucket.json"

local _M = {}

-- Whitespace words as tokens: stands in for the model's tokenizer, which
-- the gateway must use to reserve (llm.py's count_tokens).
function _M.count_tokens(text)
  local n = 0
  for _ in text:gmatch("%S+") do n = n + 1 end
  return n
end

local function words_backwards(prompt, max_tokens)
  local words = {}
  for w in prompt:gmatch("%S+") do table.insert(words, 1, w) end
  local out = {}
  for i = 1, math.min(#words, max_tokens) do out[i] = words[i] end
  return out
end

-- {"usage": {...}} as the FastAPI example's json.dumps writes it.
local function usage(prompt_tokens, completion_tokens, reserved)
  return string.format('"usage": {"prompt_tokens": %d, "completion_tokens": %d, "reserved_tokens": %d}',
    prompt_tokens, completion_tokens, reserved)
end

function _M.serve(settings)
  ngx.req.read_body()
  local body = cjson.decode(ngx.req.get_body_data() or "")
  if type(body) ~= "table" then return ngx.exit(400) end
  local tokens = words_backwards(body.prompt, body.max_tokens)
  local reserved = tonumber(ngx.var.http_x_reserved_tokens) or 0
  local fail_after = tonumber(ngx.var.http_x_stub_fail_after)
  local delay = (settings.stub_token_delay_ms or 0) / 1000
  local prompt_tokens = _M.count_tokens(body.prompt)
  if not body.stream then
    if fail_after then return ngx.exit(502) end
    ngx.header["Content-Type"] = "application/json"
    ngx.print('{"text":', json.quote(table.concat(tokens, " ")), ',"usage":{"prompt_tokens":', prompt_tokens,
      ',"completion_tokens":', #tokens, ',"reserved_tokens":', reserved, "}}")
    return
  end
  ngx.header["Content-Type"] = "text/event-stream"
  for i = 1, #tokens do
    if fail_after and i > fail_after then
      ngx.flush(true)
      return ngx.exit(444) -- cut the connection, mid-answer
    end
    if delay > 0 then ngx.sleep(delay) end
    ngx.print('data: {"token": ', json.quote(tokens[i]), "}\n\n")
    local ok = ngx.flush(true)
    if not ok then return end -- the gateway went away (its client did)
  end
  ngx.print("data: {", usage(prompt_tokens, #tokens, reserved), "}\n\n", "data: [DONE]\n\n")
end

return _M
