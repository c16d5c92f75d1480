-- uvmrec calibrate [--out calib.json] [--machine NAME] [--shapes cpu|gpu] [--quick]
-- Measures on this machine the rates the planner's cost model divides by (uvmrec.planner.calib,
-- docs/planner.md) through the engine itself, and writes them as a calibration file:
--   copies (within memory, host to device and back: on the CPU both are memcpy), the embedding
--   forward's gather of scattered rows (once each, and again within a batch), the same rows read
--   in place from pinned and managed memory, the fused backward's cost per id, the software
--   cache's cost per id, per distinct row (all-hit batches of uniform ids and of the synthetic
--   generator's Zipf ids, as a model's) and per row moved (through the real cache), the
--   hot_prefix policy's interval per row (counted on Zipf ids), the dot interaction, the MLPs
--   (f32, TF32, bf16: a FLOP rate, a cost per output value and one per layer, fitted to five
--   stacks at two batches: three with --shapes gpu), a training step's fixed cost and what the
--   synthetic loader adds to a step.
--   Collectives need ranks: not measured here (plans over several ranks need a calibration that
--   has them).
-- The sizes (--shapes): "cpu" (the CPU backend's default) as described; "gpu" (the default with a
-- GPU) the sizes a GPU step runs at, so that no term is fitted to launch-bound runs: copies of
-- 512 MiB, 2^19 ids a table over 2^20 rows for the embeddings (2.1 M ids in all, a DLRM step's
-- 26 x 65536 = 1.7 M), 65536 for the cache, MLPerf's MLP stacks
-- (13-512-256-128, 480-1024-1024-512-256-1) and a narrow one at batches 16384 and 65536, the dot
-- interaction of 27 vectors of 128 at batch 65536 as the bf16 model runs it, the loader at 16384.
-- With --quick on the CPU backend the GPU's shapes run at the CPU quick run's sizes and small
-- batches (a spec runs that path on the CPU); on a GPU --quick keeps the sizes.  Managed tables
-- are read in place on the host (the `host` hint policy: preferred on the host, accessed by the
-- GPU), as the planner prices them.  A rate that comes
-- out non-positive, not finite or beyond any machine's (a term fitted to nearly nothing) is an
-- error naming it and its measurements, never written.
-- Runs in well under a minute on two cores.  Also `luajit scripts/calibrate.lua ...`.
local ffi = require "ffi"
local ur = require "uvmrec"
local C = ur.C
local calib = require "uvmrec.planner.calib"
local tbe = require "uvmrec.tbe"
local streams = require "uvmrec.stream"

local cmd = require("uvmrec.cli").command {
  name = "calibrate",
  summary = "measure the rates the planner's cost model uses, on this machine",
  { "--out FILE", "where to write the calibration (default: print it)", check = require("uvmrec.cli").writable },
  { "--machine NAME", "the machine's name in the file (default: the CPU's or the GPU's)" },
  { "--shapes KIND", "the sizes measured: cpu or gpu (default: gpu with a GPU, else cpu)", choices = { "cpu", "gpu" } },
  { "--quick", "fewer repetitions, and on the CPU backend smaller sizes (for specs)" },
}
local o = cmd:parse(arg)

local gpu = ur.gpu()
local place_fast = gpu and "device" or "host"
local Q = o.quick
local KIND = o.shapes or (gpu and "gpu" or "cpu")
-- The sizes of each measurement, by --shapes and --quick (see the header).
local SHAPES = {
  -- hot: the rows a table of the "repeat" batch draws its ids from
  cpu = { copy_mib = 64, rows = 131072, batch = 8192, hot = 64, crow = 131072, cbatch = 8192,
          inter = { batch = 2048, dim = 16, precision = "f32" }, mlp_batches = { 1024, 4096 }, loader_batch = 1024,
          -- dlrm_tiny's and dlrm_kaggle's stacks and a narrow deep one
          mlps = { { 13, 64, 16 }, { 367, 64, 1 }, { 13, 512, 256, 64, 16 }, { 367, 512, 256, 1 },
                   { 64, 64, 64, 64, 64 } },
          mlp_names = "dlrm_tiny's, dlrm_kaggle's, 64-64-64-64-64" },
  cpu_quick = { copy_mib = 16, rows = 65536, batch = 4096, hot = 64, crow = 65536, cbatch = 4096,
                inter = { batch = 512, dim = 16, precision = "f32" }, mlp_batches = { 256, 512 }, loader_batch = 256 },
  -- (on a GPU 64 rows a table would make the backward's reduction into each row, 8192 ids, the
  -- repeat batch's cost: 4096 rows, 128 ids each, in L2 as the forward's repeats are)
  -- (at 4 x 65536 ids the embeddings' launches and the sort's fixed work were a third of the
  -- time: the planner priced dlrm_mlperf_v1_2m's embeddings at 2.1 ms against 1.0 measured,
  -- docs/results.md, twelfth session)
  gpu = { copy_mib = 512, rows = 2 ^ 20, batch = 2 ^ 19, hot = 4096, crow = 2 ^ 20, cbatch = 65536,
          inter = { batch = 65536, dim = 128, precision = "bf16" }, mlp_batches = { 16384, 65536 },
          loader_batch = 16384,
          -- dlrm_mlperf_v1's stacks (the top's input padded as the model's: 128 + 351 -> 480) and
          -- a narrow deep one, where the per-value and per-layer terms weigh most
          mlps = { { 13, 512, 256, 128 }, { 480, 1024, 1024, 512, 256, 1 }, { 128, 128, 128, 128, 128 } },
          mlp_names = "dlrm_mlperf_v1's bottom and top, 128-128-128-128-128" },
  gpu_quick = { copy_mib = 16, rows = 65536, batch = 4096, hot = 256, crow = 65536, cbatch = 4096,
                inter = { batch = 256, dim = 128, precision = "bf16" }, mlp_batches = { 256, 1024 },
                loader_batch = 256 },
}
local S = SHAPES[KIND]
-- --quick on the CPU backend: the quick sizes.  On a GPU the sizes stay (its small runs would be
-- launch-bound, the fits absurd; the full ones take milliseconds there): fewer repetitions only.
if Q and not gpu then
  local q = {}
  for k, v in pairs(S) do q[k] = v end
  for k, v in pairs(SHAPES[KIND .. "_quick"]) do q[k] = v end
  S = q
