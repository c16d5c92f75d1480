-- Run by spec/dist/train_spec.lua as every rank of `uvmrec launch -n W`: a config's DLRM
-- (dlrm_tiny unless CONFIG says) trained with its tables sharded by a plan and its dense part
-- data-parallel, each rank on its slice of every global batch, while rank 0 also trains the
-- one-process model on the whole global batches (the reference).  Rank 0 checks after the
-- first step that every table row equals the reference's bit for bit (EXACT=0: within 1e-4
-- relative, for values near 0 of 1e-2; ROWS_TOL=x: within x so), that every step's loss (the
-- global batch's) is within TOL (1e-5) relative of the reference's, and at the end that the
-- AUC over the ranks (metrics with world_size) on held-out samples is within 1e-3 of the
-- reference's.
-- Environment: PLAN (a kind, or "mixed": the four kinds in turn), STEPS, SETS (--set's, comma-
-- separated), CONFIG, EXACT, ROWS_TOL, TOL, GPU=1 (rank r on GPU r, collectives through NCCL; scripts/
-- bench/dist_gpu.sh).  Rank 0 prints each step's losses, "auc A B" and the worst loss
-- difference; every rank "rank R: ok".
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local train = require "uvmrec.train"
local metrics = require "uvmrec.metrics"

local gpu = os.getenv("GPU") == "1"
assert(dist.init { cpu = not gpu })
local rank, world = dist.rank(), dist.world()
local sets = {}
for s in (os.getenv("SETS") or ""):gmatch("[^,]+") do sets[#sets + 1] = s end
local cfg = assert(train.config.load(assert(train.find_config(os.getenv("CONFIG") or "dlrm_tiny")), sets))
local steps = tonumber(os.getenv("STEPS") or "3")
local LOSS_TOL = tonumber(os.getenv("TOL") or "1e-5")
local worst = 0
local plan = os.getenv("PLAN") or "table_wise"
if plan == "mixed" then plan = require("uvmrec.dist.plan").in_turn(#cfg.embeddings.rows) end
local B = cfg.train.batch_size
local def = assert(train.model_def(cfg))
local model = assert(def.build(cfg, { cpu = not gpu, sharding = plan }))
local opt = train.optimizer(cfg, model)
local ref, ref_opt
if rank == 0 then
  ref = assert(def.build(cfg, { cpu = not gpu }))
  ref_opt = train.optimizer(cfg, ref)
end

local n = steps * B
local data = { data = cfg.data.train, samples = n, batch_size = B }
local whole = rank == 0 and assert(ur.data.loader(data))
local sliced = { data = cfg.data.train, samples = n, batch_size = B, slice_rank = rank, slice_world = world }
local mine = assert(ur.data.loader(sliced))

local function fail(fmt, ...) error(("rank %d: " .. fmt):format(rank, ...), 0) end

local function rows_equal(step, tol)
  for i = 1, #cfg.embeddings.rows do
    local name = "C" .. i
    local got = model.embeddings:full_table(name):totable()
    if ref then
      local want = ref.embeddings:table(name):totable()
      for k = 1, #want do
        if math.abs(got[k] - want[k]) > tol * math.max(math.abs(want[k]), 1e-2) or (tol == 0 and got[k] ~= want[k]) then
          fail("after step %d table %s element %d is %.9g, the one-process run's %.9g", step, name, k - 1, got[k],
               want[k])
        end
      end
    end
  end
end

-- on a GPU, batches go to the device (the loader's are pinned host memory)
local function on(b) return gpu and b:to("device") or b end

for step = 1, steps do
  local ld = train.loop.step(model, opt, on(mine:next())):get(0)
  if ref then
    local lr = train.loop.step(ref, ref_opt, on(whole:next())):get(0)
    if math.abs(ld - lr) > LOSS_TOL * math.abs(lr) then
      fail("step %d loss %.9g, the one-process run's %.9g", step, ld, lr)
    end
    worst = math.max(worst, math.abs(ld - lr) / math.abs(lr))
    print(("step %d loss %.7f %.7f"):format(step, ld, lr))
  end
  if step == 1 then
    rows_equal(step, tonumber(os.getenv("ROWS_TOL") or "") or (os.getenv("EXACT") == "0" and 1e-4 or 0))
  end
end

-- AUC on the 4 global batches after the training samples, over the ranks
local eval = { data = cfg.data.train, samples = n + 4 * B, batch_size = B, position = { epoch = 0, sample = n },
               slice_rank = rank, slice_world = world }
local held = assert(ur.data.loader(eval))
local auc = metrics.AUC { batch_size = math.ceil(B / world), window_size = 4 * B, world_size = world, rank = rank }
for hb in held:batches() do
  local b = on(hb)
  auc:update { predictions = model:predict(b), labels = b.labels }
end
local a = auc:values().default.window.auc
if ref then
  eval.slice_rank, eval.slice_world = nil, nil
  local ra = metrics.AUC { batch_size = B, window_size = 4 * B }
  for hb in assert(ur.data.loader(eval)):batches() do
    local b = on(hb)
    ra:update { predictions = ref:predict(b), labels = b.labels }
  end
  local r = ra:values().default.window.auc
  if math.abs(a - r) > 1e-3 then fail("AUC %.6f over the ranks, the one-process run's %.6f", a, r) end
  print(("auc %.7f %.7f"):format(a, r))
  print(("worst loss difference %.3g relative"):format(worst))
end
print(("rank %d: ok"):format(rank))
