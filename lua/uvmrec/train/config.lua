-- The training config: its schema (every section a YAML config of models/ may hold), loading
-- with --set overrides, and the checks that span several values, each reported at the
-- position of the value it blames (file:line:column, or the --set that gave it).
local config = require "uvmrec.config"

local M = {}

local int, number, bool, string, scalar, enum, list, map, dict =
  config.int, config.number, config.bool, config.string, config.scalar, config.enum, config.list, config.map,
  config.dict

local PLACEMENTS = { "auto", "device", "managed", "host", "cached" }
-- How a table is sharded over the ranks of a job (uvmrec.dist.plan); a run of one rank ignores it.
M.SHARDINGS = { "table_wise", "row_wise", "column_wise", "data_parallel" }

-- Managed collisions (uvmrec.mc): the section as a default for every table, or per table;
-- a policy turns them on ("none": ids modulo rows), the other keys inherit.
local function collisions_schema()
  return map {
    policy = enum { "lfu", "lru", "distance_lfu", "none" },
    evict_every = int { min = 1 }, fallback_rows = int { min = 1 }, max_candidates = int { min = 1 },
    decay = number { min = 0, max = 1 }, distance_power = number { min = 0, max = 16 }, fill = bool {},
  }
end
local TBE_OPTIMS = require("uvmrec.optim").names("tables")
local DENSE_OPTIMS = require("uvmrec.optim").names("dense")
M.METRICS = { "auc", "ne", "accuracy", "calibration", "ctr" }
M.MAX_BATCH = 2 ^ 24 -- samples in a batch: far beyond any GPU's, and its buffers stay allocatable

