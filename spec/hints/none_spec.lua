-- The none policy (lua/uvmrec/hints/none.lua) through the hints manager on the CPU.
local hints = require "uvmrec.hints"
local H = require "hints_ref"

local tables, feed, log_since, last_seq = H.tables, H.feed, H.log_since, H.last_seq

describe("uvmrec.hints.none", function()
  it("gives no hint at all", function()
    local m = tables()
    local s0 = last_seq()
    local mgr = hints.manager(m, { policy = "none", every = 2 })
    mgr:start(0)
    feed(m, { { 5 }, { 6 } }, 3)
    mgr:step(2)
    assert.equal(0, #log_since(s0))
    mgr:free()
  end)
end)
