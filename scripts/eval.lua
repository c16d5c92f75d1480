-- uvmrec eval CONFIG --data SPEC [--checkpoint FILE|RUNDIR] [--set k=v]... [--out RUNDIR] [--cpu]
-- Evaluates the model of a config on held-out data: AUC, NE, log loss, accuracy, calibration
-- and CTR (eval.metrics), and for synthetic data the hidden model's AUC beside them.  The
-- weights are a checkpoint's (a file, or a run directory's newest), else the config's model
-- as built (seeded).  Also runs as `luajit scripts/eval.lua ...` with the paths from
-- `make -s env`.
local train = require "uvmrec.train"

local usage = [[
usage: uvmrec eval CONFIG --data SPEC [--checkpoint FILE|RUNDIR] [--set key=value]... [--out RUNDIR]
                          [--cpu]
  CONFIG        a YAML config, or a preset in models/ (dlrm_tiny, dlrm_kaggle, ...)
  --data SPEC   what to evaluate on: synthetic:NAME (the samples after the config's training
                ones, eval.samples of them), criteo-tsv:PATH[,PATH...] or criteo-bin:DIR (all,
                or the first eval.samples); default: the config's data.eval or data.train
  --checkpoint C  the weights: a checkpoint file, or a run directory (its newest checkpoint);
                the model's config must be the checkpoint's.  For synthetic data give the
                training's --set train.steps / data.samples: the held-out samples follow them
  --set k=v     any config value, checked by the schema
  --out RUNDIR  append the result to RUNDIR/metrics.jsonl
  --cpu         evaluate on the CPU even where a GPU is]]

local function die(msg, code)
  io.stderr:write("uvmrec eval: ", msg, "\n")
  os.exit(code or 2)
end

local args = arg or {}
local path, sets, opts = nil, {}, {}
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
  elseif a == "--data" then opts.data = value()
  elseif a == "--out" then opts.out = value()
  elseif a == "--checkpoint" then opts.checkpoint = value()
  elseif a == "--cpu" then opts.cpu = true
  elseif a == "-h" or a == "--help" then print(usage) os.exit(0)
  elseif a:match("^%-%-") then die("unknown option " .. a .. "\n" .. usage)
  elseif path then die("one CONFIG, got '" .. path .. "' and '" .. a .. "'")
  else path = a end
  i = i + 1
end
if not path then die("needs a CONFIG\n" .. usage) end

local file, ferr = train.find_config(path)
if not file then die(ferr, 1) end
local cfg, err = train.config.load(file, sets)
if not cfg then die(err, 1) end
opts.config_path = file
local result, rerr = train.eval(cfg, opts)
if not result then die(rerr, 1) end
