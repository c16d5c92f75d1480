-- The planner's predictions for the B3/B4 configurations measured on the H200 (README.md, 2026-11-29),
-- beside those measurements: dlrm_mlperf_v1_2m at batch 65536, bf16 MLPs, every table in HBM, every table
-- cached at load factor 0.2 (plain loop and prefetch pipeline), managed with a 20% hot prefix, and managed
-- with nothing on the GPU (the `host` hint policy).  Profiles: the preset's Zipf(1.05).  A check of the H200
-- calibration against the runs it was not fitted to, before B10's own runs on the GPU.
--   uvmrec scripts/bench/planner_b4.lua [--calibration h200]
local planner = require "uvmrec.planner"
local train = require "uvmrec.train"

local o = require("uvmrec.cli").command {
  name = "scripts/bench/planner_b4.lua",
  summary = "the planner's predicted steps for the B3/B4 configurations beside the H200's measured ones",
  { "--calibration C", "h200, cpu or a calibration file", default = "h200" },
}:parse(arg)
local cal = assert(planner.calib.find(o.calibration))
local path = assert(train.find_config("dlrm_mlperf_v1_2m"))
local cfg = assert(train.config.load(path, {}))
local rows = train.config.table_rows(cfg)
local tables, profiles = {}, {}
for i, r in ipairs(rows) do
  tables[i] = { name = "C" .. i, rows = r, dim = cfg.embeddings.dim, optimizer = "sgd" }
  profiles["C" .. i] = planner.profile.zipf { rows = r, s = 1.05 }
end
local m = cfg.model
local dense = { dense_features = m.dense_features, bottom = m.bottom_mlp, top = m.top_mlp, tables = #rows,
                dim = cfg.embeddings.dim, precision = m.precision, optimizer = "sgd" }
local cases = {
  { "all in HBM (device)", { placement = "device" }, false, 10.49, "cache.lua --gpu, device" },
  { "cached 0.2, plain loop", { placement = "cached", load_factor = 0.2 }, false, 12.60, "cache.lua --gpu" },
  { "cached 0.2 + pipeline", { placement = "cached", load_factor = 0.2 }, true, 12.37, "cache.lua --gpu" },
  { "managed, 20% hot prefix", { placement = "managed", prefix_fraction = 0.2 }, false, 11.56,
    "uvm.lua (cache.lua: 12.82)" },
  { "managed, nothing on the GPU", { placement = "managed", prefix_fraction = 0 }, false, 20.47,
    "uvm.lua, host policy" },
}
print(("planner against the H200's B3/B4 runs (calibration %s)"):format(cal.where))
print(("%-30s %12s %12s %8s   %s"):format("case", "predicted ms", "measured ms", "ratio", "measured by"))
for _, c in ipairs(cases) do
  local choices = {}
  for i = 1, #tables do choices[i] = c[2] end
  local p = assert(planner.evaluate(tables, profiles, "1TiB", { batch = 65536, calibration = cal, dense = dense,
    pipeline = c[3] }, choices))
  local ms = p.data.step_seconds * 1e3
  print(("%-30s %12.2f %12.2f %8.2f   %s"):format(c[1], ms, c[4], ms / c[4], c[5]))
end
