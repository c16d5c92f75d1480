-- Builds lua/uvmrec/planner/calib/h200.json, the planner's default calibration for GPU plans,
-- from what `uvmrec calibrate --shapes gpu` measured on one NVIDIA H200 (--measured FILE: every
-- rate kept as measured, with its source, command and date), adding what one GPU cannot
-- measure: the HBM size, the collectives (the data sheet's NVLink figure, marked not
-- measured, until `uvmrec calibrate` runs on a multi-GPU host), and the prefetch pipeline's
-- overlap from a B10 run on the same machine (its figures given below).
--
--   uvmrec calibrate --shapes gpu --out FILE            (on the H200)
--   uvmrec scripts/bench/calib_h200.lua --measured FILE [--out lua/uvmrec/planner/calib/h200.json]
local calib = require "uvmrec.planner.calib"

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/calib_h200.lua",
  summary = "build the planner's H200 calibration from uvmrec calibrate's run on the H200",
  { "--measured FILE", "the calibration `uvmrec calibrate --shapes gpu` wrote on the H200" },
  { "--out FILE", "where the calibration goes", default = "lua/uvmrec/planner/calib/h200.json" },
}
local o = cmd:parse(arg)
if not o.measured then cmd:misuse("give --measured FILE (uvmrec calibrate --shapes gpu --out FILE on the H200)") end
local m, err = calib.load(o.measured)
if not m then cmd:fail(err) end
local t = m.data
if t.backend ~= "cuda" or not tostring(t.machine):match("H200") then
  cmd:fail(("%s: machine %s, backend %s; expected a calibration measured on an NVIDIA H200 (backend cuda)"):format(
    o.measured, tostring(t.machine), tostring(t.backend)))
end
for name, r in pairs(t.rates) do
  if r.measured == false and name ~= "pipeline_overlap" then
    cmd:fail(("%s: rates.%s is not measured (%s); expected calibrate's own measurements"):format(o.measured, name,
      r.source))
  end
end
local rates = t.rates

-- ---- the prefetch pipeline's overlap: B10's cached case with and without it ----
-- dlrm_mlperf_v1_2m, every table cached at 20%, 40 timed steps (scripts/bench/planner_b10.lua,
-- 1fcc5a1, 2026-12-04, this calibration's machine): median step 6.477 ms (train.pipeline=false)
-- and 4.717 ms (true), the cache's GPU time 2.350 ms a step: the pipeline hid 1.760 ms of it (the
-- mover on 8 SMs beside the step's kernels, and no wait for the forward's bad-id flag; on
-- a718edf, 2026-12-03: 6.153, 5.985 and 2.139 ms, 0.079 of it).
local plain, piped, cache_ms = 6.477, 4.717, 2.350
rates.pipeline_overlap = { value = (plain - piped) / cache_ms, unit = "fraction", measured = true, date = "2026-12-04",
  command = "uvmrec scripts/bench/planner_b10.lua dlrm_mlperf_v1_2m --calibration h200 --cases device,cached "
            .. "--steps 40 --warmup 10 --set train.pipeline=false|true",
  source = ("B10's cached case on the H200 (1fcc5a1): median step %.3f ms without the prefetch pipeline, %.3f ms "
            .. "with it, the cache's GPU time %.3f ms a step: the share of it the pipeline hid (the mover on 8 SMs, no "
            .. "bad-id flag read after a cached forward)"):format(plain, piped, cache_ms) }

-- ---- collectives: one GPU has none ----
local NV = "not measured by uvmrec: NVIDIA H200 SXM data sheet, NVLink 900 GB/s per GPU (both directions), taken "
           .. "as 450 GB/s each way; to be replaced by `uvmrec calibrate` on a multi-GPU host"
for _, name in ipairs({ "alltoall", "allreduce", "reduce_scatter" }) do
  rates[name] = { value = 450e9, unit = "B/s", source = NV, command = "none", date = "none", measured = false }
end

local out = { format = calib.FORMAT, version = calib.VERSION, machine = "NVIDIA H200 (141 GB HBM3e, PCIe Gen5)",
              backend = "cuda", hbm_bytes = 141e9, date = t.date, commit = t.commit,
              command = "uvmrec calibrate --shapes gpu; uvmrec scripts/bench/calib_h200.lua --measured FILE",
              load_average = t.load_average, seconds = t.seconds,
              note = "uvmrec calibrate on one H200, with the data sheet's collectives and B10's pipeline overlap",
              rates = rates }
local c, cerr = calib.from_table(out, o.out)
if not c then cmd:fail(cerr) end
local f = assert(io.open(o.out, "w"))
f:write(calib.encode(out))
f:close()
local n = 0
for _ in pairs(rates) do n = n + 1 end
print(("wrote %s from %s (%s, commit %s): %d rates, pipeline_overlap %.3f, collectives from the data sheet"):format(
  o.out, o.measured, tostring(t.date), tostring(t.commit), n, rates.pipeline_overlap.value))
