-- `uvmrec test`: the spec suite of the tree this command belongs to (a checkout or dist/), run by
-- this command from the tree's root, where specs that need a source checkout find it or go
-- pending.  --gpu runs only the #cuda specs and fails them when no GPU is in use.  Every other
-- argument goes to busted (spec/run.lua) as it is; spec paths are relative to the tree's root.
local cmd = require("uvmrec.cli").command {
  name = "test",
  summary = "run the spec suite of this tree (busted, from the tree's root); --gpu: only the GPU specs",
  description = "Other arguments go to busted as they are: its options (--filter=PATTERN, --tags=TAG, "
    .. "--list, ...; `uvmrec test -- --help` shows them) and spec files or folders.",
  { "--gpu", "only the #cuda specs, failing them when no GPU is in use" },
  { "[BUSTED...]", "busted's options and the specs to run (default: spec/)", rest = true },
}
local o = cmd:parse(arg)

local host = package.loaded["uvmrec.host"]
if not host then cmd:fail("scripts/test.lua runs under the uvmrec command: `uvmrec test`") end
if not host.spec then
  cmd:fail(("this tree (%s, %s) has no spec suite; run it from a checkout (make test) or a dist tree "
    .. "(dist/bin/uvmrec test)"):format(host.layout, host.root or "?"))
end

local quote = require("uvmrec.lib").shell_quote

local env, args = { "UVMREC_BIN=" .. quote(host.binary) }, {}
if o.gpu then
  env[#env + 1] = "UVMREC_REQUIRE_GPU=1"
  args[#args + 1] = "--tags=cuda"
end
for _, a in ipairs(o.busted) do args[#args + 1] = quote(a) end

-- A child process: the suite reads UVMREC_REQUIRE_GPU from its environment, and runs from the
-- tree's root.
local line = ("cd %s && %s exec %s spec/run.lua %s"):format(quote(host.root), table.concat(env, " "),
  quote(host.binary), table.concat(args, " "))
io.stdout:flush()
local rc = os.execute(line)
-- LuaJIT returns system()'s wait status (or true/false with 5.2 extensions).
if rc == true or rc == 0 then os.exit(0) end
if type(rc) == "number" and rc % 256 == 0 then os.exit(rc / 256) end
os.exit(1)
