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

  it("reads each table's counters once an interval and its layout only after another's change, its coverage the "
     .. "engine's layout's", function()
    -- an interval read every table's counters twice (ranked, then by id for the prefix's
    -- accesses) and, after swaps, its layout twice; its first relayout ranked them again; every
    -- interval read the layout back, which the manager has kept since, in step with its own moves
    local m, mgr = H.started { policy = "adaptive", every = 1, allowance = 64 * 1024, decay = 0.5,
                               options = { margin = 0 } }
    local reads = {}
    for _, what in ipairs { "counts", "permutation" } do
      local real = m.tbe[what]
      m.tbe[what] = function(tbe, name)
        reads[what .. " " .. name] = (reads[what .. " " .. name] or 0) + 1
        return real(tbe, name)
      end
    end
    local first = {}
    for i = 1, 100 do first[i] = i * 3 end
    local streams = { { first, { 1, 2 } }, { first, { 1, 2 } } }
    for i = 1, 4 do
      local hot = {}
      for j = 1, 60 do hot[j] = 4000 + 50 * i + j end
      streams[#streams + 1] = { hot, { 7, 9 } }
    end
    local swapped = 0
    for step, hot in ipairs(streams) do
      feed(m, hot, 4 + step)
      local outside = step == 4
      if outside then
        -- a relayout the manager did not make: table b's rows reversed under it
        local rows = m.tbe.rows.b
        local perm = require("uvmrec").tensor({ rows }, { dtype = "i64" })
        for id = 0, rows - 1 do perm[id] = rows - 1 - id end
        assert(m.tbe:relayout("b", perm))
        perm:free()
      end
      reads = {}
      local rec = assert(mgr:step(step))
      swapped = swapped + (step > 1 and rec.rows_moved or 0)
      for _, name in ipairs { "a", "b" } do
        local what = ("step %d, table %s"):format(step, name)
        assert.equal(1, reads["counts " .. name], what .. ": counters read")
        -- the first interval lays the table out itself; after, only the outside change is read
        assert.equal((outside and name == "b") and 1 or 0, reads["permutation " .. name] or 0, what .. ": layout read")
        -- the coverage measured under the layout the engine now has, from its counters
        local c, p = m.tbe:counts(name):totable(), m.tbe:permutation(name)
        p = p and p:totable()
        local k, covered, total = mgr.tables[name == "a" and 1 or 2].k, 0, 0
        for id = 0, #c - 1 do
          total = total + c[id + 1]
          if (p and p[id + 1] or id) < k then covered = covered + c[id + 1] end
        end
        local view = rec.tables[name]
        assert.equal(covered / total, view.coverage, what)
        assert.equal("host", view.rank_on, what)
      end
      assert.equal("host", rec.rank_on)
      -- measuring the coverage between intervals reads no layout either
      reads = {}
      assert.is_number(mgr:measure())
      assert.same({ nil, nil }, { reads["permutation a"], reads["permutation b"] }, ("step %d: measure"):format(step))
    end
    assert.is_true(swapped > 0, "the drift swapped no row")
    -- a gap is one table's: the policy held the last table's in one field (policy.gap)
    assert.is_nil(rawget(mgr.tables[1].policy, "gap"))
    mgr:free()
  end)

  it("refuses a margin or band outside its range, naming the policy, the option and the value", function()
    -- a margin below 0 swapped at every interval (the gap is >= 0), and one of 1 never did
    local hints = require "uvmrec.hints"
    for _, case in ipairs {
      { { margin = -0.1 }, "margin is -0.1; expected a number in [0, 1)" },
      { { margin = 1 }, "margin is 1; expected a number in [0, 1)" },
      { { margin = 0 / 0 }, "margin is " .. tostring(0 / 0) .. "; expected a number in [0, 1)" },
      { { band = -1 }, "band is -1; expected a number in [0, inf)" },
      { { band = math.huge }, "band is inf; expected a number in [0, inf)" },
      { { marign = 0.1 }, "unknown option 'marign'; expected band, margin" },
    } do
      assert.has_error(function() hints.new("adaptive", case[1]) end, "hints: policy 'adaptive': " .. case[2])
    end
    assert.equal(0, hints.new("adaptive", { margin = 0, band = 0 }).opts.margin)
  end)
