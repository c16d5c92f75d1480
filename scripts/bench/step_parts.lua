-- A DLRM training step's parts, measured: the wall time of the bottom MLP, the embeddings, the
-- interaction and the top MLP (forward and backward each), the loss and the dense optimizer's
-- step, over --steps steps after --warmup, each part's fastest and median, against the
-- planner's predicted terms for the same config (B10's breakdown: which cost term is off).
-- On the CPU backend every call returns when its work is done, so a part's wall time is its
-- work's; on a GPU the device is synchronized around each part (slower than a real step).
--   uvmrec scripts/bench/step_parts.lua dlrm_tiny --cpu [--calibration FILE] [--set K=V]
local ur = require "uvmrec"
local train = require "uvmrec.train"
local planner = require "uvmrec.planner"
local clock = ur.C.ur_clock_seconds
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/step_parts.lua",
  summary = "a DLRM step's parts measured against the planner's predicted terms",
  { "CONFIG", "a config or preset (dlrm_tiny, dlrm_kaggle)" },
  { "--calibration C", "h200, cpu or a calibration file (default: cpu under --cpu, else h200)" },
  { "--steps N", "timed steps", type = "whole", default = 20 },
  { "--warmup N", "steps before the timing", type = "whole", default = 3 },
  options.set,
  options.cpu,
}
local o = cmd:parse(arg)
local path, ferr = train.find_config(o.config)
if not path then cmd:misuse(ferr) end
local gpu = ur.gpu() and not o.cpu
local cfg, cerr = train.config.load(path, o.set)
if not cfg then cmd:fail(cerr) end
local cal = planner.calib.find(o.calibration or (gpu and "h200" or "cpu"))
if not cal then cmd:misuse("--calibration: not found") end

local def = assert(train.model_def(cfg, path))
local model = def.build(cfg, { cpu = not gpu })
local opt = train.optimizer(cfg, model)
if not model.bottom or not model.embeddings or not model.interaction or not model.top then
  cmd:fail(o.config .. ": not a DLRM (bottom, embeddings, interaction, top)")
end
local data = assert(train.data(cfg, train.config.table_rows(cfg)))
local lo = {}
for k, v in pairs(data.train) do lo[k] = v end
local B = cfg.train.batch_size
lo.samples = B * (o.warmup + o.steps)
local loader = assert(ur.data.loader(lo))
local batches = {}
for k = 1, o.warmup + o.steps do batches[k] = assert(loader:next()):to(gpu and "device" or "host") end
loader:close()

local function sync() if gpu then ur.sync() end end
local times, timing = {}, false
local function wrap(obj, method, part)
  local f = obj[method]
  times[part] = {}
  obj[method] = function(...)
    if not timing then return f(...) end
    sync()
    local t0 = clock()
    local a, b = f(...)
    sync()
    local s = times[part]
    s[#s + 1] = clock() - t0
    return a, b
  end
end
-- train.loop.parts' names as this table shows them
local shown = { bottom = "bottom MLP", top = "top MLP", criterion = "loss" }
for _, p in ipairs(train.loop.parts(model, opt)) do
  local module, way = p[1]:match("^(%a+)_(%a+)$")
  wrap(p[2], p[3], module and ((shown[module] or module) .. (way == "forward" and " fwd" or " bwd")) or p[1])
end
local steps = {}
for k, b in ipairs(batches) do
  timing = k > o.warmup
  sync()
  local t0 = clock()
  train.loop.step(model, opt, b):get(0)
  sync()
  if timing then steps[#steps + 1] = clock() - t0 end
end

local function stat(s)
  local c = {}
  for k, v in ipairs(s) do c[k] = v end
  table.sort(c)
  local sum = 0
  for _, v in ipairs(c) do sum = sum + v end
  return c[1] or 0, c[math.floor((#c + 1) / 2)] or 0, #c > 0 and sum / #c or 0
end
-- the planner's terms for this config as it is (every table where the config puts it); no
-- loader term: the batches here are made before the timing
local prob = assert(planner.from_config(cfg))
local p = assert(planner.evaluate(prob.tables, prob.profiles, 2 ^ 50, { world = 1, batch = prob.batch,
  calibration = cal, dense = prob.dense, pipeline = cfg.train.pipeline, depth = cfg.data.depth,
  hints_every = prob.hints_every }, {}))
local pd = p.data
local d = pd.dense or {}
local load = require("uvmrec.cli").load_average() or "?"
print(("%s, batch %d, %s: %d warm-up + %d timed steps, load average %s, calibration %s"):format(o.config, B,
  gpu and "GPU" or "CPU", o.warmup, o.steps, load, cal.where))
print(("%-20s %10s %10s %10s"):format("part", "fastest ms", "median ms", "mean ms"))
local sum_fast, sum_med = {}, {}
for _, name in ipairs({ "bottom MLP fwd", "bottom MLP bwd", "embeddings fwd", "embeddings bwd", "interaction fwd",
                        "interaction bwd", "top MLP fwd", "top MLP bwd", "loss fwd", "loss bwd", "optimizer" }) do
  local a, m, mean = stat(times[name])
  print(("%-20s %10.3f %10.3f %10.3f"):format(name, a * 1e3, m * 1e3, mean * 1e3))
  local g = name:match("^(%a+)") == "bottom" and "mlp" or name:match("^top") and "mlp" or name:match("^(%a+)")
  sum_fast[g], sum_med[g] = (sum_fast[g] or 0) + a, (sum_med[g] or 0) + m
end
local a, m, mean = stat(steps)
print(("%-20s %10.3f %10.3f %10.3f"):format("whole step", a * 1e3, m * 1e3, mean * 1e3))
print(("\n%-14s %12s %16s %16s"):format("term", "predicted ms", "measured fastest", "measured median"))
local rows = {
  { "MLPs", d.mlp, sum_fast.mlp, sum_med.mlp },
  { "interaction", d.interaction, sum_fast.interaction, sum_med.interaction },
  { "embeddings", pd.embedding_seconds, sum_fast.embeddings, sum_med.embeddings },
  { "optimizer", d.optimizer, sum_fast.optimizer, sum_med.optimizer },
  { "rest", d.fixed, select(1, stat(steps)) - (sum_fast.mlp + sum_fast.interaction + sum_fast.embeddings
    + sum_fast.optimizer), nil },
  { "step", pd.step_seconds, a, m },
}
for _, r in ipairs(rows) do
  print(("%-14s %12.3f %16.3f %16s"):format(r[1], (r[2] or 0) * 1e3, (r[3] or 0) * 1e3,
    r[4] and ("%.3f"):format(r[4] * 1e3) or "-"))
end
