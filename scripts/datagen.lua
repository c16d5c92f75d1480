-- `uvmrec datagen`: synthetic data written as binary day files, so other tools train on exactly
-- the same data: day_N_dense.npy <f4 [n, dense], day_N_sparse.npy <i4 [n, H] (H = the sum of each
-- table's most ids per sample; one column per table when all are one-hot, as Criteo's; unused
-- slots of a multi-hot bag are -1), day_N_labels.npy <i4 [n], and when asked day_N_weights.npy
-- <f4 [n, H] and day_N_groups.npy <i8 [n]; layout.txt says which columns are which table.
-- Draws on the GPU where there is one (--cpu: on every core), converts and writes on every
-- core.  Prints samples/s, MB/s and the hidden model's AUC, the ceiling a model can reach.  Its options are
-- declared below (`uvmrec datagen --help`).  Also runs as `luajit scripts/datagen.lua ...` with
-- the paths from `make -s env`.
local ffi = require "ffi"
local ur = require "uvmrec"
local data = ur.data
local synthetic = require "uvmrec.data.synthetic"

local cmd = require("uvmrec.cli").command {
  name = "datagen",
  summary = "write synthetic data (a preset or config) as binary day files, with the hidden model's AUC",
  { "CONFIG", "a preset (tiny, kaggle, mlperf_v1, mlperf_v1_2m or dcnv2), a .lua file returning a spec, "
    .. "or a .yaml file with a synthetic: section" },
  { "--out DIR", "where the day files and layout.txt go (created if missing)", required = true },
  { "--samples N", "samples in all (default: the config's synthetic.samples)", type = "whole" },
  { "--days D", "split them into D day files", type = "whole", default = 1,
    check = function(d) return d >= 1 and d or nil, "must be at least 1" end },
  { "--seed S", "override the seed", type = "whole" },
  { "--groups G", "per-sample grouping keys in [0, G)", type = "whole" },
  { "--cpu", "generate on the CPU even where a GPU is (by default the GPU draws, the host writes)" },
  { "--report FILE", "append a JSON line of the rates to FILE" },
}
local o = cmd:parse(arg)
local name, out, days = o.config, o.out, o.days

local base, cfg_samples = synthetic.resolve(name)
if not base then cmd:misuse(cfg_samples) end
local samples = o.samples or cfg_samples
if not samples then cmd:misuse("needs --samples N: " .. name .. " gives no synthetic.samples") end
local ok, spec = pcall(synthetic.spec, base, { seed = o.seed or base.seed, groups = o.groups or base.groups })
if not ok then cmd:fail(spec) end
if os.execute("mkdir -p " .. require("uvmrec.lib").shell_quote(out)) ~= 0 then cmd:fail("cannot create " .. out) end

local c = spec.cspec
local H, one_hot, weighted, big = 0, true, false, false
local hot, rows, spaces, wide = {}, {}, {}, false
for t = 0, c.num_tables - 1 do
  local tb = c.tables[t]
  H = H + tb.hot_max
  one_hot = one_hot and tb.hot_min == 1 and tb.hot_max == 1
  weighted = weighted or tb.weighted ~= 0
  -- ids come from the id space when the spec has one (raw ids, larger than the table)
  local space = tb.id_space > 0 and tb.id_space or tb.rows
  big = big or space > 2147483647
  wide = wide or space > tb.rows
  hot[t + 1] = tb.hot_min == tb.hot_max and tostring(tb.hot_max) or (tb.hot_min .. "-" .. tb.hot_max)
  rows[t + 1] = tostring(tonumber(tb.rows))
  spaces[t + 1] = tostring(tonumber(space))
end

local C = ur.C
local function writer(path, descr, shape)
  local w = ffi.new("ur_npy_writer *[1]")
  local dims = ffi.new("int64_t[4]", shape)
  if C.ur_npy_writer_open(w, path, descr, #shape,
                          dims) ~= 0 then cmd:fail(ffi.string(C.ur_last_error())) end
  return w[0]
end
local function append(w, t)
  if C.ur_npy_writer_append(w, t.p) ~= 0 then cmd:fail(ffi.string(C.ur_last_error())) end
end
local function close(w)
  if C.ur_npy_writer_close(w) ~= 0 then cmd:fail(ffi.string(C.ur_last_error())) end
end

