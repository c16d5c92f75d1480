-- Run by spec/dist/faults_spec.lua as every rank of `uvmrec launch -n W`: dlrm_tiny with its
-- tables sharded (row-wise, C3 table-wise) and its dense part data-parallel, trained by
-- uvmrec.train.loop.run with the signals hook (SIGINT and SIGTERM stop the run at a step
-- boundary the ranks agree on), and a fault injected on one rank in the middle of a step
-- (after the embeddings' forward, before their backward).
-- Environment: FAULT (kill: SIGKILL to itself; error: a Lua error; oom: a 4 TiB host tensor;
-- hang: sleeps 600 s), FAULT_RANK (1), FAULT_STEP (3), STEPS (8), SLOW (seconds to sleep after
-- each step), OUT (a folder: at the end or on an interrupt, the sharded tables through
-- uvmrec.dist.checkpoint in OUT/shards and, from rank 0, the dense parameters and optimizer
-- state in OUT/dense.safetensors), IN (such a folder to resume from).  Rank 0 prints "step S
-- loss L" (%a, exact); an interrupted run prints "stopped at step S by SIGINT" on every rank
-- and exits 130; each rank ends with "rank R: ok".
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local train = require "uvmrec.train"
local hooks = require "uvmrec.train.hooks"
local dck = require "uvmrec.dist.checkpoint"
local ck = require "uvmrec.checkpoint"
local ffi = require "ffi"
ffi.cdef [[ int kill(int, int); int getpid(void); int usleep(unsigned int); ]]

assert(dist.init { cpu = true })
local rank, world = dist.rank(), dist.world()
local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), { "train.batch_size=240" }))
local B = cfg.train.batch_size
local def = assert(train.model_def(cfg))
local model = assert(def.build(cfg, { cpu = true, sharding = { default = "row_wise", C3 = "table_wise" } }))
local opt = train.optimizer(cfg, model)
local steps = tonumber(os.getenv("STEPS") or "8")
local fault, fault_rank = os.getenv("FAULT"), tonumber(os.getenv("FAULT_RANK") or "1")
local fault_step, slow = tonumber(os.getenv("FAULT_STEP") or "3"), tonumber(os.getenv("SLOW") or "0")

-- The dense parameters and the dense optimizer's state, by name.
local function dense_state()
  local ts = {}
  for i, p in ipairs(opt.params) do
    ts[p.name] = p.tensor
    if opt.state1[i] then ts[p.name .. ".state1"] = opt.state1[i] end
    if opt.state2[i] then ts[p.name .. ".state2"] = opt.state2[i] end
  end
  return ts
end

local start = 0
local IN, OUT = os.getenv("IN") or "", os.getenv("OUT") or ""
if IN ~= "" then
  local m = assert(dck.load(IN .. "/shards", model.embeddings))
  local f = assert(ck.open(IN .. "/dense.safetensors"))
  assert(f:load(dense_state()))
  opt.step_count = tonumber(f:meta("optimizer_step"))
  f:close()
  start = m.step
end

local step = start
local forward = model.embeddings.updateOutput
model.embeddings.updateOutput = function(self, input)
  local out = forward(self, input)
  if fault and rank == fault_rank and step + 1 == fault_step then
    io.stdout:flush()
    if fault == "kill" then ffi.C.kill(ffi.C.getpid(), 9) end
    if fault == "error" then error("an injected failure in step " .. fault_step) end
    if fault == "oom" then assert(ur.tensor({ 2 ^ 40 })) end
    if fault == "hang" then os.execute("sleep 600") end
  end
  return out
end

local data = assert(ur.data.loader { data = cfg.data.train, samples = steps * B, batch_size = B,
                                     position = { epoch = 0, sample = start * B },
                                     slice_rank = rank, slice_world = world })
local log = {
  start = function(_, run) run.step = start end,
  after = function(_, run)
    step = run.step
    if rank == 0 then print(("step %d loss %a"):format(run.step, run.loss:get(0))) end
    if slow > 0 then ffi.C.usleep(slow * 1e6) end -- not os.execute: system() ignores SIGINT meanwhile
  end,
}
local run = train.loop.run(model, opt, data, { log, hooks.signals(true) })

if OUT ~= "" and (run.interrupted or run.step == steps) then
  if rank == 0 then
    local lib = require "uvmrec.lib"
    assert(lib.check(lib.C.ur_dir_create(OUT)))
    local meta = { optimizer_step = opt.step_count }
    assert(ck.save(OUT .. "/dense.safetensors", { tensors = dense_state(), meta = meta }))
  end
  assert(dck.save(OUT .. "/shards", model.embeddings))
end
if run.interrupted then
  print(("stopped at step %d by %s"):format(run.step, run.interrupted.name))
  os.exit(130)
end
print(("rank %d: ok"):format(rank))
