-- uvmrec.train.graph: the training step (uvmrec.train.loop.step) as one CUDA graph.  The first
-- steps run as usual (warm-up: buffers, workspaces and product plans are made then, which a
-- capture must not do); then a step is captured (ur_graph_*) and replayed for the batches after
-- it: one launch in place of a few hundred, with no gaps between kernels.  A replay repeats its
-- capture exactly: the same memory, the same numbers computed on the host.  So the runner
--   * copies each batch into buffers of its own (batch:to into Batch.buffers), on its stream
--     (a batch of another shape runs eagerly); with static = true it keeps a graph per batch
--     object instead (fixed batches);
--   * captures again when a learning rate changes (a schedule's warm-up and decay: there the
--     graph saves nothing; the plateau between them is where it pays);
--   * is not used (usable() says why) where a replay cannot repeat the step: on the CPU, with
--     Adam (its bias corrections change every step), f16/bf16 tables rounded stochastically (a
--     key per step), cached tables (the cache decides on the host), bounds "fatal" (every
--     forward reads the GPU's flags);
--   * advances the optimizers' step counters as each replayed step would have.
--   local runner = graph.new(model, optimizer)        -- or nil, why
--   local loss = runner:step(batch)                   -- as loop.step(model, optimizer, batch)
--   loop.run(model, optimizer, source, { runner:hook(), ... })  -- every step through it
local ur = require "uvmrec"
local loop = require "uvmrec.train.loop"
local Batch = require "uvmrec.data.batch"
local streams = require "uvmrec.stream"

local M = {}

-- true, or false and the reason the step of this model and optimizer cannot be replayed.
function M.usable(model, optimizer)
  if not ur.gpu() or model.placement ~= "device" then return false, "the model is not on a GPU" end
  local tbe = model.embeddings.tbe
  if optimizer.kind == "adam" or optimizer.kind == "adamw" or tbe.optimizer == "adam" then
    return false, "Adam's bias corrections change every step"
  end
  if tbe.cache then return false, "cached tables are prepared on the host every step" end
  if model.collisions then
    return false, "managed collisions decide eviction rounds and reset rows on the host between steps"
  end
  if tbe.bounds == "fatal" then return false, "bounds 'fatal' reads the GPU's flags every forward" end
  if tbe.stochastic_rounding then
    for _, dt in pairs(tbe.dtypes or {}) do
      if dt ~= "f32" then return false, "f16/bf16 tables round stochastically with a key per step" end
    end
  end
  return true
end

local Runner = {}
Runner.__index = Runner

-- new(model, optimizer, {warmup = 2, static = false}): the runner, which puts the model on a
-- stream of its own; nil, reason when usable() says no.
function M.new(model, optimizer, opts)
  local ok, why = M.usable(model, optimizer)
  if not ok then return nil, why end
  opts = opts or {}
  local stream = assert(ur.stream())
  model:set_stream(stream)
  return setmetatable({ model = model, opt = optimizer, stream = stream, warmup = opts.warmup or 2,
                        static = opts.static, steps = 0, graphs = {}, done = assert(ur.event()),
                        replays = 0, captures = 0 }, Runner)
end

-- The numbers the host computes for a step that a graph bakes in (and the far rows' room,
-- whose memory it points at).
local function scalars(self)
  local tbe = self.model.embeddings.tbe
  return ("%.17g %.17g %d"):format(self.opt:lr(), self.model.embeddings:lr(), tbe and tbe:far_rows() or 0)
end

-- The shape of a batch's tensors, which a replay must find again.
local function shape_of(batch)
  local k = batch.sparse
  local w = k:weights()
  return ("%d %d %d %d"):format(batch.size, k:values():numel(), k:offsets():numel(), w and w:numel() or -1)
end

-- A copy of batch in buffers of the runner's (batch:to into Batch.buffers: the same memory each
-- step), or nil when batch's shapes differ from the first one's.  The copies wait for what the
-- default stream did before (the batch's own upload); the default stream waits for the step
-- after them (Runner:step).
local function stage(self, batch)
  local s = self.staged
  if not s then
    s = { bufs = Batch.buffers("device"), ready = assert(ur.event()), shape = shape_of(batch) }
    self.staged = s
  elseif shape_of(batch) ~= s.shape then
    return nil
  end
  assert(s.ready:record())
  assert(streams.wait(self.stream, s.ready))
  return batch:to("device", self.stream, s.bufs)
end

-- The default stream waits for the step: what runs there next (a batch's upload, a read of the
-- loss or of a parameter, a checkpoint) sees it done, with no wait on the host.
local function handback(self, loss)
  assert(self.done:record(self.stream))
  assert(streams.wait(nil, self.done))
  return loss
end

-- One training step on batch (loop.step's), eager or replayed, on the runner's stream; returns
-- the loss tensor.
function Runner:step(batch)
  self.steps = self.steps + 1
  local b = batch
  if not self.static then b = stage(self, batch) or batch end
  if self.steps <= self.warmup or (not self.static and b == batch) then
    return handback(self, loop.step(self.model, self.opt, b))
  end
  local key = self.static and batch or "staged"
  local g = self.graphs[key]
  local sc = scalars(self)
  if g and g.scalars == sc then
    assert(g.graph:launch(self.stream))
    -- what the replayed step's calls would have counted on the host
    self.opt.step_count = self.opt.step_count + 1
    local tbe = self.model.embeddings.tbe
    tbe:set_step(tbe:step() + 1)
    self.replays = self.replays + 1
    return handback(self, g.loss)
  end
  assert(ur.graph_begin(self.stream))
  local ok, loss = pcall(loop.step, self.model, self.opt, b)
  local graph, err = ur.graph_end(self.stream, g and g.graph)
  if not ok then error(loss, 0) end
  if not graph then error("graph: the step could not be captured: " .. tostring(err), 0) end
  self.graphs[key] = { graph = graph, scalars = sc, loss = loss }
  self.captures = self.captures + 1
  return handback(self, loss)
end

-- Waits for the runner's stream (before the host reads a loss or a parameter).
function Runner:sync() return self.stream:sync() end

-- The runner as a hook of uvmrec.train.loop.run, which takes the loop's steps over; the loop's
-- end waits for its stream.
-- (A table with methods, not closures over the runner: see uvmrec.train.hooks.)
local Hook = {}
Hook.__index = Hook
function Hook:take_step(_, batch) return self.runner:step(batch) end
function Hook:finish() assert(self.runner:sync()) end

function Runner:hook() return setmetatable({ runner = self }, Hook) end

function Runner:free()
  for _, g in pairs(self.graphs) do g.graph:free() end
  self.graphs = {}
  if self.staged then self.staged.bufs:free() end
  self.staged = nil
  self.model:set_stream(nil)
end

return M