M.schema = map({
  name = string { pattern = "^[%w_%-%.]+$" },
  model = map({
    file = string { default = "dlrm.lua" },   -- the model definition, beside the config or in models/
    dense_features = int { min = 1, max = 4096, default = 13 },
    bottom_mlp = list(int { min = 1 }, { min_len = 1 }),  -- widths after the dense input
    top_mlp = list(int { min = 1 }, { min_len = 1 }),     -- widths after the interaction; last 1
    interaction = enum({ "dot", "dcnv2" }, { default = "dot" }),
    self_interaction = bool { default = false },
    cross_layers = int { min = 1, max = 64, default = 3 }, -- dcnv2
    cross_rank = int { min = 0, default = 0 },             -- dcnv2: 0 full rank
    precision = enum({ "f32", "tf32", "bf16" }, { default = "f32" }),
  }, { required = { "bottom_mlp", "top_mlp" } }),
  embeddings = map({
    dim = int { min = 4, max = 1024 },                         -- a multiple of 4
    rows = list(int { min = 1 }, { min_len = 1, max_len = 65536 }), -- one table per sparse feature
    max_rows = int { min = 0, default = 0 },                   -- 0: no cap
    dtype = enum({ "f32", "f16", "bf16" }, { default = "f32" }),
    pooling = enum({ "sum", "mean" }, { default = "sum" }),
    placement = enum(PLACEMENTS, { default = "auto" }),        -- auto: device with a GPU, else host
    bounds = enum({ "fatal", "warn", "off" }, { default = "fatal" }),
    sharding = enum(M.SHARDINGS, { default = "table_wise" }),  -- over the ranks (uvmrec launch -n N)
    vbe = bool { default = false },                            -- over ranks: distinct bags exchanged
    far_rows = int { min = 0, default = 0 },                   -- GPU: HBM copies of the far rows (read
                                                               -- over the host link) a forward reads,
                                                               -- stepped from by the backward (uvm.md)
    far_behind = bool { default = false },                     -- the copies written home behind the step
    far_dma = enum({ "none", "home", "early", "both" },        -- which far rows' moves go through the copy
                   { default = "none" }),                      -- engines and host threads, not copy kernels
    tables = dict(map {                                        -- per table (C1, C2, ...)
      placement = enum(PLACEMENTS), dtype = enum { "f32", "f16", "bf16" },
      sharding = enum(M.SHARDINGS),                            -- this table's (default: embeddings.sharding)
      rank = int { min = 0 },                                  -- table_wise: its rank (default: the least loaded)
      hints = map { policy = string {},                        -- this table's hint policy
                    options = dict(scalar {}),                 -- its options (with its policy)
                    allowance = string {} },                   -- its own HBM ('20%' of its bytes, '1GiB')
      cache = map { load_factor = number { min = 0, max = 1 } }, -- its own cache size (placement cached)
      collisions = collisions_schema(),                        -- this table's managed collisions
    }),
    collisions = collisions_schema(),                          -- managed collisions (uvmrec.mc): raw
                                                               -- ids to rows by policy, not modulo
    hints = map {                                              -- managed tables (uvmrec.hints)
      policy = string { default = "hot_prefix" },              -- none, host, hot_prefix, adaptive, or a .lua file
      options = dict(scalar {}),                               -- the policy's: adaptive's {margin: 0.05}
      every = int { min = 1, default = 100 },                  -- steps between the policy's intervals
      allowance = string { default = "100%" },                 -- HBM for managed tables: '20%' or '8GiB'
      decay = number { min = 0, max = 1, default = 1 },        -- counts *= decay after each interval
      monitor = enum({ "end", "interval", "off" }, { default = "end" }), -- the GPU's migration read at each
                                                               -- summary, each interval too (16 ms on
                                                               -- the H200), or never
    },
    cache = map {                                              -- cached tables (uvmrec.cache)
      load_factor = number { min = 0, max = 1 },               -- of each table's rows (default 0.2)
      slots = int { min = 1 }, bytes = string {},              -- or rows, or slot bytes ('4GiB')
      shared = bool {},                                        -- one pool of sets for all tables
      policy = enum { "lru", "lfu" }, decay_batches = int { min = 0 },
      staging_rows = int { min = 0 }, backing = enum { "host", "managed" },
      min_slots = int { min = 0 },                             -- tables of <= min_slots/2 rows cached whole
      mover_warps = int { min = 0 },                           -- GPU: warps moving rows (default 256; 0: a warp a row)
    },
    optimizer = map {
      name = enum(TBE_OPTIMS, { default = "sgd" }),
      lr = number { min = 0 },                                 -- default: the dense lr
      eps = number { min = 0 }, weight_decay = number { min = 0 },
      beta1 = number { min = 0, max = 1 }, beta2 = number { min = 0, max = 1 },
      max_grad = number { min = 0 },                           -- each gradient element clipped to
                                                               -- [-max_grad, max_grad]; 0: none
      deterministic = bool { default = true },                 -- false: atomic SGD on the GPU (uvmrec.tbe)
    },
  }, { required = { "dim", "rows" } }),
  optimizer = map({                                            -- the dense parameters'
    name = enum(DENSE_OPTIMS, { default = "sgd" }),
    lr = number { min = 0 },
    momentum = number { min = 0, default = 0 },
    weight_decay = number { min = 0 },
    eps = number { min = 0 },
    beta1 = number { min = 0, max = 1 }, beta2 = number { min = 0, max = 1 },
    clip_norm = number { min = 0 },                            -- gradients clipped to this global norm
                                                               -- (clip_grad_norm_); 0: none
  }, { required = { "lr" } }),
  schedule = map {                                             -- a factor on each group's lr (ur.optim.Schedule)
    name = enum({ "constant", "warmup", "dlrm" }, { default = "constant" }),
    warmup_steps = int { min = 0, default = 0 },
    decay_start = int { min = 0, default = 0 },
    decay_steps = int { min = 0, default = 0 },
    power = number { min = 0, default = 2 },
    min_factor = number { min = 0, max = 1, default = 0 },
  },
  train = map {
    batch_size = int { min = 1, max = M.MAX_BATCH, default = 1024 },
    steps = int { min = 0, default = 0 },          -- 0: until the data ends (epochs)
    epochs = int { min = 1, max = 2 ^ 31 - 1, default = 1 },
    seed = int { min = 0, max = 2 ^ 52 - 1, default = 1 }, -- below nn.Module.MAX_SEED (module_spec checks)
    log_every = int { min = 1, default = 10 },     -- read the loss (the one wait) every N steps
    nonfinite = enum({ "stop", "skip", "off" }, { default = "stop" }), -- a NaN or Inf in the loss or a
                                                   -- dense gradient stops the run, or its step is skipped
    pipeline = bool { default = false },           -- the prefetch pipeline (uvmrec.pipeline.Prefetch)
    drain = bool { default = true },               -- the pipeline at the end of the data: train the
                                                   -- batches in flight (true) or drop them
    print_every = int { min = 0, default = 0 },    -- lines when not on a terminal; 0: ~10 a run
    checkpoint_every = int { min = 0, default = 0 }, -- save RUNDIR/checkpoints every N steps and at
                                                   -- the end (needs --out); 0: only on a signal
    keep = int { min = 0, default = 0 },           -- checkpoints kept there, the newest; 0: all
  },
  data = map {
    train = string { default = "" },               -- a data spec; "" for a config without one
    eval = string { default = "" },                -- "": synthetic data's held-out samples (from 2^48)
    samples = int { min = 0, default = 0 },        -- synthetic samples per epoch; 0: steps x batch
    shuffle_window = int { min = 0, default = 0 },
    depth = int { min = 1, max = 64, default = 4 },
    seed = int { min = 0, default = 0 },
    on_bad_line = enum({ "fail", "skip" }, { default = "fail" }), -- TSV: a bad line stops the run, or is skipped
    pad_missing_fields = bool { default = false }, -- TSV: lines of 15..39 fields take empty trailing ones
    drop_last = bool { default = false },          -- an epoch's short last batch is dropped, not trained
                                                   -- (over ranks: one they cannot share is refused)
  },
  eval = map {
    every = int { min = 0, default = 0 },          -- steps; 0: only at the end
    samples = int { min = 0, max = 2 ^ 30, default = 65536 }, -- held-out samples; 0: all of data.eval
    batch_size = int { min = 1, max = M.MAX_BATCH, default = 16384 },
    metrics = list(enum(M.METRICS), { default = { "auc", "ne", "accuracy", "calibration", "ctr" } }),
    min_auc = number { min = 0, max = 1, default = 0 }, -- the final AUC must reach it (0: no check)
  },
}, { required = { "model", "embeddings", "optimizer" } })

