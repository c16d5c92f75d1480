-- uvmrec.optim.Optimizer: the dense optimizers' shared body.  It holds the parameters' state
-- tensors and one C call per step (ur_optim_step: one fused GPU launch per 48 parameters),
-- which also refreshes the bf16 copies of bf16 models.  Built on model:parameters() after the
-- model's to() and set_precision(); parameters without a gradient (embedding tables whose
-- optimizer is fused into their backward) are left alone.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local streams = require "uvmrec.stream"
local tensor = require "uvmrec.tensor"
local C = lib.C

local Optimizer = {}
Optimizer.__index = Optimizer

local function like(t, value)
  local place = t:placement()
  local dev = (place == "host" or place == "pinned") and nil or t:device()
  local s = assert(tensor.tensor(t:size(), { placement = place, device = dev }))
  return s:fill(value)
end

-- kind: a dense optimizer's name ("sgd", "adagrad", "adam", "adamw"); params:
-- model:parameters(); opts: the settings uvmrec.optim documents, with its defaults.
function Optimizer.new(kind, params, opts, level)
  level = (level or 1) + 1
  local optim = require "uvmrec.optim"
  local name = optim.RULES[kind] and optim.RULES[kind].class or tostring(kind)
  if type(params) ~= "table" then
    error(name .. ": expected the list from model:parameters(), got " .. tostring(params), level)
  end
  local cfg, s = optim.config(kind, "dense", opts, name, level)
  local self = setmetatable({ kind = kind, name = name, cfg = cfg, params = {}, state1 = {}, state2 = {},
                              step_count = 0 }, Optimizer)
  local need1 = kind ~= "sgd" or cfg.momentum > 0
  local need2 = kind == "adam" or kind == "adamw"
  for _, p in ipairs(params) do
    if p.grad then
      local i = #self.params + 1
      self.params[i] = p
      self.state1[i] = need1 and like(p.tensor, kind == "adagrad" and s.initial_accumulator_value or 0) or nil
      self.state2[i] = need2 and like(p.tensor, 0) or nil
    end
  end
  local n = #self.params
  if s.clip_norm > 0 and n > 0 then
    -- the norm, the factor and the partial sums, where the gradients are (ur_optim_step)
    local t = self.params[1].tensor
    local place = t:placement()
    self.clip_work = assert(tensor.tensor({ C.UR_OPTIM_CLIP_WORK }, {
      dtype = "f64", placement = place, device = (place == "host" or place == "pinned") and nil or t:device() }))
    assert(self.clip_work:fill(0))
  end
  local arr = function() return ffi.new("ur_tensor *[?]", math.max(n, 1)) end
  self._p, self._g, self._s1, self._s2, self._h = arr(), arr(), arr(), arr(), arr()
  for i, p in ipairs(self.params) do
    self._p[i - 1], self._g[i - 1] = p.tensor.p, p.grad.p
    if self.state1[i] then self._s1[i - 1] = self.state1[i].p end
    if self.state2[i] then self._s2[i - 1] = self.state2[i].p end
    if p.half then self._h[i - 1] = p.half.p end
  end
  self.n = n
  return self
end

-- The learning rate of the next step; a schedule (uvmrec.optim.Schedule) sets it.
function Optimizer:lr() return self.cfg.lr end

function Optimizer:set_lr(lr)
  if type(lr) ~= "number" or lr < 0 then error("set_lr: expected a number >= 0", 2) end
  self.cfg.lr = lr
  return self
end

-- One update of every parameter from its gradient (one C call).
function Optimizer:step(stream)
  local cfg = self.cfg
  cfg.step = self.step_count + 1
  lib.must(C.ur_optim_step(streams.handle(stream, 2), cfg, self.n, self._p, self._g, self._s1, self._s2, self._h,
                           self._gate, self.clip_work and self.clip_work.p))
  self.step_count = self.step_count + 1
end

-- set_gate(flags or nil): a guard's flags (uvmrec.train.guard): while their element 0 is set
-- when a step runs, it leaves parameters and state as they are (gradients are zeroed all the
-- same), decided where it runs.
function Optimizer:set_gate(flags)
  if flags ~= nil and not tensor.is_tensor(flags) then
    error("set_gate: expected a guard's flags (an i32 tensor) or nil, got " .. tostring(flags), 2)
  end
  self._gate_t = flags
  self._gate = flags and flags.p or nil
  return self
end

-- The global norm of the gradients the last step clipped (clip_norm; a read, which waits for
-- the step), or nil without clip_norm.
function Optimizer:grad_norm()
  if not self.clip_work then return nil end
  return assert(self.clip_work:get(0))
end

function Optimizer:zero_grad(stream)
  for _, p in ipairs(self.params) do assert(p.grad:fill(0, stream)) end
end

function Optimizer:__tostring()
  local bytes = 0
  for i = 1, self.n do
    for _, s in ipairs { self.state1[i], self.state2[i] } do bytes = bytes + s:nbytes() end
  end
  return ("%s (lr %g, %d parameters, %.1f MiB of state, step %d)"):format(
    self.name, self:lr(), self.n, bytes / 2 ^ 20, self.step_count)
end

return Optimizer
