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
end)