-- Defaults that are tables must not be shared between configs (defaults() hands out the
-- schema's own), nor sections left absent that --set may fill.
local function own_tables(cfg)
  cfg.eval.metrics = { unpack(cfg.eval.metrics) }
  cfg.embeddings.tables = cfg.embeddings.tables or {}
  return cfg
end

-- A hint policy name: nil when it is a built-in one or a .lua file, else the message.
function M.check_policy(name)
  for _, b in ipairs(require("uvmrec.hints").BUILTIN) do
    if name == b then return nil end
  end
  if name:match("%.lua$") then return nil end
  return ("'%s' is not a hint policy: %s, or a path to a .lua file"):format(name,
    table.concat(require("uvmrec.hints").BUILTIN, ", "))
end

-- A hint policy's options (embeddings.hints.options, a table's hints.options), checked by the
-- policy itself as hints.new checks those of the Lua API (its ranges, its keys): nil, or the
-- path of the value to blame (under `at`, the hints section) and the message.  One key at a time,
-- so that the message falls on the key it names.
function M.check_options(at, policy, options)
  if options == nil or next(options) == nil then return nil end
  local hints = require "uvmrec.hints"
  local function why(err) return (tostring(err):gsub("^[^\n]-:%d+: ", ""):gsub("^hints: ", "")) end
  local ok, err = pcall(hints.new, policy) -- a policy file that does not load is the policy's fault
  if not ok then return at .. ".policy", why(err) end
  local keys = {}
  for k in pairs(options) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    ok, err = pcall(hints.new, policy, { [k] = options[k] })
    if not ok then return at .. ".options." .. k, why(err) end
  end
  return nil
end

