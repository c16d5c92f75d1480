-- BENCH.md B9: training steps of a sharded DLRM over the ranks of a job, as every rank of
-- `uvmrec launch -n W scripts/bench/dist.lua ...` (or one process: W = 1, tables unsharded).
-- Each rank trains on its slice of global batches of --per-rank x W samples; rank 0 prints, per
-- step after the warm-up, the time, the samples/s of the whole job, and the collectives' calls,
-- bytes (this rank's payload for other ranks and from them) and host seconds, then a summary line,
-- and appends it as JSON to --out.  On a GPU the steps are timed with a device synchronisation at
-- each end; batches rotate over --batches held on the device.
--
--   uvmrec launch -n 2 scripts/bench/dist.lua --config dlrm_mlperf_v1_2m --per-rank 65536 \
--     --sharding table_wise --steps 20 --out build/bench/dist_gpu.jsonl
--   uvmrec launch -n 2 scripts/bench/dist.lua --cpu --steps 5      (dlrm_tiny, ranks on the CPU)
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local train = require "uvmrec.train"
local json = require "uvmrec.json"
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/dist.lua",
  summary = "B9: samples/s of sharded DLRM training steps over the ranks, with the collectives' bytes and time",
  options.config,
  options.set,
  { "--per-rank B", "samples per rank and step (the global batch is B x ranks; default: the config's batch "
    .. "on the GPU, 1024 on the CPU)", type = "whole", key = "per_rank" },
  { "--sharding S", "the plan: table_wise, row_wise, column_wise, data_parallel or mixed (the four in turn)",
    default = "table_wise", choices = { "table_wise", "row_wise", "column_wise", "data_parallel", "mixed" } },
  { "--steps N", "timed steps", type = "whole", default = 20 },
  { "--warmup N", "steps before the timed ones", type = "whole", default = 3 },
  { "--batches N", "distinct batches the steps rotate over", type = "whole", default = 4 },
  { "--out FILE", "append the summary as a JSON line (rank 0)" },
  options.cpu,
}
local o = cmd:parse(arg)
local comm = assert(dist.init { cpu = o.cpu })
local rank, world = dist.rank(), dist.world()
local gpu, config = require("uvmrec.cli").bench_config(o)
local sets = { unpack(o.set) }
local file = assert(train.find_config(config))
local probe = assert(train.config.load(file, sets))
local per = o.per_rank or (gpu and probe.train.batch_size or 1024)
sets[#sets + 1] = "train.batch_size=" .. per * world
local cfg = assert(train.config.load(file, sets))
local plan = o.sharding
if plan == "mixed" then plan = require("uvmrec.dist.plan").in_turn(#cfg.embeddings.rows) end
local def = assert(train.model_def(cfg, file))
local model = assert(def.build(cfg, { cpu = o.cpu, sharding = world > 1 and plan or nil }))
local optimizer = train.optimizer(cfg, model)

local B = per * world
-- the config's data as uvmrec train reads it (synthetic ids within the capped tables' rows)
local lo = assert(train.data(cfg, train.config.table_rows(cfg))).train
lo.samples, lo.batch_size, lo.slice_rank, lo.slice_world = o.batches * B, B, rank, world
local data = assert(ur.data.loader(lo))
local held = train.source.hold(data, o.batches, gpu and "device" or nil)
local function say(s) if rank == 0 then io.stdout:write(s, "\n") io.stdout:flush() end end
say(("B9: %s on %s (%s), %d samples a rank and step (global batch %d), sharding %s")
  :format(cfg.name or o.config, require("uvmrec.lib").things(world, "rank"),
    gpu and "GPUs" or "the CPU", per, B, o.sharding))

local clock = ur.C.ur_clock_seconds
for i = 1, o.warmup do train.loop.step(model, optimizer, held[(i - 1) % #held + 1]) end
-- column-wise tables under rowwise Adagrad: the host time of the row sums' half-step and all-reduce
local rsums = world > 1 and model.embeddings.row_sums or nil
local rs0, rr0 = rsums and rsums.seconds or 0, rsums and rsums.reduce_seconds or 0
if gpu then assert(ur.sync()) end
comm:barrier()
local stats0 = comm:stats()
local t0, times = clock(), {}
say(("%5s %10s %14s %8s %14s %14s %10s"):format("step", "ms", "samples/s", "calls", "bytes sent", "bytes recv",
  "comm ms"))
local prev = stats0
for i = 1, o.steps do
  local s0 = clock()
  train.loop.step(model, optimizer, held[(i - 1) % #held + 1])
  if gpu then assert(ur.sync()) end
  local ms = (clock() - s0) * 1e3
  times[i] = ms
  local st = comm:stats()
  say(("%5d %10.2f %14.0f %8d %14d %14d %10.2f"):format(i, ms, B / ms * 1e3, st.calls - prev.calls,
    st.bytes_sent - prev.bytes_sent, st.bytes_received - prev.bytes_received, (st.seconds - prev.seconds) * 1e3))
  prev = st
end
local total = clock() - t0
local st = comm:stats()
table.sort(times)
local r = {
  bench = "B9", config = cfg.name or o.config, ranks = world, gpu = gpu, sharding = o.sharding,
  per_rank = per, global_batch = B, steps = o.steps, seconds = total,
  samples_per_s = B * o.steps / total, step_ms_median = times[math.ceil(#times / 2)],
  comm_calls_per_step = (st.calls - stats0.calls) / o.steps,
  comm_bytes_sent_per_step = (st.bytes_sent - stats0.bytes_sent) / o.steps,
  comm_bytes_received_per_step = (st.bytes_received - stats0.bytes_received) / o.steps,
  comm_ms_per_step = (st.seconds - stats0.seconds) * 1e3 / o.steps,
  engines = comm:engines(),
  row_sums_ms_per_step = rsums and (rsums.seconds - rs0) * 1e3 / o.steps or nil,
  row_sums_reduce_ms_per_step = rsums and (rsums.reduce_seconds - rr0) * 1e3 / o.steps or nil,
}
say(("B9: %.0f samples/s (median step %.2f ms); per step and rank %.1f collectives, %s sent, %s received, "
  .. "%.2f ms in them (host)"):format(r.samples_per_s, r.step_ms_median, r.comm_calls_per_step,
  train.progress.bytes(r.comm_bytes_sent_per_step), train.progress.bytes(r.comm_bytes_received_per_step),
  r.comm_ms_per_step))
if rsums then
  say(("B9: the row sums of %d column-sharded tables (rowwise Adagrad): %.2f ms a step (host), %.2f ms of it in "
    .. "one all-reduce of %s"):format(#rsums.tables, r.row_sums_ms_per_step, r.row_sums_reduce_ms_per_step,
    train.progress.bytes(rsums.total * 4)))
end
if rank == 0 and o.out then json.append_lines(o.out, r) end
