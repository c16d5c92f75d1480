-- uvmrec plan CONFIG [--gpus N] [--hbm 16GiB] [--host-memory 256GiB] [--calibration FILE]
--                    [--profile-steps N | --counts CKPT] [--out plan.json] [options]
-- Chooses each embedding table's placement (device, managed with a hot prefix, cached with a
-- load factor, host), sharding and ranks for a training config within an HBM budget, from the
-- tables' access profiles and a calibration's measured rates (uvmrec.planner, docs/planner.md);
-- prints one row per table, the totals per rank against the budget and the predicted step, and
-- writes the plan file.  Its options are declared below (`uvmrec plan --help`).  Also
-- `luajit scripts/plan.lua ...` with the paths from `make -s env`.
local ur = require "uvmrec"
local planner = require "uvmrec.planner"
local profile = require "uvmrec.planner.profile"
local train = require "uvmrec.train"
local synthetic = require "uvmrec.data.synthetic"

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
  { "--batch N", "batch per rank (default train.batch_size)", type = "whole",
    check = function(n) return n >= 1 and n or nil, "must be at least 1" end },
  { "--set K=V", "override a config value (as uvmrec train), e.g. --set embeddings.tables.C3.placement=device",
    many = true, key = "sets" },
  { "--policy P", "the cache policy to plan cached tables with (default the config's, or lru)",
    choices = { "lru", "lfu" } },
  { "--threshold N", "the greedy search's early stop: a number (default 10), or none for no early stop",
    check = function(t)
      if t == "none" then return false end
      local n = tonumber(t)
      return n and n >= 1 and n or nil, "must be a number >= 1 or none"
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

local e = cfg.embeddings
local rows = train.config.table_rows(cfg)
local batch = o.batch or cfg.train.batch_size

-- the synthetic preset behind the config's data, when it has one: Zipf exponents, ids a sample
local synth
if cfg.data.train:match("^synthetic:") then
  synth = synthetic.resolve(cfg.data.train:match("^synthetic:(.+)$"))
end

local tables = {}
for i, r in ipairs(rows) do
  local name = "C" .. i
  local per = e.tables[name] or {}
  local fixed = {}
  if per.placement and per.placement ~= "auto" then fixed.placement = per.placement end
  if per.cache and per.cache.load_factor then fixed.load_factor = per.cache.load_factor end
  local hot = 1
  local st = synth and synth.tables[i]
  if st then
    local h = st.hot or 1
    hot = type(h) == "table" and ((h[1] or h.min) + (h[2] or h.max)) / 2 or h
  end
  tables[i] = { name = name, rows = r, dim = e.dim, dtype = per.dtype or e.dtype, optimizer = e.optimizer.name,
                hot = hot, fixed = next(fixed) and fixed or nil }
end

-- profiles
local clock = ur.C.ur_clock_seconds
local t0 = clock()
local profiles, how = {}, nil
if o.counts then
  local ck = require "uvmrec.checkpoint"
  local file, err = ck.open(train.checkpoint_file and train.checkpoint_file(o.counts) or o.counts)
  if not file then die("--counts: " .. tostring(err)) end
  local have = {}
  for _, n in ipairs(file:names()) do have[n] = true end
  for i, t in ipairs(tables) do
    local key = have["layout." .. t.name .. ".counts"] and "layout." .. t.name .. ".counts"
                or have[t.name .. ".counts"] and t.name .. ".counts"
    if not key then
      die(("--counts %s: no access counts for table %s (layout.%s.counts); train with counting on "
           .. "(hints or set_counting) to save them"):format(o.counts, t.name, t.name))
    end
    local v = file:view(key)
    if v:numel() ~= t.rows then
      die(("--counts %s: table %s has %d counts for %d rows"):format(o.counts, t.name, v:numel(), t.rows))
    end
    profiles[t.name] = profile.from_counts(v, { name = t.name, hot = tables[i].hot,
      source = ("counts of %s"):format(o.counts) })
  end
  file:close()
  how = ("access counts of %s"):format(o.counts)
elseif o.profile_steps then
  local d, derr = train.data(cfg, rows)
  if not d then die(derr) end
  local lo = {}
  for k, v in pairs(d.train) do lo[k] = v end
  lo.batch_size = batch
  local loader, lerr = ur.data.loader(lo)
  if not loader then die(lerr) end
  local out, info = profile.from_loader(loader, o.profile_steps, tables)
  loader:close()
  for _, t in ipairs(tables) do
    profiles[t.name] = out[t.name]
    t.hot = out[t.name].hot
  end
  how = ("a pass over %d batches of %s (%d samples)"):format(info.batches, cfg.data.train, info.samples)
elseif synth then
  for i, t in ipairs(tables) do
    local st = synth.tables[i]
    profiles[t.name] = profile.zipf { rows = t.rows, s = st and (st.zipf or 0) or 0, hot = t.hot, name = t.name }
  end
  how = ("the Zipf exponents of %s"):format(cfg.data.train)
else
  die(("the config's data (%s) is not synthetic: give --profile-steps N or --counts CKPT"):format(
    cfg.data.train ~= "" and cfg.data.train or "none"), 2)
end
local profile_seconds = clock() - t0

local m = cfg.model
local dense = { dense_features = m.dense_features, bottom = m.bottom_mlp, top = m.top_mlp, interaction = m.interaction,
                self_interaction = m.self_interaction, cross_layers = m.cross_layers, cross_rank = m.cross_rank,
                tables = #tables, dim = e.dim, precision = m.precision, optimizer = cfg.optimizer.name,
                momentum = cfg.optimizer.momentum }
local budget = o.hbm or cal.data.hbm_bytes
if not budget then die("--hbm SIZE is needed: the calibration does not say the device's memory", 2) end

local plan, err = planner.plan(tables, profiles, budget, {
  world = o.gpus or 1, batch = batch, calibration = cal, dense = dense, host_memory = o.host_memory,
  policy = o.policy or e.cache.policy or "lru", pipeline = cfg.train.pipeline, threshold = o.threshold,
  search = o.search, depth = cfg.data.depth })
if not plan then die(err) end
print(("uvmrec plan: %s, %d tables, profiles from %s (%.2f s)"):format(cfg.name or path, #tables, how,
  profile_seconds))
print(plan:table())
if o.out then
  local ok, serr = plan:save(o.out)
  if not ok then die(serr) end
  print("wrote " .. o.out)
end
