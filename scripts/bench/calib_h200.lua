-- Builds lua/uvmrec/planner/calib/h200.json, the planner's H200 calibration, from figures the
-- project measured on one NVIDIA H200 (BENCH.md's ceilings, README.md's H200 tables), each cited
-- with its source, command and date; rates the figures do not give directly are derived here
-- by the cost model's own formulas (docs/planner.md), with the derivation in the source text.
-- Until `uvmrec calibrate` runs on the H200 itself, this is the default calibration for GPU plans.
--
--   uvmrec scripts/bench/calib_h200.lua [--out lua/uvmrec/planner/calib/h200.json]
local profile = require "uvmrec.planner.profile"
local calib = require "uvmrec.planner.calib"

local out = require("uvmrec.cli").command {
  name = "scripts/bench/calib_h200.lua",
  summary = "build the planner's H200 calibration from the figures the project measured there",
  { "--out FILE", "where the calibration goes", default = "lua/uvmrec/planner/calib/h200.json" },
}:parse(arg).out

local DAY = "2026-11-29"
local BENCH = "BENCH.md, table 'Ceilings measured on one NVIDIA H200' (no command or date recorded there)"
local TBE = "README.md 'Embedding collections', H200 table (make bench-gpu, " .. DAY .. "): 26 tables x 645,277 rows "
            .. "x 128 f32, batch 65536, one id per bag"
local rates = {}
local function rate(name, value, unit, source, command, date, measured)
  rates[name] = { value = value, unit = unit, source = source, command = command, date = date,
                  measured = measured ~= false }
end

-- ---- HBM ----
local GC = 4228e9
rate("hbm_copy", GC, "B/s", "README.md 'Against PyTorch': the measured copy ceiling of the speed run "
     .. "(BENCH.md's table: 4250 GB/s, read + written bytes)", "OUT=dir UVMREC=dist/bin/uvmrec bash "
     .. "scripts/bench/torch_compare.sh", DAY)

-- The TBE forward of scripts/bench/tbe.lua: uniform ids and Zipf(1.05) ids (the continuous
-- inverse CDF over rows - 1 ranks, scattered).  Forward = U rb / G + (L - U) rb / Gr + out / Gc:
-- two cases, two unknowns once the outputs' write is taken at the copy rate.
local ROWS, B, T, RB = math.floor(8 * 2 ^ 30 / 26 / (128 * 4)), 65536, 26, 512
local L = T * B
local Uu = T * profile.zipf { rows = ROWS, s = 0 }:distinct(B)
local Uz = T * profile.zipf { rows = ROWS - 1, s = 1.05, variant = "continuous" }:distinct(B)
local OUT = T * B * 128 * 4
local fu, fz = 0.469e-3 - OUT / GC, 0.380e-3 - OUT / GC
local a1, b1, a2, b2 = Uu * RB, (L - Uu) * RB, Uz * RB, (L - Uz) * RB
local det = a1 * b2 - a2 * b1
local x, y = (fu * b2 - fz * b1) / det, (a1 * fz - a2 * fu) / det
local G, Gr = 1 / x, 1 / y
rate("hbm_gather", G, "B/s", ("%s: forward 0.469 ms (uniform ids) and 0.380 ms (Zipf 1.05); with the planner's "
     .. "distinct rows per batch (%.0f and %.0f of %d ids) and the outputs' write at hbm_copy, the forward model "
     .. "U x 512 / G + (L - U) x 512 / G_repeat + outputs / hbm_copy solved for both rates (BENCH.md's plain "
     .. "gather: 1840 GB/s of rows, 3700 GB/s all bytes)"):format(TBE, Uu, Uz, L), "make bench-gpu", DAY)
rate("hbm_gather_repeat", Gr, "B/s", "derived with hbm_gather from the same two forwards (rows read again in a "
     .. "batch: Zipf's hot rows, served by L2)", "make bench-gpu", DAY)

-- ---- host link ----
rate("host_to_device", 55e9, "B/s", BENCH .. ": host to device, pinned, 1 GiB (README's UVM table: prefetch of "
     .. "4 GiB managed at 47.9-49.1 GB/s)", "not recorded", "not recorded")
