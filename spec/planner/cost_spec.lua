local planner = require "uvmrec.planner"
local cost = planner.cost
local profile = planner.profile
local helpers = require "helpers"

-- Round rates, so that every expected figure below is a formula written out here.
local R = { hbm_gather = 1e9, hbm_gather_repeat = 2e9, hbm_copy = 4e9, hbm_update = 0.5e9, zero_copy_gather = 1e8,
            managed_gather = 2e8, zero_copy_update = 0.5e8, managed_update = 1e8, tbe_backward_per_id = 1e-9,
            cache_per_id = 2e-9, cache_row_fixed = 1e-8, cache_move = 1e9, pipeline_overlap = 0.5,
            mlp_f32 = 1e12, mlp_tf32 = 2e12, mlp_bf16 = 4e12, interaction_dot = 1e11, alltoall = 1e10,
            allreduce = 2e10, reduce_scatter = 3e10, host_to_device = 1e10, device_to_host = 1e10 }
local cal = planner.calib.synthetic(R)

local ROWS, DIM, B, H = 1000, 8, 100, 2
local RB, SB = DIM * 4, 4 -- f32 rows, rowwise Adagrad's one float a row
local L = B * H
local q = 1 - (1 - 1 / ROWS) ^ L -- a row's chance to be read in a batch (uniform ids)
local U = ROWS * q
local OUT = B * DIM * 4

local function tab()
  return cost.table { name = "t", rows = ROWS, dim = DIM, optimizer = "rowwise_adagrad", hot = H,
                      profile = profile.zipf { rows = ROWS, s = 0 } }
