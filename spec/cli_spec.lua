local cli = require "uvmrec.cli"
local command = require "command"

local function decl(extra)
  local d = {
    name = "tool",
    summary = "does things to FILES",
    { "FILES...", "the files" },
    { "--out DIR", "where results go" },
    { "--steps N", "how many", type = "whole", default = 10 },
    { "--rate R", "how fast", type = "number" },
    { "--shift K", "how far", type = "integer" },
    { "--mode M", "which way", choices = { "fast", "slow" }, default = "fast" },
    { "--precisions P,...", "which", type = "list", choices = { "f32", "bf16" } },
    { "--sizes N,...", "how big", type = "numbers" },
    { "--set K=V", "a value", many = true },
    { "--cpu", "on the CPU" },
    { "--eval-data SPEC", "held out" },
    { "-k K", "a short one", type = "integer" },
  }
  for k, v in pairs(extra or {}) do d[k] = v end
  return d
end

describe("uvmrec.cli", function()
  it("parses options, flags and arguments into typed values with their defaults", function()
    local c = cli.command(decl())
    local o = assert(c:check { "a", "--steps", "3", "b", "--rate=0.5", "--shift=-2", "--set", "x=1",
                               "--set", "y=2", "--cpu", "--precisions", "f32,bf16", "--sizes", "1,2.5",
                               "--eval-data", "synthetic:tiny" })
    assert.same({ "a", "b" }, o.files)
    assert.equal(3, o.steps)
    assert.equal(0.5, o.rate)
    assert.equal(-2, o.shift)
    assert.same({ "x=1", "y=2" }, o.set)
    assert.is_true(o.cpu)
    assert.same({ "f32", "bf16" }, o.precisions)
    assert.same({ 1, 2.5 }, o.sizes)
    assert.equal("synthetic:tiny", o.eval_data)
    assert.equal("fast", o.mode)
    -- a negative number after an option is its value, not an option
    o = assert(c:check { "a", "--shift", "-2", "--rate", "-.5", "--sizes", "-1,2", "-k", "-4", "--", "-3" })
    assert.same({ -2, -0.5, { -1, 2 }, -4, { "a", "-3" } }, { o.shift, o.rate, o.sizes, o.k, o.files })
    -- the ends of the exact range
    o = assert(c:check { "a", "--steps", "9007199254740991", "-k", "-9007199254740991" })
    assert.same({ 2 ^ 53 - 1, 1 - 2 ^ 53 }, { o.steps, o.k })
    o = assert(c:check { "a" })
    assert.equal(10, o.steps)
    assert.is_false(o.cpu)
    assert.same({}, o.set)
    assert.is_nil(o.out)
    assert.is_nil(o.rate)
  end)

  it("names the option and the value that is wrong", function()
    local c = cli.command(decl())
    local cases = {
      { { "a", "--steps=-1" }, "--steps: '-1' is not a whole number (0, 1, 2, ...)" },
      { { "a", "--steps", "-5" }, "--steps: '-5' is not a whole number (0, 1, 2, ...)" },
      { { "a", "-k", "-5.5" }, "-k: '-5.5' is not an integer" },
      { { "a", "--sizes", "-1,x" }, "--sizes: 'x' is not a number" },
      { { "a", "--steps", "1.5" }, "--steps: '1.5' is not a whole number (0, 1, 2, ...)" },
      { { "a", "--shift", "x" }, "--shift: 'x' is not an integer" },
      -- past 2^53 a Lua number holds no longer every whole number: 1e300 and 9007199254740993
      -- (taken as ...992) passed, for later checks to catch or not
      { { "a", "--steps", "1e300" }, "--steps: '1e300' is 2^53 or more; expected a whole number below 2^53" },
      { { "a", "--steps", "9007199254740993" },
        "--steps: '9007199254740993' is 2^53 or more; expected a whole number below 2^53" },
      { { "a", "-k", "-1e300" }, "-k: '-1e300' is -2^53 or less; expected an integer between -2^53 and 2^53" },
      { { "a", "--steps", "inf" }, "--steps: 'inf' is 2^53 or more; expected a whole number below 2^53" },
      { { "a", "--rate", "fast" }, "--rate: 'fast' is not a number" },
      { { "a", "--mode", "medium" }, "--mode: 'medium' is not fast or slow" },
      { { "a", "--precisions", "f32,f64" }, "--precisions: 'f64' is not f32 or bf16" },
      { { "a", "--sizes", "1,x" }, "--sizes: 'x' is not a number" },
      { { "a", "--sizes", "," }, "--sizes: ',' holds no items" },
      { { "a", "--frobnicate" }, "unknown option '--frobnicate'" },
      { { "a", "--step", "1" }, "unknown option '--step'\nDid you mean '--steps'?" },
      { { "a", "--out" }, "option '--out' requires an argument" },
      { {}, "missing argument 'FILES'" },
    }
    for _, case in ipairs(cases) do
      local o, err = c:check(case[1])
      assert.is_nil(o)
      assert.equal(case[2], err, table.concat(case[1], " "))
    end
  end)

  it("checks values, required options and options that exclude each other", function()
    local c = cli.command {
      name = "t", summary = "s",
      { "[ROWS]", "rows", type = "whole", default = 8, check = function(n)
        if n % 8 ~= 0 then return nil, n .. " is not a multiple of 8" end
        return n
      end },
      { "--out DIR", "where", required = true },
      { "--config C", "a config" },
      { "--rows-list R,...", "rows", type = "numbers", min = 1 },
      { "--tol X", "how close", type = "number", min = 0 },
      mutex = { { "--config", "--rows-list" } },
    }
    assert.equal(8, assert(c:check { "--out", "x" }).rows)
    assert.equal(16, assert(c:check { "16", "--out", "x" }).rows)
    local o, err = c:check { "12", "--out", "x" }
    assert.is_nil(o)
    assert.equal("ROWS: 12 is not a multiple of 8", err)
    o, err = c:check {}
    assert.is_nil(o)
    assert.equal("missing option '--out'", err)
    o, err = c:check { "--out", "x", "--config", "c", "--rows-list", "1" }
    assert.is_nil(o)
    assert.equal("option '--rows-list' can not be used together with option '--config'", err)
    o, err = c:check { "8", "16", "--out", "x" }
    assert.is_nil(o)
    assert.equal("too many arguments", err)
    -- min: the least value, of each item of a list too
    assert.same({ 1, 2 }, assert(c:check { "--out", "x", "--rows-list", "1,2" }).rows_list)
    assert.equal(0, assert(c:check { "--out", "x", "--tol", "0" }).tol)
    o, err = c:check { "--out", "x", "--rows-list", "2,0.5" }
    assert.is_nil(o)
    assert.equal("--rows-list: '0.5' is less than 1", err)
    o, err = c:check { "--out", "x", "--tol", "-1e-9" }
    assert.is_nil(o)
    assert.equal("--tol: '-1e-9' is less than 0", err)
  end)

  it("hands on what is not its own with rest, in order, and everything after --", function()
    local c = cli.command {
      name = "t", summary = "s",
      { "--gpu", "gpu only" },
      { "--n N", "n", type = "whole" },
      { "[ARGS...]", "for another program", rest = true },
    }
    local o = assert(c:check { "--tags=x", "--gpu", "spec/a", "--n", "2", "-v", "--", "--gpu", "--help" })
    assert.is_true(o.gpu)
    assert.equal(2, o.n)
    assert.same({ "--tags=x", "spec/a", "-v", "--gpu", "--help" }, o.args)
    assert.same({}, assert(c:check {}).args)
    local _, err = c:check { "x", "--help" }
    assert.equal("help", err)
  end)

  it("writes the usage and help from the declaration", function()
    local c = cli.command(decl { description = "More about the tool." })
    local _, why = c:check { "a", "--steps", "3", "--help" }
    assert.equal("help", why)
    local help = c:help()
    assert.matches("^usage: uvmrec tool %[%-h%] ", help)
    assert.matches("\n\ndoes things to FILES\n\nMore about the tool%.\n", help)
    assert.matches("\n   FILES +the files\n", help)
    assert.matches("\n   %-%-steps N +how many %(default: 10%)\n", help)
    assert.matches("\n   %-%-set K=V +a value\n", help)
    assert.matches("\n   %-%-cpu +on the CPU\n", help)
    assert.matches("^usage: uvmrec tool ", c:usage())
    assert.is_nil(c:usage():find("\n\n"))
  end)

  it("exits 2 with the message and the usage for a wrong argument, 0 with the help for --help", function()
    local dir = command.tmpdir()
    command.spit(dir .. "/tool.lua", [[
      local o = require("uvmrec.cli").command {
        name = "tool", summary = "a tool", { "--steps N", "how many", type = "whole" },
      }:parse(arg)
      print("steps", o.steps)]])
    local out, err, code = command.run(command.quote(dir .. "/tool.lua") .. " --steps 2")
    assert.equal(0, code, err)
    assert.equal("steps\t2\n", out)
    out, err, code = command.run(command.quote(dir .. "/tool.lua") .. " --steps two")
    assert.equal(2, code)
    assert.equal("", out)
    assert.equal("uvmrec tool: --steps: 'two' is not a whole number (0, 1, 2, ...)\nusage: uvmrec tool [-h] "
      .. "[--steps N]\n(`uvmrec tool --help` describes every option)\n", err)
    out, err, code = command.run(command.quote(dir .. "/tool.lua") .. " --help")
    assert.equal(0, code, err)
    assert.matches("^usage: uvmrec tool %[%-h%] %[%-%-steps N%]\n\na tool\n", out)
    command.rmdir(dir)
  end)

  it("catches SIGINT and SIGTERM while a command works, failing it with 128 + the signal at its finish", function()
    local dir = command.tmpdir()
    command.spit(dir .. "/tool.lua", [[
      local ffi = require "ffi"
      ffi.cdef "int raise(int sig);"
      local C = require("uvmrec.lib").C
      local cmd = require("uvmrec.cli").command { name = "tool", summary = "a tool", { "--sig N", "", type = "whole" } }
      local o = cmd:parse(arg)
      local signals = cmd:catch_signals()
      if o.sig > 0 then ffi.C.raise(o.sig) end
      print("caught", signals.caught(), C.ur_interrupt_get())
      -- the handlers given back, the flag down; the signal still said (finish reads it after)
      C.ur_signals_catch(0)
      print("after", C.ur_signals_caught(), C.ur_interrupt_get())
      assert(C.ur_signals_catch(1) == 0)
      print("again", C.ur_signals_caught())
      if o.sig > 0 then ffi.C.raise(o.sig) end
      signals.finish("; the work left undone")
      print("finished")]])
    for _, c in ipairs { { 15, "SIGTERM", 143 }, { 2, "SIGINT", 130 } } do
      local out, err, code = command.run(command.quote(dir .. "/tool.lua") .. " --sig " .. c[1])
      assert.equal(c[3], code, err)
      -- ur_signals_catch(0) forgot the signal (after 0 0): read before it, one in between was lost
      assert.equal(("caught\t%d\t1\nafter\t%d\t0\nagain\t0\n"):format(c[1], c[1]), out)
      assert.equal(("uvmrec tool: interrupted by %s; the work left undone\n"):format(c[2]), err)
    end
    local out, err, code = command.run(command.quote(dir .. "/tool.lua") .. " --sig 0")
    assert.equal(0, code, err)
    assert.equal("caught\tnil\t0\nafter\t0\t0\nagain\t0\nfinished\n", out)
    command.rmdir(dir)
  end)

  it("runs a benchmark where --gpu or --cpu says, else on a GPU in use, and fails --gpu without one", function()
    local dir = command.tmpdir()
    command.spit(dir .. "/bench.lua", [[
      local cmd = require("uvmrec.cli").command {
        name = "bench", summary = "a benchmark", { "--gpu", "on the GPU" }, { "--cpu", "on the CPU" },
        mutex = { { "--gpu", "--cpu" } },
      }
      print(cmd:mode(cmd:parse(arg)))]])
    local gpu = require("uvmrec").gpu()
    local out, err, code = command.run(command.quote(dir .. "/bench.lua") .. " --cpu")
    assert.equal(0, code, err)
    assert.equal("cpu\n", out)
    out, err, code = command.run(command.quote(dir .. "/bench.lua"))
    assert.equal(0, code, err)
    assert.equal(gpu and "gpu\n" or "cpu\n", out)
    out, err, code = command.run(command.quote(dir .. "/bench.lua") .. " --gpu")
    if gpu then
      assert.equal(0, code, err)
      assert.equal("gpu\n", out)
    else
      assert.equal(1, code)
      assert.matches("^uvmrec bench: %-%-gpu asked but no GPU is in use: ", err)
    end
    command.rmdir(dir)
  end)

  it("names the uvmrec program: UVMREC_BIN, else the command running the script, else the build's", function()
    local getenv, host = os.getenv, package.loaded["uvmrec.host"]
    local env = {}
    os.getenv = function(k) return env[k] end -- luacheck: ignore 122
    finally(function()
      os.getenv = getenv -- luacheck: ignore 122
      package.loaded["uvmrec.host"] = host
    end)
    package.loaded["uvmrec.host"] = nil
    assert.equal("build/bin/uvmrec", cli.program())
    package.loaded["uvmrec.host"] = { binary = "/opt/uvmrec/bin/uvmrec" }
    assert.equal("/opt/uvmrec/bin/uvmrec", cli.program())
    env.UVMREC_BIN = "/tmp/b/uvmrec"
    assert.equal("/tmp/b/uvmrec", cli.program())
  end)

  it("gives a benchmark its place and config: --cpu or no GPU the CPU, --config or BENCH_CONFIG's", function()
    local gpu = require("uvmrec").gpu()
    assert.same({ false, cli.BENCH_CONFIG.cpu }, { cli.bench_config { cpu = true } })
    assert.same({ false, "my.yaml" }, { cli.bench_config { cpu = true, config = "my.yaml" } })
    assert.same({ gpu, cli.BENCH_CONFIG[gpu and "gpu" or "cpu"] }, { cli.bench_config { cpu = false } })
    assert.same({ gpu, "my.yaml" }, { cli.bench_config { cpu = false, config = "my.yaml" } })
  end)

  it("reads the 1-minute load average as /proc/loadavg writes it, nil without the file", function()
    local f = io.open("/proc/loadavg")
    if f then
      local first = f:read("*l"):match("^%S+")
      f:close()
      local got = cli.load_average()
      assert.matches("^%d+%.%d+$", got)
      assert.equal(#first, #got) -- the same field (it may have moved in between)
    end
    local open = io.open
    io.open = function() return nil, "no such file" end -- luacheck: ignore 122
    local ok, got = pcall(cli.load_average)
    io.open = open -- luacheck: ignore 122
    assert.truthy(ok, got)
    assert.is_nil(got)
  end)

  it("refuses a declaration it cannot read, at the caller's line", function()
    local function refuses(d, msg)
      local ok, err = pcall(cli.command, d)
      assert.is_false(ok)
      assert.matches(msg, err)
    end
    refuses({ summary = "s" }, "^cli%.command: name must be a string")
    refuses({ name = "t", summary = "two\nlines" }, "^cli%.command t: summary must be one line of text")
    refuses({ name = "t", summary = "s", { "--x" } }, "cli: entry 1: expected")
    refuses({ name = "t", summary = "s", { "--x N", "x", colour = 1 } },
      "cli: entry 1 %(%-%-x N%): unknown field 'colour'")
    refuses({ name = "t", summary = "s", { "--x N", "x", type = "date" } }, "cli: %-%-x N: unknown type 'date'")
    refuses({ name = "t", summary = "s", { "--x", "x", default = 1 } }, "cli: %-%-x: a flag takes no type")
    refuses({ name = "t", summary = "s", { "--x N", "x", min = 1 } },
      "cli: %-%-x N: min = 1: a number, for type number, integer, whole or numbers")
    refuses({ name = "t", summary = "s", { "--x N", "x", type = "whole", min = "1" } },
      "cli: %-%-x N: min = 1: a number")
    refuses({ name = "t", summary = "s", { "lower", "x" } }, "cli: entry 1: 'lower' is neither")
    refuses({ name = "t", summary = "s", { "[A", "x" } }, "cli: entry 1: '%[A' is neither")
    refuses({ name = "t", summary = "s", { "A", "x", rest = true } }, "cli: A: rest = true needs %[NAME%.%.%.%]")
    refuses({ name = "t", summary = "s", { "--a-b N", "x" }, { "--c N", "y", key = "a_b" } },
      "cli%.command t: %-%-a%-b and %-%-c both land in opts%.a_b")
    refuses({ name = "t", summary = "s", { "--a N", "x" }, mutex = { { "--a", "--b" } } },
      "cli: mutex: '%-%-b' is not an option of uvmrec t")
  end)

  it("shares the options several commands mean alike (cli.options), each in its place and unchanged", function()
    local opt = cli.options
    local function bench(out)
      return cli.command {
        name = "b", summary = "s",
        opt.config, opt.set, { "--steps N", "own", type = "whole", default = 20 }, opt.batch_size, opt.precision,
        opt.cpu, opt.zipf, opt.python, opt.no_torch, out,
      }
    end
    local before = {}
    for name, e in pairs(opt) do before[name] = { unpack(e) } end
    local c = bench(opt.out)
    local o = assert(c:check { "--config", "dlrm_kaggle", "--set", "a=1", "--set", "b=2", "--batch", "512",
                               "--precision", "bf16", "--cpu", "--zipf", "1.2", "--python", "py", "--no-torch",
                               "--out", "r.jsonl" })
    assert.same({ "dlrm_kaggle", { "a=1", "b=2" }, 20, 512, "bf16", true, 1.2, "py", true, "r.jsonl" },
      { o.config, o.set, o.steps, o.batch, o.precision, o.cpu, o.zipf, o.python, o.no_torch, o.out })
    o = assert(c:check {})
    assert.same({ {}, false, 1.05, os.getenv("PYTHON") or "python3", false },
      { o.set, o.cpu, o.zipf, o.python, o.no_torch })
    assert.is_nil(o.config)
    local _, err = c:check { "--batch", "0" }
    assert.equal("--batch: '0' is less than 1", err)
    _, err = c:check { "--precision", "f16" }
    assert.equal("--precision: 'f16' is not f32, tf32 or bf16", err)
    -- an --out with no folder to go in is refused as the arguments are read, before any measuring
    for _, b in ipairs { c, bench(opt.out_append) } do
      _, err = b:check { "--out", "/nonexistent/r.jsonl" }
      assert.equal("--out: '/nonexistent/r.jsonl': /nonexistent: No such file or directory", err)
    end
    -- in the help where the declaration puts them, the default config named from BENCH_CONFIG
    local help = c:help()
    local at = 0
    for _, line in ipairs { "--config C", "--set K=V", "--steps N", "--batch B", "--precision P", "--cpu" } do
      local here = help:find("\n   " .. line .. " ", 1, true)
      assert.truthy(here and here > at, line)
      at = here
    end
    assert.truthy(help:gsub("%s+", " "):find("a config or preset (default: dlrm_mlperf_v1_2m on a GPU, dlrm_tiny on "
      .. "the CPU)", 1, true))
    assert.matches("\n   %-%-out FILE +write JSON lines$", help)
    assert.matches("\n   %-%-out FILE +append JSON lines$", bench(opt.out_append):help())
    for name, e in pairs(opt) do assert.same(before[name], { unpack(e) }, name) end
    -- the default configs are presets there are
    local train = require "uvmrec.train"
    assert.truthy(train.find_config(cli.BENCH_CONFIG.gpu))
    assert.truthy(train.find_config(cli.BENCH_CONFIG.cpu))
  end)

  it("reads a script's declaration without running the rest of it", function()
    local dir = command.tmpdir()
    command.spit(dir .. "/good.lua", [[
      local cli = require "uvmrec.cli"
      local o = cli.command { name = "good", summary = "the good one" }:parse(arg)
      error("ran past its declaration")]])
    command.spit(dir .. "/plain.lua", [[error("a script without a declaration must not run")]])
    command.spit(dir .. "/exits.lua", [[-- uses uvmrec.cli, but exits first
      os.exit(3)]])
    local c = assert(cli.describe(dir .. "/good.lua"))
    assert.equal("the good one", c.summary)
    local none, err = cli.describe(dir .. "/plain.lua")
    assert.is_nil(none)
    assert.equal(dir .. "/plain.lua declares no command (uvmrec.cli)", err)
    none, err = cli.describe(dir .. "/exits.lua")
    assert.is_nil(none)
    assert.matches("exits%.lua exits %(code 3%) before its declaration", err)
    local list = assert(cli.commands(dir))
    assert.same({ "exits", "good", "plain" }, { list[1].name, list[2].name, list[3].name })
    assert.equal("the good one", list[2].summary)
    assert.matches("^%(.*declares no command", list[3].summary)
    command.rmdir(dir)
  end)

  it("fails in one line, noting the exit for uvmrec launch, and with 130 after a Ctrl-C", function()
    local dir = command.tmpdir()
    local fail = [[-e "local ur = require 'uvmrec'; if os.getenv('INT') then ur.C.ur_interrupt_set(1) end; ]]
      .. [[require('uvmrec.cli').command { name = 'tool', summary = 's' }:fail('no such file')"]]
    -- as launch starts a rank: its job folder, the world and the rank
    local env = ("env UVMREC_JOB=%s UVMREC_WORLD=2 UVMREC_RANK=1 "):format(dir)
    local _, err, code = command.sh(("%s%s %s"):format(env, command.bin(), fail))
    assert.equal(1, code)
    assert.equal("[rank 1] uvmrec tool: no such file\n", err)  -- a rank of two names itself
    -- launch reads it to name the rank: the code and the message, not a rank that died without a word
    assert.equal("1\tno such file\n", command.slurp(dir .. "/rank-1.exit"))
    -- Lua code that caught the interrupt's error fails as a command Ctrl-C stopped
    _, err, code = command.sh(("INT=1 %s%s %s"):format(env, command.bin(), fail))
    assert.equal(130, code, err)
    assert.equal("130\tno such file\n", command.slurp(dir .. "/rank-1.exit"))
    -- outside a job (no launcher's rank) nothing is noted, as the uvmrec command's own note does
    os.remove(dir .. "/rank-0.exit")
    command.sh(("env UVMREC_JOB=%s %s %s"):format(dir, command.bin(), fail))
    assert.is_nil(io.open(dir .. "/rank-0.exit"))
    command.rmdir(dir)
  end)
end)
