-- Managed collisions against ids modulo rows (issue #22), on the CPU.
--
--   uvmrec scripts/bench/collisions.lua [--max-rows 100] [--factor 10] [--drifts 0,0.0005]
--        [--policies modulo,lfu,lru,distance_lfu] [--seeds 1,2,3] [--steps 300] [--evict-every 25]
--        [--out FILE.jsonl]
--   uvmrec scripts/bench/collisions.lua --cost [--batches 128,2048,16384] [--out FILE.jsonl]
--
-- Quality: dlrm_tiny with its tables capped at --max-rows rows, trained --steps steps on
-- synthetic `tiny` data whose ids come from a space --factor times each capped table's rows
-- (id_space_factor), with and without drift (drift_rate: ranks the popularity moves a
-- sample).  `modulo` takes the ids modulo rows (the loader does); the others put them through
-- managed collisions with that policy (embeddings.collisions).  For each run: the held-out AUC
-- on the 65536 samples after training (the trainer's final evaluation), and the share of the
-- held-out lookups that land on a row shared with another live id (live: an id occurring in
-- those held-out samples; a row is shared when two or more live ids read it; the rows each id
-- reads come from the trained map, read-only, or from the modulo).  Each seed s changes the
-- data (synthetic seed 1234 + s) and the model (train.seed s).
--
-- Cost: the remap's time per step for dlrm_kaggle-sized tables (26 tables, 33.8 M rows, the
-- Kaggle sizes; ids from synthetic `kaggle` with an id space 10x each table), per batch size:
-- from an empty map (fill rounds every step), then with every map full (loaded with the ids
-- seen and fillers that are never looked up), and one eviction round of every table, timed;
-- the amortised cost per step at evict_every 1000; and re-initialising embedding rows (dim 16,
-- rowwise Adagrad), per thousand rows, which a round asks for each id it evicts.
local ffi = require "ffi"
local ur = require "uvmrec"
local train = require "uvmrec.train"
local mc = require "uvmrec.mc"
local json = require "uvmrec.json"
local C = ur.C

local o = require("uvmrec.cli").command {
  name = "scripts/bench/collisions.lua",
  summary = "managed collisions against ids modulo rows: held-out AUC, shared rows, and the remap's cost",
  { "--cost", "measure the remap's cost at dlrm_kaggle's table sizes instead" },
  { "--max-rows N", "rows each table is capped at", type = "whole", default = 100 },
  { "--factor N", "the id space, as a multiple of each capped table's rows", type = "number", default = 10 },
  { "--drifts R", "drift rates (ranks a sample) to run", type = "numbers", default = { 0, 0.0005 } },
  { "--policies P", "modulo and managed collisions' policies", type = "list",
    choices = { "modulo", "lfu", "lru", "distance_lfu" }, default = { "modulo", "lfu", "lru", "distance_lfu" } },
  { "--seeds S", "seeds", type = "numbers", default = { 1, 2, 3 } },
  { "--steps N", "training steps (batches of 1024)", type = "whole", default = 300 },
  { "--evict-every N", "managed collisions' evict_every", type = "whole", default = 25 },
  { "--batches B", "--cost: batch sizes", type = "numbers", default = { 128, 2048, 16384 } },
  { "--cost-steps N", "--cost: timed steps per phase", type = "whole", default = 40 },
  { "--out FILE", "JSON lines of the results" },
}:parse(arg)

local out_file
local function emit(rec)
  if not o.out then return end
  out_file = out_file or assert(io.open(o.out, "w"))
  out_file:write(json.encode(rec), "\n")
  out_file:flush()
end

local function mean_sd(xs)
  local m = 0
  for _, x in ipairs(xs) do m = m + x end
  m = m / #xs
  local v = 0
  for _, x in ipairs(xs) do v = v + (x - m) ^ 2 end
  return m, #xs > 1 and math.sqrt(v / (#xs - 1)) or 0
end

-- ---- quality ----

local function shared_share(model, spec, first, n, rows)
  local g = assert(ur.data.generate(spec, first, n))
  local ids = g.ids:totable()
  local T = #rows
  local on_shared, total = 0, 0
  for t = 1, T do
    local col = {}
    for i = 1, n do col[i] = ids[(i - 1) * T + t] end
    local at
    if model.collisions and model.collisions.map.table_index["C" .. t] then
      at = assert(model.collisions.map:lookup("C" .. t, col))
    else
      at = {}
      for i = 1, n do at[i] = col[i] % rows[t] end
    end
    local first_id, shared = {}, {}
    for i = 1, n do
      local r, id = at[i], col[i]
      if first_id[r] == nil then first_id[r] = id elseif first_id[r] ~= id then shared[r] = true end
    end
    for i = 1, n do
      if shared[at[i]] then on_shared = on_shared + 1 end
    end
    total = total + n
  end
  return on_shared / total
end

local function quality()
  local dir = os.tmpname()
  os.remove(dir)
  assert(C.ur_dir_create(dir) == 0)
  local results = {}
  print(("dlrm_tiny, tables capped at %d rows, ids from %g x each table's rows, %d steps of 1024, "
         .. "evict_every %d; held-out: 65536 samples"):format(o.max_rows, o.factor, o.steps, o.evict_every))
  for _, drift in ipairs(o.drifts) do
    for _, policy in ipairs(o.policies) do
      local aucs, shares, resident = {}, {}, {}
      for _, seed in ipairs(o.seeds) do
        local spec_path = ("%s/wide_%d_%g.yaml"):format(dir, seed, drift)
        local f = assert(io.open(spec_path, "w"))
        f:write(("synthetic: {preset: tiny, seed: %d, id_space_factor: %g, drift_rate: %g}\n"):format(
          1234 + seed, o.factor, drift))
        f:close()
        local sets = { "train.steps=" .. o.steps, "embeddings.max_rows=" .. o.max_rows, "eval.every=0",
                       "eval.samples=65536", "eval.min_auc=0", "data.train=synthetic:" .. spec_path,
                       "train.seed=" .. seed }
        if policy ~= "modulo" then
          sets[#sets + 1] = "embeddings.collisions.policy=" .. policy
          sets[#sets + 1] = "embeddings.collisions.evict_every=" .. o.evict_every
        end
        local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), sets))
        local model
        local t0 = C.ur_clock_seconds()
        local r = assert(train.run(cfg, { progress = "none", cpu = true, print = function() end,
                                          setup = function(ctx) model = ctx.model end }))
        local rows = train.config.table_rows(cfg)
        local data = assert(train.data(cfg, rows))
        local n = data.train.samples
        local share = shared_share(model, data.train.data.spec, n, 65536, rows)
        local rec = { bench = "collisions_quality", policy = policy, drift_rate = drift, seed = seed,
                      max_rows = o.max_rows, factor = o.factor, steps = o.steps, evict_every = o.evict_every,
                      auc = r.eval.auc, ceiling = r.ceiling, shared_share = share,
                      resident_share = r.collisions and r.collisions.resident_share,
                      evictions = r.collisions and r.collisions.evictions, seconds = C.ur_clock_seconds() - t0 }
        emit(rec)
        aucs[#aucs + 1], shares[#shares + 1] = r.eval.auc, share
        if r.collisions then resident[#resident + 1] = r.collisions.resident_share end
        io.stdout:write(("  %-12s drift %-7g seed %d: AUC %.4f (ceiling %.4f), shared %.3f%s\n"):format(policy, drift,
          seed, r.eval.auc, r.ceiling, share, r.collisions and (", resident lookups in training %.3f"):format(
          r.collisions.resident_share) or ""))
        io.stdout:flush()
      end
      local am, asd = mean_sd(aucs)
      local sm = mean_sd(shares)
      results[#results + 1] = { policy = policy, drift = drift, auc = am, sd = asd, shared = sm,
                                resident = #resident > 0 and mean_sd(resident) or nil }
    end
  end
  print("\n| drift_rate | ids | held-out AUC (mean ± sd, 3 seeds) | lookups on a shared row "
        .. "| resident lookups (training) |")
  print("| --- | --- | --- | --- | --- |")
  for _, r in ipairs(results) do
    print(("| %g | %s | %.4f ± %.4f | %.1f%% | %s |"):format(r.drift, r.policy == "modulo" and "modulo rows"
      or r.policy, r.auc, r.sd, 100 * r.shared, r.resident and ("%.1f%%"):format(100 * r.resident) or "-"))
  end
  os.execute("rm -rf '" .. dir .. "'")
end

-- ---- cost ----

local function kaggle_batch(spec, first, B)
  local g = assert(ur.data.generate(spec, first, B))
  local T = 26
  local ids = ffi.cast("int64_t *", ur.C.ur_tensor_data(g.ids.p))
  local values = ur.tensor({ B * T }, { dtype = "i64" })
  local v = ffi.cast("int64_t *", ur.C.ur_tensor_data(values.p))
  for t = 0, T - 1 do
    for b = 0, B - 1 do v[t * B + b] = ids[b * T + t] end
  end
  local offsets = ur.tensor({ B * T + 1 }, { dtype = "i64" })
  local off = ffi.cast("int64_t *", ur.C.ur_tensor_data(offsets.p))
  for i = 0, B * T do off[i] = i end
  return { values = values, offsets = offsets }
end

local function cost()
  local rows = ur.data.presets.kaggle_rows
  local spec = ur.data.synthetic_spec("kaggle", { id_space_factor = 10 })
  local tables = {}
  for i, r in ipairs(rows) do tables[i] = { name = "C" .. i, rows = r } end
  local total = 0
  for _, r in ipairs(rows) do total = total + r end
  print(("dlrm_kaggle's tables (26, %d rows), ids from 10x each table's rows (Zipf 1.05), lfu, on the CPU")
        :format(total))
  for _, B in ipairs(o.batches) do
    local m = assert(mc.new { tables = tables, policy = "lfu", evict_every = 1000000, device = "cpu" })
    local sample = 0
    local function step_time()
      local b = kaggle_batch(spec, sample, B)
      sample = sample + B
      local t0 = C.ur_clock_seconds()
      assert(m:remap(b))
      local dt = C.ur_clock_seconds() - t0
      b.values:free()
      b.offsets:free()
      return dt
    end
    -- an empty map: fill rounds before every batch
    local fill = {}
    for i = 1, o.cost_steps do fill[i] = step_time() end
    -- every map full: the ids seen so far, then fillers no batch reads
    for _, t in ipairs(tables) do
      local st = assert(m:state(t.name))
      local cap = st.ids:numel()
      local ids = ffi.cast("int64_t *", ur.C.ur_tensor_data(st.ids.p))
      local k = 0
      while k < cap and ids[k] ~= -1 do k = k + 1 end
      for r = k, cap - 1 do ids[r] = -2 - r end
      assert(m:load_state(t.name, st))
    end
    local full = {}
    for i = 1, o.cost_steps do full[i] = step_time() end
    local t0 = C.ur_clock_seconds()
    local evicted = 0
    for _, t in ipairs(tables) do
      assert(m:round(t.name))
      evicted = evicted + #m:reassigned(t.name)
    end
    local round_s = C.ur_clock_seconds() - t0
    table.sort(fill)
    table.sort(full)
    local fm, fullm = mean_sd(fill), mean_sd(full)
    local s = assert(m:stats())
    local rec = { bench = "collisions_cost", batch = B, ids_per_step = 26 * B, fill_ms = 1e3 * fm,
                  fill_p50_ms = 1e3 * fill[math.ceil(#fill / 2)], full_ms = 1e3 * fullm,
                  full_p50_ms = 1e3 * full[math.ceil(#full / 2)], round_s = round_s, evicted = evicted,
                  amortised_ms = 1e3 * (fullm + round_s / 1000), resident_share = s.resident_share }
    emit(rec)
    print(("batch %6d (%7d ids): remap %.2f ms/step (p50 %.2f) filling, %.2f ms/step (p50 %.2f) full; "
           .. "an eviction round of all 26 tables %.2f s (%d ids evicted); at evict_every 1000: %.2f ms/step")
          :format(B, 26 * B, rec.fill_ms, rec.fill_p50_ms, rec.full_ms, rec.full_p50_ms, round_s, evicted,
                  rec.amortised_ms))
    m:free()
  end
  -- re-initialising rows: what each eviction costs the embedding collection
  local e = ur.nn.EmbeddingBagCollection { tables = { { name = "t", rows = 1000000, dim = 16 } }, device = "cpu",
                                          optimizer = { "rowwise_adagrad", lr = 0.1 } }
  local n = 100000
  local ids = ffi.new("int64_t[?]", n)
  for i = 0, n - 1 do ids[i] = (i * 7919) % 1000000 end
  local t0 = C.ur_clock_seconds()
  assert(e.tbe:reset_rows("t", ids, n))
  local dt = C.ur_clock_seconds() - t0
  emit { bench = "collisions_reset", rows = n, dim = 16, seconds = dt }
  print(("re-initialising %d rows of dim 16 (rowwise Adagrad state zeroed): %.1f ms, %.3f ms per thousand rows")
        :format(n, 1e3 * dt, 1e6 * dt / n))
end

if o.cost then cost() else quality() end
if out_file then out_file:close() end
