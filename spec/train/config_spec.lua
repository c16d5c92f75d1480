-- The training config (uvmrec.train.config): the presets in models/ load, defaults fill in,
-- --set reaches every value through the schema, and each class of error names the file, line
-- and column of the value to change (or the --set that gave it).
local train = require "uvmrec.train"
local tconfig = train.config

local base = [[
model:
  bottom_mlp: [8, 4]
  top_mlp: [6, 1]
embeddings:
  dim: 4
  rows: [10, 20, 30]
optimizer: {name: sgd, lr: 0.1}
]]

local function parse(text, sets) return tconfig.parse(text, "t.yaml", sets) end

describe("uvmrec.train.config", function()
  it("loads every preset in models/ and fills the defaults", function()
    local dir = train.models_dirs()[1]
    for _, name in ipairs { "dlrm_tiny", "dlrm_kaggle", "dlrm_mlperf_v1", "dlrm_mlperf_v1_2m", "dlrm_dcnv2" } do
      local path = assert(train.find_config(name))
      assert.truthy(path:match("/" .. name .. "%.yaml$"), path)
      local cfg = assert(tconfig.load(path))
      assert.equal(name, cfg.name)
      assert.equal(26, #cfg.embeddings.rows)
      assert.equal(13, cfg.model.dense_features)
      assert(train.model_def(cfg, path))
    end
    assert.truthy(dir)
    local cfg = assert(tconfig.load(assert(train.find_config("dlrm_mlperf_v1_2m"))))
    local rows = tconfig.table_rows(cfg)
    assert.equal(2000000, rows[1])
    assert.equal(39043, rows[2])
    assert.same({ "dot", "bf16", 65536 }, { cfg.model.interaction, cfg.model.precision, cfg.train.batch_size })
    local dcn = assert(tconfig.load(assert(train.find_config("dlrm_dcnv2"))))
    assert.same({ "dcnv2", 3, 512, "rowwise_adagrad" },
                { dcn.model.interaction, dcn.model.cross_layers, dcn.model.cross_rank, dcn.embeddings.optimizer.name })
    local none, err = train.find_config("dlrm_nothing")
    assert.is_nil(none)
    assert.equal("dlrm_nothing: no such config file, nor a preset in models/", err)
  end)

  it("fills defaults and applies --set to any value, typed by the schema", function()
    local cfg = assert(parse(base, { "train.batch_size=4096", "model.bottom_mlp=16,4", "embeddings.max_rows=15",
                                     "embeddings.tables.C2.placement=managed", "model.precision=bf16" }))
    assert.same({ 4096, 1, 10, 0 }, { cfg.train.batch_size, cfg.train.seed, cfg.train.log_every, cfg.train.steps })
    assert.same({ 16, 4 }, cfg.model.bottom_mlp)
    assert.same({ 10, 15, 15 }, tconfig.table_rows(cfg))
    assert.same({ C2 = { placement = "managed" } }, cfg.embeddings.tables)
    assert.same({ "auc", "ne", "accuracy", "calibration", "ctr" }, cfg.eval.metrics)
    assert.equal("bf16", cfg.model.precision)
    -- defaults are not shared: a --set on one config leaves the next one alone
    local again = assert(parse(base))
    assert.same({}, again.embeddings.tables)
  end)

  it("gives the learning-rate factor of each schedule", function()
    local cfg = assert(parse(base .. "schedule: {name: dlrm, warmup_steps: 10, decay_start: 20, decay_steps: 10}\n"))
    local f = tconfig.schedule(cfg)
    assert.near(0.5, f(5), 1e-12)
    assert.near(1, f(15), 1e-12)
    assert.near(0.25, f(25), 1e-12)
    assert.is_nil(tconfig.schedule(assert(parse(base))))
  end)

  it("takes the other interaction's settings at their defaults, as a run's config.json holds them", function()
    local cfg = assert(parse((base:gsub("top_mlp: %[6, 1%]", "top_mlp: [6, 1]\n  cross_layers: 3\n  cross_rank: 0"))))
    assert.same({ "dot", 3, 0 }, { cfg.model.interaction, cfg.model.cross_layers, cfg.model.cross_rank })
  end)

  local cases = {
    { "an unknown key", base .. "trian: {steps: 3}\n",
      "t.yaml:8:1: unknown key 'trian'; expected one of data, embeddings, eval, model, name, optimizer, schedule, "
      .. "train" },
    { "an unknown nested key", base:gsub("top_mlp", "top_mpl"), "t.yaml:3:3: model: unknown key 'top_mpl'" },
    { "a wrong type", base .. "train: {batch_size: big}\n",
      "t.yaml:8:21: train.batch_size: 'big' is not a decimal integer" },
    { "a quoted number", base .. "train: {steps: '10'}\n",
      "t.yaml:8:16: train.steps: '10' is not an integer (not a quoted string)" },
    { "an impossible value", base .. "train: {batch_size: 0}\n",
      "t.yaml:8:21: train.batch_size: '0' is not an integer >= 1" },
    { "a bad enum", base .. "eval: {metrics: [auc, f1]}\n",
      "t.yaml:8:23: eval.metrics[2]: 'f1' is not one of auc, ne, accuracy, calibration, ctr" },
    { "a missing section", "model: {bottom_mlp: [4], top_mlp: [1]}\noptimizer: {lr: 1}\n",
      "t.yaml:1:1: missing key 'embeddings'" },
    { "a bottom MLP that does not end at the embedding dim", base:gsub("%[8, 4%]", "[8, 5]"),
      "t.yaml:2:19: model.bottom_mlp[2]: the dot interaction needs the bottom MLP to end at embeddings.dim (4), "
      .. "not 5" },
    { "a top MLP that does not end at one logit", base:gsub("%[6, 1%]", "[6, 2]"),
      "t.yaml:3:16: model.top_mlp[2]: the top MLP gives one logit: its last width must be 1, not 2" },
    { "an embedding dim the tables cannot hold", base:gsub("dim: 4", "dim: 6"):gsub("%[8, 4%]", "[8, 6]"),
      "t.yaml:5:8: embeddings.dim: 6 is not a multiple of 4" },
    { "a table that does not exist", (base:gsub("optimizer:", "  tables: {C4: {placement: host}}\noptimizer:")),
      "t.yaml:7:16: embeddings.tables.C4: no table 'C4'; tables are C1 to C3" },
    { "a cross rank too large",
      base:gsub("top_mlp: %[6, 1%]", "top_mlp: [6, 1]\n  interaction: dcnv2\n  cross_rank: 16"),
      "t.yaml:5:15: model.cross_rank: rank 16 is not below the cross layers' width 16" },
    { "cross layers under the dot interaction", base:gsub("top_mlp: %[6, 1%]", "top_mlp: [6, 1]\n  cross_rank: 2"),
      "t.yaml:4:15: model.cross_rank: the dot interaction takes no cross_rank (a setting of the dcnv2 interaction)" },
    { "self-interaction under dcnv2",
      base:gsub("top_mlp: %[6, 1%]", "top_mlp: [6, 1]\n  interaction: dcnv2\n  self_interaction: true"),
      "t.yaml:5:21: model.self_interaction: the dcnv2 interaction takes no self_interaction (a setting of the dot "
      .. "interaction)" },
    { "a schedule without its steps", base .. "schedule: {name: dlrm, warmup_steps: 10}\n",
      "t.yaml:8:11: schedule.decay_steps: the dlrm schedule decays over decay_steps >= 1 steps" },
    { "a dlrm schedule decaying inside its warm-up",
      base .. "schedule: {name: dlrm, warmup_steps: 10, decay_start: 5, decay_steps: 10}\n",
      "t.yaml:8:55: schedule.decay_start: the dlrm schedule decays after its warm-up: decay_start 5 is before "
      .. "warmup_steps 10" },
    { "synthetic data of no length", base .. "data: {train: 'synthetic:tiny'}\n",
      "t.yaml:8:15: data.train: synthetic data needs train.steps or data.samples" },
    { "a setting the optimizer does not take", base:gsub("lr: 0.1", "lr: 0.1, beta1: 0.8"),
      "t.yaml:7:40: optimizer.beta1: sgd takes no setting 'beta1' (its settings: clip_norm, lr, momentum, "
      .. "weight_decay)" },
    { "an anchor", base .. "train: &t {steps: 3}\n", "t.yaml:8:8: anchors (&name) are not allowed" },
    { "an alias", base .. "name: *n\n", "t.yaml:8:7: aliases (*name) are not allowed" },
    { "a duplicate key", base .. "optimizer: {lr: 1}\n", "t.yaml:8:1: duplicate key 'optimizer' (first at line 7)" },
    { "nesting too deep", base .. "name: " .. ("["):rep(70) .. ("]"):rep(70) .. "\n",
      "t.yaml:8:70: nesting deeper than 64 levels" },
  }
  -- the dense gradients' clipping by norm (clip_grad_norm_'s max_norm): a finite number >= 0
  for _, v in ipairs { { "-1", "'-1' is not a number >= 0" }, { ".inf", "'.inf' is not a number" },
                       { "[1]", "expected a number" } } do
    cases[#cases + 1] = { "optimizer.clip_norm " .. v[1], base:gsub("lr: 0.1", "lr: 0.1, clip_norm: " .. v[1]),
                          "t.yaml:7:44: optimizer.clip_norm: " .. v[2] }
  end
  for _, c in ipairs(cases) do
    it("rejects " .. c[1] .. ", naming file:line:column", function()
      local cfg, err = parse(c[2])
      assert.is_nil(cfg)
      assert.equal(c[3], err:sub(1, #c[3]))
    end)
  end

  it("names the --set that gave a value when a check blames it", function()
    local cases2 = {
      { "model.bottom_mlp=8,5", "--set model.bottom_mlp=8,5: model.bottom_mlp[2]: the dot interaction needs" },
      { "train.batch_size=-1", "--set train.batch_size=-1: '-1' is not an integer >= 1" },
      { "model.bottm_mlp=4", "--set model.bottm_mlp=4: 'model.bottm_mlp' is not a setting" },
      { "embeddings.tables.C9.placement=host",
        "--set embeddings.tables.C9.placement=host: embeddings.tables.C9: no table 'C9'" },
      { "embeddings.tables.C1.placement=hbm", "--set embeddings.tables.C1.placement=hbm: 'hbm' is not one of auto" },
      -- an optimizer's settings are checked when the config is, not at the run's first step,
      -- and one the optimizer would ignore is refused
      { "optimizer.momentum=0.9", "--set optimizer.momentum=0.9: optimizer.momentum: adagrad takes no setting "
        .. "'momentum' (its settings: clip_norm, eps, lr, weight_decay)", "optimizer.name=adagrad" },
      { "optimizer.beta1=0.5", "--set optimizer.beta1=0.5: optimizer.beta1: sgd takes no setting 'beta1'" },
      { "optimizer.beta2=1", "--set optimizer.beta2=1: optimizer.beta2: 1; expected a number in [0, 1)",
        "optimizer.name=adam" },
      { "optimizer.eps=0", "--set optimizer.eps=0: optimizer.eps: 0; expected a finite number > 0",
        "optimizer.name=adamw" },
      { "embeddings.optimizer.eps=1e-3", "--set embeddings.optimizer.eps=1e-3: embeddings.optimizer.eps: sgd takes "
        .. "no setting 'eps' (its settings: lr, max_grad, weight_decay)" },
      { "embeddings.optimizer.beta1=1", "--set embeddings.optimizer.beta1=1: embeddings.optimizer.beta1: 1; expected",
        "embeddings.optimizer.name=adam" },
      -- a pipeline setting without the pipeline
      { "train.drain=false", "--set train.drain=false: train.drain: drain is what the prefetch pipeline does at the "
        .. "data's end, and train.pipeline is off; give train.pipeline: true, or leave drain out" },
      -- a schedule's setting without a schedule that takes it
      { "schedule.warmup_steps=10", "--set schedule.warmup_steps=10: schedule.warmup_steps: the schedule is "
        .. "constant (schedule.name is not given), which takes no setting; give schedule.name: warmup or dlrm" },
      -- a decay setting under the warm-up schedule, which does not decay (it was ignored: a run of
      -- name warmup, decay_steps 100 trained at the full rate after its warm-up)
      { "schedule.decay_steps=100", "--set schedule.decay_steps=100: schedule.decay_steps: the warmup schedule "
        .. "does not decay, and takes no decay_steps (a setting of the dlrm schedule: warm-up, then decay); give "
        .. "schedule.name: dlrm", "schedule.name=warmup", "schedule.warmup_steps=10" },
      { "schedule.min_factor=0.1", "--set schedule.min_factor=0.1: schedule.min_factor: the warmup schedule does "
        .. "not decay, and takes no min_factor", "schedule.name=warmup", "schedule.warmup_steps=10" },
      -- more steps than synthetic data of data.samples an epoch gives (each epoch ends in its own
      -- last batch): it trained all 20 and then failed, "the training data ran out at step 20"
      { "train.steps=21", "--set train.steps=21: train.steps: 21 steps, and the data gives 20: train.epochs 2 of "
        .. "data.samples 10000 (10 batches of train.batch_size 1024 an epoch); give train.epochs 3, or train.steps 0 "
        .. "to train until the data ends", "data.train=synthetic:tiny", "data.samples=10000", "train.epochs=2" },
      -- the same with data.drop_last, whose epochs give 9 whole batches: 19 passed the check (it
      -- counted 10 an epoch) and the run failed when the data ended after 18
      { "train.steps=19", "--set train.steps=19: train.steps: 19 steps, and the data gives 18: train.epochs 2 of "
        .. "data.samples 10000 (9 batches of train.batch_size 1024 an epoch)", "data.train=synthetic:tiny",
        "data.samples=10000", "train.epochs=2", "data.drop_last=true" },
      -- an epoch shorter than a batch, which data.drop_last drops whole: it said "give train.epochs
      -- -9223372036854775808" (steps / 0 batches), or with train.steps 0 failed after building the model
      { "data.samples=100", "--set data.samples=100: data.samples: 100 samples an epoch, fewer than a batch "
        .. "(train.batch_size 1024), which data.drop_last drops: no batch to train; give data.samples 1024 or more, a "
        .. "smaller train.batch_size, or data.drop_last false", "data.train=synthetic:tiny", "train.steps=5",
        "data.drop_last=true" },
      { "data.samples=100", "--set data.samples=100: data.samples: 100 samples an epoch, fewer than a batch",
        "data.train=synthetic:tiny", "data.drop_last=true" },
      -- all of synthetic held-out data, which has no end: it trained, then failed "evaluate: the held-out data
      -- gave no batch"
      { "eval.samples=0", "--set eval.samples=0: eval.samples: 0 takes all of data.eval, and synthetic data "
        .. "(data.eval synthetic:tiny) has no end: give the held-out samples to draw, eval.samples > 0",
        "data.eval=synthetic:tiny" },
    }
    for _, c in ipairs(cases2) do
      local sets = { unpack(c, 3) } -- the --sets before the one blamed
      sets[#sets + 1] = c[1]
      local cfg, err = parse(base, sets)
      assert.is_nil(cfg, c[1])
      assert.equal(c[2], err:sub(1, #c[2]))
    end
  end)

  it("takes the tables' gradient clipping, embeddings.optimizer.max_grad, into the model's fused step", function()
    -- not in the schema: "unknown key 'max_grad'", though the engine clips with it
    local h = require "helpers"
    local sets = { "embeddings.optimizer.name=sgd", "embeddings.optimizer.lr=1", "train.batch_size=256",
                   "train.steps=1" }
    local function moved(more)
      local cfg = h.tiny(sets, more)
      local fresh = assert(assert(train.model_def(cfg)).build(cfg, { cpu = true }))
      local _, model = h.step_losses(cfg, true, 1)
      local most = 0
      for _, name in ipairs { "C3", "C12", "C16" } do
        local a, b = assert(fresh.embeddings:table(name):totable()), assert(model.embeddings:table(name):totable())
        for i = 1, #a do most = math.max(most, math.abs(a[i] - b[i])) end
      end
      return most
    end
    local free, clipped = moved {}, moved { "embeddings.optimizer.max_grad=1e-4" }
    assert.is_true(free > 1e-3, tostring(free))       -- unclipped, some element moves further
    -- lr 1 x at most 1e-4, and the rounding of an f32 row (a ulp of values near 0.1 is 7e-9)
    assert.is_true(clipped > 0 and clipped <= 1e-4 + 1e-8, tostring(clipped))
    -- its range, at the value
    local _, err = parse(base:gsub("rows: %[10, 20, 30%]", "rows: [10, 20, 30]\n  optimizer: {max_grad: -1}"))
    assert.equal("t.yaml:7:25: embeddings.optimizer.max_grad: '-1' is not a number >= 0", err)
    _, err = parse(base, { "embeddings.optimizer.max_grad=inf" })
    assert.equal("--set embeddings.optimizer.max_grad=inf: 'inf' is not a number", err)
  end)

  it("names the command's flag that gave a value, where its check or its type blames it", function()
    -- `uvmrec train dlrm_tiny --steps 0` blamed the YAML's data.train ("FILE:21:10: data.train: synthetic data needs
    -- train.steps or data.samples to know its length"), and --steps 1e20 a --set of -2^63
    local synth = "data:\n  train: synthetic:tiny\n"
    local _, err = parse(base .. synth, { { "train.steps=0", flag = "--steps 0" } })
    assert.equal("--steps 0: train.steps: 0 trains until the data ends, and synthetic data (data.train synthetic:tiny) "
      .. "has no end without data.samples: give train.steps > 0, or data.samples", err)
    _, err = parse(base .. synth, { { "train.steps=100000000000000000000", flag = "--steps 100000000000000000000" } })
    assert.equal("--steps 100000000000000000000: train.steps: '100000000000000000000' is not an integer below 2^53",
                 err)
    -- given in the file, the value blames itself there; left at its default, the data is blamed
    _, err = parse(base .. synth .. "train: {steps: 0}\n")
    assert.matches("^t%.yaml:10:16: train%.steps: 0 trains until the data ends", err)
    _, err = parse(base .. synth)
    assert.equal("t.yaml:9:10: data.train: synthetic data needs train.steps or data.samples to know its length", err)
    assert(parse(base .. synth, { { "train.steps=10", flag = "--steps 10" } }))
  end)

  it("takes as many steps as synthetic data of data.samples an epoch gives", function()
    local sets = { "data.train=synthetic:tiny", "data.samples=10000", "train.epochs=2", "train.steps=20" }
    assert.equal(20, assert(parse(base, sets)).train.steps)
    sets[4] = "train.steps=0" -- until the data ends
    assert(parse(base, sets))
  end)

  it("takes a cache load factor and a hint allowance per table, each on a table of its placement", function()
    local cfg = assert(parse(base, { "embeddings.placement=cached", "embeddings.tables.C2.cache.load_factor=0.05",
                                     "embeddings.tables.C3.placement=managed",
                                     "embeddings.tables.C3.hints.allowance=20%" }))
    assert.same({ C2 = { cache = { load_factor = 0.05 } },
                  C3 = { placement = "managed", hints = { allowance = "20%" } } },
                cfg.embeddings.tables)
    local cases3 = {
      { { "embeddings.tables.C1.cache.load_factor=0.5" }, "--set embeddings.tables.C1.cache.load_factor=0.5: "
        .. "embeddings.tables.C1.cache.load_factor: table C1 is placed auto (embeddings.placement): a load factor "
        .. "sizes the cache of a cached table" },
      { { "embeddings.placement=cached", "embeddings.tables.C1.cache.load_factor=0" },
        "--set embeddings.tables.C1.cache.load_factor=0: embeddings.tables.C1.cache.load_factor: 0; expected a "
        .. "number in (0, 1]" },
      { { "embeddings.placement=cached", "embeddings.cache.shared=true", "embeddings.tables.C1.cache.load_factor=0.5" },
        "--set embeddings.tables.C1.cache.load_factor=0.5: embeddings.tables.C1.cache.load_factor: a load factor "
        .. "per table needs sets per table, and embeddings.cache.shared puts every cached table in one pool" },
      { { "embeddings.tables.C2.placement=host", "embeddings.tables.C2.hints.allowance=1GiB" },
        "--set embeddings.tables.C2.hints.allowance=1GiB: embeddings.tables.C2.hints.allowance: table C2 is "
        .. "placed host (embeddings.tables.C2.placement): hints steer the rows of a managed table" },
      -- a device table's policy was taken and dropped (the manager of C3 refused it only at the run's start,
      -- and with no managed table at all no manager ran)
      { { "embeddings.tables.C3.placement=managed", "embeddings.tables.C1.hints.policy=adaptive" },
        "--set embeddings.tables.C1.hints.policy=adaptive: embeddings.tables.C1.hints.policy: table C1 is placed "
        .. "auto (embeddings.placement): hints steer the rows of a managed table" },
      { { "embeddings.placement=device", "embeddings.tables.C1.hints.options.margin=0.1" },
        "--set embeddings.tables.C1.hints.options.margin=0.1: embeddings.tables.C1.hints.options: table C1 is "
        .. "placed device (embeddings.placement): hints steer the rows of a managed table" },
    }
    for _, c in ipairs(cases3) do
      local got, err = parse(base, c[1])
      assert.is_nil(got, c[2])
      assert.equal(c[2], err:sub(1, #c[2]))
    end
  end)

  it("gives the tables' sharding as uvmrec.dist.plan reads it, a default and per table", function()
    local cfg = assert(parse(base, { "embeddings.tables.C2.sharding=row_wise" }))
    assert.same({ default = "table_wise", C2 = "row_wise" }, tconfig.sharding(cfg))
    cfg = assert(parse((base:gsub("rows: %[10, 20, 30%]\n",
      "rows: [10, 20, 30]\n  sharding: column_wise\n  tables: {C3: {sharding: data_parallel}}\n"))))
    assert.same({ default = "column_wise", C3 = "data_parallel" }, tconfig.sharding(cfg))
    local _, err = parse(base, { "embeddings.sharding=diagonal" })
    assert.matches("'diagonal' is not one of table_wise, row_wise, column_wise, data_parallel", err)
  end)

  it("refuses what a run over ranks cannot do, at the value to change", function()
    local function world_err(sets, world)
      return tconfig.check_world(assert(parse(base, sets)), world)
    end
    assert.is_nil(world_err({}, 1))
    -- a training run checks its final AUC against eval.min_auc: the evaluation must compute it (a config
    -- that `uvmrec eval` reads takes any metrics)
    assert.is_nil(world_err({ "eval.metrics=ne,ctr" }, 1))
    assert.equal("--set eval.metrics=ne,ctr: eval.metrics: eval.min_auc is 0.7: the AUC a training run checks "
      .. "needs auc among the metrics (or eval.min_auc 0)", world_err({ "eval.min_auc=0.7", "eval.metrics=ne,ctr" }, 1))
    assert.is_nil(world_err({ "train.batch_size=1026", "eval.batch_size=1026", "eval.samples=2052" }, 3))
    assert.equal("--set train.batch_size=1025: train.batch_size: 1025 is not a multiple of the 2 ranks: each rank "
      .. "takes an equal slice of every global batch", world_err({ "train.batch_size=1025" }, 2))
    -- synthetic data holds out its eval.samples
    assert.matches("eval.batch_size: 16384 is not a multiple of the 3 ranks",
                   world_err({ "data.train=synthetic:tiny", "train.steps=10", "train.batch_size=1026" }, 3))
    assert.matches("eval.samples: 1001 is not a multiple of the 2 ranks",
                   world_err({ "data.train=synthetic:tiny", "train.steps=10", "eval.samples=1001" }, 2))
    -- nor do files without data.eval
    assert.is_nil(world_err({ "data.train=criteo-tsv:x.tsv", "eval.batch_size=1023" }, 2))
    -- eval.every needs held-out data: without any the run would never evaluate
    assert.equal("--set eval.every=5: eval.every: 5, and this run has no held-out data to evaluate on (data.eval is "
      .. "not given, and data.train criteo-tsv:x.tsv holds none out): give data.eval (--eval-data), or eval.every 0",
      world_err({ "data.train=criteo-tsv:x.tsv", "eval.every=5" }, 1))
    assert.is_nil(world_err({ "data.train=criteo-tsv:x.tsv", "eval.every=5", "data.eval=criteo-tsv:y.tsv" }, 1))
    assert.is_nil(world_err({ "data.train=criteo-tsv:x.tsv", "eval.every=5", "train.steps=4" }, 1)) -- never reached
    -- a data spec that is none is what is wrong (eval.every blamed data.train bogus:x for holding none out)
    local NOT = "is not a data spec; expected synthetic:NAME, criteo-tsv:PATH[,PATH...] or criteo-bin:DIR"
    assert.equal("--set data.train=bogus:x: data.train: 'bogus:x' " .. NOT,
                 world_err({ "data.train=bogus:x", "eval.every=5" }, 1))
    assert.equal("--set data.eval=tsv:y: data.eval: 'tsv:y' " .. NOT,
                 world_err({ "data.train=criteo-tsv:x.tsv", "data.eval=tsv:y" }, 1))
    -- a run that does not evaluate (synthetic data, eval.samples 0) has no evaluation batches to slice
    assert.is_nil(world_err({ "eval.samples=0", "eval.batch_size=1023" }, 2))
    -- an epoch of synthetic samples ends in a batch of what is left: it failed there, steps into the
    -- run ("dist: rank 0 has a batch of 0 samples and rank 1 of 1"); refused where the run reaches it
    assert.equal("--set data.samples=4097: data.samples: an epoch of 4097 samples ends in a batch of 1 "
      .. "(train.batch_size 1024), which the 2 ranks cannot share equally: each rank takes an equal slice of every "
      .. "global batch (make it a multiple of 2, or data.drop_last: true drops that batch)",
      world_err({ "data.samples=4097", "train.batch_size=1024", "train.steps=10" }, 2))
    -- or, asked for, the loader drops it (the run says so)
    assert.is_nil(world_err({ "data.samples=4097", "train.batch_size=1024", "data.drop_last=true" }, 2))
    assert.matches("data.samples: an epoch of 4097 samples", world_err({ "data.samples=4097", "train.batch_size=1024",
                                                                          "train.steps=0" }, 2))
    assert.is_nil(world_err({ "data.samples=4097", "train.batch_size=1024", "train.steps=4" }, 2)) -- never reached
    assert.is_nil(world_err({ "data.samples=4098", "train.batch_size=1024", "train.steps=10" }, 2))
    assert.is_nil(world_err({ "data.samples=4097", "train.batch_size=1024", "train.steps=10" }, 1))
    -- checkpoints and --resume work over ranks (the shards through uvmrec.dist.checkpoint)
    assert.is_nil(world_err({ "train.checkpoint_every=5" }, 2))
    -- so do the prefetch pipeline and managed and cached tables (spec/dist/pipeline_spec.lua)
    assert.is_nil(world_err({ "train.pipeline=true", "embeddings.tables.C2.placement=managed",
                              "embeddings.tables.C3.placement=cached" }, 2))
  end)

  it("turns managed collisions on by a policy, as a default or per table, settings inheriting", function()
    local none = assert(parse(base))
    assert.same({}, tconfig.collisions(none))
    local cfg = assert(parse(base, { "embeddings.collisions.policy=lru", "embeddings.collisions.evict_every=50",
                                     "embeddings.tables.C2.collisions.policy=distance_lfu",
                                     "embeddings.tables.C2.collisions.fallback_rows=3",
                                     "embeddings.tables.C3.collisions.policy=none" }))
    local c = tconfig.collisions(cfg)
    assert.same({ "lru", 50 }, { c[1].policy, c[1].evict_every })
    assert.same({ "distance_lfu", 50, 3 }, { c[2].policy, c[2].evict_every, c[2].fallback_rows })
    assert.is_nil(c[3])
    local one = assert(parse(base, { "embeddings.tables.C3.collisions.policy=lfu" }))
    assert.same({ 3 }, (function()
      local k = {}
      for i in pairs(tconfig.collisions(one)) do k[#k + 1] = i end
      return k
    end)())
    local checks = {
      { { "embeddings.collisions.policy=lfu", "embeddings.collisions.fallback_rows=10" },
        "--set embeddings.collisions.fallback_rows=10: embeddings.collisions.fallback_rows: 10 fallback rows leave "
        .. "table C1 (10 rows) none for resident ids" },
      { { "embeddings.collisions.policy=lfu", "embeddings.max_rows=1" },
        "embeddings.collisions.policy: table C1 has 1 row; managed collisions need 2 or more" },
      { { "embeddings.collisions.policy=lfu", "train.pipeline=true" },
        "--set train.pipeline=true: train.pipeline: managed collisions run in the plain loop for now" },
      { { "embeddings.collisions.policy=mru" }, "--set embeddings.collisions.policy=mru: 'mru' is not one of" },
    }
    for _, k in ipairs(checks) do
      local bad, err = parse(base, k[1])
      assert.is_nil(bad, k[2])
      assert.truthy(err:find(k[2], 1, true), err)
    end
  end)

  it("reports a missing file", function()
    local cfg, err = tconfig.load("/nonexistent/x.yaml")
    assert.is_nil(cfg)
    assert.matches("^/nonexistent/x%.yaml: cannot open", err)
  end)
end)
