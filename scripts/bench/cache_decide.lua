-- The software cache's decisions on the GPU against the host reference, at the B4 shape.
--
--   uvmrec scripts/bench/cache_decide.lua [--tables T] [--rows N] [--batch B] [--batches K]
--                                         [--zipf S] [--out FILE.jsonl]
--
-- T tables of N rows (dim 4: only the decisions matter), batches of B samples with one id per
-- table drawn Zipf(S) and scattered over the rows (the hit-rate stream of cache.lua).  For
-- each cache size and policy, the same K batches go through a CPU cache (engine/src/embedding/cache.c)
-- and a GPU cache (kernels/cache.cu) in the prefetch pipeline's order (batch k prepared on
-- another stream before batch k-1 retires).  It checks that every batch gets the same slot
-- id for every value and the same counts from both, then prints each one's hit rate and
-- time per batch (a prepare and a retire, the host waiting for the GPU after each).
local ffi = require "ffi"
local ur = require "uvmrec"
local things = require("uvmrec.lib").things
local json = require "uvmrec.json"
local C = ur.C
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/cache_decide.lua",
  summary = "the software cache's decisions on the GPU against the host reference, at the B4 shape",
  { "--tables T", "tables", type = "whole", default = 26 },
  { "--rows N", "rows of each table", type = "whole", default = 1000000 },
  { "--batch B", "samples a batch (one id per table)", type = "whole", default = 65536 },
  { "--batches K", "batches", type = "whole", default = 12 },
  options.zipf,
  options.out,
}
local o = cmd:parse(arg)
if not ur.gpu() then cmd:fail("needs a GPU: " .. ur.cuda_error()) end

local T, N, B, K = o.tables, o.rows, o.batch, o.batches
math.randomseed(7)
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local host, dev = dofile(here .. "/zipf_stream.lua")(T, N, B, K, o.zipf), {}
for k, x in ipairs(host) do
  dev[k] = { values = assert(x.values:to("device")), offsets = assert(x.offsets:to("device")) }
end

local out_file = json.lines(o.out)
local FIELDS = { "lookups", "unique", "hits", "misses", "conflicts", "evictions", "writebacks", "waits",
                 "bytes_in", "bytes_out" }

-- K batches through a cache on device (-1: the CPU); per batch the ids as a host array.
local function run(device, frac, policy, check)
  local tables = {}
  for t = 1, T do tables[t] = { name = "t" .. t, rows = N, dim = 4, placement = "cached" } end
  local c = assert(require("uvmrec.tbe").new { tables = tables, device = device >= 0 and device or "cpu",
    optimizer = "sgd", cache = { load_factor = frac, policy = policy, decay_batches = policy == "lfu" and 16 or 0 } })
  local cache = c.cache
  local s_compute, s_prefetch = assert(ur.stream()), assert(ur.stream())
  local inputs = device >= 0 and dev or host
  local prev, seconds, per = nil, 0, {}
  for k = 1, K do
    local x = inputs[k]
    local t0 = C.ur_clock_seconds()
    if prev then assert(c:retire(prev, true, s_compute)) end
    local rec = assert(c:prepare(x, s_prefetch))
    if device >= 0 then assert(s_prefetch:sync()) end
    if k > 2 then seconds = seconds + (C.ur_clock_seconds() - t0) end
    local ids = device >= 0 and assert(rec.ids:to("host")) or rec.ids
    per[k] = check(k, ffi.cast("const int64_t *", C.ur_tensor_data(ids.p)), ids:numel())
    if device >= 0 then ids:free() end
    prev = rec
  end
  assert(c:retire(prev, true, s_compute))
  local st = cache:stats()
  c:free()
  s_compute:free()
  s_prefetch:free()
  return st, seconds / (K - 2), per
end

print(("cache decisions: %s x %s, batches of %d (one id per table), Zipf(%.2f), %s")
      :format(things(T, "table"), things(N, "row"), B, o.zipf, things(K, "batch", "batches")))
print(("%-6s %-5s %9s %9s %11s %11s %8s"):format("cache", "policy", "hit rate", "conflict", "CPU ms/b", "GPU ms/b",
      "same"))
local failed = false
for _, frac in ipairs({ 0.05, 0.2 }) do
  for _, policy in ipairs({ "lru", "lfu" }) do
    local want = {}
    local sc, tc = run(-1, frac, policy, function(k, p, n)
      local copy = ffi.new("int64_t[?]", n)
      ffi.copy(copy, p, n * 8)
      want[k] = { p = copy, n = n }
      return true
    end)
    local bad = nil
    local sg, tg = run(0, frac, policy, function(k, p, n)
      local w = want[k]
      if w.n ~= n then bad = bad or ("batch %d: %d ids, CPU %d"):format(k, n, w.n) return false end
      for i = 0, n - 1 do
        if p[i] ~= w.p[i] then
          bad = bad or ("batch %d value %d: GPU slot %d, CPU slot %d"):format(k, i, tonumber(p[i]), tonumber(w.p[i]))
          return false
        end
      end
      return true
    end)
    for _, f in ipairs(FIELDS) do
      if sc[f] ~= sg[f] then bad = bad or ("%s: GPU %d, CPU %d"):format(f, sg[f], sc[f]) end
    end
    failed = failed or bad ~= nil
    print(("%4.0f%%  %-5s %8.2f%% %8.2f%% %11.2f %11.2f %8s"):format(100 * frac, policy, 100 * sg.hit_rate,
          100 * sg.conflicts / math.max(1, sg.unique), 1e3 * tc, 1e3 * tg, bad and "NO" or "yes"))
    if bad then print("  first difference: " .. bad) end
    out_file:write { bench = "cache_decide", cache_fraction = frac, policy = policy,
      hit_rate = sg.hit_rate, cpu_ms_per_batch = 1e3 * tc, gpu_ms_per_batch = 1e3 * tg, same = bad == nil,
      tables = T, rows = N, batch = B }
  end
end
out_file:close()
if failed then cmd:fail("the GPU's decisions differ from the CPU's") end
