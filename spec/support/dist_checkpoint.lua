-- Run by spec/dist/checkpoint_spec.lua as every rank of `uvmrec launch -n W` (or as one
-- process): a sharded embedding collection (uvmrec.dist.shard) of four tables, multi-hot
-- weighted bags, trained by its fused optimizer on a fixed global batch of 24 samples per
-- step (rank r takes samples [r * 24 / W, (r + 1) * 24 / W)), loading and saving sharded
-- checkpoints (uvmrec.dist.checkpoint).
-- Environment: PLAN (a name below), OPT (the tables' optimizer, adam by default), IN (a
-- checkpoint folder to load first: training goes on from its step), COUNT=1 (every shard
-- counts its accesses, hints' counters), RELAYOUT=1 (every shard laid out hottest first by its
-- counts before the save), STEPS (train up to this step), OUT (a folder to save into at the
-- end; APART=1: a folder a rank, below).  Each step prints "step S out X" with the exact sum of
-- this rank's output (%a) on every rank; each rank ends with "rank R: ok".
-- Required as a module (require "dist_checkpoint"), it runs nothing and returns the
-- collection's options, the plans and batch(step, rank, world), which the spec builds its
-- one-process collections and references from.
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local dck = require "uvmrec.dist.checkpoint"

local M = {}
M.opts = function(optimizer)
  return { tables = { { name = "a", rows = 103, dim = 16, features = { "f", "g" } },
                      { name = "b", rows = 7, dim = 8, dtype = "f16" },
                      { name = "c", rows = 30, dim = 12 },
                      { name = "d", rows = 3, dim = 8 } },
           optimizer = { optimizer or "adam", lr = 0.05 }, device = "cpu", seed = 5 }
end
M.plans = {
  mixed4 = { a = "row_wise", b = "data_parallel", c = "column_wise", d = "row_wise" },
  mixed2 = { a = "column_wise", b = "row_wise", c = "table_wise", d = "data_parallel" },
  table_wise = "table_wise", row_wise = "row_wise", column_wise = "column_wise",
}
local GB = 24

-- helpers.lua beside this file (spec/run.lua puts this folder on the path; a rank does it here).
package.path = debug.getinfo(1, "S").source:match("^@(.-)[^/]*$") .. "?.lua;" .. package.path
local rng = require("helpers").rng

-- The global batch of a step, rank me's samples of it in a world of W.
function M.batch(step, me, W)
  local r = rng(step * 7919)
  local rows = { f = 103, g = 103, b = 7, c = 30, d = 3 }
  local lo, hi = me * GB / W, (me + 1) * GB / W
  local values, lengths, weights = {}, {}, {}
  for _, key in ipairs { "f", "g", "b", "c", "d" } do
    for i = 0, GB - 1 do
      local len = r(4) - 1
      if i >= lo and i < hi then lengths[#lengths + 1] = len end
      for _ = 1, len do
        local v, w = r(rows[key]) - 1, r(8) / 8
        if i >= lo and i < hi then
          values[#values + 1] = v
          weights[#weights + 1] = w
        end
      end
    end
  end
  return ur.KJT { keys = { "f", "g", "b", "c", "d" }, values = values, lengths = lengths, weights = weights }
end
if (...) == "dist_checkpoint" then return M end

assert(dist.init { cpu = true })
local comm = dist.job()
local W, me = comm.world, comm.rank

local plan = M.plans[os.getenv("PLAN") or "mixed4"]
assert(plan, "PLAN: no plan named " .. tostring(os.getenv("PLAN")))
local ebc = dist.shard(M.opts(os.getenv("OPT")), plan, comm)
local start = 0
if os.getenv("IN") and os.getenv("IN") ~= "" then
  local m = assert(dck.load(os.getenv("IN"), ebc))
  start = m.step
  print(("loaded %s: %d ranks' checkpoint at step %d"):format(os.getenv("IN"), m.world, m.step))
end
if os.getenv("COUNT") == "1" then
  for _, c in ipairs(ebc.collections) do assert(c:set_counting(true)) end
end
for step = start + 1, tonumber(os.getenv("STEPS") or "2") do
  local kjt = M.batch(step, me, W)
  local out = ebc:forward(kjt)
  local sum = 0
  for _, x in ipairs(out:totable()) do sum = sum + x end
  print(("step %d out %a"):format(step, sum))
  local g = ur.tensor({ GB, out:size(2) }):uniform(-1, 1, step)
  local mine = ur.tensor({ GB / W, out:size(2) })
  assert(mine:copy(g:view(me * GB / W, GB / W)))
  ebc:backward(kjt, mine)
  kjt:free()
end
if os.getenv("RELAYOUT") == "1" then
  for _, b in ipairs(ebc:blocks()) do assert(b.collection:relayout(b.shard, "counts")) end
end
if os.getenv("OUT") and os.getenv("OUT") ~= "" then
  -- APART=1: each rank saves into a folder of its own (OUT-rank-R), as into a folder on each
  -- host's own disk
  local out = os.getenv("APART") == "1" and ("%s-rank-%d"):format(os.getenv("OUT"), me) or os.getenv("OUT")
  local m = assert(dck.save(out, ebc))
  if me == 0 then print(("saved %s: %d ranks, step %d"):format(os.getenv("OUT"), m.world, m.step)) end
end
print(("rank %d: ok"):format(me))
