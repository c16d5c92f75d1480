-- MLP benchmark: the MLPerf v1 DLRM's MLP stack (bottom 13-512-256-128, top 479-1024-1024-512-
-- 256-1, ReLU after every layer but the last), forward + backward, as a training step runs it:
-- no input gradient for the bottom MLP (its input is data), one for the top MLP (it feeds the
-- interaction's backward).
--
--   luajit scripts/bench/mlp.lua --gpu [--batch N] [--out FILE] [--torch FILE]   (make bench-gpu)
--   luajit scripts/bench/mlp.lua --cpu [--batch N] [--out FILE]                  (make bench; --help)
--
-- First a check: the same stack with the same weights on a small batch on the CPU backend (the
-- reference) and here, in each precision; a wrong answer stops the benchmark.  Then, per
-- precision (f32, TF32, bf16 with f32 master weights), the median of timed steps after a
-- warm-up, with CUDA events.  TFLOP/s count 2 * rows * in * out per product: forward, weight
-- gradient, and input gradient where one is computed; the ceiling is BENCH.md's measured bf16
-- 790 TFLOP/s.  --torch reads scripts/bench/torch_mlp.py's JSON lines for the ratio.
local ur = require "uvmrec"
local json = require "uvmrec.json"
local compare = require "uvmrec.compare"
local streams = require "uvmrec.stream"
local nn = ur.nn
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/mlp.lua",
  summary = "MLP benchmark: the MLPerf v1 DLRM's MLP stack, forward + backward, per precision",
  { "--gpu", "on the GPU (the default where a GPU is in use)" },
  { "--cpu", "on the CPU" },
  { "--batch N", "rows a batch (default: 65536 on the GPU, 2048 on the CPU)", type = "whole" },
  { "--runs N", "timed steps (default: 30 on the GPU, 3 on the CPU)", type = "whole" },
  options.out,
  { "--torch FILE", "scripts/bench/torch_mlp.py's JSON lines, for the ratio to PyTorch" },
  mutex = { { "--gpu", "--cpu" } },
}
local args = cmd:parse(arg)
args.mode = cmd:mode(args)

local GPU = args.mode == "gpu"
local BATCH = args.batch or (GPU and 65536 or 2048)
local RUNS = args.runs or (GPU and 30 or 3)
local WARM = GPU and 5 or 1
local CEILING = 790 -- TFLOP/s, bf16 matrix products on one H200 (BENCH.md)
local BOTTOM = { 13, 512, 256, 128 }
local TOP = { 479, 1024, 1024, 512, 256, 1 }
local PLACE = GPU and "device" or "host"

local function stack(place, precision)
  nn.Module.manual_seed(2024)
  local bottom = nn.MLP(BOTTOM, { input_grad = false })
  local top = nn.MLP(TOP, { last = "none" })
  for _, m in ipairs { bottom, top } do
    assert(m:to(place))
    assert(m:set_precision(precision))
  end
  return bottom, top
end

