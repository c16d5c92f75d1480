-- VBE over ranks (uvmrec.dist.sharded's set_vbe): the bytes the embeddings' input exchange
-- sends with and without, on Zipf data, and the outputs and tables of both.  Run as every rank:
--   uvmrec launch -n 4 scripts/bench/dist_vbe.lua [--data synthetic:tiny] [--batch 4096] [--steps 4]
--     [--plan mixed|table_wise|row_wise|column_wise|data_parallel]
-- The same sharded dlrm_tiny embeddings twice (VBE off, on), trained on the same global batches
-- (each rank its slice) with the same gradients.  Rank 0 prints per step the input exchange's
-- bytes sent to other ranks (summed over the ranks) both ways and their ratio, whether this
-- step's outputs are equal bit for bit, and the largest difference of any table element after
-- it; at the end "vbe: ... bytes off, ... on, factor F".
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local train = require "uvmrec.train"

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/dist_vbe.lua", summary = "bytes of the sharded input exchange with and without VBE",
  { "--data SPEC", "synthetic data (Zipf ids)", default = "synthetic:tiny", key = "data" },
  { "--batch N", "the global batch", type = "whole", default = 4096, key = "batch" },
  { "--steps N", "steps", type = "whole", default = 4, key = "steps" },
  { "--plan KIND", "mixed, or a kind for every table", default = "mixed", key = "plan" },
}
local o = cmd:parse(arg)

assert(dist.init { cpu = true })
local comm = dist.job()
local rank, world = comm.rank, comm.world
local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")),
  { require("uvmrec.lib").flag_set("--batch", "train.batch_size", o.batch), "embeddings.optimizer.name=adagrad" }))
local plan = o.plan
if plan == "mixed" then plan = require("uvmrec.dist.plan").in_turn(#cfg.embeddings.rows) end
local def = assert(train.model_def(cfg))
local m1 = assert(def.build(cfg, { cpu = true, sharding = plan }))
local m2 = assert(def.build(cfg, { cpu = true, sharding = plan }))
local e1, e2 = m1.embeddings, m2.embeddings:set_vbe(true)
local B = o.batch / world
local data = assert(ur.data.loader { data = o.data, samples = o.steps * o.batch, batch_size = o.batch,
                                     slice_rank = rank, slice_world = world })

local sums = ur.tensor({ 2 }, { dtype = "f64" })
local function exchanged(e, kjt)
  comm:reset_stats()
  local glob = e:_exchange(kjt)
  local sent = comm:stats().bytes_sent
  glob:free()
  return sent
end

local total = { 0, 0 }
local step = 0
for batch in data:batches() do
  step = step + 1
  local kjt = batch.sparse
  local b1, b2 = exchanged(e1, kjt), exchanged(e2, kjt)
  sums:set(0, b1)
  sums:set(1, b2)
  assert(comm:all_reduce(sums))
  assert(comm:wait())
  local off, on = sums:get(0), sums:get(1)
  total[1], total[2] = total[1] + off, total[2] + on
  local y1, y2 = e1:forward(kjt), e2:forward(kjt)
  local a, b = y1:totable(), y2:totable()
  local same = #a == #b
  for i = 1, #a do same = same and a[i] == b[i] end
  local flag = ur.tensor({ 1 }, { dtype = "i32" })
  flag:set(0, same and 0 or 1)
  assert(comm:all_reduce(flag, "max"))
  assert(comm:wait())
  local g = ur.tensor({ B, e1.out_dim }):uniform(-1, 1, step * 131 + rank)
  e1:backward(kjt, g)
  e2:backward(kjt, g)
  local worst = 0
  for i = 1, #cfg.embeddings.rows do
    local x, y = e1:full_table("C" .. i):totable(), e2:full_table("C" .. i):totable()
    for j = 1, #x do worst = math.max(worst, math.abs(x[j] - y[j]) / math.max(math.abs(x[j]), 1e-2)) end
  end
  if rank == 0 then
    print(("step %d input exchange %d bytes off, %d on (%.2fx); outputs %s; tables within %.3g relative"):format(
      step, off, on, off / on, flag:get(0) == 0 and "equal" or "differ", worst))
  end
end
if rank == 0 then
  print(("vbe: %d ranks, global batch %d, %s, plan %s: %d bytes off, %d on, factor %.2f"):format(world, o.batch,
    o.data, o.plan, total[1], total[2], total[1] / total[2]))
end
print(("rank %d: ok"):format(rank))
