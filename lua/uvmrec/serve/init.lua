-- uvmrec.serve: exported models (model files of `uvmrec export`) scored through the engine's
-- serving API (uvmrec.h section 10, ur_model_*), the same calls a C program makes: open,
-- predict, info; and scoring a data spec, which `uvmrec predict` and `uvmrec eval` run.
--
--   local serve = require "uvmrec.serve"
--   local m = assert(serve.open("tiny.safetensors", { placement = "host" }))
--   local p = m:predict(batch)          -- f32 [B]: probabilities of a loader's batch
--   local r = assert(serve.evaluate(m)) -- AUC on the training run's held-out samples
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local json = require "uvmrec.json"
local C, check = lib.C, lib.check

local M = {}
local methods = {}
local wrap_model, free_model = lib.handle_type("ur_model", C.ur_model_close, { __index = methods })
local path_of = setmetatable({}, { __mode = "k" }) -- each model's file, for messages

local PLACES = { device = C.UR_PLACE_DEVICE, managed = C.UR_PLACE_MANAGED, host = C.UR_PLACE_HOST }
local BOUNDS = { fatal = C.UR_TBE_BOUNDS_FATAL, warn = C.UR_TBE_BOUNDS_WARN, off = C.UR_TBE_BOUNDS_OFF }
local OPTS = { device = true, placement = true, bounds = true, max_callers = true, hot_fraction = true }

local function choice(map, v, what, level)
  if map[v] == nil then
    local names = {}
    for k in pairs(map) do names[#names + 1] = k end
    table.sort(names)
    error(("serve: %s '%s' is not one of %s"):format(what, tostring(v), table.concat(names, ", ")), level + 1)
  end
  return map[v]
end

-- True when path is a model file (safetensors with uvmrec.format "model").
function M.is_model_file(path)
  local f = type(path) == "string" and require("uvmrec.checkpoint").open(path)
  if not f then return false end
  local yes = f:meta("uvmrec.format") == "model"
  f:close()
  return yes
end

-- serve.open(path, opts): opts.device ("cpu" or a GPU; default the current GPU, else the CPU),
-- placement of the tables ("device", "managed", "host"; default where it runs), bounds ("fatal",
-- "warn", "off"), max_callers (0: no limit), hot_fraction (managed tables' share preferred on
-- the GPU; < 0: no hints).  The model, or nil, message (the file and the reason).
function M.open(path, opts)
  if type(path) ~= "string" then error("serve: open needs a path", 2) end
  opts = lib.options(opts, OPTS, "serve", '{device = "cpu"}', 2)
  local o = ffi.new("ur_model_options")
  C.ur_model_options_init(o)
  if opts.device ~= nil then o.device = lib.device_option(opts.device, 2) end
  if opts.placement ~= nil then o.table_place = choice(PLACES, opts.placement, "placement", 2) end
  if opts.bounds ~= nil then o.bounds = choice(BOUNDS, opts.bounds, "bounds", 2) end
  -- the FFI would truncate 1.5 callers, wrap 2^40 to INT32_MIN, and raise its own error for a string
  local n = opts.max_callers
  if n ~= nil then
    if type(n) ~= "number" or n ~= math.floor(n) or n < -2 ^ 31 or n >= 2 ^ 31 then
      error(("serve: max_callers %s; expected a whole number (0: no limit)"):format(tostring(n)), 2)
    end
    o.max_callers = n
  end
  if opts.hot_fraction ~= nil then
    if type(opts.hot_fraction) ~= "number" then
      error(("serve: hot_fraction %s; expected a number (< 0: no hints)"):format(tostring(opts.hot_fraction)), 2)
    end
    o.hot_fraction = opts.hot_fraction
  end
  local out = ffi.new("ur_model *[1]")
  local ok, err = check(C.ur_model_open(out, path, o), 2)
  if not ok then return nil, err end
  local m = wrap_model(out[0])
  path_of[m] = path
  return m
end

local function P(m)
  local p = lib.ptr(m, "model", 3) -- not a tail call: lib.ptr
  return p
end

function methods:close() free_model(self) end
methods.free = methods.close

-- The path the model was opened from.
function methods:path() return path_of[self] end

local props = ffi.new("ur_model_props")

-- {interaction, input, num_dense, num_features, num_tables, dim, device, placement,
-- dense_dtype, contexts, rows, table_bytes, dense_bytes, file_bytes, calls, failed, samples}
function methods:info()
  lib.must(C.ur_model_info(P(self), props))
  return {
    interaction = ffi.string(props.interaction), input = ffi.string(props.input),
    num_dense = props.num_dense, num_features = props.num_features, num_tables = props.num_tables,
    dim = props.dim, device = props.device, placement = ffi.string(C.ur_place_name(props.table_place)),
    dense_dtype = ffi.string(C.ur_dtype_name(props.dense_dtype)), contexts = props.contexts,
    rows = tonumber(props.rows), table_bytes = tonumber(props.table_bytes),
    dense_bytes = tonumber(props.dense_bytes), file_bytes = tonumber(props.file_bytes),
    calls = tonumber(props.calls), failed = tonumber(props.failed), samples = tonumber(props.samples),
  }
end

-- A metadata value of the file, or nil.
function methods:meta(key)
  local v = C.ur_model_meta(P(self), key)
  return v ~= nil and ffi.string(v) or nil
end

-- The description (uvmrec.model), decoded: the engine checked it is JSON when it opened the file.
function methods:description() return assert(json.decode(self:meta("uvmrec.model"))) end

-- The training run's config (uvmrec.config), decoded and filled with training's defaults; nil,
-- message naming the file when it has none or one that is no JSON object (a file another
-- program wrote, or edited): the engine serves such a file, and only what reads the training
-- run's data needs the config (M.data).
function methods:config()
  return require("uvmrec.train.config").stored(self, "model file " .. self:path())
end

-- The config, or training's defaults where the file has none it can read: what scoring Criteo
-- files takes from it (eval.batch_size, eval.samples, eval.metrics, data.pad_missing_fields).
local function settings(m)
  return m:config() or require("uvmrec.train").fill_defaults({})
end

function methods:features()
  local out = {}
  for i = 0, self:info().num_features - 1 do out[i + 1] = ffi.string(C.ur_model_feature_name(P(self), i)) end
  return out
end

-- predict(batch[, out]) or predict(dense, sparse[, out]): the probabilities f32 [B] (into out,
-- f32 of B elements in any placement, when given).  A bad request returns nil, message and
-- leaves the model serving.
function methods:predict(a, b, c)
  local dense, sparse, out
  if type(a) == "table" and a.dense then dense, sparse, out = a.dense, a.sparse, b
  else dense, sparse, out = a, b, c end
  if dense == nil or sparse == nil then error("serve: predict needs a batch {dense=, sparse=} or dense, sparse", 2) end
  if out == nil then
    local err
    out, err = tensor.tensor({ dense:size(1) })
    if not out then return nil, err end
  end
  local st = C.ur_model_predict(P(self), lib.ptr(dense, "dense", 2), lib.ptr(sparse, "sparse", 2),
                                lib.ptr(out, "scores", 2))
  if st ~= 0 then return nil, ffi.string(C.ur_last_error()) end
  return out
end

-- ---- data ----

-- The refusal of data of another input than model m's (engine/examples/serve.c's rule and
-- words): nil, message; what: "Criteo data", "synthetic data", with its dense and sparse features.
local function other_input(m, spec, what, dense, sparse)
  local info = m:info()
  return nil, ("serve: %s takes %s input with %d dense and %d sparse features; %s is %s (%d and %d)")
    :format(m:path(), info.input, info.num_dense, info.num_features, spec, what, dense, sparse)
