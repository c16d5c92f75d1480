-- uvmrec train CONFIG [--data SPEC] [--eval-data SPEC] [--steps N] [--set k=v]... [--out RUNDIR]
--                    [--checkpoint-every N] [--keep K] [--resume RUNDIR|FILE]
--                    [--progress auto|bar|lines|none] [--cpu]
-- Trains the model of a YAML config (a file, or a preset of models/ by name: dlrm_tiny) with a
-- progress bar on a terminal (plain lines on a pipe), evaluates on held-out data every
-- eval.every steps and at the end, and writes config.json, metrics.jsonl and checkpoints/ into
-- RUNDIR.  SIGINT or SIGTERM stops it at the next step boundary with a checkpoint; it then
-- exits with 128 + the signal's number (130, 143).  The loop is lua/uvmrec/train/loop.lua.
-- Also runs as `luajit scripts/train.lua ...` with the paths from `make -s env`.
local train = require "uvmrec.train"

local usage = [[
usage: uvmrec train CONFIG [--data SPEC] [--eval-data SPEC] [--steps N] [--set key=value]...
                           [--out RUNDIR] [--checkpoint-every N] [--keep K] [--resume RUNDIR|FILE]
                           [--progress auto|bar|lines|none] [--cpu]
  CONFIG          a YAML config, or a preset in models/ (dlrm_tiny, dlrm_kaggle, dlrm_mlperf_v1,
                  dlrm_mlperf_v1_2m, dlrm_dcnv2)
  --data SPEC     training data: synthetic:NAME, criteo-tsv:PATH[,PATH...] or criteo-bin:DIR
                  (sets data.train)
  --eval-data SPEC  held-out data (sets data.eval; synthetic data holds out its own by default)
  --steps N       steps to train (sets train.steps; 0: until the data ends)
  --set k=v       any config value, checked by the schema: --set train.batch_size=4096,
                  --set embeddings.max_rows=1000000, --set model.precision=bf16
  --out RUNDIR    write config.json (the resolved config) and metrics.jsonl there, and
                  checkpoints into RUNDIR/checkpoints
  --checkpoint-every N  save a checkpoint every N steps and at the end (sets
                  train.checkpoint_every; needs --out).  SIGINT/SIGTERM always save one
                  (with --out) at the next step boundary; the exit code is then 130/143
  --keep K        keep the newest K checkpoints (sets train.keep; 0: all)
  --resume R      go on from a checkpoint: R is a file, or a run directory (its newest
                  checkpoint; the run goes on writing there unless --out says otherwise).
                  The config must be the checkpoint's but for how long the run goes and
                  what it logs, saves and evaluates (--steps sets where it ends)
  --progress M    auto (a bar on a terminal, lines elsewhere), bar, lines or none
  --cpu           train on the CPU even where a GPU is]]

local function die(msg, code)
  io.stderr:write("uvmrec train: ", msg, "\n")
  os.exit(code or 2)
end

local args = arg or {}
local path, sets, flags, opts = nil, {}, {}, {}
local i = 1
while i <= #args do
  local a = args[i]
  local k, v = a:match("^(%-%-[%w-]+)=(.*)$")
  if k then a = k; table.insert(args, i + 1, v) end
  local function value()
    i = i + 1
    if args[i] == nil then die(a .. " needs a value\n" .. usage) end
    return args[i]
  end
  if a == "--set" then sets[#sets + 1] = value()
  elseif a == "--data" then flags[#flags + 1] = "data.train=" .. value()
  elseif a == "--eval-data" then flags[#flags + 1] = "data.eval=" .. value()
  elseif a == "--steps" then flags[#flags + 1] = "train.steps=" .. value()
  elseif a == "--out" then opts.out = value()
  elseif a == "--checkpoint-every" then flags[#flags + 1] = "train.checkpoint_every=" .. value()
  elseif a == "--keep" then flags[#flags + 1] = "train.keep=" .. value()
  elseif a == "--resume" then opts.resume = value()
  elseif a == "--progress" then opts.progress = value()
  elseif a == "--cpu" then opts.cpu = true
  elseif a == "-h" or a == "--help" then print(usage) os.exit(0)
  elseif a:match("^%-%-") then die("unknown option " .. a .. "\n" .. usage)
  elseif path then die("one CONFIG, got '" .. path .. "' and '" .. a .. "'")
  else path = a end
  i = i + 1
end
if not path then die("needs a CONFIG\n" .. usage) end
local modes = { auto = true, bar = true, lines = true, none = true }
if opts.progress and not modes[opts.progress] then
  die("--progress: '" .. opts.progress .. "' is not auto, bar, lines or none")
end
for _, f in ipairs(flags) do sets[#sets + 1] = f end

local file, ferr = train.find_config(path)
if not file then die(ferr, 1) end
local cfg, err = train.config.load(file, sets)
if not cfg then die(err, 1) end
opts.config_path = file
-- A run directory resumed goes on being written unless --out names another.
if opts.resume and not opts.out and require("uvmrec").C.ur_path_kind(opts.resume) == 2 then
  opts.out = opts.resume
end
local result, rerr = train.run(cfg, opts)
if not result then die(rerr, 1) end
if result.interrupted then
  local sig = result.interrupted.signal
  os.exit(128 + (sig > 0 and sig or 2))
end