end)

-- The pairs adaptive swaps and the accesses a prefix takes (ur_counts_swap_pairs,
-- ur_counts_prefix) against a plain reference: two scans of the ranking, the layout tracked as
-- pairs move, as the manager's Lua did before they went to C.
describe("uvmrec.hints swap pairs and prefix accesses", function()
  local ffi = require "ffi"
  local ur = require "uvmrec"
  local C = ur.C
  local stats = require "uvmrec.tbe_stats"
  local i64 = ffi.typeof("int64_t *")
  local function ref_pairs(o, cnt, perm, rows, k, band)
    if k <= 0 or k >= rows then return {}, {} end
    local moved = {}
    local function phys(id) return moved[id] or perm[id] end
    local enter, ec = {}, {}
    for r = 0, rows - 1 do
      local c = cnt[r]
      if c == 0 or #enter >= k then break end
      if phys(o[r]) >= k then enter[#enter + 1], ec[#enter + 1] = o[r], c end
    end
    local A, B, r = {}, {}, rows - 1
    for i = 1, #enter do
      while r >= 0 and phys(o[r]) >= k do r = r - 1 end
      if r < 0 or ec[i] <= (1 + band) * cnt[r] then break end
      local x, y = enter[i], o[r]
      moved[x], moved[y] = phys(y), phys(x)
      A[#A + 1], B[#B + 1] = x, y
      r = r - 1
    end
    return A, B
  end
  it("refuse an id of the ranking outside the table that the scans meet, naming its rank", function()
    local counts = assert(ur.tensor({ 10 }, { dtype = "i32" }))
    for i = 0, 9 do counts[i] = 10 - i end
    local a = stats.snapshot(counts, "t")
    local A = assert(ur.tensor({ 5 }, { dtype = "i64" }))
    local B = assert(ur.tensor({ 5 }, { dtype = "i64" }))
    local n = ffi.new("int64_t[1]")
    for _, case in ipairs { { 9, 99 }, { 0, -1 } } do -- the coldest (the first scan's), the hottest
      local keep = a._o[case[1]]
      a._o[case[1]] = case[2]
      assert.equal(C.UR_STATUS_INVALID, C.ur_counts_swap_pairs(a.order.p, a.cumsum.p, nil, 5, 0, A.p, B.p, n, nil))
      assert.equal(("counts_swap_pairs: order[%d] is %d; expected 0..9"):format(case[1], case[2]),
                   ffi.string(C.ur_last_error()))
      a._o[case[1]] = keep
    end
    A:free()
    B:free()
    a:free()
    counts:free()
  end)

  it("take the pairs and sums the reference takes, over layouts, prefixes, bands, ties and zeros", function()
    math.randomseed(23)
    for trial = 1, 40 do
      -- 300,000 rows: the prefix's sum in 5 parts and the side flags over threads
      local rows = trial == 40 and 300000 or ({ 1, 2, 7, 64, 1000, 5000 })[trial % 6 + 1]
      local counts = assert(ur.tensor({ rows }, { dtype = "i32" }))
      local cp = ffi.cast("int32_t *", C.ur_tensor_data(counts.p))
      local spread = ({ 2, 5, 1000 })[trial % 3 + 1]
      for i = 0, rows - 1 do cp[i] = math.random() < 0.3 and 0 or math.random(0, spread) end
      if trial % 7 == 0 then cp[0] = -3 end
      -- a layout: the identity, or a shuffle
      local perm = assert(ur.tensor({ rows }, { dtype = "i64" }))
      local pp = ffi.cast(i64, C.ur_tensor_data(perm.p))
      for i = 0, rows - 1 do pp[i] = i end
      local shuffled = trial % 2 == 0
      if shuffled then
        for i = rows - 1, 1, -1 do
          local j = math.random(0, i)
          pp[i], pp[j] = pp[j], pp[i]
        end
      end
      local a = stats.snapshot(counts, "t")
      local o, cnt, pl = {}, {}, {}
      for r = 0, rows - 1 do
        o[r] = tonumber(a._o[r])
        cnt[r] = a:count_at(r)
        pl[r] = tonumber(pp[r])
      end
      for _, k in ipairs { 0, 1, math.floor(rows / 3), math.floor(rows / 2), rows - 1, rows } do
        for _, band in ipairs { 0, 0.1, 1 } do
          local want_a, want_b = ref_pairs(o, cnt, pl, rows, k, band)
          local room = math.max(1, math.min(k, rows - k))
          local A = assert(ur.tensor({ room }, { dtype = "i64" }))
          local B = assert(ur.tensor({ room }, { dtype = "i64" }))
          local n, gain = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
          assert(C.ur_counts_swap_pairs(a.order.p, a.cumsum.p, shuffled and perm.p or nil, k, band, A.p, B.p, n,
                                        gain) == 0)
          local what = ("trial %d, %d rows, k %d, band %g"):format(trial, rows, k, band)
          assert.equal(#want_a, tonumber(n[0]), what)
          local Ap, Bp = ffi.cast(i64, C.ur_tensor_data(A.p)), ffi.cast(i64, C.ur_tensor_data(B.p))
          local want_gain = 0
          for i = 1, #want_a do
            assert.equal(want_a[i], tonumber(Ap[i - 1]), what)
            assert.equal(want_b[i], tonumber(Bp[i - 1]), what)
            want_gain = want_gain + math.max(0, cp[want_a[i]]) - math.max(0, cp[want_b[i]])
          end
          assert.equal(want_gain, tonumber(gain[0]), what .. ": gain")
          A:free()
          B:free()
        end
        local sum, want = ffi.new("int64_t[1]"), 0
        for id = 0, rows - 1 do
          if pl[id] < k then want = want + math.max(0, cp[id]) end
        end
        assert(C.ur_counts_prefix(counts.p, shuffled and perm.p or nil, k, sum) == 0)
        assert.equal(want, tonumber(sum[0]), ("prefix of %d rows, k %d"):format(rows, k))
      end
      a:free()
      counts:free()
      perm:free()
    end
  end)

  it("refuse device counters, a perm of another length and a band below 0, naming them", function()
    local counts = assert(ur.tensor({ 4 }, { dtype = "i32" }))
    counts:fill(1)
    local perm = assert(ur.tensor({ 3 }, { dtype = "i64" }))
    local perm4 = assert(ur.tensor({ 4 }, { dtype = "i64" }))
    perm4:fill(0)
    local sum = ffi.new("int64_t[1]")
    assert.equal(C.UR_STATUS_INVALID, C.ur_counts_prefix(counts.p, perm.p, 2, sum))
    assert.matches("counts_prefix: perm: expected an i64 %[4%] tensor in host memory", ffi.string(C.ur_last_error()))
    local a = stats.snapshot(counts, "t")
    local n = ffi.new("int64_t[1]")
    assert.equal(C.UR_STATUS_INVALID, C.ur_counts_swap_pairs(a.order.p, a.cumsum.p, nil, 2, -1, a.order.p,
                                                             a.cumsum.p, n, nil))
    assert.matches("counts_swap_pairs: band is %-1; expected a number >= 0", ffi.string(C.ur_last_error()))
    -- an id outside the table in the order would index the layout out of bounds
    ffi.cast("int64_t *", C.ur_tensor_data(a.order.p))[2] = 7
    assert.equal(C.UR_STATUS_INVALID, C.ur_counts_swap_pairs(a.order.p, a.cumsum.p, perm4.p, 2, 0, a.order.p,
                                                             a.cumsum.p, n, nil))
    assert.matches("counts_swap_pairs: order%[2%] is 7; expected 0..3", ffi.string(C.ur_last_error()))
    a:free()
    counts:free()
    perm:free()
    perm4:free()
  end)
end)
