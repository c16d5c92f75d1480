-- What the benchmark scripts print, on the CPU: counts of 1 in the singular (lib.things, the one
-- home of the plurals), the uvm bench's --parts, refusals of counts too small to measure,
-- ktrace_overlap.py's account of a kernel timeline, planner_b10's --time at a budget given, and
-- planner_widths' --check.
local cmd = require "command"

describe("scripts/bench output", function()
  -- 'cache bench: 1 tables x 1000 rows, batches of 1 samples ..., 2 batches (1 warm-up)'
  it("counts one table, one sample a batch in the singular (cache.lua)", function()
    local out, err, code = cmd.run("scripts/bench/cache.lua --tables 1 --rows 1000 --batches 2 --batch 1")
    assert.equal(0, code, err)
    assert.matches("cache bench: 1 table x 1000 rows, batches of 1 sample (one id per table), Zipf(1.05), 2 batches "
      .. "(1 warm-up)\n", out, 1, true)
  end)

  -- 'drift ...; 1 tables of 1000 rows'
  it("counts one table in the singular (drift.lua)", function()
    local out, err, code = cmd.run("scripts/bench/drift.lua --steps 20 --every 10 --tables 1 --rows 1000 --batch 64")
    assert.equal(0, code, err)
    assert.matches("; 1 table of 1000 rows, allowance 10%\n", out, 1, true)
  end)

  -- --parts: the rest of the step (less the tables' forward and backward) taken apart by module
  it("takes the rest of the step apart by module, each part within the step (uvm.lua --parts)", function()
    local out, err, code = cmd.run("scripts/bench/uvm.lua --cpu --policies hot_prefix --fractions 20 --parts "
      .. "--none-steps 0")
    assert.equal(0, code, err)
    local n = 0
    for step, line in out:gmatch("the median step ([%d.]+) ms [^\n]+ %(medians%)\n  the rest: ([^\n]+)") do
      n = n + 1
      step = tonumber(step)
      local sum = 0
      for _, name in ipairs { "bottom", "interaction", "top", "criterion" } do
        local f, b = line:match(name .. " ([%d.]+) / ([%d.]+)")
        assert.truthy(f, name .. " missing from: " .. line)
        f, b = tonumber(f), tonumber(b)
        assert.is_true(f > 0 and b > 0 and f < step and b < step, step .. " ms a step: " .. line)
        sum = sum + f + b
      end
      local opt, between = line:match("optimizer ([%d.]+) ms .*; between them (%-?[%d.]+) ms$")
      assert.truthy(opt, line)
      assert.is_true(tonumber(opt) > 0, line)
      assert.truthy(tonumber(between), line)
      -- each part is timed inside a step, so its median is below the steps'; the parts' medians
      -- need not add up to the rest's (medians do not add), but they stay below the whole step's
      assert.is_true(sum + opt < step, step .. " ms a step: " .. line)
    end
    assert.equal(2, n, out) -- device and hot_prefix 20%
  end)
end)

-- --far-early-after: the early copies started when a part of the step ends (on the CPU they copy
-- nothing, and the run's losses still equal the device run's, or the bench fails)
describe("scripts/bench/uvm.lua --far-early-after", function()
  it("runs the written-behind case once more per part, printing its copies' time", function()
    local out, err, code = cmd.run("scripts/bench/uvm.lua --cpu --policies hot_prefix --fractions 20 --far-rows 1024 "
      .. "--far-early --far-behind --far-early-after top_backward,bottom_backward --none-steps 0")
    assert.equal(0, code, out .. err)
    for _, part in ipairs { "top_backward", "bottom_backward" } do
      assert.matches("| hot_prefix | 20% | 1024 / 0, early, behind, early after " .. part .. " |", out, 1, true)
      local ms = out:match("early copies after " .. part .. ": ([%d.]+) ms %(their median over the timed steps%), "
        .. "hot_prefix 20%%")
      assert.truthy(ms, out)
      assert.is_true(tonumber(ms) >= 0, out)
    end
  end)

  it("--far-dma: runs the last case with early copies once more per way through the copy engines, and each of "
    .. "those once more per --far-early-after part", function()
    local out, err, code = cmd.run("scripts/bench/uvm.lua --cpu --policies hot_prefix --fractions 20 --far-rows 1024 "
      .. "--far-early --far-behind --far-dma home,both --far-early-after top_backward --none-steps 0")
    assert.equal(0, code, out .. err)
    assert.matches("| hot_prefix | 20% | 1024 / 0, early, behind |", out, 1, true)
    for _, w in ipairs { "home", "both" } do
      assert.matches("| hot_prefix | 20% | 1024 / 0, early, behind, dma " .. w .. " |", out, 1, true)
      assert.matches("| hot_prefix | 20% | 1024 / 0, early, behind, early after top_backward, dma " .. w .. " |", out,
                     1, true)
      assert.truthy(out:match("early copies after top_backward: [%d.]+ ms %(their median over the timed steps%), "
        .. "hot_prefix 20%%, dma " .. w), out)
    end
  end)

  it("refuses a part the step does not have, a run without early copies written behind, and --far-dma without "
    .. "early copies", function()
    for _, case in ipairs {
      { "--far-early --far-behind --far-early-after top", "--far-early-after: 'top' is no part of the step; "
        .. "expected one of bottom_backward, bottom_forward, criterion_backward," },
      { "--far-early --far-early-after top_backward", "--far-early-after moves the early copies of the runs "
        .. "written behind: it needs --far-early and --far-behind" },
      { "--far-dma early", "--far-dma early moves the early copies of a run: it needs --far-early" },
      { "--far-early --far-dma home", "--far-dma home moves the copies written behind of a run: it needs --far-early "
        .. "and --far-behind" },
      { "--far-early --far-dma none", "--far-dma: 'none'; expected home, early or both" },
    } do
      local out, err, code = cmd.run("scripts/bench/uvm.lua --cpu --none-steps 0 " .. case[1])
      assert.equal(2, code, out .. err)
      assert.matches(case[2], err, 1, true)
    end
  end)
end)

describe("scripts/bench refusals of counts too small to measure", function()
  -- dlrm.lua --steps 1 failed with "attempt to index field 'loss' (a nil value)" after building
  -- the model; drift.lua --steps 2 (below --every 20) with "attempt to index a nil value" at its end
  it("refuses them before any work, naming the option and the least", function()
    for _, case in ipairs {
      { "scripts/bench/dlrm.lua --cpu --steps 1", "uvmrec scripts/bench/dlrm.lua: --steps: '1' is less than 2\n" },
      { "scripts/bench/drift.lua --steps 2 --tables 1 --rows 1000 --batch 64",
        "uvmrec scripts/bench/drift.lua: --steps 2 is below --every 20: the run would end before its first "
        .. "interval\n" },
    } do
      local out, err, code = cmd.run(case[1])
      assert.equal(2, code, out .. err)
      assert.equal(case[2], err:sub(1, #case[2]))
    end
  end)
end)

-- scripts/bench/ktrace_overlap.py on a timeline made here: six steps of 1 ms, each begun by the
-- tables' forward (100 us) with a product and a mask kernel on the step's stream (7); in the last
-- three the product takes 150 us instead of 100, beside an early copy (far_move_kernel<false>, on
-- stream 9) from 150 to 400 us.
describe("scripts/bench/ktrace_overlap.py", function()
  local H = require "helpers"
  local py = H.python("import argparse, bisect, statistics")

  local function trace()
    local lines, us = {}, 1000
    local function k(s, e, name, stream)
      lines[#lines + 1] = ("K,%d,%d,%d,132,256,%s"):format(s * us, e * us, stream or 7, name)
    end
    for i = 0, 6 do
      local t = i * 1000
      k(t, t + 100, "_ZN38_GLOBAL__N__0badf00d_6_tbe_cu_1234567810fwd_kernelILi1EEEv12ur__tbe_args")
      if i < 6 then
        k(t + 200, t + (i < 3 and 300 or 350), "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
        k(t + 500, t + 550, "ur_relu_bgrad_kernel")
        if i >= 3 then k(t + 150, t + 400, "_ZN38_GLOBAL__N__0badf00d_6_tbe_cu_1234567815far_move_kernelILb0EEv", 9) end
      end
    end
    lines[#lines + 1] = "M,0,10,7,4096,1,memcpy"
    local path = os.tmpname()
    cmd.spit(path, table.concat(lines, "\n") .. "\n")
    return path
  end

  it("puts each kernel's excess over the reference steps beside what ran with it", function()
    if not py then pending("no python3") return end
    local path = trace()
    local out, err, code = cmd.sh(py .. " scripts/bench/ktrace_overlap.py " .. path .. " --ref 0:3 --run 3:6")
    os.remove(path)
    assert.equal(0, code, err)
    assert.matches("the steps' stream (7) idle: 750 us a step (median) in the reference, 700 in the run", out, 1, true)
    assert.matches("step (median) 1.000 ms in the reference steps 0:3, 1.000 ms in the run's 3:6", out, 1, true)
    -- busy 250 of 1000 us in the reference (forward, product, mask), 300 in the run: the copy is no kernel's
    assert.matches("no kernel but the movers running: 750 us a step (median) in the reference, 700 in the run",
      out, 1, true)
    assert.matches("loads: 3 kernels, 250 us each (median), from 150 to 400 us after their step's start", out, 1, true)
    assert.matches("dense beside loads        1.0     150.0     +50.0", out, 1, true)
    assert.matches("dense beside none         1.0      50.0      +0.0", out, 1, true)
    assert.matches("tables beside none        1.0     100.0      +0.0", out, 1, true)
  end)

  it("refuses steps the trace does not hold, and a mover without its regex, naming them", function()
    if not py then pending("no python3") return end
    local path = trace()
    local script = py .. " scripts/bench/ktrace_overlap.py " .. path
    local runs = {}
    for i, args in ipairs { " --ref 0:3 --run 3:9", " --ref 3:3 --run 3:6", " --ref 0:3 --run 3:6 --mover loads" } do
      local _, err, code = cmd.sh(script .. args)
      runs[i] = { err, code }
    end
    os.remove(path)
    for _, r in ipairs(runs) do assert.equal(1, r[2], r[1]) end
    assert.matches("holds 7 kernels matching '_tbe_cu_\\w*fwd_kernel' (each begins a step, which ends where the next "
      .. "begins); --ref 0:3 and --run 3:9 need 10", runs[1][1], 1, true)
    assert.matches("--ref '3:3': expected A:B, step indices with A < B", runs[2][1], 1, true)
    assert.matches("--mover 'loads': expected LABEL=REGEX", runs[3][1], 1, true)
  end)
end)

describe("scripts/bench/planner_b10.lua --time", function()
  -- planner_b10 --time at a budget given (--hbm), in a calibration given, one run: search_spec's
  -- 1000-table instance, one plan (docs/results.md's instruction counts)
  it("times the planner at a budget and calibration given, the runs asked for (planner_b10.lua --time)", function()
    local out, err, code = cmd.run("scripts/bench/planner_b10.lua --time --tables 26 --ranks 1,2 --hbm 1GiB "
      .. "--calibration spec/fixtures/calib_h200_figures.json --runs 1")
    assert.equal(0, code, err)
    assert.matches("\n     26      1   1.00 GiB ", out, 1, true)
    assert.matches("\n     26      2   1.00 GiB ", out, 1, true)
    for _, case in ipairs {
      { "--hbm 1GiB --short", "option '--short' can not be used together with option '--hbm'" },
      { "--hbm 1GiB --at 0.2", "option '--at' can not be used together with option '--hbm'" },
      { "--runs 0", "--runs: '0' is less than 1" },
      { "--hbm lots", "--hbm: 'lots' is not a size" },
      { "--calibration nope", "--calibration nope: calibration: " },
    } do
      out, err, code = cmd.run("scripts/bench/planner_b10.lua --time --tables 26 " .. case[1])
      assert.equal(2, code, case[1])
      assert.equal("", out, case[1])
      assert.matches(case[2], err, 1, true)
    end
  end)
end)

describe("scripts/bench/planner_widths.lua --check", function()
  -- 200 tables of four dims on 1 rank (docs/results.md, "Planner: one row width a rank's cache"):
  -- 5e7d6b9's planner cached three widths in that rank's cache, and the check fails on its tree
  it("plans a case and passes where each rank's cache holds one row width", function()
    local out, err, code = cmd.run("scripts/bench/planner_widths.lua --check")
    assert.equal(0, code, err)
    assert.matches("\n  rank 0: [%d.]+ ms, caches %d+/f%d+ x%d+\n", out)
    assert.matches("\ncheck: ok, one row width a rank's cache\n$", out)
    out, err, code = cmd.run("scripts/bench/planner_widths.lua --case nope")
    assert.equal(2, code)
    assert.equal("", out)
    assert.matches("--case", err, 1, true)
  end)
end)
