-- UVM offload benchmark (issue #10, BENCH.md B4): DLRM training with `managed` embedding tables
-- steered by hint policies, against the same model with every table in HBM.
--
--   luajit scripts/bench/uvm.lua [--cpu] [--config NAME] [--set k=v]... [--batch B]
--                                [--fractions 5,10,20,50,100] [--policies host,hot_prefix,adaptive]
--                                [--steps S] [--warmup W] [--count C] [--none-steps N]
--                                [--out FILE.jsonl]   (--help)
--
-- On a GPU (default dlrm_mlperf_v1_2m, batch 65536, Zipf(1.05) ids scattered over the rows):
--   device       every table in HBM: the reference throughput (and the access counters' cost:
--                the same steps with counting off and on)
--   none         managed, no hints: the cost of the first N steps on fresh tables (time, bytes
--                migrated, GPU page faults from the CUPTI monitor), each step a new batch
--   host         managed, all rows preferred on the host, accessed by the GPU (nothing in HBM)
--   hot_prefix   managed, at each HBM allowance (a fraction of the tables' bytes): C counting
--   adaptive     steps, the policy's interval (relayout by counts, prefix placed), W warm-up
--                and S timed steps (adaptive re-ranks at S / 2, timed apart: its steps' ms/step
--                leave it out; the interval's seconds and rows swapped are given, and the step
--                with one interval spread over --every steps)
-- Every run trains the same steps on the same batches, so every run's losses must equal the
-- device run's bit for bit (placement and row layout change no number): it fails otherwise.
-- The HBM budget emulates the smaller GPU: set to what the run holds in HBM plus the
-- allowance, so what a policy places on the GPU is capped and counted; no ballast is allocated
-- and managed memory never exceeds the GPU's free memory.  JSON lines to --out, a table last.
-- --cpu: dlrm_tiny on the CPU backend (managed tables are host memory whose hints are recorded):
-- a smoke test of the whole flow, no migration measured.
local ur = require "uvmrec"
local train = require "uvmrec.train"
local streams = require "uvmrec.stream"
local hints = require "uvmrec.hints"
local json = require "uvmrec.json"
local table_options = require "uvmrec.table_options"

local C = ur.C
local options = require("uvmrec.cli").options
local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/uvm.lua",
  summary = "UVM offload benchmark (BENCH.md B4): managed tables steered by hint policies against all in HBM",
  { "--cpu", "dlrm_tiny on the CPU backend: a smoke test of the whole flow, no migration measured" },
  options.config,
  options.set,
  options.batch_size,
  { "--fractions F,...", "HBM allowances, in percent of the tables' bytes", type = "numbers",
    default = { 5, 10, 20, 50, 100 } },
  { "--policies P,...", "the hint policies (host, hot_prefix, adaptive, or a policy's .lua file)", type = "list",
    default = { "host", "hot_prefix", "adaptive" } },
  { "--steps S", "timed steps (default: 40 on a GPU, 6 on the CPU)", type = "whole" },
  { "--warmup W", "warm-up steps (default: 4 on a GPU, 2 on the CPU)", type = "whole" },
  { "--count C", "counting steps before a policy places rows (default: 16 on a GPU, 4 on the CPU)",
    type = "whole" },
  { "--none-steps N", "steps of the run without hints, 0 for none (default: 200 on a GPU, 8 on the CPU)",
    type = "whole" },
  { "--every N", "steps between adaptive's intervals, to spread the interval's time over (the manager's default)",
    type = "whole", default = hints.EVERY },
  { "--far-rows N,...", "room for copies of the far rows a forward reads (embeddings.far_rows): each managed "
    .. "run once per value", type = "numbers", default = { 0 } },
  { "--parts", "the tables' forward and backward, each other module's and the optimizer's step timed apart in the "
    .. "timed steps (events on the step's stream: what the step spends in each, and between them)" },
  { "--far-early", "each run with room for far rows' copies once more with early copies (the next batch's far "
    .. "rows copied while a step computes: uvmrec.train.hooks.far_early)" },
  { "--far-behind", "each run with early copies once more with the copies written home behind the step "
    .. "(embeddings.far_behind)" },
  { "--far-dma W,...", "the last run with early copies (written behind with --far-behind) once more per value, "
    .. "those moves of its far rows through the copy engines and host threads instead of copy kernels: home, early "
    .. "or both (embeddings.far_dma)", type = "list" },
  { "--far-early-after P,...", "each run with early copies written behind (and each --far-dma way's) once more "
    .. "per part of the step (train.loop.parts' names, such as top_backward), the early copies started when that "
    .. "part ends instead of after the tables' forward: what they slow where they run (their median time is "
    .. "printed)", type = "list" },
  { "--no-monitor", "no migration monitor: CUPTI's activity records left to another tool (a kernel timeline, "
    .. "scripts/bench/ktrace.c); migration is not measured" },
  options.out_append,
}
local o = cmd:parse(arg)
local gpu
gpu, o.config = require("uvmrec.cli").bench_config(o)
o.steps = o.steps or (gpu and 40 or 6)
o.warmup = o.warmup or (gpu and 4 or 2)
o.count = o.count or (gpu and 16 or 4)
o.none_steps = o.none_steps or (gpu and 200 or 8)
local NB = gpu and 8 or 4 -- batches the timed steps rotate over

-- --far-early-after's parts: train.loop.parts' names
local part_names = train.loop.part_names()
for _, name in ipairs(o.far_early_after or {}) do
  local known = false
  for _, n in ipairs(part_names) do known = known or n == name end
  if not known then
    cmd:misuse(("--far-early-after: '%s' is no part of the step; expected one of %s"):format(name,
      table.concat(part_names, ", ")))
  end
end
for _, w in ipairs(o.far_dma or {}) do
  if not table_options.FAR_DMA[w] or w == "none" then
    cmd:misuse(("--far-dma: '%s'; expected home, early or both"):format(w))
  end
  if not o.far_early or (w ~= "early" and not o.far_behind) then
    cmd:misuse(("--far-dma %s moves the %s of a run: it needs --far-early%s"):format(w,
      w == "early" and "early copies" or "copies written behind", w == "early" and "" or " and --far-behind"))
  end
end
if o.far_early_after and not (o.far_early and o.far_behind) then
  cmd:misuse("--far-early-after moves the early copies of the runs written behind: it needs --far-early and "
    .. "--far-behind")
end


-- The monitor counts only managed memory allocated after it starts: first thing.
local monitored = false
if gpu and not o.no_monitor then
  local ok, err = ur.monitor.start()
  monitored = ok and true or false
  if not ok then print("uvm bench: no migration monitor (" .. tostring(err) .. "); migration is not measured") end
elseif gpu then
  print("uvm bench: no migration monitor (--no-monitor); migration is not measured")
end

-- The bench trains a few hundred steps without the schedule: MLPerf's SGD lr of 24 (reached
-- after 2750 warm-up steps) makes the losses NaN by step 4 from fresh weights (seen on the
-- H200), so an MLPerf config trains at the benchmarks' lr (cli.bench_sets) unless --set says
-- otherwise.
local sets = {}
for _, s in ipairs(require("uvmrec.cli").bench_sets(o.config)) do sets[#sets + 1] = s end
for _, s in ipairs(o.set) do sets[#sets + 1] = s end
if o.batch then sets[#sets + 1] = require("uvmrec.lib").flag_set("--batch", "train.batch_size", o.batch) end
local path = train.find_config(o.config) or cmd:fail("no config " .. o.config)
local base_cfg, cerr = train.config.load(path, sets)
if not base_cfg then cmd:fail(cerr) end
local def, derr = train.model_def(base_cfg, path)
if not def then cmd:fail(derr) end
local B = base_cfg.train.batch_size

-- ---- the batches: NB for the timed rotation, `count` for counting, none_steps fresh ones ----

local nbatches = math.max(NB + o.count, o.none_steps)
local t_gen = C.ur_clock_seconds()
local batches = assert(train.source.hold_data(base_cfg, nbatches, gpu and "device" or nil))
local rotation = { unpack(batches, 1, NB) } -- the timed steps take these in turn
local lookups = batches[1].sparse:values():numel()
print(("uvm bench: %s, batch %d, %d batches made in %.1f s (%d lookups a batch)"):format(base_cfg.name, B,
  nbatches, C.ur_clock_seconds() - t_gen, lookups))

-- ---- one run ----

local function cfg_for(placement)
  local s = { unpack(sets) }
  s[#s + 1] = "embeddings.placement=" .. placement
  local cfg, err = train.config.load(path, s)
  if not cfg then cmd:fail(err) end
  return cfg
end

local function table_bytes(model)
  local b = 0
  for _, p in ipairs(model:parameters()) do
    if p.fused then b = b + p.tensor:nbytes() end
  end
  return b
end

local function migration()
  if not monitored then return nil end
  return ur.monitor.read(true)
end

local non_table_peak -- set by the device run

-- run{placement, policy, fraction, counting = "on"/"off"/"both"} -> record
local hooks = require "uvmrec.train.hooks"

-- Wraps obj[method] by around(f), f the method as it was; returns the unwrapper, which gives the
-- object back what it held itself under the name (nil: its class's).
local function wrap(obj, method, around)
  local own = rawget(obj, method)
  obj[method] = around(obj[method])
  return function() obj[method] = own end
end

local function median(ms)
  table.sort(ms)
  return ms[math.floor((#ms + 1) / 2)]
end

-- The median ms between the events of pairs { start, end } (each waited for).
local function pairs_ms(list)
  local ms = {}
  for k, p in ipairs(list) do
    assert(p[2]:sync())
    ms[k] = assert(p[1]:elapsed(p[2]))
  end
  return median(ms)
end

-- --parts: each of the step's parts (train.loop.parts: the collection's forward and backward, the
-- other modules', the optimizer's step) between two events on the model's stream (recorded, never
-- waited for, so the steps run as they do untimed): pairs made ahead for n steps; the steps are
-- timed from one of the collection's forwards to the next.  Returns the medians' reader ({ [name]
-- = ms } of the calls made since, and step: the steps') and the unwrapper.
local function time_parts(parts, stream, n)
  local pool, used = {}, {}
  for k = 1, 2 * n * #parts do pool[k] = { assert(streams.event()), assert(streams.event()) } end
  local unwraps = {}
  for k, part in ipairs(parts) do
    local list = {}
    used[part[1]] = list
    unwraps[k] = wrap(part[2], part[3], function(f)
      return function(...)
        local pair = table.remove(pool)
        if not pair then return f(...) end
        assert(pair[1]:record(stream))
        local r = f(...)
        assert(pair[2]:record(stream))
        list[#list + 1] = pair
        return r
      end
    end)
  end
  local function read()
    local out = {}
    for name, list in pairs(used) do out[name] = pairs_ms(list) end
    local f, ms = used.embeddings_forward, {}
    for k = 1, #f - 1 do ms[k] = assert(f[k][1]:elapsed(f[k + 1][1])) end
    out.step = median(ms)
    return out
  end
  return read, function() for k = #unwraps, 1, -1 do unwraps[k]() end end
end

local function run(r)
  local cfg = cfg_for(r.placement)
  collectgarbage()
  local model, merr = def.build(cfg, { cpu = not gpu })
  if not model then cmd:fail(merr) end
  local opt = train.optimizer(cfg, model)
  local tbe = model.embeddings.tbe
  local emb_bytes = table_bytes(model)
  local rec = { bench = "uvm", config = cfg.name, batch = B, placement = r.placement, policy = r.policy or r.placement,
                fraction = r.fraction, table_bytes = emb_bytes, device = gpu and ur.device_props(0).name or "cpu",
                losses = {} }
  -- n steps of train.loop over the list's batches in turn from its (first+1)-th, going on from
  -- the steps made so far (the hint manager counts them); hook: one more of the loop's.
  local step = 0
  -- the early copies take SMs ahead of the step's kernels as these finish (the prefetch pipeline's
  -- priority): they must be done before the next forward
  local side = r.early and assert(streams.stream { priority = -100 })
  -- --far-early-after: the part's end recorded on the model's stream (its method wrapped until
  -- the run ends); the early copies wait for it, between two events of their own
  local after, copies, unwrap_after
  if r.after then
    after, copies = assert(streams.event()), {}
    for _, part in ipairs(train.loop.parts(model, opt)) do
      if part[1] == r.after then
        unwrap_after = wrap(part[2], part[3], function(f)
          return function(...)
            local res = f(...)
            assert(after:record(model.stream))
            return res
          end
        end)
      end
    end
    assert(unwrap_after, r.after)
  end
  local function steps(list, n, first, hook)
    local ring = train.source.ring(list, n, first)
    local early = r.early and hooks.far_early { collection = tbe, source = ring, stream = side } or nil
    if early and after then
      local inner = early
      early = { after = function(_, ...)
        local pair = { assert(streams.event()), assert(streams.event()) }
        assert(streams.wait(side, after))
        assert(pair[1]:record(side))
        inner:after(...)
        assert(pair[2]:record(side))
        copies[#copies + 1] = pair
      end }
    end
    local hs = { { start = function(_, at) at.step = step end } }
    hs[#hs + 1] = hook
    hs[#hs + 1] = early
    local done = train.loop.run(model, opt, ring, hs)
    step = done.step
    return done
  end
  local mgr
  migration() -- reset the monitor's interval
  local t_setup = C.ur_clock_seconds()
  -- the room is in the budget's hbm_used below; early copies make two more of its size on their
  -- first calls, after it is set (the engine's three maps, table.h's UR__FAR_MAPS, taken in turn)
  local used0, later_rooms = ur.memory().hbm_used, 0
  if r.far and r.far > 0 then
    assert(tbe:set_far_rows(r.far))
    if r.early then later_rooms = 2 * (ur.memory().hbm_used - used0) end
  end
  tbe:set_far_behind(r.behind == true)
  assert(tbe:set_far_dma(r.dma or "none"))
  rec.far_rows, rec.far_early, rec.far_behind, rec.far_early_after = r.far, r.early, r.behind, r.after
  rec.far_dma = r.dma
  if r.placement == "managed" and r.policy ~= "none" then
    local allowance = math.floor(emb_bytes * (r.fraction or 0) / 100)
    local perm_bytes = 0
    for _, name in ipairs(tbe.table_names) do perm_bytes = perm_bytes + tbe.rows[name] * 8 end
    -- The emulated GPU: all the device run held at its peak but its tables (the batches, the
    -- dense model, activations, workspaces, counters), the permutations, and the allowance.
    if gpu then
      -- Counted from what is in use now (earlier runs' dense models may not be collected yet),
      -- so the budget holds slack; the allowance given to the policy decides what it places.
      assert(ur.set_hbm_budget(ur.memory().hbm_used + later_rooms + non_table_peak + perm_bytes + allowance))
      rec.hbm_budget = ur.hbm_budget()
    end
    -- its intervals are called below, never by step(): every is the one the step is spread over
    mgr = hints.manager(model.embeddings, { policy = r.policy, every = o.every, allowance = allowance,
                                            monitor = false })
    assert(mgr:start(0))
    rec.allowance = allowance
  end
  if r.counting then assert(tbe:set_counting(true)) end
  -- counting steps (the policy's interval after them), then warm-up and the timed steps
  steps(batches, o.count, NB, { after = function(_, at) rec.losses[#rec.losses + 1] = at.loss:get(0) end })
  if mgr then
    local ir = assert(mgr:interval(step))
    rec.relayout_seconds, rec.relayout_bytes, rec.rows_moved = ir.relayout_seconds, ir.relayout_bytes, ir.rows_moved
    rec.hint_seconds, rec.coverage, rec.hot_fraction = ir.hint_seconds, ir.coverage, ir.hot_fraction
    rec.bytes_on_gpu = ir.bytes_on_gpu
    rec.setup_migration = migration()
  end
  rec.setup_seconds = C.ur_clock_seconds() - t_setup
  steps(rotation, o.warmup, 0)
  local function timed(n, first)
    if gpu then assert(ur.sync()) end
    migration()
    local span = streams.span(nil, gpu)
    local half = step + math.floor(n / 2)
    -- adaptive's interval at the half, timed apart (the GPU drained before and after it): the
    -- steps' time leaves it out, and it is reported on its own and spread over `every` steps
    local apart = 0
    local last = steps(rotation, n, first, mgr and r.policy == "adaptive" and { after = function(_, at)
      if at.step == half then
        if gpu then assert(ur.sync()) end
        local t0, c0 = C.ur_clock_seconds(), os.clock()
        local ir = assert(mgr:interval(at.step))
        if gpu then assert(ur.sync()) end
        apart = C.ur_clock_seconds() - t0
        rec.adaptive_rows_moved = ir.rows_moved
        -- the process's CPU seconds too: on a shared machine the wall clock counts others' work
        rec.adaptive_seconds, rec.adaptive_cpu_seconds = apart, os.clock() - c0
        rec.adaptive_rank_on = ir.rank_on
        rec.adaptive_rank_seconds, rec.adaptive_swap_seconds = ir.rank_seconds, ir.relayout_seconds
      end
    end } or nil)
    local s = span()
    return s - apart, last.loss:get(0), migration()
  end
  local parts, unwrap
  if o.parts then parts, unwrap = time_parts(train.loop.parts(model, opt), model.stream, o.steps) end
  -- the host threads' calls over the timed steps (far_dma): their count, time and rows
  local dma0 = gpu and r.dma and r.dma ~= "none" and assert(ur.sync()) and tbe:far_dma_stats()
  local seconds, loss, mig = timed(o.steps, o.warmup)
  if dma0 then
    assert(ur.sync())
    local d = tbe:far_dma_stats()
    rec.far_dma_calls = {}
    for _, w in ipairs { "home", "early" } do
      local n = d[w].calls - dma0[w].calls
      if n > 0 then
        rec.far_dma_calls[w] = { calls = n, ms = (d[w].seconds - dma0[w].seconds) / n * 1e3,
                                 rows = (d[w].rows - dma0[w].rows) / n }
      end
    end
  end
  if parts then
    rec.parts_ms = parts()
    unwrap()
  end
  if r.far and r.far > 0 then -- the last forward's far rows (a lower bound where its map was full)
    rec.far_taken, rec.far_unplaced = assert(tbe:far_taken())
  end
  rec.steps, rec.seconds = o.steps, seconds
  rec.samples_per_s = o.steps * B / seconds
  rec.ms_per_step = seconds / o.steps * 1e3
  if rec.adaptive_seconds then -- one interval each --every steps
    rec.ms_per_step_every = rec.ms_per_step + rec.adaptive_seconds / o.every * 1e3
  end
  rec.losses[#rec.losses + 1] = loss
  if mig then
    rec.migration = mig
    rec.migrated_bytes_per_step = (mig.bytes_htod + mig.bytes_dtoh) / o.steps
  end
  if mgr then
    -- the share of all lookups counted so far (counting, warm-up, timed) that the prefix in HBM took
    rec.coverage = mgr:measure()
    rec.hbm_used = ur.memory().hbm_used
    -- bytes moved in place over the host link a step, estimated: lookups outside the prefix, each
    -- a row read in forward and read and written in the backward's update (not read again where
    -- the forward copied it: the share of far rows the room held)
    if rec.coverage then
      local rows = 0
      for _, name in ipairs(tbe.table_names) do rows = rows + tbe.rows[name] end
      local row_bytes = emb_bytes / rows
      -- (where the map was full, far_taken is a lower bound: this share then too high, the estimate low)
      local copied = rec.far_taken and rec.far_taken > 0 and math.min(1, rec.far_rows / rec.far_taken) or 0
      rec.host_bytes_per_step_est = (1 - rec.coverage) * lookups * row_bytes * (3 - copied)
    end
    mgr:free()
  end
  if r.counting == "both" then
    -- the same steps with counting off then on: the counters' cost
    assert(tbe:set_counting(false))
    local off = timed(o.steps, o.warmup)
    assert(tbe:set_counting(true))
    local on = timed(o.steps, o.warmup)
    rec.count_off_ms, rec.count_on_ms = off / o.steps * 1e3, on / o.steps * 1e3
    rec.count_overhead = on / off - 1
  end
  if unwrap_after then
    unwrap_after()
    -- the early copies' median time over the timed steps (the last o.steps)
    rec.early_copies_ms = pairs_ms { unpack(copies, math.max(1, #copies - o.steps + 1)) }
  end
  if gpu then assert(ur.set_hbm_budget(0)) end
  rec.hbm_peak = ur.memory().hbm_peak
  if side then side:free() end
  model.embeddings.tbe:free()
  return rec
end

-- ---- none: the first steps on fresh tables, a new batch each ----

local function run_none()
  local cfg = cfg_for("managed")
  collectgarbage()
  local model = assert(def.build(cfg, { cpu = not gpu }))
  local opt = train.optimizer(cfg, model)
  local rec = { bench = "uvm", config = cfg.name, batch = B, placement = "managed", policy = "none",
                table_bytes = table_bytes(model), steps = o.none_steps }
  migration()
  local span = streams.span(nil, gpu)
  local marks = {}
  local last = train.loop.run(model, opt, train.source.ring(batches, o.none_steps), { { after = function(_, at)
    local i = at.step
    if i == 1 or i == 10 or i == 50 or i == o.none_steps then
      marks[#marks + 1] = { step = i, seconds = span(), migration = migration() }
    end
  end } })
  rec.seconds = span()
  rec.loss = last.loss:get(0)
  rec.marks = marks
  local bytes, faults = 0, 0
  for _, m in ipairs(marks) do
    if m.migration then
      bytes = bytes + m.migration.bytes_htod + m.migration.bytes_dtoh
      faults = faults + m.migration.gpu_page_faults
    end
  end
  rec.migrated_bytes, rec.gpu_page_faults = monitored and bytes or nil, monitored and faults or nil
  rec.samples_per_s = o.none_steps * B / rec.seconds
  rec.ms_per_step = rec.seconds / o.none_steps * 1e3
  model.embeddings.tbe:free()
  return rec
end

-- ---- the runs ----

local results = {}
local function emit(rec)
  results[#results + 1] = rec
  if o.out then json.append_lines(o.out, rec) end
  print(("  %-10s %5s  %8.2f ms/step  %10.0f samples/s%s"):format(rec.policy,
    rec.fraction and (rec.fraction .. "%") or "",
    rec.ms_per_step or 0, rec.samples_per_s or 0, rec.coverage and ("  coverage %.3f"):format(rec.coverage) or ""))
end

local ref = run { placement = gpu and "device" or "host", counting = "both" }
ref.policy = "device"
non_table_peak = ref.hbm_peak - (gpu and ref.table_bytes or 0)
emit(ref)
local function same_losses(rec)
  for i, l in ipairs(ref.losses) do
    if rec.losses[i] ~= l then
      return ("check: %s at %s%%: loss %d is %.17g, the device run's %.17g: placement or layout changed a "
              .. "number"):format(rec.policy, tostring(rec.fraction), i, rec.losses[i] or 0 / 0, l)
    end
  end
end
-- A run that fails (an error, or losses that differ) is reported and the others go on; the
-- bench exits 1 at the end.
local failures = {}
local function failed(what, err)
  failures[#failures + 1] = what .. ": " .. tostring(err)
  io.stderr:write("uvm bench: ", failures[#failures], "\n")
  if gpu then ur.set_hbm_budget(0) end
  if o.out then json.append_lines(o.out, { bench = "uvm", failed = what, error = tostring(err) }) end
end
for _, pol in ipairs(o.policies) do
  local fr = pol == "host" and { 0 } or o.fractions
  for _, f in ipairs(fr) do
    local cases = {}
    for _, far in ipairs(o.far_rows) do
      cases[#cases + 1] = { far = far }
      if far > 0 and o.far_early then cases[#cases + 1] = { far = far, early = true } end
      if far > 0 and o.far_early and o.far_behind then
        cases[#cases + 1] = { far = far, early = true, behind = true }
        for _, part in ipairs(o.far_early_after or {}) do
          cases[#cases + 1] = { far = far, early = true, behind = true, after = part }
        end
      end
      for _, w in ipairs(far > 0 and o.far_dma or {}) do
        cases[#cases + 1] = { far = far, early = true, behind = o.far_behind, dma = w }
        for _, part in ipairs(o.far_early_after or {}) do
          cases[#cases + 1] = { far = far, early = true, behind = o.far_behind, dma = w, after = part }
        end
      end
    end
    for _, c in ipairs(cases) do
      local far = c.far
      local what = pol .. " " .. f .. "%" .. (far > 0 and (", far rows " .. far) or "") .. (c.early and ", early" or "")
        .. (c.behind and ", behind" or "") .. (c.after and (", early after " .. c.after) or "")
        .. (c.dma and (", dma " .. c.dma) or "")
      local ok, rec = pcall(run, { placement = "managed", policy = pol, fraction = f, far = far, early = c.early,
                                   behind = c.behind, after = c.after, dma = c.dma })
      local bad = ok and same_losses(rec)
      if not ok then failed(what, rec)
      elseif bad then failed(what, bad)
      else
        rec.of_device = rec.samples_per_s / ref.samples_per_s
        emit(rec)
      end
    end
  end
end
local ok_none, none = true, nil
if o.none_steps > 0 then ok_none, none = pcall(run_none) end
if not ok_none then
  failed("none", none)
  none = nil
elseif none and not (none.loss == none.loss and math.abs(none.loss) < math.huge) then
  failed("none", "the loss is " .. none.loss)
  none = nil
elseif none then
  emit(none)
end

-- ---- the table ----

local function gbs(b) return b and ("%.2f"):format(b / 1e9) or "-" end
print()
print(("uvm bench: %s, %s of tables (%s), batch %d, Zipf ids; every managed run's losses equal the device run's")
  :format(base_cfg.name, gbs(ref.table_bytes) .. " GB", gpu and ref.device or "CPU", B))
print(("access counters: %.3f ms a step off, %.3f on (%+.1f%%)"):format(ref.count_off_ms, ref.count_on_ms,
  100 * ref.count_overhead))
print("| policy | HBM allowance | far rows: room / read | samples/s | of device | ms/step | on GPU (GB) | coverage "
  .. "| migrated/step (MB) | est. host reads/step (MB) | relayout (s, GB) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for _, r in ipairs(results) do
  if r.policy ~= "none" then
    print(("| %s | %s | %s | %.3g M | %s | %.2f | %s | %s | %s | %s | %s |"):format(r.policy,
      r.fraction and (r.fraction .. "%") or (r.policy == "device" and "100% (all)" or "-"),
      r.far_taken and ("%d / %s%d%s%s%s%s"):format(r.far_rows, r.far_unplaced > 0 and ">= " or "", r.far_taken,
        r.far_early and ", early" or "", r.far_behind and ", behind" or "",
        r.far_early_after and (", early after " .. r.far_early_after) or "",
        r.far_dma and (", dma " .. r.far_dma) or "") or "-",
      r.samples_per_s / 1e6, r.of_device and ("%.2f"):format(r.of_device) or "1", r.ms_per_step,
      r.policy == "device" and gbs(r.table_bytes) or gbs(r.bytes_on_gpu),
      r.coverage and ("%.3f"):format(r.coverage) or "-",
      r.migrated_bytes_per_step and ("%.1f"):format(r.migrated_bytes_per_step / 1e6) or "-",
      r.host_bytes_per_step_est and ("%.1f"):format(r.host_bytes_per_step_est / 1e6) or "-",
      r.relayout_seconds and ("%.2f, %s"):format(r.relayout_seconds, gbs(r.relayout_bytes)) or "-"))
  end
end
for _, r in ipairs(results) do
  for _, w in ipairs { "home", "early" } do
    local c = r.far_dma_calls and r.far_dma_calls[w]
    if c then
      print(("far_dma %s, %s %s%%: %d host calls over the timed steps, %.3f ms and %d rows a call (%.0f ns a row)")
        :format(w, r.policy, tostring(r.fraction), c.calls, c.ms, c.rows, c.rows > 0 and c.ms * 1e6 / c.rows or 0))
    end
  end
end
for _, r in ipairs(results) do
  if r.early_copies_ms then
    print(("early copies after %s: %.3f ms (their median over the timed steps), %s %s%%%s"):format(r.far_early_after,
      r.early_copies_ms, r.policy, tostring(r.fraction), r.far_dma and (", dma " .. r.far_dma) or ""))
  end
end
for _, r in ipairs(results) do
  local p = r.parts_ms
  if p then
    local rest = p.step - p.embeddings_forward - p.embeddings_backward
    print(("parts: %s%s: the median step %.3f ms (the mean %.3f): the tables' forward %.3f ms, backward %.3f ms, "
      .. "the rest %.3f ms (medians)"):format(r.policy, r.fraction and (" " .. r.fraction .. "%") or "",
      p.step, r.ms_per_step, p.embeddings_forward, p.embeddings_backward, rest))
    local words, left = {}, rest - p.optimizer
    for _, name in ipairs(train.loop.MODULES) do
      local f, b = p[name .. "_forward"], p[name .. "_backward"]
      if f and name ~= "embeddings" then
        words[#words + 1] = ("%s %.3f / %.3f"):format(name, f, b)
        left = left - f - b
      end
    end
    words[#words + 1] = ("optimizer %.3f"):format(p.optimizer)
    print(("  the rest: %s ms (forward / backward medians); between them %.3f ms"):format(table.concat(words, ", "),
      left))
  end
end
for _, r in ipairs(results) do
  if r.adaptive_seconds then
    print(("adaptive %s%%: an interval %.3f s (%.3f CPU s) apart from the steps (ranking the counters %.3f s on the "
      .. "%s, %d rows swapped in %.3f s); with one every %d steps %.2f ms/step, %.2f of device"):format(r.fraction,
      r.adaptive_seconds, r.adaptive_cpu_seconds, r.adaptive_rank_seconds, tostring(r.adaptive_rank_on),
      r.adaptive_rows_moved, r.adaptive_swap_seconds, o.every, r.ms_per_step_every,
      ref.ms_per_step / r.ms_per_step_every))
  end
end
if none then
  print(("none (driver default, fresh tables): first %d steps in %.2f s (%.2f ms/step), migrated %s GB, "
  .. "%s GPU page faults")
  :format(none.steps, none.seconds, none.ms_per_step, gbs(none.migrated_bytes),
  none.gpu_page_faults and tostring(none.gpu_page_faults) or "-"))
end
for _, m in ipairs(none and none.marks or {}) do
  print(("  by step %d: %.2f s%s"):format(m.step, m.seconds, m.migration and
    (", +%s GB in, %d faults"):format(gbs(m.migration.bytes_htod), m.migration.gpu_page_faults) or ""))
end
if #failures > 0 then
  print(("%d runs FAILED:"):format(#failures))
  for _, f in ipairs(failures) do print("  " .. f) end
  os.exit(1)
end
