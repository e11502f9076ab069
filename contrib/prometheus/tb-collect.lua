-- Collect script for redis_exporter's -script flag: every numeric field of
-- `INFO tb` (tb_admitted, tb_denied, ... and whatever counters later
-- versions add) becomes redis_script_values{key="tb_..."}.
--
-- The exporter (1.45) reports redis_up 0 when its script fails or returns
-- a value it can't parse as a float, so this script never fails: on a
-- server without the module `INFO tb` is empty and it returns nothing, and
-- it passes on plain decimal values only (tb_version is not a number).
-- No shebang, so it also runs on Redis 6.2; it only reads.
local out = {}
for line in string.gmatch(redis.call('INFO', 'tb'), '[^\r\n]+') do
  local name, value = string.match(line, '^(tb_[%w_]+):(%-?%d+%.?%d*)$')
  if name then
    out[#out + 1] = name
    out[#out + 1] = value
  end
end
return out
