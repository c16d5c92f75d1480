-- uvmrec.nn.Sigmoid: y = 1 / (1 + e^-x), computed without overflow at any x.
local Module = require "uvmrec.nn.Module"
local dense = require "uvmrec.dense"

local Sigmoid = Module:extend("Sigmoid")

function Sigmoid:updateOutput(input)
  self:follow(input)
  local rows, cols = Module.rows_cols(input)
  self.output = self:buffer("output", Module.dtype_of(input), rows, cols)
  dense.act_forward(input, self.output, "sigmoid", self.stream)
  return self.output
end

function Sigmoid:updateGradInput(input, gradOutput) -- luacheck: ignore 212
  local rows, cols = Module.rows_cols(gradOutput)
  self.gradInput = self:buffer("gradInput", Module.dtype_of(gradOutput), rows, cols)
  dense.act_backward(self.output, gradOutput, self.gradInput, "sigmoid", self.stream)
  return self.gradInput
end

return Sigmoid
