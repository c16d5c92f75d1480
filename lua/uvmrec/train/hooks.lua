-- uvmrec.train.hooks: the hooks uvmrec.train.run composes a run of, in uvmrec.train.loop.run's
-- protocol (start, before, after, finish; each gets the run).  A hook with state of its own to
-- save registers it (register(registry): a uvmrec.checkpoint component), before a resume loads.
-- The learning rates' hook is uvmrec.optim.Schedule.
-- Each hook is a table of its own state with methods made once, here, not closures made per
-- run: LuaJIT compiles a function called on a step's path into its traces as a constant, and a
-- trace (which outlives the run, until it is flushed) would keep what a closure's upvalues
-- reach alive, a finished run's model and optimizer state among it (docs/results.md: the
-- memory held after a run).
local ur = require "uvmrec"
local progress = require "uvmrec.train.progress"
local C = ur.C

local M = {}

local function class()
  local c = {}
  c.__index = c
  return c
end

-- trainer(ctx): where the run stands, the checkpoint component "trainer": the last step, the
-- samples trained on, the data's position after the last batch trained (a pipeline reads
-- ahead: the loader's own position is not it) and the steps train.nonfinite's guard skipped
-- (run.skipped, in all: saved when there are any).  A resumed run starts at the saved step and
-- count; ctx (uvmrec.train.run's) holds step, first, samples, position, skipped.
local Trainer = class()
function M.trainer(ctx) return setmetatable({ ctx = ctx }, Trainer) end

function Trainer:register(reg)
  local ctx = self.ctx
  reg:register { name = "trainer", whole = { "step", "samples" },
    state = function()
      local skipped = ctx.skipped and ctx.skipped > 0 and ctx.skipped or nil
      return { meta = { step = ctx.step, samples = ctx.samples, position = ctx.position, skipped = skipped } }
    end,
    check = function(_, meta)
      if meta.skipped ~= nil and not require("uvmrec.lib").whole_in(meta.skipped, 0, meta.step + 1) then
        return ("the meta of component 'trainer' has skipped %s; expected a whole number of steps up to its step %s")
          :format(tostring(meta.skipped), tostring(meta.step))
      end
    end,
    load = function(_, meta)
      ctx.step, ctx.first, ctx.samples, ctx.position = meta.step, meta.step + 1, meta.samples, meta.position
      ctx.skipped = meta.skipped or 0
    end }
end

function Trainer:start(run) run.step, run.samples = self.ctx.step, self.ctx.samples end

-- the guard's count, as it stands after its reads (a read comes before this hook's after and
-- done, and before every checkpoint)
local function keep_skipped(ctx, run)
  if run.skipped then ctx.skipped = run.skipped end
end

function Trainer:after(run, batch)
  local ctx = self.ctx
  ctx.step, ctx.samples = run.step, run.samples
  ctx.position = batch:position() or ctx.position
  keep_skipped(ctx, run)
end

function Trainer:done(run) keep_skipped(self.ctx, run) end

