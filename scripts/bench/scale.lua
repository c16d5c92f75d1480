-- B5: dlrm_mlperf_v1 (187.8 M rows x 128, 89.5 GiB of f32 tables, SGD) on one GPU with its
-- embeddings' HBM capped (--hbm, 16 GiB: the HBM budget is what the same model needs in HBM
-- besides its tables, plus this), every table `cached` (rows in pinned host memory, a software
-- cache in HBM, the prefetch pipeline), fed from day files by the threaded loader.  Through
-- `uvmrec train` itself (uvmrec.train.run): the host memory the run needs is counted and
-- checked first (--host-memory), then it reports the build time, samples/s over the timed steps
-- after a warm-up, the cache's hit rate and host-link bytes a step, the peak host memory, and
-- the projected time of one Criteo 1TB epoch (4.37 G samples).  Checked: the first --check
-- steps' losses equal those of the same model with its tables in HBM (on the CPU: host tables),
-- bit for bit.  Without a GPU it runs the same flow on the config given (dlrm_tiny).
--   uvmrec scripts/bench/scale.lua --dir DAYS [--steps 2000] [--hbm 16GiB] [--out FILE]
--   uvmrec scripts/bench/scale.lua --table FILE...   (one table of every JSON line given)
local ur = require "uvmrec"
local json = require "uvmrec.json"
local train = require "uvmrec.train"
local planner = require "uvmrec.planner"
local host_memory = require "uvmrec.host_memory"
local C = ur.C
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/scale.lua",
  summary = "B5: dlrm_mlperf_v1 cached in a capped HBM, fed from day files; or --table of the scale run's results",
  { "--dir DIR", "day files (uvmrec datagen mlperf_v1 --out DIR)" },
  { "--config C", "the model (default: dlrm_mlperf_v1 on a GPU, dlrm_tiny without)" },
  { "--steps N", "timed steps", type = "whole", default = 2000 },
  { "--warm W", "steps before the timed ones", type = "whole", default = 50 },
  { "--check K", "first steps whose losses must equal all-in-HBM's (0: no check)", type = "whole", default = 4 },
  { "--hbm SIZE", "HBM for the embeddings (tables, cache, state, metadata, scratch)", default = "16GiB" },
  { "--host-memory SIZE", "refuse the run when it needs more host memory than this" },
  { "--cache-share F", "the share of --hbm given to the cache's rows; the rest holds its metadata, the " ..
    "pipeline's staged rows and scratch", type = "number", default = 0.7 },
  options.out_append,
  { "--table", "print one table of the JSON lines in the files given (the scale run's results)" },
  { "[FILES...]", "JSON line files (--table)" },
}
local o = cmd:parse(arg)
local gpu = ur.gpu()

local function emit(rec)
  rec.bench = rec.bench or "B5"
  if o.out then json.append_lines(o.out, rec) end
end

local function fmt_rate(x) return x and ("%.2f M"):format(x / 1e6) or "-" end

