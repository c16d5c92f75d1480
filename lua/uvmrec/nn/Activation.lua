-- uvmrec.nn.Activation: the base of the elementwise activations that uvmrec.dense runs by name
-- (act_forward, act_backward): a subclass names its function in `act` ("relu", "sigmoid").
--
--   local Sigmoid = require("uvmrec.nn.Activation"):extend("Sigmoid")
--   Sigmoid.act = "sigmoid"
local Module = require "uvmrec.nn.Module"
local dense = require "uvmrec.dense"

local Activation = Module:extend("Activation")

function Activation:__init()
  Module.__init(self)
  if not self.act then
    error(self:type_name() .. ": the base of activations; a subclass names its function in act", 3)
  end
end

function Activation:updateOutput(input)
  self:follow(self:tensor_arg(input, "input", 2))
  local rows, cols = Module.rows_cols(input)
  self.output = self:buffer("output", Module.dtype_of(input), rows, cols)
  self:op(2, dense.act_forward, input, self.output, self.act, self.stream)
  return self.output
end

function Activation:updateGradInput(input, gradOutput) -- luacheck: ignore 212
  -- level 3: Module.backward calls this, not in a tail call
  if not self.output then error(tostring(self) .. ": backward before forward", 3) end
  local rows, cols = Module.rows_cols(self:tensor_arg(gradOutput, "gradOutput", 3))
  self.gradInput = self:buffer("gradInput", Module.dtype_of(gradOutput), rows, cols)
  self:op(3, dense.act_backward, self.output, gradOutput, self.gradInput, self.act, self.stream)
  return self.gradInput
end

return Activation
