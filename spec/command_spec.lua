local cmd = require "command"
local ur = require "uvmrec"

local q = cmd.quote

describe("uvmrec command", function()
  it("prints its version, the CUDA build and the GPU it sees", function()
    local out, err, code = cmd.run("--version")
    assert.equal(0, code, err)
    assert.matches("^uvmrec " .. ur.version():gsub("%.", "%%.") .. " %(LuaJIT 2%.1", out)
    assert.matches("\nCUDA: [^\n]+\n", out)
    if ur.gpu() then
      assert.matches("\nGPU: cuda:0 " .. ur.device_props(0).name:gsub("%p", "%%%0"), out)
    else
      assert.matches("\nGPU: no GPU %(", out)
    end
    if ur.cuda_built() then assert.matches("CUDA: built, libuvmrec_cuda.so loads %(%S", out) end
  end)

  it("names the commit its tree was made from: a dist tree's DIST, else the checkout's HEAD", function()
    local dist = io.open("DIST", "rb")
    local want
    if dist then -- a `make dist` tree (dist-test): what its DIST says, even inside another checkout
      want = dist:read("*l"):match("made by make dist %(([^,)]+),")
      dist:close()
    else
      local p = io.popen("git rev-parse --short HEAD 2>/dev/null")
      want = p:read("*l")
      p:close()
      if not want then pending("neither a dist tree nor a git checkout") return end
    end
    local got = ur.commit()
    assert.is_truthy(got, "a commit")
    if not dist then got = got:gsub("%-dirty$", "") end -- a checkout with changes
    assert.equal(want, got)
  end)

  it("prints its usage and each command of its tree with its summary for --help", function()
    local out, err, code = cmd.run("--help")
    assert.equal(0, code, err)
    assert.matches("usage: uvmrec %[options%] %[script %[args%.%.%.%]%]", out)
    local names, bad = cmd.listed(out)
    assert.equal(cmd.commands("scripts"), names, out)
    assert.same({}, bad)
  end)

  it("prints each command's options for COMMAND --help, and names a wrong option or value, exit 2", function()
    for name in cmd.commands("scripts"):gmatch("[^, ]+") do
      local out, err, code = cmd.run(name .. " --help")
      assert.equal(0, code, name .. ": " .. err)
      assert.matches("^usage: uvmrec " .. name .. " ", out)
      assert.matches("\n   %-h, %-%-help ", out)
      if name ~= "test" then -- test hands options it does not know to busted (below)
        out, err, code = cmd.run(name .. " --no-such-option")
        assert.equal(2, code, name)
        assert.equal("", out)
        assert.matches("^uvmrec " .. name .. ": unknown option '%-%-no%-such%-option'\nusage: uvmrec " .. name, err)
      end
    end
    local out, err, code = cmd.run("env stray")
    assert.equal(2, code)
    assert.equal("", out)
    assert.equal("uvmrec env: takes no argument, not 'stray'\nusage: uvmrec env [-h]\n", err)
    out, err, code = cmd.run("train dlrm_tiny --steps ten")
    assert.equal(2, code)
    assert.equal("", out)
    assert.matches("^uvmrec train: %-%-steps: 'ten' is not a whole number", err)
  end)

  it("rejects a bad option or a missing argument with the usage and exit code 2", function()
    for _, c in ipairs { { "-z", "unknown option '%-z'" }, { "--frobnicate", "unknown option '%-%-frobnicate'" },
                         { "-e", "option '%-e' needs an argument" } } do
      local out, err, code = cmd.run(c[1])
      assert.equal(2, code, c[1])
      assert.equal("", out)
      assert.matches("^uvmrec: " .. c[2] .. "\nusage: uvmrec", err)
    end
  end)

  it("runs -e code and -l modules in order, as luajit does", function()
    local out, err, code = cmd.run("-e 'x = 20' -l uvmrec.repl -e " ..
      q("print(x + 1, package.loaded['uvmrec.repl'] ~= nil)"))
    assert.equal(0, code, err)
    assert.equal("21\ttrue\n", out)
  end)

  it("ends a failing chunk with its message and a traceback on stderr, exit code 1", function()
    local out, err, code = cmd.run("-e " .. q("local function f() error('boom') end f()"))
    assert.equal(1, code)
    assert.equal("", out)
    assert.matches("^uvmrec: %(command line%):1: boom\nstack traceback:\n", err)
    assert.matches("in function 'f'", err)
    out, err, code = cmd.run("-l no.such.module")
    assert.equal(1, code)
    assert.equal("", out)
    assert.matches("module 'no.such.module' not found", err)
  end)

  describe("with a script", function()
    local dir
    before_each(function() dir = cmd.tmpdir() end)
    after_each(function() cmd.rmdir(dir) end)

    it("gives it arg as luajit does and its exit code through os.exit", function()
      cmd.spit(dir .. "/s.lua", "print(arg[-1] ~= nil, arg[0], #arg, arg[1], arg[2], ...)\nos.exit(3)\n")
      local out, err, code = cmd.run("-e 'y = 1' " .. q(dir .. "/s.lua") .. " a 'b c'")
      assert.equal(3, code, err)
      assert.equal(("true\t%s/s.lua\t2\ta\tb c\ta\tb c\n"):format(dir), out)
    end)

    it("names itself to the script as the program to run another script with, -e or not (cli.interpreter)",
      function()
      cmd.spit(dir .. "/i.lua", "print(require('uvmrec.cli').interpreter())\n")
      for _, pre in ipairs { "", "-e 'y = 1' " } do
        local out, err, code = cmd.run(pre .. q(dir .. "/i.lua"))
        assert.equal(0, code, err)
        assert.equal(cmd.bin() .. "\n", out, pre)
      end
    end)

    it("reports a runtime error at the script's line, and a file that is not there", function()
      cmd.spit(dir .. "/bad.lua", "local x = 1\nlocal y = x + nil\n")
      local _, err, code = cmd.run(q(dir .. "/bad.lua"))
      assert.equal(1, code)
      assert.matches("^uvmrec: [^\n]*/bad%.lua:2: attempt to perform arithmetic on a nil value", err)
      assert.matches("stack traceback:", err)
      _, err, code = cmd.run(q(dir .. "/missing.lua"))
      assert.equal(1, code)
      assert.matches("cannot open [^\n]*missing%.lua", err)
    end)

    it("runs standard input as a script for `-`", function()
      local out, _, code = cmd.run("- x y", "print(arg[1], arg[2])")
      assert.equal(0, code)
      assert.equal("x\ty\n", out)
    end)

    it("enters the REPL after the script with -i", function()
      cmd.spit(dir .. "/s.lua", "answer = 42\n")
      local out, _, code = cmd.run("-i " .. q(dir .. "/s.lua"), "answer + 1\n")
      assert.equal(0, code)
      assert.equal("43\n", out)
    end)
  end)

  it("has every benchmark script declare its command line (uvmrec.cli)", function()
    local cli = require "uvmrec.cli"
    -- dofile'd by the benches
    local libraries = { ["parity_lib.lua"] = true, ["zipf_stream.lua"] = true, ["cache_run.lua"] = true }
    local p = io.popen("ls scripts/bench/*.lua")
    local n = 0
    for path in p:lines() do
      if not libraries[path:match("[^/]+$")] then
        local c, err = cli.describe(path)
        assert.truthy(c, err)
        assert.equal(path, c.name)
        n = n + 1
      end
    end
    p:close()
    assert.is_true(n >= 13, n .. " benchmark scripts")
  end)

  it("names the flag that gave a config value, not a --set the user did not write (lib.flag_set)", function()
    local lib = require "uvmrec.lib"
    local big = "1000000000000000019884624838656"
    assert.same({ "train.batch_size=" .. big, flag = "--batch " .. big },
                lib.flag_set("--batch", "train.batch_size", 1e30))
    assert.same({ "model.precision=bf16", flag = "--precision bf16" },
                lib.flag_set("--precision", "model.precision", "bf16"))
    -- each said '--set train.batch_size=3000000000: ...' (and 1e30 read '1e+30'), or 'data.eval: ...' for --data
    for _, case in ipairs {
      { "scripts/bench/dlrm.lua --cpu --steps 2 --batch 3000000000",
        "--batch 3000000000: train.batch_size: '3000000000' is not an integer <= 16777216" },
      { "scripts/bench/uvm.lua --cpu --config dlrm_tiny --batch 3000000000",
        "--batch 3000000000: train.batch_size: '3000000000' is not an integer <= 16777216" },
      { "eval dlrm_tiny --cpu --data bogus:x", "uvmrec eval: --data bogus:x: data.eval: 'bogus:x' is not a data spec" },
      { "train dlrm_tiny --cpu --eval-data bogus:x",
        "uvmrec train: --eval-data bogus:x: data.eval: 'bogus:x' is not a data spec" },
    } do
      local out, err, code = cmd.run(case[1])
      assert.equal(1, code, case[1] .. "\n" .. out .. err)
      assert.matches(case[2], err, 1, true)
      assert.is_nil(err:find("--set", 1, true), err)
    end
  end)

  it("hands busted the arguments of `uvmrec test` that are not its own", function()
    local out, err, code = cmd.run("test --help")
    assert.equal(0, code, err)
    assert.matches("^usage: uvmrec test %[%-h%] %[%-%-gpu%]", out)
    out, err, code = cmd.run("test --no-such-option")
    assert.equal(1, code)
    assert.equal("", out)
    assert.equal("busted: error: unknown/bad flag: --no-such-option; re-run with --help for usage.\n", err)
    out, err, code = cmd.run("test -- --version")
    assert.equal(0, code, err)
    assert.matches("^%d+%.%d+%.%d+\n$", out)
  end)

  it("runs scripts/NAME.lua for `uvmrec NAME`, with the arguments after the name", function()
    local out, err, code = cmd.run("demo 4096")
    assert.equal(0, code, err)
    assert.matches("table:  tensor f32 %[4096, 128%] managed", out)
  end)

  it("says in convert's README.txt the dtype each sparse file holds (<u4 once a size passes 2^31)", function()
    local dir = cmd.tmpdir()
    local sample = q(require("helpers").fixture("criteo_raw_sample2.tsv"))
    for _, c in ipairs { { "--rows 1000", "<i4", " mod rows (1000)" },
                         { "--rows 4294967296", "<u4", " mod rows (4294967296)" },
                         { "", "<u4", " (raw)" } } do
      local out = dir .. "/days" .. #c[1]
      local _, err, code = cmd.run(("convert %s --out %s %s"):format(sample, q(out), c[1]))
      assert.equal(0, code, err)
      local info = assert(ur.data.npy_header(io.open(out .. "/day_0_sparse.npy", "rb"):read(128)))
      assert.equal(c[2], info.descr)
      local readme = io.open(out .. "/README.txt"):read("*a")
      assert.matches("; sparse " .. c[2] .. " [N,26] = C1..C26 hex as uint32" .. c[3] .. "; labels", readme, 1, true)
    end
    cmd.rmdir(dir)
  end)

  it("rewrites a day's line in convert's README.txt when the day is converted again, keeping the others", function()
    -- it appended: converting into the folder again left two lines for day_0 that said different things
    local dir = cmd.tmpdir()
    local h = require "helpers"
    local s1, s2 = h.fixture("criteo_raw_sample.tsv"), h.fixture("criteo_raw_sample2.tsv")
    local out = dir .. "/days"
    local function convert(args)
      local _, err, code = cmd.run(("convert %s --out %s"):format(args, q(out)))
      assert.equal(0, code, err)
      local lines = {}
      for l in io.lines(out .. "/README.txt") do lines[#lines + 1] = l end
      return lines
    end
    local function said(day, path, descr, rows)
      return ("day_%d_*.npy from %s: dense <f4 [N,13] = log(max(x,0)+1) of I1..I13 (empty = 0); sparse %s [N,26] = "
              .. "C1..C26 hex as uint32%s; labels <i4 [N]"):format(day, path, descr, rows)
    end
    assert.same({ said(0, s2, "<i4", " mod rows (1000)") }, convert(q(s2) .. " --rows 1000"))
    local f = assert(io.open(out .. "/README.txt", "a"))
    f:write("notes by hand\n")
    f:close()
    assert.same({ "notes by hand", said(0, s2, "<u4", " (raw)"), said(1, s1, "<u4", " (raw)") },
      convert(("%s %s --days 1,0"):format(q(s1), q(s2))))
    assert.same({ "notes by hand", said(0, s2, "<u4", " (raw)"), said(1, s1, "<i4", " mod rows (1000)") },
      convert(("%s --days 1 --rows 1000"):format(q(s1))))
    cmd.rmdir(dir)
  end)

  it("lists the commands for an unknown one, exit code 2", function()
    local out, err, code = cmd.run("frobnicate --x")
    assert.equal(2, code)
    assert.equal("", out)
    assert.matches("'frobnicate' is not a command; the commands are: " .. cmd.commands("scripts"), err, 1, true)
  end)

  it("holds the engine itself: the FFI finds ur_* in the program, not in a second library", function()
    local out, err, code = cmd.run("-e " .. q("print(require('uvmrec').C == require('ffi').C)"))
    assert.equal(0, code, err)
    assert.equal("true\n", out)
  end)

  it("finds its tree from any folder and through PATH, ignoring LUA_PATH for its own modules", function()
    local bin = cmd.bin()
    local bindir = bin:match("^(.*)/[^/]*$")
    if not bin:match("^/") then pending("UVMREC_BIN is not an absolute path") return end
    local probe = q("local h = require('uvmrec.host'); print(h.layout, h.root, " ..
      "package.searchpath('uvmrec', package.path), require('uvmrec').cuda_built())")
    local direct = cmd.sh("cd / && " .. q(bin) .. " -e " .. probe)
    local via_path, err, code = cmd.sh("cd / && env PATH=" .. q(bindir) .. ":/usr/bin:/bin " ..
      "LUA_PATH='/nowhere/?.lua' uvmrec -e " .. probe)
    assert.equal(0, code, err)
    assert.equal(direct, via_path)
    local layout, root, found = direct:match("^(%S+)\t(%S+)\t(%S+)\t")
    assert.truthy(layout, direct)
    assert.equal(root .. "/" .. (layout == "install" and "share/lua/5.1" or "lua") .. "/uvmrec/init.lua",
      found)
  end)

  it("uses only its own tree's paths when it is a dist tree", function()
    local out, err, code = cmd.run("-e " ..
      q("local h = require('uvmrec.host'); print(h.self_contained, package.path, package.cpath)"))
    assert.equal(0, code, err)
    local self_contained, path, cpath = out:match("^(%S+)\t(%S+)\t(%S+)\n$")
    if self_contained ~= "true" then
      assert.matches("/usr/share/lua/5.1/?.lua", path, 1, true) -- LuaJIT's defaults follow the tree's
      return
    end
    for entry in (path .. ";" .. cpath):gmatch("[^;]+") do
      assert.is_nil(entry:find("/usr/", 1, true), entry)
      assert.matches("^/", entry)
    end
  end)

  it("prints paths for plain luajit with `uvmrec env`, and they load the engine", function()
    local exports, err, code = cmd.run("env")
    if cmd.run("-e " .. q("io.write(require('uvmrec.host').layout)")) == "dist" then
      assert.equal(1, code)
      assert.matches("a dist tree has the engine only inside this program", err)
      return
    end
    assert.equal(0, code, err)
    assert.matches("^export LUA_PATH='[^']+;;' LUA_CPATH='[^']+;;'\n$", exports)
    if not cmd.have("luajit") then pending("no luajit on PATH") return end
    local out
    out, err, code = cmd.sh("env -u LUA_PATH -u LUA_CPATH sh -c " .. q(exports:gsub("\n", "") ..
      "; cd / && luajit -e \"local ur = require 'uvmrec'; print(ur.uvm_tensor({1024, 128}))\""))
    assert.equal(0, code, err)
    assert.matches("^tensor f32 %[1024, 128%] managed", out)
  end)
end)
