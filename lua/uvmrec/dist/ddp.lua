-- uvmrec.dist.ddp: dense modules trained data-parallel.  Every rank holds the same dense
-- parameters and runs its share of the global batch; their gradients are summed over the ranks
-- by all-reduces started during the backward: the gradients are cut into buckets of about
-- bucket_bytes in the order the backward produces them (the parameters' order, reversed), and a
-- bucket's all-reduce starts as soon as the modules holding it have done their backward and every
-- earlier bucket has started, so the order is the same on every rank and in every step.  The
-- model's backward returns once all of them are done.  The model's BCE criterion takes the loss
-- over the global batch: its value is the mean over every rank's samples, and each sample's
-- gradient is scaled by 1 / (global batch), as one process training on the global batch scales
-- it, so the summed gradients are that process's.
--
--   require("uvmrec.dist.ddp").data_parallel(model, {comm = comm, bucket_bytes = 25 * 2^20})
local Module = require "uvmrec.nn.Module"
local BCE = require "uvmrec.nn.BCEWithLogits"
local dense = require "uvmrec.dense"

local M = {}

M.BUCKET_BYTES = 25 * 2 ^ 20

-- The criterion over the global batch (the ranks' batches are equal shares of it).
local function global_criterion(crit, comm)
  local W = comm.world
  function crit:updateOutput(input, target, weights) -- luacheck: ignore 212/self
    self:follow(input)
    local mine = self:buffer("loss_rank", "f32", 1, 1)
    dense.bce_forward(input, target, weights, mine, "mean", self.stream)
    local all = self:buffer("loss_ranks", "f32", 1, W)
    assert(comm:all_gather(mine, all, self.stream))
    assert(comm:wait(self.stream))
    self.output = self:buffer("loss", "f32", 1, 1)
    dense.mean(all, self.output, self.stream)
    return self.output
  end
  function crit:updateGradInput(input, target, weights)
    local rows, cols = Module.rows_cols(input)
    self.gradInput = self:buffer("gradInput", Module.dtype_of(input), rows, cols)
    dense.bce_backward(input, target, weights, self.gradInput, "sum", 1 / (rows * W), self.stream)
    return self.gradInput
  end
  crit.global_world = W
end

-- Makes model's dense modules data-parallel over opts.comm (default: the job's).  Fused
-- parameters (embedding tables) are left to their collections.  Returns the model.
function M.data_parallel(model, opts)
  opts = opts or {}
  local comm = opts.comm or require("uvmrec.dist").job()
  local limit = opts.bucket_bytes or M.BUCKET_BYTES
  if type(limit) ~= "number" or limit ~= limit or limit < 0 then
    error(("ddp: bucket_bytes is %s; expected a number of bytes >= 0"):format(tostring(limit)), 2)
  end
  local params = {}
  for _, p in ipairs(model:parameters()) do
    if not p.fused and p.grad then params[#params + 1] = p end
  end
  -- buckets in backward order
  local buckets, cur, bytes = {}, nil, 0
  local of_module = {}
  for i = #params, 1, -1 do
    local p = params[i]
    if not cur or bytes >= limit then
      cur = { grads = {}, modules = {}, waiting = 0 }
      buckets[#buckets + 1] = cur
      bytes = 0
    end
    cur.grads[#cur.grads + 1] = p.grad
    bytes = bytes + p.grad:nbytes()
    local m = p.module
    if not cur.modules[m] then
      cur.modules[m] = true
      cur.waiting = cur.waiting + 1
      of_module[m] = of_module[m] or {}
      of_module[m][#of_module[m] + 1] = cur
    end
  end
  local state = { next = 1, ready = {}, left = {} }
  for i, b in ipairs(buckets) do state.left[i] = b.waiting end

  local function launch(b)
    assert(comm:group_start())
    for _, g in ipairs(b.grads) do assert(comm:all_reduce(g, "sum", model.stream)) end
    assert(comm:group_end(model.stream))
  end
  local function advance()
    while buckets[state.next] and state.left[state.next] == 0 do
      launch(buckets[state.next])
      state.next = state.next + 1
    end
  end
  local index = {}
  for i, b in ipairs(buckets) do index[b] = i end
  local function done(m)
    if state.ready[m] then return end
    state.ready[m] = true
    for _, b in ipairs(of_module[m]) do
      local i = index[b]
      state.left[i] = state.left[i] - 1
    end
    advance()
  end
  -- each module holding parameters reports when its backward (or accGradParameters) is done;
  -- its weight gradient stays on the model's stream, where the bucket's all-reduce follows it
  -- (a side stream's would not be done: uvmrec.nn.Linear's async_wgrad)
  for m in pairs(of_module) do
    m.async_wgrad = false
    local backward, acc = m.backward, m.accGradParameters
    m.backward = function(self, ...)
      local r = backward(self, ...)
      done(self)
      return r
    end
    m.accGradParameters = function(self, ...)
      local r = acc(self, ...)
      done(self)
      return r
    end
  end
  -- Each rank's batch is rows rank * B .. of the global batch: the CPU computes every row of
  -- the dense layers as it computes that row of the global batch (uvmrec.dense.ROW0).
  local mods = {}
  model:apply(function(m) mods[#mods + 1] = m end)
  local model_forward = model.forward
  model.forward = function(self, batch, ...)
    local rows = batch and batch.dense and batch.dense:size(1) or 0
    for _, m in ipairs(mods) do m.row0 = comm.rank * rows end
    return model_forward(self, batch, ...)
  end
  local model_backward = model.backward
  model.backward = function(self, ...)
    local r = model_backward(self, ...)
    -- the buckets of modules the backward did not reach, still in order; then every one done
    for i = state.next, #buckets do state.left[i] = 0 end
    advance()
    assert(comm:wait(model.stream))
    state.next, state.ready = 1, {}
    for i, b in ipairs(buckets) do state.left[i] = b.waiting end
    return r
  end
  model.data_parallel = { comm = comm, buckets = #buckets, bucket_bytes = limit }
  if model.criterion and Module.is(model.criterion, BCE) then global_criterion(model.criterion, comm) end
  return model
end

return M
