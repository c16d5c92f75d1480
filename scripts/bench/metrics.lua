-- Metrics benchmark: update throughput (samples/s, and input bytes read per second) and the
-- time of compute() (the window's sorts, the lifetime histogram) on the GPU when one is in use,
-- else on the CPU.  Results are checked first: the backend in use against the CPU reference on
-- the same data.  Prints a table and one JSON line per row.
--   luajit scripts/bench/metrics.lua [BATCH] [WINDOW]   (--help)
local ur = require "uvmrec"
local metrics = require "uvmrec.metrics"
local json = require "uvmrec.json"

local o = require("uvmrec.cli").command {
  name = "scripts/bench/metrics.lua",
  summary = "metrics benchmark: update throughput and compute() time, checked against the CPU reference",
  { "[BATCH]", "samples an update", type = "whole", default = 65536 },
  { "[WINDOW]", "samples in the window", type = "whole", default = 1048576 },
}:parse(arg)
local batch, window = o.batch, o.window
local gpu = ur.gpu()
local place = gpu and "device" or "host"
local reps = gpu and 50 or 5

local function data(n, T, seed)
  local p = ur.tensor({ n, T }):uniform(0, 1, seed)
  local y = ur.tensor({ n, T }):uniform(0, 1, seed + 1) -- soft labels: no class is empty
  local w = ur.tensor({ n }):uniform(0.5, 2, seed + 2)
  local g = ur.tensor({ n }, { dtype = "i64" }):uniform(0, math.max(1, math.floor(n / 20)), seed + 3)
  if gpu then p, y, w, g = p:to("device"), y:to("device"), w:to("device"), g:to("device") end
  return { p, y, w, g }
end

-- The backend in use against the CPU on the same samples, every value of both scopes.
local function check(kinds, T)
  if not gpu then return "cpu is the reference" end
  local n = 20000
  local host = { ur.tensor({ n, T }):uniform(0, 1, 91), ur.tensor({ n, T }):uniform(0, 1, 92),
                 ur.tensor({ n }):uniform(0.5, 2, 93), ur.tensor({ n }, { dtype = "i64" }):uniform(0, 500, 94) }
  local dev = {}
  for i, t in ipairs(host) do dev[i] = t:to("device") end
  local opts = { metrics = kinds, tasks = {}, batch_size = n, window_size = n, placement = "host" }
  for t = 1, T do opts.tasks[t] = "t" .. t end
  local a = metrics.MetricCollection(opts)
  opts.placement = "device"
  local b = metrics.MetricCollection(opts)
  assert(a:update(host))
  assert(b:update(dev))
  local va, vb = assert(a:values()), assert(b:values())
  for task, scopes in pairs(va) do
    for scope, vals in pairs(scopes) do
      for k, v in pairs(vals) do
        local got = vb[task][scope][k]
        if math.abs(got - v) > 1e-9 * math.max(1, math.abs(v)) then
          error(("parity: %s %s %s is %.17g on the GPU, %.17g on the CPU"):format(task, scope, k, got, v))
        end
      end
    end
  end
  return "gpu = cpu on 20000 samples"
end

local rows = {}
local function row(r)
  rows[#rows + 1] = r
  io.stderr:write(json.encode(r), "\n")
end

local streams = require "uvmrec.stream"
local stream = gpu and assert(ur.stream()) or nil
for _, case in ipairs {
  { name = "auc+ne+acc+cal+ctr", kinds = { "auc", "ne", "accuracy", "calibration", "ctr" }, T = 1 },
  { name = "same, 3 tasks", kinds = { "auc", "ne", "accuracy", "calibration", "ctr" }, T = 3 },
  { name = "+ grouped auc", kinds = { "auc", "gauc", "ne" }, T = 1 },
  { name = "ne only, no window", kinds = { "ne" }, T = 1, window = 0 },
} do
  local verdict = check(case.kinds, case.T)
  local opts = { metrics = case.kinds, tasks = {}, batch_size = batch,
                 window_size = case.window or window, placement = place }
  for t = 1, case.T do opts.tasks[t] = "t" .. t end
  local m = metrics.MetricCollection(opts)
  local d = data(batch, case.T, 7)
  d.stream = stream
  for _ = 1, 3 do assert(m:update(d)) end -- warm-up, and enough to fill part of the window
  local per = streams.median_ms(function() for _ = 1, 10 do assert(m:update(d)) end end, reps, stream) / 10
  local fill = math.ceil((case.window or window) / batch)
  for _ = 1, fill do assert(m:update(d)) end
  local cms = streams.median_ms(function() assert(m:compute(stream)) end, gpu and 10 or 3, stream)
  local bytes = batch * case.T * 8 + batch * 4 + (case.kinds[2] == "gauc" and batch * 8 or 0)
  row { case = case.name, tasks = case.T, batch = batch, window = case.window or window,
        update_ms = per, samples_per_s = batch / per * 1e3, input_gbps = bytes / per / 1e6,
        compute_ms = cms, check = verdict, backend = gpu and "cuda" or "cpu" }
end

print(("%-20s %5s %8s %9s %10s %14s %10s %11s  %s"):format("case", "tasks", "batch", "window",
  "update ms", "samples/s", "GB/s in", "compute ms", "check"))
for _, r in ipairs(rows) do
  print(("%-20s %5d %8d %9d %10.4f %14.4g %10.2f %11.3f  %s"):format(r.case, r.tasks, r.batch, r.window,
    r.update_ms, r.samples_per_s, r.input_gbps, r.compute_ms, r.check))
end
