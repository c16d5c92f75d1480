-- scripts/bench/soak.lua on the CPU at dlrm_tiny's scale: cached tables and managed ones under
-- adaptive (its intervals every 2 steps, so rows move), through the prefetch pipeline, against
-- the shadow in host memory: every checked row and loss equal, memory flat; and a shadow row
-- changed on purpose (--perturb-shadow, a test option) fails the run, naming the row, and so does
-- a NaN loss.
local cmd = require "command"
local json = require "uvmrec.json"

local function soak(args)
  return cmd.sh(("%s scripts/bench/soak.lua --config dlrm_tiny --steps 9 --warm 3 --every 3 --hints-every 2 %s")
    :format(cmd.bin(), args))
end

describe("scripts/bench/soak.lua", function()
  it("keeps the cached and managed tables equal to the shadow's, row for row and loss for loss", function()
    local out = os.tmpname()
    os.remove(out)
    local so, se, rc = soak("--out " .. out)
    assert.equal(0, rc, so .. se)
    local last = so:match("([^\n]+)\n$")
    assert.matches("^soak: PASS: 9 steps, ", last)
    local lines = assert(json.read_lines(out))
    os.remove(out)
    local s = lines[#lines]
    assert.equal("summary", s.mode)
    assert.is_true(s.pass)
    assert.equal(3, s.checks)
    assert.equal(0, s.mismatches)
    assert.equal(0, s.loss_mismatches)
    -- the check read what it claims to: rows in the cache, rows adaptive had moved
    assert.is_true(s.rows_checked >= 3 * 26, s.rows_checked .. " rows checked")
    assert.is_true(s.rows_resident > 0, "no checked row was in the cache")
    assert.is_true(s.rows_moved > 0, "no checked row had been moved by adaptive")
    assert.is_true(s.relayout_bytes > 0, "adaptive moved nothing")
    assert.is_true(s.memory_start.rss > 0 and s.memory_end.rss > 0)
  end)

  it("fails when one shadow row differs, naming the table and the id", function()
    local so, se, rc = soak("--perturb-shadow 5")
    assert.equal(1, rc, so .. se)
    assert.matches("step 6: table C1 %(cached%) id %d+ %(row %d+%) row differs from the shadow's", so)
    assert.matches("\nsoak: FAIL: 6 steps, %S+ samples/s %(soak and shadow%), 2 checks, %d+ rows checked, 1 mismatches",
                   so)
  end)

  it("fails on a NaN loss, never counting two NaNs as equal", function()
    -- an lr of 1e30 turns both models' losses NaN by step 2; skip keeps the run's own guard from
    -- stopping it first, so the soak's check is what fails
    local so, se, rc = soak("--set optimizer.lr=1e30 --set train.nonfinite=skip")
    assert.equal(1, rc, so .. se)
    assert.matches("\n  step %d+: the soak's and the shadow's losses are NaN\n", so)
    assert.matches("\nsoak: FAIL: %d+ steps, .*, 0 loss mismatches, 1 NaN losses;", so)
  end)
end)