end

-- Loader options for scoring data with model m: spec nil or "held-out" (the training run's
-- held-out samples, as its final evaluation read them, rows included), a synthetic spec (the same samples;
-- refused for a model trained on Criteo input, whose rows and labels it has nothing of),
-- or criteo-tsv / criteo-bin files (all of them; ids taken modulo the tables' rows as the
-- model maps raw ids, so that day files convert reduced by other rows are refused as training
-- refuses them; TSV lines of 15 to 39 fields padded when the training run padded them,
-- data.pad_missing_fields).  The first two read the training run's config (uvmrec.config):
-- a file without one is refused naming what needed it; Criteo files take training's defaults
-- then.  opts: batch_size, samples (at most).  Returns loader options and a line saying what
-- they are.
function M.data(m, spec, opts)
  opts = opts or {}
  local train = require "uvmrec.train"
  if spec == nil or spec == "held-out" or spec:match("^synthetic:") then
    -- synthetic ids are drawn as rows of the tables and labelled by the generator's hidden model:
    -- of the same shape as Criteo's, but a model trained on Criteo learned none of them, and its
    -- scores (an AUC near 0.5) would be read as its held-out samples'
    local name = spec and spec:match("^synthetic:(.*)$")
    local base = name and m:info().input == "criteo" and require("uvmrec.data.synthetic").resolve(name)
    if base then return other_input(m, spec, "synthetic data", base.num_dense or 13, #(base.tables or {})) end
    local cfg, cerr = m:config()
    if not cfg then
      if spec and spec ~= "held-out" then return nil, ("%s, which --data %s needs"):format(cerr, spec) end
      return nil, ("%s, which the training run's held-out samples need%s"):format(cerr,
        m:info().input == "criteo" and "; --data criteo-tsv:PATH or criteo-bin:DIR needs none" or "")
    end
    local rows = train.config.table_rows(cfg)
    local bs = opts.batch_size or cfg.eval.batch_size
    if spec and spec ~= "held-out" then cfg.data.train, cfg.data.eval = spec, "" end
    local d, err = train.data(cfg, rows)
    if not d then return nil, err end
    if not d.eval then return nil, "serve: the model's training run has no held-out data; give --data SPEC" end
    local o = {}
    for k, v in pairs(d.eval) do o[k] = v end
    -- rows as the training run's evaluation read them (the model's table sizes): its day files
    -- are then checked against the sizes convert took their ids modulo, as --data's are
    o.batch_size, o.placement = bs, "host"
    if opts.samples and o.samples and o.position then
      o.samples = math.min(o.samples, o.position.sample + opts.samples)
    end
    local what = o.position and ("%s: samples %d to %d (the training run's held-out samples)"):format(
      spec or cfg.data.train, o.position.sample, o.samples - 1) or (spec or cfg.data.eval)
    return o, what
  end
  local src, serr = require("uvmrec.data.loader").parse_source(spec)
  if not src then return nil, serr end
  -- Criteo data only for a model trained on Criteo input, as engine/examples/serve.c takes
  -- Criteo lines: a model of synthetic input takes ids as rows (no modulo), so Criteo's ids
  -- fall outside its tables, or score as rows they never were
  local D, info = require("uvmrec.data"), m:info()
  if info.input ~= "criteo" or info.num_dense ~= D.NUM_DENSE or info.num_features ~= D.NUM_SPARSE then
    return other_input(m, spec, "Criteo data", D.NUM_DENSE, D.NUM_SPARSE)
  end
  -- column k's ids taken modulo feature Ck's table modulo (its rows), as the model maps them
  local rows, at = {}, {}
  for f, name in ipairs(m:features()) do at[name] = f - 1 end
  for k = 1, D.NUM_SPARSE do
    rows[k] = at["C" .. k] and tonumber(C.ur_model_table_modulo(P(m), at["C" .. k])) or 0
  end
  local cfg = settings(m)
  return { data = spec, batch_size = opts.batch_size or cfg.eval.batch_size, depth = 2, epochs = 1,
           placement = "host", rows = rows, pad_missing_fields = cfg.data.pad_missing_fields }, spec
