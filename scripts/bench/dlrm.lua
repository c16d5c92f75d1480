-- DLRM training benchmark (BENCH.md B3, B7): samples/s of whole training steps.
--
--   luajit scripts/bench/dlrm.lua [--steps N] [--batch B] [--config NAME|FILE] [--set k=v]...
--                                 [--precision f32|tf32|bf16] [--cpu] [--out FILE]   (--help)
--
-- Default on a GPU: dlrm_mlperf_v1_2m (26 tables of dim 128 capped at 2 M rows, 6.3 GiB in
-- HBM; MLPs 512-256-128 and 1024-1024-512-256-1; bf16 MLPs; SGD) at batch 65536, 200 steps.
-- With --cpu (or without a GPU): dlrm_tiny at its own batch, 50 steps.
-- It first checks the step: a few steps of dlrm_tiny on the GPU against the CPU backend from
-- the same initial weights and batches (the losses must agree; f32 and bf16).  Then it times
-- the step with every batch already on the device (rotating over several distinct batches of
-- the synthetic data, Zipf ids), after a warm-up, with CUDA events; the loss must be finite and
-- fall.  The step carries train.nonfinite's guard as a training run does (--nonfinite off: none),
-- and the guard's own work (its checks and its step end, without the step) is timed apart.
-- Last, a shorter run fed by the loader (host generation and the copies included).
-- Prints a summary and writes one JSON line to --out.
local ur = require "uvmrec"
local train = require "uvmrec.train"
local streams = require "uvmrec.stream"
local json = require "uvmrec.json"
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/dlrm.lua",
  summary = "DLRM training benchmark (BENCH.md B3, B7): samples/s of whole training steps",
  { "--steps N", "steps to time (default: 200 on a GPU, 50 on the CPU; at least 2: the first batch's loss is read "
    .. "after the first and after the last)", type = "whole", min = 2 },
  options.batch_size,
  options.config,
  options.set,
  options.precision,
  options.cpu,
  { "--nonfinite M", "the guard against NaN and infinity in the step (sets train.nonfinite; default: stop, as "
    .. "in training)", choices = { "stop", "skip", "off" } },
  options.out_append,
}
local o = cmd:parse(arg)
local gpu
gpu, o.config = require("uvmrec.cli").bench_config(o)
o.steps = o.steps or (gpu and 200 or 50)
local WARM, NBATCH = gpu and 10 or 3, gpu and 8 or 4

local C = ur.C
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local P = dofile(here .. "/parity_lib.lua")
local function load(name, sets)
  local cfg, def = P.config(name, sets)
  if not cfg then cmd:fail(def) end
  return cfg, def
end

-- ---- the check: GPU against the CPU backend ----

-- Losses of `steps` steps of dlrm_tiny from the same weights and batches; nil without a GPU.
local function losses(precision, on_cpu, steps)
  local cfg, def = load("dlrm_tiny", { "model.precision=" .. precision, "train.batch_size=512" })
  local model = assert(def.build(cfg, { cpu = on_cpu }))
  local opt = train.optimizer(cfg, model)
  local data = assert(train.data(cfg, train.config.table_rows(cfg)))
  local loader = assert(ur.data.loader(data.train))
  local out = {}
  train.loop.run(model, opt, train.source.loader(loader, { placement = not on_cpu and "device" or nil, steps = steps }),
                 { { after = function(_, r) out[r.step] = r.loss:get(0) end } })
  loader:close()
  return out
end

local check = { ok = true }
if gpu then
  for _, c in ipairs { { "f32", 2e-4 }, { "bf16", 3e-2 } } do
    local a, b = losses(c[1], true, 5), losses(c[1], false, 5)
    local worst = 0
    for s = 1, #a do worst = math.max(worst, math.abs(a[s] - b[s]) / math.max(math.abs(a[s]), 1e-6)) end
    check[c[1]] = worst
    if worst > c[2] or worst ~= worst then
      cmd:fail(("check: dlrm_tiny %s losses on the GPU differ from the CPU's by %.3g (relative; allowed %g)"):format(
        c[1], worst, c[2]))
    end
  end
end

-- ---- the timed run ----

