-- uvmrec.nn.BCEWithLogits: binary cross-entropy on logits, stable at any logit, with optional
-- per-sample weights (a criterion, as torch7's: forward(input, target[, weights])).
-- forward returns the loss as a one-element f32 tensor where the input is (reading it as a
-- number, loss:get(0) or crit:value(), waits for the GPU; a training loop need not).
-- input [rows] or [rows, 1], f32 or bf16; target and weights f32 of rows elements.
local Module = require "uvmrec.nn.Module"
local dense = require "uvmrec.dense"

local BCE = Module:extend("BCEWithLogits")

-- BCEWithLogits({reduction = "mean" | "sum"})
function BCE:__init(opts)
  Module.__init(self)
  opts = Module.options("BCEWithLogits", opts, { reduction = "string" }, 3)
  self.reduction = opts.reduction or "mean"
  if self.reduction ~= "mean" and self.reduction ~= "sum" then
    error("BCEWithLogits: reduction must be mean or sum, got " .. tostring(self.reduction), 3)
  end
end

function BCE:updateOutput(input, target, weights)
  self:follow(self:tensor_arg(input, "input", 2))
  self:tensor_arg(target, "target", 2)
  if weights ~= nil then self:tensor_arg(weights, "weights", 2) end
  self.output = self:buffer("loss", "f32", 1, 1)
  self:op(2, dense.bce_forward, input, target, weights, self.output, self.reduction, self.stream)
  return self.output
end

function BCE:forward(input, target, weights)
  return self:updateOutput(input, target, weights)
end

function BCE:updateGradInput(input, target, weights)
  local rows, cols = Module.rows_cols(self:tensor_arg(input, "input", 2))
  self:tensor_arg(target, "target", 2)
  if weights ~= nil then self:tensor_arg(weights, "weights", 2) end
  self.gradInput = self:buffer("gradInput", Module.dtype_of(input), rows, cols)
  self:op(2, dense.bce_backward, input, target, weights, self.gradInput, self.reduction, 1, self.stream)
  return self.gradInput
end

function BCE:backward(input, target, weights)
  return self:updateGradInput(input, target, weights)
end

-- The last loss as a number (waits for the GPU).
function BCE:value()
  return self.output and self.output:get(0)
end

function BCE:extra_repr()
  return "(" .. self.reduction .. ")"
end

return BCE
