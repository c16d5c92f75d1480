-- The host policy (lua/uvmrec/hints/host.lua) through the hints manager on the CPU (what it
-- places is read back from the engine's record: spec/support/hints_ref.lua).
local ur = require "uvmrec"
local H = require "hints_ref"

local feed, log_since, last_seq = H.feed, H.log_since, H.last_seq

describe("uvmrec.hints.host", function()
  it("prefers every row on the host, accessed by the GPU, once; nothing is counted on the GPU", function()
    -- earlier specs' tables, placed on the GPU and dropped, are freed now, not while this runs
    collectgarbage()
    collectgarbage()
    local gpu0 = ur.memory().managed_on_gpu
    local m, mgr, s0 = H.started { policy = "host", every = 5 }
    local log = log_since(s0)
    -- 2 tables x (weights, state) x (preferred, accessed_by, prefetch)
    assert.equal(12, #log)
    for _, name in ipairs { "a", "b" } do
      local ad = m:table(name):advised()
      assert.equal("cpu", ad.preferred_location)
      assert.same({ "cuda:0" }, ad.accessed_by)
      assert.equal("cpu", ad.last_prefetch_location)
    end
    assert.equal(gpu0, ur.memory().managed_on_gpu)
    feed(m, { { 1, 2 }, { 3 } }, 4)
    local s1 = last_seq()
    assert(mgr:step(5))
    assert.equal(0, #log_since(s1))
    mgr:free()
  end)
end)
