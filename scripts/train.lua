-- uvmrec train CONFIG [--data SPEC] [--eval-data SPEC] [--steps N] [--set k=v]... [--out RUNDIR]
--                    [--progress auto|bar|lines|none] [--cpu]
-- Trains the model of a YAML config (a file, or a preset of models/ by name: dlrm_tiny) with a
-- progress bar on a terminal (plain lines on a pipe), evaluates on held-out data every
-- eval.every steps and at the end, and writes config.json and metrics.jsonl into RUNDIR.
-- The loop is lua/uvmrec/train/loop.lua.  Also runs as `luajit scripts/train.lua ...` with the
-- paths from `make -s env`.
local train = require "uvmrec.train"

local usage = [[
usage: uvmrec train CONFIG [--data SPEC] [--eval-data SPEC] [--steps N] [--set key=value]...
                           [--out RUNDIR] [--progress auto|bar|lines|none] [--cpu]
  CONFIG          a YAML config, or a preset in models/ (dlrm_tiny, dlrm_kaggle, dlrm_mlperf_v1,
                  dlrm_mlperf_v1_2m, dlrm_dcnv2)
  --data SPEC     training data: synthetic:NAME, criteo-tsv:PATH[,PATH...] or criteo-bin:DIR
                  (sets data.train)
  --eval-data SPEC  held-out data (sets data.eval; synthetic data holds out its own by default)
  --steps N       steps to train (sets train.steps; 0: until the data ends)
  --set k=v       any config value, checked by the schema: --set train.batch_size=4096,
                  --set embeddings.max_rows=1000000, --set model.precision=bf16
  --out RUNDIR    write config.json (the resolved config) and metrics.jsonl there
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
local result, rerr = train.run(cfg, opts)
if not result then die(rerr, 1) end