rate("device_to_host", 55e9, "B/s", BENCH .. ": device to host, pinned, 1 GiB", "not recorded", "not recorded")
-- in-place reads through the TBE forward: 17.1 ms for both pinned and managed (host, accessed-by)
local f_host = 17.1e-3
local Gz = Uu * RB / (f_host - OUT / GC - (L - Uu) * RB / Gr)
rate("zero_copy_gather", Gz, "B/s", ("%s: forward of pinned host tables read in place, uniform ids, 17.1 ms; the "
     .. "distinct rows' bytes over what is left of the forward model (BENCH.md's plain gather kernel: 17 GB/s "
     .. "random, 30 Zipf)"):format(TBE), "make bench-gpu", DAY)
rate("managed_gather", Gz, "B/s", ("%s: forward of managed tables (preferred on the host, accessed by the GPU), "
     .. "uniform ids, 17.1 ms, the same as pinned; derived as zero_copy_gather (BENCH.md's plain gather: 51 GB/s "
     .. "random, 67 Zipf)"):format(TBE), "make bench-gpu", DAY)

-- ---- the fused backward: bwd = L kb + U x 512 / Gu + outputs' gradient / hbm_copy, least squares ----
local cases = {
  { L = L, U = Uu, fb = 2.10e-3 - 0.469e-3 },
  { L = L, U = Uz, fb = 1.34e-3 - 0.380e-3 },
  { L = 20 * L, U = T * profile.zipf { rows = ROWS, s = 0 }:distinct(20 * B), fb = 20.4e-3 - 4.55e-3 },
}
-- fb - OUT/GC = kb L + v (U RB), v = 1 / Gu
local A, yb = {}, {}
for i, c in ipairs(cases) do A[i], yb[i] = { c.L, c.U * RB }, c.fb - OUT / GC end
local fitted = calib.fit(A, yb)
local kb, v = fitted[1], fitted[2]
local Gu = 1 / v
local fits = {}
for i, c in ipairs(cases) do
  fits[i] = ("%.2f ms for %.2f"):format(1e3 * (kb * c.L + c.U * RB * v + OUT / GC), 1e3 * c.fb)
end
local BWD = ("%s: forward + SGD minus forward (1-hot uniform 2.10 - 0.469 ms, 1-hot Zipf 1.34 - 0.380, 20-hot "
     .. "uniform 20.4 - 4.55); bwd = L x per_id + U x 512 / hbm_update + outputs' gradient / hbm_copy fitted by "
     .. "least squares (the fit gives %s)"):format(TBE, table.concat(fits, ", "))
rate("tbe_backward_per_id", kb, "s", BWD .. ".  In the B3 training step (README 'Against PyTorch') the embeddings' "
     .. "backward took 2.78 ms (bf16 run) and 1.63 ms (TF32) for 1.7 M ids: above this model", "make bench-gpu", DAY)
rate("hbm_update", Gu, "B/s", "fitted with tbe_backward_per_id: " .. BWD, "make bench-gpu", DAY)

-- updates in place over the link: not in the project's figures
local ASSUMED = "not measured on the H200 (the bench's managed and pinned backward rows are not in README.md): "
                .. "assumed half the read rate, read and write each crossing the link"
rate("zero_copy_update", Gz / 2, "B/s", ASSUMED, "none", "none", false)
rate("managed_update", Gz / 2, "B/s", ASSUMED, "none", "none", false)

-- ---- the software cache ----
rate("cache_per_id", 1.23e-3 / L, "s", "README.md 'Software cache': decisions on the GPU, 26 tables of 1 M rows, "
     .. "65536 samples, Zipf(1.05), cache 20% LRU: 1.23 ms a batch of 1.70 M ids (5%: 2.02 ms)",
     "uvmrec scripts/bench/cache_decide.lua", DAY)
rate("cache_row_fixed", 0, "s", "not separated on the H200 (cache_move carries the whole per-row cost)",
     "none", "none", false)
rate("cache_move", 119.6e6 / (3.02e-3 - 1.23e-3), "B/s", "README.md B4 on the H200: cached 20% + pipeline, the "
     .. "cache's GPU time 3.02 ms a step of which decisions 1.23 ms (cache_decide), 119.6 MB a step moved each "
     .. "way in all: bytes / (3.02 - 1.23) ms", "uvmrec scripts/bench/cache.lua --gpu --steps 40", DAY)
