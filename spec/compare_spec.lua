-- uvmrec.compare: the relative differences the specs' references and the benchmarks' checks use.
local compare = require "uvmrec.compare"

describe("uvmrec.compare", function()
  it("maxrel is the largest difference relative to max(1, |reference|)", function()
    assert.equals(0, compare.maxrel({ 1, -2, 3 }, { 1, -2, 3 }))
    -- 0.5 against 0.25 is measured absolutely; 110 against 100 relative to 100
    assert.near(0.25, compare.maxrel({ 0.5, 110 }, { 0.25, 100 }), 1e-15)
    assert.near(0.1, compare.maxrel({ 0.5, 110 }, { 0.45, 100 }), 1e-15)
  end)

  it("maxrel names the element where the largest difference is", function()
    assert.same({ 0.25, 1 }, { compare.maxrel({ 0.5, 110 }, { 0.25, 100 }) })
    assert.same({ 0.5, 3 }, { compare.maxrel({ 1, 2, 4.5, 3 }, { 1, 2.25, 3, 3 }) })
    assert.same({ 0 }, { compare.maxrel({ 1, -2 }, { 1, -2 }) })
  end)

  it("normrel is ||a - b|| / ||b|| over the whole list", function()
    assert.near(math.sqrt(0.25 + 1) / math.sqrt(9 + 16), compare.normrel({ 3.5, 3 }, { 3, 4 }), 1e-15)
    assert.equals(0, compare.normrel({ 0, 0 }, { 0, 0 }))
  end)

  it("makes a NaN fail every tolerance", function()
    assert.same({ math.huge, 2 }, { compare.maxrel({ 1, 0 / 0, 5 }, { 1, 1, 1 }) })
    assert.equals(math.huge, compare.normrel({ 1, 0 / 0 }, { 1, 1 }))
  end)

  it("names lists of different lengths", function()
    assert.has_error(function() compare.maxrel({ 1, 2 }, { 1 }) end,
                     "compare: the lists have 2 and 1 elements; expected as many")
    assert.has_error(function() compare.normrel({}, { 1 }) end,
                     "compare: the lists have 0 and 1 elements; expected as many")
  end)
end)