end
local t_start = C.ur_clock_seconds()
local function loadavg() return tonumber(require("uvmrec.cli").load_average()) end
local load_start = loadavg()

-- The fastest of n runs of fn (after one warm-up), in seconds.  Not the median: on a shared
-- machine (this project's build machine: 2 cores, often at load 5 to 12) other processes only
-- ever add time, so the fastest run is the closest to the work's own cost, which is what the
-- planner predicts; a median measures more of the machine's load at calibration time.
local function time(n, fn)
  fn()
  if gpu then ur.sync() end
  local s = {}
  for k = 1, n do
    local t0 = C.ur_clock_seconds()
    fn()
    if gpu then ur.sync() end
    s[k] = C.ur_clock_seconds() - t0
  end
  table.sort(s)
  return s[1]
end

local function i64(list_or_n, fill)
  local n = type(list_or_n) == "table" and #list_or_n or list_or_n
  local t = assert(ur.tensor({ n }, { dtype = "i64", placement = "host" }))
  local p = ffi.cast("int64_t *", C.ur_tensor_data(t.p))
  for k = 0, n - 1 do p[k] = fill(k) end
  if gpu then
    local d = assert(t:to("device"))
    t:free()
    return d
  end
  return t
end

local rates = {}
local date = os.date("!%Y-%m-%d")
local command = "uvmrec calibrate" .. (o.shapes and " --shapes " .. o.shapes or "") .. (o.quick and " --quick" or "")
-- direct: the rate is one timed operation's (a copy, a policy's interval, a whole step), not a
-- term fitted to runs or a difference of timings.
local function rate(name, value, unit, source, direct)
  -- a rate out of calib's range (non-positive, not finite, or beyond any machine's: for a fitted
  -- rate, a term fitted to almost nothing of the time measured) is an error here, not a file that
  -- misleads the planner
  local bad = calib.check_value(name, value)
  if bad then
    error(("calibrate: %s: %s%s.  Measured: %s"):format(name, bad, direct and ""
      or " (its term was fitted to nothing, or to almost nothing, of the time measured)", source), 0)
  end
  rates[name] = { value = value, unit = unit, source = source, command = command, date = date, measured = true }
  local shown = unit == "B/s" and ("%.2f GB/s"):format(value / 1e9) or unit == "FLOP/s"
                and ("%.2f GFLOP/s"):format(value / 1e9) or unit == "s" and ("%.3f ns"):format(value * 1e9)
                or ("%.3f"):format(value)
  print(("  %-22s %14s  %s"):format(name, shown, source))
end

print(("uvmrec calibrate: %s, %s shapes, %s"):format(gpu and "GPU" or "CPU backend", KIND, Q and "quick" or "full"))

-- What is left of a measured time t after the parts the other rates account for; an error when
-- nearly nothing is (under 5% of t): a rate fitted to that would be absurd.
local function rest_of(name, t, rest, what)
  if rest ~= rest or rest < 0.05 * t then
    error(("calibrate: %s cannot be fitted: of %.4f ms measured, %.4f ms is left after %s; expected at least 5%% "
           .. "of it (the term must weigh in the run that measures it)"):format(name, t * 1e3, rest * 1e3, what), 0)
  end
  return rest
end

