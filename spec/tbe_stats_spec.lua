-- Access counters of embedding tables (engine/src/tbe_stats.c, lua/uvmrec/tbe_stats.lua): what
-- the forward counts, decay, ranking (topk, coverage, histogram), against plain references;
-- the CUDA counters against the CPU's (#cuda).
local ur = require "uvmrec"
local h = require "helpers"
local R = require "tbe_ref"

local cuda_it = h.cuda_it
local EBC = ur.nn.EmbeddingBagCollection

local TABLES = {
  { name = "a", rows = 500, dim = 8, features = { "a1", "a2" } },
  { name = "b", rows = 37, dim = 4 },
  { name = "c", rows = 2000, dim = 16, dtype = "f16" },
}

local function make(dev, place, opts)
  local o = { tables = {}, device = dev, placement = place, seed = 5, bounds = "warn" }
  for k, v in pairs(opts or {}) do o[k] = v end
  for i, t in ipairs(TABLES) do
    local c = {}
    for k, v in pairs(t) do c[k] = v end
    o.tables[i] = c
  end
  return EBC(o)
end

-- Skewed ids (the low ones hot), a few out of bounds.
local function batch(m, n, seed)
  math.randomseed(seed)
  local rows = {}
  for f, L in ipairs(R.layout(m.tbe)) do rows[f] = L.rows end
  local b = R.batch(rows, { batch = n })
  local li = 0
  for f = 1, #rows do
    for bag = (f - 1) * n + 1, f * n do
      for v = b.offsets[bag] + 1, b.offsets[bag + 1] do
        li = li + 1
        local u = math.random()
        b.values[v] = math.floor(rows[f] * u * u * u)
        if math.random() < 0.01 then b.values[v] = rows[f] + 3 end
      end
    end
  end
  return b
end

