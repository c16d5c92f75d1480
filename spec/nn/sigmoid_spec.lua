-- uvmrec.nn.Sigmoid (lua/uvmrec/nn/Sigmoid.lua) and its base uvmrec.nn.Activation on the CPU,
-- against a float64 reference and its central finite differences.
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

describe("uvmrec.nn.Activation", function()
  it("is the base of ReLU and Sigmoid, and not a module on its own", function()
    assert.is_true(nn.Module.is(nn.Sigmoid(), nn.Activation))
    assert.is_true(nn.Module.is(nn.ReLU(), nn.Activation))
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() local m = nn.Activation() return m end)
    assert.is_false(ok)
    assert.equal("sigmoid_spec.lua:" .. line .. ": Activation: the base of activations; a subclass names its "
                 .. "function in act", err:match("[^/]*$"))
  end)
end)
