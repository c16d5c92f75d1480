-- The adaptive policy (lua/uvmrec/hints/adaptive.lua) through the hints manager on the CPU.
local R = require "tbe_ref"
local H = require "hints_ref"

local feed, log_since, last_seq = H.feed, H.log_since, H.last_seq
local PAGE = H.PAGE

describe("uvmrec.hints.adaptive", function()
  it("re-ranks as the stream drifts and swaps only the rows that crossed", function()
    local m, mgr = H.started { policy = "adaptive", every = 1, allowance = 64 * 1024, decay = 0 }
    local first = {}
    for i = 1, 100 do first[i] = i * 3 end
    feed(m, { first, { 1 } }, 4)
    assert(mgr:step(1))
    local ka = mgr.tables[1].k
    local probe = { values = R.tensor({ 3, 6, 9, 1 }, "i64"), offsets = R.tensor({ 0, 1, 2, 3, 4 }, "i64") }
    local before = m:forward(probe)
    local w_before = before:totable()
    -- the same stream: within the margin, nothing moves
    feed(m, { first, { 1 } }, 4)
    local rec = assert(mgr:step(2))
    assert.equal(0, rec.rows_moved)
    -- another stream: 50 new hot ids, outside the prefix
    local second = {}
    for i = 1, 50 do second[i] = 5000 + i end
    feed(m, { second, { 1 } }, 8)
    local s0 = last_seq()
    rec = assert(mgr:step(3))
    assert.is_true(rec.rows_moved > 0 and rec.rows_moved <= 2 * 50, "moved " .. rec.rows_moved)
    local pa, k2 = m.tbe:permutation("a"):totable(), mgr.tables[1].k
    for _, id in ipairs(second) do assert.is_true(pa[id + 1] < k2, "id " .. id .. " at " .. pa[id + 1]) end
    -- the share moved a little with the counts: only rows between the old end and the new one
    -- are advised again (the prefix is prefetched again: its rows were rewritten)
    local wid = m:table("a"):id()
    local lo = math.floor(math.min(ka, k2) * 64 / PAGE) * PAGE
    for _, r in ipairs(log_since(s0)) do
      if r.tensor == wid and r.kind == "advise" then assert.is_true(r.b0 >= lo, r.b0 .. " < " .. lo) end
    end
    -- lookups read the same values after the swap
    local after = m:forward(probe)
    assert.same(w_before, after:totable())
    mgr:free()
  end)
end)
