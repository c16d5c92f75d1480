-- Held-out evaluation (uvmrec.train.evaluate): the set is the first `samples` samples of the
-- data, whatever the batches it comes in.
local ur = require "uvmrec"
local evaluate = require "uvmrec.train.evaluate"
local source = require "uvmrec.train.source"

-- A stand-in model whose prediction is a squashed dense feature: scores that vary by sample.
local function model()
  local m = ur.nn.Sequential()
  m.predict = function(_, b)
    local p = ur.tensor({ b.size, 1 })
    for i = 0, b.size - 1 do
      local x = b.dense[i * 13]
      p[i] = x / (1 + math.abs(x)) * 0.49 + 0.5
    end
    return p
  end
  return m
end

local function eval(batch_size, samples, loader_samples)
  local l = assert(ur.data.loader { data = "synthetic:tiny", samples = loader_samples, batch_size = batch_size })
  local r = assert(evaluate.run(model(), source.loader(l), { metrics = { "auc", "ne" }, samples = samples,
                                                             batch_size = batch_size }))
  l:close()
  return r
end

describe("uvmrec.train.evaluate", function()
  it("refuses grouped AUC, whose samples' groups it does not pass, naming it", function()
    local l = assert(ur.data.loader { data = "synthetic:tiny", samples = 64, batch_size = 64 })
    local r, err = evaluate.run(model(), source.loader(l), { metrics = { "auc", "gauc" }, samples = 64 })
    l:close()
    assert.is_nil(r)
    assert.equal("evaluate: metric 'gauc' needs each sample's group, which held-out evaluation does not pass; "
                 .. "expected auc, ne, accuracy, calibration or ctr", err)
  end)

  it("evaluates the first `samples` samples, also when they end inside a batch", function()
    local whole = eval(300, 300, 300)          -- exactly the first 300, in one batch
    for _, b in ipairs { 256, 64, 1000 } do
      local r = eval(b, 300, 1024)             -- the data goes on past them
      assert.equal(300, r.samples, b)
      assert.near(whole.auc, r.auc, 1e-12)
      assert.near(whole.logloss, r.logloss, 1e-9)
    end
  end)
end)

describe("uvmrec.train.evaluate of one class", function()
  local json = require "uvmrec.json"
  local cmd = require "command"

  -- a one-sample (one-class) evaluation printed 'AUC 0.5000' and logged "auc":0.5: AUC is undefined there
  it("says the AUC is undefined and why, logs it as null, and fails eval.min_auc with it", function()
    local l = assert(ur.data.loader { data = "synthetic:tiny", samples = 1, batch_size = 1 })
    local label = assert(l:next()).labels[0]
    l:close()
    local r = eval(1, 1, 1)
    assert.equal(1, r.samples)
    assert.is_nil(r.auc)
    local why = ("the 1 held-out label is %d"):format(label)
    assert.equal(why, r.auc_undefined)
    -- NE too: log loss over the entropy of a base rate of 0 or 1, which is 0 (it printed NE 2110034193817.5762)
    assert.is_nil(r.ne)
    assert.equal(why, r.ne_undefined)
    assert.is_number(r.logloss)
    assert.equal(("AUC undefined (%s)  NE undefined (%s)  logloss %.4f"):format(why, why, r.logloss),
                 evaluate.format(r))
    local line = json.decode(json.encode(evaluate.log_line(r, { event = "eval", step = 3 })))
    assert.same({ "eval", 3, why, why }, { line.event, line.step, line.auc_undefined, line.ne_undefined })
    assert.matches('"auc":null', json.encode(evaluate.log_line(r)), 1, true)
    assert.matches('"ne":null', json.encode(evaluate.log_line(r)), 1, true)
    local train = require "uvmrec.train"
    assert.equal(("the final AUC is undefined (%s), so it does not reach eval.min_auc 0.5000"):format(why),
                 train.check_min_auc({ eval = { min_auc = 0.5 } }, r))
    -- both classes: a number, no reason, no null
    local both = eval(300, 300, 300)
    assert.is_number(both.auc)
    assert.is_nil(both.auc_undefined)
    assert.equal(both.auc, json.decode(json.encode(evaluate.log_line(both))).auc)
  end)

  it("uvmrec eval prints it and writes null into the run log", function()
    local dir = cmd.tmpdir()
    local out, err, code = cmd.run("eval dlrm_tiny --cpu --set eval.samples=1 --out " .. dir)
    assert.equal(0, code, err)
    local why = out:match("\neval: AUC undefined %((the 1 held%-out label is [01])%)  NE undefined %(")
    assert.is_string(why, out)
    assert.matches("(1 sample, ", out, 1, true)
    local lines = assert(json.read_lines(dir .. "/metrics.jsonl"))
    assert.equal(why, lines[#lines].auc_undefined)
    assert.matches('"auc":null', assert(cmd.slurp(dir .. "/metrics.jsonl")), 1, true)
    cmd.rmdir(dir)
  end)
end)

describe("uvmrec.train.evaluate of held-out data shorter than eval.samples", function()
  local json = require "uvmrec.json"
  local cmd = require "command"
  local helpers = require "helpers"

  -- 300 real Criteo rows against eval.samples 1000: uvmrec eval printed '(300 samples, 0.0 s)',
  -- the asked 1000 said nowhere, as a training run's evaluations did
  it("says how many it scored against how many eval.samples asked, in uvmrec eval, a run's evaluations and the log",
     function()
    local dir = cmd.tmpdir()
    local lines = cmd.lines(helpers.fixture("criteo_raw_sample.tsv"))
    local tsv = cmd.spit(dir .. "/short.tsv", table.concat(lines, "\n", 1, 300) .. "\n")
    local run = ("eval dlrm_tiny --cpu --data criteo-tsv:%s --set eval.batch_size=128 --out %s/ev"):format(tsv, dir)
    local out, err, code = cmd.run(run .. " --set eval.samples=1000")
    assert.equal(0, code, err)
    assert.matches("(300 samples: the held-out data ends before the 1000 of eval.samples, ", out, 1, true)
    local log = assert(json.read_lines(dir .. "/ev/metrics.jsonl"))
    assert.equal(300, log[#log].samples)
    assert.equal(1000, log[#log].asked)
    -- as many as asked, or the whole file (eval.samples 0): the count alone
    for _, n in ipairs { 300, 0 } do
      out, err, code = cmd.run(run .. " --set eval.samples=" .. n)
      assert.equal(0, code, err)
      assert.matches("(300 samples, ", out, 1, true)
      log = assert(json.read_lines(dir .. "/ev/metrics.jsonl"))
      assert.is_nil(log[#log].asked)
    end
    out, err, code = cmd.run(("train dlrm_tiny --cpu --progress lines --set train.steps=2 "
      .. "--set data.eval=criteo-tsv:%s --set eval.samples=1000 --set eval.batch_size=128 "
      .. "--set eval.min_auc=0"):format(tsv))
    assert.equal(0, code, err)
    assert.matches("eval at step 2: [^\n]*%(300 samples: the held%-out data ends before the 1000 of "
      .. "eval%.samples, ", out)
    cmd.rmdir(dir)
  end)
end)
