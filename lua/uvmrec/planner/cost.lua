-- The planner's cost model: for one table and one choice (sharding, placement and its size),
-- the HBM and host bytes each shard holds, per category of ur.memory, and the seconds each
-- shard adds to its rank's step; and the same for the dense part and a rank's fixed costs.
-- docs/planner.md gives the formulas with their sources; the rates come from a calibration
-- (uvmrec.planner.calib).
--
--   local ctx = cost.context { calib = c, batch = 65536, world = 1, policy = "lru" }
--   local t = cost.table { name = "C3", rows = 1e7, dim = 128, profile = p }
--   local o = cost.option(t, ctx, { sharding = "table_wise", placement = "cached", load_factor = 0.2 })
--   o.time, o.hbm, o.shards[1].mem, o.hit_rate
local hitrate = require "uvmrec.planner.hitrate"

local M = {}
local ceil, max, min = math.ceil, math.max, math.min

M.PLACEMENTS = { "device", "managed", "cached", "host" }
M.SHARDINGS = { "table_wise", "row_wise", "column_wise", "data_parallel" }
-- prefix fractions (managed) and load factors (cached) the search tries
M.FRACTIONS = { 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9 }

local ELEM = { f32 = 4, f16 = 2, bf16 = 2 }
M.ELEM = ELEM

-- Optimizer state bytes a row carries (f32), for a row of `dim` columns.
local optim -- required on first use (uvmrec.optim is not needed to load the planner)
function M.state_bytes(optimizer, dim)
  optim = optim or require "uvmrec.optim"
  local r = optim.RULES[optimizer or "sgd"]
  if not (r and r.tables) then
    error(("cost: optimizer '%s' is not one of %s"):format(tostring(optimizer),
          table.concat(optim.names("tables"), ", ")), 3)
  end
  return 4 * r.state(dim)
end

-- What the engine's cache allocates besides slot rows (engine/src/embedding/cache.c, kernels/cache.cu):
M.CACHE = {
  slot_meta = 8 + 8 + 1,      -- tag (u64), LRU stamp (i64), dirty (u8) per slot
  slot_row_id = 8,            -- the row each slot-storage row holds (slots and staging rows)
  lfu_per_row = 4,            -- LFU count and epoch per row of every cached table
  -- the decisions' scratch a value, by backend, grown by 1/4 (engine/src/embedding/cache.c's
  -- prepare_batch): the GPU's carve (kernels/cache.cu: ka kb va vb uid ukeys 6x8, sa sb 2x4, oa ob
  -- 2x8, grp res evict 3x8, flags pre 2x24), the CPU's (cache_cpu.c: keys tkeys vidx tvidx uniq_of
  -- ukeys order res evict grp 10x8)
  scratch_per_value = { cuda = 144 * 1.25, cpu = 80 * 1.25 },
  ids_per_value = 8 * 1.25 * 2, -- slot-id buffers (i64, 1.25x), two batches in flight
  ring = 4,                   -- batches prepared and not retired: move lists each
  staging_rows = 256,         -- conflict rows per half (two halves), the default start
  min_slots = 131072,         -- tables of <= min_slots / 2 rows get two slots a row
  ways = 32,
}

function M.context(o)
  if not o.calib then error("cost.context: calib is required", 2) end
  -- a policy other than lru priced the cache as lfu; a batch of 0 or 1.5 was planned
  if o.policy ~= nil and o.policy ~= "lru" and o.policy ~= "lfu" then
    error(("cost.context: policy '%s'; expected lru or lfu"):format(tostring(o.policy)), 2)
  end
  if o.batch ~= nil and not (type(o.batch) == "number" and o.batch >= 1 and o.batch == math.floor(o.batch)
                             and o.batch < math.huge) then
    error(("cost.context: batch %s; expected a whole number >= 1"):format(tostring(o.batch)), 2)
  end
  local ctx = {
    calib = o.calib, batch = o.batch or error("cost.context: batch is required", 2),
    world = o.world or 1, policy = o.policy or "lru", pipeline = o.pipeline or false,
    page_bytes = o.page_bytes or 2097152, output_bytes = o.output_bytes or 4,
    min_slots = o.min_slots or M.CACHE.min_slots, staging_rows = o.staging_rows or M.CACHE.staging_rows,
    fractions = o.fractions or M.FRACTIONS, decay_batches = o.decay_batches,
    hints_every = o.hints_every or 100,
    -- the model's arena blocks (nn.arena): a GPU's device blocks unless told
    arena_block = o.arena_block or require("uvmrec.nn.arena").BLOCK.device,
    -- the GPU's dense workspaces (M.dense_workspaces): a GPU's unless told (the CPU has none),
    -- sized for sms multiprocessors
    workspaces = o.workspaces == nil or o.workspaces, sms = o.sms or M.WORKSPACE.sms,
    -- the backend the cache's scratch is carved for (M.cache_batch_scratch), and the rows of a
    -- rank's evaluation batches (0: none), over whose values it grows
    backend = o.calib.backend == "cpu" and "cpu" or "cuda", eval_batch = o.eval_batch or 0,
  }
  if type(ctx.eval_batch) ~= "number" or ctx.eval_batch < 0 or ctx.eval_batch ~= math.floor(ctx.eval_batch) then
    error(("cost.context: eval_batch %s; expected the rows of a rank's evaluation batches (0: none)"):format(
      tostring(ctx.eval_batch)), 2)
  end
  if type(ctx.hints_every) ~= "number" or ctx.hints_every < 1 then
    error(("cost.context: hints_every is %s; expected the steps between hint intervals (>= 1)"):format(
      tostring(ctx.hints_every)), 2)
  end
  local c = o.calib
  ctx.r = {
    G = c:rate("hbm_gather"), Gr = c:rate("hbm_gather_repeat"), Gc = c:rate("hbm_copy"), Gu = c:rate("hbm_update"),
    Gz = c:rate("zero_copy_gather"), Gm = c:rate("managed_gather"), Gzu = c:rate("zero_copy_update"),
    Gmu = c:rate("managed_update"), kb = c:rate("tbe_backward_per_id"),
    kf = c:term("cache_per_batch"), kc = c:rate("cache_per_id"), ku = c:term("cache_per_row"),
    kr = c:rate("cache_row_fixed"),
    Gmv = c:rate("cache_move"),
    overlap = c:rate("pipeline_overlap"), hint_row = c:term("hints_per_row"),
  }
  if ctx.world > 1 then
    ctx.r.a2a, ctx.r.ar, ctx.r.rs = c:rate("alltoall"), c:rate("allreduce"), c:rate("reduce_scatter")
  end
  return ctx
