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

-- none and host ignore the allowance: the split of it ranked every table's counters on their
-- first intervals (a sort of each table's rows) for shares they never read
describe("uvmrec.hints: policies that ignore the allowance", function()
  local stats = require "uvmrec.tbe_stats"

  -- The tables ranked at each interval of a manager of opts (by name: how many times).
  local function ranked(opts)
    local real, ranks = stats.snapshot, {}
    stats.snapshot = function(v, name, ...)
      ranks[#ranks][name] = (ranks[#ranks][name] or 0) + 1
      return real(v, name, ...)
    end
    local ok, err = pcall(function()
      ranks[1] = {}
      local m, mgr = H.started(opts)
      local recs = {}
      for step = 1, 3 do
        ranks[step + 1] = {}
        H.feed(m, { { 5, 6, 7 }, { 8, 9 } }, 3)
        recs[step] = assert(mgr:step(step))
      end
      mgr:free()
      return recs
    end)
    stats.snapshot = real
    assert(ok, err)
    return ranks, err
  end

  it("ranks no counters under none or host, and the record says none was ranked", function()
    for _, p in ipairs { "none", "host" } do
      local ranks, recs = ranked { policy = p, every = 1, allowance = "50%" }
      for i, r in ipairs(ranks) do assert.same({}, r, p .. ": interval " .. i) end
      for i, r in ipairs(recs) do assert.is_nil(r.rank_on, p .. ": step " .. i) end
    end
  end)

  it("ranks only the tables of policies that read their share", function()
    local ranks = ranked { policy = "host", every = 1, allowance = "50%", tables = { b = { policy = "hot_prefix" } } }
    -- b's share is split (b ranked) at start and until the first interval after step 1 that saw
    -- counts (step 2), then settled; a's never
    assert.same({ { b = 1 }, { b = 1 }, { b = 1 }, {} }, ranks)
  end)
end)
