-- Runs the unit tests under plain LuaJIT, without nginx:
--   luajit test/luajit/run.lua [test/luajit/test_x.lua ...]   (from clients/openresty; all by default)
-- Each test file returns a table of name -> function; a test fails by
-- raising. Exits 1 when any failed.

package.path = "lib/?.lua;test/luajit/?.lua;" .. package.path

local files = { ... }
if #files == 0 then
  local p = io.popen("ls test/luajit/test_*.lua")
  for line in p:lines() do files[#files + 1] = line end
  p:close()
end

local passed, failed = 0, {}
for _, file in ipairs(files) do
  local tests = dofile(file)
  local names = {}
  for name in pairs(tests) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local ok, err = xpcall(tests[name], debug.traceback)
    if ok then
      passed = passed + 1
    else
      failed[#failed + 1] = file .. ": " .. name .. "\n" .. tostring(err)
    end
  end
end
for _, f in ipairs(failed) do io.stderr:write("FAIL ", f, "\n\n") end
print(string.format("%d passed, %d failed", passed, #failed))
os.exit(#failed == 0 and 0 or 1)
