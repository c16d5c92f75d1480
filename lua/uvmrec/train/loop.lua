-- The training loop, short enough to copy for a loop of one's own.  Per step: the next batch,
-- the learning rates, forward, the loss, backward (the embedding rows the batch read are
-- updated inside it: their optimizer is fused), the dense optimizer's step (which also zeroes
-- the gradients).  A handful of engine calls, no per-element work in Lua, and no wait for the
-- GPU except where the loss is read, every log_every steps.
local M = {}

-- One step on a batch; the loss is a one-element tensor where the model runs (reading it waits).
function M.step(model, optimizer, batch)
  local crit = model.criterion
  local logits = model:forward(batch)
  local loss = crit:forward(logits, batch.labels)
  model:backward(batch, crit:backward(logits, batch.labels))
  optimizer:step()
  return loss
end

-- t = {model =, optimizer =, feed = (next() gives batches), steps = last step (nil: until the
-- data ends), first = 1, samples = 0 (trained on before first: a resumed run's), lr =
-- function(step) -> factor (nil: constant), log_every = 10, on_log = function(step, loss,
-- samples), hooks = {function(step, samples, batch), ...}, stop = function() -> true to end the loop
-- (checked before each step, after the previous one's hooks: a signal's request)}.
-- Returns the last step made, the samples trained on, and true when stop() ended it.
function M.run(t)
  local model, opt, feed, stop = t.model, t.optimizer, t.feed, t.stop
  local base_lr, base_emb_lr = opt.lr, model.embeddings.tbe:lr()
  local log_every, hooks = t.log_every or 10, t.hooks or {}
  local step, samples, loss, logged = (t.first or 1) - 1, t.samples or 0, nil, true
  local stopped = false
  while not t.steps or step < t.steps do
    if stop and stop() then
      stopped = true
      break
    end
    local batch, err = feed:next()
    if err then error(err, 0) end
    if not batch then break end
    step = step + 1
    if t.lr then
      local f = t.lr(step)
      opt:set_lr(base_lr * f)
      model.embeddings:set_lr(base_emb_lr * f)
    end
    loss = M.step(model, opt, batch)
    samples = samples + batch.size
    logged = step % log_every == 0
    if logged and t.on_log then t.on_log(step, loss:get(0), samples) end
    for i = 1, #hooks do hooks[i](step, samples, batch) end
  end
  if not logged and loss and t.on_log then t.on_log(step, loss:get(0), samples) end
  return step, samples, stopped
end

-- The same loop through the prefetch pipeline (uvmrec.pipeline.Prefetch): t as for run, with
-- loader (host batches) in place of feed.  While one batch trains, the next one's rows come
-- into the embedding cache and the one after is copied to the GPU.
function M.run_pipelined(t)
  local Prefetch = require "uvmrec.pipeline.Prefetch"
  local model, opt, stop = t.model, t.optimizer, t.stop
  local base_lr, base_emb_lr = opt.lr, model.embeddings.tbe:lr()
  local log_every, hooks = t.log_every or 10, t.hooks or {}
  local first = t.first or 1
  local step, samples, loss, logged, stopped = first - 1, t.samples or 0, nil, true, false
  local source_err
  local p = Prefetch.new {
    collection = model.embeddings,
    source = function()
      local b, err = t.loader:next()
      if err then source_err = err end
      if not b then return nil end
      local k = b.sparse
      -- the loader's batch, with its KJT as the plain tensors the collection takes
      return { dense = b.dense, labels = b.labels, size = b.size, _batch = b,
               sparse = { values = k:values(), offsets = k:offsets(), weights = k:weights() } }
    end,
    release = function(b)
      for _, v in pairs(b.sparse) do v:free() end
      b._batch:release()
    end,
    step = function(batch)
      if stop and stop() then
        stopped = true
        return false
      end
      step = step + 1
      if t.lr then
        local f = t.lr(step)
        opt:set_lr(base_lr * f)
        model.embeddings:set_lr(base_emb_lr * f)
      end
      loss = M.step(model, opt, batch)
      samples = samples + batch.size
      logged = step % log_every == 0
      if logged and t.on_log then t.on_log(step, loss:get(0), samples) end
      for i = 1, #hooks do hooks[i](step, samples, batch) end
    end,
  }
  local ok, err = pcall(p.run, p, t.steps and t.steps - first + 1 or nil)
  p:free()
  if not ok then error(err, 0) end
  if source_err then error(source_err, 0) end
  if not logged and loss and t.on_log then t.on_log(step, loss:get(0), samples) end
  return step, samples, stopped
end

return M
