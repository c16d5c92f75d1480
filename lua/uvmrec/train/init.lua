-- uvmrec.train: training a model from a config, as `uvmrec train` does.  The pieces, each
-- usable alone: config (schema, loading, --set), loop (the loop itself: read it to write your
-- own), feed (batches onto the GPU), progress (bar or lines), evaluate (held-out metrics).
--
--   local train = require "uvmrec.train"
--   local cfg = assert(train.config.load("models/dlrm_tiny.yaml", {"train.steps=100"}))
--   local result = assert(train.run(cfg, {out = "runs/a"}))   -- result.eval.auc, ...
--
-- run() builds the model (models/<model.file>), its optimizer, the loaders, registers every
-- component's state in a checkpoint registry (ctx.registry), resumes from a checkpoint when
-- asked, trains with progress and evaluations, and writes the run directory: config.json (the
-- resolved config), metrics.jsonl (one JSON object a line) and checkpoints/ckpt-<step>.safetensors
-- (every train.checkpoint_every steps, at the end, and on SIGINT/SIGTERM).
--
-- The registry (uvmrec.checkpoint) is the one place a run's state goes through: a component
-- is {name, state() -> {tensors =, meta =}, load(tensors, meta)}; its tensors are saved as
-- "<name>.<key>", its meta as JSON.  Components of other subsystems register through
-- opts.setup(ctx) (ctx.registry:register{...}), before a resume loads them.
local ur = require "uvmrec"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local synthetic = require "uvmrec.data.synthetic"
local hints = require "uvmrec.hints"

local M = {
  config = require "uvmrec.train.config",
  loop = require "uvmrec.train.loop",
  feed = require "uvmrec.train.feed",
  progress = require "uvmrec.train.progress",
  evaluate = require "uvmrec.train.evaluate",
}
local C = ur.C

M.CEILING_SAMPLES = 262144

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

-- The dense optimizer of the config over the model's parameters (zeroing the gradients).
function M.optimizer(cfg, model)
  local o = cfg.optimizer
  local ctor = ({ sgd = ur.optim.SGD, adagrad = ur.optim.Adagrad, adam = ur.optim.Adam,
                  adamw = ur.optim.AdamW })[o.name]
  return ctor(model:parameters(), {
    lr = o.lr, momentum = o.name == "sgd" and o.momentum or nil, weight_decay = o.weight_decay,
    eps = o.eps, betas = (o.beta1 or o.beta2) and { o.beta1 or 0.9, o.beta2 or 0.999 } or nil,
    zero_grad = true,
  })
end

