local ffi = require "ffi"
local ur = require "uvmrec"
local profile = require "uvmrec.planner.profile"
local presets = require "uvmrec.data.presets"
local synthetic = require "uvmrec.data.synthetic"
local helpers = require "helpers"

-- Zipf(s) over ranks 1..n by direct summation (float64): the reference.
local function zipf_ref(n, s)
  local p, h = {}, 0
  for k = 1, n do
    p[k] = k ^ -s
    h = h + p[k]
  end
  for k = 1, n do p[k] = p[k] / h end
  return p
end

describe("planner.profile", function()
  it("gives the coverage and distinct rows of the generator's Zipf, against direct sums", function()
    for _, case in ipairs({ { 20000, 1.05 }, { 5000, 0.7 }, { 3000, 1.3 } }) do
      local n, s = case[1], case[2]
      local p = zipf_ref(n, s)
      local P = profile.zipf { rows = n, s = s }
      for _, k in ipairs({ 1, 10, 64, 100, 1000, n }) do
        local top = 0
        for r = 1, k do top = top + p[r] end
        assert.is_true(math.abs(P:top(k) - top) < 1e-3 * top + 1e-12,
          ("top(%d) %.9g vs %.9g"):format(k, P:top(k), top))
      end
      for _, L in ipairs({ 1, 128, 4096, 65536 }) do
        local d = 0
        for r = 1, n do d = d + 1 - (1 - p[r]) ^ L end
        assert.is_true(math.abs(P:distinct(L) / d - 1) < 5e-4,
          ("distinct(%d) %.6g vs %.6g"):format(L, P:distinct(L), d))
      end
      assert.near(P:coverage(1), 1, 1e-12)
    end
  end)

  it("gives zipf_stream's continuous Zipf as BENCH.md quotes it for 16M rows", function()
    local P = profile.zipf { rows = 16 * 2 ^ 20, s = 1.05, variant = "continuous" }
    -- BENCH.md: the hottest 1% take 80%, 5% 87.5%, 20% 93.5%, 50% 97.3%
    assert.near(P:coverage(0.01), 0.800, 0.001)
    assert.near(P:coverage(0.05), 0.875, 0.001)
    assert.near(P:coverage(0.20), 0.935, 0.001)
    assert.near(P:coverage(0.50), 0.973, 0.001)
  end)

  it("agrees with what the synthetic generator draws (kaggle preset, 16 batches of 4096)", function()
    local s = synthetic.spec("kaggle")
    local B, K = 4096, 16
    local g = assert(synthetic.generate(s, 0, B * K))
    local ids = ffi.cast("int64_t *", ur.C.ur_tensor_data(g.ids.p))
    local H = #s.tables
    for t = 1, H do
      local rows = s.tables[t].rows
      local P = profile.zipf { rows = rows, s = 1.05 }
      local total, counts, top = 0, {}, 0
      for k = 0, K - 1 do
        local seen, u = {}, 0
        for i = 0, B - 1 do
          local id = tonumber(ids[(k * B + i) * H + t - 1])
          if not seen[id] then seen[id], u = true, u + 1 end
          counts[id] = (counts[id] or 0) + 1
        end
        total = total + u
      end
      for _, c in pairs(counts) do top = math.max(top, c) end
      local measured, model = total / K, P:distinct(B)
      -- distinct rows a batch: within 2% (sampling noise over 16 batches is below 1% here)
      assert.is_true(math.abs(measured / model - 1) < 0.02,
        ("table C%d (%d rows): %.1f distinct rows a batch measured, %.1f modelled"):format(t, rows, measured, model))
      -- the hottest row's share: within 4 binomial standard deviations
      local p1, n = P.p[1], B * K
      assert.is_true(math.abs(top / n - p1) < 4 * math.sqrt(p1 * (1 - p1) / n) + 1e-9,
        ("table C%d: hottest row %.4f measured, %.4f modelled"):format(t, top / n, p1))
    end
  end)

  it("ranks per-row counts into classes (a tensor or a list)", function()
    local counts = { 0, 5, 1, 5, 0, 9, 1, 1 } -- 8 rows, 22 lookups
    local P = profile.from_counts(counts, { hot = 2 })
    assert.equal(8, P.rows)
    assert.equal(2, P.hot)
    assert.near(P:top(1), 9 / 22, 1e-12)
    assert.near(P:top(3), 19 / 22, 1e-12)
    assert.near(P:top(6), 22 / 22, 1e-12)
    assert.near(P:coverage(0.25), 14 / 22, 1e-12) -- 2 of 8 rows: 9 + 5
    assert.equal(6, P:support())
    local d = 0
    for _, c in ipairs(counts) do d = d + 1 - (1 - c / 22) ^ 10 end
    assert.near(P:distinct(10), d, 1e-9)
    local t = assert(ur.tensor({ 8 }, { dtype = "i32" }))
    for i, c in ipairs(counts) do t:set(i - 1, c) end
    assert.near(profile.from_counts(t):top(3), 19 / 22, 1e-12)
    t:free()
    -- nothing counted: every row alike
    assert.near(profile.from_counts({ 0, 0, 0, 0 }):top(1), 0.25, 1e-12)
    local f = assert(ur.tensor({ 3 }, { dtype = "f32" }))
    assert.has_error(function() profile.from_counts(f) end, "profile.from_counts: counts must be i32 (got f32)")
    f:free()
  end)

  it("refuses a negative count, naming the table, the row and the count", function()
    -- they were taken as 0: a corrupt counter made a cold row of it, unsaid
    assert.has_error(function() profile.from_counts({ 3, 0, -2, 5 }, { name = "C3" }) end,
      "profile.from_counts: table 'C3' row 2 (counts[3]) has count -2; expected counts >= 0")
    assert.has_error(function() profile.from_counts({ -1 }) end,
      "profile.from_counts: row 0 (counts[1]) has count -1; expected counts >= 0")
    local t = assert(ur.tensor({ 6 }, { dtype = "i32" }))
    for i, c in ipairs { 4, 1, 0, 7, -2147483648, -3 } do t:set(i - 1, c) end
    assert.has_error(function() profile.from_counts(t, { name = "C9" }) end,
      "profile.from_counts: table 'C9' row 4 has count -2147483648; expected counts >= 0")
    t:set(4, 2)
    assert.has_error(function() profile.from_counts(t, { name = "C9" }) end,
      "profile.from_counts: table 'C9' row 5 has count -3; expected counts >= 0")
    t:set(5, 0)
    assert.equal(6, profile.from_counts(t, { name = "C9" }).rows)
    t:free()
  end)

  it("profiles a pass over the loader, measuring distinct rows a batch, and uses them", function()
    local tabs = {}
    for i, r in ipairs(presets.tiny_rows) do tabs[i] = { name = "C" .. i, rows = r } end
    local loader = assert(ur.data.loader { data = "synthetic:tiny", samples = 8 * 1024, batch_size = 1024 })
    local out, info = profile.from_loader(loader, 6, tabs)
    loader:close()
    assert.equal(6, info.batches)
    assert.equal(6 * 1024, info.samples)
    -- recount C16 (10000 rows) from the same batches by hand
    local s = synthetic.spec("tiny")
    local g = assert(synthetic.generate(s, 0, 6 * 1024))
    local ids = ffi.cast("int64_t *", ur.C.ur_tensor_data(g.ids.p))
    local distinct = 0
    for k = 0, 5 do
      local seen = {}
      for i = 0, 1023 do
        local id = tonumber(ids[(k * 1024 + i) * #s.tables + 15])
        if not seen[id] then seen[id], distinct = true, distinct + 1 end
      end
    end
    local P = out.C16
    assert.equal(1, P.hot)
    assert.near(P.measured.distinct_per_batch, distinct / 6, 1e-9)
    assert.near(P.measured.lookups_per_batch, 1024, 1e-9)
    -- the profile answers the measured figure at the measured batch
    assert.near(P:distinct(1024), distinct / 6, 1e-6)
    assert.near(P.lookups, 6 * 1024, 0)
  end)

  it("checks a batch not known checked before it reads its ids through raw pointers", function()
    -- a loader of the caller's own, its KJT made unchecked: key b's span read 401 ids from 3 values (the heap
    -- past them); the engine's loader makes its batches checked, which cost nothing here
    local bad = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1 }, check = false }
    local loader = { next = function() return { sparse = bad, size = 2 } end }
    local tabs = { { name = "a", rows = 8 }, { name = "b", rows = 8 } }
    assert.has_error(function() profile.from_loader(loader, 1, tabs) end,
      "planner profile: batch 1: kjt: key 'b' sample 0: offsets 2..402 disagree with length 400 or pass the 3 values")
  end)

  -- counts of one said '1 batches', '1 samples', '1 lookups', '1 rows' in a profile's source
  it("names its source with counts of one in the singular", function()
    local tabs = {}
    for i, r in ipairs(presets.tiny_rows) do tabs[i] = { name = "C" .. i, rows = r } end
    local loader = assert(ur.data.loader { data = "synthetic:tiny", samples = 1, batch_size = 1 })
    local out = profile.from_loader(loader, 1, tabs)
    loader:close()
    assert.equal("a pass over 1 batch (1 sample)", out.C1.source)
    assert.equal("access counts (1 lookup)", profile.from_counts({ 0, 1, 0 }).source)
    assert.equal("zipf 1.05 over 1 row (discrete)", profile.zipf { rows = 1, s = 1.05 }.source)
    assert.equal("zipf 1.05 over 2 rows (discrete)", profile.zipf { rows = 2, s = 1.05 }.source)
  end)

  it("profiles Kaggle-sized tables in seconds: 26 tables, 33.8 M rows, from counts", function()
    -- the process's CPU time is what is checked: the wall time of a loaded CI machine is not
    -- the profile's cost (70 s of wall for 19 s of CPU once, with other builds running)
    local clock = ur.C.ur_clock_seconds
    local t0, c0 = clock(), os.clock()
    local classes = 0
    for i, r in ipairs(presets.kaggle_rows) do
      local t = assert(ur.tensor({ r }, { dtype = "i32" }))
      local p = ffi.cast("int32_t *", ur.C.ur_tensor_data(t.p))
      for k = 0, r - 1 do p[k] = math.floor(1e6 / ((k * 2654435761) % r + 1)) end
      local P = profile.from_counts(t, { name = "C" .. i })
      classes = classes + #P.n
      t:free()
    end
    local secs, cpu = clock() - t0, os.clock() - c0
    print(("\n    26 Kaggle tables (33.8 M rows) from counts: %.2f s of CPU (%.2f s of wall), %d classes")
      :format(cpu, secs, classes))
    assert.is_true(cpu < helpers.seconds(20), ("%.1f s of CPU"):format(cpu))
  end)

  it("rejects what is not a profile", function()
    assert.has_error(function() profile.zipf { rows = 0, s = 1 } end, "profile.zipf: rows must be a whole number >= 1")
    for _, s in ipairs { -1, 0 / 0, math.huge } do
      assert.has_error(function() profile.zipf { rows = 10, s = s } end, "profile.zipf: s must be a finite number >= 0")
    end
    assert.has_error(function() profile.zipf { rows = math.huge, s = 1 } end,
                     "profile.zipf: rows must be a whole number >= 1")
    assert.has_error(function() profile.zipf { rows = 10, s = 1, variant = "x" } end,
      "profile.zipf: variant must be discrete or continuous")
  end)
end)
