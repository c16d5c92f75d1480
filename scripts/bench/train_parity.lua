-- Training parity with PyTorch (issue 9): the same DLRM trained by uvmrec and by the PyTorch
-- DLRM (scripts/bench/torch_dlrm.py train) from the same initial weights, on the same day files
-- in the same order, with the same optimizers; their final AUCs on the same held-out samples
-- must agree within --tol (0.005).
--
--   luajit scripts/bench/train_parity.lua [--config dlrm_kaggle] [--set k=v]... [--samples N]
--          [--days D] [--steps S] [--work DIR] [--python PY] [--torch-device cpu|cuda] [--cpu]
--          [--tol 0.005] [--threads T]   (--help)
--
-- 1. uvmrec datagen writes N samples of the config's synthetic data (its data.train preset) as
--    D day files (default 7, as the Kaggle set's days); the last day is held out, the others
--    are the training set (symbolic links in DIR/train and DIR/eval).
-- 2. uvmrec trains on them (uvmrec.train.run: no shuffle, evaluation only at the end, on the
--    held-out day) and, before the first step, saves its initial weights with the model's
--    description (DIR/init.safetensors); the run directory is DIR/uvmrec (metrics.jsonl).
-- 3. torch_dlrm.py train loads those weights and trains on the same files (DIR/torch.jsonl).
-- 4. A table of both runs, one JSON line in DIR/summary.jsonl, and the loss curves plotted
--    into DIR/loss.png (scripts/bench/train_parity_plot.py, where matplotlib is importable).
-- Exits 1 when the AUCs differ by more than --tol, a run fails or a run's AUC is undefined (a
-- held-out day of one class: 'uvmrec has no final AUC to compare: it is undefined, the 1 held-out
-- label is 1', said before PyTorch trains).
local ur = require "uvmrec"
local train = require "uvmrec.train"
local json = require "uvmrec.json"
local things = require("uvmrec.lib").things

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local P = dofile(here .. "/parity_lib.lua")
local cli = require "uvmrec.cli"
local options = cli.options

local cmd = cli.command {
  name = "scripts/bench/train_parity.lua",
  summary = "training parity with PyTorch: the same DLRM trained by both, final AUCs within --tol",
  { "--config C", "the config or preset (its data.train names the synthetic preset)", default = "dlrm_kaggle" },
  options.set,
  { "--samples N", "samples written by datagen", type = "whole", default = 700000, min = 2 },
  { "--days D", "day files (the last is held out)", type = "whole", default = 7, min = 2 },
  { "--steps S", "steps to train (0: the training days once)", type = "whole", default = 0 },
  { "--work DIR", "where the data, runs and summary go", default = "build/train_parity" },
  options.python,
  { "--torch-device D", "PyTorch's device (default: cuda where uvmrec uses a GPU)", choices = { "cpu", "cuda" } },
  { "--threads T", "CPU threads of both", type = "whole", min = 1 },
  { "--cpu", "uvmrec on the CPU even where a GPU is" },
  { "--tol X", "the largest AUC difference that passes", type = "number", default = 0.005, min = 0 },
}
local o = cmd:parse(arg)
local gpu = ur.gpu() and not o.cpu
o.torch_device = o.torch_device or (gpu and "cuda" or "cpu")

local sh, run = P.sh, P.run

-- 1. The data.
local cfg0, def0 = P.config(o.config, o.set)
if not cfg0 then cmd:fail(def0) end
local work = o.work
local made, derr = P.datagen(cfg0, work .. "/days", o.samples, o.days)
if not made then cmd:fail(o.config .. ": " .. derr) end
if not run("mkdir -p " .. sh(work .. "/train") .. " " .. sh(work .. "/eval")) then
  cmd:fail("cannot create " .. work)
end
local held = o.days - 1
for _, k in ipairs { "dense", "sparse", "labels" } do
  for d = 0, held - 1 do
    run(("ln -sf ../days/day_%d_%s.npy %s"):format(d, k, sh(("%s/train/day_%d_%s.npy"):format(work, d, k))))
  end
  run(("ln -sf ../days/day_%d_%s.npy %s"):format(held, k, sh(("%s/eval/day_0_%s.npy"):format(work, k))))
end
for _, d in ipairs { "train", "eval" } do
  run(("ln -sf ../days/layout.txt %s"):format(sh(work .. "/" .. d .. "/layout.txt")))
end
local eval_samples = o.samples - math.floor(o.samples * held / o.days) -- datagen's split
local train_samples = o.samples - eval_samples

-- 2. uvmrec.
local sets = { unpack(o.set) }
for _, s in ipairs { "data.train=criteo-bin:" .. work .. "/train", "data.eval=criteo-bin:" .. work .. "/eval",
                     "data.shuffle_window=0", "eval.every=0", "eval.samples=" .. eval_samples, "eval.min_auc=0",
                     require("uvmrec.lib").flag_set("--steps", "train.steps", o.steps) } do
  sets[#sets + 1] = s
end
local cfg, def, path = P.config(o.config, sets)
if not cfg then cmd:fail(def) end
local init = work .. "/init.safetensors"
run("rm -rf " .. sh(work .. "/uvmrec"))
local desc
local result, err = train.run(cfg, { config_path = path, out = work .. "/uvmrec", progress = "lines", cpu = o.cpu,
  setup = function(ctx)
    desc = P.describe(cfg, ctx.model, ctx.optimizer)
    assert(P.save_weights(init, ctx.model, desc, cfg))
  end })
if not result then cmd:fail("uvmrec: " .. tostring(err), 1) end
local steps = result.steps

-- A run's final AUC (its result's evaluation, or its final JSON line), or the run fails saying
-- which run and why it has none: auc_undefined's reason (one class held out, no held-out label),
-- no final line, an eval.metrics without auc.
local function final_auc(fin, who)
  if fin and fin.auc then return fin.auc end
  cmd:fail(("%s has no final AUC to compare: %s"):format(who, not fin and "it wrote no final line"
    or fin.auc_undefined and ("it is undefined, " .. fin.auc_undefined) or "its evaluation computed none"), 1)
end
-- an undefined one fails here, before PyTorch trains for nothing
final_auc(result.eval, "uvmrec")

-- 3. PyTorch, from the same weights, for the same steps.
local tjson = work .. "/torch.jsonl"
os.remove(tjson)
if not run(("%s %s train --ckpt %s --data %s --eval-data %s --steps %d --out %s --device %s%s"):format(sh(o.python),
  sh(here .. "/torch_dlrm.py"), sh(init), sh(work .. "/train"), sh(work .. "/eval"), steps, sh(tjson),
  o.torch_device, o.threads and (" --threads " .. o.threads) or "")) then
  cmd:fail("torch_dlrm.py train failed", 1)
end

-- 4. Both runs side by side.
local function read_jsonl(p)
  local out, jerr = json.read_lines(p)
  if not out then cmd:fail(jerr, 1) end
  return out
end
local function final(lines)
  local fin, curve = nil, {}
  for _, l in ipairs(lines) do
    if l.event == "final" then fin = l end
    if l.event == "train" then curve[l.step] = l.loss end
  end
  return fin, curve
end
local uf, ucurve = final(read_jsonl(work .. "/uvmrec/metrics.jsonl"))
local tf, tcurve = final(read_jsonl(tjson))
final_auc(uf, "uvmrec (" .. work .. "/uvmrec/metrics.jsonl)")
final_auc(tf, "PyTorch (" .. tjson .. ")")
local diff, n, sum = math.abs(uf.auc - tf.auc), 0, 0
for s, l in pairs(ucurve) do
  if tcurve[s] then n, sum = n + 1, sum + math.abs(l - tcurve[s]) end
end
local ok = diff <= o.tol
print(("\ntraining parity: %s, %s of %d (%s, %d held out), uvmrec on %s, PyTorch on %s")
  :format(cfg.name, things(steps, "step"), cfg.train.batch_size, things(train_samples, "training sample"), eval_samples,
  gpu and "the GPU" or "the CPU", o.torch_device))
print(("%-8s %10s %12s %10s %14s"):format("engine", "AUC", "logloss", "last loss", "samples/s"))
print(("%-8s %10.4f %12s %10.4f %14.0f"):format("uvmrec", uf.auc, "", uf.loss, uf.samples_per_s))
print(("%-8s %10.4f %12.4f %10.4f %14.0f"):format("torch", tf.auc, tf.logloss, tf.loss, tf.samples_per_s))
print(("|AUC difference| %.4f (allowed %.4f): %s; mean |loss difference| over %s %.4f")
  :format(diff, o.tol, ok and "ok" or "FAIL", things(n, "logged step"), n > 0 and sum / n or 0))
json.append_lines(work .. "/summary.jsonl", {
  bench = "train_parity", model = cfg.name, steps = steps, batch = cfg.train.batch_size,
  train_samples = train_samples, eval_samples = eval_samples, uvmrec_device = gpu and "cuda" or "cpu",
  torch_device = o.torch_device, uvmrec_auc = uf.auc, torch_auc = tf.auc, auc_diff = diff, tol = o.tol, ok = ok,
  mean_loss_diff = n > 0 and sum / n or 0, uvmrec_samples_per_s = uf.samples_per_s,
  torch_samples_per_s = tf.samples_per_s, sets = o.set })
local plot = ("%s %s %s %s --out %s --title %s"):format(sh(o.python), sh(here .. "/train_parity_plot.py"),
  sh(work .. "/uvmrec/metrics.jsonl"), sh(tjson), sh(work .. "/loss.png"),
  sh(("%s, %s: AUC uvmrec %.4f, PyTorch %.4f"):format(cfg.name, things(steps, "step"), uf.auc, tf.auc)))
if not run(plot) then print("(no plot here; run it where matplotlib is installed: " .. plot .. ")") end
if not ok then os.exit(1) end