-- ---- copies ----
do
  local n = S.copy_mib * 2 ^ 20 / 4
  local a = assert(ur.tensor({ n }, { placement = place_fast }))
  local b = assert(ur.tensor({ n }, { placement = place_fast }))
  local h = assert(ur.tensor({ n }, { placement = "pinned" }))
  a:fill(1)
  local reps = Q and 3 or 7
  local tc = time(reps, function() assert(b:copy(a)) end)
  rate("hbm_copy", 2 * n * 4 / tc, "B/s", ("copy of %d MiB within %s memory, bytes read + written"):format(
       n * 4 / 2 ^ 20, place_fast), true)
  local th = time(reps, function() assert(a:copy(h)) end)
  rate("host_to_device", n * 4 / th, "B/s", ("copy of %d MiB pinned -> %s"):format(n * 4 / 2 ^ 20, place_fast),
       true)
  local td = time(reps, function() assert(h:copy(a)) end)
  rate("device_to_host", n * 4 / td, "B/s", ("copy of %d MiB %s -> pinned"):format(n * 4 / 2 ^ 20, place_fast),
       true)
  a:free(); b:free(); h:free()
end

-- ---- the embedding forward and backward ----
local T, ROWS, DIM = 4, S.rows, 128
local BATCH = S.batch
local RB = DIM * 4
local L = T * BATCH
math.randomseed(11)
local uniform = {}
for k = 0, L - 1 do uniform[k] = math.random(0, ROWS - 1) end
local HOT = S.hot -- rows of the "repeat" batch: every id is one of HOT rows of its table
-- distinct (table, row) pairs of a batch of T tables x `per` ids over `rows` rows each
local function distinct(ids, per, rows)
  per, rows = per or BATCH, rows or ROWS
  local seen, u = {}, 0
  for k = 0, T * per - 1 do
    local key = math.floor(k / per) * rows + ids[k]
    if not seen[key] then seen[key] = true u = u + 1 end
  end
  return u
end
local Uu = distinct(uniform)
local repeat_ids = {}
for k = 0, L - 1 do repeat_ids[k] = math.random(0, HOT - 1) * 997 % ROWS end
local Ur = distinct(repeat_ids)
-- Zipf batches as the model's synthetic data draws them (the engine's generator: its Zipf and
-- its scatter of ranks over the rows), at the presets' exponent, T tables of `rows` rows,
-- table-major as a collection reads them
local ZIPF = require("uvmrec.data.presets").mlperf_v1_2m.tables[1].zipf
local function zipf_batch(rows, n, first)
  local tabs = {}
  for t = 1, T do tabs[t] = { name = "z" .. t, rows = rows, zipf = ZIPF } end
  local g = assert(require("uvmrec.data.synthetic").generate({ seed = 29, tables = tabs }, first or 0, n))
  local q = ffi.cast("int64_t *", C.ur_tensor_data(g.ids.p))
  local ids = {}
  for i = 0, n - 1 do
    for t = 0, T - 1 do ids[t * n + i] = tonumber(q[i * T + t]) end
  end
  for _, x in pairs(g) do x:free() end
  return ids
end
local function input_of(ids)
  return { values = i64(L, function(k) return ids[k] end), offsets = i64(L + 1, function(k) return k end) }
end
local in_u, in_r = input_of(uniform), input_of(repeat_ids)
local OUT = L * DIM * 4
local reps = Q and 3 or 5

local function collection(placement, extra)
  local tabs = {}
  for t = 1, T do tabs[t] = { name = "t" .. t, rows = ROWS, dim = DIM, placement = placement } end
  local opts = { tables = tabs, optimizer = { "sgd", lr = 1e-6 }, bounds = "off" }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return assert(tbe.new(opts))
end

local G, Gr, GC
do
  GC = rates.hbm_copy.value
  local c = collection(place_fast)
  local out = assert(c:new_output(in_u))
  local fu = time(reps, function() assert(c:forward(in_u, out)) end)
  local fr = time(reps, function() assert(c:forward(in_r, out)) end)
  -- f - OUT/GC = U RB x + (L - U) RB y, for both batches
  local a1, b1, a2, b2 = Uu * RB, (L - Uu) * RB, Ur * RB, (L - Ur) * RB
  local y1, y2 = fu - OUT / GC, fr - OUT / GC
  local det = a1 * b2 - a2 * b1
  local x, y = (y1 * b2 - y2 * b1) / det, (a1 * y2 - a2 * y1) / det
  if x <= 0 or y <= 0 then
    -- no separate repeat rate can be told apart here: one rate for both
    x = y1 / (L * RB)
    y = x
  end
  G, Gr = 1 / x, 1 / y
  rate("hbm_gather", G, "B/s", ("embedding forward, %d tables x %d rows x %d f32 in %s memory: %d uniform ids (%d "
       .. "distinct) %.3f ms, %d ids over %d rows a table %.3f ms; outputs at hbm_copy"):format(T, ROWS, DIM,
       place_fast, L, Uu, fu * 1e3, L, HOT, fr * 1e3))
  rate("hbm_gather_repeat", Gr, "B/s", "the same two forwards: bytes of rows read again within the batch")
  -- the fused backward (SGD): b - OUT/GC = L kb + U RB / Gu, for both batches
  local grad = assert(c:new_output(in_u))
  grad:fill(1e-3)
  local bu = time(reps, function() assert(c:backward(in_u, grad)) end)
  local br = time(reps, function() assert(c:backward(in_r, grad)) end)
  local v = ((bu - br) / ((Uu - Ur) * RB))
  local kb = ((br - OUT / GC) - Ur * RB * v) / L
  if kb < 0 or v <= 0 then
    kb = math.max(0, (br - OUT / GC) / L)
    v = math.max((bu - OUT / GC - L * kb) / (Uu * RB), 1e-15)
  end
  rate("tbe_backward_per_id", kb, "s", ("fused backward with SGD, the same collection: %.3f ms (uniform) and %.3f ms "
       .. "(repeated rows) for %d ids; with hbm_update fitted to both"):format(bu * 1e3, br * 1e3, L))
  rate("hbm_update", 1 / v, "B/s", "the same two backwards: bytes of the distinct rows stepped")
  rates._kb = kb
  out:free(); grad:free()
  c:free()