-- A batch as a training step sees it: dense features in f32 (from the loader), the top MLP's
-- input and the gradients arriving from above in the precision's activation dtype.
local function data(rows, place, act, seed)
  local function t(shape, dtype, s)
    local h = ur.tensor(shape, { dtype = dtype }):uniform(-1, 1, seed + s)
    return place == "host" and h or assert(h:to(place))
  end
  return { xb = t({ rows, BOTTOM[1] }, "f32", 1), xt = t({ rows, TOP[1] }, act, 2),
           gb = t({ rows, BOTTOM[#BOTTOM] }, act, 3), gt = t({ rows, 1 }, act, 4) }
end

local function step(bottom, top, d)
  bottom:forward(d.xb)
  top:forward(d.xt)
  top:backward(d.xt, d.gt)
  bottom:backward(d.xb, d.gb)
end

-- Outputs are compared element by element (maxrel); gradients as whole tensors (normrel):
-- where a pre-activation lies within rounding of zero, the two backends' ReLU masks may differ
-- and that one element by a whole gradient value.
local maxrel, normrel = compare.maxrel, compare.normrel

-- The check: outputs, the top MLP's input gradient and every weight gradient, here against
-- the CPU backend, on 512 rows.
local function check(precision)
  local act = precision == "bf16" and "bf16" or "f32"
  local results, names = {}, nil
  for _, place in ipairs { "host", PLACE } do
    local bottom, top = stack(place, precision)
    local d = data(512, place, act, 7)
    step(bottom, top, d)
    local vals = { bottom.output:totable(), top.output:totable(), top.gradInput:totable() }
    names = { "bottom output", "top output", "top input gradient" }
    for k, m in ipairs { bottom, top } do
      for _, p in ipairs(m:parameters()) do
        vals[#vals + 1] = p.grad:totable()
        names[#names + 1] = (k == 1 and "bottom " or "top ") .. p.name .. " gradient"
      end
    end
    results[#results + 1] = vals
    if not GPU then break end
  end
  if not GPU then return 0 end
  -- Outputs: f32 sums in another order; TF32 and bf16 round their inputs.  Gradients: ReLU
  -- mask elements may differ (see normrel): a handful in f32, hundreds where a bf16 rounding
  -- step (or TF32, which the CPU computes as f32) moves the pre-activations near zero.  The
  -- exact per-op parity is the #cuda specs'; this guards against a grossly wrong step.
  local tol_out = ({ f32 = 1e-4, tf32 = 2e-2, bf16 = 5e-2 })[precision]
  local tol_grad = ({ f32 = 2e-2, tf32 = 1.5e-1, bf16 = 2.5e-1 })[precision]
  local worst, where = 0, nil
  for i = 1, #results[1] do
    local d = (i <= 2 and maxrel or normrel)(results[2][i], results[1][i]) / (i <= 2 and tol_out or tol_grad)
    if d > worst then worst, where = d, names[i] end
  end
  if worst > 1 then
    io.stderr:write(("mlp bench: %s %s differs from the CPU backend's by %.3g of its tolerance\n")
      :format(precision, where, worst))
    for i = 1, #results[1] do
      io.stderr:write(("  %-28s max %.3g  norm %.3g\n"):format(names[i], maxrel(results[2][i], results[1][i]),
        normrel(results[2][i], results[1][i])))
    end
    if os.getenv("UR_MLP_CHECK") ~= "warn" then os.exit(1) end
  end
  return worst
end

local function flops(rows)
  local f = 0
  for _, sizes in ipairs { BOTTOM, TOP } do
    for l = 1, #sizes - 1 do
      local mm = 2 * rows * sizes[l] * sizes[l + 1]
      local input_grad = not (sizes == BOTTOM and l == 1)
      f = f + mm * (input_grad and 3 or 2)
    end
  end
  return f
end

local function time(precision)
  local bottom, top = stack(PLACE, precision)
  local d = data(BATCH, PLACE, precision == "bf16" and "bf16" or "f32", 11)
  for _ = 1, WARM do step(bottom, top, d) end
  ur.sync()
  return (streams.median_ms(function() step(bottom, top, d) end, RUNS))
end

-- scripts/bench/torch_mlp.py's lines: ms by precision (none when the file is not there).
local function read_torch(path)
  local out = {}
  if not path then return out end
  local recs, err = json.read_lines(path)
  if not recs then io.stderr:write(cmd.prog, ": --torch: ", err, "; the ratios are left out\n") end
  for _, r in ipairs(recs or {}) do
    if r.precision and r.ms then out[r.precision] = r.ms end
  end
  return out
end

local precisions = GPU and { "f32", "tf32", "bf16" } or { "f32", "bf16" }
local torch = read_torch(args.torch)
local out = json.lines(args.out)
local f = flops(BATCH)
print(("MLP stack %s + %s, batch %d, forward + backward, %s (%s)"):format(
  table.concat(BOTTOM, "-"), table.concat(TOP, "-"), BATCH, GPU and "GPU" or "CPU",
  GPU and assert(ur.device_props(0)).name or "OpenBLAS"))
print(("%.1f GFLOP per step"):format(f / 1e9))
print(("%-6s %12s %10s %10s %12s %10s"):format("math", "check/tol", "ms", "TFLOP/s", "of bf16 peak", "vs torch"))
for _, p in ipairs(precisions) do
  local worst = check(p)
  local ms = time(p)
  local tf = f / (ms * 1e-3) / 1e12
  local ratio = torch[p] and torch[p] / ms or nil
  print(("%-6s %12s %10.3f %10.3f %11.2f%% %10s"):format(p, GPU and ("%.1e"):format(worst) or "-", ms, tf,
    100 * tf / CEILING, ratio and ("%.2fx"):format(ratio) or "-"))
  out:write { bench = "mlp", mode = args.mode, precision = p, batch = BATCH, ms = ms, tflops = tf,
    ceiling_tflops = CEILING, check_max_rel = worst, torch_ms = torch[p] }
end
out:close()
