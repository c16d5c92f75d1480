-- The training loop, short enough to copy for a loop of one's own.  step: one batch through the
-- model (forward, the loss, backward: the embedding rows the batch read are updated inside it,
-- their optimizer is fused) and the dense optimizer's step (which also zeroes the gradients):
-- a handful of engine calls, no per-element work in Lua, and no wait for the GPU.  run: the
-- steps over a source of batches (uvmrec.train.source: the loader, a ring of batches held in
-- place; uvmrec.pipeline.Prefetch), and hooks for everything else (learning rates, logs,
-- evaluations, checkpoints, hint policies, signals: uvmrec.train.hooks).
local M = {}

-- One step on a batch; the loss is a one-element tensor where the model runs (reading it waits).
-- On the model's stream, if it has one (uvmrec.train.graph puts it on one).
-- With a guard (model.guard: uvmrec.train.guard, train.nonfinite) the loss and the dense
-- gradients are checked where the model runs, and a step that held a NaN or an infinity is held
-- back there.
function M.step(model, optimizer, batch)
  local crit, guard = model.criterion, model.guard
  local logits = model:forward(batch)
  local loss = crit:forward(logits, batch.labels)
  if guard then guard:check_loss(loss, model.stream) end
  model:backward(batch, crit:backward(logits, batch.labels))
  if guard then guard:check_grads(model.stream) end
  optimizer:step(model.stream)
  if guard then guard:end_step(model.stream) end
  return loss
end

-- The step's parts in the order it runs them, as { name, object, method } lists: forward then
-- backward of each of a DLRM's modules it has (M.MODULES: bottom, embeddings, interaction, top,
-- and the loss, model.criterion) and the optimizer's step ("optimizer"); names are the module's
-- with "_forward" or "_backward".  For timing a step apart (scripts/bench/step_parts.lua, the uvm
-- bench's --parts), by wrapping object[method].
M.MODULES = { "bottom", "embeddings", "interaction", "top", "criterion" }
function M.parts(model, optimizer)
  local list = {}
  for _, name in ipairs(M.MODULES) do
    if model[name] then
      list[#list + 1] = { name .. "_forward", model[name], "forward" }
      list[#list + 1] = { name .. "_backward", model[name], "backward" }
    end
  end
  list[#list + 1] = { "optimizer", optimizer, "step" }
  return list
end

-- The names parts() can give, sorted: a model's before it is built (to check a part's name).
function M.part_names()
  local names = { "optimizer" }
  for _, name in ipairs(M.MODULES) do
    names[#names + 1] = name .. "_forward"
    names[#names + 1] = name .. "_backward"
  end
  table.sort(names)
  return names
end

-- A run as its hooks see it: model, optimizer, step (the last step made), samples (trained on,
-- in all, by every rank), world, loss (the last step's), stopped, and error (in finish, when the
-- loop failed).
local Run = {}
Run.__index = Run

-- Ends the run after this step (a hook's request: a signal, a step limit).
function Run:stop() self.stopped = true end

local function call(hooks, name, run, batch)
  for i = 1, #hooks do
    local f = hooks[i][name]
    if f then f(hooks[i], run, batch) end
  end
end

-- The hook that takes the step over (take_step), or nil.
local function stepper(hooks)
  for i = 1, #hooks do
    if hooks[i].take_step then return hooks[i] end
  end
  return nil
end

local function steps(run, source, hooks)
  call(hooks, "start", run)
  local taker = stepper(hooks)
  while not run.stopped do
    local batch, err = source:next()
    if err then error(err, 0) end
    if not batch then break end
    call(hooks, "before", run, batch)
    if taker then
      run.loss = taker:take_step(run, batch)
    else
      run.loss = M.step(run.model, run.optimizer, batch)
    end
    run.step, run.samples = run.step + 1, run.samples + batch.size * run.world
    call(hooks, "after", run, batch)
  end
  call(hooks, "done", run)
end

-- Trains on the source's batches until it ends or a hook stops the run; the source is closed
-- at the end (batches in flight dropped).  A hook is a table with any of start(run) (before the
-- first step; a resumed run's sets run.step and run.samples), before(run, batch) (before each
-- step: the learning rates), after(run, batch) (after each step), done(run) (after the last
-- step, when the loop did not fail: a last look that may still fail it) and finish(run) (after
-- the last, also when the loop failed: run.error); one may take the step over, take_step(run,
-- batch) returning the loss as step does (uvmrec.train.graph's runner:hook() replays it as one
-- CUDA graph).  opts.world: the ranks training data-parallel, each on its slice of the global
-- batch (run.samples counts the global batches).  Returns the run, or raises the loop's error.
function M.run(model, optimizer, source, hooks, opts)
  hooks = hooks or {}
  local run = setmetatable({ model = model, optimizer = optimizer, step = 0, samples = 0, stopped = false,
                             world = opts and opts.world or 1 }, Run)
  local ok, err = pcall(steps, run, source, hooks)
  source:close()
  if not ok then run.error = err end
  local fok, ferr = pcall(call, hooks, "finish", run)
  if not ok then error(err, 0) end
  if not fok then error(ferr, 0) end
  return run
end

return M
