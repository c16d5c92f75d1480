-- uvmrec.train on the CPU: dlrm_tiny trains (the loss falls, the held-out AUC passes 0.70 and
-- stays under the synthetic data's ceiling), the run directory holds the resolved config and
-- the metrics as JSON lines, and every component registered for checkpoints comes back.
local json = require "uvmrec.json"
local cmd = require "command"
local train = require "uvmrec.train"
local h = require "helpers"

local BASE = { "train.batch_size=512", "train.steps=160", "eval.samples=16384", "eval.every=80",
               "eval.batch_size=8192" }
local function tiny(sets) return h.tiny(BASE, sets) end

local function lines_of(path) return assert(json.read_lines(path)) end

describe("uvmrec.train", function()
  local dir
  before_each(function() dir = cmd.tmpdir() end)
  after_each(function() cmd.rmdir(dir) end)

  it("trains dlrm_tiny on the CPU: the loss falls and the held-out AUC passes 0.70", function()
    local cfg = tiny()
    local said, ctx = {}, nil
    local result = assert(train.run(cfg, { out = dir .. "/run", progress = "none", cpu = true,
                                           print = function(s) said[#said + 1] = s end,
                                           setup = function(c) ctx = c end }))
    assert.equal(160, result.steps)
    assert.equal(160 * 512, result.samples)
    assert.is_true(result.samples_per_s > 0)
    assert.equal(2, #result.evals, "at step 80 and at the end")
    assert.is_true(result.eval.auc > 0.70, "AUC " .. result.eval.auc)
    assert.is_true(result.eval.auc < result.ceiling + 0.01,
                   ("AUC %g, ceiling %g"):format(result.eval.auc, result.ceiling))
    assert.is_true(result.evals[2].auc > result.evals[1].auc - 0.01)
    assert.equal(16384, result.eval.samples)
    for _, k in ipairs { "ne", "logloss", "accuracy", "calibration", "ctr" } do
      assert.is_number(result.eval[k], k)
    end
    assert.matches("^final AUC %d%.%d+ %(the synthetic data's hidden%-model ceiling: %d%.%d+%)$", said[#said - 1])
    assert.matches("^uvmrec train: dlrm_tiny on the CPU$", said[1])

    -- the run directory: the config as resolved, then one JSON object a line
    local f = assert(io.open(dir .. "/run/config.json"))
    local saved = assert(json.decode(f:read("*a")))
    f:close()
    assert.equal(160, saved.train.steps)
    assert.equal(512, saved.train.batch_size)
    assert.same(cfg.embeddings.rows, saved.embeddings.rows)
    local log = lines_of(dir .. "/run/metrics.jsonl")
    assert.equal("start", log[1].event)
    local losses, evals = {}, 0
    for _, l in ipairs(log) do
      if l.event == "train" then losses[#losses + 1] = l.loss end
      if l.event == "eval" then evals = evals + 1 end
    end
    assert.equal(16, #losses, "the loss every log_every (10) steps")
    assert.equal(2, evals)
    local first = (losses[1] + losses[2]) / 2
    local last = (losses[#losses] + losses[#losses - 1]) / 2
    assert.is_true(last < first - 0.05, ("loss %g -> %g"):format(first, last))
    assert.same({ "final", 160 }, { log[#log].event, log[#log].steps })

    -- every component comes back through the checkpoint registry: the same held-out metrics
    -- the trainer's own four first; other subsystems' components (hints' layout) may follow
    assert.same({ "dense", "embeddings", "optimizer", "trainer" }, { unpack(ctx.registry:components(), 1, 4) })
    assert(ctx.registry:save(dir .. "/ck.safetensors", { step = ctx.step, config = cfg }))
    local back
    local r = assert(train.eval(tiny(), { cpu = true, print = function() end, setup = function(c)
      back = assert(c.registry:load(dir .. "/ck.safetensors", { config = cfg }))
      assert.equal(160, c.first - 1)
      assert.equal(160, c.optimizer.step_count)
    end }))
    assert.equal(160, back.step)
    assert.near(result.eval.auc, r.eval.auc, 1e-6)
    assert.near(result.eval.logloss, r.eval.logloss, 1e-6)
  end)

  it("feeds batches through buffers of their own as it does onto a GPU, equal to the loader's", function()
    local ur = require "uvmrec"
    local function loader()
      return assert(ur.data.loader { data = "synthetic:dcnv2", samples = 700, batch_size = 256, seed = 3 })
    end
    local a, b = loader(), loader()
    local feed = train.feed.new(b, { gpu = true, placement = "managed" })
    local n = 0
    while true do
      local x, y = a:next(), assert(feed:next() or true)
      if not x then
        assert.is_true(y)
        break
      end
      n = n + 1
      assert.equal(x.size, y.size)
      assert.equal("managed", y.dense:placement())
      assert.same(x.dense:totable(), y.dense:totable())
      assert.same(x.labels:totable(), y.labels:totable())
      for _, k in ipairs { "values", "offsets" } do
        local t = x.sparse[k](x.sparse)
        assert.same(t:totable(), y.sparse[k]:totable(), k)
      end
    end
    assert.equal(3, n, "two full batches and the rest")
    feed:free()
    a:close()
    b:close()
  end)

  it("evaluates a config's model on held-out data with uvmrec eval", function()
    local out, err, code = cmd.run("eval dlrm_tiny --cpu --data synthetic:tiny --set eval.samples=2048 --out "
                                   .. cmd.quote(dir .. "/ev"))
    assert.equal(0, code, err)
    assert.matches("^uvmrec eval: dlrm_tiny on the CPU\nmodel: DLRM: ", out)
    assert.matches("\ndata: synthetic:tiny: 307200 samples an epoch; evaluation on the 2048 samples after them\n", out)
    assert.matches("\neval: AUC 0%.%d+  NE %d+%.%d+  logloss %d+%.%d+  accuracy 0%.%d+  calibration %d+%.%d+  "
                   .. "CTR 0%.%d+  %(2048 samples, [%d.]+ s%)\n", out)
    assert.matches("\nthe synthetic data's hidden%-model ceiling: 0%.8%d+\n$", out)
    local log = lines_of(dir .. "/ev/metrics.jsonl")
    assert.same({ "eval", 2048 }, { log[1].event, log[1].samples })
    out, err, code = cmd.run("eval dlrm_tiny --cpu --data criteo-tsv:/nonexistent/day_0")
    assert.equal(1, code)
    assert.is_nil(out:find("\neval: "))
    assert.equal("uvmrec eval: criteo-tsv: /nonexistent/day_0: cannot open: No such file or directory\n", err)
  end)

  it("holds out synthetic samples after the training ones and reports data errors", function()
    local cfg = tiny()
    local d = assert(train.data(cfg, train.config.table_rows(cfg)))
    assert.equal(160 * 512, d.train.samples)
    assert.same({ epoch = 0, sample = 160 * 512 }, d.eval.position)
    assert.equal(160 * 512 + 16384, d.eval.samples)
    assert.equal(160, d.steps)
    -- a rows cap shrinks the synthetic tables too, so every id fits
    cfg = tiny { "embeddings.max_rows=100" }
    d = assert(train.data(cfg, train.config.table_rows(cfg)))
    assert.equal(100, d.train.data.spec.tables[16].rows)
    assert.equal(4, d.train.data.spec.tables[1].rows)
    cfg = tiny { "data.train=synthetic:nothing" }
    local none, err = train.data(cfg, train.config.table_rows(cfg))
    assert.is_nil(none)
    assert.matches("^%-%-data synthetic:nothing: 'nothing' is neither a preset", err)
    cfg = tiny { "data.train=parquet:/x" }
    none, err = train.data(cfg, train.config.table_rows(cfg))
    assert.is_nil(none)
    assert.matches("'parquet:/x' is not a data spec", err)
    cfg = tiny { "data.train=synthetic:kaggle", "embeddings.rows=5,5" }
    none, err = train.data(cfg, train.config.table_rows(cfg))
    assert.is_nil(none)
    assert.equal("--data synthetic:kaggle: 26 sparse features, but the model has 2 tables", err)
  end)
end)
