-- uvmrec.nn.ReLU: y = max(x, 0).  Sequential fuses a ReLU that follows a Linear into the
-- Linear's epilogue; the ReLU then passes values and gradients through untouched.
local Module = require "uvmrec.nn.Module"
local dense = require "uvmrec.dense"

local ReLU = Module:extend("ReLU")
ReLU.is_relu = true -- Sequential fuses it into a Linear before it

function ReLU:__init()
  Module.__init(self)
  self.fused = false
end

function ReLU:updateOutput(input)
  if self.fused then
    self.output = input
    return input
  end
  self:follow(input)
  local rows, cols = Module.rows_cols(input)
  self.output = self:buffer("output", Module.dtype_of(input), rows, cols)
  dense.act_forward(input, self.output, "relu", self.stream)
  return self.output
end

function ReLU:updateGradInput(input, gradOutput) -- luacheck: ignore 212
  if self.fused then
    self.gradInput = gradOutput
    return gradOutput
  end
  local rows, cols = Module.rows_cols(gradOutput)
  self.gradInput = self:buffer("gradInput", Module.dtype_of(gradOutput), rows, cols)
  dense.act_backward(self.output, gradOutput, self.gradInput, "relu", self.stream)
  return self.gradInput
end

function ReLU:extra_repr()
  return self.fused and " (fused into the Linear before it)" or ""
end

return ReLU
