-- B8: the loader's samples/s from binary day files in the page cache, shuffled, at batch
-- 65,536, for each thread count asked (--threads 1,2,16), with the per-batch cost split into
-- what bounds it.  The day files are `uvmrec datagen` output (made in DIR when it has none).
-- Checked before anything is timed: every thread count gives the 1-thread loader's first
-- batches bit for bit, and a share of about 2 M rows gives, shuffled, the ids, dense features
-- and labels it gives in order (a shuffle moves rows, it neither drops nor repeats them; rows
-- read in order are the files', spec/data/loader_spec.lua).  Prints a table and one JSON
-- line per thread count (--out).
--   luajit scripts/bench/loader.lua --dir DIR [--samples N] [--threads 1,2] (--help)
local ffi = require "ffi"
local ur = require "uvmrec"
local json = require "uvmrec.json"
local data = ur.data
local C = ur.C
local options = require("uvmrec.cli").options

local o = require("uvmrec.cli").command {
  name = "scripts/bench/loader.lua",
  summary = "B8: loader samples/s from day files, shuffled, per thread count, checked first",
  { "--dir DIR", "day files (made there with `uvmrec datagen mlperf_v1` when missing)", required = true },
  { "--samples N", "samples to make when DIR has no day files", type = "whole", default = 2000000 },
  { "--batch B", "samples a batch", type = "whole", default = 65536 },
  { "--window W", "shuffle window in rows (0: in order)", type = "whole", default = 262144 },
  { "--threads LIST", "thread counts, comma-separated", default = "1,2" },
  { "--batches K", "batches timed a run", type = "whole", default = 40 },
  { "--repeat R", "runs a thread count (median and spread)", type = "whole", default = 3 },
  options.out_append,
}:parse(arg)

local function now() return C.ur_clock_seconds() end

local function load() -- the 1-minute load average: the machine is shared
  return tonumber(require("uvmrec.cli").load_average()) or -1
end

-- Day files: made when missing, then read once so the page cache holds them.
local dir = o.dir
if not io.open(dir .. "/day_0_dense.npy") then
  local cmd = ("%s datagen mlperf_v1 --out %s --samples %d"):format(require("uvmrec.cli").program(), dir, o.samples)
  print(cmd)
  assert(os.execute(cmd) == 0, "datagen failed")
end
local bytes = 0 -- of the files, then a sample's
for _, name in ipairs(assert(require("uvmrec.lib").dir_list(dir, "day_", ".npy"))) do
  local f = assert(io.open(dir .. "/" .. name, "rb"))
  while true do
    local s = f:read(16777216)
    if not s then break end
    bytes = bytes + #s
  end
  f:close()
end

local function open(threads, extra)
  local opts = { batch_size = o.batch, shuffle_window = o.window, seed = 1, epochs = 0, threads = threads,
                 depth = 4 }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return assert(data.open("criteo-bin:" .. dir, opts))
end

-- The sum of a host tensor's elements (ct: its element type).
local function sum(t, ct)
  local q, s = ffi.cast(ct, C.ur_tensor_data(t.p)), 0
  for i = 0, t:numel() - 1 do s = s + q[i] end
  return s
end

-- A batch's bits: FNV-1a over dense, labels, lengths and values.
local function digest(b)
  local h = 2166136261ULL
  local function over(t, n, ct)
    local q = ffi.cast(ct, C.ur_tensor_data(t.p))
    for i = 0, n - 1 do h = bit.bxor(h, ffi.cast("uint64_t", q[i])) * 16777619ULL end
  end
  over(b.dense, b.dense:numel(), "uint32_t *")
  over(b.labels, b.labels:numel(), "uint32_t *")
  local v, l = b.sparse:values(), b.sparse:lengths()
  over(v, v:numel(), "int64_t *")
  over(l, l:numel(), "int32_t *")
  v:free()
  l:free()
  return h
end

local threads = {}
for t in o.threads:gmatch("%d+") do threads[#threads + 1] = tonumber(t) end

-- Checks: the same first batches on every thread count; one epoch sums to the files' sums.
local want = {}
do
  local l = open(1)
  for i = 1, 3 do want[i] = digest(assert(l:next())) end
  l:close()
  for _, t in ipairs(threads) do
    local lt = open(t)
    for i = 1, 3 do
      assert(digest(assert(lt:next())) == want[i], ("%d threads: batch %d differs from 1 thread's"):format(t, i))
    end
    lt:close()
  end
  -- a share of about 2 M rows (rank 0 of as many ranks), shuffled and in order, sums the same
  local function sums(shuffle, world)
    local l2 = open(threads[#threads], { epochs = 1, world = world, shuffle_window = shuffle })
    local acc = { ids = 0ULL, labels = 0, dense = 0, n = 0 }
    for b in l2:batches() do
      local v = b.sparse:values()
      local q = ffi.cast("int64_t *", C.ur_tensor_data(v.p))
      for i = 0, v:numel() - 1 do acc.ids = acc.ids + q[i] end
      v:free()
      acc.labels = acc.labels + sum(b.labels, "float *")
      acc.dense = acc.dense + sum(b.dense, "float *")
      acc.n = acc.n + b.size
    end
    l2:close()
    return acc
  end
  local probe = open(1, { epochs = 1 })
  local total = probe:stats().samples_per_epoch
  probe:close()
  local world = math.max(1, math.floor(total / 2000000))
  local a, b = sums(o.window, world), sums(0, world)
  assert(a.n == b.n and a.n == math.floor(total / world), ("a share gave %d and %d samples"):format(a.n, b.n))
  assert(a.ids == b.ids, "the shuffled share's ids do not sum to the share's")
  assert(a.labels == b.labels, "the shuffled share's labels do not sum to the share's")
  assert(math.abs(a.dense - b.dense) <= 1e-9 * math.abs(b.dense), "the shuffled share's dense features differ")
  print(("checked: %d thread counts give 1 thread's first batches; %d of %d samples, shuffled, sum as in order")
    :format(#threads, a.n, total))
  bytes = bytes / total
end

print(("day files: %s, %.0f bytes a sample, batch %d, window %d, load %.2f at the start")
  :format(dir, bytes, o.batch, o.window, load()))
print(("%-8s %14s %14s %10s %14s %16s %8s"):format("threads", "samples/s", "spread", "batches/s",
  "CPU ms/batch", "per thread-CPU", "load"))
for _, t in ipairs(threads) do
  local rates, waits, produce = {}, {}, {}
  for r = 1, o["repeat"] do
    local l = open(t)
    for _ = 1, math.max(2, t) do assert(l:next()) end -- every thread has made a batch
    local s0 = l:stats()
    local t0 = now()
    for _ = 1, o.batches do assert(l:next()) end
    local secs = now() - t0
    local s1 = l:stats()
    l:close()
    rates[r] = o.batches * o.batch / secs
    waits[r] = s1.wait_seconds - s0.wait_seconds
    -- CPU time, not wall time: on a shared machine the threads wait for a core
    produce[r] = (s1.produce_cpu_seconds - s0.produce_cpu_seconds) / (s1.batches - s0.batches)
  end
  local sorted = { unpack(rates) }
  table.sort(sorted)
  local med = sorted[math.floor((#sorted + 1) / 2)]
  local mp = produce[1]
  for _, x in ipairs(produce) do mp = math.min(mp, x) end
  local ld = load()
  print(("%-8d %14.0f %6.2f-%.2f M %10.1f %14.2f %14.0f/s %8.2f"):format(t, med, sorted[1] / 1e6,
    sorted[#sorted] / 1e6, med / o.batch, mp * 1e3, o.batch / mp, ld))
  if o.out then
    json.append_lines(o.out, { bench = "B8", threads = t, batch = o.batch, window = o.window, samples_per_s = med,
                               min = sorted[1], max = sorted[#sorted], cpu_ms_per_batch = mp * 1e3, waited = waits,
                               load = ld, runs = rates })
  end
end
