-- `uvmrec train`: trains the model of a YAML config (a file, or a preset of models/ by name:
-- dlrm_tiny) with a progress bar on a terminal (plain lines on a pipe), evaluates on held-out data
-- every eval.every steps and at the end, and writes config.json, metrics.jsonl and checkpoints/
-- into RUNDIR.  SIGINT or SIGTERM stops it at the next step boundary with a checkpoint; it then
-- exits with 128 + the signal's number (130, 143).  The loop is lua/uvmrec/train/loop.lua.  Its
-- options are declared below (`uvmrec train --help`).  Also runs as `luajit scripts/train.lua ...`
-- with the paths from `make -s env`.
local train = require "uvmrec.train"

local cmd = require("uvmrec.cli").command {
  name = "train",
  summary = "train the model of a YAML config, with progress, evaluations and checkpoints",
  description = "SIGINT or SIGTERM stops it at the next step boundary with a checkpoint (with --out); "
    .. "it then exits with 130 or 143.",
  { "CONFIG", "a YAML config, or a preset in models/ (dlrm_tiny, dlrm_kaggle, dlrm_mlperf_v1, "
    .. "dlrm_mlperf_v1_2m, dlrm_dcnv2)" },
  { "--data SPEC", "training data: synthetic:NAME, criteo-tsv:PATH[,PATH...] or criteo-bin:DIR (sets data.train)" },
  { "--eval-data SPEC", "held-out data (sets data.eval; synthetic data holds out its own by default)" },
  { "--steps N", "steps to train (sets train.steps; 0: until the data ends)", type = "whole" },
  { "--set K=V", "any config value, checked by the schema: --set train.batch_size=4096, "
    .. "--set embeddings.max_rows=1000000, --set model.precision=bf16", many = true },
  { "--out RUNDIR", "write config.json (the resolved config) and metrics.jsonl there, and checkpoints into "
    .. "RUNDIR/checkpoints" },
  { "--checkpoint-every N", "save a checkpoint every N steps and at the end (sets train.checkpoint_every; "
    .. "needs --out)", type = "whole" },
  { "--keep K", "keep the newest K checkpoints (sets train.keep; 0: all; needs --out)", type = "whole" },
  { "--resume R", "go on from a checkpoint: a file, or a run directory (its newest checkpoint; the run goes on "
    .. "writing there unless --out says otherwise).  The config must be the checkpoint's but for how long the "
    .. "run goes and what it logs, saves and evaluates (--steps sets where it ends)" },
  { "--progress M", "auto (a bar on a terminal, lines elsewhere), bar, lines or none",
    choices = { "auto", "bar", "lines", "none" } },
  { "--plan FILE", "apply a plan of uvmrec plan (--out FILE): each table's placement, cache load factor, hint "
    .. "allowance and sharding; refused when it was made for another model, batch or budget; on a GPU the run "
    .. "goes under the plan's HBM budget" },
  { "--allow-nonfinite", "with --resume: take a checkpoint whose tensors hold NaN or infinity (refused by "
    .. "default, naming the tensor and its first bad element)" },
  { "--cpu", "train on the CPU even where a GPU is" },
  { "--host-memory SIZE", "refuse, before allocating anything, a run needing more host memory than SIZE "
    .. "(e.g. 120GiB: tables on the host, the loader, the day files' page cache; default: the cgroup's limit)",
    check = require("uvmrec.lib").bytes },
}
local o = cmd:parse(arg)
if o.allow_nonfinite and not o.resume then
  cmd:misuse("--allow-nonfinite takes the checkpoint --resume loads; without --resume nothing is loaded")
end

-- The flags that are config values go in as --set ones, after those given, each named by its
-- flag where a message blames it (lib.flag_set).
local sets = o.set
for _, f in ipairs { { "data", "data.train" }, { "eval_data", "data.eval" }, { "steps", "train.steps" },
                     { "checkpoint_every", "train.checkpoint_every" }, { "keep", "train.keep" } } do
  local v = o[f[1]]
  if v ~= nil then sets[#sets + 1] = require("uvmrec.lib").flag_set("--" .. f[1]:gsub("_", "-"), f[2], v) end
end
local opts = { out = o.out, resume = o.resume, progress = o.progress, cpu = o.cpu, host_memory = o.host_memory,
               allow_nonfinite = o.allow_nonfinite }

local file, ferr = train.find_config(o.config)
if not file then cmd:fail(ferr) end
local cfg, err = train.config.load(file, sets)
if not cfg then cmd:fail(err) end
opts.config_path = file
if o.plan then
  -- the ranks of this run (uvmrec launch's)
  local plan, perr = train.apply_plan(cfg, o.plan, { world = require("uvmrec.dist").environment().world })
  if not plan then cmd:fail(perr) end
  opts.plan, opts.plan_path = plan, o.plan
end
-- A run directory resumed goes on being written unless --out names another.
if opts.resume and not opts.out and require("uvmrec").C.ur_path_kind(opts.resume) == 2 then
  opts.out = opts.resume
end
local result, rerr = train.run(cfg, opts)
if not result then
  cmd:fail(require("uvmrec.data").bad_line_hint(rerr))
end
if result.interrupted then
  local sig = result.interrupted.signal
  os.exit(128 + (sig > 0 and sig or 2))
end
