-- What the benchmark scripts print where a count can be 1 (lib.things, the one home of the
-- plurals), on the CPU.
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
