-- uvmrec.nn.Sigmoid (lua/uvmrec/nn/Sigmoid.lua) on the CPU, against a float64 reference and its
-- central finite differences.
local R = require "dense_ref"
local nn = require("uvmrec").nn

describe("uvmrec.nn.Sigmoid", function()
  it("computes 1 / (1 + exp(-x)) and its gradient", function()
    nn.Module.manual_seed(7)
    R.gradcheck(nn.Sigmoid(), { (R.rand({ 4, 5 }, 4, { lo = -4, hi = 4 })) }, function(xv)
      local y = {}
      for i, v in ipairs(xv[1]) do y[i] = R.sigmoid(v) end
      return y
    end, 1e-4)
  end)
end)
