-- Soak: a long run of one model with its tables under both offload paths at once (some
-- `cached`: rows in host memory, a software cache in HBM; the others `managed` under the
-- `adaptive` hint policy, which swaps rows between the GPU prefix and the host), trained through
-- `uvmrec train` itself (uvmrec.train.run) with the prefetch pipeline, on the config's synthetic
-- data, for --minutes or --steps.  Beside it a shadow: the same model with every table in plain
-- memory (placement auto: HBM on a GPU, host memory on the CPU), built from the same config
-- (the same initial rows and weights) and stepped by the same loop step on the same batches
-- (the pipeline's, without their ticket), with its own learning-rate schedule at the same steps.
-- Checked:
--   * every step, the two losses are equal, bit for bit (the same kernels in the same order:
--     the cache gathers a batch's rows into slots and the kernels sum them as they sum HBM rows,
--     B5's claim; adaptive moves rows, never values), and finite: a NaN loss in either fails the run;
--   * every --every steps, --rows ids a table (half from the step's batch, half uniform) read
--     from the soak model (a cached table through tbe:table, which writes the cache's dirty
--     lines back first, so the row read is the one the model uses; a managed table at the row
--     adaptive's permutation gives the id) equal the shadow's rows, and their optimizer state,
--     byte for byte;
--   * from the check at --warm steps on, each of ur.memory()'s categories (the engine's own
--     allocations by placement, and what of them is in HBM) grows by at most --grow bytes or 1%
--     of where it started, the larger, and the host's resident memory by at most --grow-host or
--     1% (looser: the managed tables' pages move between the host and the GPU with adaptive's
--     relayouts and the driver's faults; the checks fall between adaptive's intervals).
-- Reports steps, samples/s (both models and the checks counted), rows checked, mismatches and
-- the memory at the first and last checks; exits 1 on any mismatch or growth; the last line
-- is the summary ("soak: PASS ..." or "soak: FAIL ...").
--   uvmrec scripts/bench/soak.lua [--minutes 8] [--steps N] [--every 100] [--out FILE] (--help)
local ffi = require "ffi"
local ur = require "uvmrec"
local json = require "uvmrec.json"
local train = require "uvmrec.train"
local host_memory = require "uvmrec.host_memory"
local planner = require "uvmrec.planner"
local C = ur.C
local cli = require "uvmrec.cli"
local options = cli.options

local cmd = cli.command {
  name = "scripts/bench/soak.lua",
  summary = "soak: cached and adaptive-managed tables with the prefetch pipeline against a shadow in plain memory",
  options.config,
  options.set,
  options.cpu,
  { "--minutes M", "train for M minutes (the steps counted from the first)", type = "number", default = 8 },
  { "--steps N", "train N steps instead of --minutes", type = "whole", min = 1 },
  { "--every K", "steps between row and memory checks", type = "whole", min = 1, default = 100 },
  { "--warm W", "the step of the first check, where memory is measured from (after adaptive's first " ..
    "intervals, between two)", type = "whole", min = 1, default = 125 },
  { "--rows R", "ids checked a table at each check", type = "whole", min = 1, default = 16 },
  { "--cached LIST", "the cached tables, comma separated (default: the odd ones, C1, C3, ...); the others " ..
    "are managed" },
  { "--load-factor F", "each cached table's cache, a share of its rows", type = "number", default = 0.1 },
  { "--allowance A", "HBM for the managed tables (adaptive's)", default = "20%" },
  { "--hints-every H", "steps between adaptive's intervals", type = "whole", min = 1, default = 50 },
  { "--grow SIZE", "growth allowed in each of ur.memory()'s categories (the engine's allocations by " ..
    "placement, the HBM they use) past 1% of the start", default = "64MiB" },
  { "--grow-host SIZE", "host RSS growth allowed past 1% of the start (the managed tables' pages move " ..
    "between host and GPU)", default = "256MiB" },
  { "--seed S", "the sampled ids' seed", type = "whole", default = 1 },
  { "--perturb-shadow STEP", "TEST ONLY: at the first check from STEP on, one element of a checked shadow " ..
    "row is changed (the check must fail)", type = "whole", min = 1 },
  options.out_append,
}
local o = cmd:parse(arg)
local gpu, config = cli.bench_config(o)
local path = assert(train.find_config(config))
local grow, grow_host = ur.bytes(o.grow), ur.bytes(o.grow_host)
local fmt = planner.fmt_bytes

-- The config with the run's settings and the user's --set; placements as `place` says.
local function load(place)
  -- train.steps 0: the hook ends the run (--steps, --minutes, a failed check); the synthetic
  -- data's length is 2^32 samples (about dlrm_mlperf_v1's epoch), cycled
  local sets = { "eval.samples=0", "eval.every=0", "eval.min_auc=0", "train.epochs=1000", "train.steps=0",
                 "data.samples=4294967296", "train.log_every=1000000000", "train.checkpoint_every=0" }
  for _, s in ipairs(cli.bench_sets(config)) do sets[#sets + 1] = s end
  for _, s in ipairs(o.set or {}) do sets[#sets + 1] = s end
  local cfg = assert(train.config.load(path, sets))
  place(cfg)
  return cfg
end

local cached = {}
local soak_cfg = load(function(cfg)
  local e = cfg.embeddings
  local n = #e.rows
  if o.cached then
    for name in o.cached:gmatch("[^,%s]+") do
      local i = tonumber(name:match("^C(%d+)$"))
      if not i or i > n then cmd:misuse(("--cached: '%s' is not a table (C1 to C%d)"):format(name, n)) end
      cached[name] = true
    end
  else
    for i = 1, n, 2 do cached["C" .. i] = true end
  end
  for i = 1, n do
    local name = "C" .. i
    e.tables[name] = e.tables[name] or {}
    e.tables[name].placement = cached[name] and "cached" or "managed"
  end
  e.cache.load_factor = o.load_factor
  e.hints.policy, e.hints.every, e.hints.allowance = "adaptive", o.hints_every, o.allowance
  cfg.train.pipeline = true
end)
local shadow_cfg = load(function(cfg)
  cfg.embeddings.placement = "auto" -- HBM on a GPU, host memory on the CPU
  for _, t in pairs(cfg.embeddings.tables) do t.placement = nil end
  cfg.train.pipeline = false
end)
local names = {}
for i = 1, #soak_cfg.embeddings.rows do names[i] = "C" .. i end
local table_rows = train.config.table_rows(soak_cfg)
local n_cached = 0
for _ in pairs(cached) do n_cached = n_cached + 1 end

local out = o.out
local function emit(rec)
  rec.bench = "soak"
  if out then json.append_lines(out, rec) end
end

-- ---- the shadow, built with the soak model (setup) and stepped after it (the hook) ----
local shadow, shadow_opt, shadow_sched
local soak, run_ctx -- the soak model, its run's context (its hint manager: ctx.hints)
math.randomseed(o.seed)

-- Bytes of row `row` of tensor t (a [rows, ...] table or state), read to the host.
local function row_bytes(t, row)
  local v = t:view(row, 1)
  local h = assert(v:to("host"))
  local s = ffi.string(C.ur_tensor_data(h.p), h:nbytes())
  h:free()
  v:free()
  return s
end

-- The tensors of table `name` (the rows, then the optimizer's state) in a collection.
local function tensors(tbe, name)
  local ts = { tbe:table(name) }
  local st = tbe:state(name)
  for _, k in ipairs(tbe.state_names) do ts[#ts + 1] = st[k] end
  return ts
end

local function free_all(ts)
  for _, t in ipairs(ts) do t:free() end
end

-- The ids to check in table i: half from the batch (q: its ids, on the host), half uniform
-- over the table.
local function sample(batch, q, i, rows)
  local ids, seen = {}, {}
  local function add(id)
    if not seen[id] then seen[id], ids[#ids + 1] = true, id end
  end
  local span = batch.sparse:key_span(i).values
  local n = span[2] - span[1]
  for _ = 1, n > 0 and math.ceil(o.rows / 2) or 0 do add(tonumber(q[span[1] + math.random(0, n - 1)])) end
  while #ids < o.rows and #ids < rows do add(math.random(0, rows - 1)) end
  return ids
end

local perturbed = false
-- Changes one element of the shadow's row `id` of table `name` (--perturb-shadow, a test).
local function perturb(name, id)
  local t = shadow.embeddings.tbe:table(name)
  local v = t:view(id, 1)
  local h = assert(v:to("host"))
  h:set(0, h:get(0) + 1)
  assert(v:copy(h))
  h:free()
  v:free()
  t:free()
  perturbed = true
end

-- rows: ids checked; moved: of them, managed rows adaptive had moved; resident: cached rows
-- read from the cache (resident at the check)
local stats = { checks = 0, rows = 0, moved = 0, resident = 0, mismatches = 0, loss_mismatches = 0, nan_losses = 0,
                growth = 0, relayout = 0, first = {} }

-- Compares the sampled rows of every table; returns the mismatches, each noted.
local function check_rows(step, batch)
  local bad = 0
  local soak_tbe, shadow_tbe = soak.embeddings.tbe, shadow.embeddings.tbe
  local vals = batch.sparse:values()
  local hv = assert(vals:to("host"))
  vals:free()
  local q = ffi.cast("int64_t *", C.ur_tensor_data(hv.p))
  for i, name in ipairs(names) do
    local ids = sample(batch, q, i, table_rows[i])
    if cached[name] then
      for _, slot in ipairs(soak_tbe.cache:contains(name, ids)) do
        if slot then stats.resident = stats.resident + 1 end
      end
    end
    if o.perturb_shadow and not perturbed and step >= o.perturb_shadow then perturb(name, ids[1]) end
    local a, b = tensors(soak_tbe, name), tensors(shadow_tbe, name)
    local perm = not cached[name] and soak_tbe:permutation(name)
    local hp = perm and assert(perm:to("host"))
    local pp = hp and ffi.cast("int64_t *", C.ur_tensor_data(hp.p))
    for _, id in ipairs(ids) do
      local row = pp and tonumber(pp[id]) or id
      if row ~= id then stats.moved = stats.moved + 1 end
      for k = 1, #a do
        if row_bytes(a[k], row) ~= row_bytes(b[k], id) then
          bad = bad + 1
          if #stats.first < 5 then
            stats.first[#stats.first + 1] = ("step %d: table %s (%s) id %d (row %d) %s differs from the shadow's")
              :format(step, name, cached[name] and "cached" or "managed", id, row, k == 1 and "row" or
                      "optimizer state " .. soak_tbe.state_names[k - 1])
          end
        end
      end
      stats.rows = stats.rows + 1
    end
    if hp then hp:free() end
    if perm then perm:free() end
    free_all(a)
    free_all(b)
  end
  hv:free()
  return bad
end

-- ur.memory()'s categories: the engine's allocations by placement, and what of them is in HBM
local KEYS = { "hbm_used", "device", "managed_on_gpu", "host", "pinned", "managed", "workspace" }
local function memory()
  collectgarbage()
  local m = ur.memory()
  local r = { rss = assert(host_memory.resident()) }
  for _, k in ipairs(KEYS) do r[k] = m[k] end
  return r
end

local function bound(k, x) return math.max(k == "rss" and grow_host or grow, 0.01 * x) end

-- The batch the shadow steps on: the step's batch (its device copy) without the soak's ticket,
-- one proxy for the whole run pointed at each step's batch in turn.
local current
local plain = setmetatable({}, { __index = function(_, k) if k ~= "ticket" then return current[k] end end })

local mem0, mem1, t0, step0
local hook = {}
function hook.before(_, run)
  if shadow_sched then shadow_sched:before(run) end
end
function hook.after(_, run, batch)
  current = batch
  local sl = train.loop.step(shadow, shadow_opt, plain)
  current = nil
  local a, b = run.loss:get(0), sl:get(0)
  -- a NaN loss fails the run at once: NaN never equals NaN, and NaN rows would compare equal
  -- byte for byte, so nothing after it is evidence
  if a ~= a or b ~= b then
    stats.nan_losses = stats.nan_losses + 1
    stats.first[#stats.first + 1] = ("step %d: %s NaN"):format(run.step, a ~= a and b ~= b and
      "the soak's and the shadow's losses are" or a ~= a and "the soak's loss is" or "the shadow's loss is")
    run:stop()
    return
  end
  if a ~= b then
    stats.loss_mismatches = stats.loss_mismatches + 1
    if #stats.first < 5 then
      stats.first[#stats.first + 1] = ("step %d: loss %.9g, the shadow's %.9g"):format(run.step, a, b)
    end
  end
  local step = run.step
  if not t0 then t0, step0 = C.ur_clock_seconds(), step end
  -- the run ends here (--steps, --minutes): a last check, if this step has none
  local ending = (o.steps and step >= o.steps) or (not o.steps and C.ur_clock_seconds() - t0 >= o.minutes * 60)
  if step == o.warm or (step > o.warm and ((step - o.warm) % o.every == 0 or ending)) then
    local bad = check_rows(step, batch)
    stats.checks, stats.mismatches = stats.checks + 1, stats.mismatches + bad
    local m = memory()
    if not mem0 then mem0 = m end
    mem1 = m
    local grew = {}
    for k, v in pairs(m) do
      if v - mem0[k] > bound(k, mem0[k]) then grew[#grew + 1] = ("%s %s -> %s"):format(k, fmt(mem0[k]), fmt(v)) end
    end
    table.sort(grew)
    if #grew > 0 then
      stats.growth = stats.growth + 1
      if #stats.first < 5 then stats.first[#stats.first + 1] = ("step %d: memory grew: %s"):format(step,
        table.concat(grew, ", ")) end
    end
    local moved_bytes = run_ctx.hints and run_ctx.hints.relayout_bytes or 0
    stats.relayout = moved_bytes
    print(("check at step %d: %d rows checked (%d cached read from the cache, %d managed moved by adaptive), "
      .. "%d mismatches, %d loss mismatches so far; adaptive moved %s; host RSS %s, HBM used %s, loss %.6g")
      :format(step, stats.rows, stats.resident, stats.moved, bad, stats.loss_mismatches, fmt(moved_bytes),
              fmt(m.rss), fmt(m.hbm_used), a))
    emit { mode = "check", step = step, rows_checked = stats.rows, rows_resident = stats.resident,
           rows_moved = stats.moved, relayout_bytes = moved_bytes, mismatches = bad,
           loss_mismatches = stats.loss_mismatches, memory = m, loss = a }
    if bad > 0 or stats.loss_mismatches > 0 or #grew > 0 then run:stop() end
  end
  if ending then run:stop() end
end

print(("soak: %s, %d tables (%d cached at load factor %g, %d managed under adaptive, allowance %s), "
  .. "the prefetch pipeline; the shadow's tables %s; %s"):format(soak_cfg.name or config, #names, n_cached,
  o.load_factor, #names - n_cached, o.allowance,
  gpu and "in HBM" or "in host memory", o.steps and (o.steps .. " steps") or (o.minutes .. " minutes")))
local built_at = C.ur_clock_seconds()
local r, err = train.run(soak_cfg, {
  config_path = path, progress = "none", print = function() end, cpu = not gpu, signals = false,
  setup = function(ctx)
    soak, run_ctx = ctx.model, ctx
    local def = assert(train.model_def(shadow_cfg, path))
    shadow = assert(def.build(shadow_cfg, { cpu = not gpu }))
    shadow_opt = train.optimizer(shadow_cfg, shadow)
    local sched = train.config.schedule(shadow_cfg)
    shadow_sched = sched and ur.optim.Schedule(sched, { shadow_opt, shadow.embeddings }) or nil
    print(("built both models in %.1f s: the soak's tables %s in HBM, %s pinned, %s managed; host RSS %s")
      :format(C.ur_clock_seconds() - built_at, fmt(ur.memory().device), fmt(ur.memory().pinned),
              fmt(ur.memory().managed), fmt(assert(host_memory.resident()))))
  end,
  hooks = { hook },
})
if not r then cmd:fail(err) end
local steps = r.steps
local rate = t0 and steps > step0 and (steps - step0) * soak_cfg.train.batch_size / (C.ur_clock_seconds() - t0)
local cstats = soak.embeddings.tbe.cache and soak.embeddings.tbe.cache:stats()
local failed = stats.mismatches > 0 or stats.loss_mismatches > 0 or stats.nan_losses > 0 or stats.growth > 0
  or stats.checks == 0
for _, l in ipairs(stats.first) do print("  " .. l) end
if stats.checks == 0 and stats.nan_losses == 0 then
  print(("  no check ran: the run ended at step %d, before --warm %d"):format(steps, o.warm))
end
print(("cache hit rate %s; adaptive moved %s of rows and state"):format(
  cstats and ("%.1f%%"):format(100 * cstats.hit_rate) or "-", fmt(stats.relayout)))
emit { mode = "summary", config = config, steps = steps, samples_per_s = rate, checks = stats.checks,
       rows_checked = stats.rows, rows_resident = stats.resident, rows_moved = stats.moved,
       cache_hit_rate = cstats and cstats.hit_rate, relayout_bytes = stats.relayout, mismatches = stats.mismatches,
       loss_mismatches = stats.loss_mismatches, nan_losses = stats.nan_losses,
       memory_start = mem0, memory_end = mem1, pass = not failed }
print(("soak: %s: %d steps, %s samples/s (soak and shadow), %d checks, %d rows checked, %d mismatches, "
  .. "%d loss mismatches, %d NaN losses; host RSS %s -> %s, HBM used %s -> %s"):format(failed and "FAIL" or "PASS",
  steps, rate and ("%.3g"):format(rate) or "-", stats.checks, stats.rows, stats.mismatches, stats.loss_mismatches,
  stats.nan_losses,
  mem0 and fmt(mem0.rss) or "-", mem1 and fmt(mem1.rss) or "-", mem0 and fmt(mem0.hbm_used) or "-",
  mem1 and fmt(mem1.hbm_used) or "-"))
os.exit(failed and 1 or 0)
