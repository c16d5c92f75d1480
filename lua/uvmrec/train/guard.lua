-- uvmrec.train.guard: train.nonfinite's guard against NaN and infinities.  Each step ORs "some
-- element is NaN or +-Inf" of the loss and of every dense gradient into a few i32 flags where
-- the model runs (ur_nonfinite_check: one launch for the loss, one for up to 32 gradients, no
-- wait), and the tables' fused step and the dense optimizer's step are gated by those flags
-- where they run (ur_tbe_set_gate, ur_optim_step's gate): a step that held a non-finite value
-- changes no row, no parameter and no optimizer state.  The model checks its dense gradients
-- before its tables' step (models/dlrm.lua's backward calls guard:check_grads; loop.step
-- checks them before the optimizer's step when the model did not).  The flags are read only
-- where the loss is read (hook(): every train.log_every steps, and after the last step), so the
-- guard adds no wait for the GPU.  Modes:
--   stop  the flag stays up once raised: every later step is held back too, and the read
--         stops the run naming the first bad step and its first non-finite tensor (the loss,
--         then the gradients in the optimizer's order); the model is as after the step before.
--   skip  the flag is cleared at each step's end; bad steps are held back and counted (the run
--         log's "nonfinite" lines, the summary).  A skipped step is no update: Adam's bias
--         corrections (dense and tables) count the updates made, whenever the flags are read.
--         Until a read, the updates take the skipped steps the flags count ([2]) off their
--         number where they run (ur__optim_now); the read takes them off the optimizer's and
--         the tables' counts and clears [2].
--
--   local g = guard.new(model, optimizer, "skip")   -- attaches itself: model.guard, the gates
--   loop.run(model, optimizer, source, { g:hook { every = 10, line = log.line }, ... })
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local streams = require "uvmrec.stream"
local tensor = require "uvmrec.tensor"
local progress = require "uvmrec.train.progress"
local C = lib.C

local M = {}
M.MODES = { stop = true, skip = true, off = true }
local HEAD = 3 -- UR_NONFINITE_HEAD

local Guard = {}
Guard.__index = Guard

-- new(model, optimizer, mode): the guard of model (its loss, its optimizer's gradients), in
-- the model's placement, attached: model.guard, and the gates of model.embeddings (when it
-- has tables: set_gate) and of optimizer.  mode "stop" or "skip".
function M.new(model, optimizer, mode)
  if mode ~= "stop" and mode ~= "skip" then
    error("guard: mode '" .. tostring(mode) .. "'; expected stop or skip (train.nonfinite: off has no guard)", 2)
  end
  local params = optimizer.params or {}
  local n = #params
  local place = model.placement == "device" and "device" or "host"
  local flags = assert(tensor.tensor({ HEAD + 1 + n }, { dtype = "i32", placement = place,
                                                          device = place == "device" and model.device or nil }))
  assert(flags:fill(0))
  local names, grads = { "loss" }, ffi.new("const ur_tensor *[?]", math.max(n, 1))
  for i, p in ipairs(params) do
    names[i + 1] = (p.name or ("parameter " .. i)) .. " gradient"
    grads[i - 1] = p.grad.p
  end
  -- [2], the skipped steps the update counts do not leave out yet, is cleared by poll
  local pending = assert(flags:view_as(2, { 1 }))
  local self = setmetatable({ mode = mode, flags = flags, pending = pending, names = names, n = n, grads = grads,
                              optimizer = optimizer, model = model, one = ffi.new("const ur_tensor *[1]"),
                              buf = ffi.new("int32_t[?]", HEAD + 1 + n), checked = false,
                              seen = 0, base = 0, skipped = 0 }, Guard)
  local emb = model.embeddings
  if emb and not emb.set_gate then
    error("guard: the model's embeddings (" .. tostring(emb) .. ") have no set_gate: their fused step "
          .. "cannot be held back", 2)
  end
  model.guard = self
  if emb then emb:set_gate(flags) end
  optimizer:set_gate(flags)
  return self
end

local function must(st)
  if st ~= 0 then error(ffi.string(C.ur_last_error()), 3) end
end

-- The loss of this step (a one-element tensor), slot 0.
function Guard:check_loss(loss, stream)
  self.one[0] = loss.p
  must(C.ur_nonfinite_check(streams.handle(stream, 2), 1, self.one, self.flags.p, 0))
end

-- Every dense gradient (slots 1..n), once a step: before the tables' step when the model calls
-- it (its gradients complete: on a GPU, after dense.join), else before the optimizer's.
function Guard:check_grads(stream)
  if self.checked then return end
  if self.n > 0 then
    must(C.ur_nonfinite_check(streams.handle(stream, 2), self.n, self.grads, self.flags.p, 1))
  end
  self.checked = true
end

-- The step's end, after the optimizer's step: the counts, and the flag cleared (skip).
function Guard:end_step(stream)
  self:check_grads(stream)
  must(C.ur_nonfinite_end_step(streams.handle(stream, 2), self.flags.p, self.mode == "stop" and 1 or 0))
  self.checked = false
end

-- The flags as they stand (a read, which waits for the steps enqueued before): {steps (ended
-- since the guard was made), bad (steps that held a non-finite value, those poll took off the
-- counts and those since), first = {step, slot, name} of the first such step's first
-- non-finite tensor, or nil}.
function Guard:read()
  local n = HEAD + 1 + self.n
  local ok, err = lib.check(C.ur_tensor_read(self.flags.p, 0, n, self.buf))
  if not ok then error(err, 2) end
  local b = self.buf
  local first
  for slot = 0, self.n do
    local at = b[HEAD + slot]
    if at > 0 and (not first or at < first.step) then first = { step = at, slot = slot } end
  end
  if first then first.name = self.names[first.slot + 1] end
  return { steps = b[1], bad = self.seen + b[2], first = first }
end

-- The model's embedding collections (uvmrec.tbe): an EmbeddingBagCollection's, a sharded
-- one's shards.
local function collections(emb)
  if not emb then return {} end
  return emb.collections or { emb.tbe }
end

-- `new` skipped steps, read: they were no updates, so the dense optimizer's count and the
-- tables' (Adam's bias corrections count updates made) drop by `new`, and the flags' [2] is
-- cleared after the steps enqueued, for the updates to come take the counts as they are now
-- (until this read, the updates took the skipped steps off themselves: ur__optim_now).
function Guard:account(new)
  local opt = self.optimizer
  if opt.step_count then opt.step_count = opt.step_count - new end
  for _, c in ipairs(collections(self.model.embeddings)) do c:set_step(c:step() - new) end
  assert(self.pending:fill(0, self.model.stream))
end

-- The message of a stop at run step `step` (where the flags were read).
function Guard:stop_message(r, step)
  local bad = self.base + r.first.step
  return ("train.nonfinite: step %d: %s holds NaN or infinity (the first non-finite tensor of that step; "
    .. "seen when the loss was read at step %d); the run stops with the model as after step %d, the steps "
    .. "from %d on not applied.  train.nonfinite: skip skips such steps instead"):format(
    bad, r.first.name, step, bad - 1, bad)
end

-- Reads the flags at run step `step`: stops (stop: raises the message) or notes the newly
-- skipped steps (skip: returns {skipped (in all), new, first}); nil when nothing is new.
function Guard:poll(step)
  local r = self:read()
  -- the run's step before the guard's first: r.steps have ended since (a resumed run's steps
  -- go on from its checkpoint's)
  self.base = step - r.steps
  if r.bad == self.seen then return nil end
  if self.mode == "stop" then error(self:stop_message(r, step), 0) end
  local new = r.bad - self.seen
  self.seen, self.skipped = r.bad, r.bad
  self:account(new)
  return { skipped = r.bad, new = new, first = r.first and { step = self.base + r.first.step, tensor = r.first.name } }
end

-- Detaches the gates and the model's guard, taking skipped steps not read yet off the counts
-- first (a read: the gates will no longer take them off).
function Guard:detach()
  if self.mode == "skip" then
    local r = self:read()
    if r.bad > self.seen then
      self:account(r.bad - self.seen)
      self.seen, self.skipped = r.bad, r.bad
    end
  end
  if self.model.guard == self then self.model.guard = nil end
  local emb = self.model.embeddings
  if emb and emb.set_gate then emb:set_gate(nil) end
  self.optimizer:set_gate(nil)
end

-- hook{every =, saves = (function(step): a checkpoint is saved after it), line = (the run
-- log's), say =, skipped =}: the loop hook that reads the flags every `every` steps (where the log hook
-- reads the loss; place it before that hook, so a stop comes before a non-finite loss is
-- logged), before each checkpoint (so that none is saved from a stopped run) and after the
-- last step; logs a "nonfinite" line for steps skipped since the last read.  run.skipped holds
-- the count, from skipped = (the steps skipped before this run: a resumed run's checkpoint's).
-- (A table with methods, not closures over the guard: see uvmrec.train.hooks.)
local Hook = {}
Hook.__index = Hook

function Guard:hook(o)
  o = o or {}
  return setmetatable({ guard = self, every = o.every or 10, saves = o.saves, line = o.line, say = o.say,
                        earlier = o.skipped or 0 }, Hook)
end

function Hook:poll(run)
  local r = self.guard:poll(run.step)
  if not r then return end
  r.skipped = self.earlier + r.skipped
  run.skipped = r.skipped
  if self.line then
    self.line { event = "nonfinite", step = run.step, skipped = r.skipped, new = r.new,
                first_step = r.first and r.first.step, tensor = r.first and r.first.tensor }
  end
  if self.say then
    self.say(("train.nonfinite: skip: %s skipped by step %d (%d in all; the first at step %d: %s)"):format(
      progress.things(r.new, "step"), run.step, r.skipped, r.first and r.first.step or 0,
      r.first and r.first.tensor or "?"))
  end
end

function Hook:start(run) run.skipped = self.earlier end

function Hook:after(run)
  if run.step % self.every == 0 or (self.saves and self.saves(run.step)) then self:poll(run) end
end

function Hook:done(run) self:poll(run) end

return M
