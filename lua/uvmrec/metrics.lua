-- uvmrec.metrics: streaming metrics of binary predictions, computed where their state lives
-- (the GPU for device or managed state, else the CPU): AUC (exact over a window or an
-- evaluation set, and lifetime from a histogram with its error bound), grouped AUC, NE with
-- log loss, accuracy, calibration and CTR, for several tasks at once, with per-sample weights.
--
--   local metrics = require "uvmrec.metrics"
--   local auc = metrics.AUC{tasks = {"ctr"}, batch_size = 4096}
--   auc:update{predictions = p, labels = y, weights = w}   -- enqueues; never waits
--   auc:compute()  --> {["auc-ctr|window_auc"] = 0.71, ["auc-ctr|lifetime_auc"] = ..., ...}
--
-- A MetricCollection computes several kinds from one state, reading each batch once.  An AUC,
-- NE or calibration that one class leaves undefined (a grouped AUC no group can give) is nil
-- (compute leaves its keys out; values says why), where the engine (uvmrec.h's section 7) says
-- torchrec's AUC 0.5 and NE and calibration near 1e12; an AUC a scope does not compute is
-- absent from both (the engine's 0).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local streams = require "uvmrec.stream"
local C, check = lib.C, lib.check

local M = {}

-- What each kind reports: key suffix, scope, field of ur_metric_values, and what it needs.
local KINDS = {
  auc = { prefix = "auc", outputs = {
    { "window_auc", "window", "auc", "window" },
    { "lifetime_auc", "lifetime", "auc", "bins" },
    { "lifetime_auc_error", "lifetime", "auc_error", "bins" } } },
  gauc = { prefix = "gauc", outputs = {
    { "window_gauc", "window", "grouped_auc", "window" },
    { "window_gauc_num_groups", "window", "groups", "window" } } },
  ne = { prefix = "ne", outputs = {
    { "window_ne", "window", "ne", "window" },
    { "lifetime_ne", "lifetime", "ne" },
    { "window_logloss", "window", "logloss", "logloss_window" },
    { "lifetime_logloss", "lifetime", "logloss", "logloss" } } },
  accuracy = { prefix = "accuracy", outputs = {
    { "window_accuracy", "window", "accuracy", "window" },
    { "lifetime_accuracy", "lifetime", "accuracy" } } },
  calibration = { prefix = "calibration", outputs = {
    { "window_calibration", "window", "calibration", "window" },
    { "lifetime_calibration", "lifetime", "calibration" } } },
  ctr = { prefix = "ctr", outputs = {
    { "window_ctr", "window", "ctr", "window" },
    { "lifetime_ctr", "lifetime", "ctr" } } },
}
local KIND_ORDER = { "auc", "gauc", "ne", "accuracy", "calibration", "ctr" }

local FIELDS = { "auc", "auc_error", "grouped_auc", "groups", "ne", "logloss", "accuracy", "calibration",
                 "ctr", "weight", "positive", "negative" }

local OPTIONS = { tasks = true, batch_size = true, window_size = true, lifetime_bins = true,
                  include_logloss = true, threshold = true, eta = true, placement = true,
                  device = true, reduce = true, world_size = true, rank = true, my_rank = true,
                  comm = true }

local DEFAULT_BINS = 65536
local DEFAULT_WINDOW_BATCHES = 100

local wrap_handle, free_handle = lib.handle_type("ur_metrics", C.ur_metrics_free, {})

local Metric = {}
Metric.__index = Metric

local function parse_tasks(tasks, level)
  tasks = tasks or { "default" }
  if type(tasks) ~= "table" or #tasks < 1 then
    error("metrics: tasks must be a non-empty list of names, got " .. tostring(tasks), level + 1)
  end
  local seen = {}
  for i, name in ipairs(tasks) do
    if type(name) ~= "string" or name == "" or name:find("[|%s]") then
      error(("metrics: task %d is %s; expected a name without spaces or '|'"):format(i, tostring(name)), level + 1)
    end
    if seen[name] then error("metrics: task '" .. name .. "' is listed twice", level + 1) end
    seen[name] = true
  end
  return tasks
end

-- kinds: a set of KINDS names; opts as documented in README.md.
local function new(kinds, opts, level)
  level = level + 1
  if type(opts) ~= "table" then error("metrics: expected a table of options", level) end
  lib.known_keys(opts, OPTIONS, "metrics", level)
  local tasks = parse_tasks(opts.tasks, level)
  local batch = lib.whole(opts.batch_size, "metrics: batch_size", level, 1)
  local window = lib.whole(opts.window_size or batch * DEFAULT_WINDOW_BATCHES, "metrics: window_size", level, 0)
  local bins = kinds.auc and lib.whole(opts.lifetime_bins or DEFAULT_BINS, "metrics: lifetime_bins", level, 0) or 0
  if opts.reduce ~= nil and type(opts.reduce) ~= "function" then
    error("metrics: reduce must be a function, got " .. type(opts.reduce), level)
  end
  local reduce = opts.reduce
  local world = opts.world_size or 1
  if world ~= 1 then
    lib.whole(world, "metrics: world_size", level, 1)
    local rank = opts.rank or opts.my_rank
    if rank == nil then error("metrics: world_size " .. world .. " needs rank (or my_rank)", level) end
    lib.whole(rank, "metrics: rank", level, 0)
    if reduce then error("metrics: give reduce or world_size, not both", level) end
    local comm = opts.comm or require("uvmrec.dist").job()
    if comm.world ~= world or comm.rank ~= rank then
      error(("metrics: world_size %d and rank %d, but the communicator is rank %d of %d")
            :format(world, rank, comm.rank, comm.world), level)
    end
    reduce = M.over_ranks(comm)
  end
  if kinds.gauc and window == 0 then
    error("metrics: grouped AUC is computed over the window, and window_size is 0", level)
  end
  local place = opts.placement or (C.ur_device_count() > 0 and "device" or "host")
  local place_id = lib.enum(C.ur_place_parse, "ur_place", place, "metrics placement", level)
  local device = -1
  if opts.device ~= nil then
    device = lib.location(opts.device, level)
  elseif place_id == C.UR_PLACE_DEVICE or place_id == C.UR_PLACE_MANAGED then
    local d = ffi.new("int32_t[1]")
    device = C.ur_device_get(d) == 0 and d[0] or 0
  end
  local o = ffi.new("ur_metrics_opts")
  o.tasks = #tasks
  o.auc = (kinds.auc and window > 0) and 1 or 0
  o.grouped_auc = kinds.gauc and 1 or 0
  o.bins = bins
  o.window = window
  for _, k in ipairs { "threshold", "eta" } do
    if opts[k] ~= nil and type(opts[k]) ~= "number" then
      error(("metrics: %s is %s; expected a number"):format(k, type(opts[k])), level)
    end
  end
  if opts.include_logloss ~= nil and type(opts.include_logloss) ~= "boolean" then
    error(("metrics: include_logloss is %s; expected true or false"):format(tostring(opts.include_logloss)), level)
  end
  o.threshold = opts.threshold or 0.5
  o.eta = opts.eta or 1e-12
  local out = ffi.new("ur_metrics *[1]")
  local ok, err = check(C.ur_metrics_new(out, o, place_id, device), level)
  if not ok then return nil, err end

  local has = { window = window > 0, bins = bins > 0, logloss = opts.include_logloss and true,
                logloss_window = opts.include_logloss and window > 0 }
  has[true] = true
  local outputs = {}
  for _, kind in ipairs(KIND_ORDER) do
    if kinds[kind] then
      for _, o2 in ipairs(KINDS[kind].outputs) do
        if has[o2[4] or true] then
          for t, name in ipairs(tasks) do
            outputs[#outputs + 1] = { KINDS[kind].prefix .. "-" .. name .. "|" .. o2[1], t - 1, o2[2], o2[3] }
          end
        end
      end
    end
  end
  return setmetatable({
    _h = wrap_handle(out[0]), tasks = tasks, batch_size = batch, window_size = window,
    lifetime_bins = bins, reduce = reduce, placement = place, device = device, world_size = world,
    _outputs = outputs, _auc = { window = kinds.auc and window > 0, lifetime = kinds.auc and bins > 0 },
    _gauc = kinds.gauc and true,
    _window = ffi.new("ur_metric_values[?]", #tasks),
    _lifetime = ffi.new("ur_metric_values[?]", #tasks),
    _snap = ffi.new("double *[1]"), _count = ffi.new("uint64_t[1]"),
  }, Metric)
end

local function H(self, level)
  local h = rawget(self, "_h")
  if type(h) ~= "cdata" then error("metrics: expected a metric object (use ':')", level + 1) end
  local p = lib.ptr(h, "metrics", level + 1) -- not a tail call: lib.ptr
  return p
end

local function tensor_arg(v, what, level, optional)
  if v == nil and optional then return nil end
  if not tensor.is_tensor(v) then
    error(("metrics: %s must be a tensor, got %s"):format(what, type(v)), level + 1)
  end
  local p = lib.ptr(v, "metrics " .. what, level + 1) -- not a tail call: lib.ptr
  return p
end

local UPDATE_KEYS, BY_POSITION = { "predictions", "labels", "weights", "grouping_keys", "stream" },
                                  { true, true, true, true }

-- update{predictions = p, labels = y, weights = w, grouping_keys = g, stream = s}, or
-- positionally update{p, y, w, g}.  Enqueues the work and returns at once.
function Metric:update(a)
  local m = H(self, 2)
  if type(a) ~= "table" then
    error("metrics update: expected a table {predictions = ..., labels = ...}", 2)
  end
  -- a misspelt key (weight =) would count every sample as weight 1, silently
  lib.known_keys(a, UPDATE_KEYS, "metrics update", 2, "key", BY_POSITION, "or the first four by position")
  local ok, err = check(C.ur_metrics_update(streams.handle(a.stream, 2), m,
    tensor_arg(a.predictions or a[1], "predictions", 2),
    tensor_arg(a.labels or a[2], "labels", 2),
    tensor_arg(a.weights or a[3], "weights", 2, true),
    tensor_arg(a.grouping_keys or a[4], "grouping keys", 2, true)))
  if not ok then return nil, err end
  return self
end

function Metric:reset(stream)
  local ok, err = check(C.ur_metrics_reset(streams.handle(stream, 2), H(self, 2)))
  if not ok then return nil, err end
  return self
end

-- Samples added since the last reset, counted on the host (no wait).
function Metric:seen() return tonumber(C.ur_metrics_seen(H(self, 2))) end
function Metric:on_gpu() return C.ur_metrics_on_gpu(H(self, 2)) ~= 0 end

-- What a reduction across GPUs works on: `lifetime`, a snapshot of the lifetime state
-- ({ptr = double *, count = n, placement, device}: sum it in place over the ranks), and
-- `window`, views of this rank's window ({predictions, labels, weights, grouping_keys}:
-- gather them over the ranks).
function Metric:state(stream)
  local m = H(self, 2)
  local ok, err = check(C.ur_metrics_snapshot(streams.handle(stream, 2), m, self._snap, self._count))
  if not ok then return nil, err end
  local snap = ffi.new("ur_tensor *[1]")
  ok, err = check(C.ur_metrics_snapshot_tensor(streams.handle(stream, 2), m, snap))
  if not ok then return nil, err end
  local s = { lifetime = { ptr = self._snap[0], count = tonumber(self._count[0]),
                           placement = self.placement, device = self.device, tensor = tensor.wrap(snap[0]) },
              tasks = #self.tasks, stream = stream }
  if self.window_size > 0 then
    local v = ffi.new("ur_tensor *[4]")
    ok, err = check(C.ur_metrics_window(m, v, v + 1, v + 2, v + 3))
    if not ok then return nil, err end
    s.window = { predictions = tensor.wrap(v[0]), labels = tensor.wrap(v[1]),
                 weights = tensor.wrap(v[2]), grouping_keys = v[3] ~= nil and tensor.wrap(v[3]) or nil }
  end
  return s
end

local function free_window(w)
  if not w then return end
  for _, k in ipairs { "predictions", "labels", "weights", "grouping_keys" } do
    if w[k] then w[k]:free() end
  end
end

-- check() for ur_metrics_compute, its error naming the task as the metric's tasks do.
local function check_compute(self, st, level)
  if st == C.UR_STATUS_INVALID then
    local msg = ffi.string(C.ur_last_error()):gsub("task (%d+) %(of %d+, from 0%)", function(t)
      return ("task %s"):format(self.tasks[tonumber(t) + 1])
    end)
    error(msg, level + 1)
  end
  return check(st, level + 1)
end

-- Fills the value arrays: waits for the work enqueued so far (the only place that does).
local function run(self, stream, level)
  local m = H(self, level + 1)
  local sh = streams.handle(stream, level + 1)
  local ok, err
  if self.reduce then
    local s
    s, err = self:state(stream)
    if not s then return nil, err end
    local got = self.reduce(s)
    local w = got or s.window
    if w then
      ok, err = check_compute(self, C.ur_metrics_compute(sh, m, 1,
        tensor_arg(w.predictions, "reduced window predictions", level + 1),
        tensor_arg(w.labels, "reduced window labels", level + 1),
        tensor_arg(w.weights, "reduced window weights", level + 1, true),
        tensor_arg(w.grouping_keys, "reduced window grouping keys", level + 1, true),
        self._window, self._lifetime), level + 1)
    else
      ok, err = check_compute(self, C.ur_metrics_compute(sh, m, 1, nil, nil, nil, nil, self._window, self._lifetime),
                              level + 1)
    end
    free_window(s.window)
    if got and got ~= s.window then free_window(got) end
    s.lifetime.tensor:free()
  else
    ok, err = check_compute(self, C.ur_metrics_compute(sh, m, 0, nil, nil, nil, nil, self._window, self._lifetime),
                            level + 1)
  end
  if not ok then return nil, err end
  return true
end

-- Why the AUC of one scope's values (a values() scope, or the engine's ur_metric_values) is
-- undefined, or nil when it is not: it ranks positives above negatives, so it needs both
-- classes, a positive and a negative weight.  The engine gives 0.5 there, a number that reads
-- as a result.  noun: what the labels are called in the message ("label", "held-out label").
function M.auc_undefined(v, noun)
  local pos, neg = v.positive, v.negative
  if pos > 0 and neg > 0 and pos * neg > 0 then return nil end
  noun = noun or "label"
  local n = tonumber(v.samples)
  if n == 0 then return "no " .. noun end
  if pos <= 0 and neg <= 0 then return ("the %s weigh 0"):format(lib.things(n, noun)) end
  if pos > 0 and neg > 0 then return ("its classes weigh %g and %g, too little to pair"):format(pos, neg) end
  local weighed = tonumber(v.weight) ~= n and " by weight" or ""
  if n == 1 then return ("the 1 %s is %d%s"):format(noun, pos > 0 and 1 or 0, weighed) end
  return ("all %s are %d%s"):format(lib.things(n, noun), pos > 0 and 1 or 0, weighed)
end

-- The values of one scope that its classes leave undefined, each with why ({} when none is):
-- auc (and auc_error) without both classes; ne, log loss over the entropy of the base rate,
-- which is 0 with one class (the engine clamps it at eta: NE 2e12 for one sample); calibration,
-- over the positive weight, without positives (8.8e11 for a negative sample); grouped_auc, the
-- mean over the groups that hold both classes, when none does (the engine says 0.5).
function M.undefined(v, noun)
  local out = {}
  if tonumber(v.groups) == 0 then out.grouped_auc = "no group holds both classes" end
  local why = M.auc_undefined(v, noun)
  if why then
    out.auc, out.auc_error = why, why
    if v.positive <= 0 or v.negative <= 0 then out.ne = why end
    if v.positive <= 0 then out.calibration = why end
  end
  return out
end

-- {["<kind>-<task>|<scope>_<name>"] = value}, torchrec's keys; an undefined value's keys are left
-- out (M.undefined: torchrec says AUC 0.5, and NE and calibration near 1e12).
function Metric:compute(stream)
  local ok, err = run(self, stream, 2)
  if not ok then return nil, err end
  local out = {}
  for _, o in ipairs(self._outputs) do
    local v = (o[3] == "window" and self._window or self._lifetime)[o[2]]
    if not M.undefined(v)[o[4]] then out[o[1]] = tonumber(v[o[4]]) end
  end
  return out
end

-- A scope's values; the undefined are nil, <name>_undefined saying why.  AUC and grouped AUC
-- (with its groups) are there only where the scope computes them, has.auc and has.gauc: the
-- engine leaves them 0 elsewhere, an AUC that reads as the worst ranking (AUC{window_size = 0}'s
-- window.auc was 0).
local ONLY = { auc = "auc", auc_error = "auc", grouped_auc = "gauc", groups = "gauc" }
local function values_table(v, has)
  local t = { samples = tonumber(v.samples) }
  for _, f in ipairs(FIELDS) do
    if not ONLY[f] or has[ONLY[f]] then t[f] = tonumber(v[f]) end
  end
  for k, why in pairs(M.undefined(v)) do
    if not ONLY[k] or has[ONLY[k]] then
      t[k] = nil
      if k ~= "auc_error" then t[k .. "_undefined"] = why end
    end
  end
  return t
end

-- Every value of both scopes per task: {[task] = {window = {...}, lifetime = {...}}}.
function Metric:values(stream)
  local ok, err = run(self, stream, 2)
  if not ok then return nil, err end
  local out = {}
  for t, name in ipairs(self.tasks) do
    out[name] = { window = values_table(self._window[t - 1], { auc = self._auc.window, gauc = self._gauc }),
                  lifetime = values_table(self._lifetime[t - 1], { auc = self._auc.lifetime }) }
  end
  return out
end

function Metric:free()
  local h = rawget(self, "_h")
  if h then free_handle(h) end
end

function Metric:__tostring()
  local h = rawget(self, "_h")
  if h.p == nil then return "metrics (freed)" end
  local ks = {}
  for _, o in ipairs(self._outputs) do
    local k = o[1]:match("^([^-]+)")
    if ks[#ks] ~= k then ks[#ks + 1] = k end
  end
  return ("metrics {%s} tasks {%s} window %d bins %d, %s %s"):format(table.concat(ks, ", "),
    table.concat(self.tasks, ", "), self.window_size, self.lifetime_bins, self.placement,
    self:on_gpu() and "(GPU)" or "(CPU)")
end

-- The reduction over the ranks of a communicator (world_size = W, rank = r): the lifetime sums
-- and histograms summed (f64, exact for counts), the windows gathered, so AUC and grouped AUC
-- are exact over the union of every rank's samples.
function M.over_ranks(comm)
  return function(state)
    local st = state.stream
    assert(comm:all_reduce(state.lifetime.tensor, "sum", st))
    local w = state.window
    if not w then
      assert(comm:wait(st))
      return nil
    end
    local W, tasks = comm.world, state.tasks
    local n = w.labels:size(1)
    local counts = tensor.tensor({ W }, { dtype = "i64" })
    local mine = tensor.tensor({ 1 }, { dtype = "i64" }):fill(n)
    assert(comm:all_gather(mine, counts))
    assert(comm:wait())
    local rows, total = counts:totable(), 0
    counts:free()
    mine:free()
    for r = 1, W do total = total + rows[r] end
    local function gather(t, per)
      if not t then return nil end
      local o = { dtype = t:dtype(), placement = t:placement() }
      if o.placement == "device" or o.placement == "managed" then o.device = t:device() end
      local out = assert(tensor.tensor(per > 1 and { total, per } or { total }, o))
      local c = {}
      for r = 1, W do c[r] = rows[r] * per end
      assert(comm:all_gather(t, out, c, st))
      return out
    end
    local wper = w.weights and w.weights:numel() == n * tasks and tasks or 1
    local got = { predictions = gather(w.predictions, tasks), labels = gather(w.labels, tasks),
                  weights = gather(w.weights, wper), grouping_keys = gather(w.grouping_keys, 1) }
    assert(comm:wait(st))
    return got
  end
end

-- The classes: each is called with the options, as in the seed: AUC{tasks = ..., ...}.
local function class(name, kind)
  local c = { name = name, kind = kind }
  return setmetatable(c, { __call = function(_, opts) return new({ [kind] = true }, opts, 2) end,
                           __tostring = function() return "uvmrec.metrics." .. name end })
end

M.AUC = class("AUC", "auc")
M.GroupedAUC = class("GroupedAUC", "gauc")
M.NE = class("NE", "ne")
M.Accuracy = class("Accuracy", "accuracy")
M.Calibration = class("Calibration", "calibration")
M.CTR = class("CTR", "ctr")

-- MetricCollection{metrics = {"auc", "ne", metrics.Accuracy, ...}, tasks = ..., ...}: the
-- kinds named (by kind name or class) share one state and one update per batch.
M.MetricCollection = setmetatable({ name = "MetricCollection" }, {
  __call = function(_, opts)
    if type(opts) ~= "table" or type(opts.metrics) ~= "table" or #opts.metrics < 1 then
      error("metrics: MetricCollection needs metrics = a list of kinds or classes", 2)
    end
    local kinds = {}
    for i, k in ipairs(opts.metrics) do
      local kind = type(k) == "table" and k.kind or k
      if not KINDS[kind] then
        error(("metrics: metric %d is %s; expected one of %s or a class"):format(i, tostring(k),
          table.concat(KIND_ORDER, ", ")), 2)
      end
      kinds[kind] = true
    end
    local rest = {}
    for k, v in pairs(opts) do
      if k ~= "metrics" then rest[k] = v end
    end
    return new(kinds, rest, 2)
  end,
})

M.Metric = Metric
return M
