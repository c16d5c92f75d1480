-- uvmrec.nn.Linear (lua/uvmrec/nn/Linear.lua) on the CPU: act(x w^T + b) and its gradients against
-- a float64 reference and its central finite differences.
local R = require "dense_ref"
local nn = require("uvmrec").nn

describe("uvmrec.nn.Linear", function()
  it("computes act(x w^T + b) and its gradients, with and without bias and fused relu", function()
    nn.Module.manual_seed(7)
    R.gradcheck(nn.Linear(5, 4), { (R.rand({ 3, 5 }, 1)) }, function(xv, pv)
      return R.linear(xv[1], pv[1], pv[2], 3, 5, 4)
    end, 1e-4)
    R.gradcheck(nn.Linear(6, 3, { bias = false, act = "relu" }), { (R.rand({ 4, 6 }, 2)) }, function(xv, pv)
      return R.linear(xv[1], pv[1], nil, 4, 6, 3, "relu")
    end, 1e-4)
  end)
end)
