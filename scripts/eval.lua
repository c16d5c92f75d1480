-- `uvmrec eval`: evaluates the model of a config on held-out data: AUC, NE, log loss, accuracy,
-- calibration and CTR (eval.metrics), and for synthetic data the hidden model's AUC beside them.
-- The weights are a checkpoint's (a file, or a run directory's newest), else the config's model
-- as built (seeded).  CONFIG may be an exported model file instead (`uvmrec export`): it is then
-- served through the serving API (uvmrec.serve), by default on the training run's held-out
-- samples, the ones its final evaluation scored.  Its options are declared below (`uvmrec eval --help`).  Also runs as
-- `luajit scripts/eval.lua ...` with the paths from `make -s env`.
local train = require "uvmrec.train"

local cmd = require("uvmrec.cli").command {
  name = "eval",
  summary = "evaluate a config's model (or a checkpoint of it) on held-out data: AUC, NE, log loss, ...",
  { "CONFIG", "a YAML config, a preset in models/ (dlrm_tiny, dlrm_kaggle, ...), or a model file (uvmrec export)" },
  { "--data SPEC", "what to evaluate on: synthetic:NAME (eval.samples held-out samples, from sample 2^48, "
    .. "which training never reaches), criteo-tsv:PATH[,PATH...] or criteo-bin:DIR (all, or the first "
    .. "eval.samples); default: the config's data.eval or data.train; for a model file, the training "
    .. "run's held-out samples" },
  { "--checkpoint C", "the weights: a checkpoint file, or a run directory (its newest checkpoint); the model's "
    .. "config must be the checkpoint's" },
  { "--set K=V", "any config value, checked by the schema", many = true },
  { "--out RUNDIR", "append the result to RUNDIR/metrics.jsonl" },
  { "--allow-nonfinite", "take a checkpoint whose tensors hold NaN or infinity (refused by default, naming "
    .. "the tensor and its first bad element)" },
  { "--cpu", "evaluate on the CPU even where a GPU is" },
}
local o = cmd:parse(arg)
if o.allow_nonfinite and not o.checkpoint then
  cmd:misuse("--allow-nonfinite takes the checkpoint --checkpoint loads; without --checkpoint nothing is loaded")
end
local opts = { data = o.data, out = o.out, checkpoint = o.checkpoint, cpu = o.cpu, allow_nonfinite = o.allow_nonfinite }

local serve = require "uvmrec.serve"
if serve.is_model_file(o.config) then
  if o.checkpoint or #o.set > 0 then cmd:misuse("a model file takes neither --checkpoint nor --set") end
  local m, err = serve.open(o.config, { device = o.cpu and "cpu" or nil })
  if not m then cmd:fail(err) end
  -- made before the work, as for a config: a bad --out fails now, not after the evaluation
  local log, lerr = train.run_dir(o.out)
  if not log then cmd:fail(lerr) end
  local info = m:info()
  print(("uvmrec eval: model file %s (%s interaction, %s, %s dense, %d bytes)"):format(o.config,
    info.interaction, require("uvmrec.lib").things(info.num_tables, "table"), info.dense_dtype, info.file_bytes))
  local r, rerr = serve.evaluate(m, o.data)
  if not r then cmd:fail(rerr) end
  print("data: " .. r.what)
  print(("eval: %s  (%s, %.1f s)"):format(train.evaluate.format(r, r.metrics),
                                         train.evaluate.count(r), r.seconds))
  log.line(train.evaluate.log_line(r, { event = "eval", model = o.config }))
  log.close()
  m:close()
  return
end

local file, ferr = train.find_config(o.config)
if not file then cmd:fail(ferr) end
local cfg, err = train.config.load(file, o.set)
if not cfg then cmd:fail(err) end
opts.config_path = file
local result, rerr = train.eval(cfg, opts)
if not result then
  cmd:fail(require("uvmrec.data").bad_line_hint(rerr))
end
