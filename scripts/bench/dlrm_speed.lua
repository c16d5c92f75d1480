-- uvmrec against the PyTorch DLRM in the same run (BENCH.md B3, issue 9): samples/s of whole
-- training steps of both, per precision, and uvmrec's step cut into its phases against the
-- floor their bytes and FLOPs allow.
--
--   luajit scripts/bench/dlrm_speed.lua [--config dlrm_mlperf_v1_2m] [--set k=v]... [--batch B]
--          [--precisions f32,tf32,bf16] [--steps 30] [--data DIR] [--work DIR] [--python PY]
--          [--no-torch] [--out FILE] [--cpu] [--graph]   (--help)
--
-- The data: the day files in --data, or written by uvmrec datagen from the config's synthetic
-- preset into --work (8 batches); both engines train on the same batches, rotating over them.
-- PyTorch first (scripts/bench/torch_dlrm.py speed, one process a precision; on a GPU it also
-- measures the matrix-product and copy ceilings), then uvmrec, per precision:
--   * steady: --steps steps back to back after a warm-up, timed with CUDA events (the clock on
--     the CPU), the learning rates following the config's schedule as uvmrec.train does; with
--     --graph each step is a replayed CUDA graph (uvmrec.train.graph, a graph per batch), the
--     model on a stream of its own and the learning rates held at the schedule's first step's
--     (a graph replays them as captured);
--   * phases: each phase of the step (parity_lib.lua's cut of models/dlrm.lua: bottom MLP,
--     embeddings, interaction, top MLP forward; loss; top, interaction, bottom backward; the
--     tables' backward with their fused optimizer; the dense optimizer) repeated alone, back to
--     back; "gaps" is the step's time that the phases alone do not account for (host waits,
--     launch latency, synchronisations);
--   * the floor of each phase: max(FLOPs / the matrix-product ceiling, bytes / the copy
--     ceiling), with the bytes each phase must move at least (rows read once, activations read
--     and written once, ids and offsets) and the ceilings PyTorch measured in this run (else
--     BENCH.md's: 790 TFLOP/s bf16, 4250 GB/s; f32 and TF32 products then have none).
-- Prints the tables last and appends JSON lines to --out.
local ur = require "uvmrec"
local train = require "uvmrec.train"
local things = require("uvmrec.lib").things
local streams = require "uvmrec.stream"
local json = require "uvmrec.json"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local P = dofile(here .. "/parity_lib.lua")
local cli = require "uvmrec.cli"
local options = cli.options

local cmd = cli.command {
  name = "scripts/bench/dlrm_speed.lua",
  summary = "uvmrec against the PyTorch DLRM in the same run (BENCH.md B3): samples/s per precision, and phases",
  options.config,
  options.set,
  options.batch_size,
  { "--precisions P,...", "the precisions to time", type = "list", choices = { "f32", "tf32", "bf16" },
    default = { "f32", "tf32", "bf16" } },
  { "--steps N", "timed steps (default: 30 on a GPU, 5 on the CPU)", type = "whole", min = 1 },
  { "--data DIR", "day files to train on (default: written by uvmrec datagen into --work)" },
  { "--work DIR", "where the data and PyTorch's results go", default = "build/dlrm_speed" },
  options.python,
  options.no_torch,
  options.out_append,
  options.cpu,
  { "--graph", "each steady step a replayed CUDA graph (the learning rates held at the schedule's first step's)" },
}
local o = cmd:parse(arg)
local gpu
gpu, o.config = cli.bench_config(o)
o.steps = o.steps or (gpu and 30 or 5)
local WARM, NBATCH, REPEAT = gpu and 5 or 1, gpu and 8 or 2, gpu and 10 or 2

local sh, run = P.sh, P.run

local function config(precision)
  local sets = { unpack(o.set) }
  if o.batch then sets[#sets + 1] = require("uvmrec.lib").flag_set("--batch", "train.batch_size", o.batch) end
  sets[#sets + 1] = require("uvmrec.lib").flag_set("--precisions", "model.precision", precision)
  local cfg, def = P.config(o.config, sets)
  if not cfg then cmd:fail(def) end
  return cfg, def
end

-- ---- the data ----
local cfg0 = config(o.precisions[1])
local B = cfg0.train.batch_size
if not o.data then
  o.data = o.work .. "/days"
  local ok, err = P.datagen(cfg0, o.data, NBATCH * B)
  if not ok then cmd:fail(("%s: %s (else give --data DIR)"):format(o.config, err)) end
end

-- ---- PyTorch ----
local torch = {}
local ceil = {}
if not o.no_torch then
  local desc_path = o.work .. "/desc.json"
  run("mkdir -p " .. sh(o.work))
  do
    -- The description needs built objects: a model of 1-row tables has the same shape (the
    -- real rows are put back).
    local cfg = config(o.precisions[1])
    local sets = { unpack(o.set) }
    sets[#sets + 1] = "embeddings.max_rows=1"
    if o.batch then sets[#sets + 1] = require("uvmrec.lib").flag_set("--batch", "train.batch_size", o.batch) end
    local small, def = P.config(o.config, sets)
    if not small then cmd:fail(def) end
    local m = assert(def.build(small, { cpu = true }))
    local desc = P.describe(small, m, train.optimizer(small, m))
    desc.rows = train.config.table_rows(cfg)
    local f = assert(io.open(desc_path, "w"))
    f:write(json.encode(desc), "\n")
    f:close()
    m.embeddings.tbe:free()
  end
  local tj = o.work .. "/torch_speed.jsonl"
  os.remove(tj)
  for i, p in ipairs(o.precisions) do
    if not run(("%s %s speed --desc %s --data %s --precision %s --batch %d --steps %d --batches %d --out %s "
      .. "--device %s%s"):format(sh(o.python), sh(here .. "/torch_dlrm.py"), sh(desc_path), sh(o.data), p, B,
      o.steps, NBATCH, sh(tj), gpu and "cuda" or "cpu", (i == 1 and gpu) and " --ceilings" or "")) then
      print("(PyTorch failed for " .. p .. "; its column stays empty)")
    end
  end
  local f = io.open(tj)
  if f then
    for line in f:lines() do
      local r = json.decode(line)
      if r.bench == "torch_dlrm" then torch[r.precision] = r
      elseif r.bench == "ceilings" then ceil = r end
    end
    f:close()
  end
end
local COPY = (ceil.copy_gbps or 4250) * 1e9
local MM = { f32 = ceil.mm_f32_tflops, tf32 = ceil.mm_tf32_tflops, bf16 = ceil.mm_bf16_tflops or 790 }

-- ---- bytes and FLOPs of each phase ----
local function floors(model, precision, unique)
  local ab = precision == "bf16" and 2 or 4
  local d = model.dim
  local T = model.num_tables
  local f, b = {}, {}
  local function mlp(seq, first_input_grad)
    local ff, fb, bf, bb, params = 0, 0, 0, 0, 0
    local k = 0
    for _, l in ipairs(seq.modules) do
      if l.out_features then
        k = k + 1
        local i, n = l.in_features, l.out_features
        ff = ff + 2 * B * i * n
        fb = fb + B * (i + n) * ab
        local gin = k > 1 or first_input_grad
        bf = bf + 2 * B * i * n * (gin and 2 or 1)
        -- backward: the output's gradient and the output (ReLU mask) read, the input read, its
        -- gradient written
        bb = bb + B * (2 * n + i + (gin and i or 0)) * ab
        params = params + (i + 1) * n
      end
    end
    return ff, fb, bf, bb, params
  end
  local bff, bfb, bbf, bbb, bp = mlp(model.bottom, false)
  local tff, tfb, tbf, tbb, tp = mlp(model.top, true)
  f.bottom_fwd, b.bottom_fwd = bff, bfb + B * model.num_dense * 4
  f.bottom_bwd, b.bottom_bwd = bbf, bbb
  f.top_fwd, b.top_fwd = tff, tfb
  f.top_bwd, b.top_bwd = tbf, tbb
  local ids = model._speed_ids
  local width = model.interaction_width
  local xd = width - T * d -- the bottom MLP's output
  if model._pair then
    local n = T + 1
    f.inter_fwd = 2 * B * (n * (n - 1) / 2) * d
    f.inter_bwd = 2 * f.inter_fwd
    b.inter_fwd = B * (n * d + width) * ab
    b.inter_bwd = B * (width + 2 * n * d) * ab
  else
    local r = model.interaction.rank or width
    local per = model.interaction.rank and 2 * B * width * r * 2 or 2 * B * width * width
    f.inter_fwd = per * model.interaction.layers
    f.inter_bwd = 2 * f.inter_fwd
    -- concat, and per layer x_l, z read and x_{l+1} written (x0 stays cached at best: counted once)
    b.inter_fwd = B * (xd + T * d) * ab * 2 + model.interaction.layers * B * width * 3 * ab
    b.inter_bwd = model.interaction.layers * B * width * 5 * ab + B * width * ab * 2
  end
  local interaction_params = 0
  for _, p in ipairs(model.interaction:parameters()) do interaction_params = interaction_params + p.tensor:numel() end
  f.loss, b.loss = 0, B * (2 * ab + 4)
  -- the tables: every id and offset read, every pooled row written; each (id, row) read once
  local row_bytes = d * 4
  b.emb_fwd = ids * (8 + row_bytes) + B * T * 8 + B * T * d * ab
  f.emb_fwd = 0
  -- backward with SGD: the gradient rows read, ids and offsets read, the (row, position) pairs
  -- sorted (written and read once), each distinct row read and written once
  b.emb_bwd_opt = B * T * d * ab + ids * 8 + B * T * 8 + ids * 16 * 2 + unique * row_bytes * 2
  f.emb_bwd_opt = 0
  -- the dense optimizer (SGD): weight and gradient read, weight written, gradient zeroed, the
  -- bf16 copy written
  local np = bp + tp + interaction_params
  b.dense_opt, f.dense_opt = np * (4 * 4 + (precision == "bf16" and 2 or 0)), 0
  local out = {}
  for k, v in pairs(b) do
    local mm, fl = MM[precision], f[k] or 0
    local ms = v / COPY * 1e3
    if fl > 0 then ms = mm and math.max(ms, fl / (mm * 1e12) * 1e3) or nil end -- no ceiling: no floor
    out[k] = { flops = fl, bytes = v, ms = ms }
  end
  return out
end

-- ---- uvmrec ----
-- A timed span from now on stream: its milliseconds so far (events on a GPU, the clock on the CPU).
local function span_ms(stream)
  local timed = streams.span(stream, gpu)
  return function() return timed() * 1e3 end
end

local results = {}
for _, precision in ipairs(o.precisions) do
  local cfg, def = config(precision)
  local model, merr = def.build(cfg, { cpu = not gpu })
  if not model then cmd:fail(merr) end
  local opt = train.optimizer(cfg, model)
  local rows = train.config.table_rows(cfg)
  local loader = assert(ur.data.loader { data = "criteo-bin:" .. o.data, batch_size = B, depth = 2, rows = rows,
                                         drop_last = true })
  local batches = train.source.hold(loader, NBATCH, gpu and "device" or nil)
  if #batches == 0 then cmd:fail(o.data .. ": not one whole batch of " .. B) end
  local ids = 0
  for _, b in ipairs(batches) do ids = ids + b.sparse:values():numel() end
  model._speed_ids = ids / #batches
  local runner
  if o.graph then
    if not gpu then cmd:fail("--graph needs a GPU") end
    local why
    -- each batch runs eagerly once, then is captured, then replayed
    runner, why = require("uvmrec.train.graph").new(model, opt, { static = true, warmup = #batches })
    if not runner then cmd:fail("--graph: " .. why) end
  end
  local stream = runner and runner.stream
  local steps = {}
  for i, b in ipairs(batches) do steps[i] = P.phases(model, opt, b) end
  -- the step's phases over the batches in turn, the learning rates as uvmrec.train sets them
  local sched = train.config.schedule(cfg)
  local lrs = sched and ur.optim.Schedule(sched, { opt, model.embeddings })
  local n = 0
  -- A graph replays its learning rates as captured: they stay at the schedule's first step's,
  -- where a model trained from scratch stays finite (at the plateau's, 24 for MLPerf's config,
  -- this untrained one reached NaN within 46 steps on the H200).  The rate's value does not
  -- change the step's time.
  if runner and lrs then lrs:set(1) end
  local function step()
    n = n + 1
    if lrs and not runner then lrs:set(n) end
    local i = (n - 1) % #batches + 1
    if runner then
      runner:step(batches[i])
    else
      P.run_phases(steps[i])
    end
    return steps[i]
  end
  for _ = 1, math.max(WARM, runner and 2 * #batches or 0) do step() end
  local timed = span_ms(stream)
  for _ = 1, o.steps do step() end
  local ms = timed() / o.steps
  -- The loss of the first batch after the timed steps (forward and loss only).
  local loss_last
  do
    local list, st = P.phases(model, opt, batches[1])
    for i = 1, 5 do list[i][2]() end
    if stream then assert(stream:sync()) end
    loss_last = st.loss:get(0)
  end
  if not (loss_last == loss_last and math.abs(loss_last) < math.huge) then
    cmd:fail(("%s: the loss is %s after %s"):format(precision, tostring(loss_last), things(n, "step")), 1)
  end

  -- The distinct rows of a batch (the backward's floor), from the tables' gradient.
  local unique = 0
  do
    local list, st = P.phases(model, opt, batches[1], { sparse_grad = true })
    P.run_phases(list)
    for _, g in pairs(st.sparse) do unique = unique + g.rows:numel() end
    model:zero_grad()
  end
  local fl = floors(model, precision, unique)

  -- Each phase alone, repeated back to back, on the state a full step left.
  local list = step()
  local phases, sum = {}, 0
  for _, ph in ipairs(list) do
    local phase_ms = span_ms(stream)
    for _ = 1, REPEAT do ph[2]() end
    ur.dense.join(model.stream) -- the phase's weight gradients, on a side stream, count here
    local pms = phase_ms() / REPEAT
    phases[#phases + 1] = { name = ph[1], ms = pms, floor_ms = fl[ph[1]] and fl[ph[1]].ms,
                            bytes = fl[ph[1]] and fl[ph[1]].bytes, flops = fl[ph[1]] and fl[ph[1]].flops }
    sum = sum + pms
  end
  local floor_ms, floor_known = 0, true
  for _, ph in ipairs(phases) do
    if ph.floor_ms then floor_ms = floor_ms + ph.floor_ms else floor_known = false end
  end
  local r = { precision = precision, ms = ms, samples_per_s = B / (ms * 1e-3), phases = phases, phase_sum = sum,
              gaps = ms - sum, floor_ms = floor_known and floor_ms or nil, unique = unique, ids = model._speed_ids,
              loss = loss_last, graph = runner and { captures = runner.captures, replays = runner.replays } or nil }
  results[#results + 1] = r
  print(("uvmrec %s: %.3f ms a step (%s after %d warm-up, over %d batches%s), %.3f M samples/s; loss %.4f")
    :format(precision, ms, things(o.steps, "step"), WARM, #batches,
            runner and (", CUDA graphs: %d captured, %d replays"):format(runner.captures, runner.replays) or "",
            r.samples_per_s / 1e6, loss_last))
  if runner then runner:free() end
  model.embeddings.tbe:free()
  steps, batches = nil, nil
  collectgarbage()
  collectgarbage()
end

-- ---- the tables ----
local where = gpu and ("cuda:0 " .. ur.device_props(0).name) or "the CPU"
print(("\ndlrm_speed: %s, batch %d, on %s; PyTorch %s; ceilings: copy %.0f GB/s%s, products %s TFLOP/s")
  :format(cfg0.name, B, where, (next(torch) and select(2, next(torch)).torch) or "not run", COPY / 1e9,
  ceil.copy_gbps and " (measured)" or " (BENCH.md)",
  table.concat((function()
    local t = {}
    for _, p in ipairs { "f32", "tf32", "bf16" } do
      t[#t + 1] = p .. " " .. (MM[p] and ("%.0f"):format(MM[p]) or "?")
    end
    return t
  end)(), ", ")))
for _, r in ipairs(results) do
  print(("\nuvmrec %s step, phases alone (x%d): %d ids, %d distinct rows a batch"):format(r.precision, REPEAT, r.ids,
    r.unique))
  print(("%-12s %9s %9s %8s %12s %10s"):format("phase", "ms", "floor ms", "% floor", "MB", "GFLOP"))
  for _, ph in ipairs(r.phases) do
    print(("%-12s %9.3f %9s %8s %12.1f %10.1f"):format(ph.name, ph.ms,
      ph.floor_ms and ("%.3f"):format(ph.floor_ms) or "?",
      ph.floor_ms and ("%.0f%%"):format(100 * ph.floor_ms / ph.ms) or "", (ph.bytes or 0) / 1e6, (ph.flops or 0) / 1e9))
  end
  print(("%-12s %9.3f"):format("gaps", r.gaps))
  print(("%-12s %9.3f %9s %8s"):format("step", r.ms, r.floor_ms and ("%.3f"):format(r.floor_ms) or "?",
    r.floor_ms and ("%.0f%%"):format(100 * r.floor_ms / r.ms) or ""))
end
print(("\n%-6s %11s %13s %11s %13s %8s %10s %8s"):format("math", "uvmrec ms", "uvmrec M/s", "torch ms", "torch M/s",
  "ratio", "floor ms", "% floor"))
for _, r in ipairs(results) do
  local t = torch[r.precision]
  print(("%-6s %11.3f %13.3f %11s %13s %8s %10s %8s"):format(r.precision, r.ms, r.samples_per_s / 1e6,
    t and ("%.3f"):format(t.ms) or "-", t and ("%.3f"):format(t.samples_per_s / 1e6) or "-",
    t and ("%.2fx"):format(t.ms / r.ms) or "-", r.floor_ms and ("%.3f"):format(r.floor_ms) or "?",
    r.floor_ms and ("%.0f%%"):format(100 * r.floor_ms / r.ms) or ""))
end
for _, r in ipairs(results) do
  if r.precision == "bf16" and gpu then
    local t = torch.bf16
    print(("B3 (bf16): %.2f M samples/s against 10 M (%.0f%%)%s"):format(r.samples_per_s / 1e6, r.samples_per_s / 1e5,
      t and (", %.2fx PyTorch against 3x"):format(t.ms / r.ms) or ""))
  end
end
if o.out then
  local lines = {}
  for _, r in ipairs(results) do
    local t = torch[r.precision]
    lines[#lines + 1] = { bench = "dlrm_speed", config = cfg0.name, device = where, batch = B,
      precision = r.precision, ms = r.ms, samples_per_s = r.samples_per_s, phases = r.phases, gaps_ms = r.gaps,
      floor_ms = r.floor_ms, unique_rows = r.unique, ids = r.ids, loss = r.loss, graph = r.graph,
      sets = #o.set > 0 and o.set or nil,
      torch_ms = t and t.ms, torch_samples_per_s = t and t.samples_per_s, ratio = t and t.ms / r.ms,
      ceilings = next(ceil) and ceil or nil }
  end
  json.append_lines(o.out, unpack(lines))
end
