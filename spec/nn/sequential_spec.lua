-- uvmrec.nn.Sequential (lua/uvmrec/nn/Sequential.lua): children in order, printed as a tree,
-- a child's error prefixed with its index and type.  (Its gradients: mlp_spec.lua.)
local R = require "dense_ref"
local nn = require("uvmrec").nn

describe("uvmrec.nn.Sequential", function()
  it("prints as a tree", function()
    local m = nn.Sequential(nn.MLP({ 13, 8 }), nn.Interaction(), nn.CrossNet(4, 2), nn.BCEWithLogits())
    assert.equal(table.concat({
      "Sequential {",
      "  (1): Sequential {",
      "    (1): Linear(13 -> 8, +relu)",
      "    (2): ReLU (fused into the Linear before it)",
      "  }",
      "  (2): Interaction",
      "  (3): CrossNet(4, 2 layers)",
      "  (4): BCEWithLogits(mean)",
      "}" }, "\n"), tostring(m))
  end)

  it("prefixes a child's error with its index and type; modules name bad input", function()
    local m = nn.Sequential(nn.ReLU(), nn.Linear(13, 4))
    assert.error_matches(function() m:forward(R.rand({ 2, 9 }, 1)) end,
      "Sequential: %(2%) Linear: Linear%(13 %-> 4%): input is %[2, 9%]; expected %[rows, 13%]")
    assert.error_matches(function() nn.Linear(0, 3) end, "Linear: in is 0; expected a whole number >= 1")
    assert.error_matches(function() nn.Sequential():add({}) end, "Sequential:add: expected a module")
    -- the location shown is the line that called the container, forward and backward
    local lines, errs = {}, {}
    local x = R.rand({ 2, 13 }, 2)
    local calls = { function() m:forward(R.rand({ 2, 9 }, 1)) end, function() m:forward(x) end,
                    function() m:backward(x, R.zeros({ 2, 5 })) end,
                    function() m:updateGradInput(x, R.zeros({ 2, 5 })) end }
    for k, f in ipairs(calls) do
      lines[k] = debug.getinfo(f, "S").linedefined
      errs[k] = select(2, pcall(f))
    end
    assert.is_nil(errs[2])
    for k = 3, 4 do assert.matches("Sequential: (2) Linear: ", errs[k], 1, true) end
    for _, k in ipairs { 1, 3, 4 } do
      assert.matches("^[^:]*sequential_spec%.lua:" .. lines[k] .. ": Sequential: ", errs[k])
    end
    assert.error_matches(function() nn.Interaction():forward(R.zeros({ 2, 2 })) end,
      "Interaction: input must be {dense %[rows, d%], emb %[rows, T%*d%]}")
  end)
end)
