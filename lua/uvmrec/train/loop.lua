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

-- The state both loops share, and one trained batch: its learning rates, the step, the log and
-- the hooks.
local function state(t)
  return { t = t, model = t.model, opt = t.optimizer, hooks = t.hooks or {}, log_every = t.log_every or 10,
           base_lr = t.optimizer:lr(), base_emb_lr = t.model.embeddings.tbe:lr(),
           step = (t.first or 1) - 1, samples = t.samples or 0, loss = nil, logged = true, stopped = false }
end

local function train_one(st, batch)
  local t = st.t
  st.step = st.step + 1
  if t.lr then
    local f = t.lr(st.step)
    st.opt:set_lr(st.base_lr * f)
    st.model.embeddings:set_lr(st.base_emb_lr * f)
  end
  st.loss = M.step(st.model, st.opt, batch)
  st.samples = st.samples + batch.size
  st.logged = st.step % st.log_every == 0
  if st.logged and t.on_log then t.on_log(st.step, st.loss:get(0), st.samples) end
  for i = 1, #st.hooks do st.hooks[i](st.step, st.samples, batch) end
end

-- The last log line when the last step was not logged; what the loops return.
local function finish(st)
  if not st.logged and st.loss and st.t.on_log then st.t.on_log(st.step, st.loss:get(0), st.samples) end
  return st.step, st.samples, st.stopped
end

-- t = {model =, optimizer =, feed = (next() gives batches), steps = last step (nil: until the
-- data ends), first = 1, samples = 0 (trained on before first: a resumed run's), lr =
-- function(step) -> factor (nil: constant), log_every = 10, on_log = function(step, loss,
-- samples), hooks = {function(step, samples, batch), ...}, stop = function() -> true to end the loop
-- (checked before each step, after the previous one's hooks: a signal's request)}.
-- Returns the last step made, the samples trained on, and true when stop() ended it.
function M.run(t)
  local st = state(t)
  while not t.steps or st.step < t.steps do
    if t.stop and t.stop() then
      st.stopped = true
      break
    end
    local batch, err = t.feed:next()
    if err then error(err, 0) end
    if not batch then break end
    train_one(st, batch)
  end
  return finish(st)
end

-- The same loop through the prefetch pipeline (uvmrec.pipeline.Prefetch): t as for run, with
-- loader (host batches) in place of feed.  While one batch trains, the next one's rows come
-- into the embedding cache and the one after is copied to the GPU.
function M.run_pipelined(t)
  local Prefetch = require "uvmrec.pipeline.Prefetch"
  local plain = require("uvmrec.train.feed").plain
  local st = state(t)
  local source_err
  local p = Prefetch.new {
    collection = t.model.embeddings,
    source = function()
      local b, err = t.loader:next()
      if err then source_err = err end
      if not b then return nil end
      local out = plain(b) -- the collection takes the KJT as plain tensors
      out._batch = b
      return out
    end,
    release = function(b)
      for _, v in pairs(b.sparse) do v:free() end
      b._batch:release()
    end,
    step = function(batch)
      if t.stop and t.stop() then
        st.stopped = true
        return false
      end
      train_one(st, batch)
    end,
  }
  local ok, err = pcall(p.run, p, t.steps and t.steps - (t.first or 1) + 1 or nil)
  p:free()
  if not ok then error(err, 0) end
  if source_err then error(source_err, 0) end
  return finish(st)
end

return M
