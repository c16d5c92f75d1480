-- Managed collisions against ids modulo rows (issue #22), on the CPU or (--gpu) the GPU.
--
--   uvmrec scripts/bench/collisions.lua [--max-rows 100] [--factor 10] [--drifts 0,0.0005]
--        [--policies modulo,lfu,lru,distance_lfu] [--seeds 1,2,3] [--steps 300] [--evict-every 25]
--        [--gpu] [--out FILE.jsonl]
--   uvmrec scripts/bench/collisions.lua --cost [--batches 128,2048,16384] [--gpu] [--out FILE.jsonl]
--
-- From a `make dist` tree: bin/uvmrec scripts/bench/collisions.lua --cost --gpu (and without
-- --cost for the quality runs on the GPU).
--
-- Quality: dlrm_tiny with its tables capped at --max-rows rows, trained --steps steps on
-- synthetic `tiny` data whose ids come from a space --factor times each capped table's rows
-- (id_space_factor), with and without drift (the generator's `drift`: ranks the hot ids move
-- a sample).  `modulo` takes the ids modulo rows (the loader does); the others put them through
-- managed collisions with that policy (embeddings.collisions).  For each run: the AUC on the
-- 65536 samples right after the training samples (the next traffic: under drift, the trainer's
-- held-out samples from 2^48 lie at an unrelated point of the drift), and the share of those
-- lookups that land on a row shared with another live id (live: an id occurring in those
-- samples; a row is shared when two or more live ids read it; the rows each id reads come from
-- the trained map, read-only, or from the modulo).  Each seed s changes the data (synthetic
-- seed 1234 + s) and the model (train.seed s).  Checked: managed collisions' statistics add up
-- (resident + fallback lookups = lookups) and no two resident ids share a row.
--
-- Cost: the remap's time per step for dlrm_kaggle-sized tables (26 tables, 33.8 M rows, the
-- Kaggle sizes; ids from synthetic `kaggle` with an id space 10x each table), per batch size:
-- from an empty map (fill rounds every step), then with every map full (loaded with the ids
-- seen and fillers that are never looked up), and one eviction round of every table, timed;
-- the amortised cost per step at evict_every 1000; and re-initialising embedding rows (dim 16,
-- rowwise Adagrad), per thousand rows, which a round asks for each id it evicts.  Checked
-- before any time is reported: every row a remap gives equals the read-only lookup's, and with
-- --gpu the GPU's rows equal a CPU map's batch for batch.
local ffi = require "ffi"
local ur = require "uvmrec"
local train = require "uvmrec.train"
local mc = require "uvmrec.mc"
local json = require "uvmrec.json"
local C = ur.C
local flag_set = require("uvmrec.lib").flag_set
local things = require("uvmrec.lib").things
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/collisions.lua",
  summary = "managed collisions against ids modulo rows: next-traffic AUC, shared rows, and the remap's cost",
  { "--cost", "measure the remap's cost at dlrm_kaggle's table sizes instead" },
  { "--gpu", "on the GPU (the maps where the tables run; the CPU's decisions checked first for --cost)" },
  { "--max-rows N", "rows each table is capped at", type = "whole", default = 100 },
  { "--factor N", "the id space, as a multiple of each capped table's rows", type = "number", default = 10 },
  { "--drifts R", "drifts (ranks the hot ids move a sample) to run", type = "numbers", default = { 0, 0.0005 } },
  { "--policies P", "modulo and managed collisions' policies", type = "list",
    choices = { "modulo", "lfu", "lru", "distance_lfu" }, default = { "modulo", "lfu", "lru", "distance_lfu" } },
  { "--seeds S", "seeds", type = "numbers", default = { 1, 2, 3 } },
  { "--steps N", "training steps (batches of 1024)", type = "whole", default = 300 },
  { "--evict-every N", "managed collisions' evict_every", type = "whole", default = 25 },
  { "--batches B", "--cost: batch sizes (default 128,2048,16384; --gpu 2048,16384,65536)", type = "numbers" },
  { "--cost-steps N", "--cost: timed steps per phase", type = "whole", default = 40 },
  options.out,
}
local o = cmd:parse(arg)

