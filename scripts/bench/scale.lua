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
-- Without --dir the config's own synthetic data (data.train = "synthetic:...") feeds it, drawn on
-- the GPU where it is used (uvmrec.data.generator; in order, no shuffle window): first a timed
-- run with every table in HBM (on the CPU: host tables), the reference, then one timed run
-- cached for each size of --hbm (a list); each reports samples/s and its HBM peak, the cached
-- ones the hit rate and host-link bytes a step, and each cached run's first --check losses (read
-- in its warm-up) must equal the reference's, bit for bit.  Each run builds the tables anew.
--   uvmrec scripts/bench/scale.lua --dir DAYS [--steps 2000] [--hbm 16GiB] [--out FILE]
--   uvmrec scripts/bench/scale.lua --config dlrm_dcnv2 --steps 500 --hbm 16GiB,32GiB [--out FILE]
--   uvmrec scripts/bench/scale.lua --table FILE...   (one table of every JSON line given)
local ur = require "uvmrec"
local json = require "uvmrec.json"
local caches = require "uvmrec.cache"
local train = require "uvmrec.train"
local planner = require "uvmrec.planner"
local host_memory = require "uvmrec.host_memory"
local C = ur.C
local cli = require "uvmrec.cli"
local options = cli.options

local cmd = cli.command {
  name = "scripts/bench/scale.lua",
  summary = "B5: dlrm_mlperf_v1 cached in a capped HBM, fed from day files (or a config's synthetic data, " ..
    "against all in HBM); or --table of the scale run's results",
  { "--dir DIR", "day files (uvmrec datagen mlperf_v1 --out DIR); without it the config's synthetic data" },
  { "--config C", "the model (default: dlrm_mlperf_v1 on a GPU, dlrm_tiny without)" },
  { "--steps N", "timed steps", type = "whole", default = 2000 },
  { "--warm W", "steps before the timed ones", type = "whole", default = 50 },
  { "--check K", "first steps whose losses must equal all-in-HBM's (0: no check)", type = "whole", default = 4 },
  { "--hbm SIZE", "HBM for the embeddings (tables, cache, state, metadata, scratch); without --dir a list " ..
    "(16GiB,32GiB), one cached run each", type = "list", default = { "16GiB" } },
  { "--host-memory SIZE", "refuse the run when it needs more host memory than this" },
  { "--cache-share F", "the share of --hbm given to the cache's rows; the rest holds its metadata, the " ..
    "pipeline's staged rows and scratch", type = "number", default = 0.7 },
  options.set,
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
    elseif r.bench == "scale" and r.mode == "timed" then
      local where = r.placement == "cached" and "cached " .. planner.fmt_bytes(r.hbm_embeddings) or "all in HBM"
      what, got = ("%s %s"):format(r.config, where), fmt_rate(r.samples_per_s) .. " samples/s"
      note = ("%s%d steps, HBM peak %s, built %.0f s, host peak %.1f GiB"):format(
        r.placement == "cached" and ("hit %.1f%%, link %.0f MB/step, "):format(100 * r.hit_rate,
          r.link_bytes_per_step / 1e6) or "", r.steps, planner.fmt_bytes(r.hbm_peak), r.build_seconds,
        r.host_peak_bytes / 2 ^ 30)
    elseif r.bench == "scale" and r.mode == "error" then
      what = ("%s %s"):format(r.config, r.placement == "cached" and "cached " .. planner.fmt_bytes(r.hbm_embeddings)
        or "all in HBM")
      got, note = "FAILED", r.error
    elseif r.bench == "scale" and r.mode == "check" then
      what = ("%s first losses, %s vs all in HBM"):format(r.config, planner.fmt_bytes(r.hbm_embeddings))
      got, note = r.equal and "equal" or "DIFFER", ("%d steps"):format(r.steps)
    end
    if what then print(("%-34s %-26s %s"):format(what, got, note)) end
  end
  os.exit(0)
end

local config = o.config or (gpu and "dlrm_mlperf_v1" or "dlrm_tiny")
local config_path = assert(train.find_config(config))
local base_cfg = assert(train.config.load(config_path, o.set or {}))
local synthetic = not o.dir
if synthetic and not base_cfg.data.train:match("^synthetic:") then
  cmd:misuse(("needs --dir DAYS: %s's data.train is '%s', not synthetic:NAME"):format(config, base_cfg.data.train))
end
local sizes = {}
for _, size in ipairs(o.hbm) do sizes[#sizes + 1] = { text = size, bytes = ur.bytes(size) } end
local hbm_text = table.concat(o.hbm, ",")
if o.dir and #sizes > 1 then
  cmd:misuse(("--hbm %s: one size with --dir"):format(hbm_text))
end
if synthetic and o.check > o.warm then
  cmd:misuse(("--check %d: the checked steps are read in the warm-up of %d (--warm)"):format(o.check, o.warm))
end
local hbm = sizes[1].bytes

-- What ur.memory() counts per category, each of which must be back to its level before a run
-- (or below) once the run's model is freed; HBM in use must too, but for the growth of the GPU
-- backend's dense workspaces (the default stream's is kept for the process's later matrix
-- products: docs/tensors.md), the one thing the engine keeps past a run by design.
local HELD = { "host", "pinned", "device", "managed", "managed_on_gpu" }

-- Frees a run's tables (tbe: nil when the run failed before building them) explicitly
-- (tbe:free); the dense parameters and optimizer state have no free of their own, so full
-- collections end them here, not at the collector's later timing (the caller holds no
-- reference to the model by then, and nothing else may: two cycles, as objects kept alive by a
-- finalized one go in the next).  Returns whether the tables were freed, the message naming the
-- bytes the engine still holds past `before` (ur.memory() taken before the run), by category
-- and in HBM past the workspaces' growth (nil where none), and the free's failure (or nil).
local function release(tbe, before)
  local ok, err = true, nil
  if tbe then ok, err = pcall(tbe.free, tbe) end
  local freed = not ok and ("freeing the tables failed: " .. tostring(err)) or nil
  collectgarbage()
  collectgarbage()
  local m = ur.memory()
  local ws = m.workspace - before.workspace
  local msgs = {}
  for _, k in ipairs(HELD) do
    local d = m[k] - before[k]
    if d > 0 then msgs[#msgs + 1] = ("%s %+d bytes (%s before the run)"):format(k, d, planner.fmt_bytes(before[k])) end
  end
  local past = m.hbm_used - before.hbm_used - math.max(ws, 0)
  if past > 0 then
    msgs[#msgs + 1] = ("HBM in use %+d bytes past the workspaces' growth (%s before the run, %s after; workspaces "
      .. "%s, %s)"):format(past, planner.fmt_bytes(before.hbm_used), planner.fmt_bytes(m.hbm_used),
      planner.fmt_bytes(before.workspace), planner.fmt_bytes(m.workspace))
  end
  if #msgs == 0 then return ok, nil, freed end
  return ok, "the engine still holds memory after the run's model was freed and collected: "
    .. table.concat(msgs, ", "), freed
end

-- One run of `uvmrec train`: the config with sets, steps, a run directory for the losses;
-- returns the result, the losses logged, the build seconds, the cache's statistics (or nil) and
-- the tables' bytes.  The model is freed before it returns (release: the next run builds 89.5
-- GiB again), and a run after which the engine still holds memory past its level before the run
-- fails, naming the bytes; a failed run returns nil and its message (with the traceback of an
-- error raised).
local function run(sets, steps, log_every, hooks)
  local all = { "eval.samples=0", "eval.every=0", "eval.min_auc=0", "train.log_every=" .. log_every,
                "train.steps=" .. steps, "train.epochs=1000", "data.depth=4" }
  -- epochs: the steps end the run, the data cycles
  for _, s in ipairs(cli.bench_sets(config)) do all[#all + 1] = s end
  for _, s in ipairs(o.set or {}) do all[#all + 1] = s end
  for _, s in ipairs(sets) do all[#all + 1] = s end
  local cfg = assert(train.config.load(config_path, all))
  if o.dir then cfg.data.train = "criteo-bin:" .. o.dir end
  local dir = os.tmpname()
  os.remove(dir)
  local before = ur.memory()
  local t0, built, cache, model = C.ur_clock_seconds(), nil, nil, nil
  local ok, r, err = xpcall(train.run, debug.traceback, cfg, {
    config_path = config_path, out = dir, progress = "none", print = function() end, host_memory = o.host_memory,
    setup = function(ctx)
      built = C.ur_clock_seconds() - t0
      model = ctx.model
      cache = ctx.model.embeddings.tbe.cache
    end,
    hooks = hooks,
  })
  if not ok then r, err = nil, tostring(r) end
  local losses, cstats, table_bytes = {}, nil, nil
  if r then
    for _, l in ipairs(assert(json.read_lines(dir .. "/metrics.jsonl"))) do
      if l.event == "train" then losses[l.step] = l.loss end
    end
    cstats = cache and cache:stats()
    table_bytes = model:stats().table_bytes
  end
  os.execute("rm -rf '" .. dir .. "'")
  local m = ur.memory() -- the failed run's HBM, before its model is freed
  -- nothing of the run is held past here but its tables' handle (setup's upvalues included)
  local tbe = model and model.embeddings.tbe
  model, cache = nil, nil -- luacheck: ignore 311 (setup's upvalues: the model is let go)
  local tbe_ok, left, freed = release(tbe, before)
  if r and not tbe_ok then r, err, m = nil, freed, ur.memory() end
  -- On the H200 (01846b7) 2.2 GiB of HBM, the dense side, stayed after B5's reference run: LuaJIT's
  -- traces kept the run's hook closures and with them the model (docs/results.md, the eighth
  -- session); a run that leaves anything held fails.
  if r and left then r, err, m, left = nil, left, ur.memory(), nil end
  if not r then
    local msg = ("%s (HBM in use %s, peak %s, budget %s)"):format(err, planner.fmt_bytes(m.hbm_used),
      planner.fmt_bytes(m.hbm_peak), planner.fmt_bytes(m.hbm_budget))
    if left then msg = msg .. "; then " .. left end
    -- B5 stops; the synthetic runs go on to the next size (one GPU call runs them all)
    if not synthetic then cmd:fail(msg) end
    return nil, msg
  end
  return r, losses, built, cstats, table_bytes
end

-- A timed run: warm-up, then the timed steps (the clock read at their first and last); the
-- losses of steps 1..--check read into `first` (a table) when given.  Returns its record (mode
-- "timed") and the tables' bytes; nil and the failure's message when the run failed (the
-- synthetic runs).
local B = base_cfg.train.batch_size
local function timed(sets, first)
  local t_warm, t_end
  local hooks = { { after = function(_, at)
    if first and at.step <= o.check then first[at.step] = at.loss:get(0) end
    if at.step == o.warm then
      if gpu then C.ur_device_sync() end
      t_warm = C.ur_clock_seconds()
      local cache = at.model.embeddings.tbe.cache
      if cache then cache:reset_stats() end
    elseif at.step == o.warm + o.steps then
      if gpu then C.ur_device_sync() end
      t_end = C.ur_clock_seconds()
    end
  end } }
  local r, failed, built, cstats, table_bytes = run(sets, o.warm + o.steps, o.warm + o.steps, hooks)
  if not r then return nil, failed end
  local rate = o.steps * B / (t_end - t_warm)
  local cs = cstats and caches.per_step(cstats, o.steps)
  return { mode = "timed", config = config, steps = o.steps, batch = B, samples_per_s = rate,
           hit_rate = cs and cs.hit_rate or 0, link_bytes_per_step = cs and cs.link_bytes or 0, cache = cs,
           epoch_minutes = 4.37e9 / rate / 60, build_seconds = built, host_peak_bytes = host_memory.peak() or 0,
           hbm_peak = ur.memory().hbm_peak, loss = r.loss }, table_bytes
end

local cache_sets = function(bytes, extra)
  local sets = { "embeddings.placement=cached", ("embeddings.cache.bytes=%d"):format(math.floor(bytes * o.cache_share)),
                 "train.pipeline=true" }
  for _, s in ipairs(extra) do sets[#sets + 1] = s end
  return sets
end
local in_hbm = "embeddings.placement=" .. (gpu and "device" or "host")

if synthetic then
  -- The reference, every table in HBM: its samples/s, its first losses, and what the model needs
  -- in HBM besides its tables (the cached runs' budget is that plus --hbm).
  print(("%s fed from %s (drawn %s), %d timed steps after %d: all in HBM, then cached in %s"):format(config,
    base_cfg.data.train, gpu and "on the GPU" or "on the CPU", o.steps, o.warm, hbm_text))
  local function show(what, rec)
    print(("%-16s %12.0f samples/s  built %6.1f s  HBM peak %s"):format(what, rec.samples_per_s, rec.build_seconds,
      planner.fmt_bytes(rec.hbm_peak)))
    if rec.cache then print(("%-16s cache: %s"):format("", caches.step_line(rec.cache))) end
  end
  -- A failed run is a line of its own (mode "error") and fails the command at the end, after the
  -- other runs.
  local failed = {}
  local function failure(placement, size, msg)
    print(("%s: failed: %s"):format(placement == "hbm" and "all in HBM" or "cached " .. size.text, msg))
    emit { bench = "scale", mode = "error", config = config, placement = placement,
           hbm_embeddings = size and size.bytes, error = msg }
    failed[#failed + 1] = placement == "hbm" and "all in HBM" or size.text
  end
  ur.set_hbm_budget(0)
  ur.reset_hbm_peak()
  local base = {}
  local ref, table_bytes = timed({ in_hbm }, base)
  local rest -- without the reference the cached runs have no budget but their cache's size
  if ref then
    rest = math.max(0, ref.hbm_peak - table_bytes)
    ref.bench, ref.placement, ref.data, ref.hit_rate, ref.link_bytes_per_step, ref.epoch_minutes =
      "scale", "hbm", base_cfg.data.train, nil, nil, nil
    ref.hbm_rest, ref.table_bytes = rest, table_bytes
    emit(ref)
    show("all in HBM", ref)
  else
    failure("hbm", nil, table_bytes)
  end
  for _, size in ipairs(sizes) do
    if gpu and rest then ur.set_hbm_budget(rest + size.bytes) end
    ur.reset_hbm_peak()
    local first = {}
    local rec, err = timed(cache_sets(size.bytes, {}), first)
    if not rec then
      failure("cached", size, err)
    else
      rec.bench, rec.placement, rec.data, rec.epoch_minutes = "scale", "cached", base_cfg.data.train, nil
      rec.hbm_embeddings, rec.hbm_rest, rec.cache_share = size.bytes, rest, o.cache_share
      emit(rec)
      show("cached " .. size.text, rec)
      if o.check > 0 and ref then
        local equal = true
        for s = 1, o.check do equal = equal and first[s] == base[s] end
        print(("cached %s: first %d losses %s all-in-HBM's"):format(size.text, o.check,
          equal and "equal" or "DIFFER from"))
        emit { bench = "scale", mode = "check", config = config, hbm_embeddings = size.bytes, steps = o.check,
               equal = equal, losses = first, base = base }
        if not equal then failed[#failed + 1] = size.text .. " (first losses differ from all-in-HBM's)" end
      end
    end
  end
  if #failed > 0 then cmd:fail("failed: " .. table.concat(failed, ", ")) end
  os.exit(0)
end

print(("B5: %s, every table cached with %s of HBM for the embeddings, fed from %s"):format(config, hbm_text, o.dir))

-- What the model needs in HBM besides its tables: measured with them in HBM (the check run).
local base_losses, rest
local shuffle = "data.shuffle_window=" .. 4 * B
if o.check > 0 then
  ur.set_hbm_budget(0)
  local _, losses, built, _, table_bytes = run({ in_hbm, shuffle }, o.check, 1)
  base_losses = losses
  rest = math.max(0, ur.memory().hbm_peak - table_bytes)
  print(("all in HBM: built in %.1f s, %d check steps; HBM besides the tables %s"):format(built, o.check,
    planner.fmt_bytes(rest)))
end
rest = rest or 8 * 2 ^ 30
if gpu then ur.set_hbm_budget(rest + hbm) end

if o.check > 0 then
  local _, losses, built = run(cache_sets(hbm, { shuffle }), o.check, 1)
  local equal = true
  for s = 1, o.check do equal = equal and losses[s] == base_losses[s] end
  print(("cached: built in %.1f s; first %d losses %s all-in-HBM's"):format(built, o.check,
    equal and "equal" or "DIFFER from"))
  emit { mode = "check", config = config, steps = o.check, equal = equal, losses = losses, base = base_losses }
  if not equal then cmd:fail("check: the cached run's first losses differ from all-in-HBM's") end
end

local rec = timed(cache_sets(hbm, { shuffle }))
rec.hbm_embeddings, rec.hbm_rest, rec.cache_share = hbm, rest, o.cache_share
emit(rec)
print(("%-12s %14s %10s %16s %14s %12s %14s"):format("steps", "samples/s", "hit rate", "host link/step",
  "1TB epoch", "built", "host peak"))
print(("%-12d %14.0f %9.1f%% %13.1f MB %11.1f min %10.1f s %11.1f GiB"):format(o.steps, rec.samples_per_s,
  100 * rec.hit_rate, rec.link_bytes_per_step / 1e6, rec.epoch_minutes, rec.build_seconds,
  rec.host_peak_bytes / 2 ^ 30))
