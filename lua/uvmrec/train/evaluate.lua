-- Evaluation on held-out data: the model's probabilities for every batch go into one metric
-- collection where the model runs; AUC is exact over the whole set (the window holds it all)
-- when its size is known, else the lifetime histogram's (within its stated error).  One class
-- leaves the AUC (and NE, and without positives calibration) undefined: it is then nil,
-- <name>_undefined says why, the line says so and the run log holds null.
local metrics = require "uvmrec.metrics"
local json = require "uvmrec.json"
local lib = require "uvmrec.lib"

local M = {}

-- source: next() gives batches (uvmrec.train.source); opts: metrics (kinds, default auc and
-- ne), samples (the set's size, or at most this many; 0 or nil: until the data ends),
-- batch_size, comm (a job of several ranks: the source gives this rank's equal slices of the global
-- batches, samples and batch_size count the global ones, and the metrics are over every rank's
-- samples).  Returns {auc =, ne =, logloss =, accuracy =, calibration =, ctr =, samples =,
-- asked = (samples, when the data ended before them), auc_error =, seconds =}, each metric only
-- when its kind was asked for (logloss with ne); an
-- AUC, NE or calibration asked for that one class leaves undefined is nil, and auc_undefined (...)
-- says why.
function M.run(model, source, opts)
  opts = opts or {}
  local C = require("uvmrec").C
  local t0 = C.ur_clock_seconds()
  local comm = opts.comm
  local W = comm and comm.world or 1
  local limit = opts.samples or 0
  local per_update = math.ceil((opts.batch_size or 16384) / W)
  local kinds = opts.metrics or { "auc", "ne" }
  for _, k in ipairs(kinds) do
    -- the batches' groups never reach the metric: refused before the data is read
    if k == "gauc" then
      return nil, "evaluate: metric 'gauc' needs each sample's group, which held-out evaluation does not "
        .. "pass; expected auc, ne, accuracy, calibration or ctr"
    end
  end
  -- The metric state lives where the model's predictions are (made at the first batch).
  local m
  local function collection(predictions)
    local p = predictions:placement()
    return metrics.MetricCollection { metrics = kinds, batch_size = per_update, include_logloss = true,
                                      placement = (p == "device" or p == "managed") and "device" or "host",
                                      device = predictions:device() >= 0 and predictions:device() or nil,
                                      window_size = limit > 0 and math.ceil(limit / W) + per_update or 0,
                                      world_size = W > 1 and W or nil, rank = W > 1 and comm.rank or nil,
                                      comm = W > 1 and comm or nil }
  end
  model:evaluate()
  -- The set is the data's first `samples` (all of it: 0), whatever the ranks.  A global batch
  -- is W equal slices (the loader's even_slices), so a slice of `size` samples comes from a global
  -- batch of size * W that ends at its `next`; each rank scores the samples of its slice inside
  -- the set (a slice past its end, none), and every rank stops after the same global batch.
  -- (Every rank scored its whole slice of the batch the set ended in: the first 600 rows of a
  -- file in global batches of 400 on 2 ranks scored 800, an AUC one process does not give.)
  local pos0, all = nil, 0
  while limit == 0 or all < limit do
    local batch, err = source:next()
    if err then
      model:training()
      return nil, err
    end
    if not batch then break end
    local predictions, labels = model:predict(batch), batch.labels
    m = m or collection(predictions)
    local gfirst = batch.next and batch.next - batch.size * W or (pos0 or 0) + all
    pos0 = pos0 or gfirst
    local n = batch.size
    if limit > 0 then n = math.max(0, math.min(n, limit - ((batch.first or gfirst) - pos0))) end
    if n < batch.size then predictions, labels = predictions:view(0, n), labels:view(0, n) end
    if n > 0 then assert(m:update { predictions = predictions, labels = labels }) end
    all = gfirst + batch.size * W - pos0
  end
  model:training()
  if not m then return nil, "evaluate: the held-out data gave no batch" end
  local v = assert(m:values()).default
  local scope = limit > 0 and v.window or v.lifetime
  m:free()
  local out = { samples = limit > 0 and math.min(all, limit) or all, asked = limit > 0 and all < limit and limit or nil,
                seconds = C.ur_clock_seconds() - t0 }
  M.take(out, scope, kinds)
  if limit == 0 and out.auc then out.auc_error = v.lifetime.auc_error end
  return out
end

-- Copies the kinds asked for from a values() scope of uvmrec.metrics into r (logloss with ne),
-- an undefined one as <kind>_undefined, its reason in the held-out samples' words.
function M.take(r, scope, kinds)
  local undefined = metrics.undefined(scope, "held-out label")
  -- the kinds asked for alone: a kind not computed reads 0 (an AUC of 0 is no AUC)
  for _, k in ipairs(kinds or { "auc", "ne" }) do
    r[k] = scope[k]
    if r[k] == nil then r[k .. "_undefined"] = undefined[k] end
    if k == "ne" then r.logloss = scope.logloss end
  end
  return r
end

-- The samples a result scored, as its lines say them: "300 samples", or with r.asked (more
-- than the data held) "300 samples: the held-out data ends before the 1000 of eval.samples"
-- (a file shorter than eval.samples was scored whole and said as a count alone).
function M.count(r)
  local n = lib.things(r.samples, "sample")
  if not r.asked then return n end
  return ("%s: the held-out data ends before the %.0f of eval.samples"):format(n, r.asked)
end

local UNDEFINED = { "auc", "ne", "calibration" } -- what metrics.undefined may leave out

-- The run log's line of a result (metrics.jsonl): fields, then r's values, each undefined one
-- (auc, ne, calibration) as null beside its <name>_undefined reason (a line without auc would
-- read as a run that asked for none).
function M.log_line(r, fields)
  local line = {}
  for k, v in pairs(fields or {}) do line[k] = v end
  for k, v in pairs(r) do line[k] = v end
  for _, k in ipairs(UNDEFINED) do
    if r[k .. "_undefined"] then line[k] = json.null end
  end
  return line
end

-- "AUC 0.8830  NE 0.629  logloss 0.3891 ..." of the kinds asked for.
function M.format(r, kinds)
  local want = {}
  for _, k in ipairs(kinds or { "auc", "ne" }) do want[k] = true end
  local parts = {}
  local function value(name, fmt, k)
    parts[#parts + 1] = r[k] and (name .. " " .. fmt):format(r[k])
                        or ("%s undefined (%s)"):format(name, r[k .. "_undefined"] or "one class")
  end
  if want.auc then value("AUC", "%.4f", "auc") end
  if want.ne then
    value("NE", "%.4f", "ne")
    parts[#parts + 1] = ("logloss %.4f"):format(r.logloss)
  end
  if want.accuracy then parts[#parts + 1] = ("accuracy %.4f"):format(r.accuracy) end
  if want.calibration then value("calibration", "%.3f", "calibration") end
  if want.ctr then parts[#parts + 1] = ("CTR %.4f"):format(r.ctr) end
  return table.concat(parts, "  ")
end

return M