end
local function ctx(extra)
  local o = { calib = cal, batch = B, world = 1, page_bytes = 4096 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return cost.context(o)
end
local function near(a, b, what)
  assert.is_true(math.abs(a - b) <= 1e-9 * math.abs(b) + 1e-15, ("%s: %.12g vs %.12g"):format(what, a, b))
end

describe("planner.cost", function()
  it("prices a device table: rows once, repeats on chip, the step per id and per distinct row", function()
    local o = assert(cost.option(tab(), ctx(), { placement = "device" }))
    local fwd = U * RB / R.hbm_gather + (L - U) * RB / R.hbm_gather_repeat + OUT / R.hbm_copy
    local bwd = L * R.tbe_backward_per_id + U * (RB + SB) / R.hbm_update + OUT / R.hbm_copy
    near(o.time, fwd + bwd, "time")
    local m = o.shards[1].mem
    assert.equal(ROWS * RB, m.device.weights)
    assert.equal(ROWS * SB, m.device.optimizer)
    assert.equal(2 * OUT, m.device.outputs)
    assert.equal(ROWS * RB + ROWS * SB + 2 * OUT, o.hbm)
    assert.equal(0, o.host)
  end)

  it("prices a managed table with a hot prefix: coverage, cold rows over the link, whole pages", function()
    local o = assert(cost.option(tab(), ctx(), { placement = "managed", prefix_fraction = 0.1 }))
    local h = 100
    local Ucold, Uhot = (ROWS - h) * q, h * q
    local fwd = Uhot * RB / R.hbm_gather + Ucold * RB / R.managed_gather + (L - U) * RB / R.hbm_gather_repeat
                + OUT / R.hbm_copy
    local bwd = L * R.tbe_backward_per_id + Uhot * (RB + SB) / R.hbm_update + Ucold * (RB + SB) / R.managed_update
                + OUT / R.hbm_copy
    near(o.time, fwd + bwd, "time")
    near(o.coverage, 0.1, "coverage")
    local m = o.shards[1].mem
    assert.equal(4096 + 4096, m.managed_on_gpu) -- 3200 bytes of rows and 400 of state, each a page
    assert.equal(ROWS * (RB + SB), m.managed)
    assert.equal(8192 + 2 * OUT, o.hbm)
  end)

  it("prices a cached table: slots in whole sets, metadata, scratch, misses moved in and back", function()
    local c = ctx { min_slots = 0 }
    local o = assert(cost.option(tab(), c, { placement = "cached", load_factor = 0.2 }))
    local S = 224 -- 200 rows rounded up to 7 sets of 32
    assert.equal(S, o.slots)
    near(o.hit_rate, S / ROWS, "hit rate (uniform ids: the cached share)")
    local misses = U * (1 - S / ROWS)
    near(o.misses, misses, "misses")
    local fwd = U * RB / R.hbm_gather + (L - U) * RB / R.hbm_gather_repeat + OUT / R.hbm_copy
    local bwd = L * R.tbe_backward_per_id + U * (RB + SB) / R.hbm_update + OUT / R.hbm_copy
    local cache = L * R.cache_per_id + 2 * misses * (R.cache_row_fixed + (RB + SB) / R.cache_move)
    near(o.time, fwd + bwd + cache, "time")
    local m = o.shards[1].mem.device
    -- the staging rows are the cache's, once: on one rank the plan's (cost.cache_staging), over
    -- ranks each cached table's
    local staging = 2 * 256
    assert.equal(S * (RB + SB), m.cache_slots)
    assert.equal(S * 17 + S * 8, m.cache_meta)
    assert.same({ cache_slots = staging * (RB + SB), cache_meta = staging * 8 }, cost.cache_staging(c, RB + SB))
    -- over ranks the table's share of the per-batch scratch (on one rank the plan's term), and
    -- the move lists
    local lists = 4 * 8 * (1.5 * (4 * misses + U) + 1024)
    near(m.cache_scratch, lists, "scratch on one rank")
    near(cost.cache_batch_scratch(L), L * (144 * 1.25 + 8 * 1.25 * 2), "the batch's scratch")
    local two = assert(cost.option(tab(), ctx { min_slots = 0, world = 2 },
                                   { placement = "cached", load_factor = 0.2 }))
    near(two.shards[1].mem.device.cache_scratch, cost.cache_batch_scratch(two.lookups)
      + 4 * 8 * (1.5 * (4 * two.misses + two.distinct) + 1024), "scratch over two ranks")
    assert.equal((S + staging) * (RB + SB), two.shards[1].mem.device.cache_slots)
    assert.equal(ROWS * (RB + SB), o.shards[1].mem.pinned)
    -- LFU keeps 4 bytes a row of counts; the prefetch pipeline hides its share of the cache's time
    local lfu = assert(cost.option(tab(), c, { placement = "cached", load_factor = 0.2, policy = "lfu" }))
    assert.equal(m.cache_meta + 4 * ROWS, lfu.shards[1].mem.device.cache_meta)
    local piped = assert(cost.option(tab(), ctx { min_slots = 0, pipeline = true },
                                     { placement = "cached", load_factor = 0.2 }))
    near(piped.time, fwd + bwd + cache * (1 - R.pipeline_overlap), "pipelined time")
    -- a small table is cached whole (two slots a row) under the default min_slots
    assert.equal(2016, assert(cost.option(tab(), ctx(), { placement = "cached", load_factor = 0.2 })).slots)
  end)

  it("holds a cache's scratch over every value its rank's collection gets, and its evaluations' growth", function()
    -- the backend's carve a value (kernels/cache.cu, engine/src/embedding/cache_cpu.c), grown by a
    -- quarter, and two slot-id buffers; evaluations of 4 times the batch grow the scratch to
    -- theirs and add two buffers of their own
    local cpu = planner.calib.synthetic(R)
    cpu.backend = "cpu"
    near(cost.cache_batch_scratch(L, ctx()), L * (144 * 1.25 + 20), "the GPU's")
    near(cost.cache_batch_scratch(L, ctx { calib = cpu }), L * (80 * 1.25 + 20), "the CPU's")
    near(cost.cache_batch_scratch(L, ctx { eval_batch = 4 * B }), L * (4 * 144 * 1.25 + 20 * (1 + 4)), "evaluating")
    near(cost.cache_batch_scratch(L, ctx { eval_batch = B / 2 }), L * (144 * 1.25 + 20), "smaller evaluations")
    -- over ranks a cached shard holds room in the search over its own values (the plan counts
    -- its rank's collection's: spec/planner/train_plan_spec.lua measures it); others none
    local c2 = ctx { world = 2, eval_batch = 4 * B }
    for _, sh in ipairs({ "table_wise", "row_wise" }) do
      local o = assert(cost.option(tab(), c2, { sharding = sh, placement = "cached", load_factor = 0.2 }))
      near(o.room, cost.cache_batch_scratch(o.lookups, c2), sh)
      assert.is_nil(assert(cost.option(tab(), c2, { sharding = sh, placement = "device" })).room)
    end
  end)

  it("prices the cache's decisions per distinct row of the table's own ids, and each miss moved", function()
    -- a calibration with the per-row term: the lookup per id, the decisions per distinct row
    local R2 = {}
    for k, v in pairs(R) do R2[k] = v end
    R2.cache_per_row = 5e-9
    local c2 = ctx { calib = planner.calib.synthetic(R2), min_slots = 0 }
    local function cached(s)
      local P = profile.zipf { rows = ROWS, s = s }
      local t = cost.table { name = "t", rows = ROWS, dim = DIM, optimizer = "rowwise_adagrad", hot = H, profile = P }
      return assert(cost.option(t, c2, { placement = "cached", load_factor = 0.2 })), P
    end
    for _, s in ipairs({ 0, 0.8, 1.05, 1.3 }) do
      local o, P = cached(s)
      -- the distinct rows and misses are the profile's (the model's Zipf: far fewer rows than ids)
      near(o.distinct, P:distinct(L), "distinct rows, zipf " .. s)
      local hr = require("uvmrec.planner.hitrate").lru(P, L, o.slots)
      near(o.misses, hr.misses, "misses, zipf " .. s)
      local cache = L * R.cache_per_id + P:distinct(L) * 5e-9 + 2 * hr.misses * (R.cache_row_fixed
                    + (RB + SB) / R.cache_move)
      near(o.cache_seconds, cache, "the cache's time, zipf " .. s)
    end
    -- the same ids a batch, the hotter table's fewer distinct rows cost less
    local flat, hot = cached(0), cached(1.3)
    assert.is_true(hot.distinct < 0.5 * flat.distinct)
    assert.is_true(hot.cache_seconds < flat.cache_seconds)
    -- without the term (a calibration lacking it: its cache_per_id carries it) the cache is
    -- priced per id and per miss only
    local o = assert(cost.option(tab(), ctx { min_slots = 0 }, { placement = "cached", load_factor = 0.2 }))
    near(o.cache_seconds, L * R.cache_per_id + 2 * o.misses * (R.cache_row_fixed + (RB + SB) / R.cache_move),
         "without cache_per_row")
  end)

  it("prices a host table: every distinct row read and stepped in place", function()
    local o = assert(cost.option(tab(), ctx(), { placement = "host" }))
    local fwd = U * RB / R.zero_copy_gather + (L - U) * RB / R.hbm_gather_repeat + OUT / R.hbm_copy
    local bwd = L * R.tbe_backward_per_id + U * (RB + SB) / R.zero_copy_update + OUT / R.hbm_copy
    near(o.time, fwd + bwd, "time")
    assert.equal(2 * OUT, o.hbm)
    assert.equal(ROWS * (RB + SB), o.host)
  end)

  it("prices sharding over ranks: lookups, rows and communication per shard", function()
    local W = 2
    local c = ctx { world = W }
    local Lp = W * B * H -- every rank's lookups of the table
    local qp = 1 - (1 - 1 / ROWS) ^ Lp
    -- table_wise: one shard sees all ranks' ids; ids and lengths in, outputs out and gradients in
    local tw = assert(cost.option(tab(), c, { sharding = "table_wise", placement = "device" }))
    local out2 = W * B * DIM * 4
    local fwd = ROWS * qp * RB / R.hbm_gather + (Lp - ROWS * qp) * RB / R.hbm_gather_repeat + out2 / R.hbm_copy
    local bwd = Lp * R.tbe_backward_per_id + ROWS * qp * (RB + SB) / R.hbm_update + out2 / R.hbm_copy
    local comm = ((W - 1) * B * H * 8 + (W - 1) * B * 4) / R.alltoall + 2 * (W - 1) * B * DIM * 4 / R.alltoall
    near(tw.time, fwd + bwd + comm, "table_wise")
    assert.equal(1, tw.shards_count)
    -- row_wise: each rank half the rows and half the lookups; partial outputs reduce-scattered
    local rw = assert(cost.option(tab(), c, { sharding = "row_wise", placement = "device" }))
    assert.equal(2, rw.shards_count)
    local Ls, Us = Lp / W, ROWS * qp / W
    local fr = Us * RB / R.hbm_gather + (Ls - Us) * RB / R.hbm_gather_repeat + out2 / R.hbm_copy
    local br = Ls * R.tbe_backward_per_id + Us * (RB + SB) / R.hbm_update + out2 / R.hbm_copy
    local cr = ((W - 1) * B * H * 8 / W + (W - 1) * B * 4) / R.alltoall
               + 2 * (W - 1) * B * DIM * 4 / R.reduce_scatter
    near(rw.shards[1].time, fr + br + cr, "row_wise shard")
    assert.equal(ROWS / W * RB, rw.shards[1].mem.device.weights)
    -- data_parallel: every rank its own batch, the whole table's gradient all-reduced and stepped
    local dp = assert(cost.option(tab(), c, { sharding = "data_parallel", placement = "device" }))
    local fd = U * RB / R.hbm_gather + (L - U) * RB / R.hbm_gather_repeat + OUT / R.hbm_copy
    local bd = L * R.tbe_backward_per_id + U * (RB + SB) / R.hbm_update + OUT / R.hbm_copy
      + 2 * ROWS * (RB + SB) / R.hbm_copy
    near(dp.shards[1].time, fd + bd + 2 * (W - 1) / W * ROWS * DIM * 4 / R.allreduce, "data_parallel shard")
    -- column_wise over 2: half the columns each, all ids
    local cw = assert(cost.option(tab(), c, { sharding = "column_wise", shards = 2, placement = "device" }))
    assert.equal(ROWS * RB / 2, cw.shards[1].mem.device.weights)
    -- what cannot be
    local bad, err = cost.option(tab(), ctx { world = 4 },
                                 { sharding = "column_wise", shards = 4, placement = "device" })
    assert.is_nil(bad)
    assert.equal("column_wise over 4 shards needs dim 8 to split into multiples of 4", err)
    bad, err = cost.option(tab(), c, { sharding = "data_parallel", placement = "host" })
    assert.is_nil(bad)
    assert.equal("data_parallel tables are device tables (every rank holds the whole table)", err)
    assert.has_error(function()
      cost.context { calib = planner.calib.synthetic { alltoall = false }, batch = 1, world = 2 }
    end)
  end)

  it("prices a choice over many ranks once: one shard entry, shards_count of them", function()
    -- a list of a copy a shard made every choice O(ranks): planning 1000 tables that do not fit
    -- on 8 ranks took 57 s, pricing worlds of up to 65536 ranks for the fewest GPUs that fit
    local c = ctx { world = 65536 }
    for _, sh in ipairs { "row_wise", "data_parallel" } do
      local o = assert(cost.option(tab(), c, { sharding = sh, placement = "device" }))
      assert.equal(65536, o.shards_count)
      assert.equal(1, #o.shards)
      near(o.time, 65536 * o.shards[1].time, sh .. " time")
      assert.equal(65536 * o.shards[1].hbm, o.hbm)
    end
  end)

  it("prices the dense part: MLP and interaction FLOPs at the calibrated rates", function()
    local dm = cost.dense_model { dense_features = 3, bottom = { 4 }, top = { 2, 1 }, tables = 1, dim = 4 }
    -- dot over 2 vectors: 1 pair; top input 4 + 1
    assert.equal(3 * 4 + 5 * 2 + 2 * 1, dm.macs)
    assert.equal(3 * 4 + 4 + 5 * 2 + 2 + 2 * 1 + 1, dm.params)
    -- the bottom's first layer (3 -> 4) is fed data: 4 of its 6 products (no input gradient)
    assert.equal(dm.macs - 3 * 4 / 3, dm.product_macs)
    local d = cost.dense(dm, ctx())
    near(d.mlp, 6 * B * dm.product_macs / R.mlp_f32, "mlp")
    near(d.interaction, B * 6 * 1 * 4 / R.interaction_dot, "interaction")
    near(d.optimizer, dm.params * 4 * 3 / R.hbm_copy, "optimizer (sgd)")
    near(d.time, d.mlp + d.interaction + d.optimizer, "dense time")
    local bf = cost.dense(cost.dense_model { dense_features = 3, bottom = { 4 }, top = { 2, 1 }, tables = 1, dim = 4,
                                             precision = "bf16" }, ctx())
    near(bf.mlp, 6 * B * dm.product_macs / R.mlp_bf16, "bf16 mlp")
  end)

  it("refuses a dense description it cannot read, naming the field and the value", function()
    -- each raised from inside the arithmetic ("attempt to get length of field 'top'", "attempt to
    -- compare string with number") or, for a misspelt key or precision, priced a default unsaid
    local function d(over)
      local t = { dense_features = 3, bottom = { 4 }, top = { 2, 1 }, tables = 1, dim = 4 }
      for k, v in pairs(over) do t[k] = v end
      return t
    end
    local cases = {
      { 5, "the description is a number; expected a table {dense_features, bottom, top, tables, dim, ...}" },
      { d { top = false }, "top is false; expected a list of layer widths" },
      { d { bottom = { 4, "x" } }, "bottom[2] is 'x'; expected a layer's width, a whole number >= 1" },
      { d { top = { 2, 0.5 } }, "top[2] is 0.5; expected a layer's width, a whole number >= 1" },
      { d { tables = false }, "tables is false; expected the embedding tables' count, a whole number >= 1" },
      { d { dim = 0 }, "dim is 0; expected the embedding dimension, a whole number >= 1" },
      { d { dense_features = -1 }, "dense_features is -1; expected a whole number >= 1" },
      { d { interaction = "dcn" }, "interaction is 'dcn'; expected dot or dcnv2" },
      { d { cross_layers = 1.5 }, "cross_layers is 1.5; expected a whole number >= 0" },
      { d { cross_rank = -2 }, "cross_rank is -2; expected a whole number >= 0" },
      { d { precision = "fp16" }, "precision is 'fp16'; expected f32, tf32 or bf16" },
      { d { optimizer = "lamb" }, "optimizer is 'lamb'; expected adagrad, adam, adamw, sgd" },
      { d { momentum = "0.9" }, "momentum is '0.9'; expected a number >= 0" },
      { d { eval_batch = -1 }, "eval_batch is -1; expected a whole number >= 0" },
      { d { self_interaction = 1 }, "self_interaction is 1; expected a boolean" },
      { d { dense_feature = 13 }, "unknown key 'dense_feature'; expected bottom, cross_layers, cross_rank, "
        .. "dense_features, dim, eval_batch, interaction, momentum, optimizer, precision, self_interaction, "
        .. "tables, top" },
    }
    for _, c in ipairs(cases) do
      assert.has_error(function() cost.dense_model(c[1]) end, "cost.dense_model: " .. c[2])
    end
    -- what from_config gives: the config's fields, nil where it has none
    assert.equal(3, cost.dense_model(d { interaction = "dcnv2", cross_layers = 0, optimizer = "adamw",
                                         momentum = 0, eval_batch = 0, self_interaction = true }).layers)
  end)

  it("prices an MLP layer's output values and calls where the calibration has them", function()
    local R2 = {}
    for k, v in pairs(R) do R2[k] = v end
    R2.mlp_act_f32, R2.mlp_layer_f32, R2.mlp_act_bf16 = 2e-9, 5e-5, 7e-9
    local c2 = ctx { calib = planner.calib.synthetic(R2) }
    local shape = { dense_features = 3, bottom = { 4 }, top = { 2, 1 }, tables = 1, dim = 4 }
    local dm = cost.dense_model(shape)
    -- three layers, whose outputs are 4 + 2 + 1 values a sample
    assert.equal(3, dm.layers)
    assert.equal(4 + 2 + 1, dm.outputs)
    near(cost.dense(dm, c2).mlp, 6 * B * dm.product_macs / R.mlp_f32 + B * 7 * 2e-9 + 3 * 5e-5, "mlp with its terms")
    -- bf16 has no per-layer term here: that part is left out (0), not borrowed from f32
    shape.precision = "bf16"
    near(cost.dense(cost.dense_model(shape), c2).mlp, 6 * B * dm.product_macs / R.mlp_bf16 + B * 7 * 7e-9, "bf16")
    -- DCNv2's cross layers are layers too: three of 8 x 8 (the bottom's 4 and one table of 4)
    local dc = cost.dense_model { dense_features = 3, bottom = { 4 }, top = { 1 }, tables = 1, dim = 4,
                                  interaction = "dcnv2", cross_layers = 3 }
    assert.equal(1 + 3 + 1, dc.layers)
    assert.equal(4 + 3 * 8 + 1, dc.outputs)
  end)

  -- A model of config c[1] with sets c[2] (and `base`) trained 2 steps on the CPU, its arena given
  -- `where`'s blocks (the same engine/src/dense/arena.c carves host and device ones): the
  -- config, the run's result, its model and optimizer, and a label for messages.
  local function trained(c, where, base)
    local train = require "uvmrec.train"
    local arena = require "uvmrec.nn.arena"
    local sets = { "embeddings.max_rows=1000", "train.steps=2", "eval.min_auc=0", base }
    for _, x in ipairs(c[2]) do sets[#sets + 1] = x end
    local cfg = assert(train.config.load(assert(train.find_config(c[1])), sets))
    local model, opt
    local r = assert(train.run(cfg, { cpu = true, progress = "none", print = function() end, setup = function(run)
      model, opt = run.model, run.optimizer
      local a = arena.new("host", -1, arena.BLOCK[where])
      model:apply(function(m) m._arena, m._bufs = a, {} end)
    end }))
    return cfg, r, model, opt, c[1] .. " " .. table.concat(c[2], " ") .. ", " .. where .. " blocks"
  end

  it("holds the dense part as the engine does: its parameters, and the arena's blocks of a step's tensors", function()
    -- Models trained on the CPU, their arena given host blocks and then the GPU's device blocks
    -- (the same engine/src/dense/arena.c carves both): the planner's bytes are the engine's.
    local train = require "uvmrec.train"
    local arena = require "uvmrec.nn.arena"
    local cases = {
      { "dlrm_kaggle", { "train.batch_size=1024" } },              -- the dot interaction, f32
      { "dlrm_kaggle", { "train.batch_size=1000", "model.precision=bf16", "optimizer.name=adam" } },
      { "dlrm_tiny", {} },                                          -- adagrad
      { "dlrm_dcnv2", { "train.batch_size=512" } },                 -- low-rank cross layers, bf16
      { "dlrm_dcnv2", { "train.batch_size=300", "model.cross_rank=0", "model.cross_layers=2",
                        "model.precision=f32" } },
    }
    for _, c in ipairs(cases) do
      for _, where in ipairs { "host", "device" } do
        local cfg, _, model, opt, what = trained(c, where, "eval.samples=0")
        local params = helpers.dense_bytes(model, opt)
        local prob = assert(planner.from_config(cfg))
        -- trained on the CPU, which keeps no workspaces: priced without them
        local dm = cost.dense_model(prob.dense)
        local d = cost.dense(dm, ctx { batch = prob.batch, arena_block = arena.BLOCK[where], workspaces = false })
        local got = model:arena():stats()
        assert.equal(got.used, d.mem.activations_used, what .. ": arena bytes used")
        assert.equal(got.reserved, d.mem.activations, what .. ": arena bytes reserved")
        assert.equal(got.blocks, d.mem.arena_blocks, what .. ": arena blocks")
        assert.equal(params, d.mem.params, what .. ": parameters, gradients, bf16 copies and state")
        assert.equal(0, d.mem.workspaces, what .. ": no workspaces")
        assert.equal(params + got.reserved, d.hbm, what)
        -- on a GPU the dense ops' workspaces come on top (their arithmetic: the test below)
        local g = cost.dense(dm, ctx { batch = prob.batch, arena_block = arena.BLOCK[where] })
        assert.equal(cost.dense_workspaces(dm, prob.batch, cost.WORKSPACE.sms, true), g.mem.workspaces, what)
        assert.equal(params + got.reserved + g.mem.workspaces, g.hbm, what .. " on a GPU")
      end
    end
    -- a GPU's arena is one 64 MiB block for dlrm_kaggle at a batch of 1024, most of it unused
    -- (no ReLU masks: a Linear folds the ReLU below it by its input, X_RELU)
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_kaggle")), { "train.batch_size=1024",
                                                                                    "eval.samples=0" }))
    local d = cost.dense(cost.dense_model(assert(planner.from_config(cfg)).dense), ctx { batch = 1024 })
    assert.equal(64 * 2 ^ 20, d.mem.activations)
    assert.equal(18030848, d.mem.activations_used)
  end)

  it("holds the GPU's dense workspaces: cuBLASLt's 32 MiB a stream and the largest part a backward asks", function()
    local LT, SMS = 32 * 2 ^ 20, 132
    assert.equal(SMS, cost.WORKSPACE.sms)
    -- bottom {4} (3 -> 4, its ReLU's gradient and bias sums in chunks of rows: min(4 SMs a
    -- 32-column tile, ceil(100 / 8)) = 13 chunks of 4 floats), top {2, 1} over the dot
    -- interaction padded to 8 columns (8 -> 2 masked by the layer above; 2 -> 1 one output:
    -- blocks of ceil(100 / 32) = 4, each 2 x 2 + 1 floats); the MLPs' weight gradients on a
    -- side stream, which holds cuBLASLt's part alone
    local dm = cost.dense_model { dense_features = 3, bottom = { 4 }, top = { 2, 1 }, tables = 1, dim = 4 }
    local main, side = LT + math.max(13 * 4 * 4, (4 * 2 * 2 + 4) * 4), LT
    assert.same({ main + side, main, side }, { cost.dense_workspaces(dm, 100, SMS, true) })
    local d = cost.dense(dm, ctx())
    assert.same({ main + side, 2 }, { d.mem.workspaces, d.mem.workspace_streams })
    assert.equal(d.mem.params + d.mem.activations + main + side, d.hbm)
    -- over ranks uvmrec.dist.ddp keeps the weight gradients on the model's stream: one workspace
    local d2 = cost.dense(dm, ctx { world = 2 })
    assert.same({ main, 1 }, { d2.mem.workspaces, d2.mem.workspace_streams })
    -- the CPU backend keeps none
    assert.equal(0, cost.dense(dm, ctx { workspaces = false }).mem.workspaces)
    -- a full-rank cross layer (8 -> 8) sums its bias gradient in its weight gradient's product
    -- into 8 floats on the model's stream, more than the rest at a batch of 8
    local dc = cost.dense_model { dense_features = 3, bottom = { 4 }, top = { 2, 1 }, tables = 1, dim = 4,
                                  interaction = "dcnv2", cross_layers = 1 }
    assert.same({ 2 * LT + 8 * 4, LT + 8 * 4, LT }, { cost.dense_workspaces(dc, 8, SMS, true) })
    -- a one-output layer over 256 columns at 65536 rows: 4 x 132 blocks at most, of
    -- ceil(65536 / 528) = 125 rows, so 525 blocks of 256 x 2 + 1 floats
    local one = { linears = cost.mlp_linears({ 256, 1 }, false, true) }
    assert.equal(LT + (525 * 256 * 2 + 525) * 4, cost.dense_workspaces(one, 65536, SMS, true))
    -- in an MLP {64, 96, 48, 8} a layer above a ReLU masks its input's gradient by its input
    -- (X_RELU) and sums the ReLU's bias gradient in the same pass, by chunks of rows: at 8 rows
    -- one chunk of its input's width in floats (96, and 48 in the last layer), on the model's
    -- stream; the last layer, unmasked and without a ReLU, sums its own bias gradient in its
    -- weight gradient's product, into 8 floats on the side stream
    local mlp = { linears = cost.mlp_linears({ 64, 96, 48, 8 }, false, true) }
    assert.same({ 2 * LT + 96 * 4 + 8 * 4, LT + 96 * 4, LT + 8 * 4 }, { cost.dense_workspaces(mlp, 8, SMS, true) })
    -- dlrm_mlperf_v1 at 65536 rows: bottom 13-512-256-128 (its last ReLU's bias gradient in
    -- 4 x 132 chunks of one 256-column tile, 528 of 128 floats; the ReLUs below it folded into
    -- the input gradients by chunks), top 480-1024-1024-512-256-1 (479 interaction columns padded to 8; the ReLUs
    -- folded in by chunks: 132 of 1024 floats at most; the one-output layer's 525 blocks of
    -- 2 x 256 + 1 floats, the largest), the weight gradients on the side stream (no bias
    -- gradient left to them: every bias is summed below or in a ReLU's pass)
    local mlperf = cost.dense_model { dense_features = 13, bottom = { 512, 256, 128 },
                                      top = { 1024, 1024, 512, 256, 1 }, tables = 26, dim = 128 }
    local gemv = (525 * 256 * 2 + 525) * 4
    assert.is_true(gemv > 132 * 1024 * 4 and gemv > 528 * 128 * 4)
    assert.same({ 2 * LT + gemv, LT + gemv, LT }, { cost.dense_workspaces(mlperf, 65536, SMS, true) })
    assert.same({ LT + gemv, LT + gemv, 0 }, { cost.dense_workspaces(mlperf, 65536, SMS, false) })
    -- at 32 rows the folded ReLUs' 4 chunks (a chunk per 8 rows) of 1024 floats are the largest:
    -- the one-output layer has one block of 2 x 256 + 1 floats
    assert.same({ 2 * LT + 4 * 1024 * 4, LT + 4 * 1024 * 4, LT }, { cost.dense_workspaces(mlperf, 32, SMS, true) })
  end)

  it("holds the arena of a run that evaluates: the evaluation's forward at its batch on top of the step's", function()
    -- As above, with evaluations (every step, then at the end: the first takes its tensors, the
    -- later ones and the steps between take views of them): larger batches than training's (the
    -- forward's tensors taken again, masks included), smaller ones (only the probabilities, and
    -- the logits cast to f32 under bf16), and fewer held-out samples than eval.batch_size (one
    -- batch of them); the planner's figure is the arena's after the run.
    local train = require "uvmrec.train"
    local arena = require "uvmrec.nn.arena"
    local cases = {
      { "dlrm_kaggle", { "train.batch_size=1024", "eval.samples=16384" }, 16384 },  -- the default eval batch
      { "dlrm_kaggle", { "train.batch_size=1000", "model.precision=bf16", "eval.samples=5000",
                         "eval.batch_size=3000" }, 3000 },                           -- a partial last batch
      { "dlrm_tiny", { "eval.samples=700", "eval.batch_size=100" }, 100 },           -- smaller than training's
      { "dlrm_dcnv2", { "train.batch_size=512", "eval.samples=4096", "eval.batch_size=4096" }, 4096 },
      { "dlrm_dcnv2", { "train.batch_size=300", "model.cross_rank=0", "model.cross_layers=2", "model.precision=f32",
                        "eval.samples=2000" }, 2000 },                               -- eval.samples < eval.batch_size
    }
    for _, c in ipairs(cases) do
      for _, where in ipairs { "host", "device" } do
        local cfg, r, model, _, what = trained(c, where, "eval.every=1")
        assert.equal(2, r.eval and #r.evals or 0, what .. ": evaluations")
        local prob = assert(planner.from_config(cfg))
        assert.equal(c[3], prob.dense.eval_batch, what .. ": the evaluation's batch")
        local dm = cost.dense_model(prob.dense)
        local d = cost.dense(dm, ctx { batch = prob.batch, arena_block = arena.BLOCK[where] })
        local got = model:arena():stats()
        assert.equal(got.used, d.mem.activations_used, what .. ": arena bytes used")
        assert.equal(got.reserved, d.mem.activations, what .. ": arena bytes reserved")
        assert.equal(got.blocks, d.mem.arena_blocks, what .. ": arena blocks")
        dm.eval_batch = 0
        local step = cost.dense(dm, ctx { batch = prob.batch, arena_block = arena.BLOCK[where] })
        assert.equal(d.mem.activations - step.mem.activations, d.mem.eval_activations,
                     what .. ": the evaluation's part")
      end
    end
    -- on a GPU dlrm_kaggle's default evaluation (batches of 16384) takes two more 64 MiB blocks
    -- beside the step's one: 192 MiB
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_kaggle")), { "train.batch_size=1024" }))
    local d = cost.dense(cost.dense_model(assert(planner.from_config(cfg)).dense), ctx { batch = 1024 })
    assert.equal(192 * 2 ^ 20, d.mem.activations)
    assert.equal(3, d.mem.arena_blocks)
    assert.equal(128 * 2 ^ 20, d.mem.eval_activations)
    -- over two ranks each evaluates its slice of the global batch
    assert.equal(8192, assert(planner.from_config(cfg, { world = 2 })).dense.eval_batch)
  end)

  it("prices a managed table's hint intervals, once every hints_every steps", function()
    local R2 = {}
    for k, v in pairs(R) do R2[k] = v end
    R2.hints_per_row = 4e-9
    local c2 = planner.calib.synthetic(R2)
    local managed = { placement = "managed", prefix_fraction = 0.2 }
    local with = cost.option(tab(), ctx { calib = c2, hints_every = 10 }, managed)
    local without = cost.option(tab(), ctx(), managed)
    near(with.hints_seconds, ROWS * 4e-9 / 10, "hints")
    near(without.hints_seconds, 0, "a calibration without the rate leaves it out")
    near(with.time - without.time, ROWS * 4e-9 / 10, "in the table's time")
    near(cost.option(tab(), ctx { calib = c2 }, managed).hints_seconds,
         ROWS * 4e-9 / 100, "every 100 steps by default")
    assert.is_nil(cost.option(tab(), ctx { calib = c2 }, { placement = "device" }).hints_seconds)
    assert.has_error(function() ctx { hints_every = 0 } end,
      "cost.context: hints_every is 0; expected the steps between hint intervals (>= 1)")
  end)

  it("adds the loader's time to a CPU step and to a GPU's work (drawn on the model's stream), against the calls",
     function()
    local R2 = {}
    for k, v in pairs(R) do R2[k] = v end
    R2.loader_per_value = 3e-9
    local c2 = ctx { calib = planner.calib.synthetic(R2) }
    near(cost.loader(c2, 40), B * 40 * 3e-9, "loader")
    near(cost.loader(ctx(), 40), 0, "a calibration without the loader's rate leaves it out")
    near(cost.step(5e-3, 1e-3, "cpu", 2e-3), 8e-3, "cpu: in turn")
    near(cost.step(5e-3, 1e-3, "cuda", 2e-3), 7e-3, "gpu: the work and the loader in turn")
    near(cost.step(5e-3, 1e-3, "cuda"), 5e-3, "gpu: the work")
    near(cost.step(5e-3, 8e-3, "cuda", 2e-3), 8e-3, "gpu: the calls, which the host runs ahead")
  end)

  it("lists the choices a table may take, narrowed by its fixed settings", function()
    local c = ctx { world = 2 }
    local all = cost.options(tab(), c)
    local kinds = {}
    for _, o in ipairs(all) do kinds[o.sharding .. " " .. o.placement] = true end
    for _, k in ipairs({ "table_wise device", "table_wise managed", "table_wise cached", "table_wise host",
                         "row_wise cached", "column_wise device", "data_parallel device" }) do
      assert.is_true(kinds[k], k)
    end
    local t = tab()
    t.fixed = { placement = "cached", load_factor = 0.5 }
    local only = cost.options(t, c)
    for _, o in ipairs(only) do
      assert.equal("cached", o.placement)
      assert.equal(0.5, o.load_factor)
    end
    assert.is_true(#only >= 2) -- table_wise, row_wise, column_wise
  end)
end)