end

-- A table as the planner sees it: name, rows, dim, dtype, optimizer, profile (uvmrec.planner.
-- profile), hot (ids per sample; the profile's by default).
function M.table(t)
  if type(t.name) ~= "string" then error("cost.table: name is required", 2) end
  if type(t.rows) ~= "number" or t.rows < 1 or t.rows ~= math.floor(t.rows) or t.rows == math.huge then
    error(("cost.table %s: rows %s; expected a whole number >= 1"):format(t.name, tostring(t.rows)), 2)
  end
  -- the embedding collection's rule (a dim of 6 was planned for a table no collection builds)
  if type(t.dim) ~= "number" or not (t.dim >= 4 and t.dim <= 1024 and t.dim % 4 == 0) then
    error(("cost.table %s: dim %s; expected a multiple of 4 from 4 to 1024"):format(t.name, tostring(t.dim)), 2)
  end
  if not t.profile then error(("cost.table %s: no access profile"):format(t.name), 2) end
  -- another table's profile priced this one by its rows (10 of a table of 10,000: 10 distinct
  -- rows a batch at most), and a plain table raised from the options' pricing
  local P = t.profile
  if type(P) ~= "table" or getmetatable(P) ~= require("uvmrec.planner.profile").Profile then
    error(("cost.table %s: its access profile is a %s; expected a uvmrec.planner.profile"):format(t.name, type(P)), 2)
  end
  if P.rows ~= t.rows then
    error(("cost.table %s: its access profile holds %d rows and the table %d; expected a profile of the table's rows")
      :format(t.name, P.rows, t.rows), 2)
  end
  local dtype = t.dtype or "f32"
  if not ELEM[dtype] then error(("cost.table %s: dtype %s is not f32, f16 or bf16"):format(t.name, dtype), 2) end
  -- here, where the planner catches it (the options' pricing raised it from cost.lua)
  M.state_bytes(t.optimizer, t.dim)
  -- the ids a sample (0 for a table a pass never saw read); -1 priced negative lookups, and the
  -- search raised "table a has no option"
  local hot = t.hot or P.hot or 1
  if type(hot) ~= "number" or not (hot >= 0 and hot < math.huge) then
    error(("cost.table %s: hot %s; expected the ids a sample has, a number >= 0"):format(t.name,
      require("uvmrec.lib").shown(hot)), 2)
  end
  return { name = t.name, rows = t.rows, dim = t.dim, dtype = dtype, optimizer = t.optimizer or "sgd",
           profile = t.profile, hot = hot, fixed = t.fixed, _memo = {} }
end

-- The shards of a sharding: count, rows each, dim each, lookups of the population the shard
-- draws from (L_pop), share of that population's rows it holds (frac), output rows (bags).
-- Values, not a table: every option of every table asks (70 a table on 8 ranks).
local function geometry(t, ctx, sharding, k)
  local W, B, h = ctx.world, ctx.batch, t.hot
  if sharding == "table_wise" then
    return 1, t.rows, t.dim, W * B * h, 1, W * B
  elseif sharding == "row_wise" then
    return W, ceil(t.rows / W), t.dim, W * B * h, 1 / W, W * B
  elseif sharding == "column_wise" then
    return k, t.rows, t.dim / k, W * B * h, 1, W * B
  elseif sharding == "data_parallel" then
    return W, t.rows, t.dim, B * h, 1, B
  end
  error("cost: sharding '" .. tostring(sharding) .. "' is not " .. table.concat(M.SHARDINGS, ", "), 3)
end

local function pages(bytes, page) return ceil(bytes / page) * page end

-- Slots a table's own cache gets for load factor c (uvmrec.cache's rule for per-table sets:
-- small tables twice their rows), in whole sets.
function M.cache_slots(rows, c, ctx)
  local want = max(1, ceil(c * rows))
  if 2 * rows <= ctx.min_slots and 2 * rows > want then want = 2 * rows end
  return ceil(want / M.CACHE.ways) * M.CACHE.ways
end

-- Memo per table: kind -> key1 -> key2 -> value (distinct rows, cold distinct rows, hit rates).
local function memo_get(t, kind, k1, k2)
  local a = t._memo[kind]
  local b = a and a[k1]
  return b and b[k2]
end
local function memo_set(t, kind, k1, k2, v)
  local a = t._memo[kind]
  if not a then a = {} t._memo[kind] = a end
  local b = a[k1]
  if not b then b = {} a[k1] = b end
  b[k2] = v
  return v
end

