-- Cache hit rates warm and at first touch (BENCH.md B6), measured by the cache itself on the CPU
-- and predicted by the planner's hit-rate model (lua/uvmrec/planner/hitrate.lua).
--
--   uvmrec scripts/bench/cache_warm.lua [--rows N] [--tables T] [--batch B] [--batches K]
--        [--warm W] [--zipf S] [--fractions 0.01,0.1,...] [--policies lru,lfu] [--prefetch]
--        [--out FILE.jsonl] [--plot FILE.png]
--
-- The id stream is B6's (scripts/bench/zipf_stream.lua, seed 7): T tables of N rows, batches of
-- B samples with one id per table, Zipf(S) by the continuous inverse CDF, scattered over the
-- rows.  The first W batches warm the cache, the rest are measured.  Each measured batch's
-- distinct rows split into rows never read before in the run (first touch: no cache can hit
-- them) and rows read before; the cache's counters give the hits, so
--   hit rate       = hits / distinct rows          (what `cache:stats()` calls hit_rate)
--   first touch    = never-read rows / distinct rows
--   warm hit rate  = hits / rows read before       (the steady state's rate, which a long run
--                                                    approaches as first touches die out)
-- The model's numbers for the same window (and for a cache warm forever) are printed beside
-- them.  It checks hits + misses + conflicts = distinct rows before it reports.  "--prefetch"
-- adds the runs with two batches in flight (the pipeline's order), as cache.lua does.
local ffi = require "ffi"
local ur = require "uvmrec"
local things = require("uvmrec.lib").things
local C = ur.C
local profile = require "uvmrec.planner.profile"
local hitrate = require "uvmrec.planner.hitrate"
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/cache_warm.lua",
  summary = "the cache's warm and first-touch hit rates against its size, beside the planner's model",
  { "--rows N", "rows per table", type = "whole", default = 1000000 },
  { "--tables N", "tables", type = "whole", default = 4 },
  { "--batch N", "ids per table and batch", type = "whole", default = 8192 },
  { "--batches N", "measured batches", type = "whole", default = 200 },
  { "--warm N", "warm-up batches before them", type = "whole", default = 100 },
  options.zipf,
  { "--fractions F", "cache sizes as fractions of the rows", type = "numbers",
    default = { 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0 } },
  { "--policies P", "cache policies", type = "list", choices = { "lru", "lfu" }, default = { "lru", "lfu" } },
  { "--decay N", "LFU: counts halve every N batches (0: never)", type = "whole", default = 0 },
  { "--prefetch", "prepare each batch before the previous one retires (the pipeline's order)" },
  options.out,
  { "--plot FILE", "a PNG of the curves (matplotlib)" },
}
local o = cmd:parse(arg)

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local zipf_stream = dofile(here .. "/zipf_stream.lua")
local cache_run = dofile(here .. "/cache_run.lua")
local out_file = require("uvmrec.json").lines(o.out)

local T, N, B, K, W = o.tables, o.rows, o.batch, o.batches, o.warm
if W >= K then cmd:misuse(("--warm %d must be below --batches %d"):format(W, K)) end
print(("cache_warm: %s x %s, batches of %s (one id per table), Zipf(%.2f) (zipf_stream.lua), %s, the "
       .. "first %d warm the cache"):format(things(T, "table"), things(N, "row"), things(B, "sample"), o.zipf,
       things(K, "batch", "batches"), W))
math.randomseed(7)
local inputs = zipf_stream(T, N, B, K, o.zipf)

-- first touches per batch and table: rows of batch k never read in batches 1..k-1
local first = {}
do
  local seen = ffi.new("uint8_t[?]", T * N)
  for k = 1, K do
    local pv = ffi.cast("int64_t *", C.ur_tensor_data(inputs[k].values.p))
    local new = 0
    for j = 0, T * B - 1 do
      local t = math.floor(j / B)
      local key = t * N + tonumber(pv[j])
      if seen[key] == 0 then
        seen[key] = 1
        new = new + 1
      end
    end
    first[k] = new
  end
end

local P = profile.zipf { rows = N, s = o.zipf, variant = "continuous" }
local prefetch_stream = o.prefetch and assert(ur.stream()) or nil
print(("%-5s %-4s %-8s %9s %9s %9s | %9s %9s %9s %9s"):format("cache", "pol", "prefetch", "hit", "first",
      "warm", "model hit", "first", "warm", "steady"))
for _, frac in ipairs(o.fractions) do
  for _, policy in ipairs(o.policies) do
    for _, prefetch in ipairs(o.prefetch and { false, true } or { false }) do
      local c, s = cache_run.run { inputs = inputs, tables = T, rows = N, fraction = frac, policy = policy,
                               decay = o.decay, warm = W, prefetch_stream = prefetch and prefetch_stream or nil,
                               fail = function(msg) cmd:fail(msg) end }
      local cache = c.cache
      local new = 0
      for k = W + 1, K do new = new + first[k] end
      local slots = cache:slots() / T
      local m = hitrate.window(policy, P, B, slots, W + 1, K, { decay_batches = o.decay })
      local r = { bench = "cache_warm", cache_fraction = frac, policy = policy, prefetch = prefetch,
                  hit_rate = s.hits / s.unique, first_touch = new / s.unique,
                  warm_hit_rate = s.hits / (s.unique - new), conflict_rate = s.conflicts / s.unique,
                  model_hit_rate = m.hit_rate, model_first_touch = m.first_touch,
                  model_warm_hit_rate = m.warm_hit_rate, model_steady = m.steady,
                  unique_per_batch = s.unique / (K - W), model_unique_per_batch = T * m.distinct,
                  slots_per_table = slots, tables = T, rows = N, batch = B, batches = K, warm = W,
                  zipf = o.zipf, decay = policy == "lfu" and o.decay or nil,
                  stream = "zipf_stream.lua (continuous), seed 7" }
      out_file:write(r)
      print(("%4.0f%% %-4s %-8s %8.2f%% %8.2f%% %8.2f%% | %8.2f%% %8.2f%% %8.2f%% %8.2f%%"):format(100 * frac,
        policy, prefetch and "yes" or "no", 100 * r.hit_rate, 100 * r.first_touch, 100 * r.warm_hit_rate,
        100 * m.hit_rate, 100 * m.first_touch, 100 * m.warm_hit_rate, 100 * m.steady))
      c:free()
    end
  end
end
cache_run.free(inputs)
out_file:close()
if o.out and o.plot then cache_run.plot(o.out, o.plot) end
