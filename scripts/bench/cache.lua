-- Software cache benchmark (BENCH.md B4, B6).
--
--   luajit scripts/bench/cache.lua [--rows N] [--tables T] [--batch B] [--batches K] [--zipf S]
--                                  [--out FILE.jsonl] [--plot FILE.png]
--   luajit scripts/bench/cache.lua --gpu [--steps N] [--out FILE.jsonl]
--
-- Default (the CPU, any machine): hit rate against cache size (1% .. 100% of the rows), LRU
-- and LFU, without and with prefetch, on Zipf ids, computed by the cache itself (its decisions
-- are made on the host, the same for the CPU and the GPU).  T tables of N rows (dim 4: only the
-- decisions matter), batches of B samples with one id per table, the ids of each table drawn
-- Zipf(S) and scattered over the rows; the first half of the K batches warms the cache, the
-- second half is measured.  "Prefetch" prepares batch i+1 on another stream while batch i is
-- in flight, as uvmrec.pipeline.Prefetch does: two batches' rows are locked instead of one.
-- It checks the counts (hits + misses + conflicts = distinct rows; the hit rate does not fall
-- as the cache grows) before it reports, prints a table, writes JSON lines and a PNG (through
-- scripts/bench/cache_plot.py, when python3 with matplotlib is there).
--
-- --gpu: dlrm_mlperf_v1_2m at batch 65536 on the GPU: all tables in HBM, against every table
-- `cached` with 20% of the rows in HBM (with the prefetch pipeline and without), and `managed`
-- with the hot_prefix hint policy at a 20% allowance (the plain loop, and the prefetch pipeline
-- prefetching each next batch's cold pages); samples/s of each, its ratio to all in HBM, and
-- the bytes each step moves over the host link against the 55 GB/s ceiling (managed through
-- the pipeline: the page runs it asked for, plus the batch; the plain managed loop's faults
-- and zero-copy reads are the driver's and not counted here).  The
-- first steps' losses of every mode must agree with all-in-HBM's (same weights and batches).
local ur = require "uvmrec"
local things = require("uvmrec.lib").things
local C = ur.C
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/cache.lua",
  summary = "software cache benchmark (BENCH.md B4, B6): hit rates on the CPU; --gpu: training through the cache",
  { "--rows N", "rows of each table (hit rates)", type = "whole", default = 1000000 },
  { "--tables T", "tables (hit rates)", type = "whole", default = 4 },
  { "--batch B", "samples a batch (hit rates)", type = "whole", default = 8192 },
  { "--batches K", "batches, the first half warming the cache (hit rates)", type = "whole", default = 200 },
  { "--zipf S", "the ids' Zipf exponent (hit rates)", type = "number", default = 1.05 },
  options.out,
  { "--plot FILE", "a PNG of the hit rates (with --out; scripts/bench/cache_plot.py)" },
  { "--gpu", "the training modes: all in HBM, cached, managed" },
  { "--steps N", "timed steps a mode (--gpu)", type = "whole", default = 40 },
  { "--config C", "another config than dlrm_mlperf_v1_2m (--gpu; without a GPU, a dry run on host tables)" },
  { "--modes M,...", "only these modes besides device (--gpu)", type = "list",
    choices = { "device", "cached+pipeline", "cached", "managed+hot_prefix", "managed+pages" } },
  options.set, -- every --gpu mode, after its own (e.g. embeddings.cache.mover_warps=256)
}
local o = cmd:parse(arg)

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local zipf_stream = dofile(here .. "/zipf_stream.lua")
local cache_run = dofile(here .. "/cache_run.lua")
local P = dofile(here .. "/parity_lib.lua")

local out_file = require("uvmrec.json").lines(o.out)
local function emit(rec)
  if not o.out then return end
  local finite = {} -- a rate of nothing (0 / 0) is left out of the line
  for k, v in pairs(rec) do
    if type(v) ~= "number" or (v == v and math.abs(v) ~= math.huge) then finite[k] = v end
  end
  out_file:write(finite)
end

-- ---- the CPU mode: hit rates ----

local function hit_rates()
  local T, N, B, K = o.tables, o.rows, o.batch, o.batches
  print(("cache bench: %s x %s, batches of %s (one id per table), Zipf(%.2f), %s (%d warm-up)")
    :format(things(T, "table"), things(N, "row"), things(B, "sample"), o.zipf, things(K, "batch", "batches"),
      math.floor(K / 2)))
  math.randomseed(7)
  -- the id stream, key-major per batch: table t's ids of batch k at [k][t * B ..]
  local inputs = zipf_stream(T, N, B, K, o.zipf)
  local fractions = { 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0 }
  local prefetch_stream = assert(ur.stream())
  local last = {}
  print(("%-5s %-8s %6s %9s %9s %9s %10s %12s %12s"):format("cache", "policy", "prefetch", "hit rate", "miss",
        "conflict", "evict/b", "MB in/batch", "ms/batch"))
  for _, frac in ipairs(fractions) do
    for _, policy in ipairs({ "lru", "lfu" }) do
      for _, prefetch in ipairs({ false, true }) do
        local c, s = cache_run.run { inputs = inputs, tables = T, rows = N, fraction = frac, policy = policy,
                                 decay = 16, warm = math.floor(K / 2),
                                 prefetch_stream = prefetch and prefetch_stream or nil,
                                 fail = function(msg) cmd:fail(msg) end }
        local cache = c.cache
        local key = policy .. tostring(prefetch)
        if last[key] and s.hits / s.unique < last[key] - 0.005 then
          cmd:fail(("check: %s hit rate %.4f at %g of the rows, below %.4f at a smaller cache"):format(key,
              s.hits / s.unique, frac, last[key]))
        end
        last[key] = s.hits / s.unique
        local nb = K - math.floor(K / 2)
        local r = { bench = "cache_hit_rate", cache_fraction = frac, policy = policy, prefetch = prefetch,
                    hit_rate = s.hits / s.unique, miss_rate = s.misses / s.unique,
                    conflict_rate = s.conflicts / s.unique, evictions_per_batch = s.evictions / nb,
                    bytes_in_per_batch = s.bytes_in / nb, bytes_out_per_batch = s.bytes_out / nb,
                    unique_per_batch = s.unique / nb, ms_per_batch = 1e3 * s.seconds / nb,
                    tables = T, rows = N, batch = B, zipf = o.zipf, slots = cache:slots() }
        emit(r)
        print(("%4.0f%% %-8s %6s %8.2f%% %8.2f%% %8.2f%% %10.0f %12.2f %12.2f"):format(100 * frac, policy,
          prefetch and "yes" or "no", 100 * r.hit_rate, 100 * r.miss_rate, 100 * r.conflict_rate,
          r.evictions_per_batch, r.bytes_in_per_batch / 1e6, r.ms_per_batch))
        c:free()
      end
    end
  end
  cache_run.free(inputs)
  if o.out and o.plot then
    out_file:close()
    cache_run.plot(o.out, o.plot)
  end
end

-- ---- the GPU mode: dlrm_mlperf_v1_2m, all in HBM against cached and managed ----

-- --config NAME runs the modes on another config; without a GPU (a dry run of this code on
-- a small config, e.g. dlrm_tiny) "device" means host tables.
local function gpu_modes()
  local gpu = ur.gpu()
  if not gpu and not o.config then cmd:fail("--gpu needs a GPU: " .. ur.cuda_error()) end
  local train = require "uvmrec.train"
  local Prefetch = require "uvmrec.pipeline.Prefetch"
  -- every step trains a batch of its own (a cycle of a few would let a 20% cache hold them
  -- all): WARM warm-up steps (the first CHECK compared across modes), then the timed ones
  local WARM, CHECK = 24, 4
  local steps = o.steps
  local NB = WARM + steps
  -- The timed steps run without the schedule: an MLPerf config trains at the benchmarks' lr
  -- (cli.bench_sets says why).
  local function load(sets)
    local config = o.config or "dlrm_mlperf_v1_2m"
    local all = {}
    for _, v in ipairs(require("uvmrec.cli").bench_sets(config)) do all[#all + 1] = v end
    for _, v in ipairs(sets) do all[#all + 1] = v end
    for _, v in ipairs(o.set) do all[#all + 1] = v end
    local cfg, def = P.config(config, all)
    if not cfg then cmd:fail(def) end
    return cfg, def
  end
  -- distinct batches in pinned host memory, the same for every mode
  local cfg0 = load({})
  local host = assert(train.source.hold_data(cfg0, NB, "pinned"))
  local B = cfg0.train.batch_size

  local modes = {
    { name = "device", sets = { "embeddings.placement=" .. (gpu and "device" or "host") } },
    { name = "cached+pipeline", sets = { "embeddings.placement=cached", "embeddings.cache.load_factor=0.2" },
      pipeline = true },
    { name = "cached", sets = { "embeddings.placement=cached", "embeddings.cache.load_factor=0.2" } },
    { name = "managed+hot_prefix", sets = { "embeddings.placement=managed", "embeddings.hints.policy=hot_prefix",
      "embeddings.hints.allowance=20%", "embeddings.hints.every=10" } },
    { name = "managed+pages", sets = { "embeddings.placement=managed", "embeddings.hints.policy=hot_prefix",
      "embeddings.hints.allowance=20%", "embeddings.hints.every=10" }, pipeline = true, pages = true },
  }

  local base, base_losses
  print(("cache bench --gpu: %s, batch %d, %d timed steps per mode"):format(cfg0.name, B, steps))
  print(("%-20s %14s %8s %12s %14s %10s %10s %9s %14s %13s %8s %8s"):format("mode", "samples/s", "vs HBM",
        "emb HBM", "host link/step", "GB/s", "hit rate", "ms/step", "cache host ms", "cache GPU ms", "conf/st",
        "waits/st"))
  local only = {}
  for _, name in ipairs(o.modes or {}) do only[name] = true end
  for _, m in ipairs(modes) do
    if o.modes and not only[m.name] and m.name ~= "device" then goto next_mode end
    local cfg, def = load(m.sets)
    local model = def.build(cfg, { cpu = not gpu })
    if not model then cmd:fail("could not build " .. m.name) end
    local opt = train.optimizer(cfg, model)
    local hints = train.hints(cfg, model)
    if hints then hints:start(0) end
    local cache = model.embeddings.tbe.cache
    local dev = {}
    if not m.pipeline then for k = 1, NB do dev[k] = host[k]:to(gpu and "device" or "host") end end
    local losses, step, page_bytes = {}, 0, 0
    -- n steps of train.loop from the batch after the steps made so far: through the pipeline
    -- from the pinned batches, else over the device copies
    local hooks = { { start = function(_, at) at.step = step end },
                    { after = function(_, at)
                        if at.step <= CHECK then losses[at.step] = at.loss:get(0) end
                        if hints then hints:step(at.step) end
                      end } }
    local function run(n)
      if m.pipeline then
        local p = Prefetch.new { collection = model.embeddings, source = train.source.ring(host, n, step),
                                 pages = m.pages }
        step = train.loop.run(model, opt, p, hooks).step
        page_bytes = p:stats().page_bytes or 0 -- managed tables: the page runs asked for
        p:free()
      else
        step = train.loop.run(model, opt, train.source.ring(dev, n, step), hooks).step
      end
      if gpu then C.ur_device_sync() end
    end
    run(WARM) -- warm-up, with the check steps
    if cache then cache:reset_stats() end
    local t0 = C.ur_clock_seconds()
    run(steps)
    local secs = C.ur_clock_seconds() - t0
    local rate = steps * B / secs
    if not base then
      base, base_losses = rate, losses
    else
      for s = 1, CHECK do
        local d = math.abs(losses[s] - base_losses[s]) / math.max(math.abs(base_losses[s]), 1e-6)
        if d > 1e-3 or d ~= d then
          cmd:fail(("check: %s step %d loss %.6g, all-in-HBM's %.6g"):format(m.name, s, losses[s], base_losses[s]))
        end
      end
    end
    local link, hbm, hit, host_ms, gpu_ms, conf, waits -- managed: what moved is the driver's (not measured)
    link = 0
    local table_bytes = model:stats().table_bytes
    if cache then
      local s = cache:stats()
      link = (s.bytes_in + s.bytes_out + s.bytes_ids) / steps
      hbm = cache:bytes()
      hit = s.hits / math.max(s.unique, 1)
      host_ms = 1e3 * s.seconds / steps
      gpu_ms = 1e3 * s.gpu_seconds / steps
      conf, waits = s.conflicts / steps, s.waits / steps
    elseif m.name == "device" then
      hbm = table_bytes
    else
      hbm = ur.memory().managed_on_gpu
    end
    -- the pipeline copies each batch (dense, labels, ids); the cache without it reads the ids
    -- back from the device; the other modes train on batches already on the device
    local hb = host[1]
    local ids = hb.sparse:values():nbytes() + hb.sparse:offsets():nbytes()
    if m.pipeline then link = link + page_bytes / steps + hb.dense:nbytes() + hb.labels:nbytes() + ids
    elseif cache then link = link + ids end
    local gbps = link / (secs / steps) / 1e9
    local r = { bench = "cache_gpu", mode = m.name, samples_per_s = rate, vs_hbm = rate / base,
                emb_hbm_bytes = hbm, table_bytes = table_bytes, link_bytes_per_step = link,
                link_gbps = gbps, link_fraction = gbps / 55, hit_rate = hit or -1, steps = steps, batch = B,
                step_ms = 1e3 * secs / steps, cache_host_ms = host_ms or 0, cache_gpu_ms = gpu_ms or 0,
                conflicts_per_step = conf or 0,
                waits_per_step = waits or 0 }
    emit(r)
    print(("%-20s %14.0f %7.1f%% %10.2f GB %12.1f MB %10.2f %9s %9.2f %14s %13s %8s %8s"):format(m.name, rate,
      100 * rate / base, hbm / 1e9, link / 1e6, gbps, hit and ("%.1f%%"):format(100 * hit) or "-", 1e3 * secs / steps,
      host_ms and ("%.2f"):format(host_ms) or "-", gpu_ms and ("%.2f"):format(gpu_ms) or "-",
      conf and ("%.0f"):format(conf) or "-",
      waits and ("%.2f"):format(waits) or "-"))
    if hints then hints:free() end
    for _, b in ipairs(dev) do b:release() end
    model.embeddings.tbe:free()
    collectgarbage()
    ::next_mode::
  end
end

if o.gpu then gpu_modes() else hit_rates() end
out_file:close()
