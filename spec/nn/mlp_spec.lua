-- uvmrec.nn.MLP (lua/uvmrec/nn/MLP.lua) on the CPU: Linear layers with fused ReLUs (and a
-- sigmoid last when asked) against a float64 reference and its central finite differences.
local h = require "helpers"
local R = require "dense_ref"
local nn = require("uvmrec").nn

local function mlp_ref(sizes, last)
  return function(xv, pv)
    local x, rows = xv[1], #xv[1] / sizes[1]
    for l = 1, #sizes - 1 do
      local act = (l < #sizes - 1 or last == "relu") and "relu" or "none"
      x = R.linear(x, pv[2 * l - 1], pv[2 * l], rows, sizes[l], sizes[l + 1], act)
    end
    if last == "sigmoid" then
      for i = 1, #x do x[i] = R.sigmoid(x[i]) end
    end
    return x
  end
end

describe("uvmrec.nn.MLP", function()
  it("chains Linear layers with fused relus, ending in a sigmoid when asked", function()
    nn.Module.manual_seed(7)
    R.gradcheck(nn.MLP({ 5, 7, 4, 3 }), { (R.rand({ 6, 5 }, 5)) }, mlp_ref({ 5, 7, 4, 3 }, "relu"), 1e-4)
    R.gradcheck(nn.MLP({ 4, 6, 1 }, { last = "sigmoid" }), { (R.rand({ 5, 4 }, 6)) },
      mlp_ref({ 4, 6, 1 }, "sigmoid"), 1e-4)
  end)

  it("names the size that is wrong, at the caller's line", function()
    -- 'Linear: out is 2.5; expected a whole number >= 1' at a line of MLP.lua, naming neither
    h.raises_at_caller(function() nn.MLP({ 4, 2.5 }) end, "MLP: sizes[2] is 2.5; expected a whole number >= 1")
    assert.has_error(function() nn.MLP({ 4, "8", 2 }) end, "MLP: sizes[2] is 8; expected a whole number >= 1")
    assert.has_error(function() nn.MLP({ 0, 2 }) end, "MLP: sizes[1] is 0; expected a whole number >= 1")
  end)
end)