-- ---- --table: one table of the scale run ----
if o.table then
  local rows = {}
  for _, path in ipairs(o.files or {}) do
    for _, r in ipairs(assert(json.read_lines(path))) do rows[#rows + 1] = r end
  end
  print(("%-34s %-26s %s"):format("what", "measured", "target / note"))
  for _, r in ipairs(rows) do
    local what, got, note
    if r.bench == "datagen" then
      what, got, note = "datagen mlperf_v1", ("%.0f MB/s"):format(r.mb_per_s), ">= 500 MB/s"
    elseif r.bench == "B8" then
      what, got, note = ("B8 loader, %d threads"):format(r.threads), fmt_rate(r.samples_per_s) .. " samples/s",
        ">= 10 M samples/s at 16 cores"
    elseif r.bench == "build" then
      what, got = ("build, %s, %d threads"):format(r.placement, r.threads), ("%.2f s/GiB"):format(r.wall_s_per_gib)
      note = ("dlrm_mlperf_v1 predicted %.0f s (< 60 s)"):format(r.predicted_mlperf_s)
    elseif r.bench == "B5" and r.mode == "timed" then
      what, got = "B5 " .. r.config .. " cached", fmt_rate(r.samples_per_s) .. " samples/s"
      note = (">= 5 M; hit %.1f%%, link %.0f MB/step, epoch %.1f min, built %.0f s, host peak %.1f GiB"):format(
        100 * r.hit_rate, r.link_bytes_per_step / 1e6, r.epoch_minutes, r.build_seconds, r.host_peak_bytes / 2 ^ 30)
    elseif r.bench == "B5" and r.mode == "check" then
      what, got, note = "B5 first losses vs all in HBM", r.equal and "equal" or "DIFFER", ("%d steps"):format(r.steps)
    end
    if what then print(("%-34s %-26s %s"):format(what, got, note)) end
  end
  os.exit(0)
end

if not o.dir then cmd:misuse("needs --dir DAYS (or --table FILE...)") end
local config = o.config or (gpu and "dlrm_mlperf_v1" or "dlrm_tiny")
local hbm = ur.bytes(o.hbm)

-- One run of `uvmrec train`: the config with sets, steps, a run directory for the losses;
-- returns the result, the losses logged, the build seconds, the cache's statistics (or nil) and
-- the tables' bytes.  The tables (and the cache) are freed before it returns: the next run
-- builds 89.5 GiB again.
local function run(sets, steps, log_every, hooks)
  local path = assert(train.find_config(config))
  -- MLPerf's SGD lr of 24 without its warm-up schedule makes the losses NaN in a few steps
  local all = { "eval.samples=0", "eval.min_auc=0", "train.log_every=" .. log_every, "train.steps=" .. steps,
                "train.epochs=1000", "data.depth=4" } -- epochs: the steps end the run, the data cycles
  if config:match("mlperf") then all[#all + 1] = "optimizer.lr=1.0" end
  for _, s in ipairs(sets) do all[#all + 1] = s end
  local cfg = assert(train.config.load(path, all))
  cfg.data.train = "criteo-bin:" .. o.dir
  local dir = os.tmpname()
  os.remove(dir)
  local t0, built, cache, model = C.ur_clock_seconds(), nil, nil, nil
  local r, err = train.run(cfg, {
    config_path = path, out = dir, progress = "none", print = function() end, host_memory = o.host_memory,
    setup = function(ctx)
      built = C.ur_clock_seconds() - t0
      model = ctx.model
      cache = ctx.model.embeddings.tbe.cache
    end,
    hooks = hooks,
  })
  if not r then
    local m = ur.memory()
    cmd:fail(("%s (HBM in use %s, peak %s, budget %s)"):format(err, planner.fmt_bytes(m.hbm_used),
      planner.fmt_bytes(m.hbm_peak), planner.fmt_bytes(m.hbm_budget)))
  end
  local losses = {}
  for _, l in ipairs(assert(json.read_lines(dir .. "/metrics.jsonl"))) do
    if l.event == "train" then losses[l.step] = l.loss end
  end
  os.execute("rm -rf '" .. dir .. "'")
  local cstats = cache and cache:stats()
  local table_bytes = model:stats().table_bytes
  model.embeddings.tbe:free()
  collectgarbage()
  return r, losses, built, cstats, table_bytes
end

print(("B5: %s, every table cached with %s of HBM for the embeddings, fed from %s"):format(config, o.hbm, o.dir))
local B = assert(train.config.load(assert(train.find_config(config)))).train.batch_size

-- What the model needs in HBM besides its tables: measured with them in HBM (the check run).
local base_losses, rest
local shuffle = "data.shuffle_window=" .. 4 * B
if o.check > 0 then
  ur.set_hbm_budget(0)
  local _, losses, built, _, table_bytes = run({ "embeddings.placement=" .. (gpu and "device" or "host"), shuffle },
                                                o.check, 1)
  base_losses = losses
  rest = math.max(0, ur.memory().hbm_peak - table_bytes)
  print(("all in HBM: built in %.1f s, %d check steps; HBM besides the tables %s"):format(built, o.check,
    planner.fmt_bytes(rest)))
end
rest = rest or 8 * 2 ^ 30
if gpu then ur.set_hbm_budget(rest + hbm) end
local cache_sets = { "embeddings.placement=cached",
                     ("embeddings.cache.bytes=%d"):format(math.floor(hbm * o.cache_share)),
                     "train.pipeline=true", shuffle }

if o.check > 0 then
  local _, losses, built = run(cache_sets, o.check, 1)
  local equal = true
  for s = 1, o.check do equal = equal and losses[s] == base_losses[s] end
  print(("cached: built in %.1f s; first %d losses %s all-in-HBM's"):format(built, o.check,
    equal and "equal" or "DIFFER from"))
  emit { mode = "check", config = config, steps = o.check, equal = equal, losses = losses, base = base_losses }
  if not equal then cmd:fail("check: the cached run's first losses differ from all-in-HBM's") end
end

-- The timed run: warm-up, then the timed steps (the clock read at their first and last).
local t_warm, cache_ref
local t_end
local hooks = { { after = function(_, at)
  if at.step == o.warm then
    if gpu then C.ur_device_sync() end
    t_warm = C.ur_clock_seconds()
    cache_ref = at.model.embeddings.tbe.cache
    if cache_ref then cache_ref:reset_stats() end
  elseif at.step == o.warm + o.steps then
    if gpu then C.ur_device_sync() end
    t_end = C.ur_clock_seconds()
  end
end } }
local r, _, built, cstats = run(cache_sets, o.warm + o.steps, o.warm + o.steps, hooks)
local secs = t_end - t_warm
local rate = o.steps * B / secs
local s = cstats or { hits = 0, unique = 1, bytes_in = 0, bytes_out = 0, bytes_ids = 0 }
local rec = { mode = "timed", config = config, steps = o.steps, batch = B, samples_per_s = rate,
              hit_rate = s.hits / math.max(s.unique, 1),
              link_bytes_per_step = (s.bytes_in + s.bytes_out + s.bytes_ids) / o.steps,
              epoch_minutes = 4.37e9 / rate / 60, build_seconds = built, host_peak_bytes = host_memory.peak() or 0,
              hbm_embeddings = hbm, hbm_peak = ur.memory().hbm_peak, hbm_rest = rest, cache_share = o.cache_share,
              loss = r.loss }
emit(rec)
print(("%-12s %14s %10s %16s %14s %12s %14s"):format("steps", "samples/s", "hit rate", "host link/step",
  "1TB epoch", "built", "host peak"))
print(("%-12d %14.0f %9.1f%% %13.1f MB %11.1f min %10.1f s %11.1f GiB"):format(o.steps, rate, 100 * rec.hit_rate,
  rec.link_bytes_per_step / 1e6, rec.epoch_minutes, built, rec.host_peak_bytes / 2 ^ 30))
