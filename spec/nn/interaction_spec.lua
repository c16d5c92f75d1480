-- uvmrec.nn.Interaction (lua/uvmrec/nn/Interaction.lua) on the CPU: DLRM's dot interaction against
-- a float64 reference and its central finite differences.
local R = require "dense_ref"
local nn = require("uvmrec").nn

describe("uvmrec.nn.Interaction", function()
  it("computes the pairwise dot products and their gradients, without and with self-interaction", function()
    nn.Module.manual_seed(7)
    for _, self in ipairs { false, true } do
      R.gradcheck(nn.Interaction { self_interaction = self }, { (R.rand({ 3, 4 }, 7)), (R.rand({ 3, 12 }, 8)) },
        function(xv) return (R.interaction(xv[1], xv[2], 3, 3, 4, self)) end, 1e-4)
    end
  end)
end)