-- Counts per table by the definition: one per value whose id is in the table.
local function reference(m, b, into)
  local layout = R.layout(m.tbe)
  for _, g in ipairs(R.bags(b, #layout)) do
    local L = layout[g.f]
    local c = into[L.table] or {}
    into[L.table] = c
    for v = g.first, g.last do
      local id = b.values[v]
      if id >= 0 and id < L.rows then c[id] = (c[id] or 0) + 1 end
    end
  end
  return into
end

local function counts_of(m, name)
  local c = m.tbe:counts(name)
  local t = c:totable()
  c:free()
  return t
end

local function check_counts(m, ref, what)
  for _, t in ipairs(TABLES) do
    local got, want = counts_of(m, t.name), ref[t.name] or {}
    for id = 0, t.rows - 1 do
      if got[id + 1] ~= (want[id] or 0) then
        error(("%s: table %s id %d counted %d, expected %d"):format(what, t.name, id, got[id + 1], want[id] or 0))
      end
    end
  end
end

describe("uvmrec.tbe access counters", function()
  it("count one access per value that reads a row, over features sharing a table, skipping bad ids", function()
    local m = make("cpu", "host")
    assert(m.tbe:set_counting(true))
    local ref = {}
    for s = 1, 3 do
      local b = batch(m, 64, s)
      m:forward(R.input(b))
      reference(m, b, ref)
    end
    check_counts(m, ref, "after 3 forwards")
    assert.is_true(m.tbe:counting("a"))
  end)

  it("count nothing while off and keep what they had; count one table alone", function()
    local m = make("cpu", "host")
    assert(m.tbe:set_counting(true, "b"))
    assert.is_false(m.tbe:counting("a"))
    local b = batch(m, 32, 11)
    m:forward(R.input(b))
    local ref = reference(m, b, {})
    assert.same(counts_of(m, "b"), (function()
      local t = {}
      for id = 0, 36 do t[id + 1] = ref.b[id] or 0 end
      return t
    end)())
    assert.has_error(function() m.tbe:counts("a") end,
      "tbe: table 'a' has no access counters; turn counting on first (ur_tbe_set_counting)")
    assert(m.tbe:set_counting(false, "b"))
    m:forward(R.input(batch(m, 32, 12)))
    local before = counts_of(m, "b")
    assert.same(before, counts_of(m, "b"))
    local sum = 0
    for _, v in ipairs(before) do sum = sum + v end
    local want = 0
    for _, v in pairs(ref.b) do want = want + v end
    assert.equal(want, sum)
  end)

  it("decay as floor(count * factor), and 0 clears", function()
    local m = make("cpu", "host")
    assert(m.tbe:set_counting(true))
    local ref = {}
    for s = 1, 4 do
      local b = batch(m, 64, 20 + s)
      m:forward(R.input(b))
      reference(m, b, ref)
      assert(m.tbe:decay_counts(0.7))
      for _, c in pairs(ref) do
        for id, v in pairs(c) do c[id] = math.floor(v * 0.7) end
      end
    end
    check_counts(m, ref, "after decay")
    assert(m.tbe:decay_counts(0, "a"))
    for _, v in ipairs(counts_of(m, "a")) do assert.equal(0, v) end
    assert.has_error(function() m.tbe:decay_counts(1.5) end, "tbe: decay factor 1.5; expected a value in [0, 1]")
  end)

  it("rank rows: topk, coverage and histogram match a sort of the counts", function()
    local m = make("cpu", "host")
    assert(m.tbe:set_counting(true))
    local ref = {}
    for s = 1, 5 do
      local b = batch(m, 128, 40 + s)
      m:forward(R.input(b))
      reference(m, b, ref)
    end
    local rows = 2000
    local list, total = {}, 0
    for id = 0, rows - 1 do
      list[#list + 1] = { id = id, c = ref.c[id] or 0 }
      total = total + (ref.c[id] or 0)
    end
    table.sort(list, function(x, y) if x.c ~= y.c then return x.c > y.c end return x.id < y.id end)
    local a = m.tbe:access("c")
    assert.equal(total, a.total)
    local ids, counts = a:topk(25)
    for r = 1, 25 do
      assert.equal(list[r].id, ids[r])
      assert.equal(list[r].c, counts[r])
    end
    for _, x in ipairs { 0.01, 0.05, 0.2, 0.5, 1 } do
      local k, s = math.floor(x * rows + 0.5), 0
      for r = 1, k do s = s + list[r].c end
      assert.equal(s / total, a:coverage(x))
    end
    local hist = a:histogram(6)
    local seen_rows, seen_acc = 0, 0
    for _, bin in ipairs(hist) do
      local nr, na = 0, 0
      for _, e in ipairs(list) do
        if e.c >= bin.lo and e.c <= bin.hi then nr, na = nr + 1, na + e.c end
      end
      assert.equal(nr, bin.rows)
      assert.equal(na, bin.accesses)
      seen_rows, seen_acc = seen_rows + bin.rows, seen_acc + bin.accesses
    end
    assert.equal(rows, seen_rows)
    assert.equal(total, seen_acc)
    a:free()
  end)

  it("reject a table that does not exist", function()
    local m = make("cpu", "host")
    assert.has_error(function() m.tbe:set_counting(true, "zz") end,
      "embedding collection: no table named 'zz' (tables: a, b, c)")
  end)

  cuda_it("count on the GPU exactly as on the CPU, decay included (device and managed tables)", function()
    for _, place in ipairs { "device", "managed" } do
      local cpu, gpu = make("cpu", "host"), make(0, place)
      assert(cpu.tbe:set_counting(true))
      assert(gpu.tbe:set_counting(true))
      for s = 1, 4 do
        local b = batch(cpu, 256, 60 + s)
        -- a hot id read by many lanes of a warp at once
        for v = 1, 40 do b.values[v] = 7 end
        cpu:forward(R.input(b))
        gpu:forward(R.input(b, "device"))
        if s == 2 then
          assert(cpu.tbe:decay_counts(0.5))
          assert(gpu.tbe:decay_counts(0.5))
        end
      end
      assert(ur.sync())
      for _, t in ipairs(TABLES) do
        assert.same(counts_of(cpu, t.name), counts_of(gpu, t.name), place .. " table " .. t.name)
      end
    end
  end)
end)
