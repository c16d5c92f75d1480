-- Hint policies under drift: synthetic data whose hot ids move (the generator's drift), the
-- same batches into two collections of managed tables, one under hot_prefix, one under
-- adaptive, at the same HBM allowance.  Per interval: the coverage of each (the share of that
-- interval's lookups that read a row of the GPU prefix as laid out before it), the rows adaptive
-- swapped and its time.  hot_prefix lays the rows out once and its coverage decays as the hot
-- set leaves its prefix; adaptive's follows.  Runs on the CPU (managed tables are host memory
-- there, their hints recorded), and on a GPU as is.  Checked first: the two collections give the
-- same outputs step for step (swaps move rows, never values).  Prints a table and JSON lines.
--   luajit scripts/bench/drift.lua [--steps N] [--drift D] [--allowance 10%] (--help)
local ffi = require "ffi"
local ur = require "uvmrec"
local things = require("uvmrec.lib").things
local json = require "uvmrec.json"
local hints = require "uvmrec.hints"
local C = ur.C
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/drift.lua",
  summary = "hot_prefix and adaptive under a drifting hot set: coverage per interval",
  { "--steps N", "training steps", type = "whole", default = 240 },
  { "--batch B", "samples a step", type = "whole", default = 4096 },
  { "--tables T", "tables", type = "whole", default = 8 },
  { "--rows R", "rows a table", type = "whole", default = 100000 },
  { "--drift D", "ranks the hot ids move a sample (default: the prefix's rows twice over the run)", type = "number" },
  { "--allowance A", "HBM allowance of the managed tables' bytes", default = "10%" },
  { "--every K", "steps an interval", type = "whole", default = 20 },
  { "--decay F", "counts times F after each interval", type = "number", default = 0.5 },
  options.out_append,
}
local o = cmd:parse(arg)
-- coverage is measured at each interval: steps that end before the first had none to print
-- ('attempt to index a nil value' at the summary)
if o.steps < o.every then
  cmd:misuse(("--steps %d is below --every %d: the run would end before its first interval"):format(o.steps, o.every))
end

local allowance = tonumber((o.allowance:gsub("%%$", ""))) / 100
local drift = o.drift or 2 * allowance * o.rows / (o.steps * o.batch)
local tables, names = {}, {}
for i = 1, o.tables do
  tables[i] = { name = "C" .. i, rows = o.rows, zipf = 1.05 }
  names[i] = "C" .. i
end
local spec = ur.data.synthetic_spec { num_dense = 13, seed = 17, drift = drift, tables = tables }
local samples = o.steps * o.batch

local function collection()
  local ts = {}
  for i, n in ipairs(names) do ts[i] = { name = n, rows = o.rows, dim = 16 } end
  return ur.nn.EmbeddingBagCollection { tables = ts, placement = "managed", optimizer = { "sgd", lr = 0.05 },
                                        seed = 3 }
end
local runs = {}
for _, policy in ipairs { "hot_prefix", "adaptive" } do
  local ebc = collection()
  local m = hints.manager(ebc, { policy = policy, every = o.every, allowance = o.allowance, decay = o.decay })
  m:start()
  runs[#runs + 1] = { policy = policy, ebc = ebc, m = m, hits = 0, lookups = 0, swapped = 0, swap_s = 0,
                      intervals = {} }
end

-- The lookups of a batch's ids that read a row in the prefix (physical row < hot rows), per run.
local function covered(run, kjt)
  local tbe = run.ebc.tbe
  local hits, total = 0, 0
  for i, name in ipairs(names) do
    local k = 0
    for _, t in ipairs(run.m.tables) do
      if t.name == name then k = t.k end
    end
    local perm = tbe:permutation(name)
    local pp = perm and ffi.cast("int64_t *", C.ur_tensor_data(perm.p))
    local b0, b1, v0, v1 = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
    assert(C.ur_kjt_key_span(kjt.p, i - 1, b0, b1, v0, v1) == 0)
    local vals = kjt:values()
    local q = ffi.cast("int64_t *", C.ur_tensor_data(vals.p))
    for j = tonumber(v0[0]), tonumber(v1[0]) - 1 do
      local id = q[j]
      local phys = pp and pp[id] or id
      if phys < k then hits = hits + 1 end
    end
    total = total + tonumber(v1[0] - v0[0])
    vals:free()
    if perm then perm:free() end
  end
  return hits, total
end

local loader = assert(ur.data.loader { data = { kind = "synthetic", spec = spec }, samples = samples,
                                       batch_size = o.batch })
local step = 0
print(("drift %.4g ranks a sample (the hot set moves %s over %s); %s of %s, allowance %s")
  :format(drift, things(math.floor(drift * samples), "rank"), things(samples, "sample"), things(o.tables, "table"),
    things(o.rows, "row"), o.allowance))
print(("%6s %10s %14s %14s %12s %12s"):format("step", "shift", "hot_prefix", "adaptive", "swapped rows",
  "swap s"))
for b in loader:batches() do
  step = step + 1
  local outs = {}
  for i, run in ipairs(runs) do
    local h, n = covered(run, b.sparse)
    run.hits, run.lookups = run.hits + h, run.lookups + n
    local y = run.ebc:forward(b.sparse)
    outs[i] = y:totable()
    run.ebc:backward(b.sparse, y) -- a gradient of the output itself: training moves rows
    local before = run.m.relayout_bytes
    run.m:step(step)
    local last = run.m.intervals[#run.m.intervals]
    if last and last.step == step and run.m.relayout_bytes > before then
      run.swapped = run.swapped + last.rows_moved
      run.swap_s = run.swap_s + last.relayout_seconds
    end
  end
  -- the check: swaps and layouts move rows, never values
  for j = 1, #outs[1], 97 do
    assert(outs[1][j] == outs[2][j], "the two collections' outputs differ at step " .. step)
  end
  if step % o.every == 0 then
    local row = { step = step, shift = math.floor(drift * step * o.batch) }
    for _, run in ipairs(runs) do
      row[run.policy] = run.lookups > 0 and run.hits / run.lookups or 0
      run.hits, run.lookups = 0, 0
    end
    row.swapped, row.swap_seconds = runs[2].swapped, runs[2].swap_s
    runs[2].swapped, runs[2].swap_s = 0, 0
    print(("%6d %10d %14.3f %14.3f %12d %12.4f"):format(row.step, row.shift, row.hot_prefix, row.adaptive,
      row.swapped, row.swap_seconds))
    if o.out then
      row.bench = "drift"
      json.append_lines(o.out, row)
    end
    runs[1].intervals[#runs[1].intervals + 1] = row
  end
end
loader:close()
-- the last quarter of the run: adaptive keeps its coverage, hot_prefix's has decayed
local rows = runs[1].intervals
local q = math.max(1, math.floor(#rows * 3 / 4))
local hp, ad = 0, 0
for i = q, #rows do hp, ad = hp + rows[i].hot_prefix, ad + rows[i].adaptive end
hp, ad = hp / (#rows - q + 1), ad / (#rows - q + 1)
print(("last quarter: coverage hot_prefix %.3f, adaptive %.3f (first interval %.3f / %.3f)"):format(hp, ad,
  rows[1].hot_prefix, rows[1].adaptive))