-- The parts of an option's device bytes (M.option's mem.device), in the order a rank's are
-- summed (planner.build, after them the rank's dense part, pipeline and reserve).
M.DEVICE_PARTS = { "weights", "optimizer", "cache_slots", "cache_meta", "cache_scratch", "outputs" }

-- The choice `opt` {sharding, shards (column_wise), placement, prefix (managed: rows of each
-- shard, or prefix_fraction), load_factor (cached)} for table t.  Returns
-- { shards = { {time, compute, comm, hbm, mem = {device = {...}, managed_on_gpu, pinned, managed}} }
--   (one shard: the shards_count shards are alike), sharding, placement, shards_count, time
--   (sum over shards), hbm, host, distinct and lookups (a shard's, a batch), and managed: prefix,
--   prefix_fraction, coverage, hints_seconds; cached: load_factor, slots, hit_rate, misses, policy,
--   row_bytes, width (its shard's dim and dtype: "dim 32, f16"), cache_seconds }.
function M.option(t, ctx, opt)
  local r = ctx.r
  local sharding, place = opt.sharding or "table_wise", opt.placement
  local count, Rs, sdim, L_pop, frac, bags = geometry(t, ctx, sharding, opt.shards or ctx.world)
  if sharding == "column_wise" and (t.dim % count ~= 0 or (t.dim / count) % 4 ~= 0) then
    -- a run cuts such a dim into shards of two widths (uvmrec.dist.plan: the first ones a group
    -- of 4 wider); this model prices every shard alike
    local units = t.dim / 4
    if count > units then
      return nil, ("column_wise over %d shards needs dim %d to split into multiples of 4"):format(count, t.dim)
    end
    local n_wide, narrow = units % count, 4 * math.floor(units / count)
    return nil, ("a run cuts dim %d into %d shards, %d of %d columns and %d of %d (uvmrec.dist.plan), and the "
      .. "planner prices equal shards only"):format(t.dim, count, n_wide, narrow + 4, count - n_wide, narrow)
  end
  if sharding == "data_parallel" and place ~= "device" then
    return nil, "data_parallel tables are device tables (every rank holds the whole table)"
  end
  local P = t.profile
  local es = ELEM[t.dtype]
  local rbs, sbs = sdim * es, M.state_bytes(t.optimizer, sdim)
  local U_pop = memo_get(t, "U", L_pop, 0) or memo_set(t, "U", L_pop, 0, P:distinct(L_pop))
  local Ls, Us = frac * L_pop, frac * U_pop
  local out = bags * sdim * ctx.output_bytes
  -- the keys every option has, named in its constructor (shards, time, hbm and host are set at
  -- the end): LuaJIT sizes it for 16 keys at once, room for a cached option's 7 more (grown key by
  -- key it was rehashed twice; 70 options a table on 8 ranks)
  local o = { sharding = sharding, placement = place, shards_count = count, distinct = Us, lookups = Ls,
              shards = nil, time = nil, hbm = nil, host = nil }
  local mem = { device = { weights = 0, optimizer = 0, cache_slots = 0, cache_meta = 0, cache_scratch = 0,
                           outputs = 2 * out }, managed_on_gpu = 0, pinned = 0, managed = 0 }
  -- rows read from HBM (U_hbm) and in place over the link (U_link at rates Glink, Glink_u)
  local U_hbm, U_link, Glink, Glink_u = Us, 0, r.G, r.Gu
  local cache_time = 0
  if place == "device" then
    mem.device.weights, mem.device.optimizer = Rs * rbs, Rs * sbs
  elseif place == "managed" then
    local h = opt.prefix or ceil((opt.prefix_fraction or 0) * Rs)
    h = min(max(h, 0), Rs)
    local h_pop = h / frac
    o.prefix, o.prefix_fraction = h, h / Rs
    o.coverage = P:top(h_pop)
    local cold = memo_get(t, "C", L_pop, h_pop)
                 or memo_set(t, "C", L_pop, h_pop, P:distinct_beyond(h_pop, L_pop))
    U_link, Glink, Glink_u = frac * cold, r.Gm, r.Gmu
    U_hbm = Us - U_link
    mem.managed_on_gpu = (h > 0 and pages(h * rbs, ctx.page_bytes) or 0)
                         + (h > 0 and sbs > 0 and pages(h * sbs, ctx.page_bytes) or 0)
    mem.managed = Rs * (rbs + sbs)
    -- the hint policy's interval over the shard's rows, once every hints_every steps
    o.hints_seconds = Rs * r.hint_row / ctx.hints_every
  elseif place == "cached" then
    local c = opt.load_factor
    if type(c) ~= "number" or c <= 0 or c > 1 then
      return nil, ("load_factor %s; expected a number in (0, 1]"):format(tostring(c))
    end
    local S = M.cache_slots(Rs, c, ctx)
    -- the staging rows are the cache's, one set whatever its tables: on one rank the plan holds
    -- them once where a table may be cached (M.cache_staging, planner.setup); over ranks each
    -- cached table holds room for them in the search, and the plan counts them once a cache
    -- (planner.build, from o.staging)
    local staging = ctx.world > 1 and M.cache_staging(ctx, rbs + sbs) or { cache_slots = 0, cache_meta = 0 }
    if ctx.world > 1 then o.staging = staging end
    local policy = opt.policy or ctx.policy
    local hr = memo_get(t, policy, L_pop, S / frac)
    if not hr then
      hr = memo_set(t, policy, L_pop, S / frac, policy == "lru" and hitrate.lru(P, L_pop, S / frac)
                    or hitrate.lfu(P, L_pop, S / frac))
    end
    local misses = frac * hr.misses
    o.load_factor, o.slots, o.hit_rate, o.misses, o.policy = c, S, hr.hit_rate, misses, policy
    o.row_bytes = rbs + sbs
    -- the cache's rows: a rank's cached shards of a kind share one cache of one dim and dtype
    -- (ur_cache_new; planner.search keeps to it)
    o.width = ("dim %d, %s"):format(sdim, t.dtype)
    mem.device.cache_slots = S * (rbs + sbs) + staging.cache_slots
    mem.device.cache_meta = S * (M.CACHE.slot_meta + M.CACHE.slot_row_id) + staging.cache_meta
                            + (policy == "lfu" and M.CACHE.lfu_per_row * Rs or 0)
    -- the move lists of the batches in flight; the scratch over the batch's values is the
    -- rank's (below: a share of it every shard has)
    mem.device.cache_scratch = M.CACHE.ring * 8 * (1.5 * (4 * misses + Us) + 1024)
    mem.pinned = Rs * (rbs + sbs)
    -- the lookup sorts every id; the decisions and placement go per distinct row (a Zipf
    -- table's batch has far fewer than ids: its profile's); each miss moves its row in and,
    -- dirty, back.  The cache's cost per batch is the rank's, once (M.cache_batch_seconds).
    cache_time = Ls * r.kc + Us * r.ku + 2 * misses * (r.kr + (rbs + sbs) / r.Gmv)
    o.cache_seconds = cache_time
    if ctx.pipeline then cache_time = cache_time * (1 - r.overlap) end
  elseif place == "host" then
    U_link, U_hbm, Glink, Glink_u = Us, 0, r.Gz, r.Gzu
    mem.pinned = Rs * (rbs + sbs)
  else
    return nil, ("placement '%s' is not %s"):format(tostring(place), table.concat(M.PLACEMENTS, ", "))
  end
  -- Over ranks a rank's shards of a kind (table- and column-wise, row-wise) are one collection,
  -- which hands its cache every shard's values, cached or not (uvmrec.dist.sharded's prepare;
  -- engine/src/embedding/cache.c's prepare_batch sizes the scratch over them).  A cached shard
  -- holds the scratch over its own values (o.room, in its cache_scratch); a shard of another
  -- placement has its share (o.share); both whole bytes rounded up, so that their sums are exact
  -- and hold at least the scratch planner.build sums over the rank's values (o.room unrounded
  -- left the search ulps short of it, and planner.plan's check of its budget could fail), which
  -- the search holds on a rank only once that rank's collection caches a shard (planner.search);
  -- planner.build counts the rank's cache over all its collection's values (o.lookups of every
  -- shard of the kind), once.
  if ctx.world > 1 and sharding ~= "data_parallel" then
    if place == "cached" then
      o.room = ceil(M.cache_batch_scratch(Ls, ctx))
      mem.device.cache_scratch = mem.device.cache_scratch + o.room
    else
      o.share = ceil(M.cache_batch_scratch(Ls, ctx))
    end
  end
  -- forward: distinct rows at the gather rate (or over the link), repeats on chip, outputs
  -- written; backward: per id, each distinct row stepped with its state, the outputs' gradient
  local fwd = U_hbm * rbs / r.G + U_link * rbs / Glink + max(0, Ls - Us) * rbs / r.Gr + out / r.Gc
  local bwd = Ls * r.kb + U_hbm * (rbs + sbs) / r.Gu + U_link * (rbs + sbs) / Glink_u + out / r.Gc
  local compute = fwd + bwd + cache_time + (o.hints_seconds or 0)
  if sharding == "data_parallel" and ctx.world > 1 then
    -- the all-reduced gradient steps every row
    compute = compute + 2 * Rs * (rbs + sbs) / r.Gc
  end
  -- communication each shard's rank takes part in (bytes over its links / the collective's rate)
  local comm = 0
  local W, B, hh = ctx.world, ctx.batch, t.hot
  if W > 1 then
    local ob = ctx.output_bytes
    if sharding == "table_wise" or sharding == "column_wise" then
      comm = ((W - 1) * B * hh * 8 + (W - 1) * B * 4) / r.a2a + 2 * (W - 1) * B * sdim * ob / r.a2a
      if sharding == "column_wise" and count > 1 and t.optimizer == "rowwise_adagrad" then
        -- the whole row's sums of squares: one more pass over the ids, an all-reduce of rows x 4 bytes
        compute = compute + Ls * r.kb
        comm = comm + 2 * (W - 1) / W * Rs * 4 / r.ar
      end
    elseif sharding == "row_wise" then
      comm = ((W - 1) * B * hh * 8 / W + (W - 1) * B * 4) / r.a2a + 2 * (W - 1) * B * sdim * ob / r.rs
    elseif sharding == "data_parallel" then
      comm = 2 * (W - 1) / W * Rs * sdim * 4 / r.ar
    end
  end
  local d = mem.device
  local hbm = mem.managed_on_gpu + d.weights + d.optimizer + d.cache_slots + d.cache_meta + d.cache_scratch
              + d.outputs
  local shard = { compute = compute, comm = comm, time = compute + comm, hbm = hbm, mem = mem,
                  host = mem.pinned + mem.managed }
  -- one entry, not one a shard: a list of W copies made every option of a table O(W) (the
  -- fewest-GPUs search of an infeasible plan prices worlds of up to 65536 ranks)
  o.shards = { shard }
  o.time, o.hbm, o.host = count * shard.time, count * hbm, count * shard.host
  return o
end

-- The setting a placement draws from ctx.fractions: the HBM prefix of a managed table, the
-- cache of a cached one.
local FRACTION_OF = { managed = "prefix_fraction", cached = "load_factor" }

-- The choices the search considers for table t: every sharding the world allows, every
-- placement, the prefix fractions and load factors of ctx.fractions.  A table's fixed settings
-- (t.fixed: placement, sharding, load_factor, prefix_fraction, rank) narrow the list: a rank
-- places a table_wise table (the search keeps it there).  Returns the list and, for each
-- sharding the world and the fixed settings allow that has no choice, or that is fixed where
-- the world allows table_wise alone, why not ({[sharding] = reason}, or nil): a column_wise
-- table whose dim a run cuts unevenly was dropped unsaid.
function M.options(t, ctx)
  local W = ctx.world
  local fx = t.fixed or {}
  local shardings = (W > 1 and not fx.rank) and { "table_wise", "row_wise", "column_wise", "data_parallel" }
                    or { "table_wise" }
  local out, why = {}, {}
  local reason
  local function add(o, err)
    if o then out[#out + 1] = o else reason = reason or err end
  end
  for _, sh in ipairs(shardings) do
    if not fx.sharding or fx.sharding == sh then
      local before = #out
      reason = nil
      -- column shards as a run cuts them (uvmrec.dist.plan): min(W, dim / 4) of them, whose
      -- widths this model takes equal (M.option refuses another split); the ranks are the run's
      -- too (search.partition).  The choices of 2, 4, ... shards made plans no run took: 'train
      -- --plan' refused them.
      local ks = { 1 }
      if sh == "column_wise" then ks = { min(W, t.dim / 4) } end
      for _, k in ipairs(ks) do
        for _, place in ipairs(M.PLACEMENTS) do
          -- column-wise shards are for wide tables that must spread: in HBM, or cached
          local allowed = sh ~= "column_wise" or place == "device" or place == "cached"
          if not allowed and fx.placement == place then
            reason = ("column_wise shards are priced in HBM (device or cached), and the placement is fixed to %s")
              :format(place)
          end
          if allowed and (not fx.placement or fx.placement == place) then
            local shards = sh == "column_wise" and k or nil
            local knob = FRACTION_OF[place]
            if knob then
              for _, f in ipairs(fx[knob] and { fx[knob] } or ctx.fractions) do
                add(M.option(t, ctx, { sharding = sh, shards = shards, placement = place, [knob] = f }))
              end
            else
              add(M.option(t, ctx, { sharding = sh, shards = shards, placement = place }))
            end
          end
        end
      end
      if #out == before and reason then why[sh] = reason end
    end
  end
  -- a sharding fixed on one rank had no choice and no reason ('plan:with(T, {sharding =
  -- "column_wise"})' on 1 rank: "no choice satisfies its fixed settings" alone); a fixed rank
  -- beside another sharding is refused before (planner.fixed_error)
  if fx.sharding and fx.sharding ~= "table_wise" and W == 1 then
    why[fx.sharding] = ("the plan is for 1 rank, where every table is table_wise (%s spreads a table over ranks)")
      :format(fx.sharding)
  end
  return out, next(why) and why or nil
end

-- ---- the dense part ----

-- The tensors a training step takes from the model's arena (nn.arena, through Module:buffer), in
-- the order the modules ask for them, as {cols, elem}, each [batch, cols] of elem bytes (rows 1
-- where given): models/dlrm.lua's forward and backward through nn.MLP's Linears (an output each;
-- backward, the input's gradient past the bottom's first layer and the ReLU's work where no
-- layer above folds it in), the dot Interaction (output padded to 8
-- columns; the dense and pooled gradients) or the concatenation and nn.CrossNet, and
-- BCEWithLogits.  The pooled outputs are the collection's own (cost.option's outputs), not here.
-- Also the tensors an evaluation's forward takes (models/dlrm.lua's predict: the same forward,
-- no loss and no backward; then the logits cast to f32 under bf16 and the
-- probabilities, keys of their own, marked new).
-- spec/planner/cost_spec.lua checks the lists against the arena of a model trained on the CPU.
local function arena_buffers(d, bottom_out, width, top_in, T)
  local dt = d.precision == "bf16" and 2 or 4
  local fwd = {}
  local function add(list, cols, elem, rows) list[#list + 1] = { cols = cols, elem = elem or dt, rows = rows } end
  -- a Sequential of Linears with fused ReLUs (nn.MLP); its backward's buffers go to `back` in
  -- the order they are taken there (last layer first)
  local function mlp(sizes, last_relu, input_grad, in_width, back)
    local n = #sizes - 1
    local layer = {}
    for i = 1, n do
      local relu = i < n or last_relu
      layer[i] = { relu = relu, folded = relu and i < n, cols = sizes[i + 1],
                   in_width = i == 1 and in_width or sizes[i], gx = i > 1 or input_grad }
      add(fwd, layer[i].cols)
    end
    for i = n, 1, -1 do
      local l = layer[i]
      if l.gx then add(back, l.in_width) end
      -- the layer above folds the ReLU into the gradient it passes down (X_RELU)
      if l.relu and not l.folded then add(back, l.cols) end
    end
  end
  -- bf16: the f32 batch is cast into the bottom's first layer's input
  if dt == 2 then add(fwd, d.dense_features or 13) end
  local bottom_back, top_back = {}, {}
  mlp({ d.dense_features or 13, unpack(d.bottom) }, true, false, d.dense_features or 13, bottom_back)
  local dim = d.dim
  local inter_back = {}
  if (d.interaction or "dot") == "dot" then
    add(fwd, top_in)
    add(inter_back, bottom_out)
    add(inter_back, T * dim)
  else
    add(fwd, width) -- the concatenation, then the cross layers' z, t (low rank) and x
    local r, L = (d.cross_rank or 0) > 0 and d.cross_rank or nil, d.cross_layers or 3
    for _ = 1, L do
      add(fwd, width)
      if r then add(fwd, r) end
      add(fwd, width)
    end
    add(inter_back, width) -- gx0, gz, the ping-pong gradients of x_l and low rank's gt
    add(inter_back, width)
    for l = L, 2, -1 do
      if l >= L - 1 then add(inter_back, width) end
      if r and l == L then add(inter_back, r) end
    end
    if r and L == 1 then add(inter_back, r) end
    add(inter_back, width - T * dim) -- the concatenation's gradient, split
    add(inter_back, T * dim)
  end
  mlp({ width, unpack(d.top) }, false, true, top_in, top_back)
  local eval = {}
  for i, b in ipairs(fwd) do eval[i] = b end
  if dt == 2 then eval[#eval + 1] = { cols = 1, elem = 4, new = true } end -- logits_f32
  eval[#eval + 1] = { cols = 1, elem = 4, new = true }                    -- probs
  add(fwd, 1, 4, 1) -- the loss
  add(fwd, 1)       -- its gradient
  for _, part in ipairs { top_back, inter_back, bottom_back } do
    for _, b in ipairs(part) do fwd[#fwd + 1] = b end
  end
  return fwd, eval
end

-- The arena's bytes for `buffers` (arena_buffers) at `batch` rows in blocks of `block` bytes
-- (engine/src/dense/arena.c): each tensor 256-byte aligned; a tensor that does not fit in the
-- rest of the block starts a new one, of `block` bytes or its own size if larger, and the old
-- block's tail is left unused.  Returns used, reserved, blocks, and the arena's state, which
-- `from` continues: then `buffers` are taken again at `batch` after the batch `from.batch`
-- (Module:buffer: a key is taken anew only when its rows grow, or it is new; the tensors it
-- held before stay in their block, which the step's other tensors keep alive).
function M.arena(buffers, batch, block, from)
  local s = from or { used = 0, reserved = 0, blocks = 0, left = 0 }
  local prior = from and from.batch
  for _, b in ipairs(buffers) do
    local rows = b.rows or batch
    local had = prior and not b.new and (b.rows or prior)
    if not had or rows > had then
      local need = max(256, ceil(rows * b.cols * b.elem / 256) * 256)
      if need > s.left then
        local size = max(need, block)
        s.reserved, s.blocks, s.left = s.reserved + size, s.blocks + 1, size
      end
      s.left = s.left - need
      s.used = s.used + need
    end
  end
  local out = { used = s.used, reserved = s.reserved, blocks = s.blocks, left = s.left,
                batch = prior and max(prior, batch) or batch }
  return out.used, out.reserved, out.blocks, out
end

-- The dense ops' workspaces on a GPU (kernels/dense.cu, kernels/linear.cu): every stream that
-- runs a matrix product keeps one, of cuBLASLt's (and cuBLAS's) bytes and after them the largest
-- part a linear backward on that stream asks, kept until the stream is freed and counted in
-- ur.memory's workspace and against the HBM budget.  sms: the multiprocessors the backward's
-- partial sums are sized by (an H200's unless the context says).
M.WORKSPACE = { sms = 132 }

-- The Linears of an nn.MLP of `sizes` (a fused ReLU after each but the last, and after the last
-- with last_relu; input_grad: the first takes its input's gradient; in_width: its input's
-- columns, padding included) as their backward calls see them, in the order they are made:
-- {inw, out, bias, relu (the ReLU's gradient taken in the call: a fused ReLU no layer above
-- folds in), masked (GY_MASKED: the layer above did), gx, x_relu (X_RELU: the layer below's ReLU
-- folded into gx), async (WGRAD_ASYNC: models/dlrm.lua sets it on the MLPs' Linears)},
-- appended to calls.
function M.mlp_linears(sizes, last_relu, input_grad, in_width, calls)
  calls = calls or {}
  local n = #sizes - 1
  for i = 1, n do
    local relu = i < n or last_relu
    calls[#calls + 1] = { inw = i == 1 and (in_width or sizes[1]) or sizes[i], out = sizes[i + 1], bias = true,
                          relu = relu and i == n, masked = relu and i < n, gx = i > 1 or input_grad,
                          x_relu = i > 1, async = true }
  end
  return calls
end

-- A DLRM's Linears (M.mlp_linears): the bottom MLP's, nn.CrossNet's (their own calls: no ReLU,
-- the bias gradient in the weight gradient's product, on the model's stream) and the top's.
local function linear_calls(d, width, top_width)
  local f = d.dense_features or 13
  local calls = M.mlp_linears({ f, unpack(d.bottom) }, true, false, f)
  if (d.interaction or "dot") ~= "dot" then
    local r = (d.cross_rank or 0) > 0 and d.cross_rank or nil
    for _ = 1, d.cross_layers or 3 do
      if r then
        calls[#calls + 1] = { inw = r, out = width, bias = true, gx = true }
        calls[#calls + 1] = { inw = width, out = r, bias = false, gx = true }
      else
        calls[#calls + 1] = { inw = width, out = width, bias = true, gx = true }
      end
    end
  end
  return M.mlp_linears({ width, unpack(d.top) }, false, true, top_width, calls)
end

-- The dense ops' workspaces of a training step at `rows` rows a rank: the model's stream's, and
-- the weight gradients' side stream's (async: one rank; uvmrec.dist.ddp keeps them on the
-- model's stream), each the most a backward on it needs (the engine's rule:
-- ur_linear_backward_workspace, which leaves out the parts of cuBLAS's fallback, used only
-- where cuBLASLt has no algorithm for a shape; X_RELU's mask pass is counted).  dm:
-- cost.dense_model's, or any {linears = M.mlp_linears(...)}.  Returns total, main, side.
function M.dense_workspaces(dm, rows, sms, async)
  local dense = require "uvmrec.dense"
  local main, side = 0, 0
  for _, c in ipairs(dm.linears) do
    local flags = (c.masked and dense.GY_MASKED or 0) + (c.async and async and dense.WGRAD_ASYNC or 0)
      + (c.x_relu and dense.X_RELU or 0)
    local m, s = dense.linear_backward_workspace(rows, c.inw, c.out,
      { gx = c.gx, gw = true, gb = c.bias and not c.masked }, c.relu and "relu" or "none", flags, sms)
    main, side = max(main, m), max(side, s)
  end
  return main + side, main, side
end

local DENSE_KEYS = { "bottom", "cross_layers", "cross_rank", "dense_features", "dim", "eval_batch", "interaction",
                     "momentum", "optimizer", "precision", "self_interaction", "tables", "top" }

-- What is wrong with a dense description (nil when nothing): the arithmetic below reads every
-- field as its kind, and raised from inside it ("attempt to get length of field 'top'").
local function dense_error(d)
  local lib = require "uvmrec.lib"
  local shown = lib.shown
  if type(d) ~= "table" then
    return ("the description is a %s; expected a table {dense_features, bottom, top, tables, dim, ...}"):format(type(d))
  end
  -- a misspelt key first: its field's default, or a missing field, was the next thing said
  local ok, kerr = pcall(lib.known_keys, d, DENSE_KEYS, "cost.dense_model", 1, "key")
  if not ok then return (tostring(kerr):gsub("^[^\n]-cost%.dense_model: ", "", 1)) end
  local function whole(k, lo, what)
    local v = d[k]
    if v ~= nil and not lib.whole_in(v, lo, 2 ^ 53) then
      return ("%s is %s; expected %sa whole number >= %d"):format(k, shown(v), what or "", lo)
    end
  end
  for _, k in ipairs { "bottom", "top" } do
    if type(d[k]) ~= "table" then return ("%s is %s; expected a list of layer widths"):format(k, shown(d[k])) end
    for i, o in ipairs(d[k]) do
      if not lib.whole_in(o, 1, 2 ^ 53) then
        return ("%s[%d] is %s; expected a layer's width, a whole number >= 1"):format(k, i, shown(o))
      end
    end
  end
  if d.tables == nil then return "tables is nil; expected the embedding tables' count, a whole number >= 1" end
  if d.dim == nil then return "dim is nil; expected the embedding dimension, a whole number >= 1" end
  local err = whole("tables", 1, "the embedding tables' count, ") or whole("dim", 1, "the embedding dimension, ")
    or whole("dense_features", 1) or whole("cross_layers", 0) or whole("cross_rank", 0) or whole("eval_batch", 0)
  if err then return err end
  if d.interaction ~= nil and d.interaction ~= "dot" and d.interaction ~= "dcnv2" then
    return ("interaction is %s; expected dot or dcnv2"):format(shown(d.interaction))
  end
  if d.precision ~= nil and d.precision ~= "f32" and d.precision ~= "tf32" and d.precision ~= "bf16" then
    return ("precision is %s; expected f32, tf32 or bf16"):format(shown(d.precision))
  end
  optim = optim or require "uvmrec.optim"
  local rule = d.optimizer ~= nil and optim.RULES[d.optimizer]
  if d.optimizer ~= nil and not (rule and rule.dense) then
    return ("optimizer is %s; expected %s"):format(shown(d.optimizer), table.concat(optim.names("dense"), ", "))
  end
  local m = d.momentum
  if m ~= nil and not (type(m) == "number" and m >= 0 and m < math.huge) then
    return ("momentum is %s; expected a number >= 0"):format(shown(m))
  end
  if d.self_interaction ~= nil and type(d.self_interaction) ~= "boolean" then
    return ("self_interaction is %s; expected a boolean"):format(shown(d.self_interaction))
  end
end

-- A DLRM's dense side from its shape: dense_features, bottom (widths), top (widths),
-- interaction ("dot" | "dcnv2"), tables (count), dim, self_interaction, cross_layers,
-- cross_rank, precision ("f32" | "tf32" | "bf16"), optimizer ("sgd" ...; its state per
-- parameter: sgd 0 (momentum 1), adagrad 1, adam/adamw 2), eval_batch (the rows of a rank's
-- evaluation batches; 0 or nil: the run does not evaluate).  A description it cannot read is
-- refused (raised at the caller, as cost.table and cost.context do: planner.plan's setup turns
-- their errors into nil, message), naming the field and the value.
function M.dense_model(d)
  local derr = dense_error(d)
  if derr then error("cost.dense_model: " .. derr, 2) end
  local macs, params, widths, layers = 0, 0, 0, 0
  local function layer(i, o, no_bias)
    macs, params, widths, layers = macs + i * o, params + i * o + (no_bias and 0 or o), widths + o, layers + 1
  end
  local w = d.dense_features or 13
  -- the bottom's first layer is fed data: no input gradient, 4 of its 6 products (models/dlrm.lua)
  local skipped = #d.bottom > 0 and w * d.bottom[1] / 3 or 0
  for _, o in ipairs(d.bottom) do
    layer(w, o)
    w = o
  end
  local bottom_out = w
  local F = d.tables + 1
  local inter_flops, width
  -- the top's first layer reads the dot interaction padded to 8 columns (zero weights held too)
  local top_width
  if (d.interaction or "dot") == "dot" then
    local pairs_ = d.self_interaction and F * (F + 1) / 2 or F * (F - 1) / 2
    width = w + pairs_
    inter_flops = 6 * pairs_ * d.dim
    top_width = require("uvmrec.dense").interaction_width(d.tables, w, d.self_interaction, true)
  else
    width = w + d.tables * d.dim
    inter_flops = 0
    for _ = 1, d.cross_layers or 3 do
      if (d.cross_rank or 0) > 0 then
        layer(width, d.cross_rank, true) -- V_l has no bias (nn.CrossNet)
        layer(d.cross_rank, width)
      else
        layer(width, width)
      end
    end
  end
  local top_in = width
  for _, o in ipairs(d.top) do
    layer(top_in, o)
    top_in = o
  end
  local buffers, eval_buffers = arena_buffers(d, bottom_out, width, top_width or width, d.tables)
  -- uvmrec.optim's state of a row of one element, and SGD's momentum buffer
  local rule = require("uvmrec.optim").RULES[d.optimizer or "sgd"]
  local nstate = (rule and rule.state(1) or 0) + ((d.optimizer or "sgd") == "sgd" and (d.momentum or 0) > 0 and 1 or 0)
  return { macs = macs, product_macs = macs - skipped, params = params, layers = layers, outputs = widths,
           -- the tensors' elements: the padded columns' weights are held too
           param_elems = params + (top_width and #d.top > 0 and (top_width - width) * d.top[1] or 0),
           inter_flops = inter_flops,
           interaction = d.interaction or "dot",
           buffers = buffers, eval_buffers = eval_buffers, eval_batch = d.eval_batch or 0,
           linears = linear_calls(d, width, top_width or width),
           precision = d.precision or "f32", nstate = nstate,
           description = d }
end

-- Seconds and HBM of the dense part on one rank of ctx (batch per rank); `fixed` is the step's
-- fixed cost, which M.step combines with the work.  Its HBM: the parameters, their gradients,
-- optimizer state and bf16 copies, and the arena's blocks (ctx.arena_block bytes each: on a GPU
-- one block of 64 MiB holds the activations of batches up to a few thousand, most of it unused)
-- at their peak: after the first training step and then the first evaluation (dm.eval_batch),
-- whose forward adds its tensors when its batch is larger (the arena frees nothing; after it
-- the steps take views of them), and after which nothing more is taken; and on a GPU
-- (ctx.workspaces) the dense ops' workspaces (M.dense_workspaces), which an evaluation's
-- forward does not grow.
function M.dense(dm, ctx)
  local c, B = ctx.calib, ctx.batch
  local p = dm.precision
  -- the products by FLOPs; bias, activation and their gradients by the layers' output values;
  -- and a cost per layer
  local t_mlp = 6 * B * dm.product_macs / c:rate("mlp_" .. p) + B * dm.outputs * c:term("mlp_act_" .. p)
                + dm.layers * c:term("mlp_layer_" .. p)
  local t_int = dm.inter_flops > 0 and B * dm.inter_flops / c:rate("interaction_dot") or 0
  local t_opt = dm.params * 4 * (3 + 2 * dm.nstate) / c:rate("hbm_copy")
  local t_fixed = c:term("step_overhead")
  local comm = 0
  if ctx.world > 1 then comm = 2 * (ctx.world - 1) / ctx.world * dm.params * 4 / c:rate("allreduce") end
  local pe = dm.param_elems
  local used, reserved, blocks, st = M.arena(dm.buffers, B, ctx.arena_block)
  local step_reserved = reserved
  if dm.eval_batch > 0 then used, reserved, blocks = M.arena(dm.eval_buffers, dm.eval_batch, ctx.arena_block, st) end
  local mem = { params = pe * 4 * (2 + dm.nstate) + (dm.precision == "bf16" and pe * 2 or 0),
                activations = reserved, activations_used = used, arena_blocks = blocks,
                arena_block = ctx.arena_block, eval_batch = dm.eval_batch,
                eval_activations = reserved - step_reserved, workspaces = 0, workspace_streams = 0 }
  if ctx.workspaces then
    local _, main, side = M.dense_workspaces(dm, B, ctx.sms, ctx.world == 1)
    mem.workspaces, mem.workspace_streams = main + side, side > 0 and 2 or 1
  end
  return { time = t_mlp + t_int + t_opt + comm, mlp = t_mlp, interaction = t_int, optimizer = t_opt,
           fixed = t_fixed, comm = comm, mem = mem, hbm = mem.params + mem.activations + mem.workspaces }
end

-- The synthetic loader's time for a batch of ctx.batch samples of `values` values each (ids,
-- dense features, label): on the CPU backend what it adds to a step, on a GPU its own; 0 where
-- the calibration lacks it.
function M.loader(ctx, values)
  return ctx.batch * values * ctx.calib:term("loader_per_value")
end

-- What a rank's cache costs a step besides its tables' ids, rows and moves (cache_time in
-- M.option): its batch's launches and the host's waits, once for all the rank's cached tables
-- (planner.build adds it to each rank that caches one; the pipeline hides its share).
function M.cache_batch_seconds(ctx)
  local r = ctx.r
  return r.kf * (ctx.pipeline and (1 - r.overlap) or 1)
end

-- A step from its work, its fixed cost and the loader's time: on a GPU the host's launches run
-- ahead of the device, so the step is the longer of the two, and the synthetic loader draws
-- each batch on the model's stream (uvmrec.data.generator), in turn with the work: its time
-- adds to the work's; the CPU backend does the work and the calls in turn, and the loader's
-- threads take the same cores.
function M.step(work, fixed, backend, loader)
  loader = loader or 0
  if backend == "cpu" then return work + fixed + loader end
  return max(work + loader, fixed)
end

-- HBM of a cache's staging rows (two halves of staging_rows, rows of row_bytes with their
-- state): their slot storage and their row ids, by device category.
function M.cache_staging(ctx, row_bytes)
  local M2 = 2 * ctx.staging_rows
  return { cache_slots = M2 * row_bytes, cache_meta = M2 * M.CACHE.slot_row_id }
end

-- HBM of a cache's per-batch scratch over `values` values a training batch: the decisions'
-- scratch and the slot-id buffers.  A collection hands its cache the whole batch, every table's
-- values (on one rank the batch's; over ranks its kind's shards' on the rank: M.option's room).
-- ctx (optional: the GPU's, no evaluation): the backend the scratch is carved for, and the
-- rows of a rank's evaluation batches, whose values (values * eval_batch / batch) grow the
-- scratch where they are more (one scratch, grown, the old one freed) and take two slot-id
-- buffers of their own (the training batches' stay in the cache's pool: uvmrec.cache's _buffer).
function M.cache_batch_scratch(values, ctx)
  local spv = M.CACHE.scratch_per_value[ctx and ctx.backend or "cuda"]
  local e = ctx and ctx.eval_batch > ctx.batch and ctx.eval_batch / ctx.batch or 0
  return values * (spv * max(1, e) + M.CACHE.ids_per_value * (1 + e))
end

-- The pipeline's buffers on one rank: the batch on the GPU (two in flight), `depth` pinned
-- batches on the host.  ids = ids per sample over all tables.
function M.pipeline(ctx, ids, tables, dense_features, depth)
  local B = ctx.batch
  local batch = B * ids * 8 + (tables * B + 1) * 8 + tables * B * 4 + B * (dense_features or 13) * 4 + B * 4
  return { device = 2 * batch, pinned = (depth or 4) * batch }
end

return M
