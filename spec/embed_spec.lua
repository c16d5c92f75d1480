-- The example host programs, built through pkg-config against a temporary `make install`.
local cmd = require "command"

local q = cmd.quote

-- Why this machine cannot run these specs, or nil.
local function unable()
  if not io.open("Makefile") or not io.open("engine/examples/c_api.c") then
    return "not in a source tree"
  end
  for _, program in ipairs { "make", "cc", "pkg-config" } do
    if not cmd.have(program) then return "no " .. program end
  end
  if require("helpers").asan() then
    return "a sanitizer build (its programs need the runtimes preloaded, and valgrind cannot run them)"
  end
end

describe("embedding uvmrec in C", function()
  local why = unable()
  local prefix, dir

  setup(function()
    if why then return end
    prefix, dir = cmd.tmpdir(), cmd.tmpdir()
    -- The build under test: the folder holding bin/uvmrec.
    local build = cmd.bin():match("^(.*)/bin/uvmrec$") or "build"
    local out, err, code = cmd.sh(("env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s --no-print-directory " ..
      "install PREFIX=%s BUILD=%s"):format(q(prefix), q(build)))
    assert(code == 0, "make install failed:\n" .. out .. err)
  end)

  teardown(function()
    cmd.rmdir(prefix)
    cmd.rmdir(dir)
  end)

  -- Compiles an example (or the C file src) with `pkg-config --cflags --libs pc`; returns the
  -- program's path.
  local function build(name, pc, extra, src)
    local exe = dir .. "/" .. name
    local out, err, code = cmd.sh(("cc -std=c11 -Wall -Wextra -Werror %s " ..
      "$(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs %s) %s -Wl,-rpath,%s/lib -o %s"):format(
      q(src or "engine/examples/" .. name .. ".c"), q(prefix), pc, extra or "", q(prefix), q(exe)))
    assert.equal(0, code, out .. err)
    return exe
  end

  local function valgrind(exe, input, args)
    if not cmd.have("valgrind") then return pending("no valgrind") end
    local out, err, code = cmd.sh(("valgrind -q --error-exitcode=99 --leak-check=full " ..
      "--suppressions=spec/support/valgrind.supp " ..
      "--errors-for-leak-kinds=definite,indirect %s %s"):format(q(exe), args or ""), input)
    assert.equal(0, code, "valgrind:\n" .. err .. out)
  end

  it("installs the command, libraries, headers, Lua modules, scripts and pkg-config files", function()
    if why then return pending(why) end
    for _, f in ipairs { "bin/uvmrec", "lib/libuvmrec.a", "lib/libuvmrec.so", "lib/libuvmrec_lua.a",
                         "lib/libuvmrec_lua.so", "include/uvmrec.h", "include/uvmrec_lua.h",
                         "share/lua/5.1/uvmrec/init.lua", "share/lua/5.1/uvmrec/repl.lua",
                         "share/uvmrec/scripts/demo.lua", "lib/pkgconfig/uvmrec.pc",
                         "lib/pkgconfig/uvmrec-lua.pc" } do
      assert.truthy(io.open(prefix .. "/" .. f), f)
    end
    local out, err, code = cmd.sh(q(prefix .. "/bin/uvmrec") .. " -e " ..
      q("print(require('uvmrec.host').layout, package.searchpath('uvmrec', package.path))"))
    assert.equal(0, code, err)
    assert.equal("install\t" .. prefix .. "/share/lua/5.1/uvmrec/init.lua\n", out)
    out = cmd.sh(q(prefix .. "/bin/uvmrec") .. " --help")
    assert.equal(cmd.commands(prefix .. "/share/uvmrec/scripts"), cmd.listed(out), out)
  end)

  it("builds c_api.c with pkg-config uvmrec; it runs clean under valgrind", function()
    if why then return pending(why) end
    local exe = build("c_api", "uvmrec")
    local out, err, code = cmd.sh(q(exe))
    assert.equal(0, code, err)
    assert.matches("hot rows: bytes 0%.%.131072", out)
    assert.matches("tensor f32 %[4096, 64%] managed", out)
    assert.matches("hint log: %d+ records", out)
    valgrind(exe)
  end)

  it("builds lua_host.c with pkg-config uvmrec-lua; Lua drives the host's engine, clean under valgrind", function()
    if why then return pending(why) end
    local exe = build("lua_host", "uvmrec-lua")
    local out, err, code = cmd.sh("cd / && " .. q(exe))
    assert.equal(0, code, err .. out)
    assert.matches("mean of 8000 uniform draws made in Lua: 0%.", out)
    assert.matches("host bytes: (%d+) seen from Lua, %1 from C %(one engine%)", out)
    assert.matches("error reported: snippet:1: from Lua", out)
    valgrind(exe)
  end)

  it("refuses NULL to the Lua host's functions with UR_STATUS_INVALID, naming the argument", function()
    if why then return pending(why) end
    -- (capi_null_spec calls the headers' UR_CDEF blocks; these take a lua_State and are outside them)
    local src = cmd.spit(dir .. "/lua_nulls.c", [[
#include <stdio.h>
#include <uvmrec_lua.h>
static void show(const char *what, ur_status s) {
  printf("%s %s %s\n", what, s == UR_STATUS_INVALID ? "invalid" : "other", ur_lua_last_error());
}
int main(void) {
  show("open", ur_lua_open(NULL));
  show("pcall", ur_lua_pcall(NULL, 0, 0));
  show("dofile", ur_lua_dofile(NULL, "x.lua", 0));
  show("dostring", ur_lua_dostring(NULL, "return 1", NULL, 0));
  show("repl", ur_lua_repl(NULL));
  struct lua_State *L;
  if (ur_lua_open(&L)) return 1;
  show("code", ur_lua_dostring(L, NULL, NULL, 0));
  ur_lua_close(L);
  ur_lua_close(NULL);
  return 0;
}
]])
    local out, err, code = cmd.sh("cd / && " .. q(build("lua_nulls", "uvmrec-lua", nil, src)))
    assert.equal(0, code, err .. out)
    assert.equal(table.concat({
      "open invalid ur_lua_open: argument 'out' is NULL",
      "pcall invalid ur_lua_pcall: argument 'L' is NULL",
      "dofile invalid ur_lua_dofile: argument 'L' is NULL",
      "dostring invalid ur_lua_dostring: argument 'L' is NULL",
      "repl invalid ur_lua_repl: argument 'L' is NULL",
      "code invalid ur_lua_dostring: argument 'code' is NULL", "" }, "\n"), out)
  end)

  it("builds serve.c with pkg-config uvmrec; it scores Criteo lines as the tree's build does, clean under valgrind",
    function()
    if why then return pending(why) end
    local h = require "helpers"
    local model, missing = h.exported("criteo", { tables = "int4" })
    if not model then return pending(missing) end
    local lines = cmd.lines(h.fixture("criteo_raw_sample.tsv"), 40)
    local input = table.concat(lines, "\n") .. "\n"
    local exe = build("serve", "uvmrec", "-lpthread")
    local out, err, code = cmd.sh(q(exe) .. " --threads 2 --batch 16 " .. q(model), input)
    assert.equal(0, code, err)
    assert.equal(40, select(2, out:gsub("\n", "")))
    cmd.spit(dir .. "/lines.tsv", input)
    local want = cmd.sh(q(cmd.bin()) .. " predict " .. q(model) .. " --batch-size 16 --data criteo-tsv:" ..
                        q(dir .. "/lines.tsv"))
    assert.equal(want, out)
    valgrind(exe, input, "--threads 2 --batch 16 " .. q(model))
    build("serve_bench", "uvmrec", "-lpthread")
  end)

  it("uninstalls everything it installed", function()
    if why then return pending(why) end
    local out, err, code = cmd.sh(("env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s --no-print-directory " ..
      "uninstall PREFIX=%s"):format(q(prefix)))
    assert.equal(0, code, out .. err)
    local left = cmd.sh("find " .. q(prefix) .. " -type f")
    assert.equal("", left)
  end)
end)
