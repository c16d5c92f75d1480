-- Runs the busted specs under LuaJIT and ends with one line: N passed, N failed, N skipped.
-- Usage: luajit spec/run.lua [busted options] [specs...]   (make test sets the paths)
local dir = (arg[0]:match("^(.*)/[^/]*$") or ".")
package.path = dir .. "/support/?.lua;" .. dir .. "/?.lua;" .. package.path

-- Only the GPU specs, and no GPU in use: one line saying so, not a failure per spec.
if os.getenv("UVMREC_REQUIRE_GPU") == "1" then
  local ur = require "uvmrec"
  if not ur.gpu() then
    io.stderr:write("the GPU specs need a GPU, and none is in use: ", ur.cuda_error(), "\n")
    print("0 passed, 1 failed, 0 skipped")
    os.exit(1)
  end
end

-- One load of every module for the whole run: busted's default reloads the modules a spec file
-- required before the next file (auto-insulate), while the engine's FFI types outlive the reload.
local args = { "--output=summary", "--no-auto-insulate" }
for i = 1, #arg do args[#args + 1] = arg[i] end
if #arg == 0 or arg[#arg]:match("^%-") then args[#args + 1] = dir end
-- busted reads the global arg table: hand it ours.
for i = 1, #arg do arg[i] = nil end -- luacheck: ignore 122
for i, a in ipairs(args) do arg[i] = a end -- luacheck: ignore 122

-- Called through pcall, busted's runner ends a failed run (or a bad option) with os.exit(1);
-- called directly it would raise an error without a message, its way on Lua 5.1, which the
-- command reports as "(error object is a nil value)".
local ok, err = pcall(require "busted.runner", { standalone = false })
if not ok then error(err, 0) end