end

-- rows read and updated in place: pinned and managed tables.  The managed ones under the `host`
-- hint policy (every row preferred on the host, accessed by the GPU, prefetched to the host): read in
-- place over the link as the planner prices a managed table's rows beyond its prefix; without
-- it a GPU's first touch migrates the pages into HBM and the runs measure HBM.
for _, pl in ipairs({ { "pinned", "zero_copy" }, { "managed", "managed" } }) do
  local c = collection(pl[1])
  local out = assert(c:new_output(in_u))
  local hm
  if pl[1] == "managed" then
    -- the advice once; then neither the access counters the manager turns on nor its migration
    -- monitor (CUPTI) run in the timed steps
    hm = require("uvmrec.hints").manager(c, { policy = "host", monitor = false })
    assert(hm:interval(1))
    assert(c:set_counting(false))
    if gpu then ur.sync() end
  end
  local f = time(reps, function() assert(c:forward(in_u, out)) end)
  local rest = rest_of(pl[2] .. "_gather", f, f - OUT / GC - (L - Uu) * RB / Gr,
                       "the outputs' writes at hbm_copy and the repeated rows' reads at hbm_gather_repeat")
  rate(pl[2] .. "_gather", Uu * RB / rest, "B/s", ("embedding forward of %s tables%s, %d uniform ids: "
       .. "%.3f ms; the distinct rows' bytes over what is left after the outputs and repeats"):format(pl[1],
       hm and " (host policy)" or "", L, f * 1e3))
  local grad = assert(c:new_output(in_u))
  grad:fill(1e-3)
  local b = time(reps, function() assert(c:backward(in_u, grad)) end)
  local restb = rest_of(pl[2] .. "_update", b, b - OUT / GC - L * rates._kb,
                        ("the gradient's read at hbm_copy and %d ids at tbe_backward_per_id %.3f ns"):format(L,
                        rates._kb * 1e9))
  rate(pl[2] .. "_update", Uu * RB / restb, "B/s", ("fused backward (SGD) of the same, %.3f ms; the "
       .. "distinct rows' bytes over what is left after the per-id cost and the gradient's read"):format(b * 1e3))
  if hm then hm:free() end
  out:free(); grad:free()
  c:free()
end
rates._kb = nil

