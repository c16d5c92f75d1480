-- Exact resume at a real size: trains CONFIG for 2N steps without a stop, then N steps with a
-- checkpoint and N more resumed from it (`uvmrec train --resume` in-process), on the GPU where
-- there is one; checks that the resumed run's losses are the uninterrupted run's (bit for bit
-- unless --tol allows a relative difference) and reports the checkpoint's size and the save's
-- and the resume's times.  Exit status 1 when the losses differ by more than --tol.
--
--   luajit scripts/bench/train_resume.lua [--config NAME|FILE] [--steps N] [--set k=v]...
--                                        [--dir DIR] [--tol T] [--cpu] [--out FILE]   (--help)
--
-- Defaults: on a GPU dlrm_mlperf_v1_2m (6.3 GiB of tables in HBM, batch 65536, bf16 MLPs),
-- N = 5; on the CPU dlrm_tiny, N = 10.  DIR (default /tmp/uvmrec-train-resume) holds the run
-- directories and is removed at the end.  --out appends the result as a line of JSON.
local train = require "uvmrec.train"
local json = require "uvmrec.json"
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/train_resume.lua",
  summary = "exact resume at a real size: 2N steps straight against N, a checkpoint, and N resumed",
  options.config,
  { "--steps N", "N (default: 5 on a GPU, 10 on the CPU)", type = "whole", min = 1 },
  options.set,
  { "--dir DIR", "the run directories (removed at the end)", default = "/tmp/uvmrec-train-resume" },
  { "--tol T", "the relative loss difference allowed", type = "number", default = 0 },
  options.cpu,
  options.out_append,
}
local o = cmd:parse(arg)
local gpu
gpu, o.config = require("uvmrec.cli").bench_config(o)
local n = o.steps or (gpu and 5 or 10)

local path = train.find_config(o.config) or cmd:fail(o.config .. ": no such config or preset")
local function cfg(extra)
  local sets = { "train.log_every=1", "eval.samples=0", "eval.every=0", "eval.min_auc=0" }
  for _, s in ipairs(o.set) do sets[#sets + 1] = s end
  for _, s in ipairs(extra) do sets[#sets + 1] = s end
  local c, err = train.config.load(path, sets)
  if not c then cmd:fail(err) end
  return c
end

local function run(c, opts)
  opts.config_path, opts.progress, opts.cpu = path, "none", not gpu
  opts.print = function() end
  local r, err = train.run(c, opts)
  if not r then cmd:fail(err) end
  collectgarbage()
  collectgarbage()
  return r
end

local function events(dir) return assert(json.read_lines(dir .. "/metrics.jsonl")) end

local function losses(dir)
  local out = {}
  for _, e in ipairs(events(dir)) do if e.event == "train" then out[e.step] = e.loss end end
  return out
end

os.execute("rm -rf " .. require("uvmrec.lib").shell_quote(o.dir))
local a_dir, b_dir = o.dir .. "/whole", o.dir .. "/resumed"
io.write(("%s %s: %d steps uninterrupted, then %d + %d resumed\n"):format(o.config,
  gpu and "on the GPU" or "on the CPU", 2 * n, n, n))
run(cfg { "train.steps=" .. 2 * n }, { out = a_dir })
run(cfg { "train.steps=" .. n, "train.checkpoint_every=" .. n }, { out = b_dir })
local r = run(cfg { "train.steps=" .. 2 * n }, { out = b_dir, resume = b_dir })

local save, start
for _, e in ipairs(events(b_dir)) do
  if e.event == "checkpoint" and e.step == n then save = e end
  if e.event == "start" and e.resumed_from then start = e end
end
local want, got = losses(a_dir), losses(b_dir)
local worst, exact = 0, true
for s = 1, 2 * n do
  if not (want[s] and got[s]) then cmd:fail(("step %d has no loss (uninterrupted %s, resumed %s)"):format(
    s, tostring(want[s]), tostring(got[s]))) end
  if want[s] ~= got[s] then exact = false end
  worst = math.max(worst, math.abs(got[s] - want[s]) / math.max(math.abs(want[s]), 1e-30))
end
local gb = save.bytes / 1e9
local result = { bench = "train_resume", config = o.config, gpu = gpu, steps = n, checkpoint_bytes = save.bytes,
                 save_seconds = save.seconds, save_gb_s = gb / save.seconds, load_seconds = start.load_seconds,
                 load_gb_s = gb / start.load_seconds, exact = exact, max_rel_diff = worst,
                 resumed_step = r.resumed.step, loss_last = want[2 * n] }
io.write(("checkpoint at step %d: %.2f GB; saved in %.2f s (%.2f GB/s, fsync included); resumed in %.2f s "
  .. "(%.2f GB/s)\n"):format(n, gb, save.seconds, result.save_gb_s, start.load_seconds, result.load_gb_s))
io.write(("losses of steps 1..%d (resumed after %d): %s (largest relative difference %.3g); last loss %.6f\n")
  :format(2 * n, n, exact and "bit for bit the uninterrupted run's" or "NOT bit-identical", worst, want[2 * n]))
io.write(json.encode(result), "\n")
if o.out then json.append_lines(o.out, result) end
os.execute("rm -rf " .. require("uvmrec.lib").shell_quote(o.dir))
if worst > o.tol then
  cmd:fail(("the resumed losses differ from the uninterrupted run's by %.3g (relative), over --tol %g"):format(
    worst, o.tol))
end
