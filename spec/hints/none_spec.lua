-- The none policy (lua/uvmrec/hints/none.lua) through the hints manager on the CPU.
local H = require "hints_ref"

describe("uvmrec.hints.none", function()
  it("gives no hint at all", function()
    local m, mgr, s0 = H.started { policy = "none", every = 2 }
    H.feed(m, { { 5 }, { 6 } }, 3)
    mgr:step(2)
    assert.equal(0, #H.log_since(s0))
    mgr:free()
  end)
end)