-- ---- the hot_prefix hint policy's interval, after its one-time relayout ----
-- What every interval does again (the layout read back, the prefix placed, its coverage
-- measured), per row: tables of millions of rows, as the policy's work is a pass over them
-- (memory-bound; a table that fits in the CPU's caches costs less a row).
do
  local HR = Q and 2 ^ 18 or 2 ^ 21
  local tabs = {}
  for t = 1, T do tabs[t] = { name = "t" .. t, rows = HR, dim = 16, placement = "managed" } end
  local c = assert(tbe.new { tables = tabs, optimizer = { "sgd", lr = 1e-6 }, bounds = "off" })
  -- the model's Zipf ids: the counts the interval ranks and sums are a model's
  local input = input_of(zipf_batch(HR, BATCH))
  local out = assert(c:new_output(input))
  local m = require("uvmrec.hints").manager(c, { policy = "hot_prefix", allowance = "20%" })
  assert(c:forward(input, out))
  local t0 = C.ur_clock_seconds()
  assert(m:interval(1))
  local first = C.ur_clock_seconds() - t0
  assert(c:forward(input, out))
  local step = 1
  local th = time(Q and 2 or 4, function()
    step = step + 1
    assert(m:interval(step))
  end)
  m:free(); out:free(); input.values:free(); input.offsets:free()
  c:free()
  rate("hints_per_row", th / (T * HR), "s", ("the hot_prefix policy's interval over %d managed tables of %d rows "
       .. "counted on a batch of Zipf(%g) ids, after its relayout: %.3f ms (the first interval, with the "
       .. "relayout: %.1f ms, once)"):format(T, HR, ZIPF, th * 1e3, first * 1e3), true)
end

-- ---- the software cache (LRU) ----
-- Its lookup sorts every id; its decisions, placement and slot reads go per distinct row; a
-- miss moves its row in and, dirty, back; and a batch, whatever its size, pays its launches
-- and the host's two waits (engine/src/embedding/cache.c: decide).  So: five all-hit batches
-- (the tables cached whole, the same batch prepared again) of uniform ids (nearly every id a
-- distinct row) and of the model's Zipf ids (a few distinct rows an id), at several sizes, give
-- a cost per batch, one per id and one per distinct row.  Then moves: a
-- cache of a sixteenth of the rows filled by one batch of fresh uniform ids, then batches of
-- a sixteenth as many fresh ids a table (one row in 256 of a table: sparse, as a large table's
-- misses are, each row its own pages; the dense batches this measured before, one row in 21,
-- moved them 2.8 times as fast as dlrm_mlperf_v1_2m's cache did: docs/results.md, thirteenth
-- session), each evicting a dirty row, at rows of 16 and 512 bytes: a moved row's cost and
-- its bytes'.
do
  local crow = S.crow
  local cb = S.cbatch
  local CL = T * cb
  local function cache_batch(n, ids_fn)
    return { values = i64(n, ids_fn), offsets = i64(n + 1, function(k) return k end) }
  end
  local function run(dim, lf, batches, min_slots)
    local tabs = {}
    for t = 1, T do tabs[t] = { name = "t" .. t, rows = crow, dim = dim, placement = "cached" } end
    -- on the default device, as every collection here: the GPU when there is one (where the
    -- batches' ids are, and where the planner prices the cache), else the CPU
    local c = assert(tbe.new { tables = tabs, optimizer = "sgd", bounds = "off",
                               cache = { load_factor = lf, policy = "lru", min_slots = min_slots } })
    local cache = c.cache
    local function step(x)
      assert(c:retire(assert(c:prepare(x)), true))
    end
    step(batches[1])
    cache:reset_stats()
    local times = {}
    for k = 2, #batches do
      local t0 = C.ur_clock_seconds()
      step(batches[k])
      if gpu then ur.sync() end
      times[#times + 1] = C.ur_clock_seconds() - t0
    end
    table.sort(times)
    local s, where = cache:stats(), c:placement()
    c:free()
    return times[1], s, #batches - 1, where
  end
  local nrep = Q and 8 or 12
  local function all_hit(ids, n)
    local b = cache_batch(n, function(k) return ids[k] end)
    local list = {}
    for k = 1, nrep do list[k] = b end
    local t, s, _, where = run(4, 1.0, list)
    if s.misses + s.conflicts > 0 then
      print(("  (note: %d misses in the all-hit runs)"):format(s.misses + s.conflicts))
    end
    b.values:free(); b.offsets:free()
    return t, where
  end
  -- all-hit batches (ids a table, their ids): uniform ids at cb and at a quarter of it (nearly
  -- every id a distinct row), the model's Zipf ids at 1, 2 and 8 times cb (a few distinct rows an
  -- id); t = F + n kc + U ku fitted to the five (relative errors, least squares): three runs
  -- solved exactly left each term to the noise of one (fresh fits on the H200 moved the terms
  -- 0.2-2.7x while the predicted steps stayed within 3%: docs/results.md, eighteenth session).
  -- On the H200 the per-id and per-row terms still trade against each other between runs
  -- (0.019 / 0.596 against 0.060 / 0.355 ns), the batches' times within 3-13% (twentieth).
  local function uniform_ids(per)
    local ids = {}
    for k = 0, T * per - 1 do ids[k] = uniform[k % L] % crow end
    return ids
  end
  local q4 = math.max(1, math.floor(cb / 4))
  local zipf_name = ("Zipf(%g)"):format(ZIPF)
  local runs = { { what = "uniform", per = cb, ids = uniform_ids(cb) },
                 { what = "uniform", per = q4, ids = uniform_ids(q4) },
                 { what = zipf_name, per = cb, ids = zipf_batch(crow, cb, 4096) },
                 { what = zipf_name, per = 2 * cb, ids = zipf_batch(crow, 2 * cb, 6144) },
                 { what = zipf_name, per = 8 * cb, ids = zipf_batch(crow, 8 * cb, 8192) } }
  local A, y, where = {}, {}, nil
  for i, r in ipairs(runs) do
    r.n, r.U = T * r.per, distinct(r.ids, r.per, crow)
    local t, w = all_hit(r.ids, r.n)
    r.t, where = t, where or w
    A[i], y[i] = { 1, r.n, r.U }, t
  end
  local c, worst = calib.fit(A, y, true)
  local kf, kc, ku = c[1], c[2], c[3]
  local shown = {}
  for i, r in ipairs(runs) do
    shown[i] = ("%d %s ids (%d distinct rows) %.3f ms"):format(r.n, r.what, r.U, r.t * 1e3)
  end
  local dropped = {}
  for j, name in ipairs({ "a batch", "an id", "a row" }) do if c[j] == 0 then dropped[#dropped + 1] = name end end
  local how = ("; fitted with cache_per_id and cache_per_row to the five (worst run %.0f%% off%s)"):format(worst * 100,
              #dropped > 0 and ("; no term %s: it fitted below 0"):format(table.concat(dropped, ", ")) or "")
  rate("cache_per_batch", kf, "s", ("the cache's prepare and retire of all-hit batches, all cached (slots in %s "
       .. "memory), %d tables x %d rows: %s%s"):format(where, T, crow, table.concat(shown, ", "), how))
  rate("cache_per_id", kc, "s", "the same five batches: per id")
  rate("cache_per_row", ku, "s", "the same five batches: per distinct row")
  -- one batch of cb fresh ids a table fills the cache (a sixteenth of the rows), then sparse ones
  local sparse = math.max(1, math.floor(cb / 16))
  local fresh = { cache_batch(CL, function() return math.random(0, crow - 1) end) }
  for k = 2, nrep do
    fresh[k] = cache_batch(T * sparse, function() return math.random(0, crow - 1) end)
  end
  local lf = math.min(1, cb / crow)
  local moves = {}
  for _, dim in ipairs({ 4, 128 }) do
    -- (min_slots 0: no table cached whole for its size, as the quick run's small ones would be)
    local tm, s, nb = run(dim, lf, fresh, 0)
    local m = (s.misses + s.conflicts + s.writebacks) / nb
    moves[dim] = { per_row = (tm - kf - T * sparse * kc - s.unique / nb * ku) / math.max(m, 1), rows = m,
                   ms = tm * 1e3, conflicts = s.conflicts / nb, writebacks = s.writebacks / nb }
  end
  local b4, b128 = 4 * 4, 128 * 4
  local slope = (moves[128].per_row - moves[4].per_row) / (b128 - b4)
  local fixed = moves[4].per_row - slope * b4
  if slope <= 0 or fixed < 0 then
    -- too noisy to split: the 512-byte rows' whole cost as bytes (at least 1 ns a row)
    slope, fixed = math.max(moves[128].per_row, 1e-9) / b128, 0
  end
  rate("cache_row_fixed", math.max(fixed, 0), "s", ("the cache with a %g share of %d tables' %d rows filled by one "
       .. "batch, then batches of %d fresh uniform ids a table (one row in %d): %.0f rows moved a batch (%.0f of them "
       .. "write-backs, %.0f conflicts), %.3f ms with rows of 16 bytes, %.3f ms with 512 (less the per-batch, per-id "
       .. "and per-row costs): per row"):format(lf, T, crow, sparse, math.floor(crow / sparse), moves[128].rows,
       moves[128].writebacks, moves[128].conflicts, moves[4].ms, moves[128].ms))
  rate("cache_move", 1 / slope, "B/s", "the same runs: the bytes a moved row adds")
  for _, b in ipairs(fresh) do b.values:free(); b.offsets:free() end
end
rates.pipeline_overlap = { value = 0, unit = "fraction", measured = false, command = command, date = date,
  source = gpu and "not measured by calibrate yet (the prefetch pipeline's overlap needs a training run)"
           or "the CPU backend runs streams synchronously: nothing overlaps" }
print(("  %-22s %14s  %s"):format("pipeline_overlap", "0", rates.pipeline_overlap.source))

-- ---- dense: MLPs of several shapes, and the dot interaction ----
do
  local nn = require "uvmrec.nn"
  -- the interaction first: right after the MLPs' products OpenBLAS's threads may still spin for
  -- work and take the cores from it (one run there measured 5.3 GFLOP/s; first, 4.7 to 9.1)
  do
    local B, d, F, ip = S.inter.batch, S.inter.dim, 27, S.inter.precision
    -- padded as models/dlrm.lua's (zero columns up to a multiple of 8); under bf16 as the bf16
    -- model runs it: the bottom MLP's output, the pooled rows (nn.EmbeddingBagCollection's
    -- set_precision makes them bf16) and the gradient in bf16
    local it = nn.Interaction { pad = true }
    if gpu then it:to("device") end
    it:set_precision(ip)
    local ad = ip == "bf16" and "bf16" or "f32"
    local dn = assert(ur.tensor({ B, d }, { placement = place_fast, dtype = ad })); dn:uniform(-1, 1, 5)
    local em = assert(ur.tensor({ B, (F - 1) * d }, { placement = place_fast, dtype = ad })); em:uniform(-1, 1, 6)
    local gy = assert(ur.tensor(it:forward({ dn, em }):shape(), { placement = place_fast, dtype = ad }))
    gy:uniform(-1, 1, 7)
    local t = time(reps, function()
      it:forward({ dn, em })
      it:backward({ dn, em }, gy)
    end)
    rate("interaction_dot", 6 * B * (F * (F - 1) / 2) * d / t, "FLOP/s", ("dot interaction of %d vectors of %d (%s), "
         .. "forward + backward at batch %d: %.2f ms; 6 x batch x F(F-1)/2 x dim"):format(F, d, ip, B, t * 1e3),
         true)
    dn:free(); em:free(); gy:free()
    it = nil -- luacheck: ignore 311
    collectgarbage()
  end

  -- the stacks of S.mlps at two batches: a layer's forward + backward costs 6·B·in·out FLOPs at
  -- the matrix products' rate, a time per output value (bias, activation and their gradients)
  -- and a time per layer (on the CPU OpenBLAS's threading of its products at these sizes; on a
  -- GPU its kernels' launches); the three are fitted to all runs (small products run far below
  -- the large ones' rate) in the form uvmrec.planner.cost's dense() prices them
  local shapes = S.mlps
  local batches = S.mlp_batches
  for _, prec in ipairs({ "f32", "tf32", "bf16" }) do
    local A, y = {}, {}
    local total = 0
    for _, B in ipairs(batches) do
      for _, w in ipairs(shapes) do
        -- as models/dlrm.lua's: the bottom stack (fed the 13 dense features) skips its input's
        -- gradient, the others compute it
        local bottom = w[1] == 13
        local m = nn.MLP(w, { input_grad = not bottom, last = w[#w] == 1 and "none" or nil })
        if gpu then m:to("device") end
        m:set_precision(prec)
        local gd = prec == "bf16" and "bf16" or "f32"
        local x = assert(ur.tensor({ B, w[1] }, { placement = place_fast })); x:uniform(0, 1, 1)
        local g = assert(ur.tensor({ B, w[#w] }, { placement = place_fast, dtype = gd })); g:uniform(-1, 1, 3)
        -- three runs even when quick: one run on a loaded machine can be preempted (CI saw every
        -- quick run a multiple of the 4 ms scheduler tick, and the fit then found no FLOP rate)
        local t = time(Q and 3 or 5, function() m:forward(x); m:backward(x, g) end)
        local macs, outs = 0, 0
        for k = 1, #w - 1 do macs, outs = macs + w[k] * w[k + 1], outs + w[k + 1] end
        -- a layer's products: 2 forward, 2 for the weights' gradient, 2 for the input's
        local flops = 6 * B * macs - (bottom and 2 * B * w[1] * w[2] or 0)
        A[#A + 1], y[#y + 1] = { flops, B * outs, #w - 1 }, t
        total = total + t
        x:free(); g:free()
        -- the stack's parameters and arena (on a GPU up to a few GiB at the largest batch) go
        -- before the next one is built
        m = nil -- luacheck: ignore 311
        collectgarbage()
      end
    end
    local c, worst = calib.fit(A, y, true)
    if c[1] <= 0 then
      local runs = {}
      for i = 1, #A do
        runs[i] = ("%.3g FLOP, %d values, %d layers: %.3f ms"):format(A[i][1], A[i][2], A[i][3], y[i] * 1e3)
      end
      error(("calibrate: the MLP runs (%s) gave no positive FLOP rate (the fit left the products' FLOPs "
             .. "%.3g s each: the runs are bound by their launches or values, not their products; expected "
             .. "stacks and batches where the products weigh most).  Runs: %s"):format(prec, c[1],
             table.concat(runs, "; ")), 0)
    end
    local how = ("%d MLP stacks (%s) at batch %s, %s, forward + backward: "
                 .. "%.2f ms in all; fitted with the per-value and per-layer terms (worst run %.0f%% off)"):format(
                 #shapes, SHAPES[KIND].mlp_names, table.concat(batches, " and "), prec, total * 1e3, worst * 100)
    rate("mlp_" .. prec, 1 / c[1], "FLOP/s", how .. "; 6 x batch x sum of in x out, less the bottom's input "
         .. "gradient")
    rate("mlp_act_" .. prec, c[2], "s", "the same fit: per output value of a layer")
    rate("mlp_layer_" .. prec, c[3], "s", ("the same fit: per layer, at batches %s (%s)"):format(
         table.concat(batches, " to "), gpu and "its kernels' launches"
         or "the products' threading at these sizes, not a call's cost"))
  end
end

-- ---- a training step's fixed cost: dlrm_tiny at batch 8, whose work is negligible ----
do
  local train = require "uvmrec.train"
  local path = assert(train.find_config("dlrm_tiny"))
  local cfg = assert(train.config.load(path, { "train.batch_size=8" }))
  local def = assert(train.model_def(cfg, path))
  local model = def.build(cfg, { cpu = not gpu })
  local opt = train.optimizer(cfg, model)
  local d = assert(train.data(cfg, train.config.table_rows(cfg)))
  local lo = {}
  for k, v in pairs(d.train) do lo[k] = v end
  lo.samples = 64
  local loader = assert(ur.data.loader(lo))
  local b = assert(loader:next()):to(gpu and "device" or "host")
  loader:close()
  local t = time(Q and 5 or 21, function() train.loop.step(model, opt, b):get(0) end)
  rate("step_overhead", t, "s", ("a whole training step of dlrm_tiny at batch 8 (26 tables, MLPs 13-64-16 and "
       .. "367-64-1): %.3f ms, its work negligible"):format(t * 1e3), true)

  -- the synthetic loader: dlrm_tiny's data in batches of 1024 (the values a sample has as the
  -- planner counts them: ids, dense features, label).  On the CPU backend its threads take the
  -- cores the step runs on: what it costs is what it adds to a step, dlrm_tiny's steps fed by it
  -- against the same steps of batches made before, with no loader running (medians).  On a GPU
  -- in-order synthetic data is drawn on the device (uvmrec.data.generator, as uvmrec.train's run
  -- draws it there), beside the step: its cost is its own rate, batches one after another.
  local LB = S.loader_batch
  local lcfg = assert(train.config.load(path, { "train.batch_size=" .. LB }))
  local values = assert(require("uvmrec.planner").from_config(lcfg)).loader.values
  local n = Q and 6 or 24
  lo.batch_size, lo.samples = LB, LB * (n + 4)
  local per, how
  if gpu then
    lo.placement = "device"
    local ld = assert(ur.data.loader(lo))
    assert(ld:next())
    ur.sync()
    local t0 = C.ur_clock_seconds()
    for _ = 1, n do assert(ld:next()) end
    ur.sync()
    per = (C.ur_clock_seconds() - t0) / n
    ld:close()
    how = ("drawn on the GPU (uvmrec.data.generator), %.3f ms a batch, one after another"):format(per * 1e3)
  else
    local lmodel = def.build(lcfg, { cpu = true })
    local lopt = train.optimizer(lcfg, lmodel)
    -- seconds: the median of n steps after two warm-up ones
    local function median(steps_of)
      for k = 1, 2 do train.loop.step(lmodel, lopt, steps_of(k)):get(0) end
      return streams.median_ms(function(k) train.loop.step(lmodel, lopt, steps_of(k + 2)):get(0) end, n) / 1e3
    end
    local ld = assert(ur.data.loader(lo))
    local made = {}
    for k = 1, n + 2 do made[k] = assert(ld:next()):to("host") end
    ld:close()
    local mb = median(function(k) return made[k] end)
    made = nil -- luacheck: ignore 311
    ld = assert(ur.data.loader(lo))
    local mf = median(function() return assert(ld:next()):to("host") end)
    ld:close()
    per = math.max(0, mf - mb)
    how = ("dlrm_tiny's step %.3f ms fed by it, %.3f ms from batches made before (medians of %d)"):format(mf * 1e3,
          mb * 1e3, n)
  end
  rate("loader_per_value", per / (LB * values), "s", ("dlrm_tiny's synthetic batches of %d samples, %d values "
       .. "each: %s"):format(LB, values, how))
end

in_u.values:free(); in_u.offsets:free(); in_r.values:free(); in_r.offsets:free()

local machine = o.machine
if not machine then
  if gpu then
    machine = ur.device_props(0).name
  else
    local cpuinfo = require("uvmrec.lib").read_file("/proc/cpuinfo") or ""
    local cpu = cpuinfo:match("model name%s*:%s*([^\n]+)") or "unknown CPU"
    local n = 0
    local g = io.popen("nproc 2>/dev/null")
    if g then n = tonumber(g:read("*l")) or 0 g:close() end
    machine = ("%s, %d cores (CPU backend)"):format(cpu, n)
  end
end
local commit = ur.commit()
local t = { format = calib.FORMAT, version = calib.VERSION, machine = machine, backend = gpu and "cuda" or "cpu",
            date = date, command = command, commit = commit, rates = rates,
            seconds = math.floor((C.ur_clock_seconds() - t_start) * 10 + 0.5) / 10,
            load_average = load_start and { load_start, loadavg() } or nil }
assert(calib.from_table(t, "calibrate"))
local text = calib.encode(t)
if o.out then
  local ok, werr = require("uvmrec.lib").check(C.ur_file_write(o.out, text, #text))
  if not ok then -- the measurements are not lost: they go to standard output
    io.write(text)
    cmd:fail(werr .. " (the calibration is on standard output)")
  end
  print(("wrote %s in %.1f s"):format(o.out, C.ur_clock_seconds() - t_start))
else
  io.write(text)
end
