-- uvmrec.nn.CrossNet (lua/uvmrec/nn/CrossNet.lua) on the CPU: DCNv2's cross layers, full and low
-- rank, against a float64 reference and its central finite differences.
local R = require "dense_ref"
local nn = require("uvmrec").nn

local function cross_ref(d, L, rank)
  return function(xv, pv)
    local x0, rows = xv[1], #xv[1] / d
    local xl = x0
    for l = 1, L do
      local z
      if rank then
        local V, U, b = pv[3 * l - 2], pv[3 * l - 1], pv[3 * l]
        z = R.linear(R.linear(xl, V, nil, rows, d, rank), U, b, rows, rank, d)
      else
        z = R.linear(xl, pv[2 * l - 1], pv[2 * l], rows, d, d)
      end
      local y = {}
      for i = 1, #x0 do y[i] = x0[i] * z[i] + xl[i] end
      xl = y
    end
    return xl
  end
end

describe("uvmrec.nn.CrossNet", function()
  it("computes full-rank and low-rank cross layers and their gradients", function()
    nn.Module.manual_seed(7)
    R.gradcheck(nn.CrossNet(5, 3), { (R.rand({ 4, 5 }, 9)) }, cross_ref(5, 3), 1e-4)
    R.gradcheck(nn.CrossNet(6, 2, { rank = 2 }), { (R.rand({ 3, 6 }, 10)) }, cross_ref(6, 2, 2), 1e-4)
  end)

  it("refuses an input of another width, naming itself and the input's shape", function()
    local ur = require "uvmrec"
    assert.has_error(function() nn.CrossNet(4, 1):forward(ur.tensor({ 2, 5 }):fill(1)) end,
      "CrossNet(4, 1 layers): input is [2, 5]; expected [rows, 4]")
    assert.has_error(function() nn.CrossNet(4, 2, { rank = 2 }):forward(ur.tensor({ 4 }):fill(1)) end,
      "CrossNet(4, 2 layers, rank 2): input is [4]; expected [rows, 4]")
  end)

  it("refuses an infinite or huge size and a backward before forward, naming itself", function()
    local ur = require "uvmrec"
    assert.has_error(function() nn.CrossNet(4, math.huge) end,
      "CrossNet: layers is inf; expected a whole number from 1 to 65536")
    -- 2^63 passed as whole, and the constructor looped over that many layers; 2^40 still did
    assert.has_error(function() nn.CrossNet(4, 2 ^ 63) end,
      "CrossNet: layers is 9.2233720368548e+18; expected a whole number from 1 to 65536")
    assert.has_error(function() nn.CrossNet(4, 2 ^ 40) end,
      "CrossNet: layers is 1099511627776; expected a whole number from 1 to 65536")
    assert.has_error(function() nn.CrossNet(4, 0) end,
      "CrossNet: layers is 0; expected a whole number from 1 to 65536")
    assert.has_error(function() nn.CrossNet(4, 1.5) end,
      "CrossNet: layers is 1.5; expected a whole number from 1 to 65536")
    assert.equal(65536, nn.CrossNet.MAX_LAYERS)
    assert.has_error(function() nn.CrossNet(0, 2) end, "CrossNet: d is 0; expected a whole number >= 1")
    assert.has_error(function() nn.CrossNet(4, 2, { rank = -1 }) end,
      "CrossNet: rank is -1; expected a whole number >= 1")
    -- d * d past what a tensor holds failed inside Module, naming neither CrossNet nor d
    assert.has_error(function() nn.CrossNet(2 ^ 40, 1) end,
      "CrossNet: d 1099511627776: a weight [d, d] of 1208925819614629174706176 elements; " ..
      "expected at most 281474976710656 (2^50 bytes of f32)")
    assert.has_error(function() nn.CrossNet(4, 1, { rank = 2 ^ 62 }) end,
      "CrossNet: d 4 and rank 4611686018427387904: a U [d, rank] of 18446744073709551616 elements; " ..
      "expected at most 281474976710656 (2^50 bytes of f32)")
    assert.has_error(function() nn.CrossNet(4, 2):backward(ur.tensor({ 2, 4 }), ur.tensor({ 2, 4 })) end,
      "CrossNet(4, 2 layers): backward before forward")
  end)
end)
