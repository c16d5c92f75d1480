-- `uvmrec test [--gpu] [busted options] [specs...]`: the spec suite of the tree this command
-- belongs to (a checkout or dist/), run by this command from the tree's root, where specs that
-- need a source checkout find it or go pending.  --gpu runs only the #cuda specs and fails them
-- when no GPU is in use.  Spec paths are relative to the tree's root.
local host = package.loaded["uvmrec.host"]
if not host then
  error("scripts/test.lua runs under the uvmrec command: `uvmrec test`", 0)
end
if not host.spec then
  io.stderr:write(("uvmrec test: this tree (%s, %s) has no spec suite; run it from a checkout " ..
    "(make test) or a dist tree (dist/bin/uvmrec test)\n"):format(host.layout, host.root or "?"))
  os.exit(2)
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local env, args = { "UVMREC_BIN=" .. quote(host.binary) }, {}
for i = 1, #arg do
  if arg[i] == "--gpu" then
    env[#env + 1] = "UVMREC_REQUIRE_GPU=1"
    args[#args + 1] = "--tags=cuda"
  else
    args[#args + 1] = quote(arg[i])
  end
end

-- A child process: the suite reads UVMREC_REQUIRE_GPU from its environment, and runs from the
-- tree's root.
local cmd = ("cd %s && %s exec %s spec/run.lua %s"):format(quote(host.root), table.concat(env, " "),
  quote(host.binary), table.concat(args, " "))
io.stdout:flush()
local rc = os.execute(cmd)
-- LuaJIT returns system()'s wait status (or true/false with 5.2 extensions).
if rc == true or rc == 0 then os.exit(0) end
if type(rc) == "number" and rc % 256 == 0 then os.exit(rc / 256) end
os.exit(1)
