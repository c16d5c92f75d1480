-- A plan trained (uvmrec train --plan): the plan's per-table settings reach the config, the
-- cache and the hint manager; its HBM prediction is what the engine allocates (on the CPU, the
-- engine's own byte counts of the categories it has there; on a GPU, ur.memory's peak under the
-- plan's budget); plans made for another model, batch, pipeline or budget are refused.
local ur = require "uvmrec"
local train = require "uvmrec.train"
local planner = require "uvmrec.planner"
local cmd = require "command"
local h = require "helpers"

-- dlrm_kaggle's 26 tables capped at 200 k rows, batch 1024, rowwise Adagrad (state a row), C3
-- cached at 0.1 by the config: in 40 MiB the CPU calibration gives device, cached and managed
-- tables (each category of the prediction has something in it).  On the CPU backend device,
-- managed and pinned rows are the same host memory, so the shipped calibration's in-place rates
-- differ only by its runs' noise; the plan here reads them at fixed fractions of the device
-- ones, as on a GPU, so that it holds every placement whatever the last calibration measured.
-- No evaluation: the plan and the runs are of training alone (one that evaluates is refused
-- below; the GPU case says why it does not evaluate).
local SETS = { "embeddings.max_rows=200000", "train.batch_size=1024", "embeddings.optimizer.name=rowwise_adagrad",
               "embeddings.tables.C3.placement=cached", "embeddings.tables.C3.cache.load_factor=0.1",
               "eval.samples=0" }
local TOL = 0.05 -- the issue's: measured at most the prediction + 5% (and here at least - 5%)
-- The tables' budget: 40 MiB, and room for C3's cache's scratch over the whole batch (a
-- collection hands its cache every table's values: 1024 x 26)
local BUDGET = 40 * 2 ^ 20 + planner.cost.cache_batch_scratch(1024 * 26)

local function set_args()
  local a = {}
  for i, s in ipairs(SETS) do a[i] = "--set " .. s end
  return table.concat(a, " ")
end

local function config(extra)
  local sets = { unpack(SETS) }
  for _, s in ipairs(extra or {}) do sets[#sets + 1] = s end
  return assert(train.config.load(assert(train.find_config("dlrm_kaggle")), sets))
end

-- The dense part's HBM the planner predicts on a GPU for cfg at its batch per rank (world ranks):
-- parameters with their gradients and state, the model's arena in device blocks (nn.arena) and
-- the dense ops' workspaces (cost.dense_workspaces, for sms multiprocessors: an H200's unless
-- given); and cost.dense's whole answer.
local function gpu_dense(cfg, world, sms)
  local prob = assert(planner.from_config(cfg, { world = world }))
  local ctx = planner.cost.context { calib = assert(planner.calib.find("h200")), batch = prob.batch, world = world,
                                     sms = sms }
  local d = planner.cost.dense(planner.cost.dense_model(prob.dense), ctx)
  return d.hbm, d
end

local function near(want, got, what, tol)
  tol = tol or TOL
  assert.is_true(got <= want * (1 + tol) and got >= want * (1 - tol),
    ("%s: measured %d bytes, predicted %d (tolerance %.0f%%)"):format(what, got, want, 100 * tol))
end

describe("uvmrec train --plan", function()
  local dir, path
  setup(function()
    dir = cmd.tmpdir()
    path = dir .. "/plan.json"
    local cpu = assert(planner.calib.find("cpu")).data
    local r = cpu.rates
    for _, k in ipairs({ "gather", "update" }) do
      r["zero_copy_" .. k].value = r["hbm_" .. k].value / 4
      r["managed_" .. k].value = r["hbm_" .. k].value / 3
    end
    local calib_path = dir .. "/calib.json"
    local f = assert(io.open(calib_path, "w"))
    f:write(planner.calib.encode(cpu))
    f:close()
    local so, se, rc = cmd.sh(("%s plan dlrm_kaggle --calibration %s --hbm %d %s --out %s"):format(cmd.bin(),
      calib_path, BUDGET, set_args(), path))
    assert.equal(0, rc, se)
    assert.matches("wrote " .. path, so, 1, true)
  end)
  teardown(function() cmd.rmdir(dir) end)

  it("trains the plan: its allocations are its HBM prediction, category by category (CPU)", function()
    local cfg = config { "train.steps=5", "eval.samples=0", "eval.min_auc=0" }
    local plan = assert(train.apply_plan(cfg, path))
    local p = plan.data
    local place = {}
    for _, t in ipairs(p.tables) do place[t.placement] = (place[t.placement] or 0) + 1 end
    assert.truthy(place.device and place.cached and place.managed,
      "the plan should hold every placement; it has " .. train.plan_summary(p))
    -- the config now says what the plan says, table by table
    local e = cfg.embeddings
    for _, t in ipairs(p.tables) do
      local own = e.tables[t.name]
      assert.equal(t.placement, own.placement, t.name)
      if t.placement == "cached" then assert.equal(t.load_factor, own.cache.load_factor, t.name) end
      if t.placement == "managed" then assert.equal("hot_prefix", own.hints.policy, t.name) end
    end
    assert.equal(p.policy, e.cache.policy)
    local model, lines = nil, {}
    ur.set_hbm_budget(nil)
    local r = assert(train.run(cfg, { cpu = true, progress = "none", print = function(l) lines[#lines + 1] = l end,
                                      setup = function(ctx) model = ctx.model end, plan = plan, plan_path = path }))
    assert.equal(5, r.steps)
    assert.matches("plan: " .. path .. ", 26 tables (", table.concat(lines, "\n"), 1, true)
    assert.equal(0, ur.hbm_budget(), "the run's budget is the plan's while it runs, removed after")
    -- the engine's bytes of what the plan puts in HBM
    local tbe = model.embeddings.tbe
    local weights, state = 0, 0
    for _, t in ipairs(p.tables) do
      if t.placement == "device" then
        local w = tbe:table(t.name)
        weights = weights + w:nbytes()
        w:free()
        for _, k in ipairs(tbe.state_names) do state = state + tbe:state(t.name)[k]:nbytes() end
      end
    end
    local R = p.ranks[1]
    near(R.device.weights, weights, "device tables' weights")
    near(R.device.optimizer, state, "their optimizer state")
    near(R.device.cache_slots, tbe.cache:bytes(), "cache slots (rows, state, staging)")
    local mem = ur.memory()
    near(R.managed_on_gpu, mem.managed_on_gpu, "managed rows hinted to the GPU")
    -- on the CPU the engine's HBM count holds the managed prefix only; its peak stays within it
    near(R.managed_on_gpu, r.plan.hbm_peak, "the run's HBM peak (ur.memory)")
    assert.equal(R.hbm, r.plan.hbm_predicted)
    local total = R.device.weights + R.device.optimizer + R.device.cache_slots + R.managed_on_gpu
    near(total, weights + state + tbe.cache:bytes() + mem.managed_on_gpu, "all four")
    -- the cache got the plan's load factor per table
    for _, t in ipairs(p.tables) do
      if t.placement == "cached" then assert.equal(math.ceil(t.load_factor * t.rows), tbe.cache.table_slots[t.name]) end
    end
  end)

  it("refuses a plan made for another model, batch or pipeline, or over its budget", function()
    local cases = {
      { { "embeddings.max_rows=100000" }, "--plan " .. path .. ": table C3 has 200000 rows in the plan and 100000 in "
        .. "the model (embeddings.rows, max_rows)" },
      { { "embeddings.dim=32", "model.bottom_mlp=512,256,64,32" }, "--plan " .. path .. ": table C1 has dim 16 in the "
        .. "plan and 32 in the model (embeddings.dim)" },
      { { "train.batch_size=512" }, "--plan " .. path .. ": the plan is for a batch of 1024 per rank and "
        .. "train.batch_size is 512" },
      { { "train.pipeline=true" }, "--plan " .. path .. ": the plan was made without the prefetch pipeline and "
        .. "train.pipeline is true" },
      -- an evaluation's forward adds its batch's activations to the model's arena
      { { "eval.samples=65536" }, "--plan " .. path .. ": the plan is for no evaluation and this run evaluates in "
        .. "batches of 16384 per rank (eval.batch_size 16384, eval.samples 65536), whose activations it does not "
        .. "hold: plan this config again, or set eval.samples=0 (no evaluation)" },
      { { "embeddings.tables.C3.cache.load_factor=0.3" }, "--plan " .. path
        .. ": embeddings.tables.C3.cache.load_factor "
        .. "is 0.3 in the config and 0.1 in the plan: plan this config again" },
    }
    for _, c in ipairs(cases) do
      local got, err = train.apply_plan(config(c[1]), path)
      assert.is_nil(got, c[2])
      assert.equal(c[2], err:sub(1, #c[2]))
    end
    -- a plan for evaluations in batches of 16384 holds smaller ones, not larger
    local pe = assert(planner.load(path))
    pe.data.eval_batch = 16384
    local evp = dir .. "/eval.json"
    assert(pe:save(evp))
    assert(train.apply_plan(config { "eval.samples=65536", "eval.batch_size=8192" }, evp))
    local _, eerr = train.apply_plan(config { "eval.samples=65536", "eval.batch_size=32768" }, evp)
    assert.equal("--plan " .. evp .. ": the plan is for evaluation batches of 16384 per rank and this run evaluates "
      .. "in batches of 32768 per rank (eval.batch_size 32768, eval.samples 65536), whose activations it does not "
      .. "hold: plan this config again, or set eval.samples=0 (no evaluation)", eerr)
    local _, err = train.apply_plan(config(), path, { world = 2 })
    assert.equal("--plan " .. path .. ": the plan is for 1 rank and this run has 2", err)
    -- a plan edited past its own budget
    local p = assert(planner.load(path))
    p.data.budget = p.data.ranks[1].hbm - 1
    local bad = dir .. "/over.json"
    assert(p:save(bad))
    _, err = train.apply_plan(config(), bad)
    assert.matches("^%-%-plan " .. bad:gsub("%p", "%%%0") .. ": rank 0 needs [%d.]+ MiB of HBM %(%d+ bytes%), over the "
      .. "plan's budget of [%d.]+ MiB per rank$", err)
    -- a table's choice edited in the file and not its config_keys (or the other way): the keys
    -- ran while the plan's figures and summary told the edited choice
    local pk = assert(planner.load(path))
    local t1 = pk.data.tables[1]
    local was = t1.placement
    t1.placement = was == "host" and "device" or "host"
    local edited = dir .. "/edited.json"
    assert(pk:save(edited))
    _, err = train.apply_plan(config(), edited)
    assert.equal(("--plan %s: table C1 is placement %s in the plan and its config_keys set "
      .. "embeddings.tables.C1.placement to %s: the file was edited; change a plan with plan:with (or plan again)")
      :format(edited, t1.placement, was), err)
    -- the engine's budget below the plan's
    local cfg = config { "train.steps=1", "eval.samples=0", "eval.min_auc=0" }
    local plan = assert(train.apply_plan(cfg, path))
    collectgarbage()
    ur.set_hbm_budget(ur.memory().hbm_used + 1024 ^ 2)
    local ok, rerr = train.run(cfg, { cpu = true, progress = "none", print = function() end, plan = plan,
                                      plan_path = path })
    ur.set_hbm_budget(nil)
    assert.is_nil(ok)
    assert.equal(("--plan %s: the plan's HBM budget is %.1f MiB and the engine's leaves 1.0 MiB "
      .. "(ur.set_hbm_budget)"):format(path, BUDGET / 2 ^ 20), rerr)
    -- and from the command
    local so, se, rc = cmd.sh(("%s train dlrm_kaggle --cpu --plan %s %s --set train.batch_size=256 --steps 1"):format(
      cmd.bin(), path, set_args()))
    assert.equal(1, rc, so)
    assert.matches("uvmrec train: --plan " .. path .. ": the plan is for a batch of 1024", se, 1, true)
  end)

  it("refuses a GPU budget that does not hold the dense part's arena, naming the budget that does", function()
    -- on a GPU the model's arena is one device block of 64 MiB at this batch (its 17.2 MiB of
    -- activations fit one): with the parameters, more than 40 MiB
    local cmdline = ("%s plan dlrm_kaggle --calibration h200 %s --hbm "):format(cmd.bin(), set_args())
    local so, se, rc = cmd.sh(cmdline .. "40MiB")
    assert.equal(1, rc, so)
    local dense = planner.fmt_bytes(gpu_dense(config(), 1))
    assert.matches(("dense %s: parameters, gradients and optimizer state "):format(dense), se, 1, true)
    assert.matches("the model's arena 64.0 MiB in 1 block of 64.0 MiB (nn.arena) for 17.2 MiB of activations at a "
      .. "batch of 1024", se, 1, true)
    local least = tonumber(se:match("a budget of at least [%d.]+ MiB %((%d+) bytes%) would fit"))
    assert.truthy(least, se)
    -- the budget it names fits (every table at its smallest choice); 1 KiB less does not
    so, se, rc = cmd.sh(cmdline .. least)
    assert.equal(0, rc, se .. so)
    so, se, rc = cmd.sh(cmdline .. (least - 1024))
    assert.equal(1, rc, so)
    assert.matches("cannot fit", se, 1, true)
  end)

  it("sets each table's sharding and rank from a plan of several ranks, as uvmrec.dist.plan places them", function()
    local p2 = dir .. "/w2.json"
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), {}))
    -- 64 MiB a rank for the tables, the pipeline and the reserve; the dense part's arena on top
    local budget = 64 * 2 ^ 20 + gpu_dense(cfg, 2)
    local so, se, rc = cmd.sh(("%s plan dlrm_tiny --gpus 2 --hbm %d --out %s"):format(cmd.bin(), budget, p2))
    assert.equal(0, rc, se .. so)
    local plan = assert(train.apply_plan(cfg, p2, { world = 2 }))
    assert.is_nil(train.config.check_world(cfg, 2))
    local tabs = {}
    for i, t in ipairs(plan.data.tables) do tabs[i] = { name = t.name, rows = t.rows, dim = t.dim } end
    local dp = require("uvmrec.dist.plan").plan(tabs, train.config.sharding(cfg), 2)
    local kinds = {}
    for _, t in ipairs(plan.data.tables) do
      assert.equal(t.sharding, dp.tables[t.name].kind, t.name)
      local got = {}
      for j, s in ipairs(dp.tables[t.name].shards) do got[j] = s.rank end
      assert.same(t.ranks, got, t.name)
      kinds[t.sharding] = true
    end
    assert.truthy(kinds.table_wise, "the plan has table_wise tables (their ranks are the check)")
    -- a rank on a table that is not table_wise is refused where it is set
    local _, err = train.config.load(assert(train.find_config("dlrm_tiny")), { "embeddings.tables.C3.sharding=row_wise",
      "embeddings.tables.C3.rank=1" })
    assert.equal("--set embeddings.tables.C3.rank=1: embeddings.tables.C3.rank: table C3 is sharded row_wise: a rank "
      .. "places a table_wise table", err)
  end)

  -- A config's per-table sharding was not kept: `uvmrec plan dlrm_tiny --gpus 2 --set
  -- embeddings.tables.C3.sharding=row_wise` planned C3 table_wise, unflagged, and `train --plan`
  -- refused it ("row_wise in the config and table_wise in the plan: plan this config again"),
  -- which planned it table_wise again.
  it("keeps a table's sharding the config sets, as it keeps its placement", function()
    local sets = { "embeddings.tables.C3.sharding=row_wise", "embeddings.tables.C5.sharding=data_parallel" }
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), sets))
    local prob = assert(planner.from_config(cfg, { world = 2 }))
    local budget = 64 * 2 ^ 20 + gpu_dense(cfg, 2)
    local plan = assert(planner.plan(prob.tables, prob.profiles, budget, { world = 2, batch = prob.batch,
      calibration = "h200", dense = prob.dense, loader = prob.loader }))
    local by = {}
    for _, t in ipairs(plan.data.tables) do by[t.name] = t end
    assert.equal("row_wise", by.C3.sharding)
    assert.same({ sharding = "row_wise" }, by.C3.fixed)
    assert.equal("data_parallel", by.C5.sharding)
    assert.matches("C3*", plan:table(), 1, true)
    -- on one rank every table is table_wise: the config's sharding is for runs over ranks
    local one = assert(planner.from_config(cfg, { world = 1 }))
    assert.is_nil(one.tables[3].fixed)
    local p2 = dir .. "/kept_sharding.json"
    assert(plan:save(p2))
    assert(train.apply_plan(cfg, p2, { world = 2 }))
  end)

  -- A config's rank for a table was not kept: `uvmrec plan dlrm_tiny --gpus 2 --set
  -- embeddings.tables.C16.rank=1 --set embeddings.tables.C21.rank=1` planned C21 on rank 0,
  -- unflagged, and `train --plan` refused it ("embeddings.tables.C21.rank is 1 in the config and
  -- 0 in the plan: plan this config again"), which planned it the same.
  it("keeps a table's rank the config sets, as it keeps its sharding", function()
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), { "embeddings.tables.C16.rank=1",
      "embeddings.tables.C21.rank=1" }))
    local prob = assert(planner.from_config(cfg, { world = 2 }))
    assert.same({ rank = 1 }, prob.tables[16].fixed)
    local budget = 64 * 2 ^ 20 + gpu_dense(cfg, 2)
    local plan = assert(planner.plan(prob.tables, prob.profiles, budget, { world = 2, batch = prob.batch,
      calibration = "h200", dense = prob.dense, loader = prob.loader }))
    local by = {}
    for _, t in ipairs(plan.data.tables) do by[t.name] = t end
    for _, name in ipairs({ "C16", "C21" }) do
      assert.equal("table_wise", by[name].sharding, name)
      assert.same({ 1 }, by[name].ranks, name)
      assert.same({ rank = 1 }, by[name].fixed, name)
    end
    local p2 = dir .. "/kept_rank.json"
    assert(plan:save(p2))
    assert(train.apply_plan(cfg, p2, { world = 2 }))
    assert.equal(1, cfg.embeddings.tables.C16.rank)
    -- a rank outside the plan's ranks is refused at the config's key (it named the planner's
    -- "fixed rank 2", a key nobody wrote; and with --gpus 1 rank 1 was dropped: planned as unset)
    local far = assert(train.config.load(assert(train.find_config("dlrm_tiny")), { "embeddings.tables.C16.rank=2" }))
    local none, err = planner.from_config(far, { world = 2 })
    assert.is_nil(none)
    assert.equal("--set embeddings.tables.C16.rank=2: embeddings.tables.C16.rank: 2; expected a rank from 0 to 1 (the "
      .. "plan is for 2 ranks)", err)
    local one = assert(train.config.load(assert(train.find_config("dlrm_tiny")), { "embeddings.tables.C16.rank=1" }))
    none, err = planner.from_config(one, { world = 1 })
    assert.is_nil(none)
    assert.equal("--set embeddings.tables.C16.rank=1: embeddings.tables.C16.rank: 1; expected a rank from 0 to 0 (the "
      .. "plan is for 1 rank)", err)
    -- rank 0 is every table's rank on one: kept as the run keeps it, not flagged
    local zero = assert(train.config.load(assert(train.find_config("dlrm_tiny")), { "embeddings.tables.C16.rank=0" }))
    assert.is_nil(assert(planner.from_config(zero, { world = 1 })).tables[16].fixed)
    -- and through the command, which names the key and changes nothing
    local so, se, rc = cmd.run("plan dlrm_tiny --gpus 1 --calibration cpu --set embeddings.tables.C16.rank=1")
    assert.equal(1, rc, so .. se)
    assert.equal("", so)
    assert.matches("embeddings.tables.C16.rank: 1; expected a rank from 0 to 0 (the plan is for 1 rank)", se, 1, true)
  end)

  -- A plan's column_wise table could not be trained: `uvmrec plan dlrm_tiny --gpus 2 --set
  -- embeddings.tables.C2.sharding=column_wise` put C2's shards on the least loaded ranks (0,1) and
  -- `train --plan` refused it ("the run would place it on 1,0 (uvmrec.dist.plan)"); on 4 ranks the
  -- planner chose 2 shards where a run cuts 4 ("on ranks 1,2 in the plan ... on 1,2,3,0").
  it("plans a column_wise table's shards as the run cuts and places them", function()
    for _, W in ipairs({ 2, 4 }) do
      local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), {
        "embeddings.tables.C2.sharding=column_wise", "embeddings.tables.C3.sharding=column_wise" }))
      local prob = assert(planner.from_config(cfg, { world = W }))
      for _, how in ipairs({ "greedy", "exhaustive" }) do
        local plan = assert(planner.plan(prob.tables, prob.profiles, 64 * 2 ^ 20 + gpu_dense(cfg, W), { world = W,
          batch = prob.batch, calibration = "h200", dense = prob.dense, loader = prob.loader, search = how }))
        local dp = require("uvmrec.dist.plan").plan({ { name = "C1", rows = 4, dim = 16 },
          { name = "C2", rows = 10, dim = 16 }, { name = "C3", rows = 1000, dim = 16 } }, "column_wise", W)
        for i = 2, 3 do
          local t = plan.data.tables[i]
          local want = {}
          for j, sh in ipairs(dp.tables[t.name].shards) do want[j] = sh.rank end
          assert.equal("column_wise", t.sharding)
          assert.same(want, t.ranks, ("%s on %d ranks, %s"):format(t.name, W, how))
        end
        local file = ("%s/column_wise_%d.json"):format(dir, W)
        assert(plan:save(file))
        assert(train.apply_plan(cfg, file, { world = W }))
      end
    end
  end)

  -- its rank or ranks were written by hand ("on rank%s %s"): lib.things counts them
  it("refuses a plan whose table is on other ranks than the run's, counting them", function()
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), {}))
    local prob = assert(planner.from_config(cfg, { world = 2 }))
    local plan = assert(planner.plan(prob.tables, prob.profiles, "1GiB", { world = 2, batch = prob.batch,
      calibration = "h200", dense = prob.dense, loader = prob.loader }))
    local file = dir .. "/ranks.json"
    assert(plan:save(file))
    local json = require "uvmrec.json"
    local d = assert(json.decode(assert(cmd.slurp(file))))
    assert.equal("data_parallel", d.tables[1].sharding)
    d.tables[1].ranks = { 1 }
    cmd.spit(file, json.encode(d))
    local ok, err = train.apply_plan(cfg, file, { world = 2 })
    assert.is_nil(ok)
    assert.equal(("--plan %s: table C1 is data_parallel on 1 rank (1) in the plan, and the run would place it on "
      .. "0,1 (uvmrec.dist.plan)"):format(file), err)
  end)

  -- A plan file whose ranks' figures were cut passed the budget check (it read the ranks it had)
  it("refuses a plan file without a rank's figures", function()
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), {}))
    local prob = assert(planner.from_config(cfg))
    local plan = assert(planner.plan(prob.tables, prob.profiles, "1GiB", { batch = prob.batch, calibration = "cpu",
      dense = prob.dense, loader = prob.loader }))
    plan.data.ranks = {}
    local cut = dir .. "/no_ranks.json"
    assert(plan:save(cut))
    local _, err = train.apply_plan(cfg, cut)
    assert.equal("--plan " .. cut .. ": the plan has the figures of 0 ranks for its 1 rank: the file was edited; "
      .. "plan again", err)
  end)

  h.mpi_it("trains a plan of 2 ranks under uvmrec launch, rank 0 alone saying the plan's HBM peak", function()
    local p2 = dir .. "/w2run.json"
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), { "eval.samples=0" }))
    local budget = 64 * 2 ^ 20 + gpu_dense(cfg, 2)
    local so, se, rc = cmd.sh(("%s plan dlrm_tiny --gpus 2 --hbm %d --set eval.samples=0 --out %s"):format(cmd.bin(),
      budget, p2))
    assert.equal(0, rc, se .. so)
    so, se, rc = cmd.sh(("timeout 300 %s launch -n 2 train dlrm_tiny --cpu --plan %s --steps 2 --progress none "
      .. "--set eval.samples=0"):format(cmd.bin(), p2))
    assert.equal(0, rc, se .. so)
    local _, lines = (so .. se):gsub("plan: HBM peak", "")
    assert.equal(1, lines, so .. se)
    assert.is_nil((so .. se):match("%[rank 1%]"), so .. se)
  end)

  -- Over ranks a rank's table- and column-wise shards are one collection, which hands its cache
  -- every shard's values, not only the cached table's (uvmrec.dist.sharded's prepare; the engine's
  -- prepare_batch carves the scratch over them), and an evaluation's larger batch grows it: the
  -- plan counted C16's own 1024 values a batch of rank 0's 5120 (its four host tables' too) and
  -- no evaluation (at 7cb692d 2,158,838 bytes: 7% and 38% under what the cache held, its scratch
  -- 38% and 84%; now within 0.3%).  Each rank trains the plan, evaluates or not, and frees its
  -- caches: the bytes ur.memory's host category gives back are the cache's (slots, metadata,
  -- scratch, slot-id buffers, move lists: on the CPU backend host tensors).
  h.mpi_it("holds a cache's scratch over its rank's values over 2 ranks, after training and after evaluating "
     .. "(CPU)", function()
    local sets = { "train.batch_size=1024", "embeddings.tables.C16.placement=cached",
                   "embeddings.tables.C16.cache.load_factor=0.1", "embeddings.tables.C16.rank=0", "train.steps=2",
                   "eval.min_auc=0" }
    local cpu = assert(planner.calib.find("cpu")).data
    for _, k in ipairs({ "alltoall", "allreduce", "reduce_scatter" }) do -- (a plan over ranks needs them)
      cpu.rates[k] = { value = 1e9, unit = "B/s", source = "spec", command = "none", date = "none", measured = false }
    end
    local calib_path = dir .. "/calib_w2.json"
    cmd.spit(calib_path, planner.calib.encode(cpu))
    local script = cmd.spit(dir .. "/cache_bytes.lua", [[
      local ur = require "uvmrec"
      local train = require "uvmrec.train"
      local path, sets = arg[1], {}
      for i = 2, #arg do sets[#sets + 1] = arg[i] end
      local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), sets))
      local plan = assert(train.apply_plan(cfg, path, { world = 2 }))
      local model
      assert(train.run(cfg, { cpu = true, progress = "none", print = function() end, plan = plan, plan_path = path,
                              setup = function(ctx) model = ctx.model end }))
      local rank, held = require("uvmrec.dist").rank(), 0
      for _, k in ipairs({ "tbe_a2a", "tbe_rw" }) do
        local c = model.embeddings[k]
        if c and c.cache then
          collectgarbage()
          collectgarbage()
          local before = ur.memory().host
          c.cache:free()
          held = held + before - ur.memory().host
        end
      end
      local d = plan.data.ranks[rank + 1].device
      print(("rank %d: cache %d planned %d"):format(rank, held, d.cache_slots + d.cache_meta + d.cache_scratch))
      print(("rank %d: ok"):format(rank))
    ]])
    for _, ev in ipairs({ { "eval.samples=0" }, { "eval.samples=16384", "eval.batch_size=4096", "eval.every=1" } }) do
      local all = { unpack(sets) }
      for _, s in ipairs(ev) do all[#all + 1] = s end
      local args = {}
      for i, s in ipairs(all) do args[i] = "--set " .. s end
      local p2 = dir .. "/w2cache.json"
      local so, se, rc = cmd.sh(("%s plan dlrm_tiny --gpus 2 --calibration %s --hbm 1GiB %s --out %s"):format(cmd.bin(),
        calib_path, table.concat(args, " "), p2))
      assert.equal(0, rc, se .. so)
      so, se, rc = cmd.sh(("timeout 300 %s launch -n 2 %s %s %s"):format(cmd.bin(), script, p2, table.concat(all, " ")))
      h.ranks_ok(2, so, se, rc)
      local got, want = so:match("rank 0: cache (%d+) planned ([%d.e+]+)")
      got, want = tonumber(got), tonumber(want)
      assert.truthy(got and got > 0, so .. se)
      near(want, got, "rank 0's cache (" .. ev[1] .. ")", 0.02)
      -- rank 1 caches nothing, and the plan holds no cache there
      assert.matches("rank 1: cache 0 planned 0\n", so, 1, true)
    end
  end)

  h.cuda_it("on the GPU: 5 steps under the plan's HBM budget peak at most the prediction + 5%", function()
    -- the setup's budget for the tables, the pipeline and the reserve, and the dense part on top:
    -- on a GPU its arena is a 64 MiB device block, which 40 MiB alone does not hold (refused above),
    -- and the dense ops' workspaces of the model's stream and of its weight gradients' side stream
    -- (32 MiB each and the backward's parts), which the engine counts against the plan's budget.
    -- Still without evaluation: the planner holds an evaluation's arena (cost.dense; cost_spec),
    -- but not yet what else grows with its batch of 16384: the collection's pooled outputs
    -- (26 x 16384 x 16 x 4 bytes, 27 MB against the step's 3.4 MB planned), C3's cache
    -- scratch over the batch's values (cost.cache_batch_scratch(16384 x 26), 85 MB against
    -- 5.3 MB) and the held-out batches on the GPU (~9 MB each), together far past the 5%.
    local cfg = config { "train.steps=5", "eval.min_auc=0" }
    local dense = gpu_dense(cfg, 1)
    local so, se, rc = cmd.sh(("%s plan dlrm_kaggle --calibration h200 --hbm %d %s --out %s"):format(cmd.bin(),
      BUDGET + dense, set_args(), dir .. "/gpu.json"))
    assert.equal(0, rc, se .. so)
    local plan = assert(train.apply_plan(cfg, dir .. "/gpu.json"))
    assert.equal(dense, plan.data.ranks[1].device.dense)
    ur.set_hbm_budget(nil)
    local model, opt
    local ws0 = ur.memory().workspace
    local r = assert(train.run(cfg, { progress = "none", print = function() end, plan = plan,
                                      setup = function(ctx) model, opt = ctx.model, ctx.optimizer end }))
    assert.equal(5, r.steps)
    -- the dense part on the GPU: its parameters, gradients and state, and the arena's blocks
    local held = model:arena():stats().reserved + h.dense_bytes(model, opt)
    local _, d = gpu_dense(cfg, 1)
    assert.equal(dense - d.mem.workspaces, held, "the dense part's HBM but its workspaces")
    -- and the workspaces, priced for this GPU: the model's stream and its side stream hold at
    -- least them (earlier specs on the default stream may have grown its workspace more), and
    -- the run grew them by at most them
    local _, dd = gpu_dense(cfg, 1, assert(ur.device_props(0)).sm_count)
    local ws = ur.memory().workspace
    assert.is_true(ws >= dd.mem.workspaces, ("workspaces %d bytes, predicted %d"):format(ws, dd.mem.workspaces))
    assert.is_true(ws - ws0 <= dd.mem.workspaces, ("workspaces grew by %d bytes, predicted %d"):format(ws - ws0,
                                                                                                  dd.mem.workspaces))
    local peak, want = r.plan.hbm_peak, plan.data.ranks[1].hbm -- peak: from the run's start (ur.reset_hbm_peak)
    assert.equal(want, r.plan.hbm_predicted)
    assert.is_true(peak <= want * (1 + TOL), ("peak %d bytes, predicted %d"):format(peak, want))
    -- the same plan in a budget the engine's allocations do not fit is refused by the engine
    plan.data.budget = math.floor(peak / 2)
    for _, R in ipairs(plan.data.ranks) do R.hbm = math.floor(peak / 4) end
    local ok, err = train.run(cfg, { progress = "none", print = function() end, plan = plan })
    assert.is_nil(ok)
    assert.matches("hbm budget", err, 1, true)
  end)
end)