end

-- Scores loader options' batches: fn(batch, probabilities) for each; opts.samples stops after
-- that many.  Returns the samples scored, or nil, message.
function M.score(m, lopts, fn, opts)
  opts = opts or {}
  local loader, err = require("uvmrec").data.loader(lopts)
  if not loader then return nil, err end
  local n, out = 0, nil
  while not opts.samples or n < opts.samples do
    -- the engine's interrupt flag (SIGINT or SIGTERM where a command catches them, as uvmrec
    -- predict does: ur_signals_catch) stops it between batches
    if C.ur_interrupt_get() ~= 0 then
      loader:close()
      if out then out:free() end
      return nil, ("interrupted after %d samples"):format(n)
    end
    local batch, berr = loader:next()
    if berr then
      loader:close()
      return nil, berr
    end
    if not batch then break end
    if not out or out:numel() ~= batch.size then
      if out then out:free() end
      out = assert(tensor.tensor({ batch.size }))
    end
    local p, perr = m:predict(batch, out)
    if not p then
      loader:close()
      return nil, perr
    end
    fn(batch, p)
    n = n + batch.size
  end
  loader:close()
  if out then out:free() end
  return n
end

-- The metrics of model m on data (M.data's spec and opts; kinds: opts.metrics, else eval.metrics
-- of its training config): {auc, ne, logloss, accuracy, calibration, ctr, samples, seconds, what,
-- metrics = the kinds}, AUC exact over every sample scored.
function M.evaluate(m, spec, opts)
  opts = opts or {}
  local metrics = require "uvmrec.metrics"
  local lopts, what = M.data(m, spec, opts)
  if not lopts then return nil, what end
  local cfg = settings(m) -- M.data refused data that needs the config where there is none
  local total = lopts.position and (lopts.samples - lopts.position.sample) or opts.samples or cfg.eval.samples
  local t0 = C.ur_clock_seconds()
  local mc = metrics.MetricCollection { metrics = opts.metrics or cfg.eval.metrics, batch_size = lopts.batch_size,
                                        include_logloss = true, placement = "host",
                                        window_size = total > 0 and total + lopts.batch_size or 0 }
  local n, err = M.score(m, lopts, function(batch, p)
    assert(mc:update { predictions = p, labels = batch.labels })
  end, { samples = total > 0 and total or nil })
  if not n then
    mc:free()
    return nil, err
  end
  if n == 0 then
    mc:free()
    return nil, ("serve: %s gave no samples; expected at least one to score"):format(what)
  end
  local v = assert(mc:values()).default
  local scope = total > 0 and v.window or v.lifetime
  mc:free()
  local kinds = opts.metrics or cfg.eval.metrics
  local r = { samples = n, asked = total > 0 and n < total and total or nil, seconds = C.ur_clock_seconds() - t0,
              what = what, metrics = kinds }
  return require("uvmrec.train.evaluate").take(r, scope, kinds)
end

return M
