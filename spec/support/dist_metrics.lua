-- Run by spec/dist/metrics_spec.lua as every rank of `uvmrec launch -n W`: a MetricCollection
-- over the ranks (world_size, rank; my_rank for GroupedAUC) fed each rank's share of 4 batches,
-- against the same metrics of one process fed every batch whole (computed here too).  Prints
-- "rank R: ok" and rank 0 the values.
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local metrics = require "uvmrec.metrics"

assert(dist.init { cpu = true })
local rank, world = dist.rank(), dist.world()
local B = 24 * world
local kinds = { "auc", "gauc", "ne", "accuracy", "calibration", "ctr" }
local opts = { metrics = kinds, tasks = { "click", "like" }, batch_size = B, window_size = 8 * B,
               include_logloss = true }
local one = metrics.MetricCollection(opts)
opts.batch_size, opts.world_size, opts.rank = B / world, world, rank
local ranks = metrics.MetricCollection(opts)
local g = metrics.GroupedAUC { batch_size = B / world, world_size = world, my_rank = rank }
local g1 = metrics.GroupedAUC { batch_size = B }

for step = 1, 4 do
  local p = ur.tensor({ B, 2 }):uniform(0, 1, step)
  local noise = ur.tensor({ B, 2 }):uniform(-0.4, 0.4, 100 + step)
  local y, w, keys = ur.tensor({ B, 2 }), ur.tensor({ B }), ur.tensor({ B }, { dtype = "i64" })
  for i = 0, 2 * B - 1 do y[i] = p[i] + noise[i] > 0.5 and 1 or 0 end
  for i = 0, B - 1 do
    w[i] = 0.5 + (i % 3) / 4
    keys[i] = (i * 7 + step) % 5
  end
  one:update { predictions = p, labels = y, weights = w, grouping_keys = keys }
  local p1, y1 = ur.tensor({ B }):uniform(0, 1, 50 + step), ur.tensor({ B })
  for i = 0, B - 1 do y1[i] = p1[i] + noise[i] > 0.5 and 1 or 0 end
  g1:update { predictions = p1, labels = y1, grouping_keys = keys }
  local b0, n = rank * B / world, B / world
  local pv, yv, wv, kv = p:view(b0, n), y:view(b0, n), w:view(b0, n), keys:view(b0, n)
  ranks:update { predictions = pv, labels = yv, weights = wv, grouping_keys = kv }
  g:update { predictions = p1:view(b0, n), labels = y1:view(b0, n), grouping_keys = kv }
end

local a, b = one:compute(), ranks:compute()
for k, v in pairs(a) do
  local tol = k:match("lifetime_auc") and 0 or 1e-6
  if b[k] == nil or math.abs(b[k] - v) > tol * math.max(1, math.abs(v)) then
    error(("rank %d: %s is %s over the ranks, %.12g in one process"):format(rank, k, tostring(b[k]), v), 0)
  end
end
local ga, gb = g1:compute(), g:compute()
assert(math.abs(ga["gauc-default|window_gauc"] - gb["gauc-default|window_gauc"]) < 1e-9, "grouped AUC")
if rank == 0 then print(("auc %.9f gauc %.9f ne %.9f"):format(b["auc-click|window_auc"], gb["gauc-default|window_gauc"],
  b["ne-like|lifetime_ne"])) end
print(("rank %d: ok"):format(rank))