-- far_early{collection =, source =, stream =}: after each step, the far rows of the source's
-- next batch (source:peek(), a uvmrec.train.source.ring's) copied early into HBM on `stream`
-- (a stream of its own: the copies overlap the step; docs/uvm.md, "Early copies"), so that the
-- next forward reads them there.  collection: a uvmrec.tbe collection with room for far rows'
-- copies (set_far_rows).  self.made: the batches it copied early.
local FarEarly = class()
function M.far_early(o)
  if type(o) ~= "table" or type(o.source) ~= "table" or type(o.source.peek) ~= "function" then
    error("far_early: expected {collection =, source = (a source with peek()), stream =}", 2)
  end
  if type(o.collection) ~= "table" or type(o.collection.far_prefetch) ~= "function" then
    error("far_early: collection must be a uvmrec.tbe collection (an EmbeddingBagCollection's .tbe)", 2)
  end
  if o.collection:far_rows() <= 0 then
    error("far_early: the collection has no room for far rows' copies; set_far_rows(n) first", 2)
  end
  return setmetatable({ tbe = o.collection, source = o.source, stream = o.stream, made = 0 }, FarEarly)
end

function FarEarly:after()
  local b = self.source:peek()
  if not b then return end
  assert(self.tbe:far_prefetch(b.sparse, self.stream))
  self.made = self.made + 1
end

-- log{progress =, line =, every =, optimizer =, tables =}: every `every` steps the loss is read
-- (the one wait for the GPU), shown by progress (uvmrec.train.progress) and written as a "train"
-- line (line(t): the run directory's) with the step's learning rates: lr, the dense optimizer's,
-- and tables_lr, the tables' fused optimizer's (tables: the model's embedding collection, or nil);
-- at the end, the last step's when it was not.  self.loss: the last loss read.
local Log = class()
function M.log(o)
  return setmetatable({ every = o.every or 10, logged = nil, loss = nil, progress = o.progress, line = o.line,
                        optimizer = o.optimizer, tables = o.tables }, Log)
end

local function log_line(h, run)
  local loss = run.loss:get(0)
  h.logged = run.step
  -- a skipped step's loss (train.nonfinite: skip) may be NaN, which JSON cannot hold
  local finite = loss == loss and loss ~= math.huge and loss ~= -math.huge
  if finite then h.loss = loss end
  h.progress:update(run.step, finite and loss or nil, run.samples)
  h.line { event = "train", step = run.step, samples = run.samples, loss = finite and loss or nil,
           loss_nonfinite = not finite or nil, seconds = h.progress:elapsed(),
           samples_per_s = h.progress.rate, lr = h.optimizer:lr(), tables_lr = h.tables and h.tables:lr() }
end

function Log:after(run)
  if run.step % self.every == 0 then log_line(self, run) end
end

function Log:finish(run)
  if not run.error and run.loss and self.logged ~= run.step then log_line(self, run) end
end

-- evaluation{every =, last =, model =, data = (the held-out loader's options), source = (a
-- uvmrec.train.source.loader, attached to each evaluation's loader), metrics =, samples =,
-- batch_size =, progress =, line =, comm = (several ranks: each evaluates its slices, the metrics
-- over all)}: the model's held-out metrics every `every` steps (0:
-- never) but at step `last`, which the run evaluates at its end (evaluate(step)); shown,
-- logged as an "eval" line and kept in self.evals.
local Evaluation = class()
function M.evaluation(o) return setmetatable({ o = o, evals = {} }, Evaluation) end

function Evaluation:evaluate(step)
  local evaluate = require "uvmrec.train.evaluate"
  local o = self.o
  o.progress:pause()
  local l, lerr = ur.data.loader(o.data)
  if not l then error(lerr, 0) end
  o.source:attach(l)
  local r, e = evaluate.run(o.model, o.source, { metrics = o.metrics, samples = o.samples,
                                                 batch_size = o.batch_size, comm = o.comm })
  o.source:drain()
  l:close()
  if not r then error(e, 0) end
  r.step = step
  self.evals[#self.evals + 1] = r
  o.progress:message(("eval at step %d: %s  (%s, %.1f s)"):format(step, evaluate.format(r, o.metrics),
                                                                  evaluate.count(r), r.seconds))
  o.line(evaluate.log_line(r, { event = "eval", step = step }))
  o.progress:resume()
  return r
end

function Evaluation:after(run)
  local o = self.o
  if o.every > 0 and run.step % o.every == 0 and run.step ~= o.last then self:evaluate(run.step) end
end

function Evaluation:free() self.o.source:free() end

local function file_bytes(path)
  local f = io.open(path, "rb")
  if not f then return 0 end
  local n = f:seek("end")
  f:close()
  return n
end

-- checkpoints{every =, registry =, dir =, config =, keep =, progress =, line =}: the registry
-- saved into dir every `every` steps ("every"), at the end when every > 0 ("end"), and when a
-- signal stopped the run ("signal"); never twice at one step, and not at a resumed run's
-- first step before it trained; shown and logged as a "checkpoint" line.  self.saved: {step,
-- path} of the last.  Over ranks (shards = {collection =, comm =}: a sharded collection), every
-- rank calls it at the same steps: the ranks write the tables' shards into ckpt-<step>.shards
-- (uvmrec.dist.checkpoint, a collective that ends once every rank's file and the manifest are
-- written), then rank 0 alone writes the registry's ckpt-<step>.safetensors (the dense part,
-- optimizer, trainer), which publishes the checkpoint, and applies keep.
local Checkpoints = class()
function M.checkpoints(o) return setmetatable({ o = o, saved = nil }, Checkpoints) end

function Checkpoints:save(step, why)
  local ck = require "uvmrec.checkpoint"
  local o = self.o
  o.progress:pause()
  local t0 = C.ur_clock_seconds()
  local path, shards, sbytes = ck.path_for(o.dir, step), nil, 0
  if o.shards then
    shards = ck.shards_path(path)
    local m, serr = require("uvmrec.dist.checkpoint").save(shards, o.shards.collection)
    if not m then error(serr, 0) end
    for _, f in ipairs(type(m) == "table" and m.files or {}) do sbytes = sbytes + file_bytes(shards .. "/" .. f) end
  end
  if not o.shards or o.shards.comm.rank == 0 then
    local saved, err = o.registry:save_step(o.dir, { step = step, config = o.config, keep = o.keep })
    if not saved then error(err, 0) end
    path = saved
  end
  local secs, bytes = C.ur_clock_seconds() - t0, file_bytes(path) + sbytes
  o.progress:message(("checkpoint at step %d: %s%s (%s, %.1f s)"):format(step, path,
    shards and (" + " .. shards:match("[^/]*$")) or "", progress.bytes(bytes), secs))
  o.line { event = "checkpoint", step = step, path = path, shards = shards, bytes = bytes, seconds = secs,
           reason = why }
  o.progress:resume()
  self.saved = { step = step, path = path }
end

function Checkpoints:start(run) self.first = run.step + 1 end

function Checkpoints:after(run)
  local every = self.o.every
  if every > 0 and run.step % every == 0 then self:save(run.step, "every") end
end

function Checkpoints:finish(run)
  if run.error or run.step < self.first or (self.saved and self.saved.step == run.step) then return end
  if run.interrupted then self:save(run.step, "signal")
  elseif self.o.every > 0 then self:save(run.step, "end") end
end

-- hints(manager, line, say): a hint policy manager (uvmrec.hints) stepped after each step; each
-- interval's record (and the first) logged as a "hints" line, its summary said at the start.
local Hints = class()
function M.hints(manager, line, say) return setmetatable({ manager = manager, line = line, say = say }, Hints) end

local function hints_note(h, rec)
  local l = { event = "hints" }
  for k, v in pairs(rec) do l[k] = v end
  h.line(l)
end

function Hints:start(run)
  local rec = self.manager:start(run.step)
  self.manager:read_monitor()
  hints_note(self, rec)
  self.say(self.manager:summary())
end

function Hints:after(run)
  local rec = self.manager:step(run.step)
  if rec then hints_note(self, rec) end
end

-- A metrics.jsonl line of managed collisions' statistics (mcc: ur.nn.ManagedCollisionCollection):
-- {"event": "collisions", resident, capacity, occupancy, candidates, lookups, resident_share,
-- fallback_share, rounds, fills, admissions, evictions, skipped, seconds, tables = {C3 = {...},
-- ...}} (counts since the start, or the checkpoint resumed from).
local RECORD = { "resident", "capacity", "occupancy", "candidates", "lookups", "resident_share", "fallback_share",
                 "rounds", "fills", "admissions", "evictions", "skipped", "seconds" }
function M.collisions_record(mcc)
  local s = assert(mcc:stats())
  local function pick(t)
    local o = {}
    for _, k in ipairs(RECORD) do o[k] = t[k] end
    return o
  end
  local rec = pick(s)
  rec.event, rec.tables = "collisions", {}
  for name, t in pairs(s.tables) do rec.tables[name] = pick(t) end
  return rec
end

-- collisions{collisions = (ur.nn.ManagedCollisionCollection, the model's), every =}: the maps
-- and counts as the checkpoint component "collisions" (exact resume; eval --checkpoint reads
-- its maps); every `every` steps their statistics as a "collisions" line and, before the log
-- hook shows the step, the maps' occupancy and the share of lookups on resident ids beside the
-- loss; at the end the last step's line (when it was not).  What it shows and writes to is
-- attached once the run has them (attach{progress =, line =}); self.last: the last record,
-- self:summary() a line.
local Collisions = class()
function M.collisions(o)
  return setmetatable({ collisions = o.collisions, every = o.every or 10, last = nil }, Collisions)
end

function Collisions:attach(a) self.progress, self.line = a.progress, a.line end
function Collisions:register(reg) reg:register(self.collisions:checkpoint_component("collisions")) end

local function collisions_note(h, run)
  local rec = M.collisions_record(h.collisions) -- waits for the GPU, as the loss's read does
  rec.step = run.step
  h.last = rec
  h.progress.note = ("collisions %.0f%% full, %.1f%% resident"):format(100 * rec.occupancy, 100 * rec.resident_share)
  h.line(rec)
end

function Collisions:after(run)
  if run.step % self.every == 0 then collisions_note(self, run) end
end

function Collisions:finish(run)
  if run.error or not run.loss then return end
  if not (self.last and self.last.step == run.step) then collisions_note(self, run) end
end

function Collisions:summary() return self.collisions:summary() end

-- signals(catch): the interrupt flag stops the run at the step boundary after it rises
-- (run.interrupted = {signal, name, step}); with catch, SIGINT and SIGTERM only raise it while
-- the loop runs (one call a step, no system call).  Last in a run's hooks: the others' after
-- has run when it stops, and the handlers come back after their finish (a checkpoint's save).
local Signals = class()
function M.signals(catch) return setmetatable({ catch = catch }, Signals) end

function Signals:start()
  if self.catch then assert(require("uvmrec.lib").check(C.ur_signals_catch(1))) end
end

function Signals:after(run)
  local sig = C.ur_interrupt_get() ~= 0 and (self.catch and C.ur_signals_caught() or 0) or nil
  -- over several ranks, the boundary they all stop at (uvmrec.dist.interrupted)
  local dist = package.loaded["uvmrec.dist"]
  if dist and dist.is_initialized() and dist.world() > 1 then sig = dist.interrupted(sig) end
  if sig == nil then return end
  local name = sig ~= 0 and require("uvmrec.lib").signal_name(sig) or "the interrupt flag"
  run.interrupted = { signal = sig, name = name, step = run.step }
  run:stop()
end

function Signals:finish()
  if self.catch then C.ur_signals_catch(0) end
end

return M