-- Where the data comes from, for the config as resolved (data.train, train.steps set):
-- {train = loader options, eval = loader options or nil, eval_samples, ceiling = function()
-- (synthetic data: the hidden model's AUC on the held-out samples), steps = total or nil,
-- what = a line for people}.
function M.data(cfg, rows)
  local spec, batch = cfg.data.train, cfg.train.batch_size
  -- What the loader takes ids modulo: each table's rows, but 0 (raw ids) where managed
  -- collisions map them.
  local managed, load_rows = M.config.collisions(cfg), {}
  for i, r in ipairs(rows) do load_rows[i] = managed[i] and 0 or r end
  if spec == "" then return nil, "no training data: give --data SPEC or data.train in the config" end
  local ok, src = pcall(require("uvmrec.data.loader").source, spec)
  if not ok then return nil, (tostring(src):gsub("^[^\n]-:%d+: ", "")) end
  local d = { eval_samples = cfg.eval.samples }
  local common = { batch_size = batch, depth = cfg.data.depth, shuffle_window = cfg.data.shuffle_window,
                   seed = cfg.data.seed, epochs = cfg.train.epochs }
  if src.kind == "synthetic" then
    local base, samples = synthetic.resolve(src.name)
    if not base then return nil, "--data " .. spec .. ": " .. tostring(samples) end
    if #base.tables ~= #rows then
      return nil, ("--data %s: %d sparse features, but the model has %d tables"):format(spec, #base.tables, #rows)
    end
    -- Ids the capped tables cannot hold are not drawn: the hidden model lives on the capped rows
    -- (unless the spec draws from an id space of its own: id_space, id_space_factor).
    for i, t in ipairs(base.tables) do t.rows = math.min(t.rows, rows[i]) end
    local s = synthetic.spec(base, nil, 2)
    local n = cfg.data.samples > 0 and cfg.data.samples or (samples and cfg.train.steps == 0 and samples)
              or cfg.train.steps * batch
    common.data, common.samples = { kind = "synthetic", spec = s }, n
    -- Ids beyond a table's rows are taken modulo them by the loader, or kept raw for managed
    -- collisions.
    local wide = false
    for i = 0, s.cspec.num_tables - 1 do
      wide = wide or tonumber(s.cspec.tables[i].id_space) > tonumber(s.cspec.tables[i].rows)
    end
    if wide and #rows ~= 26 then
      return nil, ("--data %s: an id space larger than the tables needs the loader's 26 tables (this "
                   .. "model has %d)"):format(spec, #rows)
    end
    common.rows = wide and load_rows or nil
    d.train = common
    d.steps = cfg.train.steps > 0 and cfg.train.steps or math.ceil(n / batch) * cfg.train.epochs
    if cfg.data.eval == "" and d.eval_samples > 0 then
      d.eval = { data = common.data, samples = n + d.eval_samples, position = { epoch = 0, sample = n },
                 batch_size = cfg.eval.batch_size, depth = 2, rows = common.rows }
      -- The ceiling from at most CEILING_SAMPLES of them: it is computed on the host.
      d.ceiling_samples = math.min(d.eval_samples, M.CEILING_SAMPLES)
      d.ceiling = function() return synthetic.hidden_auc(s, d.ceiling_samples, n) end
      d.what = ("%s: %d samples an epoch; evaluation on the %d samples after them"):format(spec, n, d.eval_samples)
    end
  else
    common.data, common.rows = spec, load_rows
    d.train = common
    d.steps = cfg.train.steps > 0 and cfg.train.steps or nil
  end
  if cfg.data.eval ~= "" then
    local synth = cfg.data.eval:match("^synthetic:")
    d.eval = { data = cfg.data.eval, rows = not synth and load_rows or nil, batch_size = cfg.eval.batch_size,
               depth = 2, samples = synth and d.eval_samples or nil }
    d.what = ("%s; evaluation on %s"):format(spec, cfg.data.eval)
  end
  d.what = d.what or (src.kind == "synthetic" and ("%s: %d samples an epoch; no evaluation (eval.samples is 0)")
    :format(spec, d.train.samples) or (spec .. "; no held-out data (set data.eval or --eval-data): no evaluation"))
  return d
end

-- The checkpoint registry of a run: each component's state, to save and load in one call.
local function register(ctx)
  local model, opt, tbe = ctx.model, ctx.optimizer, ctx.model.embeddings.tbe
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
  reg:register { name = "embeddings",
    state = function()
      local ts = {}
      for _, name in ipairs(tbe.table_names) do
        ts[name] = tbe:table(name)
        for k, s in pairs(tbe:state(name)) do ts[name .. "." .. k] = s end
      end
      return { tensors = ts, meta = { step = tbe:step() } }
    end,
    load = function(_, meta)
      tbe:set_step(meta.step)
      -- The rows came into the tables' own storage (state() flushed the cache before): copies
      -- a cache holds are stale.
      if tbe.cache then assert(tbe.cache:invalidate()) end
    end }
  reg:register { name = "optimizer",
    state = function()
      local ts = {}
      for i, p in ipairs(opt.params) do
        if opt.state1[i] then ts[p.name .. ".state1"] = opt.state1[i] end
        if opt.state2[i] then ts[p.name .. ".state2"] = opt.state2[i] end
      end
      return { tensors = ts, meta = { step = opt.step_count } }
    end,
    load = function(_, meta) opt.step_count = meta.step end }
  reg:register { name = "trainer",
    state = function()
      local pos = ctx.trained or ctx.loader and ctx.loader:position() or ctx.position
      return { meta = { step = ctx.step, samples = ctx.samples, position = pos } }
    end,
    load = function(_, meta)
      ctx.step, ctx.first, ctx.samples, ctx.position = meta.step, meta.step + 1, meta.samples, meta.position
    end }
  hints.register(reg, tbe) -- row layout and access counters (optional in a checkpoint)
  -- managed collisions' maps and counts
  if model.collisions then reg:register(model.collisions:checkpoint_component("collisions")) end
  return reg
end

-- Config paths a resumed run may change: how long it runs, what it logs, saves and evaluates,
-- and where the rows live (placements, hint policies, the cache, the prefetch pipeline: none
-- changes a value).  Everything else must be the checkpoint's.
M.RESUME_IGNORE = { "train.steps", "train.checkpoint_every", "train.keep", "train.log_every",
                    "train.print_every", "data.eval", "data.depth", "eval", "embeddings.placement",
                    "embeddings.tables", "embeddings.bounds", "embeddings.hints", "embeddings.cache",
                    "train.pipeline" }
-- Evaluating a checkpoint needs only the model's shape to match.
M.EVAL_IGNORE = { "name", "train", "data", "eval", "schedule", "optimizer", "embeddings.optimizer",
                  "embeddings.placement", "embeddings.tables", "embeddings.bounds", "embeddings.hints",
                  "embeddings.cache" }

-- The checkpoint file of --resume / --checkpoint: a file itself; a run directory's newest in
-- its checkpoints/ folder; a folder of ckpt-<step>.safetensors files, its newest.
function M.checkpoint_file(path)
  if type(path) ~= "string" or path == "" then return nil, "checkpoint: expected a run directory or a file" end
  if C.ur_path_kind(path) == 2 and C.ur_path_kind(path .. "/checkpoints") == 2 then
    return ck.latest(path .. "/checkpoints")
  end
  return ck.latest(path)
end

-- A checkpoint's config with the keys it lacks (added to the schema since it was written)
-- filled with their defaults, as a config loaded now would have them.
local function fill_defaults(s, v)
  if s.kind ~= "map" or type(v) ~= "table" then return v end
  for key, fs in pairs(s.fields) do
    if v[key] == nil then
      if fs.default ~= nil then v[key] = json.decode(json.encode(fs.default))
      elseif fs.kind == "map" then v[key] = fill_defaults(fs, {})
      elseif fs.kind == "dict" then v[key] = {} end
    else
      fill_defaults(fs, v[key])
    end
  end
  return v
end
M.fill_defaults = function(cfg) return fill_defaults(M.config.schema, cfg) end

-- Loads a checkpoint (a file or a run directory) into ctx.registry, checking the config
-- against ctx.cfg but for the ignored paths.  Returns the registry's load result, or nil, message.
function M.load_checkpoint(ctx, path, ignore)
  local file, err = M.checkpoint_file(path)
  if not file then return nil, err end
  return ctx.registry:load(file, { config = ctx.cfg, config_ignore = ignore, config_fill = M.fill_defaults })
end

local function file_bytes(path)
  local f = io.open(path, "rb")
  if not f then return 0 end
  local n = f:seek("end")
  f:close()
  return n
end

local SIGNALS = { [2] = "SIGINT", [15] = "SIGTERM" }

local function device_line()
  if ur.gpu() then
    local p = ur.device_props(0)
    return ("on the GPU (cuda:%d %s)"):format(p.ordinal, p.name)
  end
  return "on the CPU"
end

-- A writer of the run directory's files; a no-op without a directory.
local function run_dir(out)
  if not out then return { line = function() end, close = function() end } end
  local ok, err = require("uvmrec.lib").check(C.ur_dir_create(out))
  if not ok then return nil, ("--out %s: %s"):format(out, err) end
  local f, ferr = io.open(out .. "/metrics.jsonl", "a")
  if not f then return nil, ferr end
  return {
    line = function(t)
      f:write(json.encode(t), "\n")
      f:flush()
    end,
    close = function() f:close() end,
    config = function(cfg)
      local c = assert(io.open(out .. "/config.json", "w"))
      c:write(json.encode(cfg), "\n")
      c:close()
    end,
  }
end

-- A metrics.jsonl line of managed collisions' statistics: {"event": "collisions", resident,
-- capacity, occupancy, candidates, lookups, resident_share, fallback_share, rounds, fills,
-- admissions, evictions, skipped, seconds, tables = {C3 = {...}, ...}} (counts since the start).
local RECORD = { "resident", "capacity", "occupancy", "candidates", "lookups", "resident_share", "fallback_share",
                 "rounds", "fills", "admissions", "evictions", "skipped", "seconds" }
function M.collisions_record(mcc)
  local s = assert(mcc:stats())
  local function pick(t)
    local o = {}
    for _, k in ipairs(RECORD) do o[k] = t[k] end
    return o
  end
  local rec = pick(s)
  rec.event, rec.tables = "collisions", {}
  for name, t in pairs(s.tables) do rec.tables[name] = pick(t) end
  return rec
end

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
    if t.hints and t.hints.policy then per[name] = { policy = t.hints.policy } end
  end
  return hints.manager(model.embeddings, { policy = e.hints.policy, every = e.hints.every,
                                           allowance = e.hints.allowance, decay = e.hints.decay, tables = per })
end

-- Trains as the config says.  opts: config_path (to find model.file), out (run directory),
-- progress ("auto", "bar", "lines", "none"), print (a function of one line; default to
-- stdout), hooks ({function(step, samples, ctx)}: after each step), setup (function(ctx),
-- after the model and registry exist and before a resume and the data: register more
-- components there), resume (a checkpoint file or run directory: its state is loaded and
-- training goes on from its step to train.steps), signals (false: leave SIGINT/SIGTERM
-- alone; by default, while the loop runs, either stops it at the next step boundary, with a
-- checkpoint when there is a run directory), cpu (true: no GPU).  Returns {steps, samples,
-- seconds, samples_per_s, loss, eval = {...} or nil, ceiling, checkpoint = the last saved,
-- resumed = {step, path} or nil, interrupted = {signal, name, step} or nil} or nil, message.
function M.run(cfg, opts)
  opts = opts or {}
  local say = opts.print or function(s) io.stdout:write(s, "\n") io.stdout:flush() end
  local def, where = M.model_def(cfg, opts.config_path)
  if not def then return nil, where end
  local rows = M.config.table_rows(cfg)
  local data, derr = M.data(cfg, rows)
  if not data then return nil, derr end
  -- The migration monitor counts only managed memory allocated after it starts: before the
  -- model, when tables are managed (hint policies report what moved; nil without CUPTI).
  if ur.gpu() and not opts.cpu and M.any_managed(cfg) then ur.monitor.start() end
  local model, merr = def.build(cfg, { cpu = opts.cpu })
  if not model then return nil, merr end
  local gpu = ur.gpu() and not opts.cpu
  local ctx = { cfg = cfg, model = model, optimizer = M.optimizer(cfg, model), step = 0, samples = 0, first = 1 }
  ctx.registry = register(ctx)
  if opts.setup then opts.setup(ctx) end
  local every, ckdir = cfg.train.checkpoint_every, opts.out and opts.out .. "/checkpoints"
  if every > 0 and not ckdir then
    return nil, "train.checkpoint_every is " .. every .. ": checkpoints need a run directory (--out RUNDIR)"
  end
  local resumed
  if opts.resume then
    local t0 = C.ur_clock_seconds()
    local r, rerr = M.load_checkpoint(ctx, opts.resume, M.RESUME_IGNORE)
    if not r then return nil, "--resume: " .. rerr end
    resumed = { step = r.step, path = r.path, seconds = C.ur_clock_seconds() - t0 }
  end
  ctx.hints = M.hints(cfg, model)

  local log, lerr = run_dir(opts.out)
  if not log then return nil, lerr end
  if log.config then log.config(cfg) end
  say(("uvmrec train: %s %s"):format(cfg.name or "model", device_line()))
  say("model: " .. tostring(model))
  say("data: " .. data.what)
  if resumed then
    say(("resumed from %s at step %d (%d samples trained; loaded in %.1f s)"):format(resumed.path, resumed.step,
      ctx.samples, resumed.seconds))
  end
  log.line { event = "start", version = ur.version(), gpu = gpu, model = model:stats(), data = cfg.data.train,
             resumed_from = resumed and resumed.path, step = resumed and resumed.step,
             load_seconds = resumed and resumed.seconds }

  local topts = {}
  for k, v in pairs(data.train) do topts[k] = v end
  topts.position = ctx.position
  local loader, err = ur.data.loader(topts)
  if not loader then return nil, err end
  ctx.loader = loader
  local feed = M.feed.new(loader, { gpu = gpu })
  local eval_feed = data.eval and M.feed.new(nil, { gpu = gpu })
  local kinds = cfg.eval.metrics
  local progress = M.progress.new { total = data.steps, mode = opts.progress, print_every = cfg.train.print_every }
  local evals = {}
  local function evaluate(step)
    progress:pause()
    local l = assert(ur.data.loader(data.eval))
    eval_feed:attach(l)
    local r, e = M.evaluate.run(model, eval_feed, { metrics = kinds, samples = cfg.eval.samples,
                                                    batch_size = cfg.eval.batch_size })
    eval_feed:drain()
    l:close()
    if not r then error(e, 0) end
    r.step = step
    evals[#evals + 1] = r
    progress:message(("eval at step %d: %s  (%d samples, %.1f s)"):format(step, M.evaluate.format(r, kinds),
                                                                        r.samples, r.seconds))
    local line = { event = "eval", step = step }
    for k, v in pairs(r) do line[k] = v end
    log.line(line)
    progress:resume()
    return r
  end

  -- Saves ctx.registry into RUNDIR/checkpoints at a step boundary (ctx.step is that step's).
  local saved
  local function checkpoint(step, why)
    progress:pause()
    local t0 = C.ur_clock_seconds()
    local path, cerr = ctx.registry:save_step(ckdir, { step = step, config = cfg,
                                                       keep = cfg.train.keep > 0 and cfg.train.keep or nil })
    if not path then error(cerr, 0) end
    local secs, bytes = C.ur_clock_seconds() - t0, file_bytes(path)
    saved = { step = step, path = path }
    progress:message(("checkpoint at step %d: %s (%s, %.1f s)"):format(step, path, M.progress.bytes(bytes), secs))
    log.line { event = "checkpoint", step = step, path = path, bytes = bytes, seconds = secs, reason = why }
    progress:resume()
  end

  -- Where the data stands after the step: the position after its batch.  The loader's own
  -- position runs ahead of it when batches are read in advance (the prefetch pipeline's are).
  local hooks = { function(step, samples, batch)
    ctx.step, ctx.samples = step, samples
    local b = batch and (batch._batch or batch)
    if b and b.epoch and b.first then ctx.trained = { epoch = b.epoch, sample = b.first + b.size } end
  end }
  if ctx.hints then
    local function note(rec)
      local line = { event = "hints" }
      for k, v in pairs(rec) do line[k] = v end
      log.line(line)
    end
    note(ctx.hints:start(ctx.first - 1))
    say(ctx.hints:summary())
    hooks[#hooks + 1] = function(step)
      local rec = ctx.hints:step(step)
      if rec then note(rec) end
    end
  end
  local eval_every = cfg.eval.every
  if data.eval and eval_every > 0 then
    hooks[#hooks + 1] = function(step)
      if step % eval_every == 0 and step ~= data.steps then evaluate(step) end
    end
  end
  if every > 0 then
    hooks[#hooks + 1] = function(step)
      if step % every == 0 then checkpoint(step, "every") end
    end
  end
  for _, h in ipairs(opts.hooks or {}) do hooks[#hooks + 1] = function(step, samples) h(step, samples, ctx) end end

  -- SIGINT/SIGTERM only raise the interrupt flag while the loop runs; the loop reads it once
  -- a step (one call, no system call) and stops at the boundary.
  local catching = opts.signals ~= false
  if catching then
    local cok, cerr = require("uvmrec.lib").check(C.ur_signals_catch(1))
    if not cok then return nil, cerr end
  end
  local sched = M.config.schedule(cfg)
  local last_loss
  local first, samples0 = ctx.first, ctx.samples
  local ok, steps, samples, stopped = pcall(cfg.train.pipeline and M.loop.run_pipelined or M.loop.run, {
    model = model, optimizer = ctx.optimizer, feed = feed, loader = loader, first = ctx.first,
    samples = ctx.samples,
    steps = cfg.train.steps > 0 and cfg.train.steps or nil, lr = sched,
    log_every = cfg.train.log_every, hooks = hooks,
    stop = function() return C.ur_interrupt_get() ~= 0 end,
    on_log = function(step, loss, n)
      last_loss = loss
      if model.collisions then
        -- the maps' statistics with the loss (reading them waits for the GPU, as the loss did)
        local cs = M.collisions_record(model.collisions)
        progress.note = ("collisions %.1f%% resident"):format(100 * cs.resident_share)
        cs.step = step
        log.line(cs)
      end
      progress:update(step, loss, n)
      log.line { event = "train", step = step, samples = n, loss = loss, seconds = progress:elapsed(),
                 samples_per_s = progress.rate, lr = ctx.optimizer.lr }
    end,
  })
  local interrupted, cerr
  if ok and stopped then
    local sig = catching and C.ur_signals_caught() or 0
    interrupted = { signal = sig, name = SIGNALS[sig] or "the interrupt flag", step = steps }
    ctx.step, ctx.samples = steps, samples
    -- No step since the start (or the checkpoint resumed from): nothing new to save.
    if ckdir and steps >= first and not (saved and saved.step == steps) then
      local sok, e = pcall(checkpoint, steps, "signal")
      if not sok then cerr = e end
    end
  elseif ok and every > 0 and steps >= first and not (saved and saved.step == steps) then
    local sok, e = pcall(checkpoint, steps, "end")
    if not sok then cerr = e end
  end
  if catching then C.ur_signals_catch(0) end
  progress:finish()
  feed:drain()
  ctx.position, ctx.loader = loader:position(), nil
  if not ok or cerr then
    loader:close()
    log.close()
    return nil, tostring(cerr or steps)
  end
  local seconds = progress:elapsed()
  local result = { steps = steps, samples = samples, seconds = seconds, loss = last_loss,
                   samples_per_s = (samples - samples0) / math.max(seconds, 1e-9), evals = evals,
                   resumed = resumed, checkpoint = saved and saved.path, interrupted = interrupted }
  if resumed then
    say(("trained steps %d to %d, %d samples in %.1f s: %s samples/s (%d samples in all)"):format(first, steps,
      samples - samples0, seconds, M.progress.count(result.samples_per_s), samples))
  else
    say(("trained %d steps, %d samples in %.1f s: %s samples/s"):format(steps, samples, seconds,
      M.progress.count(result.samples_per_s)))
  end
  if ctx.hints then
    say(ctx.hints:summary())
    result.hints = ctx.hints.last
    ctx.hints:free()
  end
  if model.collisions then
    say(model.collisions:summary())
    result.collisions = M.collisions_record(model.collisions)
  end
  local cache = model.embeddings.tbe.cache
  if cache then
    local cs = cache:stats()
    result.cache = cs
    say(("cache: %.1f%% of %s distinct rows hit, %s misses, %s conflict misses, %s evictions; "
         .. "%s in, %s out over the host link"):format(100 * cs.hit_rate, M.progress.count(cs.unique),
      M.progress.count(cs.misses), M.progress.count(cs.conflicts), M.progress.count(cs.evictions),
      M.progress.bytes(cs.bytes_in), M.progress.bytes(cs.bytes_out)))
    log.line { event = "cache", hits = cs.hits, unique = cs.unique, misses = cs.misses, conflicts = cs.conflicts,
               evictions = cs.evictions, writebacks = cs.writebacks, bytes_in = cs.bytes_in,
               bytes_out = cs.bytes_out, seconds = cs.seconds }
  end
  feed:free()
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
    return result
  end
  if data.eval then
    local eok, r = true, evals[#evals]
    if not (r and r.step == steps) then eok, r = pcall(evaluate, steps) end
    if not eok then
      log.close()
      return nil, tostring(r)
    end
    eval_feed:free()
    result.eval = r
    if data.ceiling then result.ceiling = data.ceiling() end
    say(("final AUC %.4f%s"):format(r.auc, result.ceiling
      and (" (the synthetic data's hidden-model ceiling: %.4f)"):format(result.ceiling) or ""))
  end
  log.line { event = "final", steps = steps, samples = samples, seconds = seconds,
             samples_per_s = result.samples_per_s, loss = last_loss, auc = result.eval and result.eval.auc,
             ceiling_auc = result.ceiling }
  log.close()
  if opts.out then
    say("run directory: " .. opts.out .. " (config.json, metrics.jsonl" .. (saved and ", checkpoints/)" or ")"))
  end
  if cfg.eval.min_auc > 0 and not (result.eval and result.eval.auc >= cfg.eval.min_auc) then
    return nil, ("the final AUC %s is below eval.min_auc %.4f"):format(
      result.eval and ("%.4f"):format(result.eval.auc) or "(no evaluation)", cfg.eval.min_auc), result
  end
  return result
end

-- Evaluates the model of a config on held-out data, as run() does at its end: opts.data
-- (synthetic: the samples after the config's training ones; files: these files), out,
-- config_path, setup (function(ctx), as run's), checkpoint (a file or run directory: its
-- weights are loaded; the model's config must be the checkpoint's, M.EVAL_IGNORE aside),
-- print, cpu.  Returns {eval = {...}, ceiling, step (the checkpoint's, or 0)} or nil, message.
function M.eval(cfg, opts)
  opts = opts or {}
  local say = opts.print or function(s) io.stdout:write(s, "\n") io.stdout:flush() end
  if opts.data and not opts.data:match("^synthetic:") then
    cfg.data.eval = opts.data
    if cfg.data.train == "" then cfg.data.train = opts.data end
  elseif opts.data then
    cfg.data.train, cfg.data.eval = opts.data, ""
  end
  local def, where = M.model_def(cfg, opts.config_path)
  if not def then return nil, where end
  local data, derr = M.data(cfg, M.config.table_rows(cfg))
  if not data then return nil, derr end
  if not data.eval then return nil, "no held-out data to evaluate on: give --data SPEC" end
  local model, merr = def.build(cfg, { cpu = opts.cpu })
  if not model then return nil, merr end
  local gpu = ur.gpu() and not opts.cpu
  local ctx = { cfg = cfg, model = model, optimizer = M.optimizer(cfg, model), step = 0, samples = 0, first = 1 }
  ctx.registry = register(ctx)
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
  say(("uvmrec eval: %s %s"):format(cfg.name or "model", device_line()))
  say("model: " .. tostring(model))
  if loaded then say(("weights: %s (step %d)"):format(loaded.path, loaded.step)) end
  say("data: " .. data.what)
  local loader, err = ur.data.loader(data.eval)
  if not loader then return nil, err end
  local feed = M.feed.new(loader, { gpu = gpu })
  local r, eerr = M.evaluate.run(model, feed, { metrics = cfg.eval.metrics, samples = cfg.eval.samples,
                                                batch_size = cfg.eval.batch_size })
  feed:free()
  loader:close()
  if not r then return nil, eerr end
  local result = { eval = r, ceiling = data.ceiling and data.ceiling(), step = ctx.step }
  say(("eval: %s  (%d samples, %.1f s)"):format(M.evaluate.format(r, cfg.eval.metrics), r.samples, r.seconds))
  if result.ceiling then
    say(("the synthetic data's hidden-model ceiling: %.4f"):format(result.ceiling))
  end
  local line = { event = "eval", step = ctx.step, ceiling_auc = result.ceiling, checkpoint = loaded and loaded.path }
  for k, v in pairs(r) do line[k] = v end
  log.line(line)
  log.close()
  return result
end

return M
