-- uvmrec.train: training a model from a config, as `uvmrec train` does.  The pieces, each
-- usable alone: config (schema, loading, --set), loop (the loop itself: read it to write your
-- own), source (batches from the loader, onto the GPU; a ring of them), hooks (what a run does
-- besides its steps), progress (bar or lines), evaluate (held-out metrics).
--
--   local train = require "uvmrec.train"
--   local cfg = assert(train.config.load("models/dlrm_tiny.yaml", {"train.steps=100"}))
--   local result = assert(train.run(cfg, {out = "runs/a"}))   -- result.eval.auc, ...
--
-- run() builds the model (models/<model.file>), its optimizer, the loaders, registers every
-- component's state in a checkpoint registry (ctx.registry), resumes from a checkpoint when
-- asked, and runs uvmrec.train.loop over the data (the loader, or the prefetch pipeline) with
-- its hooks: learning rates, progress and the run log, the trainer's position, hint policies,
-- evaluations, checkpoints, signals.  It writes the run directory: config.json (the resolved
-- config), metrics.jsonl (one JSON object a line) and checkpoints/ckpt-<step>.safetensors
-- (every train.checkpoint_every steps, at the end, and on SIGINT/SIGTERM).
--
-- The registry (uvmrec.checkpoint) is the one place a run's state goes through: a component
-- is {name, state() -> {tensors =, meta =}, load(tensors, meta)}; its tensors are saved as
-- "<name>.<key>", its meta as JSON.  Components of other subsystems register through
-- opts.setup(ctx) (ctx.registry:register{...}), before a resume loads them.
local ur = require "uvmrec"
local ffi = require "ffi"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local synthetic = require "uvmrec.data.synthetic"
local hints = require "uvmrec.hints"

local M = {
  config = require "uvmrec.train.config",
  loop = require "uvmrec.train.loop",
  source = require "uvmrec.train.source",
  hooks = require "uvmrec.train.hooks",
  progress = require "uvmrec.train.progress",
  evaluate = require "uvmrec.train.evaluate",
  guard = require "uvmrec.train.guard",
}
local C = ur.C

M.CEILING_SAMPLES = 262144
-- Held-out synthetic samples are drawn from index 2^48 up, a stream no training run reaches:
-- an epoch of synthetic training data is held below it, whatever train.steps says.
M.HELD_OUT = 2 ^ 48

local function exists(path) return path and C.ur_path_kind(path) == 1 end

