-- uvmrec.nn.BCEWithLogits (lua/uvmrec/nn/BCEWithLogits.lua) on the CPU: the loss and its gradient
-- against a float64 reference and its central finite differences.
local R = require "dense_ref"
local nn = require("uvmrec").nn

describe("uvmrec.nn.BCEWithLogits", function()
  it("computes the weighted loss, mean and sum, and its gradient", function()
    nn.Module.manual_seed(7)
    local n = 9
    local x, xv = R.rand({ n, 1 }, 11, { lo = -5, hi = 5 })
    local t, tv = R.rand({ n }, 12, { lo = 0, hi = 1 })
    local w, wv = R.rand({ n }, 13, { lo = 0, hi = 2 })
    for _, red in ipairs { "mean", "sum" } do
      local crit = nn.BCEWithLogits { reduction = red }
      local function loss()
        local s = 0
        for i = 1, n do s = s + R.bce(xv[i], tv[i], wv[i]) end
        return red == "mean" and s / n or s
      end
      assert.is_true(math.abs(crit:forward(x, t, w):get(0) - loss()) < 1e-6)
      assert.is_true(math.abs(crit:value() - loss()) < 1e-6)
      R.close(crit:backward(x, t, w):totable(), R.central_differences(loss, xv), 1e-6, "gradient")
    end
  end)
end)
