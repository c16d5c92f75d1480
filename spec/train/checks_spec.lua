-- uvmrec.train against silent wrong results (issue #26): held-out synthetic samples that
-- training never draws, resumes that must go forward and go on saving, data that runs out,
-- eval.min_auc without an evaluation, bad TSV lines in training, and numbers too large to
-- train on, each refused up front or reported, never an exit code 0 with a wrong answer.
local h = require "helpers"
local cmd = require "command"
local train = require "uvmrec.train"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"

local SAMPLE2 = h.fixture("criteo_raw_sample2.tsv") -- 400 real lines
local QUIET = function() end
local SMALL = { "train.batch_size=256", "eval.samples=4096", "eval.batch_size=4096" }

local function slurp(path) return cmd.slurp(path) or "" end

describe("uvmrec.train, against silent wrong results", function()
  local dir
  before_each(function() dir = cmd.tmpdir() end)
  after_each(function() cmd.rmdir(dir) end)

  it("holds out synthetic samples from 2^48 whatever train.steps says", function()
    for _, steps in ipairs { 1, 300, 1e6 } do
      local cfg = h.tiny(SMALL, { "train.steps=" .. steps })
      local d = assert(train.data(cfg, train.config.table_rows(cfg)))
      assert.same({ epoch = 0, sample = 2 ^ 48 }, d.eval.position)
      assert.equal(steps * 256, d.train.samples)
    end
    -- synthetic data named as the evaluation data is held out the same way
    local cfg = h.tiny(SMALL, { "train.steps=10", "data.eval=synthetic:tiny" })
    local d = assert(train.data(cfg, train.config.table_rows(cfg)))
    assert.same({ epoch = 0, sample = 2 ^ 48 }, d.eval.position)
  end)

  it("evaluates a checkpoint on the trainer's held-out samples without being told the training's steps", function()
    local r = h.train_tiny(SMALL, { "train.steps=20", "train.checkpoint_every=20" }, { out = dir .. "/run" })
    -- the YAML's 300 steps would have put the held-out samples inside a 300-step run's data
    local e = assert(train.eval(h.tiny(SMALL), { checkpoint = dir .. "/run", cpu = true, print = QUIET }))
    assert.equal(20, e.step)
    assert.equal(r.result.eval.auc, e.eval.auc)
    assert.equal(r.result.ceiling, e.ceiling)
  end)

  it("says why synthetic data has nothing to evaluate on with eval.samples 0", function()
    local none, err = train.eval(h.tiny(SMALL, { "eval.samples=0" }), { cpu = true, print = QUIET })
    assert.is_nil(none)
    assert.equal("no held-out data to evaluate on: eval.samples is 0 (synthetic data holds out that many samples); "
                 .. "give eval.samples, or --data files", err)
  end)

  it("refuses a synthetic epoch that would reach the held-out samples, before any work", function()
    for _, steps in ipairs { "100000000000000", "9007199254740991" } do
      local cfg = h.tiny { "train.steps=" .. steps }
      local none, err = train.data(cfg, train.config.table_rows(cfg))
      assert.is_nil(none)
      assert.matches("^synthetic:tiny: an epoch of %d+ samples %(train%.steps " .. steps
        .. " x train%.batch_size 1024%); "
        .. "synthetic training data stops below sample 2%^48, where the held%-out samples start$", err)
      local out, cerr, code = cmd.run("train dlrm_tiny --cpu --progress none --steps " .. steps)
      assert.equal(1, code, out)
      assert.matches("^uvmrec train: synthetic:tiny: an epoch of ", cerr)
      assert.is_nil(cerr:find("%.lua:%d+:"), cerr) -- no internal file:line
    end
  end)

  it("names --steps where a value of it is refused", function()
    -- the config's check, and the command line's own for a number past 2^53 (a usage error, 2)
    for _, c in ipairs { { "0", 1, "uvmrec train: --steps 0: train.steps: 0 trains until the data ends, and "
                                 .. "synthetic data (data.train synthetic:tiny) has no end without data.samples" },
                         { "1e20", 2, "uvmrec train: --steps: '1e20' is 2^53 or more; expected a whole number "
                                 .. "below 2^53" } } do
      local _, err, code = cmd.run("train dlrm_tiny --cpu --progress none --steps " .. c[1])
      assert.equal(c[2], code)
      assert.equal(c[3], err:sub(1, #c[3]))
    end
  end)

  it("refuses up front the settings too large to work, naming the limit", function()
    for _, case in ipairs {
      { "eval.samples", 2 ^ 30 }, { "eval.batch_size", 2 ^ 24 }, { "train.batch_size", 2 ^ 24 },
      { "train.epochs", 2 ^ 31 - 1 },
    } do
      local _, err, code = cmd.run(("train dlrm_tiny --cpu --progress none --set %s=9007199254740991"):format(case[1]))
      assert.equal(1, code, case[1])
      assert.equal(("uvmrec train: --set %s=9007199254740991: '9007199254740991' is not an integer <= %d\n"):format(
        case[1], case[2]), err)
    end
    local _, err = train.run(h.tiny { "train.checkpoint_every=9007199254740991" }, { cpu = true, print = QUIET })
    assert.equal("train.checkpoint_every is 9007199254740991: checkpoints need a run directory (--out RUNDIR)", err)
  end)

  it("refuses a resume that would end before its checkpoint, naming both steps; the run stays as it was", function()
    local run = dir .. "/run"
    h.train_tiny(SMALL, { "train.steps=20", "train.checkpoint_every=20" }, { out = run })
    local config, log = slurp(run .. "/config.json"), slurp(run .. "/metrics.jsonl")
    for _, steps in ipairs { 10, 19 } do
      local r, err = train.run(h.tiny(SMALL, { "train.steps=" .. steps }),
        { resume = run, out = run, cpu = true, progress = "none", print = QUIET })
      assert.is_nil(r)
      assert.equal(("--resume: %s is at step 20 and this run ends at step %d (train.steps, --steps): a resumed "
        .. "run goes on from its checkpoint; give 20 steps or more"):format(ck.latest(run .. "/checkpoints"), steps),
        err)
    end
    assert.equal(config, slurp(run .. "/config.json"))
    assert.equal(log, slurp(run .. "/metrics.jsonl"))
  end)

  it("goes on saving checkpoints on a resume as the run it resumes did, unless told otherwise", function()
    local run = dir .. "/run"
    h.train_tiny(SMALL, { "train.steps=20", "train.checkpoint_every=10", "eval.samples=0" }, { out = run })
    local steps = {}
    for _, c in ipairs(ck.list(run .. "/checkpoints")) do steps[#steps + 1] = c.step end
    assert.same({ 10, 20 }, steps)
    assert(train.run(h.tiny(SMALL, { "train.steps=40", "eval.samples=0" }),
      { resume = run, out = run, cpu = true, progress = "none", print = QUIET }))
    steps = {}
    for _, c in ipairs(ck.list(run .. "/checkpoints")) do steps[#steps + 1] = c.step end
    assert.same({ 10, 20, 30, 40 }, steps)
    -- a run that sets train.checkpoint_every itself has its own way
    assert(train.run(h.tiny(SMALL, { "train.steps=60", "eval.samples=0", "train.checkpoint_every=20" }),
      { resume = run, out = run, cpu = true, progress = "none", print = QUIET }))
    steps = {}
    for _, c in ipairs(ck.list(run .. "/checkpoints")) do steps[#steps + 1] = c.step end
    assert.same({ 10, 20, 30, 40, 60 }, steps)
  end)

  it("fails when the data runs out before train.steps, and trains to its end with train.steps 0", function()
    local data = { "data.train=criteo-tsv:" .. SAMPLE2, "train.batch_size=64", "eval.every=0" }
    local r, err = train.run(h.tiny(data, { "train.steps=100" }), { cpu = true, progress = "none", print = QUIET })
    assert.is_nil(r)
    assert.equal("the training data ran out at step 7 of train.steps 100 (400 samples trained; train.epochs 1 of "
      .. "criteo-tsv:" .. SAMPLE2 .. "): give more data or epochs (train.epochs), or train.steps 0 to train until "
      .. "the data ends", err)
    r = assert(train.run(h.tiny(data, { "train.steps=0" }), { cpu = true, progress = "none", print = QUIET }))
    assert.same({ 7, 400 }, { r.steps, r.samples })
    r = assert(train.run(h.tiny(data, { "train.steps=14", "train.epochs=2" }),
      { cpu = true, progress = "none", print = QUIET }))
    assert.same({ 14, 800 }, { r.steps, r.samples })
  end)

  it("fails when the training data gives no batch at all", function()
    local ur = require "uvmrec"
    local days = dir .. "/days"
    os.execute("mkdir -p " .. cmd.quote(days))
    assert(ur.data.npy_save(days .. "/day_0_dense.npy", ur.tensor({ 0, 13 })))
    assert(ur.data.npy_save(days .. "/day_0_sparse.npy", ur.tensor({ 0, 26 }, { dtype = "i32" })))
    assert(ur.data.npy_save(days .. "/day_0_labels.npy", ur.tensor({ 0 }, { dtype = "i32" })))
    local r, err = train.run(h.tiny { "data.train=criteo-bin:" .. days, "eval.every=0", "train.steps=0" },
      { cpu = true, progress = "none", print = QUIET })
    assert.is_nil(r)
    assert.equal("the training data gave no batch: nothing was trained (criteo-bin:" .. days .. ")", err)
  end)

  it("refuses eval.every where the run has no held-out data, which would never evaluate, before any work", function()
    -- accepted before, the run trained and never evaluated (it said "no evaluation" once, naming no setting)
    local out = dir .. "/run"
    local cfg = h.tiny { "data.train=criteo-tsv:" .. SAMPLE2, "train.batch_size=100", "train.steps=0" }
    local r, err = train.run(cfg, { cpu = true, progress = "none", print = QUIET, out = out })
    assert.is_nil(r)
    assert.matches("dlrm_tiny%.yaml:%d+:%d+$", require("uvmrec.config").where(cfg, "eval.every"))
    assert.equal(require("uvmrec.config").where(cfg, "eval.every") .. ": eval.every: 100, and this run has no "
      .. "held-out data to evaluate on (data.eval is not given, and data.train criteo-tsv:" .. SAMPLE2 .. " holds none "
      .. "out): give data.eval (--eval-data), or eval.every 0", err)
    assert.is_nil(cmd.slurp(out .. "/metrics.jsonl")) -- nothing done
    -- synthetic data holds out eval.samples of its own: with 0, none
    local _, serr, code = cmd.run("train dlrm_tiny --cpu --progress none --steps 100 --set eval.samples=0")
    assert.equal(1, code)
    assert.matches(": eval%.every: 100, and this run has no held%-out data to evaluate on %(data%.eval is not given, "
      .. "and eval%.samples is 0: synthetic data holds out that many samples%): give eval%.samples, data%.eval "
      .. "%(%-%-eval%-data%), or eval%.every 0\n$", serr)
    -- a run that ends before eval.every would evaluate only at its end in any case; one with data.eval evaluates
    assert(train.run(h.tiny { "eval.samples=0", "train.steps=2", "train.batch_size=64", "eval.min_auc=0" },
      { cpu = true, progress = "none", print = QUIET }))
    assert(train.run(h.tiny { "data.train=criteo-tsv:" .. SAMPLE2, "data.eval=criteo-tsv:" .. SAMPLE2,
                              "train.batch_size=100", "train.steps=0", "eval.min_auc=0", "eval.samples=100",
                              "eval.batch_size=100" }, { cpu = true, progress = "none", print = QUIET }))
  end)

  it("checks eval.min_auc only against an evaluation, and says once when there is none", function()
    local lines = {}
    local r = assert(train.run(h.tiny { "data.train=criteo-tsv:" .. SAMPLE2, "train.batch_size=100",
                                        "train.steps=0", "eval.min_auc=0.7", "eval.every=0" },
      { cpu = true, progress = "none", print = function(l) lines[#lines + 1] = l end }))
    assert.is_nil(r.eval)
    local said = 0
    for _, l in ipairs(lines) do
      if l == "eval.min_auc 0.7000 is not checked: this run has no evaluation" then said = said + 1 end
    end
    assert.equal(1, said, table.concat(lines, "\n"))
    -- with an evaluation it is checked
    local _, err = train.run(h.tiny(SMALL, { "train.steps=2", "eval.min_auc=0.99" }),
      { cpu = true, progress = "none", print = QUIET })
    assert.matches("^the final AUC 0%.%d+ is below eval%.min_auc 0%.9900$", err)
  end)

  it("skips bad TSV lines or pads short ones in training as convert does (data.on_bad_line, pad_missing_fields)",
    function()
    local lines = cmd.lines(SAMPLE2)
    lines[50] = lines[50]:gsub("\t[^\t]*\t[^\t]*$", "") -- 38 fields
    lines[60] = "2" .. lines[60]:sub(2)                  -- a label of 2
    local short = cmd.spit(dir .. "/short.tsv", table.concat(lines, "\n", 1, 55) .. "\n")
    local bad = cmd.spit(dir .. "/bad.tsv", table.concat(lines, "\n", 51) .. "\n")
    local base = { "train.batch_size=10", "eval.every=0", "train.steps=0" }
    local _, err = train.run(h.tiny(base, { "data.train=criteo-tsv:" .. short }),
      { cpu = true, progress = "none", print = QUIET })
    assert.equal("criteo-tsv: " .. short .. ":50: has 38 fields; expected 40", err)
    local r = assert(train.run(h.tiny(base, { "data.train=criteo-tsv:" .. short, "data.pad_missing_fields=true" }),
      { cpu = true, progress = "none", print = QUIET }))
    assert.equal(55, r.samples)
    _, err = train.run(h.tiny(base, { "data.train=criteo-tsv:" .. bad }),
      { cpu = true, progress = "none", print = QUIET })
    assert.equal("criteo-tsv: " .. bad .. ":10: label is '2'; expected 0 or 1", err)
    r = assert(train.run(h.tiny(base, { "data.train=criteo-tsv:" .. bad, "data.on_bad_line=skip" }),
      { cpu = true, progress = "none", print = QUIET }))
    assert.equal(349, r.samples)
    -- the command's error names the settings that take such lines
    local _, cerr, code = cmd.run("train dlrm_tiny --cpu --progress none --data criteo-tsv:" .. cmd.quote(short)
      .. " --set train.batch_size=10 --set eval.every=0 --steps 0")
    assert.equal(1, code)
    assert.equal("uvmrec train: criteo-tsv: " .. short .. ":50: has 38 fields; expected 40 (--set "
      .. "data.pad_missing_fields=true accepts lines of 15 to 39 fields (copies that lost their trailing tabs); "
      .. "--set data.on_bad_line=skip skips bad lines and counts them)\n", cerr)
    -- and uvmrec eval's, on held-out data with the line
    _, cerr, code = cmd.run("eval dlrm_tiny --cpu --set eval.batch_size=10 --data criteo-tsv:" .. cmd.quote(short))
    assert.equal(1, code)
    assert.equal("uvmrec eval: criteo-tsv: " .. short .. ":50: has 38 fields; expected 40 (--set "
      .. "data.pad_missing_fields=true accepts lines of 15 to 39 fields (copies that lost their trailing tabs); "
      .. "--set data.on_bad_line=skip skips bad lines and counts them)\n", cerr)
  end)

  it("writes a run directory's events as JSON lines it can read back", function()
    -- (the run directory of a failed run says why: a failed event, no final one)
    local run = dir .. "/run"
    local _, err = train.run(h.tiny { "data.train=criteo-tsv:" .. SAMPLE2, "train.batch_size=100", "eval.samples=0",
                                      "train.steps=10" }, { out = run, cpu = true, progress = "none", print = QUIET })
    assert.matches("^the training data ran out at step 4 of train%.steps 10", err)
    local events = assert(json.read_lines(run .. "/metrics.jsonl"))
    assert.same({ "failed", 4, err }, { events[#events].event, events[#events].step, events[#events].error })
    for _, e in ipairs(events) do assert.are_not.equal("final", e.event) end
  end)
end)
