-- Building a large model: the time to allocate and draw embedding tables, per GiB, for each
-- thread count asked (each in a process of its own, UR_NUM_THREADS set), wall and CPU time, and
-- what they predict for dlrm_mlperf_v1's 89.5 GiB.  The tables have MLPerf v1's row counts
-- scaled down to --gib GiB (dim 128, f32), placed on the host (a CPU collection), or with --gpu
-- pinned on the host of a GPU collection (drawn by the GPU and streamed down) and managed.
-- Checked first: each table's first elements are Philox's numbers for its seed, and every
-- thread count gives the same tables (a digest of every element).
--   luajit scripts/bench/build.lua [--gib G] [--threads 1,2] [--gpu] (--help)
local ffi = require "ffi"
local ur = require "uvmrec"
local json = require "uvmrec.json"
local C = ur.C
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/build.lua",
  summary = "build time of large embedding tables per GiB and thread, checked against Philox",
  { "--gib G", "GiB of tables", type = "number", default = 1 },
  { "--threads LIST", "thread counts, comma-separated (one process each)", default = "1,2" },
  { "--gpu", "a GPU collection: tables pinned on the host (streamed draw) and managed" },
  { "--one PLACEMENT", "(internal) build once in this process and print a JSON line" },
  options.out_append,
}
local o = cmd:parse(arg)

local presets = require "uvmrec.data.presets"
local DIM, SEED = 128, 7

local function tables(gib, placement)
  local total = 0
  for _, r in ipairs(presets.mlperf_rows) do total = total + r end
  local scale = gib * 2 ^ 30 / (total * DIM * 4)
  local out = {}
  for i, r in ipairs(presets.mlperf_rows) do
    out[i] = { name = "C" .. i, rows = math.max(1, math.floor(r * scale)), dim = DIM, placement = placement }
  end
  return out
end

if o.gpu and not ur.gpu() then cmd:fail("--gpu: no GPU in use: " .. ur.cuda_error(), 2) end

-- Build once here: {seconds, cpu_seconds, bytes, digest} as a JSON line on stdout.
if o.one then
  local ts = tables(o.gib, o.one)
  local bytes = 0
  for _, t in ipairs(ts) do bytes = bytes + t.rows * DIM * 4 end
  local t0, c0 = C.ur_clock_seconds(), os.clock()
  local c = assert(require("uvmrec.tbe").new { tables = ts, seed = SEED, device = o.gpu and 0 or "cpu",
                                               optimizer = "sgd" })
  local secs, cpu = C.ur_clock_seconds() - t0, os.clock() - c0
  -- the check: the first elements are the tensor generator's for the table's seed, whose
  -- numbers are Philox's (spec/tensor_spec.lua); the digest: every element
  local h, bad = 2166136261ULL, nil
  for i, t in ipairs(ts) do
    local w = c:table(t.name)
    local host = w:placement() == "host" and w or assert(w:to("host"))
    if host ~= w then w:free() end
    local q = ffi.cast("uint32_t *", C.ur_tensor_data(host.p))
    local seed = bit.bxor(ffi.cast("uint64_t", SEED), ffi.cast("uint64_t", i) * 0xD1B54A32D192ED03ULL)
    local m = math.min(4096, t.rows * DIM)
    local b = 1 / math.sqrt(t.rows)
    local ref = ur.tensor({ m }):uniform(-b, b, seed)
    local rq = ffi.cast("uint32_t *", C.ur_tensor_data(ref.p))
    for k = 0, m - 1 do
      if q[k] ~= rq[k] and not bad then bad = ("table %s element %d differs from Philox's"):format(t.name, k) end
    end
    ref:free()
    for k = 0, t.rows * DIM - 1, 7 do h = bit.bxor(h, q[k]) * 16777619ULL end
    host:free()
  end
  c:free()
  io.write(json.encode { seconds = secs, cpu_seconds = cpu, bytes = bytes, digest = tostring(h), bad = bad }, "\n")
  os.exit(0)
end

local function load() return tonumber(require("uvmrec.cli").load_average()) or -1 end

local bin = require("uvmrec.cli").program()
local places = o.gpu and { "host", "managed" } or { "host" }
print(("%-9s %-8s %10s %12s %12s %14s %8s"):format("placement", "threads", "GiB", "wall s/GiB", "CPU s/GiB",
  "89.5 GiB, 16", "load"))
for _, place in ipairs(places) do
  local digest
  for t in o.threads:gmatch("%d+") do
    local child = ("UR_NUM_THREADS=%s %s scripts/bench/build.lua --gib %s --one %s%s"):format(t, bin, o.gib, place,
      o.gpu and " --gpu" or "")
    local p = io.popen(child)
    local line = p:read("*a")
    p:close()
    local r = json.decode(line:match("{.*}") or error("build.lua --one: " .. line))
    assert(not r.bad, r.bad)
    assert(not digest or digest == r.digest, ("%s threads built other tables than the first count"):format(t))
    digest = r.digest
    local gib = r.bytes / 2 ^ 30
    -- 16 cores: the CPU time spread over them (the draw is one parallel loop)
    local pred = place == "host" and not o.gpu and 89.5 * r.cpu_seconds / gib / 16 or 89.5 * r.seconds / gib
    local ld = load()
    print(("%-9s %-8s %10.2f %12.2f %12.2f %12.1f s %8.2f"):format(place, t, gib, r.seconds / gib,
      r.cpu_seconds / gib, pred, ld))
    if o.out then
      json.append_lines(o.out, { bench = "build", placement = place, threads = tonumber(t), gib = gib,
                                 wall_s_per_gib = r.seconds / gib, cpu_s_per_gib = r.cpu_seconds / gib,
                                 predicted_mlperf_s = pred, load = ld })
    end
  end
end
print("checked: the first elements of every table are Philox's; every thread count built the same tables")