rate("pipeline_overlap", 1 - (12.37 - 10.49) / (12.60 - 10.49), "fraction", "README.md B4 on the H200: all in HBM "
     .. "10.49 ms a step, cached 20% plain loop 12.60 ms, with the prefetch pipeline 12.37 ms: the share of the "
     .. "plain loop's extra time the pipeline hid", "uvmrec scripts/bench/cache.lua --gpu --steps 40", DAY)

-- ---- dense ----
local MLP = "README.md 'Dense ops and nn modules', MLP benchmark: the MLPerf v1 DLRM MLP stack (13-512-256-128 and "
            .. "479-1024-1024-512-256-1) forward + backward at batch 65536, medians of 15 steps"
rate("mlp_f32", 46.1e12, "FLOP/s", MLP .. ": f32 20.14 ms", "luajit scripts/bench/mlp.lua --gpu (make bench-gpu)",
     "not recorded in README.md")
rate("mlp_tf32", 156.1e12, "FLOP/s", MLP .. ": TF32 5.95 ms", "luajit scripts/bench/mlp.lua --gpu (make bench-gpu)",
     "not recorded in README.md")
rate("mlp_bf16", 230.7e12, "FLOP/s", MLP .. ": bf16 4.03 ms (8192^3 bf16 product: about 790 TFLOP/s, BENCH.md)",
     "luajit scripts/bench/mlp.lua --gpu (make bench-gpu)", "not recorded in README.md")
rate("interaction_dot", 6 * B * (27 * 26 / 2) * 128 / (0.156e-3 + 0.417e-3), "FLOP/s", "docs/results.md, the "
     .. "eleventh session's call 8 (a5e1592): the bf16 B3 step's dot interaction alone on mma.sync, forward 0.156 ms "
     .. "+ backward 0.417 ms at batch 65536 over 27 vectors of 128: 6 x batch x 351 x 128 FLOPs over 0.573 ms",
     "uvmrec scripts/bench/dlrm_speed.lua --precisions bf16 --no-torch --steps 30", "2026-12-03")

-- ---- a step's fixed cost: dlrm_kaggle at batch 128 is bound by launches ----
rate("step_overhead", 128 / 101.6e3, "s", "README.md 'Against PyTorch', training parity on the GPU: dlrm_kaggle at "
     .. "batch 128 trained at 101.6 k samples/s ('both bound by launches'), 1.26 ms a step, taken whole as the "
     .. "fixed cost (its work is a few microseconds by this model)", "uvmrec scripts/bench/train_parity.lua "
     .. "(torch_compare.sh)", DAY)

-- ---- collectives: not measured yet ----
local NV = "not measured by uvmrec: NVIDIA H200 SXM data sheet, NVLink 900 GB/s per GPU (both directions), taken "
           .. "as 450 GB/s each way; to be replaced by `uvmrec calibrate` on a multi-GPU host"
rate("alltoall", 450e9, "B/s", NV, "none", "none", false)
rate("allreduce", 450e9, "B/s", NV, "none", "none", false)
rate("reduce_scatter", 450e9, "B/s", NV, "none", "none", false)

local t = { format = calib.FORMAT, version = calib.VERSION, machine = "NVIDIA H200 (141 GB HBM3e, PCIe Gen5)",
            backend = "cuda", hbm_bytes = 141e9, date = DAY, command = "uvmrec scripts/bench/calib_h200.lua",
            note = "figures of the project's H200 runs; derived rates use the planner's own model (docs/planner.md)",
            rates = rates }
assert(calib.from_table(t, out))
local f = assert(io.open(out, "w"))
f:write(calib.encode(t))
f:close()
print(("wrote %s: hbm_gather %.0f GB/s, repeat %.0f GB/s, update %.0f GB/s, zero-copy/managed %.1f GB/s, "
       .. "backward %.3f ns/id, cache %.3f ns/id, cache move %.1f GB/s, overlap %.3f, interaction %.2f TFLOP/s"):format(
       out, G / 1e9, Gr / 1e9, Gu / 1e9, Gz / 1e9, kb * 1e9, 1.23e-3 / L * 1e9, 119.6e6 / (3.02e-3 - 1.23e-3) / 1e9,
       1 - (12.37 - 10.49) / (12.60 - 10.49), rates.interaction_dot.value / 1e12))
