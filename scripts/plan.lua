-- uvmrec plan CONFIG [--gpus N] [--hbm 16GiB] [--host-memory 256GiB] [--calibration FILE]
--                    [--profile-steps N | --counts CKPT] [--out plan.json] [options]
-- Chooses each embedding table's placement (device, managed with a hot prefix, cached with a
-- load factor, host), sharding and ranks for a training config within an HBM budget, from the
-- tables' access profiles and a calibration's measured rates (uvmrec.planner, docs/planner.md);
-- prints one row per table, the totals per rank against the budget and the predicted step, and
-- writes the plan file.  Its options are declared below (`uvmrec plan --help`).  Also
-- `luajit scripts/plan.lua ...` with the paths from `make -s env`.
local planner = require "uvmrec.planner"
local train = require "uvmrec.train"

local cmd = require("uvmrec.cli").command {
  name = "plan",
  summary = "choose each embedding table's placement, cache size and sharding within an HBM budget",
  { "CONFIG", "a config file or a preset of models/ (dlrm_kaggle, ...)" },
  { "--gpus N", "ranks to plan for", type = "whole", default = 1,
    check = function(n) return n >= 1 and n or nil, "must be at least 1" end },
  { "--hbm SIZE", "HBM budget per rank, e.g. 16GiB (default: the calibration's device memory)" },
  { "--host-memory SIZE", "host memory for all ranks' host-side tables (default: not checked)" },
  { "--calibration C", "h200, cpu, or a calibration file (uvmrec calibrate --out FILE)", default = "h200" },
  { "--profile-steps N", "profile the tables from N batches of the config's data", type = "whole",
    check = function(n) return n >= 1 and n or nil, "must be at least 1" end },
  { "--counts CKPT", "profile them from the access counts saved in a checkpoint (default: the synthetic "
    .. "preset's Zipf exponents, for synthetic data)" },
  { "--out FILE", "write the plan (JSON; a .yaml name gets the same text, which YAML reads)" },
  { "--batch N", "batch per rank (default train.batch_size over --gpus: each rank's slice)", type = "whole",
    check = function(n) return n >= 1 and n or nil, "must be at least 1" end },
  { "--set K=V", "override a config value (as uvmrec train), e.g. --set embeddings.tables.C3.placement=device",
    many = true, key = "sets" },
  { "--policy P", "the cache policy to plan cached tables with (default the config's, or lru)",
    choices = { "lru", "lfu" } },
  { "--threshold N", "the greedy search's early stop: proposals without improvement (default 10), or none",
    check = function(t)
      if t == "none" then return false end
      local n = tonumber(t)
      return n and n >= 1 and n < math.huge and n == math.floor(n) and n or nil, "must be a whole number >= 1 or none"
    end },
  { "--search S", "auto (exhaustive for small instances), greedy or exhaustive", choices = { "auto", "greedy",
    "exhaustive" } },
  mutex = { { "--profile-steps", "--counts" } },
}
local o = cmd:parse(arg)
local function die(msg, code)
  if code == 2 then cmd:misuse(msg) end
  cmd:fail(msg, code)
end

local path, ferr = train.find_config(o.config)
if not path then die(ferr, 2) end
local cfg, cerr = train.config.load(path, o.sets)
if not cfg then die(cerr, 2) end
local cal, calerr = planner.calib.find(o.calibration)
if not cal then die(calerr, 2) end

local prob, perr, pcode = planner.from_config(cfg, { world = o.gpus or 1, batch = o.batch, counts = o.counts,
                                                    profile_steps = o.profile_steps })
if not prob then die(perr, pcode) end
local tables, profiles, dense, batch, how = prob.tables, prob.profiles, prob.dense, prob.batch, prob.how
local profile_seconds = prob.seconds
local e = cfg.embeddings
local budget = o.hbm or cal.data.hbm_bytes
if not budget then die("--hbm SIZE is needed: the calibration does not say the device's memory", 2) end

local plan, err = planner.plan(tables, profiles, budget, {
  world = o.gpus or 1, batch = batch, calibration = cal, dense = dense, host_memory = o.host_memory,
  policy = o.policy or e.cache.policy or "lru", pipeline = cfg.train.pipeline, threshold = o.threshold,
  search = o.search, depth = cfg.data.depth, loader = prob.loader, hints_every = prob.hints_every })
if not plan then die(err) end
print(("uvmrec plan: %s, %s, profiles from %s (%.2f s)"):format(cfg.name or path,
  train.progress.things(#tables, "table"), how, profile_seconds))
print(plan:table())
if o.out then
  local ok, serr = plan:save(o.out)
  if not ok then die(serr) end
  print("wrote " .. o.out)
end
