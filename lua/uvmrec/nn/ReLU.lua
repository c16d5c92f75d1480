-- uvmrec.nn.ReLU: y = max(x, 0).  Sequential fuses a ReLU that follows a Linear into the
-- Linear's epilogue; the ReLU then passes values and gradients through untouched.
local Activation = require "uvmrec.nn.Activation"

local ReLU = Activation:extend("ReLU")
ReLU.act = "relu"
ReLU.is_relu = true -- Sequential fuses it into a Linear before it

function ReLU:__init()
  Activation.__init(self)
  self.fused = false
end

function ReLU:updateOutput(input)
  if self.fused then
    self.output = input
    return input
  end
  return Activation.updateOutput(self, input)
end

function ReLU:updateGradInput(input, gradOutput)
  if self.fused then
    self.gradInput = gradOutput
    return gradOutput
  end
  return Activation.updateGradInput(self, input, gradOutput)
end

function ReLU:extra_repr()
  return self.fused and " (fused into the Linear before it)" or ""
end

return ReLU
