-- uvmrec.nn.ReLU (lua/uvmrec/nn/ReLU.lua) on its own on the CPU (after a Linear it is fused into
-- it: linear_spec.lua), against a float64 reference and its central finite differences.
local R = require "dense_ref"
local nn = require("uvmrec").nn

describe("uvmrec.nn.ReLU", function()
  it("passes positive values and their gradients, zeroes the rest", function()
    nn.Module.manual_seed(7)
    R.gradcheck(nn.ReLU(), { (R.rand({ 4, 5 }, 3)) }, function(xv)
      local y = {}
      for i, v in ipairs(xv[1]) do y[i] = math.max(v, 0) end
      return y
    end, 1e-4)
  end)
end)