-- A chunk at a time: drawn on the GPU (copied down) or on every core, then converted (on every
-- core) and written.
local chunk = 262144
local gpu = ur.gpu() and not o.cpu
local function now() return C.ur_clock_seconds() end
local start = now()
local gen_s, write_s, bytes = 0, 0, 0
local gen_cpu, write_cpu = 0, 0 -- CPU time (all threads): the cost on a shared machine
local first = 0
for d = 0, days - 1 do
  local n_day = math.floor(samples * (d + 1) / days) - math.floor(samples * d / days)
  local p = ("%s/day_%d_"):format(out, d)
  local w = {
    dense = writer(p .. "dense.npy", "<f4", { 0, c.num_dense }),
    sparse = writer(p .. "sparse.npy", big and "<i8" or "<i4", { 0, H }),
    labels = writer(p .. "labels.npy", "<i4", { 0 }),
    weights = weighted and writer(p .. "weights.npy", "<f4", { 0, H }) or nil,
    groups = c.groups > 0 and writer(p .. "groups.npy", "<i8", { 0 }) or nil,
  }
  local done = 0
  while done < n_day do
    local n = math.min(chunk, n_day - done)
    local g0, gc0 = now(), os.clock()
    local g = assert(data.generate(spec, first + done, n, { placement = gpu and "device" or "host" }))
    if gpu then
      for k, t in pairs(g) do
        g[k] = assert(t:to("host"))
        t:free()
      end
    end
    local w0, wc0 = now(), os.clock()
    gen_s, gen_cpu = gen_s + (w0 - g0), gen_cpu + (wc0 - gc0)
    append(w.dense, g.dense)
    append(w.sparse, g.ids)
    append(w.labels, g.labels)
    if w.weights then append(w.weights, g.weights) end
    if w.groups then append(w.groups, g.groups) end
    write_s, write_cpu = write_s + (now() - w0), write_cpu + (os.clock() - wc0)
    bytes = bytes + n * (c.num_dense * 4 + H * (big and 8 or 4) + 4 + (w.weights and H * 4 or 0) +
                         (w.groups and 8 or 0))
    for _, t in pairs(g) do t:free() end
    done = done + n
  end
  for _, x in pairs(w) do close(x) end
  first = first + n_day
end
local secs = now() - start

local lay = assert(io.open(out .. "/layout.txt", "w"))
lay:write("format uvmrec-day 1\n", ("source synthetic %s seed %d\n"):format(name, tonumber(c.seed)),
  ("samples %d\ndays %d\ndense %d\ntables %d\n"):format(samples, days, c.num_dense, c.num_tables),
  "hot ", table.concat(hot, ","), "\n", "rows ", table.concat(rows, ","), "\n",
  ("one_hot %s\nweights %s\ngroups %d\n"):format(tostring(one_hot), tostring(weighted), tonumber(c.groups)),
  wide and ("id_space " .. table.concat(spaces, ",") .. "\n") or "")
lay:close()

print(("CPU time: generation %.0f samples a CPU-second, converting and writing %.0f MB a CPU-second"):format(
  samples / math.max(gen_cpu, 1e-9), bytes / 1e6 / math.max(write_cpu, 1e-9)))
if o.report then
  require("uvmrec.json").append_lines(o.report, { bench = "datagen", config = name, samples = samples, bytes = bytes,
    seconds = secs, mb_per_s = bytes / 1e6 / math.max(secs, 1e-9), gpu = gpu,
    generation_cpu_samples_per_s = samples / math.max(gen_cpu, 1e-9),
    write_cpu_mb_per_s = bytes / 1e6 / math.max(write_cpu, 1e-9) })
end
local ceiling, no_ceiling = synthetic.hidden_auc(spec, math.min(samples, 100000), 0)
print(("wrote %d samples of '%s' (%d tables, %d dense) into %d day file(s) in %s"):format(samples, name,
  c.num_tables, c.num_dense, days, out))
print(("%.2f s: %.0f samples/s, %.0f MB/s written (generation on the %s %.0f samples/s; converting and writing "
  .. "%.0f MB/s)"):format(secs, samples / math.max(secs, 1e-9), bytes / 1e6 / math.max(secs, 1e-9),
  gpu and "GPU, copies included," or "CPU", samples / math.max(gen_s, 1e-9), bytes / 1e6 / math.max(write_s, 1e-9)))
-- Too few samples (none, or all of one class) have no AUC: say so rather than print a number.
print(ceiling and ("hidden model AUC (the ceiling): %.4f"):format(ceiling)
  or ("hidden model AUC (the ceiling): none on %d samples (%s)"):format(samples, no_ceiling))