-- Checks between values: nil, or the message at the position of the value to change.
function M.check(cfg)
  local function fail(path, msg) return config.message(cfg, path, msg) end
  local m, e = cfg.model, cfg.embeddings
  if e.dim % 4 ~= 0 then
    return fail("embeddings.dim", ("%d is not a multiple of 4 (rows are read 16 bytes at a time)"):format(e.dim))
  end
  if m.interaction == "dot" and m.bottom_mlp[#m.bottom_mlp] ~= e.dim then
    return fail(("model.bottom_mlp[%d]"):format(#m.bottom_mlp),
      ("the dot interaction needs the bottom MLP to end at embeddings.dim (%d), not %d"):format(
        e.dim, m.bottom_mlp[#m.bottom_mlp]))
  end
  if m.top_mlp[#m.top_mlp] ~= 1 then
    return fail(("model.top_mlp[%d]"):format(#m.top_mlp),
      ("the top MLP gives one logit: its last width must be 1, not %d"):format(m.top_mlp[#m.top_mlp]))
  end
  -- a setting of the other interaction would be ignored: the dot interaction has no cross
  -- layers, and dcnv2's layers read the vectors side by side (no pairs, none with itself).  Its
  -- default passes: a run's config.json, the config resolved, holds every key.
  local foreign = m.interaction == "dot" and { "cross_layers", "cross_rank" } or { "self_interaction" }
  for _, key in ipairs(foreign) do
    if config.given(cfg, "model." .. key) and m[key] ~= M.schema.fields.model.fields[key].default then
      return fail("model." .. key, ("the %s interaction takes no %s (a setting of the %s interaction)"):format(
        m.interaction, key, m.interaction == "dot" and "dcnv2" or "dot"))
    end
  end
  if m.interaction == "dcnv2" and m.cross_rank > 0 then
    local width = m.bottom_mlp[#m.bottom_mlp] + #e.rows * e.dim
    if m.cross_rank >= width then
      return fail("model.cross_rank", ("rank %d is not below the cross layers' width %d; use 0 for full rank"):format(
        m.cross_rank, width))
    end
  end
  for name, t in pairs(e.tables) do
    local i = tonumber(name:match("^C(%d+)$"))
    if not i or i < 1 or i > #e.rows then
      return fail("embeddings.tables." .. name, ("no table '%s'; tables are C1 to C%d"):format(name, #e.rows))
    end
    local at = "embeddings.tables." .. name
    if t.rank and (t.sharding or e.sharding) ~= "table_wise" then
      return fail(at .. ".rank", ("table %s is sharded %s: a rank places a table_wise table"):format(name,
        t.sharding or e.sharding))
    end
    local place = t.placement or e.placement
    for _, k in ipairs { "policy", "options", "allowance" } do
      -- hints steer a managed table: a device or host table's (auto is one of those) were dropped
      if t.hints and t.hints[k] ~= nil and place ~= "managed" then
        return fail(at .. ".hints." .. k, ("table %s is placed %s (embeddings.%splacement): hints steer the rows of "
          .. "a managed table"):format(name, place, t.placement and ("tables." .. name .. ".") or ""))
      end
    end
    local perr = t.hints and t.hints.policy and M.check_policy(t.hints.policy)
    if perr then return fail(at .. ".hints.policy", perr) end
    if t.hints and t.hints.options and not t.hints.policy then
      -- the manager gives the default policy embeddings.hints.options: these would be dropped
      return fail(at .. ".hints.options", ("options without a policy of table %s's own (embeddings.hints.options "
        .. "are the default policy's); give %s.hints.policy"):format(name, at))
    end
    local opath, oerr = M.check_options(at .. ".hints", t.hints and t.hints.policy, t.hints and t.hints.options)
    if opath then return fail(opath, oerr) end
    local lf = t.cache and t.cache.load_factor
    if lf ~= nil then
      if place ~= "cached" then
        return fail(at .. ".cache.load_factor", ("table %s is placed %s (embeddings.%splacement): a load factor "
          .. "sizes the cache of a cached table"):format(name, place, t.placement and ("tables." .. name .. ".") or ""))
      end
      if lf <= 0 then return fail(at .. ".cache.load_factor", ("%s; expected a number in (0, 1]"):format(lf)) end
      if e.cache.shared then
        return fail(at .. ".cache.load_factor", "a load factor per table needs sets per table, and "
          .. "embeddings.cache.shared puts every cached table in one pool")
      end
    end
    local al = t.hints and t.hints.allowance
    if al ~= nil then
      local ok, aerr = pcall(require("uvmrec.hints").parse_allowance, al, 1)
      if not ok then
        return fail(at .. ".hints.allowance", (tostring(aerr):gsub("^[^\n]-:%d+: ", ""):gsub("^hints: ", "")))
      end
    end
  end
  local managed = M.collisions(cfg)
  for i, r in ipairs(M.table_rows(cfg)) do
    local c = managed[i]
    if c then
      local own = (e.tables["C" .. i] or {}).collisions or {}
      local function at(key)
        return own[key] ~= nil and ("embeddings.tables.C%d.collisions.%s"):format(i, key)
               or "embeddings.collisions." .. key
      end
      if r < 2 then
        return fail(at("policy"), ("table C%d has %d row; managed collisions need 2 or more (policy none "
                                   .. "turns them off for one table)"):format(i, r))
      end
      if c.fallback_rows and c.fallback_rows >= r then
        return fail(at("fallback_rows"), ("%d fallback rows leave table C%d (%d rows) none for resident ids")
                                         :format(c.fallback_rows, i, r))
      end
      if c.decay == 0 then return fail(at("decay"), "decay 0 would forget every count; expected a value in (0, 1]") end
      if c.distance_power == 0 then return fail(at("distance_power"), "expected a value in (0, 16]") end
    end
  end
  if next(managed) and cfg.train.pipeline then
    return fail("train.pipeline", "managed collisions run in the plain loop for now: a round resets rows that a "
                .. "batch in flight in the pipeline would still update")
  end
  local perr = M.check_policy(e.hints.policy)
  if perr then return fail("embeddings.hints.policy", perr) end
  local opath, oerr = M.check_options("embeddings.hints", e.hints.policy, e.hints.options)
  if opath then return fail(opath, oerr) end
  local ok, aerr = pcall(require("uvmrec.hints").parse_allowance, e.hints.allowance, 1)
  if not ok then
    return fail("embeddings.hints.allowance", (tostring(aerr):gsub("^[^\n]-:%d+: ", ""):gsub("^hints: ", "")))
  end
  local optim = require "uvmrec.optim"
  local fields = M.schema.fields
  local sections = { { "optimizer", cfg.optimizer, "dense", fields.optimizer.fields },
                     { "embeddings.optimizer", e.optimizer, "tables", fields.embeddings.fields.optimizer.fields } }
  for _, o in ipairs(sections) do
    local at, sec, side, keys = o[1], o[2] or {}, o[3], o[4]
    local name = sec.name or "sgd"
    for _, key in ipairs { "momentum", "eps", "beta1", "beta2", "weight_decay", "max_grad", "clip_norm" } do
      -- the dense momentum's default is 0, which every optimizer takes as none
      local v = sec[key]
      if v ~= nil and not (key == "momentum" and v == 0) then
        local why = optim.refuses(name, side, key, keys)
        if why then return fail(at .. "." .. key, why) end
        local want = optim.setting_expects(key, v)
        if want then return fail(at .. "." .. key, ("%s; expected %s"):format(v, want)) end
      end
    end
  end
  -- train.drain says what the prefetch pipeline does at the data's end: without it, dropping the
  -- batches in flight would be ignored (true, the default, as a run's config.json holds it, is)
  if not cfg.train.drain and not cfg.train.pipeline then
    return fail("train.drain", "drain is what the prefetch pipeline does at the data's end, and train.pipeline "
      .. "is off; give train.pipeline: true, or leave drain out")
  end
  local s = cfg.schedule
  -- a schedule's setting without its name would be ignored by the default, constant, schedule
  if not config.given(cfg, "schedule.name") then
    for _, key in ipairs { "warmup_steps", "decay_start", "decay_steps", "power", "min_factor" } do
      if config.given(cfg, "schedule." .. key) then
        return fail("schedule." .. key, "the schedule is constant (schedule.name is not given), which takes no "
          .. "setting; give schedule.name: warmup or dlrm")
      end
    end
  end
  -- the warm-up schedule does not decay: a decay setting under it would be ignored (its default
  -- passes, as a run's config.json, the config resolved, holds every key)
  if s.name == "warmup" then
    local sfields = M.schema.fields.schedule.fields
    for _, key in ipairs { "decay_start", "decay_steps", "power", "min_factor" } do
      if config.given(cfg, "schedule." .. key) and s[key] ~= sfields[key].default then
        return fail("schedule." .. key, ("the warmup schedule does not decay, and takes no %s (a setting of the dlrm "
          .. "schedule: warm-up, then decay); give schedule.name: dlrm"):format(key))
      end
    end
  end
  if s.name == "dlrm" and s.decay_steps < 1 then
    return fail("schedule.decay_steps", "the dlrm schedule decays over decay_steps >= 1 steps")
  end
  if (s.name == "warmup" or s.name == "dlrm") and s.warmup_steps < 1 then
    return fail("schedule.warmup_steps", s.name .. " needs warmup_steps >= 1")
  end
  -- as the DLRM reference refuses it: a decay from inside the warm-up cuts the rate mid-ramp
  if s.name == "dlrm" and s.decay_start < s.warmup_steps then
    return fail("schedule.decay_start", ("the dlrm schedule decays after its warm-up: decay_start %d is before "
      .. "warmup_steps %d"):format(s.decay_start, s.warmup_steps))
  end
  if cfg.train.steps == 0 and cfg.data.samples == 0 and cfg.data.train:match("^synthetic:") then
    -- the value given blames itself: train.steps 0 (--steps 0) asks for the data's end, which this data has not
    if config.given(cfg, "train.steps") then
      return fail("train.steps", ("0 trains until the data ends, and synthetic data (data.train %s) has no end without "
        .. "data.samples: give train.steps > 0, or data.samples"):format(cfg.data.train))
    end
    return fail("data.train", "synthetic data needs train.steps or data.samples to know its length")
  end
  -- eval.samples 0 reads held-out files to their end; synthetic held-out data has none (it trained
  -- the whole run, then failed "evaluate: the held-out data gave no batch")
  if cfg.eval.samples == 0 and cfg.data.eval:match("^synthetic:") then
    return fail("eval.samples", ("0 takes all of data.eval, and synthetic data (data.eval %s) has no end: give the "
      .. "held-out samples to draw, eval.samples > 0"):format(cfg.data.eval))
  end
  -- synthetic data of data.samples an epoch gives a known number of batches (each epoch ends in
  -- its own last batch): more steps would fail when it runs out, after training all of them
  local t, d = cfg.train, cfg.data
  if d.samples > 0 and d.train:match("^synthetic:") then
    local per = M.batches_per_epoch(cfg, d.samples)
    -- an epoch shorter than a batch, dropped whole: no batch at all (its steps' check said "give
    -- train.epochs -9223372036854775808", the ceiling of steps / 0)
    if per == 0 then
      return fail("data.samples", ("%d samples an epoch, fewer than a batch (train.batch_size %d), which "
        .. "data.drop_last drops: no batch to train; give data.samples %d or more, a smaller train.batch_size, or "
        .. "data.drop_last false"):format(d.samples, t.batch_size, t.batch_size))
    end
    if t.steps > 0 and t.steps > per * t.epochs then
      return fail("train.steps", ("%d steps, and the data gives %d: train.epochs %d of data.samples %d (%d batches "
        .. "of train.batch_size %d an epoch); give train.epochs %d, or train.steps 0 to train until the data ends")
        :format(t.steps, per * t.epochs, t.epochs, d.samples, per, t.batch_size, math.ceil(t.steps / per)))
    end
  end
  return nil
end

-- The batches an epoch of n samples gives: its short last batch counts unless data.drop_last
-- drops it (the loader's count, and the check of train.steps against the data).
function M.batches_per_epoch(cfg, n)
  return (cfg.data.drop_last and math.floor or math.ceil)(n / cfg.train.batch_size)
end

-- A config read (cfg, err from uvmrec.config's load or parse), with --set overrides ("a.b=v",
-- applied in order; or {"a.b=v", flag = "--steps 0"}, a command's flag that sets a value, which
-- its messages name) and the checks: cfg, or nil, message.
local function finish(cfg, err, sets)
  if not cfg then return nil, err end
  own_tables(cfg)
  for _, a in ipairs(sets or {}) do
    local ok, serr
    if type(a) == "table" then ok, serr = config.set(cfg, M.schema, a[1], a.flag)
    else ok, serr = config.set(cfg, M.schema, a) end
    if not ok then return nil, serr end
  end
  err = M.check(cfg)
  if err then return nil, err end
  return cfg
end

-- A config from a YAML file with --set overrides and the checks.
-- Returns cfg, or nil, message (file:line:column: path: what).
function M.load(path, sets)
  local cfg, err = config.load(path, M.schema)
  return finish(cfg, err, sets)
end

-- The same from YAML text (specs, and configs made by programs).
function M.parse(text, name, sets)
  local cfg, err = config.parse(text, M.schema, name)
  return finish(cfg, err, sets)
end

-- A checkpoint's config with the keys it lacks (added to the schema since it was written)
-- filled with their defaults, as a config loaded now would have them (config.fill_defaults).
function M.fill_defaults(cfg) return config.fill_defaults(cfg, M.schema) end

-- The training run's config a file holds in its metadata (uvmrec.config, JSON: a checkpoint's,
-- or a model file's, which export copies), its values' types checked against the schema
-- (config.check_value) and filled as fill_defaults does; f is anything with meta(key).  nil,
-- message when it has none, one that is no JSON object (a file another program wrote, or
-- edited) or one of a value the schema does not allow (`uvmrec.config: eval.batch_size: "x" is
-- not an integer`), the message naming the file by `where` ("checkpoint F").  The checks
-- between values (M.check) are not made: they may read what only the training machine has
-- (a hint policy's file).
function M.stored(f, where)
  local cfg, err = require("uvmrec.checkpoint").meta_json(f, "uvmrec.config", "object",
    { where = where, what = "the training run's config" })
  if not cfg then return nil, err end
  local bad = config.check_value(cfg, M.schema)
  if bad then return nil, ("%s: uvmrec.config: %s"):format(where, bad) end
  return M.fill_defaults(cfg)
end

-- Table sizes after the rows cap.
function M.table_rows(cfg)
  local e, out = cfg.embeddings, {}
  for i, r in ipairs(e.rows) do out[i] = e.max_rows > 0 and math.min(r, e.max_rows) or r end
  return out
end

-- The tables' sharding over the ranks, as uvmrec.dist.plan reads it: {default =
-- embeddings.sharding, C3 = embeddings.tables.C3.sharding, ...}.
function M.sharding(cfg)
  local e = cfg.embeddings
  local spec = { default = e.sharding }
  for name, t in pairs(e.tables) do
    if t.rank then
      spec[name] = { t.sharding or e.sharding, rank = t.rank }
    elseif t.sharding then
      spec[name] = t.sharding
    end
  end
  return spec
end

-- What a training run over `world` ranks needs of the config: nil, or the message at the value
-- to change.  Its final AUC is checked against eval.min_auc, so auc must be among the metrics
-- (`uvmrec eval` checks no minimum: it takes any metrics), and eval.every needs held-out data
-- where the run reaches it (M.evaluates).  The batches are global batches cut
-- into equal slices, one a rank.  (Checkpoints and
-- --resume work over ranks: the tables' shards go through uvmrec.dist.checkpoint, which
-- reshards; the prefetch pipeline exchanges each rank's next batch ahead; managed and cached
-- tables keep their placement in every shard, the hint policies driving each rank's shards.)
function M.check_world(cfg, world)
  local function fail(path, msg) return config.message(cfg, path, msg) end
  -- the data specs first: a bad one is what is wrong, not what follows from it (eval.every
  -- blamed --data bogus:x for holding no data out)
  for _, key in ipairs { "train", "eval" } do
    if cfg.data[key] ~= "" then
      local ok, err = require("uvmrec.data.loader").parse_source(cfg.data[key])
      if not ok then return fail("data." .. key, (err:gsub("^data: ", ""))) end
    end
  end
  local ev = cfg.eval
  local evaluates = M.evaluates(cfg)
  -- evaluations every eval.every steps need held-out data: without any they were never made,
  -- silently (a run that ends before eval.every would make none in any case)
  local t, synth = cfg.train, cfg.data.train:match("^synthetic:")
  local last = t.steps > 0 and t.steps
    or synth and cfg.data.samples > 0 and M.batches_per_epoch(cfg, cfg.data.samples) * t.epochs or math.huge
  if ev.every > 0 and not evaluates and cfg.data.train ~= "" and last >= ev.every then
    return fail("eval.every", ("%d, and this run has no held-out data to evaluate on (data.eval is not given, and %s): "
      .. "give %sdata.eval (--eval-data), or eval.every 0"):format(ev.every,
      synth and "eval.samples is 0: synthetic data holds out that many samples"
      or ("data.train %s holds none out"):format(cfg.data.train), synth and "eval.samples, " or ""))
  end
  if ev.min_auc > 0 then
    local has = false
    for _, k in ipairs(ev.metrics) do has = has or k == "auc" end
    if not has then
      return fail("eval.metrics", ("eval.min_auc is %g: the AUC a training run checks needs auc among the "
        .. "metrics (or eval.min_auc 0)"):format(ev.min_auc))
    end
  end
  if world <= 1 then return nil end
  -- a run that does not evaluate has no evaluation batches
  local keys = evaluates and { "train.batch_size", "eval.batch_size", "eval.samples" } or { "train.batch_size" }
  for _, key in ipairs(keys) do
    local sec, name = key:match("^(%w+)%.([%w_]+)$")
    local v = cfg[sec][name]
    if v % world ~= 0 then
      return fail(key, ("%d is not a multiple of the %d ranks: each rank takes an equal slice of every global batch")
        :format(v, world))
    end
  end
  return M.check_epoch(cfg, world, cfg.data.samples, "data.samples")
end

-- Whether a training run of cfg has held-out data to evaluate on (uvmrec.train.data's): data.eval,
-- or synthetic training data's eval.samples held-out samples.
function M.evaluates(cfg)
  return cfg.data.eval ~= "" or (cfg.data.train:match("^synthetic:") ~= nil and cfg.eval.samples > 0)
end

-- An epoch of n samples ends in a batch of what is left, which the ranks share too (it failed
-- there, steps into the run: "dist: rank 0 has a batch of 0 samples and rank 1 of 1"): nil, or
-- the message at key, where the run reaches that batch and data.drop_last does not drop it.
-- Synthetic data's n is data.samples (check_world's); day files' is known once they are open
-- (uvmrec.train.run's, key data.train, of: where they are); TSV files' only at their end.
function M.check_epoch(cfg, world, n, key, of)
  if world <= 1 or cfg.data.drop_last then return nil end
  local B, steps = cfg.train.batch_size, cfg.train.steps
  local last = n > 0 and n % B or 0
  if last % world ~= 0 and (steps == 0 or steps > math.floor(n / B)) then
    return config.message(cfg, key, ("an epoch of %d samples%s ends in a batch of %d (train.batch_size %d), "
      .. "which the %d ranks cannot share equally: each rank takes an equal slice of every global batch (make it a "
      .. "multiple of %d, or data.drop_last: true drops that batch)"):format(n, of and " (" .. of .. ")" or "", last,
      B, world, world))
  end
  return nil
end

-- Held-out data of n samples over world ranks: an evaluation reads global batches of
-- eval.batch_size until eval.samples (0: the end), and the ranks share each one, the last too
-- (it failed at the run's first evaluation, after the training). nil, or the message at
-- eval.batch_size.
function M.check_eval(cfg, world, n, of)
  local B, want = cfg.eval.batch_size, cfg.eval.samples
  local last = n % B
  if world <= 1 or last % world == 0 or (want > 0 and want <= n - last) then return nil end
  return config.message(cfg, "eval.batch_size", ("held-out data of %d samples (%s) ends in a batch of %d "
    .. "(eval.batch_size %d), which the %d ranks cannot share equally: each rank takes an equal slice of every "
    .. "global batch (make it a multiple of %d, or eval.samples at most %d)"):format(n, of, last, B, world,
    world, n - last))
end

-- Managed collisions per table: {[i] = settings for uvmrec.mc} for the tables that have them
-- (the default section's keys under the table's own; a policy turns them on, "none" off).
function M.collisions(cfg)
  local e, out = cfg.embeddings, {}
  local default = e.collisions or {}
  for i = 1, #e.rows do
    local own = (e.tables["C" .. i] or {}).collisions or {}
    local policy = own.policy or default.policy
    if policy and policy ~= "none" then
      local c = {}
      for _, k in ipairs(require("uvmrec.mc").TABLE_SETTINGS) do
        if own[k] ~= nil then c[k] = own[k] else c[k] = default[k] end
      end
      c.policy = policy
      out[i] = c
    end
  end
  return out
end

-- The learning-rate factor of the 1-based step (nil for a constant schedule).
function M.schedule(cfg)
  local s, sched = cfg.schedule, require "uvmrec.optim.schedule"
  if s.name == "constant" then return nil end
  if s.name == "warmup" then return sched.linear_warmup { base = 1, warmup = s.warmup_steps } end
  return sched.dlrm { base = 1, warmup = s.warmup_steps, decay_start = s.decay_start,
                      decay_steps = s.decay_steps, power = s.power, min = s.min_factor }
end

return M
