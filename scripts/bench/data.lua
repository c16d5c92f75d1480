-- Data path throughput, one line each: the Criteo TSV reader (lines/s), the synthetic
-- generator on the CPU and, when there is one, on the GPU (samples/s), and the loader
-- (batches/s) from synthetic data, day files and TSV.
-- usage: luajit scripts/bench/data.lua [LINES] [BATCH] [DIR]   (--help)
-- The TSV is the real sample rows of ../shared/data repeated (or synthetic lines without them).
local ffi = require "ffi"
local ur = require "uvmrec"
local data = ur.data
local C = ur.C

local args = require("uvmrec.cli").command {
  name = "scripts/bench/data.lua",
  summary = "data path throughput: the Criteo TSV reader, the synthetic generator, the loader",
  { "[LINES]", "lines of the TSV", type = "whole", default = 2000000 },
  { "[BATCH]", "samples a batch", type = "whole", default = 65536 },
  { "[DIR]", "where the files go (in uvmrec-bench-data/)", default = "/tmp" },
}:parse(arg)
local lines, B, dir = args.lines, args.batch, args.dir .. "/uvmrec-bench-data"

pcall(ffi.cdef, "int clock_gettime(int, void *);")
local function now()
  local t = ffi.new("struct { long s, ns; }")
  ffi.C.clock_gettime(1, t)
  return tonumber(t.s) + tonumber(t.ns) * 1e-9
end

local function report(what, n, unit, secs, extra)
  print(("%-44s %12.0f %s/s  (%d in %.2f s%s)"):format(what, n / secs, unit, n, secs, extra or ""))
end

os.execute("rm -rf " .. dir .. " && mkdir -p " .. dir)
print(("threads: %s (UR_NUM_THREADS), batch %d"):format(os.getenv("UR_NUM_THREADS") or "all cores", B))

-- A TSV of `lines` lines.
local shared = (arg[0]:match("^(.*)/scripts/bench/[^/]*$") or ".") .. "/spec/fixtures/criteo_raw_sample.tsv"
local src = {}
local f = io.open(shared)
if f then
  for l in f:lines() do src[#src + 1] = l end
  f:close()
else
  for i = 1, 1000 do
    local fields = { tostring(i % 4 == 0 and 1 or 0) }
    for j = 1, 13 do fields[#fields + 1] = tostring((i * j) % 1000) end
    for j = 1, 26 do fields[#fields + 1] = ("%08x"):format((i * 2654435761 + j * 40503) % 4294967296) end
    src[#src + 1] = table.concat(fields, "\t")
  end
end
local block = table.concat(src, "\n") .. "\n"
local tsv = dir .. "/day_0.tsv"
local out = assert(io.open(tsv, "wb"))
for _ = 1, math.ceil(lines / #src) do out:write(block) end
out:close()
local nlines = math.ceil(lines / #src) * #src

-- TSV reader: parse only (no copies into Lua).
do
  local paths = ffi.new("const char *[1]", { tsv })
  local r = ffi.new("ur_criteo_reader *[1]")
  local o = data.criteo_opts({ rows = data.presets.kaggle_rows }, 1)
  assert(C.ur_criteo_open(r, paths, 1, o) == 0)
  local chunk = 65536
  local lb, d, c = ffi.new("int32_t[?]", chunk), ffi.new("float[?]", chunk * 13), ffi.new("uint32_t[?]", chunk * 26)
  local got = ffi.new("int64_t[1]")
  local t0, n = now(), 0
  repeat
    assert(C.ur_criteo_read(r[0], chunk, lb, d, c, got) == 0)
    n = n + tonumber(got[0])
  until got[0] == 0
  local secs = now() - t0
  C.ur_criteo_close(r[0])
  local mb = #block * nlines / #src / 1e6
  report("criteo-tsv reader (parse, mod rows)", n, "lines", secs, (", %.0f MB/s"):format(mb / secs))
end

-- TSV to day files.
do
  local t0 = now()
  local st = assert(data.convert(tsv, dir .. "/bin", (function() os.execute("mkdir -p " .. dir .. "/bin") return
    { rows = data.presets.kaggle_rows } end)()))
  report("uvmrec convert (TSV -> .npy day files)", st.lines, "lines", now() - t0)
end

-- Synthetic generator.
for _, preset in ipairs { "tiny", "kaggle", "dcnv2" } do
  local spec = data.synthetic_spec(preset)
  local n = preset == "dcnv2" and 100000 or 500000
  data.generate(spec, 0, 1000)
  local t0 = now()
  assert(data.generate(spec, 0, n))
  report("synthetic " .. preset .. " on the CPU", n, "samples", now() - t0)
  if ur.gpu() then
    assert(data.generate(spec, 0, n, { placement = "device" }))
    ur.sync()
    t0 = now()
    for _ = 1, 5 do assert(data.generate(spec, 0, n, { placement = "device" })) end
    ur.sync()
    report("synthetic " .. preset .. " on the GPU", 5 * n, "samples", now() - t0)
  end
end

-- The loader at batch B: synthetic tiny, the day files, the TSV.
local function bench_loader(what, spec, opts, max_batches)
  local o = { batch_size = B, depth = 4 }
  for k, v in pairs(opts) do o[k] = v end
  local l = assert(data.open(spec, o))
  local t0, nb, ns = now(), 0, 0
  for b in l:batches() do
    nb = nb + 1
    ns = ns + b.size
    if nb >= max_batches then break end
  end
  local secs = now() - t0
  local s = l:stats()
  l:close()
  report("loader " .. what, nb, "batches", secs,
    (", %.0f samples/s, consumer waited %.2f s"):format(ns / secs, s.wait_seconds))
end
bench_loader("synthetic tiny", "synthetic:tiny", { samples = 40 * B }, 40)
bench_loader("criteo-bin (day files)", "criteo-bin:" .. dir .. "/bin", { epochs = 0 }, 40)
bench_loader("criteo-bin, shuffled in windows of 4B", "criteo-bin:" .. dir .. "/bin",
  { epochs = 0, shuffle_window = 4 * B, seed = 1 }, 40)
bench_loader("criteo-tsv", "criteo-tsv:" .. tsv, { rows = data.presets.kaggle_rows, epochs = 0 }, 20)
os.execute("rm -rf " .. dir)
