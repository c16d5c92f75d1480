-- Where TF32 runs on the GPU part from the CPU's exact f32 (issue #24's open question), on one
-- GPU.  Three measurements, printed as one table:
--   1. how the GPU's TF32 products round their inputs: a product whose inputs need rounding to
--      TF32's 10-bit mantissa, read back (truncated, rounded to nearest, or exact);
--   2. dense_cuda_spec's MLP chain (61-96-48-1 at 300 rows, padded, ReLUs): the ReLU units the
--      GPU passes otherwise than the CPU, per layer, with the largest |output| among them; the
--      input gradient's difference in norm with the CPU's outputs (what the spec checks) and
--      with the GPU's ReLU outputs copied into the CPU's backward; and the GPU's own TF32 against its
--      own f32 (what TF32 alone does);
--   3. train_cuda_spec's dlrm_tiny run, 8 steps: the losses of GPU f32 / TF32 / bf16 against the
--      CPU's, and GPU TF32 against GPU f32.
--   uvmrec scripts/bench/tf32_check.lua      (needs a GPU; spec/support on the package path)
local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/tf32_check.lua",
  summary = "where TF32 on the GPU parts from the CPU's exact f32: the products' input rounding, the ReLU units "
    .. "set otherwise, the gradients with either backend's ReLU outputs, dlrm_tiny's losses (needs a GPU)",
}
cmd:parse(arg)
package.path = "spec/support/?.lua;" .. package.path
local ur = require "uvmrec"
local dense = ur.dense
local R = require "dense_ref"
local helpers = require "helpers"
local compare = require "uvmrec.compare"

if not ur.gpu() then cmd:fail("needs a GPU: " .. ur.cuda_error(), 2) end
local rows_out = {}
local function row(what, value) rows_out[#rows_out + 1] = { what, value } end

-- 1. rounding of a TF32 product's inputs: x[:, 0] = 1 + 2^-11 + 2^-13, w[:, 0] = 1, the rest 0
do
  local n = 256
  local xv, wv = {}, {}
  local v = 1 + 2 ^ -11 + 2 ^ -13
  for r = 0, n - 1 do
    for c = 0, n - 1 do
      xv[r * n + c + 1] = c == 0 and v or 0
      wv[r * n + c + 1] = c == 0 and 1 or 0
    end
  end
  local x, w = R.tensor({ n, n }, xv, { placement = "device" }), R.tensor({ n, n }, wv, { placement = "device" })
  local y = R.zeros({ n, n }, { placement = "device" })
  dense.linear_forward(x, w, nil, y, "none", dense.TF32)
  local got = y:totable()[1]
  local kind = got == 1 and "truncated" or got == 1 + 2 ^ -10 and "rounded to nearest"
               or got == v and "exact f32" or ("other (%.10g)"):format(got)
  row("TF32 input 1+2^-11+2^-13 becomes", ("%.10g: %s"):format(got, kind))
end

-- 2. the MLP chain of dense_cuda_spec
local function build(place, prec)
  ur.nn.Module.manual_seed(7)
  local m = ur.nn.MLP({ 61, 96, 48, 1 }, { last = "none", pad_to = 8 })
  if place then assert(m:to(place)) end
  assert(m:set_precision(prec))
  return m
end

do
  local x = R.zeros({ 300, 64 })
  dense.concat({ (R.rand({ 300, 61 }, 21)), R.zeros({ 300, 3 }) }, x)
  local gy = R.rand({ 300, 1 }, 22)
  local function grads(m, place)
    local xi = place and assert(x:to(place)) or x
    m:forward(xi)
    m:zero_grad()
    local gx = m:backward(xi, place and assert(gy:to(place)) or gy)
    dense.join()
    return gx:totable()
  end
  local mc, mg, mf = build(nil, "tf32"), build("device", "tf32"), build("device", "f32")
  mc:forward(x)
  mg:forward(assert(x:to("device")))
  -- the Linears with a fused ReLU are modules 1 and 3 (a fused ReLU module follows each)
  for i, width in ipairs { 96, 48 } do
    local lc, lg = mc.modules[2 * i - 1], mg.modules[2 * i - 1]
    -- a unit passed where its output is above zero (the layer above masks by it: X_RELU)
    local yc, yg = lc.output:totable(), lg.output:totable()
    local flips, largest = 0, 0
    for k = 1, 300 * width do
      if (yc[k] > 0) ~= (yg[k] > 0) then
        flips = flips + 1
        largest = math.max(largest, math.abs(yc[k]), math.abs(yg[k]))
      end
    end
    row(("layer %d ReLU units set otherwise (of %d)"):format(i, 300 * width),
        ("%d, largest |output| among them %.3g"):format(flips, largest))
  end
  local gc = grads(mc)
  local gg = grads(mg, "device")
  row("input gradient, GPU TF32 vs CPU, CPU's masks", ("%.4g"):format(compare.normrel(gg, gc)))
  -- the CPU's backward with the GPU's ReLU outputs: copy them in after the CPU's forward
  mc:forward(x)
  mg:forward(assert(x:to("device")))
  for i = 1, 3, 2 do assert(mc.modules[i].output:copy(mg.modules[i].output)) end
  mc:zero_grad()
  local gcm = mc:backward(x, gy):totable()
  row("input gradient, GPU TF32 vs CPU, GPU's masks (spec: <= 3e-3)", ("%.4g"):format(compare.normrel(gg, gcm)))
  local gf = grads(mf, "device")
  row("input gradient, GPU TF32 vs GPU f32", ("%.4g"):format(compare.normrel(gg, gf)))
  row("input gradient, GPU f32 vs CPU", ("%.4g"):format(compare.normrel(gf, gc)))
end

-- 3. dlrm_tiny, 8 steps, as train_cuda_spec runs it
do
  local BASE = { "train.batch_size=512", "train.steps=20", "eval.samples=8192", "eval.batch_size=4096" }
  local function run(prec, on_cpu)
    return (helpers.step_losses(helpers.tiny(BASE, { "model.precision=" .. prec }), on_cpu, 8))
  end
  local cpu = { f32 = run("f32", true), tf32 = run("tf32", true), bf16 = run("bf16", true) }
  local gpu = { f32 = run("f32", false), tf32 = run("tf32", false), bf16 = run("bf16", false) }
  local function worst(a, b)
    local w, at = 0, 0
    for s = 1, #a do
      local d = math.abs(a[s] - b[s]) / math.max(1e-30, math.abs(b[s]))
      if d > w then w, at = d, s end
    end
    return ("%.3f%% (step %d)"):format(100 * w, at)
  end
  for _, p in ipairs { "f32", "tf32", "bf16" } do
    row(("dlrm_tiny loss, GPU %s vs CPU %s, worst of 8 steps"):format(p, p), worst(gpu[p], cpu[p]))
  end
  row("dlrm_tiny loss, GPU tf32 vs GPU f32, worst of 8 steps", worst(gpu.tf32, gpu.f32))
  row("dlrm_tiny loss, GPU bf16 vs GPU f32, worst of 8 steps", worst(gpu.bf16, gpu.f32))
end

print("\n== tf32_check")
for _, r in ipairs(rows_out) do print(("%-62s %s"):format(r[1], r[2])) end
