-- B10 (BENCH.md): the planner's predicted step against the measured one, and its plan against
-- hand-made ones, on this machine (the CPU backend, or the GPU).  For a training config, each
-- case is a plan file applied by `uvmrec train --plan`'s path (train.apply_plan, train.run under
-- the plan's HBM budget): the hand-made ones (every table device, cached at --fraction, managed
-- with a --fraction hot prefix, host) re-predicted by planner.evaluate, and `planned`, the
-- planner's own plan in the HBM the hand-made cached case needs (or --hbm).  Each case trains
-- --warmup steps, then --steps timed ones (the device synchronized at both ends only; on a GPU
-- each step is timed by events on the compute stream, so the host queues ahead and the prefetch
-- pipeline, train.pipeline, overlaps as in training); the hint policies run an interval every
-- --warmup steps (embeddings.hints.every), and the timing starts after two of them: the two that
-- come once (the first, which lays the rows out, and the second, which ranks every table's
-- counts for the split) are not timed, and the hot prefix is in place.  Prints predicted and measured ms a
-- step: the predicted step with its share of the hint intervals against the mean of the timed
-- steps, and the predicted step between intervals against their median and the fastest (one
-- step in `every` runs an interval, and neither counts it; on a loaded machine the fastest is
-- the closest to the work's own time, which the prediction is of), their ratios, the process's
-- CPU ms a step (all threads: on a loaded machine the wall time is not the work's),
-- samples/s and the HBM peak (ur.memory, from the run's start) against the prediction; for a
-- case with cached tables, a line under it: the timed steps' hit rate, bytes over the host link
-- and the cache's GPU time a step by phase (uvmrec.cache.per_step); --out writes JSON lines.
--   uvmrec scripts/bench/planner_b10.lua dlrm_tiny --cpu --calibration cpu
--   uvmrec scripts/bench/planner_b10.lua dlrm_mlperf_v1_2m --calibration FILE   (B4 with a plan, GPU)
--   uvmrec scripts/bench/planner_b10.lua --time                    (the planner's own time)
local ur = require "uvmrec"
local planner = require "uvmrec.planner"
local train = require "uvmrec.train"
local things = require("uvmrec.lib").things
local json = require "uvmrec.json"
local caches = require "uvmrec.cache"
local streams = require "uvmrec.stream"
local clock = ur.C.ur_clock_seconds
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/planner_b10.lua",
  summary = "B10: the planner's predicted steps against measured ones, its plan against hand-made ones",
  { "[CONFIG]", "a config or preset (dlrm_tiny, dlrm_kaggle, dlrm_mlperf_v1_2m); not with --time" },
  { "--calibration C", "h200, cpu or a calibration file (uvmrec calibrate --out FILE)" },
  { "--cases LIST", "comma-separated: device, cached, managed, host, planned",
    default = "device,cached,managed,planned" },
  { "--fraction F", "the hand-made cases' load factor and hot prefix", type = "number", default = 0.2,
    check = function(f) return f > 0 and f <= 1 and f or nil, "must be in (0, 1]" end },
  { "--hbm SIZE", "the planned case's HBM budget (default: what the hand-made cached case needs); with --time, "
    .. "a rank's budget instead of --at's", check = require("uvmrec.lib").bytes },
  { "--steps N", "timed steps a case", type = "whole", default = 20 },
  { "--warmup N", "steps between hint intervals; the timing starts after two (2 x N steps)", type = "whole",
    default = 5 },
  { "--set K=V", "a config value for every case (as uvmrec train)", many = true, key = "sets" },
  options.cpu,
  { "--out FILE", "append a JSON line a case (or a timing)", check = require("uvmrec.cli").writable },
  { "--time", "time the planner itself: 26, 100 and 1000 tables on 1 and 8 ranks (the H200 calibration, or "
    .. "--calibration's)" },
  { "--tables LIST", "with --time: comma-separated table counts", default = "26,100,1000" },
  { "--ranks LIST", "with --time: comma-separated rank counts", default = "1,8" },
  { "--at F", "with --time: the budget's place from the least one's need (0) to all in HBM (1)",
    type = "number", default = 1 / 3,
    check = function(f) return f >= 0 and f <= 1 and f or nil, "must be in [0, 1]" end },
  { "--short", "with --time: time the answer to half the least budget (the error and the fewest GPUs)" },
  { "--runs N", "with --time: plans a case, the least CPU kept (each of fresh profiles, cold)", type = "whole",
    default = 3, min = 1 },
  mutex = { { "--short", "--hbm" }, { "--at", "--hbm" } },
}
local o = cmd:parse(arg)
local function record(t)
  if o.out then json.append_lines(o.out, t) end
end
local function commit() return ur.commit() or "unknown" end
local function load_avg() return require("uvmrec.cli").load_average() or "?" end

if o.time then
  -- synthetic tables as search_spec's: rows 1e2..1e7, dims 16..128, Zipf 0.8..1.3, rowwise Adagrad
  local cal, cerr = planner.calib.find(o.calibration or "h200")
  if not cal then cmd:misuse(("--calibration %s: %s"):format(o.calibration or "h200", tostring(cerr))) end
  local fixed_budget = o.hbm
  print(("planner time (CPU seconds of this process; wall; load average %s), commit %s, %s"):format(load_avg(),
    commit(), os.date("!%Y-%m-%d")))
  print(("%7s %6s %10s %10s %10s %10s %12s"):format("tables", "ranks", "budget", "cpu s", "wall s", "proposals",
    "step ms"))
  local function list(v, what)
    local t = {}
    for x in v:gmatch("[^,]+") do
      local k = tonumber(x)
      if not k or k < 1 or k ~= math.floor(k) then
        cmd:misuse(("--%s: '%s' is not a whole number >= 1"):format(what, x))
      end
      t[#t + 1] = k
    end
    return t
  end
  local counts, worlds = list(o.tables, "tables"), list(o.ranks, "ranks")
  -- n tables and their profiles, made afresh for each timed plan: a profile keeps what the
  -- planner computed from it (its classes' chances per batch size, the LRU grid), which a plan
  -- before would have warmed
  local function tables_of(n)
    math.randomseed(7)
    local tables, profiles = {}, {}
    for i = 1, n do
      local rows = math.floor(10 ^ (2 + 5 * math.random()))
      local dim = ({ 16, 32, 64, 128 })[math.random(4)]
      tables[i] = { name = "T" .. i, rows = rows, dim = dim, optimizer = "rowwise_adagrad" }
      profiles["T" .. i] = planner.profile.zipf { rows = rows, s = 0.8 + 0.5 * math.random(), hot = 1 }
    end
    return tables, profiles
  end
  for _, n in ipairs(counts) do
    local tables, profiles = tables_of(n)
    for _, W in ipairs(worlds) do
      -- a budget a rank --at of the way (a third) from the smallest plan's need to the all-in-HBM
      -- one's; with --short, half the smallest plan's need; with --hbm, that one
      local popts = { world = W, batch = 4096, calibration = cal }
      local budget = fixed_budget
      if not budget then
        local _, _, info = planner.plan(tables, profiles, 1, popts)
        if o.short then
          budget = math.floor(info.min_budget / 2)
        else
          local all = assert(planner.plan(tables, profiles, 2 ^ 50, { world = W, batch = 4096, calibration = cal,
                                                                      reserve = 0 }))
          local hi = 0
          for _, r in ipairs(all.data.ranks) do hi = math.max(hi, r.hbm) end
          budget = math.floor((info.min_budget + (hi - info.min_budget) * o.at) / 0.95)
        end
      end
      local best = nil
      for _ = 1, o.runs do
        tables, profiles = tables_of(n)
        local c0, w0 = os.clock(), clock()
        local p, err, pinfo = planner.plan(tables, profiles, budget, popts)
        local r = { cpu = os.clock() - c0, wall = clock() - w0 }
        if o.short then
          if p then error(("%s, %s: half the least budget fits"):format(things(n, "table"), things(W, "rank"))) end
          r.proposals, r.step, r.method = ("gpus %s"):format(tostring(pinfo.gpus)), 0, "infeasible"
          r.error = err
        else
          assert(p, err)
          r.proposals, r.step, r.method = p.data.search.proposals or 0, p.data.step_seconds, p.data.search.method
        end
        if not best or r.cpu < best.cpu then best = r end
      end
      print(("%7d %6d %10s %10.3f %10.3f %10s %12.4f"):format(n, W, planner.fmt_bytes(budget), best.cpu, best.wall,
        tostring(best.proposals), best.step * 1e3))
      record { bench = "B10", what = "planner_time", tables = n, ranks = W, budget = budget, cpu_seconds = best.cpu,
               wall_seconds = best.wall, proposals = best.proposals, method = best.method, commit = commit(),
               date = os.date("!%Y-%m-%d"), load = load_avg() }
    end
  end
  return
end

if not o.config then cmd:misuse("give a CONFIG (or --time)") end
local path, ferr = train.find_config(o.config)
if not path then cmd:misuse(ferr) end
local gpu = ur.gpu() and not o.cpu
local cal_name = o.calibration or (gpu and "h200" or "cpu")
local cal = planner.calib.find(cal_name)
if not cal then cmd:misuse("--calibration " .. cal_name .. ": not found") end
local sets = { unpack(o.sets) }
-- a hint interval every --warmup steps, and the timing after two of them (the policy's relayout
-- and the split's ranking of the counts, once each), unless --set gives embeddings.hints.every;
-- the timed steps' intervals are in the prediction
local every = true
for _, s in ipairs(o.sets) do if s:match("^embeddings%.hints%.every=") then every = false end end
local lead = every and 2 * o.warmup or o.warmup -- steps before the timing
local total = lead + o.steps
for _, s in ipairs { "train.steps=" .. total, "eval.samples=0", "eval.every=0", "eval.min_auc=0",
                     "train.log_every=" .. total, "train.checkpoint_every=0" } do
  sets[#sets + 1] = s
end
if every then sets[#sets + 1] = "embeddings.hints.every=" .. math.max(1, o.warmup) end
local function config()
  local cfg, err = train.config.load(path, sets)
  if not cfg then cmd:fail(err) end
  return cfg
end
local base = config()
local prob, perr = planner.from_config(base)
if not prob then cmd:fail(perr) end
local popts = { world = 1, batch = prob.batch, calibration = cal, dense = prob.dense, loader = prob.loader,
                hints_every = prob.hints_every, pipeline = base.train.pipeline,
                policy = base.embeddings.cache.policy or "lru", depth = base.data.depth }

-- a hand-made plan: every table the same choice, in the HBM it needs (plus the 5% reserve)
local function hand(choice)
  local choices = {}
  for i = 1, #prob.tables do choices[i] = choice end
  local o0 = {}
  for k, v in pairs(popts) do o0[k] = v end
  o0.reserve = 0
  local p0, err = planner.evaluate(prob.tables, prob.profiles, 2 ^ 50, o0, choices)
  if not p0 then cmd:fail(err) end
  local budget = math.ceil(p0.data.ranks[1].hbm / 0.95) + 1
  local p, err2 = planner.evaluate(prob.tables, prob.profiles, budget, popts, choices)
  if not p then cmd:fail(err2) end
  return p
end

local F = o.fraction
local plans, order = {}, {}
for c in o.cases:gmatch("[^,]+") do order[#order + 1] = c end
local function make(c)
  if plans[c] then return plans[c] end
  local p
  if c == "device" then p = hand { placement = "device" }
  elseif c == "cached" then p = hand { placement = "cached", load_factor = F }
  elseif c == "managed" then p = hand { placement = "managed", prefix_fraction = F }
  elseif c == "host" then p = hand { placement = "host" }
  elseif c == "planned" then
    local budget = o.hbm or make("cached").data.budget
    local err
    p, err = planner.plan(prob.tables, prob.profiles, budget, popts)
    if not p then cmd:fail(err) end
  else
    cmd:misuse(("--cases: '%s' is not device, cached, managed, host or planned"):format(c))
  end
  plans[c] = p
  return p
end

local dir = os.tmpname()
os.remove(dir)
assert(ur.C.ur_dir_create(dir) == 0)
print(("B10 %s on %s: batch %d, %d warm-up + %d timed steps, calibration %s; commit %s, %s, load average %s"):format(
  base.name or o.config, gpu and ("the GPU (" .. ur.device_props(0).name .. ")") or "the CPU", prob.batch, lead,
  o.steps, cal.where, commit(), os.date("!%Y-%m-%d"), load_avg()))
print(("%-9s %-28s %12s %12s %7s %10s %10s %7s %10s %7s %9s %12s %11s %11s"):format("case", "placements",
  "predicted ms", "mean ms", "ratio", "between ms", "median ms", "ratio", "fastest", "ratio", "CPU ms", "samples/s",
  "HBM pred", "HBM peak"))
for _, c in ipairs(order) do
  local plan = make(c)
  local file = ("%s/%s.json"):format(dir, c)
  assert(plan:save(file))
  local cfg = config()
  local applied, aerr = train.apply_plan(cfg, file)
  if not applied then cmd:fail(aerr) end
  local t0, t1, c0, c1, last
  local each = {} -- each timed step's seconds, from the end of the one before
  -- On a GPU, an event after each step on the compute stream: the host does not wait between
  -- steps (the prefetch pipeline overlaps as in training, and the host queues ahead), and each
  -- step is the time between two events.  On the CPU, the wall clock.
  local marks = {}
  for k = 1, gpu and o.steps + 1 or 0 do marks[k] = assert(streams.event()) end
  local timer = { after = function(_, run)
    if run.step < lead then return end
    if gpu then
      assert(marks[run.step - lead + 1]:record(run.model.stream))
    else
      local now = clock()
      if run.step > lead then each[#each + 1] = now - last end
      last = now
    end
    if run.step == lead or run.step == total then
      if gpu then ur.C.ur_device_sync() end
      if run.step == lead then
        t0, c0 = clock(), os.clock()
        local cache = run.model.embeddings.tbe and run.model.embeddings.tbe.cache
        if cache then cache:reset_stats() end -- the timed steps' counts only
      else
        t1, c1 = clock(), os.clock()
      end
    end
  end }
  local r, rerr = train.run(cfg, { cpu = o.cpu, progress = "none", print = function() end, hooks = { timer },
                                   plan = applied, plan_path = file, signals = false })
  if not r then cmd:fail(c .. ": " .. tostring(rerr)) end
  local measured, cpu = (t1 - t0) / o.steps, (c1 - c0) / o.steps
  for k = 2, #marks do each[#each + 1] = assert(marks[k - 1]:elapsed(marks[k])) * 1e-3 end
  for _, m in ipairs(marks) do m:free() end
  table.sort(each)
  local fastest, median = each[1], each[math.floor((#each + 1) / 2)]
  local p = plan.data
  -- the mean carries the hint intervals (one every `every` steps), the median and the fastest
  -- step do not (while under half the steps run one): each is set against the prediction of
  -- what it measures
  local between = (p.hints_every or 1) > 2 and p.step_seconds_between_hints or p.step_seconds
  print(("%-9s %-28s %12.3f %12.3f %7.2f %10.3f %10.3f %7.2f %10.3f %7.2f %9.3f %12.0f %11s %11s"):format(c,
    train.plan_summary(p), p.step_seconds * 1e3, measured * 1e3, p.step_seconds / measured, between * 1e3,
    median * 1e3, between / median, fastest * 1e3, between / fastest, cpu * 1e3, prob.batch / measured,
    planner.fmt_bytes(p.ranks[1].hbm), planner.fmt_bytes(r.plan.hbm_peak)))
  local cache = r.cache and caches.per_step(r.cache, o.steps)
  if cache then print(("%-9s cache: %s"):format("", caches.step_line(cache))) end
  record { bench = "B10", config = base.name or o.config, case = c, placements = train.plan_summary(p),
           batch = prob.batch, predicted_seconds = p.step_seconds, measured_seconds = measured,
           predicted_between_hints_seconds = between, hints_seconds = p.hints_seconds,
           median_seconds = median, fastest_seconds = fastest,
           ratio = p.step_seconds / measured, ratio_median = between / median, cpu_seconds = cpu,
           hbm_predicted = p.ranks[1].hbm,
           hbm_peak = r.plan.hbm_peak,
           budget = p.budget, cache = cache, gpu = gpu, calibration = cal.where, steps = o.steps, warmup = lead,
           commit = commit(), date = os.date("!%Y-%m-%d"), load = load_avg() }
  os.remove(file)
  -- the case's model goes before the next one's (its managed rows on the GPU count in HBM)
  r, applied, cfg = nil, nil, nil -- luacheck: ignore 311 (still on the stack at the collection)
  collectgarbage()
  collectgarbage()
end
os.remove(dir)