if o.gpu and not ur.gpu() then cmd:fail("--gpu: no GPU in use: " .. tostring(ur.cuda_error()), 2) end
local WHERE = o.gpu and ("the GPU (%s)"):format(ur.device_props(0).name) or "the CPU"
local EVAL = 65536

local out_file = json.lines(o.out)
local function emit(rec)
  if not o.out then return end
  rec.where = o.gpu and "gpu" or "cpu"
  out_file:write(rec)
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

-- The maps' invariants after training: every resident id on a row of its own, the lookups
-- split into resident and fallback ones.
local function check_maps(mcc)
  local s = assert(mcc:stats())
  for name, t in pairs(s.tables) do
    if t.resident_lookups + t.fallback_lookups ~= t.lookups then
      error(("%s: %d resident + %d fallback lookups are not the %d lookups"):format(name, t.resident_lookups,
        t.fallback_lookups, t.lookups))
    end
    local ids = assert(assert(mcc.map:state(name)).ids:to("host")):totable()
    local seen = {}
    for _, id in ipairs(ids) do
      if id ~= -1 then
        if seen[id] then error(("%s: id %d holds two rows"):format(name, id)) end
        seen[id] = true
      end
    end
  end
end

local function quality()
  local dir = os.tmpname()
  os.remove(dir)
  assert(C.ur_dir_create(dir) == 0)
  local results = {}
  print(("dlrm_tiny on %s, tables capped at %d rows, ids from %g x each table's rows, %s of 1024, "
         .. "evict_every %d; evaluated on the %d samples after training"):format(WHERE, o.max_rows, o.factor,
         things(o.steps, "step"), o.evict_every, EVAL))
  for _, drift in ipairs(o.drifts) do
    for _, policy in ipairs(o.policies) do
      local aucs, shares, resident = {}, {}, {}
      for _, seed in ipairs(o.seeds) do
        local spec_path = ("%s/wide_%d_%g.yaml"):format(dir, seed, drift)
        local f = assert(io.open(spec_path, "w"))
        f:write(("synthetic: {preset: tiny, seed: %d, id_space_factor: %g, drift: %g}\n"):format(
          1234 + seed, o.factor, drift))
        f:close()
        local sets = { flag_set("--steps", "train.steps", o.steps),
                       flag_set("--max-rows", "embeddings.max_rows", o.max_rows), "eval.every=0",
                       "eval.samples=0", "eval.min_auc=0", "data.train=synthetic:" .. spec_path,
                       "train.seed=" .. seed }
        if policy ~= "modulo" then
          sets[#sets + 1] = "embeddings.collisions.policy=" .. policy
          sets[#sets + 1] = flag_set("--evict-every", "embeddings.collisions.evict_every", o.evict_every)
        end
        local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), sets))
        local model
        local t0 = C.ur_clock_seconds()
        local r = assert(train.run(cfg, { progress = "none", cpu = not o.gpu, print = function() end,
                                          setup = function(ctx) model = ctx.model end }))
        local seconds = C.ur_clock_seconds() - t0
        if model.collisions then check_maps(model.collisions) end
        local rows = train.config.table_rows(cfg)
        local data = assert(train.data(cfg, rows))
        local n = data.train.samples
        -- the next traffic: samples n .. n + EVAL - 1, ids as the training data's
        local eo = {}
        for k, v in pairs(data.train) do eo[k] = v end
        eo.samples, eo.position, eo.batch_size, eo.epochs, eo.depth = n + EVAL, { epoch = 0, sample = n }, 8192, 1, 2
        local loader = assert(ur.data.loader(eo))
        local source = train.source.loader(loader, { placement = o.gpu and "device" or nil })
        local ev = assert(train.evaluate.run(model, source, { metrics = { "auc" }, samples = EVAL, batch_size = 8192 }))
        source:free()
        loader:close()
        assert(ev.samples == EVAL, "evaluated " .. tostring(ev.samples) .. " samples")
        if not ev.auc then cmd:fail(policy .. ": the held-out AUC is undefined (" .. ev.auc_undefined .. ")") end
        local spec = data.train.data.spec
        local ceiling = ur.data.hidden_auc(spec, EVAL, n)
        local share = shared_share(model, spec, n, EVAL, rows)
        local rec = { bench = "collisions_quality", policy = policy, drift = drift, seed = seed,
                      max_rows = o.max_rows, factor = o.factor, steps = o.steps, evict_every = o.evict_every,
                      auc = ev.auc, ceiling = ceiling, shared_share = share,
                      resident_share = r.collisions and r.collisions.resident_share,
                      evictions = r.collisions and r.collisions.evictions, seconds = seconds }
        emit(rec)
        aucs[#aucs + 1], shares[#shares + 1] = ev.auc, share
        if r.collisions then resident[#resident + 1] = r.collisions.resident_share end
        io.stdout:write(("  %-12s drift %-7g seed %d: AUC %.4f (ceiling %.4f), shared %.3f%s, %.0f s\n"):format(policy,
          drift, seed, ev.auc, ceiling, share, r.collisions and (", resident lookups in training %.3f"):format(
          r.collisions.resident_share) or "", seconds))
        io.stdout:flush()
        model.embeddings.tbe:free()
      end
      local am, asd = mean_sd(aucs)
      local sm = mean_sd(shares)
      results[#results + 1] = { policy = policy, drift = drift, auc = am, sd = asd, shared = sm,
                                resident = #resident > 0 and mean_sd(resident) or nil }
    end
  end
  print(("\n| drift | ids | next-traffic AUC (mean ± sd, %d seeds) | lookups on a shared row "
        .. "| resident lookups (training) |"):format(#o.seeds))
  print("| --- | --- | --- | --- | --- |")
  for _, r in ipairs(results) do
    print(("| %g | %s | %.4f ± %.4f | %.1f%% | %s |"):format(r.drift, r.policy == "modulo" and "modulo rows"
      or r.policy, r.auc, r.sd, 100 * r.shared, r.resident and ("%.1f%%"):format(100 * r.resident) or "-"))
  end
  os.execute("rm -rf '" .. dir .. "'")
end

-- ---- cost ----

-- A batch of B samples of the spec as a KJT of keys C1..C26 (placement: "host" or "device").
local KEYS = {}
for i = 1, 26 do KEYS[i] = "C" .. i end
local function kaggle_batch(spec, first, B, placement)
  local g = assert(ur.data.generate(spec, first, B))
  local T = 26
  local ids = ffi.cast("int64_t *", ur.C.ur_tensor_data(g.ids.p))
  local values, lengths = ur.tensor({ B * T }, { dtype = "i64" }), ur.tensor({ B * T }, { dtype = "i32" })
  local v = ffi.cast("int64_t *", ur.C.ur_tensor_data(values.p))
  local l = ffi.cast("int32_t *", ur.C.ur_tensor_data(lengths.p))
  for t = 0, T - 1 do
    for b = 0, B - 1 do
      v[t * B + b] = ids[b * T + t]
      l[t * B + b] = 1
    end
  end
  local k = ur.KJT { keys = KEYS, values = values, lengths = lengths }
  if placement == "device" then k = assert(k:to("device")) end
  return k, g.ids
end

-- Every row the remap gave (a KJT of rows) equals the read-only lookup's.
local function check_rows(m, rows_kjt, ids, B)
  local got = assert(rows_kjt:values():to("host")):totable()
  local raw = ids:totable()
  for t = 1, 26 do
    local col = {}
    for b = 1, B do col[b] = raw[(b - 1) * 26 + t] end
    local want = assert(m:lookup("C" .. t, col))
    for b = 1, B do
      if got[(t - 1) * B + b] ~= want[b] then
        error(("C%d, sample %d: the remap gave row %d, the lookup %d"):format(t, b, got[(t - 1) * B + b], want[b]))
      end
    end
  end
end

local function cost()
  local rows = ur.data.presets.kaggle_rows
  local spec = ur.data.synthetic_spec("kaggle", { id_space_factor = 10 })
  local tables = {}
  for i, r in ipairs(rows) do tables[i] = { name = "C" .. i, rows = r } end
  local total = 0
  for _, r in ipairs(rows) do total = total + r end
  local place = o.gpu and "device" or "host"
  local batches = o.batches or (o.gpu and { 2048, 16384, 65536 } or { 128, 2048, 16384 })
  print(("dlrm_kaggle's tables (26, %d rows), ids from 10x each table's rows (Zipf 1.05), lfu, on %s")
        :format(total, WHERE))
  for _, B in ipairs(batches) do
    local m = assert(mc.new { tables = tables, policy = "lfu", evict_every = 1000000, device = o.gpu and 0 or "cpu" })
    local ref = o.gpu and assert(mc.new { tables = tables, policy = "lfu", evict_every = 1000000, device = "cpu" })
    local stream = o.gpu and assert(ur.stream()) or nil
    local sample = 0
    local function step_time(check)
      local k, ids = kaggle_batch(spec, sample, B, place)
      sample = sample + B
      if stream then assert(stream:sync()) end
      local t0 = C.ur_clock_seconds()
      local out = assert(m:remap(k, nil, stream))
      if stream then assert(stream:sync()) end
      local dt = C.ur_clock_seconds() - t0
      if check then
        check_rows(m, out, ids, B)
        if ref then -- the GPU's decisions are the CPU's
          local hk = kaggle_batch(spec, sample - B, B, "host")
          local want = assert(ref:remap(hk)):values():totable()
          local got = assert(out:values():to("host")):totable()
          for i = 1, #want do
            if got[i] ~= want[i] then error(("batch at sample %d, value %d: GPU row %d, CPU row %d"):format(
              sample - B, i - 1, got[i], want[i])) end
          end
        end
      end
      out:free()
      k:free()
      return dt
    end
    -- an empty map: fill rounds before every batch (the first three checked)
    local fill = {}
    for i = 1, o.cost_steps do fill[i] = step_time(i <= 3) end
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
    for i = 1, o.cost_steps do full[i] = step_time(i == 1) end
    local t0 = C.ur_clock_seconds()
    local evicted = 0
    for _, t in ipairs(tables) do
      assert(m:round(t.name, stream))
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
    if ref then ref:free() end
  end
  -- re-initialising rows: what each eviction costs the embedding collection
  local e = ur.nn.EmbeddingBagCollection { tables = { { name = "t", rows = 1000000, dim = 16 } },
                                          device = o.gpu and 0 or "cpu", optimizer = { "rowwise_adagrad", lr = 0.1 } }
  local n = 100000
  local ids = ffi.new("int64_t[?]", n)
  for i = 0, n - 1 do ids[i] = (i * 7919) % 1000000 end
  assert(ur.sync())
  local t0 = C.ur_clock_seconds()
  assert(e.tbe:reset_rows("t", ids, n))
  assert(ur.sync())
  local dt = C.ur_clock_seconds() - t0
  emit { bench = "collisions_reset", rows = n, dim = 16, seconds = dt }
  print(("re-initialising %d rows of dim 16 (rowwise Adagrad state zeroed): %.1f ms, %.3f ms per thousand rows")
        :format(n, 1e3 * dt, 1e6 * dt / n))
end

if o.cost then cost() else quality() end
out_file:close()