-- Folders that may hold model files and preset configs: the tree's models/ (beside the
-- command's scripts, or above this Lua tree).
function M.models_dirs()
  local dirs = {}
  local host = package.loaded["uvmrec.host"]
  if type(host) == "table" and host.scripts then dirs[#dirs + 1] = host.scripts .. "/../models" end
  local src = debug.getinfo(1, "S").source:match("^@(.*)/uvmrec/train/init%.lua$")
  if src then dirs[#dirs + 1] = src .. "/../models" end
  return dirs
end

-- A config path: the file itself, or a preset's name ("dlrm_tiny") in models/.
function M.find_config(name)
  if exists(name) then return name end
  for _, d in ipairs(M.models_dirs()) do
    local p = ("%s/%s.yaml"):format(d, name)
    if exists(p) then return p end
  end
  return nil, ("%s: no such config file, nor a preset in models/"):format(name)
end

-- The model definition named by model.file: beside the config first, then in models/.
function M.model_def(cfg, config_path)
  local file = cfg.model.file
  local tried = {}
  local candidates = { file:sub(1, 1) == "/" and file or nil }
  if not candidates[1] then
    if config_path then candidates[#candidates + 1] = (config_path:match("^(.*)/[^/]*$") or ".") .. "/" .. file end
    for _, d in ipairs(M.models_dirs()) do candidates[#candidates + 1] = d .. "/" .. file end
  end
  for _, p in ipairs(candidates) do
    if exists(p) then
      local chunk, err = loadfile(p)
      if not chunk then return nil, err end
      local ok, def = pcall(chunk)
      if not ok then return nil, tostring(def) end
      if type(def) ~= "table" or type(def.build) ~= "function" then
        return nil, p .. ": a model file returns a table with build(cfg, opts)"
      end
      return def, p
    end
    tried[#tried + 1] = p
  end
  return nil, ("model.file %s: not found (looked at %s)"):format(file, table.concat(tried, ", "))
end

-- The dense optimizer of the config over the model's parameters (zeroing the gradients); the
-- settings the config leaves out take uvmrec.optim's defaults.
function M.optimizer(cfg, model)
  local o = cfg.optimizer
  return ur.optim.dense(o.name, model:parameters(), {
    lr = o.lr, momentum = o.name == "sgd" and o.momentum or nil, weight_decay = o.weight_decay,
    eps = o.eps, beta1 = o.beta1, beta2 = o.beta2, clip_norm = o.clip_norm, zero_grad = true,
  })
end

-- The loader options of n held-out synthetic samples (data: a spec string or a loader's data
-- table): samples 2^48 .. 2^48 + n - 1, which training never draws; rows as the training
-- data's (ids modulo rows, or raw for managed collisions; nil: as drawn).
function M.held_out(data, n, batch_size, rows)
  return { data = data, samples = M.HELD_OUT + n, position = { epoch = 0, sample = M.HELD_OUT },
           batch_size = batch_size, depth = 2, rows = rows }
end

-- A synthetic preset (spec "synthetic:NAME", given as flag) for a model of these table rows:
-- {kind = "synthetic", spec} with the preset's tables capped at the rows, so the hidden model
-- lives on them and every id fits (unless the spec draws from an id space of its own: id_space,
-- id_space_factor, whose ids the loader takes modulo loader_rows), then loader_rows (nil where
-- none is wider) and the preset's samples; or nil, message.
local function synthetic_data(spec, name, rows, load_rows, flag)
  local base, samples = synthetic.resolve(name)
  if not base then return nil, flag .. " " .. spec .. ": " .. tostring(samples) end
  if #base.tables ~= #rows then
    return nil, ("%s %s: %d sparse features, but the model has %d tables"):format(flag, spec, #base.tables, #rows)
  end
  for i, t in ipairs(base.tables) do t.rows = math.min(t.rows, rows[i]) end
  local s = synthetic.spec(base, nil, 3)
  local wide = false
  for i = 0, s.cspec.num_tables - 1 do
    wide = wide or tonumber(s.cspec.tables[i].id_space) > tonumber(s.cspec.tables[i].rows)
  end
  return { kind = "synthetic", spec = s }, wide and load_rows or nil, samples
end

-- Where the data comes from, for the config as resolved (data.train, train.steps set):
-- {train = loader options, eval = loader options or nil, eval_samples, ceiling = function()
-- (synthetic data: the hidden model's AUC on the held-out samples), steps = total or nil,
-- what = a line for people}.
-- What the loader takes a config's ids modulo, given its tables' rows: each table's rows, but 0
-- (raw ids) where managed collisions map them.
function M.load_rows(cfg, rows)
  local managed, load_rows = M.config.collisions(cfg), {}
  for i, r in ipairs(rows) do load_rows[i] = managed[i] and 0 or r end
  return load_rows
end

function M.data(cfg, rows)
  local spec, batch = cfg.data.train, cfg.train.batch_size
  local load_rows = M.load_rows(cfg, rows)
  if spec == "" then return nil, "no training data: give --data SPEC or data.train in the config" end
  local src, serr = require("uvmrec.data.loader").parse_source(spec)
  if not src then return nil, serr end
  local d = { eval_samples = cfg.eval.samples }
  local common = { batch_size = batch, depth = cfg.data.depth, shuffle_window = cfg.data.shuffle_window,
                   seed = cfg.data.seed, epochs = cfg.train.epochs, on_bad_line = cfg.data.on_bad_line,
                   pad_missing_fields = cfg.data.pad_missing_fields, drop_last = cfg.data.drop_last }
  if src.kind == "synthetic" then
    local sdata, srows, samples = synthetic_data(spec, src.name, rows, load_rows, "--data")
    if not sdata then return nil, srows end
    local s = sdata.spec
    local n = cfg.data.samples > 0 and cfg.data.samples or (samples and cfg.train.steps == 0 and samples)
              or cfg.train.steps * batch
    if n >= M.HELD_OUT then
      return nil, ("%s: an epoch of %.0f samples (%s); synthetic training data stops below sample 2^48, where "
        .. "the held-out samples start"):format(spec, n, cfg.data.samples > 0 and "data.samples"
        or ("train.steps %.0f x train.batch_size %d"):format(cfg.train.steps, batch))
    end
    -- Ids beyond a table's rows are taken modulo them by the loader, or kept raw for managed
    -- collisions.
    common.data, common.samples, common.rows = sdata, n, srows
    d.train = common
    d.steps = cfg.train.steps > 0 and cfg.train.steps
              or M.config.batches_per_epoch(cfg, n) * cfg.train.epochs
    if cfg.data.eval == "" and d.eval_samples > 0 then
      d.eval = M.held_out(common.data, d.eval_samples, cfg.eval.batch_size, common.rows)
      -- The ceiling from at most CEILING_SAMPLES of them: it is computed on the host.
      d.ceiling_samples = math.min(d.eval_samples, M.CEILING_SAMPLES)
      d.ceiling = function() return synthetic.hidden_auc(s, d.ceiling_samples, M.HELD_OUT) end
      d.what = ("%s: %s an epoch; evaluation on %s (from sample 2^48)"):format(spec,
        M.progress.things(n, "sample"), M.progress.things(d.eval_samples, "held-out sample"))
    end
  else
    common.data, common.rows = spec, load_rows
    d.train = common
    d.steps = cfg.train.steps > 0 and cfg.train.steps or nil
  end
  if cfg.data.eval ~= "" then
    -- checked as the training data is, before any step: a bad one would fail the run's first evaluation
    local esrc, eerr = require("uvmrec.data.loader").parse_source(cfg.data.eval)
    if not esrc then return nil, require("uvmrec.config").message(cfg, "data.eval", (eerr:gsub("^data: ", ""))) end
    if esrc.kind == "synthetic" then
      local edata, erows = synthetic_data(cfg.data.eval, esrc.name, rows, load_rows, "data.eval")
      if not edata then return nil, erows end
      d.eval = M.held_out(edata, d.eval_samples, cfg.eval.batch_size, erows)
    else
      d.eval = { data = cfg.data.eval, rows = load_rows, batch_size = cfg.eval.batch_size, depth = 2,
                 on_bad_line = cfg.data.on_bad_line, pad_missing_fields = cfg.data.pad_missing_fields }
    end
    d.what = ("%s; evaluation on %s"):format(spec, cfg.data.eval)
  end
  d.what = d.what or (src.kind == "synthetic" and ("%s: %s an epoch; no evaluation (eval.samples is 0)")
    :format(spec, M.progress.things(d.train.samples, "sample"))
    or (spec .. "; no held-out data (set data.eval or --eval-data): no evaluation"))
  return d
end

-- The checkpoint registry of a run: the model's and its optimizer's state, then what the
-- hooks (the trainer's position, ...) register, then the tables' row layout; saved and loaded
-- in one call.
local function registry(ctx, hooks)
  local model, opt = ctx.model, ctx.optimizer
  local reg = ck.registry()
  reg:register { name = "dense",
    state = function()
      local ts = {}
      for _, p in ipairs(model:parameters()) do
        if not p.fused then ts[p.name] = p.tensor end
      end
      return { tensors = ts }
    end,
    load = function()
      for _, c in ipairs { model.bottom, model.interaction, model.top } do c:sync_halves() end
    end }
  -- A sharded collection's rows are shards: they go to the checkpoint's .shards folder
  -- (uvmrec.dist.checkpoint, by the checkpoints hook); the file names the world that wrote them.
  if model.embeddings.component then
    reg:register(model.embeddings:component("embeddings"))
  else
    reg:register(M.shards_component(ctx))
  end
  reg:register { name = "optimizer", whole = { "step" },
    state = function()
      local ts = {}
      for i, p in ipairs(opt.params) do
        if opt.state1[i] then ts[p.name .. ".state1"] = opt.state1[i] end
        if opt.state2[i] then ts[p.name .. ".state2"] = opt.state2[i] end
      end
      return { tensors = ts, meta = { step = opt.step_count } }
    end,
    load = function(_, meta) opt.step_count = meta.step end }
  for _, h in ipairs(hooks) do
    if h.register then h:register(reg) end
  end
  if model.embeddings.component then
    hints.register(reg, model.embeddings) -- row layout and access counters (optional in a checkpoint)
  end
  return reg
end

-- The checkpoint component "shards" of a run whose tables are sharded (or of one process
-- loading such a checkpoint): no tensors, its meta the world that saved; loading it loads the
-- checkpoint's .shards folder (ctx.loading: the file being loaded) into ctx.model.embeddings,
-- whatever its world, plan or kind (uvmrec.dist.checkpoint reshards).
function M.shards_component(ctx)
  return { name = "shards",
    state = function()
      local comm = ctx.model.embeddings.comm
      return { meta = { world = comm and comm.world or 1, folder = "ckpt-<step>.shards" } }
    end,
    -- before any component loads: the folder's manifest (its checksum and fields), which must say
    -- the step and the world this file says (the folder of another save under this one's name)
    check = function(_, meta, step)
      local dir = ck.shards_path(ctx.loading)
      local m, err = require("uvmrec.dist.checkpoint").manifest(dir)
      if not m then return err end
      for _, k in ipairs { "step", "world" } do
        local here = k == "step" and step or meta.world
        if here ~= nil and m[k] ~= here then
          return ("%s/manifest.json has %s %s, but this file's %s is %s; expected one save's"):format(dir, k,
            tostring(m[k]), k == "step" and "uvmrec.step" or "component 'shards' world", tostring(here))
        end
      end
    end,
    load = function()
      local dir = ck.shards_path(ctx.loading)
      local ok, err = require("uvmrec.dist.checkpoint").load(dir, ctx.model.embeddings)
      if not ok then error(err, 0) end
    end }
end

-- Config paths a resumed run may change: how long it runs, what it logs, saves and evaluates,
-- and where the rows live (placements, hint policies, the cache, the prefetch pipeline: none
-- changes a value).  Everything else must be the checkpoint's.
-- A table's own settings are compared but for where its rows live (its dtype and managed
-- collisions change values).
local WHERE_ROWS_LIVE = { "embeddings.placement", "embeddings.tables.*.placement", "embeddings.bounds",
                          "embeddings.hints", "embeddings.tables.*.hints", "embeddings.cache",
                          "embeddings.tables.*.cache", "embeddings.sharding", "embeddings.tables.*.sharding",
                          "embeddings.tables.*.rank", "embeddings.vbe", "embeddings.far_rows",
                          "embeddings.far_behind", "embeddings.far_dma" }
M.RESUME_IGNORE = { "train.steps", "train.epochs", "train.checkpoint_every", "train.keep", "train.log_every",
                    "train.nonfinite", "train.print_every", "data.eval", "data.depth", "eval", "train.pipeline",
                    "train.drain", unpack(WHERE_ROWS_LIVE) }
-- Evaluating a checkpoint needs only the model's shape to match.
M.EVAL_IGNORE = { "name", "train", "data", "eval", "schedule", "optimizer", "embeddings.optimizer",
                  unpack(WHERE_ROWS_LIVE) }

-- The checkpoint file of --resume / --checkpoint: a file itself; a run directory's newest in
-- its checkpoints/ folder; a folder of ckpt-<step>.safetensors files, its newest.
function M.checkpoint_file(path)
  if type(path) ~= "string" or path == "" then return nil, "checkpoint: expected a run directory or a file" end
  if C.ur_path_kind(path) == 2 and C.ur_path_kind(path .. "/checkpoints") == 2 then
    return ck.latest(path .. "/checkpoints")
  end
  return ck.latest(path)
end

M.fill_defaults = M.config.fill_defaults

-- Loads a checkpoint (a file or a run directory) into ctx.registry, checking the config
-- against ctx.cfg but for the ignored paths.  Returns the registry's load result, or nil, message.
-- A checkpoint of a run over ranks (component "shards": its tables in ckpt-<step>.shards) loads
-- into one process's whole tables, and one of any world into any other: the sharding and the
-- world size are not part of the config a resume must match.  One process's checkpoint (whole
-- tables, component "embeddings") does not load into a run over ranks.
function M.load_checkpoint(ctx, path, ignore)
  local file, err = M.checkpoint_file(path)
  if not file then return nil, err end
  local f, ferr = ck.open(file)
  if not f then return nil, ferr end
  local names, nerr = f:meta_json("uvmrec.components", "list of strings",
                                  { default = {}, what = "the names of its components" })
  f:close()
  if not names then return nil, nerr end
  local has = {}
  for _, n in ipairs(names) do has[n] = true end
  local reg = ctx.registry
  local whole = reg.by_name.embeddings
  local swap = has.shards and whole and not reg.by_name.shards
  if reg.by_name.shards and has.embeddings and not has.shards then
    return nil, ("%s was saved by one process (its tables whole, component 'embeddings'): a run over %d ranks "
      .. "resumes from checkpoints of runs over ranks (ckpt-<step>.shards); resume it in one process")
      :format(file, ctx.comm and ctx.comm.world or 1)
  end
  if swap then
    -- the tables come from the .shards folder, not from the file's (absent) component
    whole.optional = true
    reg:register(M.shards_component(ctx))
  end
  ctx.loading = file
  local ok, r, lerr = pcall(reg.load, reg, file, { config = ctx.cfg, config_ignore = ignore,
                                                    config_fill = M.fill_defaults,
                                                    allow_nonfinite = ctx.allow_nonfinite })
  ctx.loading = nil
  if swap then
    reg:unregister("shards")
    whole.optional = nil
  end
  if not ok then return nil, ("checkpoint %s: %s"):format(file, tostring(r)) end
  return r, lerr
end

local function device_line(gpu, comm)
  local where = "on the CPU"
  if gpu then
    local d = ffi.new("int32_t[1]")
    local p = ur.device_props(comm and comm.device >= 0 and comm.device or (C.ur_device_get(d) == 0 and d[0] or 0))
    where = ("on the GPU (cuda:%d %s)"):format(p.ordinal, p.name)
  end
  if comm and comm.world > 1 then
    where = ("%s, %d ranks (rank 0 %s; host collectives %s, device %s)"):format(gpu and "on GPUs" or "on the CPU",
      comm.world, gpu and where:gsub("^on the ", "on its ") or "on the CPU", comm:engines().host,
      comm:engines().device)
  end
  return where
end

-- The job a run belongs to: its communicator when the environment says several ranks
-- (`uvmrec launch -n N`, mpirun), else nil (one process).
function M.job(opts)
  local dist = require "uvmrec.dist"
  if dist.environment().world <= 1 then return nil end
  return dist.init { cpu = opts and opts.cpu }
end

-- A writer of the run directory's files (made with its parents, metrics.jsonl opened to append,
-- before any work); a no-op without a directory; nil, "--out DIR: why" when it cannot be made.
local function run_dir(out)
  if not out then return { line = function() end, close = function() end } end
  local ok, err = require("uvmrec.lib").check(C.ur_dir_create(out))
  if not ok then return nil, ("--out %s: %s"):format(out, err) end
  local f, ferr = io.open(out .. "/metrics.jsonl", "a")
  if not f then return nil, ("--out %s: %s"):format(out, ferr) end
  return {
    line = function(t)
      f:write(json.encode(t), "\n")
      f:flush()
    end,
    close = function() f:close() end,
    config = function(cfg)
      local text = json.encode(cfg) .. "\n"
      assert(require("uvmrec.lib").check(C.ur_file_write(out .. "/config.json", text, #text)))
    end,
  }
end
M.run_dir = run_dir

-- The hint policy manager of the config's managed tables (uvmrec.hints), or nil without any.
function M.any_managed(cfg)
  local e = cfg.embeddings
  for i = 1, #e.rows do
    local own = e.tables["C" .. i] or {}
    if (own.placement or e.placement) == "managed" then return true end
  end
  return false
end

function M.hints(cfg, model)
  local e = cfg.embeddings
  if not M.any_managed(cfg) then return nil end
  local per = {}
  for name, t in pairs(e.tables) do
    if t.hints and (t.hints.policy or t.hints.allowance) then
      per[name] = { policy = t.hints.policy, options = t.hints.options, allowance = t.hints.allowance }
    end
  end
  return hints.manager(model.embeddings, { policy = e.hints.policy, options = e.hints.options,
                                           every = e.hints.every, allowance = e.hints.allowance,
                                           decay = e.hints.decay, tables = per, monitor = e.hints.monitor })
end

-- embeddings.far_rows: room in HBM for copies of the far rows each forward reads (every
-- collection of the model; docs/uvm.md), embeddings.far_behind: the copies written home behind
-- each step, and embeddings.far_dma: which moves go through the copy engines.  Returns the line
-- the run prints, or nil; nil, message when a room cannot be had.
function M.far_rows(cfg, model)
  local e = cfg.embeddings
  local n, behind, dma = e.far_rows, e.far_behind, e.far_dma
  if n == 0 and behind then
    return nil, "embeddings.far_behind is true with embeddings.far_rows 0: it writes copies home, and there is no "
      .. "room for any"
  end
  if n == 0 and dma ~= "none" then
    return nil, ("embeddings.far_dma is '%s' with embeddings.far_rows 0: it moves copies, and there is no room for "
      .. "any"):format(dma)
  end
  if not behind and (dma == "home" or dma == "both") then
    return nil, ("embeddings.far_dma is '%s' with embeddings.far_behind false: no copy is written home behind a "
      .. "step"):format(dma)
  end
  if not cfg.train.pipeline and (dma == "early" or dma == "both") then
    return nil, ("embeddings.far_dma is '%s' with train.pipeline false: no copy is made early"):format(dma)
  end
  if n == 0 or not model.embeddings then return nil end
  for _, tbe in ipairs(hints.tbes_of(model.embeddings)) do
    local ok, err = tbe:set_far_rows(n)
    if not ok then return nil, "embeddings.far_rows: " .. err end
    tbe:set_far_behind(behind)
    ok, err = tbe:set_far_dma(dma)
    if not ok then return nil, "embeddings.far_dma: " .. err end
  end
  if not ur.gpu() or model.placement ~= "device" then
    return ("far rows: room for %d copies set; a model on the CPU reads no row over a link, so none is made"):format(n)
  end
  local through = { none = "", home = ", the write home through the copy engines",
                    early = ", the early copies through the copy engines",
                    both = ", the early copies and the write home through the copy engines" }
  return ("far rows: room in HBM for %d copies a forward of the rows read over the host link%s%s"):format(
    n, behind and ", written home behind each step" or "", through[dma])
end

-- A resumed run saves as the run it resumes did (train.checkpoint_every, train.keep), unless this
-- run's config gives them (in its file or by --set).
function M.keep_saving(cfg, saved)
  local given = require("uvmrec.config").given
  for _, key in ipairs { "checkpoint_every", "keep" } do
    local v = type(saved) == "table" and type(saved.train) == "table" and saved.train[key]
    if type(v) == "number" and not given(cfg, "train." .. key) then cfg.train[key] = v end
  end
end

-- A resume may not end before its checkpoint: nil, or why not (the checkpoint's step, and the
-- step the run would end at, nil when the data decides).  Ending at it trains nothing.
function M.check_resume(ckpt_step, last_step, path)
  if last_step and last_step < ckpt_step then
    return ("--resume: %s is at step %d and this run ends at step %d (train.steps, --steps): a resumed run "
      .. "goes on from its checkpoint; give %d steps or more"):format(path, ckpt_step, last_step, ckpt_step)
  end
end

-- A run saving into ckdir from step `step` (0, or the step it resumes from): nil, or why not,
-- when ckdir holds a checkpoint past that step (another run's, or the later steps of the one it
-- resumes): saves would mix with those, --keep would remove this run's own as the older ones,
-- and a --resume of the folder would take theirs.
function M.check_out(ckdir, step, resumed)
  local saved = ck.list(ckdir) or {}
  local newest = saved[#saved]
  if newest and newest.step > step then
    return ("--out: %s holds a checkpoint at step %d (%s), past step %d where this run starts%s: its "
      .. "checkpoints would mix with those (--keep removing its own as the older ones, --resume taking "
      .. "theirs); give another --out, or resume the newest"):format(ckdir, newest.step, newest.path, step,
      resumed and (" (resumed from " .. resumed .. ")") or "")
  end
end

-- After the loop: nil, or why the run fails though it was not stopped.  Steps the data could not
-- give are a failure when train.steps asked for them; with train.steps 0 the data's end
-- (train.epochs of it) is the run's, but a run that trained no step at all always fails.
function M.check_ran(cfg, first, steps, samples)
  local asked = cfg.train.steps
  if asked > 0 and first > asked then return nil end -- a resume already at train.steps
  if steps < first then
    return ("the training data gave no batch: nothing was trained (%s)"):format(cfg.data.train)
  end
  if asked > 0 and steps < asked then
    return ("the training data ran out at step %d of train.steps %d (%s trained; train.epochs %d of %s): "
      .. "give more data or epochs (train.epochs), or train.steps 0 to train until the data ends"):format(steps,
      cfg.train.steps, M.progress.things(samples, "sample"), cfg.train.epochs, cfg.data.train)
  end
  return nil
end

-- eval.min_auc against the final evaluation: nil when it passes, else why the run fails; with
-- no evaluation there is nothing to check (the second value says so).
function M.check_min_auc(cfg, ev)
  local want = cfg.eval.min_auc
  if want <= 0 then return nil end
  if not ev then return nil, ("eval.min_auc %.4f is not checked: this run has no evaluation"):format(want) end
  if ev.auc == nil then
    return ("the final AUC is undefined (%s), so it does not reach eval.min_auc %.4f"):format(
      tostring(ev.auc_undefined), want)
  end
  if ev.auc ~= ev.auc or ev.auc < want then
    return ("the final AUC %.4f is below eval.min_auc %.4f"):format(ev.auc, want)
  end
  return nil
end

-- The source of a run's training batches: the loader's, copied to the GPU when the model is
-- there, or through the prefetch pipeline (train.pipeline; train.drain); at most `steps`.
local function train_source(cfg, model, loader, gpu, steps)
  if cfg.train.pipeline then
    return require("uvmrec.pipeline.Prefetch").new { collection = model.embeddings, source = loader,
                                                      steps = steps, drain = cfg.train.drain }
  end
  return M.source.loader(loader, { placement = gpu and "device" or nil, steps = steps })
end

-- Trains as the config says.  opts: config_path (to find model.file), out (run directory),
-- progress ("auto", "bar", "lines", "none"), print (a function of one line; default to
-- stdout), hooks (more hooks of uvmrec.train.loop.run's protocol, after the run's own: {after
-- = function(self, run, batch) ... end, register = function(self, registry) ... end}), setup
-- (function(ctx), after the model and registry exist and before a resume and the data:
-- register more components there), resume (a checkpoint file or run directory: its state is
-- loaded and training goes on from its step to train.steps), signals (false: leave SIGINT/SIGTERM
-- alone; by default, while the loop runs, either stops it at the next step boundary, with a
-- checkpoint when there is a run directory), cpu (true: no GPU), host_memory (bytes or
-- "100GiB": a run needing more host memory is refused before anything is allocated; default: the
-- cgroup's limit, if any; uvmrec.host_memory), allow_nonfinite (a --resume checkpoint may hold
-- NaN or infinity; refused by default).  Returns {steps, samples,
-- seconds, samples_per_s, loss, eval = {...} or nil, ceiling, checkpoint = the last saved,
-- resumed = {step, path} or nil, interrupted = {signal, name, step} or nil} or nil, message.
-- plan (a uvmrec.planner plan, applied to cfg by M.apply_plan; plan_path names it): the run
-- goes under the engine's HBM budget of the plan, on top of the HBM the process holds already
-- (an allocation past it fails, naming it; on the CPU the engine counts there only the managed
-- rows hinted to the GPU), restored after; a budget already set that leaves less refuses the run.
local run_plain
function M.run(cfg, opts)
  opts = opts or {}
  if not opts.plan then return run_plain(cfg, opts) end
  local planner = require "uvmrec.planner"
  -- the plan's HBM is this run's: on top of what the process holds already
  local budget, before, used0 = opts.plan.data.budget, ur.hbm_budget(), ur.memory().hbm_used
  if before > 0 and before - used0 < budget then
    return nil, ("--plan %s: the plan's HBM budget is %s and the engine's leaves %s (ur.set_hbm_budget)"):format(
      opts.plan_path or "given", planner.fmt_bytes(budget), planner.fmt_bytes(math.max(0, before - used0)))
  end
  ur.set_hbm_budget(used0 + budget)
  ur.reset_hbm_peak()
  local r = { pcall(run_plain, cfg, opts) }
  local peak = ur.memory().hbm_peak - used0
  ur.set_hbm_budget(before > 0 and before or nil)
  if not r[1] then error(r[2], 0) end
  local result = r[2]
  if result then
    local rank = require("uvmrec.dist").environment().rank or 0
    local R = opts.plan.data.ranks[rank + 1] or opts.plan.data.ranks[1]
    local predicted = R.hbm
    result.plan = { hbm_peak = peak, hbm_predicted = predicted, step_seconds = opts.plan.data.step_seconds }
    -- rank 0 alone speaks (run_plain's rule); every rank's result holds its own peak
    local say = rank ~= 0 and function() end or opts.print or function(l) io.stdout:write(l, "\n") io.stdout:flush() end
    say(("plan: HBM peak %s (ur.memory: device tensors, managed rows on the GPU, dense workspaces), "
      .. "predicted %s%s"):format(
      planner.fmt_bytes(peak), planner.fmt_bytes(predicted),
      (ur.gpu() and not opts.cpu) and "" or "; on the CPU only the managed rows count there"))
  end
  return unpack(r, 2, 4)
end

-- The placements of a plan's tables, counted: "3 cached, 23 device".
function M.plan_summary(p)
  local n, order = {}, {}
  for _, t in ipairs(p.tables) do
    if not n[t.placement] then order[#order + 1] = t.placement end
    n[t.placement] = (n[t.placement] or 0) + 1
  end
  local parts = {}
  for i, k in ipairs(order) do parts[i] = ("%d %s"):format(n[k], k) end
  return table.concat(parts, ", ")
end

-- A plan file (uvmrec plan --out) applied to training config cfg (Plan:apply): returns the
-- plan, or nil, message.
function M.apply_plan(cfg, path, opts)
  local plan, err = require("uvmrec.planner").load(path)
  if not plan then return nil, "--plan " .. err end
  local ok, aerr = plan:apply(cfg, path, opts)
  if not ok then return nil, aerr end
  return plan
end

-- The samples of an epoch of the training data (the loader options t), where they are known
-- before it is read: synthetic data's, and day files' from their sizes (a loader of one sample
-- a batch, opened and closed); nil for TSV files, known at their end, and where nothing asks.
-- Over ranks, day files whose epoch ends in a batch the ranks cannot share are refused here,
-- before anything is built (config.check_epoch, synthetic data's in check_world): nil, message.
-- The samples of day files t.data (a loader of one sample a batch, opened and closed).
local function day_samples(t)
  local probe, err = ur.data.loader { data = t.data, rows = t.rows, batch_size = 1, depth = 1, threads = 1,
                                      epochs = 1 }
  if not probe then return nil, err end
  local n = probe:stats().samples_per_epoch
  probe:close()
  return n
end

local function epoch_samples(cfg, t, world)
  if type(t.data) == "table" then return t.samples end
  if world <= 1 and not cfg.data.drop_last then return nil end
  if not t.data:match("^criteo%-bin:") then return nil end
  local n, err = day_samples(t)
  if not n then return nil, err end
  local bad = M.config.check_epoch(cfg, world, n, "data.train",
                                   "the day files in " .. t.data:match("^criteo%-bin:(.*)$"))
  if bad then return nil, bad end
  return n
end

-- Over ranks, held-out day files whose evaluation reaches a last batch the ranks cannot share
-- are refused before anything is built (2 ranks, 1025 samples in batches of 512 trained the
-- whole run and failed at its first evaluation): nil, or the message.
local function check_eval_days(cfg, t, world)
  if world <= 1 or not t or type(t.data) ~= "string" or not t.data:match("^criteo%-bin:") then return nil end
  local n, err = day_samples(t)
  if not n then return err end
  return M.config.check_eval(cfg, world, n, "the day files in " .. t.data:match("^criteo%-bin:(.*)$"))
end

function run_plain(cfg, opts)
  local say = opts.print or function(s) io.stdout:write(s, "\n") io.stdout:flush() end
  local def, where = M.model_def(cfg, opts.config_path)
  if not def then return nil, where end
  -- Several ranks: the tables sharded as the config says, the dense part data-parallel, each
  -- rank on its slice of every global batch; rank 0 alone speaks and writes the run directory.
  local wanted = require("uvmrec.dist").environment().world
  local werr = M.config.check_world(cfg, wanted)
  if werr then return nil, werr end
  local comm, cerr = M.job(opts)
  if wanted > 1 and not comm then return nil, cerr end
  local mismatch = comm and require("uvmrec.dist").config_mismatch(comm, cfg)
  if mismatch then return nil, mismatch end
  local rank, world = comm and comm.rank or 0, comm and comm.world or 1
  if rank ~= 0 then say = function() end end
  local out = rank == 0 and opts.out or nil
  local rows = M.config.table_rows(cfg)
  local data, derr = M.data(cfg, rows)
  if not data then return nil, derr end
  local epoch, eerr = epoch_samples(cfg, data.train, world)
  if eerr then return nil, eerr end
  local everr = check_eval_days(cfg, data.eval, world)
  if everr then return nil, everr end
  if comm then
    for _, d in ipairs { data.train, data.eval or false } do
      -- a global batch the ranks cannot share fails where it comes (TSV files' last, known only
      -- there), before any rank trains or scores a slice of it
      if d then d.slice_rank, d.slice_world, d.even_slices = rank, world, true end
    end
  end
  -- host memory counted before anything is allocated: a run that cannot fit is refused here
  local host_memory = require "uvmrec.host_memory"
  local fits, herr = host_memory.check(host_memory.count(cfg, data.train, ur.gpu() and not opts.cpu),
                                       opts.host_memory)
  if not fits then return nil, herr end
  -- The migration monitor counts only managed memory allocated after it starts: before the
  -- model, when tables are managed (hint policies report what moved; nil without CUPTI).
  if ur.gpu() and not opts.cpu and M.any_managed(cfg) then ur.monitor.start() end
  local model, merr = def.build(cfg, { cpu = opts.cpu, sharding = comm and M.config.sharding(cfg) or nil })
  if not model then return nil, merr end
  local gpu = ur.gpu() and not opts.cpu
  local ctx = { cfg = cfg, model = model, optimizer = M.optimizer(cfg, model), step = 0, samples = 0, first = 1,
                comm = comm, allow_nonfinite = opts.allow_nonfinite }
  local trainer = M.hooks.trainer(ctx)
  local collisions = model.collisions and M.hooks.collisions { collisions = model.collisions,
                                                               every = cfg.train.log_every }
  local own = { trainer, collisions or nil }
  for _, h in ipairs(opts.hooks or {}) do own[#own + 1] = h end
  ctx.registry = registry(ctx, own)
  if opts.setup then opts.setup(ctx) end
  -- over ranks every rank saves its shards into the run directory's checkpoints/ (a folder
  -- every rank sees: one host, or a shared file system), rank 0 alone the rest
  local ckdir = (comm and opts.out or out) and (comm and opts.out or out) .. "/checkpoints"
  local resumed
  if opts.resume then
    local t0 = C.ur_clock_seconds()
    local r, rerr = M.load_checkpoint(ctx, opts.resume, M.RESUME_IGNORE)
    if not r then return nil, "--resume: " .. rerr end
    local behind = M.check_resume(r.step, data.steps, r.path)
    if behind then return nil, behind end
    if ckdir then M.keep_saving(cfg, r.config) end
    resumed = { step = r.step, path = r.path, seconds = C.ur_clock_seconds() - t0 }
  end
  local every = cfg.train.checkpoint_every
  -- train.keep alone is no mistake: it rotates the checkpoints a signal saves, and a resumed run's
  for _, key in ipairs { "checkpoint_every", "keep" } do
    if cfg.train[key] > 0 and not ckdir then
      return nil, ("train.%s is %d: checkpoints need a run directory (--out RUNDIR)"):format(key, cfg.train[key])
    end
  end
  local mixed = ckdir and M.check_out(ckdir, ctx.step, resumed and resumed.path)
  if mixed then return nil, mixed end
  if ckdir and every > 0 then
    -- a folder the saves cannot write into fails the run now, not after `every` steps of training
    local check = require("uvmrec.lib").check
    local ok, perr = check(C.ur_dir_create(ckdir))
    local probe = ffi.new("char[?]", #ckdir + 16, ckdir .. "/.probe-XXXXXX")
    if ok then ok, perr = check(C.ur_dir_temp(probe)) end
    if ok then os.remove(ffi.string(probe)) end
    if not ok then
      return nil, ("train.checkpoint_every is %d: checkpoints cannot be saved into %s (%s)"):format(every, ckdir, perr)
    end
  end
  ctx.hints = M.hints(cfg, model)
  local far, ferr = M.far_rows(cfg, model)
  if ferr then return nil, ferr end

  local log, lerr = run_dir(out)
  if not log then return nil, lerr end
  if log.config then log.config(cfg) end
  say(("uvmrec train: %s %s"):format(cfg.name or "model", device_line(gpu, comm)))
  say("model: " .. tostring(model) .. (comm and " (the rows and bytes of rank 0's shards)" or ""))
  if comm then
    say("sharding: " .. model.embeddings:extra_repr():gsub("^%((.*)%)$", "%1")
        .. (model.embeddings.vbe and "; VBE: each rank sends each feature's distinct bags" or ""))
  end
  say("data: " .. data.what)
  if cfg.data.drop_last then
    local tail = epoch and epoch % cfg.train.batch_size
    if tail ~= 0 then
      say(tail and ("data: each epoch's last batch, of %s, is dropped (data.drop_last)"):format(
                     M.progress.things(tail, "sample"))
          or "data: each epoch's last batch, when short, is dropped (data.drop_last)")
    end
  end
  if far then say(far) end
  if opts.plan then
    local planner, p = require "uvmrec.planner", opts.plan.data
    say(("plan: %s, %s (%s), predicted %s a step (%.0f samples/s), HBM %s of %s (%s)"):format(
      opts.plan_path or "given", M.progress.things(#p.tables, "table"), M.plan_summary(p),
      planner.fmt_time(p.step_seconds),
      p.samples_per_second, planner.fmt_bytes(p.ranks[1].hbm), planner.fmt_bytes(p.budget),
      gpu and "the engine's HBM budget" or "the engine's HBM budget: on the CPU managed rows on the GPU only"))
    log.line { event = "plan", path = opts.plan_path, step_seconds = p.step_seconds, hbm = p.ranks[1].hbm,
               budget = p.budget, samples_per_second = p.samples_per_second }
  end
  if resumed then
    say(("resumed from %s at step %d (%s trained; loaded in %.1f s)"):format(resumed.path, resumed.step,
      M.progress.things(ctx.samples, "sample"), resumed.seconds))
  end
  log.line { event = "start", version = ur.version(), gpu = gpu, model = model:stats(), data = cfg.data.train,
             ranks = world,
             resumed_from = resumed and resumed.path, step = resumed and resumed.step,
             load_seconds = resumed and resumed.seconds }

  local topts = {}
  for k, v in pairs(data.train) do topts[k] = v end
  topts.position = ctx.position
  -- over ranks TSV files are counted as the loader opens (one parsing pass), so an epoch whose
  -- last batch the ranks cannot share is refused here, before any step (it failed at that
  -- batch, after an epoch of training); drop_last drops that batch, and needs no count
  local tsv = comm and not cfg.data.drop_last and type(topts.data) == "string"
              and topts.data:match("^criteo%-tsv:(.*)$")
  topts.count_samples = tsv and true or nil
  -- synthetic data in order is drawn on the GPU where it is used (uvmrec.data.generator)
  -- (it draws ids as the spec does: ids from a wide id space that tables take modulo their
  -- rows come through the loader, which reduces them)
  local reduced = false
  for _, r in ipairs(topts.rows or {}) do reduced = reduced or r > 0 end
  if gpu and type(topts.data) == "table" and (topts.shuffle_window or 0) == 0 and not reduced then
    topts.placement = "device"
  end
  local loader, err = ur.data.loader(topts)
  if not loader then return nil, err end
  local counted = {} -- TSV files' counts by their spec: each is one parsing pass, made once a run
  if tsv then
    local n = loader:stats().samples_per_epoch
    counted[topts.data] = n
    local bad = M.config.check_epoch(cfg, world, n, "data.train", "the TSV files " .. tsv)
    if bad then
      loader:close()
      return nil, bad
    end
  end
  -- held-out files open once before any step, as each evaluation opens them: a missing one
  -- fails the run now, not after its training; over ranks held-out TSV files are counted here
  -- (each evaluation's loader does not count them again, nor this one the training files'
  -- count: data.eval naming data.train's files made a second pass over them), and a last batch
  -- the ranks cannot share is refused as held-out day files are
  if data.eval and type(data.eval.data) == "string" then
    local eval_tsv = comm and data.eval.data:match("^criteo%-tsv:(.*)$")
    local po = {}
    for k, v in pairs(data.eval) do po[k] = v end
    po.count_samples = eval_tsv and not counted[po.data] or nil
    local probe, perr = ur.data.loader(po)
    if not probe then
      loader:close()
      return nil, "data.eval " .. perr
    end
    local n = eval_tsv and (counted[po.data] or probe:stats().samples_per_epoch)
    local bad = n and M.config.check_eval(cfg, world, n, "the TSV files " .. eval_tsv)
    probe:close()
    if bad then
      loader:close()
      return nil, bad
    end
  end
  local last = cfg.train.steps > 0 and cfg.train.steps or nil
  local source = train_source(cfg, model, loader, gpu, last and last - ctx.step)
  local progress = M.progress.new { total = data.steps, mode = rank ~= 0 and "none" or opts.progress,
                                    print_every = cfg.train.print_every, samples = ctx.samples }

  -- The run's hooks, in the order they act after a step: the loss read and logged, the
  -- trainer's position, hint policies, evaluations, checkpoints, the caller's, and last the
  -- signals' stop (after every other hook of the step, as a step boundary).
  local sched = M.config.schedule(cfg)
  local logger = M.hooks.log { progress = progress, line = log.line, every = cfg.train.log_every,
                               optimizer = ctx.optimizer,
                               tables = model.embeddings and model.embeddings.lr and model.embeddings or nil }
  local evaluation = data.eval and M.hooks.evaluation {
    every = cfg.eval.every, last = data.steps, model = model, data = data.eval, metrics = cfg.eval.metrics,
    source = M.source.loader(nil, { placement = gpu and "device" or nil }), samples = cfg.eval.samples,
    batch_size = cfg.eval.batch_size, progress = progress, line = log.line, comm = comm }
  local checkpoints = ckdir and M.hooks.checkpoints {
    every = every, registry = ctx.registry, dir = ckdir, config = cfg, progress = progress, line = log.line,
    keep = cfg.train.keep > 0 and cfg.train.keep or nil,
    shards = comm and { collection = model.embeddings, comm = comm } or nil }
  -- train.nonfinite: the guard's flags are read where the loss is, just before the log reads it
  local guard = cfg.train.nonfinite ~= "off" and M.guard.new(model, ctx.optimizer, cfg.train.nonfinite) or nil
  local hooks = { sched and ur.optim.Schedule(sched, { ctx.optimizer, model.embeddings }) or nil }
  hooks[#hooks + 1] = guard and guard:hook {
    every = cfg.train.log_every, line = log.line, say = say, skipped = ctx.skipped,
    saves = checkpoints and every > 0 and function(step) return step % every == 0 end } or nil
  if collisions then -- before the log hook, which shows its note with the loss
    collisions:attach { progress = progress, line = log.line }
    hooks[#hooks + 1] = collisions
  end
  hooks[#hooks + 1] = logger
  hooks[#hooks + 1] = trainer
  hooks[#hooks + 1] = ctx.hints and M.hooks.hints(ctx.hints, log.line, say) or nil
  hooks[#hooks + 1] = evaluation or nil
  hooks[#hooks + 1] = checkpoints or nil
  for _, h in ipairs(opts.hooks or {}) do hooks[#hooks + 1] = h end
  -- Over ranks the signals hook stops every rank at the same step boundary (the ranks agree on
  -- it: uvmrec.dist.interrupted), where the checkpoints hook saves one consistent checkpoint.
  hooks[#hooks + 1] = M.hooks.signals(opts.signals ~= false)

  local first, samples0 = ctx.first, ctx.samples
  local ok, run = pcall(M.loop.run, model, ctx.optimizer, source, hooks, { world = world })
  progress:finish()
  -- the batches whose far rows the pipeline copied early (docs/uvm.md, "Early copies")
  local early = source.stats and source:stats().far_early or 0
  if source.free then source:free() end
  if guard then guard:detach() end
  if not ok then
    if evaluation then evaluation:free() end
    loader:close()
    -- where it got to: the steps done and their samples, as a run that ran out of data says
    log.line { event = "failed", step = ctx.step, samples = ctx.samples, error = tostring(run) }
    log.close()
    return nil, tostring(run)
  end
  local steps, samples, interrupted = run.step, run.samples, run.interrupted
  local saved = checkpoints and checkpoints.saved
  local short = not interrupted and M.check_ran(cfg, first, steps, samples)
  if short then
    if evaluation then evaluation:free() end
    loader:close()
    log.line { event = "failed", step = steps, samples = samples, error = short }
    log.close()
    return nil, short
  end
  local seconds = progress:elapsed()
  local result = { steps = steps, samples = samples, seconds = seconds, loss = logger.loss,
                   samples_per_s = (samples - samples0) / math.max(seconds, 1e-9),
                   evals = evaluation and evaluation.evals or {},
                   resumed = resumed, checkpoint = saved and saved.path, interrupted = interrupted,
                   skipped = guard and run.skipped or nil }
  if resumed and steps < first then
    say(("nothing to train: the checkpoint is at step %d, where train.steps ends"):format(steps))
  elseif resumed then
    local which = first == steps and ("step %d"):format(steps) or ("steps %d to %d"):format(first, steps)
    say(("trained %s, %s in %.1f s: %s samples/s (%s in all)"):format(which,
      M.progress.things(samples - samples0, "sample"), seconds, M.progress.count(result.samples_per_s),
      M.progress.things(samples, "sample")))
  else
    say(("trained %s, %s in %.1f s: %s samples/s"):format(M.progress.things(steps, "step"),
      M.progress.things(samples, "sample"), seconds, M.progress.count(result.samples_per_s)))
  end
  if result.skipped and result.skipped > 0 then
    say(("train.nonfinite: skip: %s skipped (NaN or infinity in the loss or a dense gradient), "
         .. "neither tables nor dense parameters updated by them"):format(M.progress.things(result.skipped, "step")))
  end
  if ctx.hints then
    ctx.hints:read_monitor()
    say(ctx.hints:summary())
    result.hints = ctx.hints.last
    ctx.hints:free()
  end
  if far then
    -- the room against what the last forward read: how to size embeddings.far_rows
    local room, read, copied, unplaced = cfg.embeddings.far_rows, 0, 0, 0
    local dma = { home = 0, early = 0 } -- rows the host threads moved (embeddings.far_dma)
    assert(ur.sync()) -- their count is exact once the host calls are done
    for _, tbe in ipairs(hints.tbes_of(model.embeddings)) do
      local n, u = assert(tbe:far_taken())
      read, copied, unplaced = read + n, copied + math.min(n, room), unplaced + u
      local d = tbe:far_dma_stats()
      dma.home, dma.early = dma.home + d.home.rows, dma.early + d.early.rows
    end
    result.far_rows = { room = room, read = read, copied = copied, unplaced = unplaced, early = early, dma = dma }
    if read > 0 then
      -- a full map left rows uncounted: the count is then a lower bound, and says so
      local full = unplaced > 0 and (" (%d lookups found the copies' map full where they looked: "
        .. "more rows than counted)"):format(unplaced) or ""
      local ahead = early > 0 and ("; %d batches' far rows copied early (train.pipeline)"):format(early) or ""
      local engines = cfg.embeddings.far_dma ~= "none" and ("; the host threads moved %d rows home and %d early "
        .. "(embeddings.far_dma)"):format(dma.home, dma.early) or ""
      say(("far rows: the last forward read %s%d distinct far rows, copied %d (room %d a collection)%s%s%s"):format(
        unplaced > 0 and "at least " or "", read, copied, room, full, ahead, engines))
    end
  end
  if collisions then
    say(collisions:summary())
    result.collisions = collisions.last
  end
  local cs = model.embeddings.cache_stats and model.embeddings:cache_stats()
  if cs then
    result.cache = cs
    say(("cache: %.1f%% of %s distinct rows hit, %s misses, %s conflict misses, %s evictions; "
         .. "%s in, %s out over the host link"):format(100 * cs.hit_rate, M.progress.count(cs.unique),
      M.progress.count(cs.misses), M.progress.count(cs.conflicts), M.progress.count(cs.evictions),
      M.progress.bytes(cs.bytes_in), M.progress.bytes(cs.bytes_out)))
    log.line { event = "cache", hits = cs.hits, unique = cs.unique, misses = cs.misses, conflicts = cs.conflicts,
               evictions = cs.evictions, writebacks = cs.writebacks, bytes_in = cs.bytes_in,
               bytes_out = cs.bytes_out, seconds = cs.seconds }
  end
  loader:close()
  if interrupted then
    local what
    if saved and saved.step == steps then
      what = "checkpoint " .. saved.path .. "; go on with --resume " .. opts.out
    elseif steps < first then
      what = "no step was trained, so nothing was saved"
    else
      what = "no run directory (--out), so nothing was saved"
    end
    say(("stopped by %s at step %d: %s"):format(interrupted.name, steps, what))
    log.line { event = "interrupted", step = steps, signal = interrupted.signal, checkpoint = saved and saved.path }
    log.close()
    if evaluation then evaluation:free() end
    return result
  end
  if evaluation then
    local eok, r = true, result.evals[#result.evals]
    if not (r and r.step == steps) then eok, r = pcall(evaluation.evaluate, evaluation, steps) end
    evaluation:free()
    if not eok then
      log.close()
      return nil, tostring(r)
    end
    result.eval = r
    if data.ceiling and rank == 0 then result.ceiling = data.ceiling() end
    local ceiling = result.ceiling and (" (the synthetic data's hidden-model ceiling: %.4f)"):format(result.ceiling)
                    or ""
    if r.auc then -- eval.metrics may leave it out
      say(("final AUC %.4f%s"):format(r.auc, ceiling))
    elseif r.auc_undefined then
      say(("final AUC undefined: %s%s"):format(r.auc_undefined, ceiling))
    end
  end
  log.line { event = "final", steps = steps, samples = samples, seconds = seconds,
             samples_per_s = result.samples_per_s, loss = logger.loss,
             auc = result.eval and (result.eval.auc or result.eval.auc_undefined and json.null),
             auc_undefined = result.eval and result.eval.auc_undefined, skipped = result.skipped,
             ceiling_auc = result.ceiling }
  log.close()
  if out then
    say("run directory: " .. out .. " (config.json, metrics.jsonl" .. (saved and ", checkpoints/)" or ")"))
  end
  local low, unchecked = M.check_min_auc(cfg, result.eval)
  if unchecked then say(unchecked) end
  -- Every rank fails alike here (the AUC is over all of them); the first to exit aborts the job
  -- (MPI_Abort), so the others wait until rank 0 has written its final event and said where.
  if low and comm and comm.world > 1 then comm:barrier() end
  if low then return nil, low, result end
  return result
end

-- Evaluates the model of a config on held-out data, as run() does at its end: opts.data
-- (synthetic: eval.samples held-out samples, from sample 2^48; files: these files), out,
-- config_path, setup (function(ctx), as run's), checkpoint (a file or run directory: its
-- weights are loaded; the model's config must be the checkpoint's, M.EVAL_IGNORE aside),
-- print, cpu.  Returns {eval = {...}, ceiling, step (the checkpoint's, or 0)} or nil, message.
function M.eval(cfg, opts)
  opts = opts or {}
  local world = require("uvmrec.dist").environment().world
  if world > 1 then
    return nil, ("uvmrec eval runs as one process, not %d ranks: evaluate without uvmrec launch or mpirun")
      :format(world)
  end
  local say = opts.print or function(s) io.stdout:write(s, "\n") io.stdout:flush() end
  -- set as `uvmrec train`'s flags are (lib.flag_set): a message about them names --data
  local sets = {}
  local function data_set(path, v) sets[#sets + 1] = require("uvmrec.lib").flag_set("--data", path, v) end
  if opts.data and not opts.data:match("^synthetic:") then
    data_set("data.eval", opts.data)
    if cfg.data.train == "" then data_set("data.train", opts.data) end
  elseif opts.data then
    data_set("data.train", opts.data)
    data_set("data.eval", "")
  end
  for _, s in ipairs(sets) do
    local ok, serr = require("uvmrec.config").set(cfg, M.config.schema, s[1], s.flag)
    if not ok then return nil, serr end
  end
  local def, where = M.model_def(cfg, opts.config_path)
  if not def then return nil, where end
  local data, derr = M.data(cfg, M.config.table_rows(cfg))
  if not data then return nil, derr end
  if not data.eval then
    -- synthetic data holds out eval.samples of its own: none when that is 0
    local none = cfg.data.train:match("^synthetic:") and cfg.eval.samples == 0
    return nil, "no held-out data to evaluate on: " .. (none and "eval.samples is 0 (synthetic data holds out that "
      .. "many samples); give eval.samples, or --data files" or "give --data SPEC")
  end
  local model, merr = def.build(cfg, { cpu = opts.cpu })
  if not model then return nil, merr end
  local gpu = ur.gpu() and not opts.cpu
  local ctx = { cfg = cfg, model = model, optimizer = M.optimizer(cfg, model), step = 0, samples = 0, first = 1,
                allow_nonfinite = opts.allow_nonfinite }
  -- a model with managed collisions looks up through the checkpoint's maps
  ctx.registry = registry(ctx, { M.hooks.trainer(ctx), model.collisions and M.hooks.collisions {
    collisions = model.collisions } or nil })
  if opts.setup then opts.setup(ctx) end
  local loaded
  if opts.checkpoint then
    -- The dense optimizer's state plays no part in evaluating (nor does its config).
    ctx.registry:unregister("optimizer")
    local r, cerr = M.load_checkpoint(ctx, opts.checkpoint, M.EVAL_IGNORE)
    if not r then return nil, "--checkpoint: " .. cerr end
    loaded = r
  end
  local log, lerr = run_dir(opts.out)
  if not log then return nil, lerr end
  say(("uvmrec eval: %s %s"):format(cfg.name or "model", device_line(gpu)))
  say("model: " .. tostring(model))
  if loaded then say(("weights: %s (step %d)"):format(loaded.path, loaded.step)) end
  say("data: " .. data.what)
  local loader, err = ur.data.loader(data.eval)
  if not loader then return nil, err end
  local source = M.source.loader(loader, { placement = gpu and "device" or nil })
  local r, eerr = M.evaluate.run(model, source, { metrics = cfg.eval.metrics, samples = cfg.eval.samples,
                                                  batch_size = cfg.eval.batch_size })
  source:free()
  loader:close()
  if not r then return nil, eerr end
  local result = { eval = r, ceiling = data.ceiling and data.ceiling(), step = ctx.step }
  say(("eval: %s  (%s, %.1f s)"):format(M.evaluate.format(r, cfg.eval.metrics), M.evaluate.count(r),
                                        r.seconds))
  if result.ceiling then
    say(("the synthetic data's hidden-model ceiling: %.4f"):format(result.ceiling))
  end
  log.line(M.evaluate.log_line(r, { event = "eval", step = ctx.step, ceiling_auc = result.ceiling,
                                    checkpoint = loaded and loaded.path }))
  log.close()
  return result
end

return M
