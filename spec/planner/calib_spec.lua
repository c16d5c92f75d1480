local calib = require "uvmrec.planner.calib"
local cmd = require "command"

local function base()
  local t = { format = "uvmrec-calibration", version = 1, machine = "m", backend = "cpu", rates = {} }
  for name, spec in pairs(calib.RATES) do
    if not spec[3] then
      t.rates[name] = { value = spec[1] == "fraction" and 0.5 or spec[1] == "s" and 1e-6 or 1, unit = spec[1],
                        source = "s" }
    end
  end
  return t
end

describe("planner.calib", function()
  -- docs/planner.md listed the shipped files' rates in prose, rounded by hand; now a table a row
  -- a rate, each checked against the file: its value to the 4 digits shown, measured or not, date.
  it("is what docs/planner.md's table of the shipped calibrations says, rate by rate", function()
    local doc = cmd.slurp("docs/planner.md")
    if not doc then pending("no docs/planner.md in this tree (a dist tree ships no docs/)") return end
    local scale = { ["GB/s"] = 1e9, ["GFLOP/s"] = 1e9, us = 1e-6, ns = 1e-9, [""] = 1 }
    for _, name in ipairs({ "h200", "cpu" }) do
      local c = assert(calib.find(name))
      local rows = {}
      for rate, cells in doc:gmatch("\n| " .. name .. "%.json | ([%w_]+) | ([^\n]*)") do rows[rate] = cells end
      for rate, r in pairs(c.data.rates) do
        local cells = rows[rate]
        assert.is_truthy(cells, ("docs/planner.md has no row for %s.json's %s"):format(name, rate))
        local num, unit, measured, date = cells:match("^([%d.e+-]+) ?([%a/]*) | (%a+) | [^|]* | [^|]* | ([^|]-) |")
        assert.is_truthy(num, ("%s.json's %s row: %s"):format(name, rate, cells))
        local v = tonumber(num) * assert(scale[unit], "unit " .. unit)
        assert.near(r.value, v, 5e-4 * math.abs(r.value), ("%s.json's %s: %s %s"):format(name, rate, num, unit))
        assert.equal(r.measured == false and "no" or "yes", measured, name .. " " .. rate)
        assert.equal(r.date == "none" and "-" or r.date, date, name .. " " .. rate)
        rows[rate] = nil
      end
      assert.same({}, rows, "rows of rates " .. name .. ".json lacks")
    end
  end)

  it("ships an H200 and a CPU calibration, every rate with its source, command and date", function()
    -- the H200's is `uvmrec calibrate` on the H200 with the data sheet's collectives
    -- (scripts/bench/calib_h200.lua); the CPU has no collectives
    local lacks = { h200 = {}, cpu = { "^alltoall$", "^allreduce$", "^reduce_scatter$" } }
    for _, name in ipairs({ "h200", "cpu" }) do
      local c = assert(calib.find(name))
      for rate in pairs(calib.RATES) do
        local r = c.data.rates[rate]
        local lacking = false
        for _, pat in ipairs(lacks[name]) do lacking = lacking or rate:match(pat) ~= nil end
        if lacking then
          assert.is_nil(r, name .. " " .. rate)
        else
          assert.is_table(r, name .. " " .. rate)
        end
        if r then
          assert.is_string(r.source)
          assert.is_string(r.command, name .. " " .. rate)
          assert.is_string(r.date, name .. " " .. rate)
        end
      end
    end
    local h = assert(calib.find("h200"))
    assert.equal(141e9, h.data.hbm_bytes)
    -- the collectives are data-sheet figures, and say so
    assert.same({ "alltoall (" .. h.data.rates.alltoall.source .. ")" }, h:unmeasured({ "alltoall", "hbm_gather" }))
  end)

  it("is the file scripts/bench/calib_h200.lua builds from uvmrec calibrate's run on the H200", function()
    -- calibrate's file as it came from the H200 (spec/fixtures/calib_h200_measured.json)
    local m = assert(calib.load("spec/fixtures/calib_h200_measured.json")).data
    local rates = m.rates
    local measured, out = os.tmpname(), os.tmpname()
    local build = "%s scripts/bench/calib_h200.lua --measured %s --out %s"
    local _, se, rc = cmd.sh(build:format(cmd.bin(), "spec/fixtures/calib_h200_measured.json", out))
    assert.equal(0, rc, se)
    assert.equal(cmd.slurp(calib.dir() .. "/h200.json"), cmd.slurp(out))
    -- not an H200's, or not calibrate's own measurements: refused, the file named
    local so, se2, rc2 = cmd.sh(build:format(cmd.bin(), calib.dir() .. "/cpu.json", out))
    assert.equal(1, rc2, so)
    assert.matches("cpu.json: machine .* backend cpu; expected a calibration measured on an NVIDIA H200", se2)
    rates.hbm_copy = { value = 1e12, unit = "B/s", measured = false, source = "a guess", command = "none",
                       date = "none" }
    local f = assert(io.open(measured, "w"))
    f:write(calib.encode(m))
    f:close()
    _, se2, rc2 = cmd.sh(build:format(cmd.bin(), measured, out))
    assert.equal(1, rc2)
    assert.matches("rates.hbm_copy is not measured (a guess)", se2, 1, true)
    _, se2, rc2 = cmd.sh(("%s scripts/bench/calib_h200.lua --out %s"):format(cmd.bin(), out))
    assert.equal(2, rc2)
    assert.matches("give --measured FILE", se2, 1, true)
    os.remove(measured)
    os.remove(out)
  end)

  it("reads a file back as written, and names what is wrong with a bad one", function()
    local t = base()
    local c = assert(calib.from_table(t))
    local back = assert(calib.from_table(require("uvmrec.json").decode(c:encode())))
    assert.same(c.data, back.data)
    local function bad(edit, msg)
      local x = base()
      edit(x)
      local ok, err = calib.from_table(x, "f.json")
      assert.is_nil(ok)
      assert.equal(msg, err)
    end
    bad(function(x) x.rates.hbm_gather = nil end,
        "calibration f.json: rates.hbm_gather is missing (bytes of scattered rows read once each in HBM)")
    bad(function(x) x.rates.hbm_gather.unit = "GB/s" end,
        "calibration f.json: rates.hbm_gather.unit is GB/s; expected B/s")
    bad(function(x) x.rates.hbm_gather.value = -1 end,
        "calibration f.json: rates.hbm_gather.value -1 is out of range for B/s: expected > 0 and below 1e+14")
    bad(function(x) x.rates.pipeline_overlap.value = 1 end,
        "calibration f.json: rates.pipeline_overlap.value 1 is out of range for fraction: expected >= 0 and below 1")
    -- beyond any machine's: a term fitted to almost nothing (managed_update once came out 16 PB/s)
    bad(function(x) x.rates.managed_update.value = 1.6e16 end,
        "calibration f.json: rates.managed_update.value 1.6e+16 is out of range for B/s: expected > 0 and below 1e+14")
    bad(function(x) x.rates.mlp_bf16.value = 2e16 end,
        "calibration f.json: rates.mlp_bf16.value 2e+16 is out of range for FLOP/s: expected > 0 and below 1e+16")
    bad(function(x) x.rates.cache_per_id.value = 2 end,
        "calibration f.json: rates.cache_per_id.value 2 is out of range for s: expected >= 0 and below 1")
    assert.matches("^value %-?nan is not a number$", calib.check_value("hbm_copy", 0 / 0))
    assert.is_nil(calib.check_value("managed_update", 9.9e13))
    assert.is_nil(calib.check_value("tbe_backward_per_id", 0))
    bad(function(x) x.rates.warp_speed = { value = 1, unit = "B/s", source = "s" } end,
        "calibration f.json: rates.warp_speed: unknown rate")
    bad(function(x) x.rates.cache_move.source = nil end, "calibration f.json: rates.cache_move has no source")
    bad(function(x) x.format = "x" end, 'calibration f.json: format is x; expected "uvmrec-calibration"')
    bad(function(x) x.version = 2 end, "calibration f.json: version 2; this planner reads 1")
    -- the backend decides the step's form (the CPU's sum, a GPU's longer of work and calls), the
    -- hint pages, the arena's blocks and the dense workspaces: a file without it, or with "CPU",
    -- was priced as a GPU's; a rate's "measured" of "no" or "false" was taken as measured
    bad(function(x) x.backend = nil end, "calibration f.json: backend is nil; expected \"cuda\" or \"cpu\"")
    bad(function(x) x.backend = "CPU" end, "calibration f.json: backend is \"CPU\"; expected \"cuda\" or \"cpu\"")
    bad(function(x) x.rates.hbm_gather.measured = "false" end,
        "calibration f.json: rates.hbm_gather.measured is \"false\"; expected true or false")
    assert.equal("cuda", calib.synthetic().backend)
    -- the collectives are optional, until a plan over several ranks needs them
    local one = assert(calib.from_table(base()))
    assert.has_error(function() one:rate("alltoall") end,
      "calibration (table) has no alltoall rate (all-to-all, bytes each rank sends): plans over several ranks need "
      .. "the collectives' rates")
    local _, err = calib.load("/nonexistent.json")
    assert.matches("^calibration: ", err)
  end)

  it("fits rates by least squares, absolute or relative, with no coefficient below 0", function()
    -- y = 2 a + 3 b exactly: both ways recover it
    local A, y = { { 1, 0 }, { 0, 1 }, { 1, 1 }, { 2, 5 } }, {}
    for i, r in ipairs(A) do y[i] = 2 * r[1] + 3 * r[2] end
    for _, rel in ipairs({ false, true }) do
      local x, off = calib.fit(A, y, rel)
      assert.near(2, x[1], 1e-12)
      assert.near(3, x[2], 1e-12)
      assert.near(0, off, 1e-12)
    end
    -- the linear solve under it (pivoting: the first row's leading zero)
    local x3 = calib.solve({ { 0, 2, 1 }, { 1, 1, 0 }, { 2, 0, 3 } }, { 7, 3, 11 })
    for i, want in ipairs({ 1, 2, 3 }) do assert.near(want, x3[i], 1e-12) end
    -- y = a x through (1, 1) and (10, 20): absolute errors, the long run decides (sum xy / sum x^2);
    -- relative ones weigh both alike (sum (x/y) / sum (x/y)^2, x/y = 1 and 0.5)
    local A2, y2 = { { 1 }, { 10 } }, { 1, 20 }
    assert.near((1 + 200) / 101, calib.fit(A2, y2)[1], 1e-12)
    assert.near(1.5 / 1.25, calib.fit(A2, y2, true)[1], 1e-12)
    -- a term that would come out below 0 is dropped and the rest fitted again
    local x = calib.fit({ { 1, 1 }, { 2, 1 }, { 3, 1 } }, { 3, 5, 7.2 })
    assert.is_true(x[1] > 0 and x[2] > 0)
    local off
    x, off = calib.fit({ { 1, 1 }, { 2, 1 }, { 3, 1 } }, { 1, 2.5, 4 })
    assert.equal(0, x[2])
    assert.near((1 + 5 + 12) / 14, x[1], 1e-12)
    -- with it the worst run's relative error: the first, 18/14 against 1
    assert.near(18 / 14 - 1, off, 1e-12)
    -- an absolute fit may hold a run measured at 0: the error is over the others, never NaN
    local _, off0 = calib.fit({ { 1, 0 }, { 0, 1 }, { 1, 1 } }, { 0, 2, 2.2 })
    assert.is_true(off0 == off0 and off0 > 0 and off0 < 1, tostring(off0))
    -- what cannot be fitted is an error, not NaN rates
    assert.has_error(function() calib.solve({ { 1, 2 }, { 2, 4 } }, { 1, 2 }) end,
      "calib.solve: the system is singular (column 2 has no pivot)")
    assert.has_error(function() calib.fit({ { 1 }, { 2 } }, { 1, 0 }, true) end,
      "calib.fit: run 2 measured 0; expected a time > 0")
    assert.has_error(function() calib.synthetic():term("hbm_gather") end,
      "calibration: hbm_gather is not an optional term in seconds")
  end)

  it("measures this machine with uvmrec calibrate --quick", function()
    local out = os.tmpname()
    local so, se, rc = cmd.sh(("%s calibrate --quick --out %s"):format(cmd.bin(), out))
    assert.equal(0, rc, se)
    assert.matches("wrote " .. out, so, 1, true)
    local c = assert(calib.load(out))
    assert.equal("uvmrec calibrate --quick", c.data.rates.hbm_gather.command)
    assert.is_true(c:rate("mlp_f32") > 1e8)
    assert.is_true(c:rate("hbm_copy") > 1e8)
    assert.is_true(c:rate("step_overhead") > 0)
    -- the MLP fit's terms (each >= 0: a term fitted below 0 is dropped), the loader's cost a value
    for _, p in ipairs({ "f32", "tf32", "bf16" }) do
      assert.is_true(c:term("mlp_act_" .. p) >= 0 and c:term("mlp_layer_" .. p) >= 0, p)
      assert.matches("worst run %d+%% off", c.data.rates["mlp_" .. p].source)
    end
    -- the cache measured where the planner prices it: on the GPU when there is one, where every
    -- other step's collection runs and its batches' ids are (a cache run on the CPU there fails
    -- at its first prepare, on ids in device memory)
    local gpu = require("uvmrec").gpu()
    -- the loader's: what it adds to a CPU step (a difference of two medians, 0 where it is lost
    -- in the noise, as it can be in the quick run's few steps); on a GPU its own rate
    assert.is_true(c:term("loader_per_value") >= 0)
    assert.matches(gpu and "[%d.]+ ms a batch, one after another"
                   or "dlrm_tiny's step [%d.]+ ms fed by it, [%d.]+ ms from batches made before",
                   c.data.rates.loader_per_value.source)
    assert.is_true(c:term("hints_per_row") > 0)
    assert.matches("counted on a batch of Zipf(1.05) ids", c.data.rates.hints_per_row.source, 1, true)
    -- the cache per batch, per id and per distinct row, fitted to five all-hit batches: uniform
    -- ids at two sizes and the model's Zipf ids (fewer distinct rows than ids) at three; its
    -- moves: sparse rows of large tables, each miss evicting a dirty row
    assert.is_true(c:term("cache_per_batch") >= 0 and c:term("cache_per_row") >= 0)
    local fit = c.data.rates.cache_per_batch.source
    local runs = {}
    for n, what, u in fit:gmatch("(%d+) (%S+) ids %((%d+) distinct rows%) [%d.]+ ms") do
      runs[#runs + 1] = { n = tonumber(n), what = what, u = tonumber(u) }
    end
    assert.equal(5, #runs, fit)
    for i, what in ipairs({ "uniform", "uniform", "Zipf(1.05)", "Zipf(1.05)", "Zipf(1.05)" }) do
      assert.equal(what, runs[i].what, fit)
    end
    local n = runs[1].n
    assert.is_true(runs[2].n <= n / 4 and runs[3].n == n and runs[4].n == 2 * n and runs[5].n == 8 * n, fit)
    assert.is_true(runs[3].u < 0.6 * runs[1].u, fit)
    assert.matches("fitted with cache_per_id and cache_per_row to the five %(worst run %d+%% off", fit)
    assert.matches(("slots in %s memory"):format(gpu and "device" or "host"), fit, 1, true)
    local every, moved, wb, conflicts = c.data.rates.cache_row_fixed.source:match(
      "one row in (%d+)%): (%d+) rows moved a batch %((%d+) of them write%-backs, (%d+) conflicts%)")
    assert.is_truthy(moved, c.data.rates.cache_row_fixed.source)
    assert.is_true(tonumber(every) >= 200, "sparse rows, as a large table's misses")
    assert.is_true(tonumber(wb) > 0.3 * tonumber(moved), "the misses evict dirty rows: their write-backs are timed")
    assert.is_true(tonumber(conflicts) < 0.01 * tonumber(moved), "a cache with room: (almost) no conflicts")
    -- the shapes of this machine's kind (a GPU's: `--shapes gpu` below)
    assert.matches(gpu and "dlrm_mlperf_v1's bottom and top" or "dlrm_tiny's, dlrm_kaggle's",
                   c.data.rates.mlp_f32.source, 1, true)
    os.remove(out)
    local _, se2, rc2 = cmd.sh(("%s calibrate --bogus"):format(cmd.bin()))
    assert.equal(2, rc2)
    assert.matches("unknown option '--bogus'", se2, 1, true)
    local _, se3, rc3 = cmd.sh(("%s calibrate --shapes tpu --quick"):format(cmd.bin()))
    assert.equal(2, rc3)
    assert.matches("calibrate: --shapes: 'tpu' is not cpu or gpu\nusage: uvmrec calibrate ", se3, 1, true)
  end)

  -- The path a GPU takes by default, run here at the quick run's sizes: MLPerf's stacks (the
  -- top's input padded to 480), the interaction of 27 vectors of 128 as the bf16 model runs it,
  -- the managed tables read in place under the host hint policy; every rate within calib's range.
  it("measures at a GPU's shapes with --shapes gpu (on the CPU backend at --quick's sizes)", function()
    local out = os.tmpname()
    local so, se, rc = cmd.sh(("%s calibrate --shapes gpu --quick --out %s"):format(cmd.bin(), out))
    assert.equal(0, rc, se)
    assert.matches("gpu shapes, quick", so, 1, true)
    local c = assert(calib.load(out))
    assert.equal("uvmrec calibrate --shapes gpu --quick", c.data.command)
    -- on a GPU --quick keeps the GPU's sizes (small runs are launch-bound there)
    local gpu = require("uvmrec").gpu()
    for _, p in ipairs({ "f32", "tf32", "bf16" }) do
      local src = c.data.rates["mlp_" .. p].source
      assert.matches(("3 MLP stacks (dlrm_mlperf_v1's bottom and top, 128-128-128-128-128) at batch %s, %s"):format(
                     gpu and "16384 and 65536" or "256 and 1024", p), src, 1, true)
      assert.is_true(c:rate("mlp_" .. p) > 1e8, p)
      assert.is_true(c:term("mlp_act_" .. p) >= 0 and c:term("mlp_layer_" .. p) >= 0, p)
    end
    assert.matches(("dot interaction of 27 vectors of 128 (bf16), forward + backward at batch %d"):format(
                   gpu and 65536 or 256), c.data.rates.interaction_dot.source, 1, true)
    assert.matches(("embedding forward of managed tables (host policy), %d uniform ids"):format(
                   gpu and 262144 or 16384), c.data.rates.managed_gather.source, 1, true)
    for name, r in pairs(c.data.rates) do assert.is_nil(calib.check_value(name, r.value), name) end
    os.remove(out)
  end)
end)