local sets = { unpack(o.set) }
local flag_set = require("uvmrec.lib").flag_set
local things = require("uvmrec.lib").things
if o.batch then sets[#sets + 1] = flag_set("--batch", "train.batch_size", o.batch) end
if o.precision then sets[#sets + 1] = flag_set("--precision", "model.precision", o.precision) end
if o.nonfinite then sets[#sets + 1] = flag_set("--nonfinite", "train.nonfinite", o.nonfinite) end
local cfg, def = load(o.config, sets)
local B = cfg.train.batch_size
local model, merr = def.build(cfg, { cpu = not gpu })
if not model then cmd:fail(merr) end
local opt = train.optimizer(cfg, model)
local guard = cfg.train.nonfinite ~= "off" and train.guard.new(model, opt, cfg.train.nonfinite) or nil
local st = model:stats()
local where = gpu and ("cuda:0 " .. ur.device_props(0).name) or "the CPU"
print(("dlrm bench: %s on %s, batch %d, %s MLPs, %d tables x %d (%s rows, %s)"):format(cfg.name, where, B,
  cfg.model.precision, st.tables, st.dim, train.progress.count(st.rows), train.progress.bytes(st.table_bytes)))
if gpu then
  print(("check: dlrm_tiny, 5 steps on the GPU against the CPU: losses agree within %.2g (f32), %.2g (bf16)")
    :format(check.f32, check.bf16))
end

-- Distinct batches of the config's data, held where the model runs.
local batches, dopts = assert(train.source.hold_data(cfg, NBATCH, gpu and "device" or nil))

-- n more steps over the batches held, going on from the steps made before (the schedule's
-- step, the ring's turn); the first step's loss and the last's.
local sched = train.config.schedule(cfg)
local lrs = sched and ur.optim.Schedule(sched, { opt, model.embeddings })
local step = 0
local function run(n)
  local first
  local hooks = { { start = function(_, r) r.step = step end },
                  { after = function(_, r) first = first or r.loss:get(0) end } }
  if lrs then table.insert(hooks, 2, lrs) end
  local r = train.loop.run(model, opt, train.source.ring(batches, n, step), hooks)
  step = r.step
  return first, r.loss:get(0)
end

-- A timed span from now on stream (nil: the default one): events on a GPU, the clock on the CPU.
local function span(stream) return streams.span(stream, gpu) end

run(WARM)
local probe = batches[step % NBATCH + 1] -- the first timed step's batch: its loss before and after
local timed = span()
local loss0 = select(2, run(1))
run(o.steps - 1)
local seconds = timed()
-- run(1) read the loss once inside the timed span: one wait in o.steps steps.
local loss1 = model.criterion:forward(model:forward(probe), probe.labels):get(0)
if not (loss1 == loss1 and math.abs(loss1) < math.huge) then
  cmd:fail(("the loss is %s after %s"):format(loss1, things(step, "step")))
end
if loss1 >= loss0 then
  cmd:fail(("the loss of a batch did not fall over %s on %d repeated batches: %.4f -> %.4f"):format(
    things(o.steps, "step"), NBATCH, loss0, loss1))
end
local rate = o.steps * B / seconds
print(("steady: %s (after %d warm-up) over %d batches already %s: %.3f ms a step, %s samples/s; "
  .. "the first batch's loss %.4f -> %.4f"):format(things(o.steps, "step"), WARM, NBATCH,
  gpu and "on the GPU" or "in memory", seconds / o.steps * 1e3, train.progress.count(rate), loss0, loss1))
if gpu then print(("B3 target: 10 M samples/s on one H200; this is %.2f of it"):format(rate / 10e6)) end

-- The guard's work alone, as a step does it: the loss's check, the dense gradients' (one launch
-- on a GPU for up to 32), the step's end; timed over many rounds (CUDA events on a GPU).
local guard_ms
if guard then
  local rounds = gpu and 1000 or 200
  local loss = model.criterion.output
  local timed_guard = span(model.stream)
  for _ = 1, rounds do
    guard:check_loss(loss, model.stream)
    guard:end_step(model.stream)
  end
  guard_ms = timed_guard() * 1e3 / rounds
  local r = guard:read()
  if r.bad > 0 then cmd:fail(("the guard saw %d steps with NaN or infinity (%s)"):format(r.bad, r.first.name)) end
  print(("guard (train.nonfinite: %s): %.4f ms a step over %d gradients (%s elements) and the loss, %.3f%% of "
    .. "the step"):format(cfg.train.nonfinite, guard_ms, guard.n, train.progress.count(st.dense_params),
    100 * guard_ms / (seconds / o.steps * 1e3)))
end

-- The same steps fed by the loader: generation on the host, copies to the device.
local fed_steps = math.max(5, math.floor(o.steps / 4))
dopts.samples = (fed_steps + WARM) * B
local loader = assert(ur.data.loader(dopts))
local f0
local fed = train.loop.run(model, opt, train.source.loader(loader, { placement = gpu and "device" or nil,
                                                                     steps = WARM + fed_steps }),
                           { { after = function(_, r)
                               if r.step == WARM then
                                 ur.sync()
                                 f0 = C.ur_clock_seconds()
                               end
                             end } })
fed.loss:get(0)
local fed_seconds = C.ur_clock_seconds() - f0
local fed_rate = fed_steps * B / fed_seconds
local ls = loader:stats()
loader:close()
print(("fed by the loader: %s, %s samples/s (the loader waited on for %.2f s of %.2f s)"):format(
  things(fed_steps, "step"),
  train.progress.count(fed_rate), ls.wait_seconds, fed_seconds))

if o.out then
  json.append_lines(o.out, { bench = "dlrm", config = cfg.name, device = where, batch = B,
    precision = cfg.model.precision, steps = o.steps, seconds = seconds, samples_per_s = rate,
    ms_per_step = seconds / o.steps * 1e3, fed_samples_per_s = fed_rate, loss_first = loss0, loss_last = loss1,
    check_f32 = check.f32, check_bf16 = check.bf16, nonfinite = cfg.train.nonfinite, guard_ms = guard_ms })
end
