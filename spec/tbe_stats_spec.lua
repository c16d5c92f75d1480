-- Access counters of embedding tables (engine/src/embedding/counters.c, lua/uvmrec/tbe_stats.lua): what
-- the forward counts, decay, ranking (topk, coverage, histogram), against plain references;
-- the CUDA counters against the CPU's (#cuda).
local ffi = require "ffi"
local ur = require "uvmrec"
local h = require "helpers"
local R = require "tbe_ref"
local ck = require "uvmrec.checkpoint"
local hints = require "uvmrec.hints"
local stats = require "uvmrec.tbe_stats"

local cuda_it = h.cuda_it
local EBC = ur.nn.EmbeddingBagCollection
local C = ur.C

local TABLES = {
  { name = "a", rows = 500, dim = 8, features = { "a1", "a2" } },
  { name = "b", rows = 37, dim = 4 },
  { name = "c", rows = 2000, dim = 16, dtype = "f16" },
}

-- A collection of copies of tables (default TABLES) on dev and place; opts over seed 5 and
-- bounds "warn".
local function make(dev, place, opts, tables)
  local o = { tables = {}, device = dev, placement = place, seed = 5, bounds = "warn" }
  for k, v in pairs(opts or {}) do o[k] = v end
  for i, t in ipairs(tables or TABLES) do
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

-- A CPU collection counting every table after n forwards of batches of `size` (seeds seed + 1 ..
-- seed + n), and the reference counts of what it read; after(m, ref), when given, runs after
-- each forward.
local function counted(n, size, seed, after)
  local m = make("cpu", "host")
  assert(m.tbe:set_counting(true))
  local ref = {}
  for s = 1, n do
    local b = batch(m, size, seed + s)
    m:forward(R.input(b))
    reference(m, b, ref)
    if after then after(m, ref) end
  end
  return m, ref
end

describe("uvmrec.tbe access counters", function()
  it("count one access per value that reads a row, over features sharing a table, skipping bad ids", function()
    local m, ref = counted(3, 64, 0)
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
    local m, ref = counted(4, 64, 20, function(m, ref)
      assert(m.tbe:decay_counts(0.7))
      for _, c in pairs(ref) do
        for id, v in pairs(c) do c[id] = math.floor(v * 0.7) end
      end
    end)
    check_counts(m, ref, "after decay")
    assert(m.tbe:decay_counts(0, "a"))
    for _, v in ipairs(counts_of(m, "a")) do assert.equal(0, v) end
    assert.has_error(function() m.tbe:decay_counts(1.5) end, "tbe: decay factor 1.5; expected a value in [0, 1]")
    assert.has_error(function() m.tbe:decay_counts("0.5") end,
                     "tbe: decay factor 0.5 (a string); expected a number in [0, 1]")
  end)

  it("rank rows: topk, coverage and histogram match a sort of the counts", function()
    local m, ref = counted(5, 128, 40)
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
    -- one bin holds every row and every access (it held the rows never read, 0 accesses)
    assert.same({ { lo = 0, hi = math.huge, rows = rows, accesses = total } }, a:histogram(1))
    assert.has_error(function() a:histogram(0) end, "histogram: bins is 0; expected a whole number from 1 to 64")
    assert.has_error(function() a:histogram(1.5) end, "histogram: bins is 1.5; expected a whole number from 1 to 64")
    -- a percentage for the fraction read as all rows (coverage 1), silently
    for _, x in ipairs { 20, -0.1, 0 / 0, "0.2" } do
      assert.has_error(function() a:coverage(x) end,
                       ("coverage: x is %s; expected a fraction of the rows from 0 to 1"):format(tostring(x)))
    end
    a:free()
  end)

  it("rank on the host and say so, with the counts by id as ranked (below 0 as 0) when asked", function()
    local c = R.tensor({ 4, -2, 9, 0, 4, 1 }, "i32")
    local a = stats.snapshot(c, "t", true)
    assert.equal("host", a.rank_on)
    assert.same({ 4, 0, 9, 0, 4, 1 }, a.by_id:totable())
    assert.same({ 2, 0, 4, 5, 1, 3 }, a:topk(6))
    assert.same({ 4, -2, 9, 0, 4, 1 }, c:totable()) -- ranked where they are, left as they were
    a:free()
    a = stats.snapshot(c, "t")
    assert.is_nil(a.by_id)
    a:free()
    c:free()
  end)

  it("rank into an earlier snapshot's outputs, which then raises naming its table, as a freed one does", function()
    local c = R.tensor({ 4, -2, 9, 0, 4, 1 }, "i32")
    local a = stats.snapshot(c, "t", true)
    local mem = { C.ur_tensor_data(a.order.p), C.ur_tensor_data(a.cumsum.p), C.ur_tensor_data(a.by_id.p) }
    for i, v in ipairs { 0, 7, 3, 7, -1, 2 } do c[i - 1] = v end
    local b = stats.snapshot(c, "t", true, a)
    -- the same host memory, holding the new ranking: a fresh snapshot's
    assert.same(mem, { C.ur_tensor_data(b.order.p), C.ur_tensor_data(b.cumsum.p), C.ur_tensor_data(b.by_id.p) })
    local f = stats.snapshot(c, "t", true)
    assert.same({ f:topk(6) }, { b:topk(6) })
    assert.same(f.cumsum:totable(), b.cumsum:totable())
    assert.same({ 0, 7, 3, 7, 0, 2 }, b.by_id:totable())
    assert.equal(19, b.total)
    -- the earlier one would read b's counts as its own: it raises, naming its table
    local taken = "access snapshot of table 't' used after a later snapshot took its order, sums and counts "
      .. "(snapshot's `into`: it is valid until then)"
    assert.has_error(function() return a:topk(1) end, taken)
    assert.has_error(function() return a.total end, taken)
    a:free() -- harmless
    assert.has_error(function() stats.snapshot(c, "t", true, a) end,
      "snapshot of table 't': into is a spent snapshot; expected an access snapshot (not freed nor taken by another)")
    f:free()
    assert.has_error(function() return f:coverage(0.5) end, "access snapshot of table 't' used after its free()")
    f:free()
    -- without by_id, into's goes; of another size, refused before anything is taken
    local d = stats.snapshot(c, "t", false, b)
    assert.is_nil(d.by_id)
    assert.same({ 1, 3, 2, 5, 0, 4 }, d:topk(6))
    local c7 = assert(ur.tensor({ 7 }, { dtype = "i32" }))
    assert.has_error(function() stats.snapshot(c7, "u", false, d) end,
      "snapshot of table 'u': into has 6 rows, the counters 7; expected a snapshot of as many rows")
    assert.equal(6, d.rows)
    d:free()
    c7:free()
    c:free()
  end)

  it("rank host counters to a plain sort's order and sums: random, skewed, tied, wide and negative counts", function()
    -- the CPU's radix sort carries each key beside its id and skips a digit every key shares: its
    -- order must stay a sort by count (highest first) and id, whichever digits vary
    local n = 30000
    local c = assert(ur.tensor({ n }, { dtype = "i32" }))
    local order = assert(ur.tensor({ n }, { dtype = "i64" }))
    local cumsum = assert(ur.tensor({ n }, { dtype = "i64" }))
    local p = ffi.cast("int32_t *", C.ur_tensor_data(c.p))
    local o = ffi.cast("int64_t *", C.ur_tensor_data(order.p))
    local cs = ffi.cast("int64_t *", C.ur_tensor_data(cumsum.p))
    math.randomseed(7)
    local fills = {
      -- every digit varies
      uniform = function() return math.random(0, 2 ^ 31 - 1) end,
      -- a power law: most rows 0, the counts below 2^11 (two digits alike)
      skewed = function() local u = math.random() return u < 0.7 and 0 or math.floor(1 / (1.0001 - u)) % 2000 end,
      -- a few values, many ties; negatives read as 0
      tied = function() return ({ 0, 5, 5, 2048, -3, 2 ^ 22, 2 ^ 31 - 1 })[math.random(7)] end,
      -- only the middle digit varies
      middle = function() return 2048 * math.random(0, 2047) end,
      -- only the top digit varies, and every key alike
      top = function() return 2 ^ 22 * math.random(0, 511) end,
      same = function() return 9 end,
    }
    for _, name in ipairs { "uniform", "skewed", "tied", "middle", "top", "same" } do
      local ref = {}
      for i = 0, n - 1 do
        p[i] = fills[name]()
        ref[i + 1] = { id = i, c = math.max(0, p[i]) }
      end
      table.sort(ref, function(x, y) if x.c ~= y.c then return x.c > y.c end return x.id < y.id end)
      assert.equal(0, C.ur_counts_rank(c.p, order.p, cumsum.p, nil, nil), name)
      local sum = 0
      for r = 1, n do
        sum = sum + ref[r].c
        if tonumber(o[r - 1]) ~= ref[r].id or tonumber(cs[r - 1]) ~= sum then
          error(("%s: rank %d is id %d (sum %d), expected id %d (count %d, sum %d)"):format(name, r - 1,
            tonumber(o[r - 1]), tonumber(cs[r - 1]), ref[r].id, ref[r].c, sum))
        end
      end
    end
    c:free()
    order:free()
    cumsum:free()
  end)

  it("count no cached table (its kernels read slots): refused by name, skipped for every table", function()
    -- a cached table counted its cache's slots as if they were row ids: 'b' of 500 rows had 544
    -- counters (32 slots and 2 x 256 staging rows), its top "ids" slots
    local tables = { { name = "a", rows = 50, dim = 4, placement = "host" },
                     { name = "b", rows = 500, dim = 4, placement = "cached" } }
    local m = make("cpu", nil, { cache = { slots = 32, shared = true } }, tables)
    assert.has_error(function() assert(m.tbe:set_counting(true, "b")) end,
      "tbe: set_counting of table 'b': the table is cached (its kernels read the cache's slots, which are no row "
      .. "ids); its cache's stats count its lookups")
    assert(m.tbe:set_counting(true))
    assert.is_true(m.tbe:counting("a"))
    assert.is_false(m.tbe:counting("b"))
    m:forward(R.input({ values = { 3, 3, 7, 400, 401 }, offsets = { 0, 2, 3, 4, 5 } }))
    local c = m.tbe:counts("a")
    assert.equal(50, c:numel())
    assert.same({ 2, 1 }, { c:totable()[4], c:totable()[8] })
    c:free()
    assert.has_error(function() m.tbe:counts("b") end)
    assert(m.tbe:set_counting(false, "b")) -- off is no work
  end)

  it("reject a table that does not exist", function()
    local m = make("cpu", "host")
    assert.has_error(function() m.tbe:set_counting(true, "zz") end,
      "embedding collection: no table named 'zz' (tables: a, b, c)")
  end)

  cuda_it("rank device counters on the GPU to the CPU's order, sums and counts by id (ties by id, below 0 as 0), "
          .. "on the CPU where the HBM budget has no room, saying which", function()
    -- budget: the HBM budget set once the counters are on the device, before they are ranked
    local function same(n, fill, what, budget)
      local host = assert(ur.tensor({ n }, { dtype = "i32" }))
      local p = ffi.cast("int32_t *", C.ur_tensor_data(host.p))
      for i = 0, n - 1 do p[i] = fill(i) end
      local dev = assert(host:to("device"))
      if budget then
        -- the collector stopped until the budget is lifted: tensors it freed in between made room
        -- for the sort under a budget set at the HBM in use (on an H200, after the cases above)
        collectgarbage()
        collectgarbage()
        collectgarbage("stop")
        assert(ur.set_hbm_budget(ur.memory().hbm_used + budget))
      end
      -- the GPU's order, sums and counts by id (computed there), and its order and sums alone
      local function check(a, b, b2)
        -- which path ran: the two give one order, so the record says (no room: the CPU's)
        assert.equal("host", a.rank_on, what)
        assert.equal(budget and "host" or "device", b.rank_on, what)
        assert.equal(b.rank_on, b2.rank_on, what)
        -- the budget's refusal was no error of the call, which the CPU's ranking answered
        if budget then assert.equal("", ffi.string(C.ur_last_error()), what) end
        assert.equal(a.total, b.total, what)
        assert.equal(a.total, b2.total, what)
        assert.same(a.by_id:totable(), b.by_id:totable(), what)
        assert.is_nil(b2.by_id, what)
        for _, g in ipairs { b, b2 } do
          for r = 0, n - 1 do
            if a._o[r] ~= g._o[r] or a._c[r] ~= g._c[r] then
              error(("%s (%s): rank %d: the CPU has id %d (sum %d), the GPU id %d (sum %d)"):format(what, g.name, r,
                tonumber(a._o[r]), tonumber(a._c[r]), tonumber(g._o[r]), tonumber(g._c[r])))
            end
          end
        end
      end
      local a, b, b2 = stats.snapshot(host, "h", true), stats.snapshot(dev, "d", true), stats.snapshot(dev, "d2")
      check(a, b, b2)
      -- new counts ranked into the last snapshots' outputs (the manager's next interval): the new ranking
      for i = 0, n - 1 do p[i] = fill(i) end
      assert(dev:copy(host))
      a, b = stats.snapshot(host, "h", true, a), stats.snapshot(dev, "d", true, b)
      b2 = stats.snapshot(dev, "d2", false, b2)
      check(a, b, b2)
      a:free()
      b:free()
      b2:free()
      host:free()
      dev:free()
    end
    math.randomseed(71)
    same(1, function() return 5 end, "one row")
    same(2, function(i) return 3 - i end, "two rows")
    -- few distinct counts (long runs of ties, ids must stay in order), a few below 0 and huge
    same(300001, function()
      local u = math.random()
      if u < 0.01 then return -math.random(1, 1000) end
      if u < 0.02 then return 2147483647 - math.random(0, 3) end
      return math.floor(8 * u * u)
    end, "ties")
    -- a power law over ids: most rows never read, the hot ones' counts tied in runs
    same(1 + 2 ^ 21, function()
      local u = math.random()
      return u < 0.75 and 0 or math.min(2 ^ 31 - 1, math.floor(1 / (1.00001 - u) ^ 1.5))
    end, "skewed")
    -- uniform: every digit of the key varies
    same(1 + 2 ^ 20, function() return math.random(0, 2 ^ 31 - 1) end, "uniform counts")
    -- no room in the HBM budget for the sort's 16 bytes a row: the CPU ranks, the same order
    local ok, err = pcall(same, 100000, function() return math.random(0, 50) end, "no room", 4096)
    ur.set_hbm_budget(nil)
    collectgarbage("restart")
    assert(ok, err)
  end)

  cuda_it("rank device counters on the GPU into pinned and managed outputs as into host ones", function()
    local n = 100003
    math.randomseed(73)
    local host = assert(ur.tensor({ n }, { dtype = "i32" }))
    local p = ffi.cast("int32_t *", C.ur_tensor_data(host.p))
    for i = 0, n - 1 do p[i] = math.random() < 0.5 and 0 or math.random(-5, 3000) end
    local dev = assert(host:to("device"))
    local function ranked(out)
      local o, cs, by = out("i64"), out("i64"), out("i32")
      local on = ffi.new("int32_t[1]")
      assert.equal(0, C.ur_counts_rank(dev.p, o.p, cs.p, by.p, on), ffi.string(C.ur_last_error()))
      assert.equal(1, on[0])
      local t = { o:totable(), cs:totable(), by:totable() }
      o:free()
      cs:free()
      by:free()
      return t
    end
    local want = ranked(function(dt) return assert(ur.tensor({ n }, { dtype = dt })) end)
    assert.same(want, ranked(function(dt) return assert(ur.tensor({ n }, { dtype = dt, placement = "pinned" })) end))
    assert.same(want, ranked(function(dt) return assert(ur.uvm_tensor({ n }, { dtype = dt })) end))
    host:free()
    dev:free()
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

-- Row permutations of embedding tables (engine/src/embedding/layout.c, the lookup kernels): a table
-- laid out by a permutation gives the same outputs and the same training, bit for bit, as the
-- identity layout; relayout moves rows with their optimizer state; a checkpoint of a permuted
-- table resumes exactly; the CUDA kernels' permuted lookups match the CPU's (#cuda).

local PERM_TABLES = {
  { name = "a", rows = 300, dim = 16, features = { "a1", "a2" } },
  { name = "b", rows = 41, dim = 8, dtype = "f16" },
  { name = "c", rows = 1000, dim = 32, dtype = "bf16" },
}

local function make_permuted(dev, place, optim)
  return make(dev, place, { seed = 3, bounds = "fatal", optimizer = optim }, PERM_TABLES)
end

-- A random permutation of 0..n-1 as a host i64 tensor.
local function random_perm(n, seed)
  math.randomseed(seed)
  local p = {}
  for i = 1, n do p[i] = i - 1 end
  for i = n, 2, -1 do
    local j = math.random(1, i)
    p[i], p[j] = p[j], p[i]
  end
  return R.tensor(p, "i64"), p
end

local rows_of = R.rows_of

-- A flat list of `per` elements a row of table `name`'s storage, read by id (through its
-- permutation).
local function by_id(m, name, flat, per)
  local p = m.tbe:permutation(name)
  if not p then return flat end
  local perm, out = p:totable(), {}
  for id = 0, #perm - 1 do
    for c = 1, per do out[id * per + c] = flat[perm[id + 1] * per + c] end
  end
  return out
end

-- Table `name` of m read by id, and its optimizer state `which`.
local function logical(m, name) return by_id(m, name, m:table(name):totable(), m.tbe.dims[name]) end

local function logical_state(m, name, which)
  local s = m:state(name)[which]:totable()
  return by_id(m, name, s, #s / m.tbe.rows[name])
end

-- Every permuted table and its state read by id: the same in a and b.
local function same_logical(a, b)
  for _, t in ipairs(PERM_TABLES) do
    assert.same(logical(a, t.name), logical(b, t.name), "table " .. t.name)
    for _, sname in ipairs(a.tbe.state_names) do
      assert.same(logical_state(a, t.name, sname), logical_state(b, t.name, sname),
                  "state " .. sname .. " of " .. t.name)
    end
  end
end

-- Steps of forward and backward on random batches: the outputs of each, then the tables.
local function train(m, steps, seed, placement)
  local outs = {}
  for s = 1, steps do
    math.randomseed(seed + s)
    local b = R.batch(rows_of(m), { batch = 24, weighted = s % 2 == 0, big = 300 })
    local inp = R.input(b, placement)
    local o = m:forward(inp)
    outs[s] = o:totable()
    local g = ur.tensor(o:size(), { dtype = o:dtype() }):uniform(-1, 1, seed + 100 * s)
    if placement == "device" then g = assert(g:to("device")) end
    m:backward(inp, g)
  end
  return outs
end

describe("uvmrec.tbe row permutations", function()
  for _, optim in ipairs { "sgd", "rowwise_adagrad", "adam" } do
    it("train bit-identically to the identity layout (" .. optim .. ", f16 and bf16 rounded stochastically)",
       function()
      local plain, perm = make_permuted("cpu", "host", optim), make_permuted("cpu", "host", optim)
      for i, t in ipairs(PERM_TABLES) do
        local p = random_perm(t.rows, 10 + i)
        local r = assert(perm.tbe:relayout(t.name, p))
        assert.is_true(r.rows_moved > t.rows * 0.9)
      end
      assert.same(train(plain, 6, 1), train(perm, 6, 1))
      same_logical(plain, perm)
    end)
  end

  it("relayout mid-training changes nothing, and back to the identity restores the storage", function()
    local plain, perm = make_permuted("cpu", "host", "rowwise_adagrad"), make_permuted("cpu", "host", "rowwise_adagrad")
    local a = train(plain, 3, 7)
    assert.same(a, train(perm, 3, 7))
    assert(perm.tbe:relayout("a", (random_perm(300, 5))))
    assert(perm.tbe:relayout("a", (random_perm(300, 6)))) -- a permutation over a permutation
    assert(perm.tbe:relayout("c", (random_perm(1000, 8))))
    assert.same(train(plain, 3, 70), train(perm, 3, 70))
    local r = assert(perm.tbe:relayout("a", nil))
    assert.is_nil(perm.tbe:permutation("a"))
    assert.is_true(r.rows_moved > 0)
    assert.same(plain:table("a"):totable(), perm:table("a"):totable())
    assert.same(plain:state("a").sum:totable(), perm:state("a").sum:totable())
  end)

  -- Disjoint random pairs of ids of a table of n rows: two lists of m.
  local function random_pairs(n, m, seed)
    local _, p = random_perm(n, seed)
    local a, b = {}, {}
    for i = 1, m do a[i], b[i] = p[i], p[m + i] end
    return a, b
  end

  for _, optim in ipairs { "sgd", "rowwise_adagrad", "adam" } do
    it("swap rows in place mid-training and train bit-identically to the identity layout (" .. optim .. ")",
       function()
      local plain, swapped = make_permuted("cpu", "host", optim), make_permuted("cpu", "host", optim)
      local a1 = train(plain, 3, 11)
      assert.same(a1, train(swapped, 3, 11))
      for i, t in ipairs(PERM_TABLES) do
        local a, b = random_pairs(t.rows, math.floor(t.rows / 3), 60 + i)
        local r = assert(swapped.tbe:swap_rows(t.name, a, b))
        assert.equal(2 * #a, r.rows_moved)
        assert.is_false(r.on_gpu)
      end
      assert(swapped.tbe:swap_rows("a", random_pairs(300, 7, 99))) -- swaps over swaps
      assert.same(train(plain, 4, 12), train(swapped, 4, 12))
      same_logical(plain, swapped)
    end)
  end

  it("swap rows as the relayout with the permutation they make does, and check their ids", function()
    local x, y = make_permuted("cpu", "host", "adam"), make_permuted("cpu", "host", "adam")
    train(x, 2, 5)
    train(y, 2, 5)
    assert(x.tbe:relayout("c", (random_perm(1000, 3))))
    assert(y.tbe:relayout("c", (random_perm(1000, 3))))
    local a, b = random_pairs(1000, 200, 4)
    assert(x.tbe:swap_rows("c", a, b))
    local p = y.tbe:permutation("c"):totable()
    for k = 1, #a do p[a[k] + 1], p[b[k] + 1] = p[b[k] + 1], p[a[k] + 1] end
    assert(y.tbe:relayout("c", R.tensor(p, "i64")))
    assert.same(y.tbe:permutation("c"):totable(), x.tbe:permutation("c"):totable())
    assert.same(y:table("c"):totable(), x:table("c"):totable())
    assert.same(y:state("c").exp_avg:totable(), x:state("c").exp_avg:totable())
    assert.same(y:state("c").exp_avg_sq:totable(), x:state("c").exp_avg_sq:totable())
    assert.has_error(function() assert(x.tbe:swap_rows("b", { 1, 40 }, { 41, 3 })) end,
      "tbe: swap_rows of table 'b': b[0] = 41; expected 0..40")
    assert.has_error(function() assert(x.tbe:swap_rows("b", { 1, 5 }, { 2, 1 })) end,
      "tbe: swap_rows of table 'b': id 1 is in two pairs; each id may move once")
    assert.has_error(function() x.tbe:swap_rows("b", { 1 }, { 2, 3 }) end,
      "swap_rows: a and b must be lists of one length")
    assert.has_error(function() x.tbe:swap_rows("b", { 1.5 }, { 3 }) end,
      "swap_rows: a[1] is 1.5; expected a whole number that fits i64")
    assert.is_truthy(x.tbe:swap_rows("b", {}, {})) -- nothing to do
  end)

  it("number each table's layout changes (permutation_gen): moves and installs count, steps, refusals not", function()
    local x = make_permuted("cpu", "host", "sgd")
    local function gens() return { x.tbe:permutation_gen("b"), x.tbe:permutation_gen("c") } end
    local g = gens()
    train(x, 2, 5)
    assert.same(g, gens())
    assert(x.tbe:relayout("c", (random_perm(1000, 3))))
    assert.same({ g[1], g[2] + 1 }, gens())
    local a, b = random_pairs(1000, 20, 4)
    assert(x.tbe:swap_rows("c", a, b))
    assert.same({ g[1], g[2] + 2 }, gens())
    assert.has_error(function() assert(x.tbe:swap_rows("c", { 1, 5 }, { 2, 1 })) end)
    assert(x.tbe:set_permutation("b", (random_perm(41, 5))))
    assert(x.tbe:set_permutation("c", nil))
    assert.same({ g[1] + 1, g[2] + 3 }, gens())
    assert.has_error(function() x.tbe:permutation_gen("nope") end)
  end)

  it("lays rows out hottest first from the counts, ties by id", function()
    local m = make_permuted("cpu", "host", "sgd")
    assert(m.tbe:set_counting(true))
    math.randomseed(3)
    local b = R.batch(rows_of(m), { batch = 64 })
    m:forward(R.input(b))
    local before = m:forward(R.input(b)):totable() -- counts every id twice now
    local cnt = m.tbe:counts("c"):totable()
    local ids = {}
    for id = 0, 999 do ids[#ids + 1] = id end
    table.sort(ids, function(x, y)
      if cnt[x + 1] ~= cnt[y + 1] then return cnt[x + 1] > cnt[y + 1] end
      return x < y
    end)
    local r = assert(m.tbe:relayout("c", "counts"))
    assert.is_false(r.on_gpu)
    assert.equal(r.rows_moved * 32 * 2, r.bytes) -- the CPU rewrites the rows that move
    local p = m.tbe:permutation("c"):totable()
    for rank, id in ipairs(ids) do assert.equal(rank - 1, p[id + 1]) end
    -- the counters are by id: a relayout leaves them as they were
    assert.same(cnt, m.tbe:counts("c"):totable())
    assert.same(before, m:forward(R.input(b)):totable())
  end)

  it("keep the sparse gradient's rows as ids", function()
    local plain, perm = make_permuted("cpu", "host", "sgd"), make_permuted("cpu", "host", "sgd")
    assert(perm.tbe:relayout("a", (random_perm(300, 9))))
    math.randomseed(4)
    local b = R.batch(rows_of(plain), { batch = 16 })
    local g = ur.tensor({ 16, plain.tbe.out_dim }):uniform(-1, 1, 2)
    local x, y = plain:sparse_grad(R.input(b), g), perm:sparse_grad(R.input(b), g)
    for name, v in pairs(x) do
      assert.same(v.rows:totable(), y[name].rows:totable())
      assert.same(v.grad:totable(), y[name].grad:totable())
    end
  end)

  it("reject a perm that is not a permutation of the table's rows, naming table and entry", function()
    local m = make_permuted("cpu", "host", "sgd")
    local _, list = random_perm(41, 1)
    list[5] = list[9]
    assert.has_error(function() m.tbe:relayout("b", R.tensor(list, "i64")) end,
      ("tbe: relayout of table 'b': perm[8] = %d repeats perm[4]; a permutation holds each of 0..40 once")
        :format(list[9]))
    list[5] = 41
    assert.has_error(function() m.tbe:relayout("b", R.tensor(list, "i64")) end,
      "tbe: relayout of table 'b': perm[4] = 41; expected 0..40 (a permutation)")
    assert.has_error(function() m.tbe:relayout("b", R.tensor({ 0, 1 }, "i64")) end,
      "tbe: relayout of table 'b': perm is i64 [2]; expected i64 [41] (row id -> physical row)")
    assert.is_nil(m.tbe:permutation("b"))
    assert.has_error(function() m.tbe:relayout("b", 3) end, "relayout: perm must be an i64 tensor, \"counts\" or nil")
  end)

  it("save with the layout and counters in a registry checkpoint and resume exactly", function()
    local dir = os.tmpname()
    os.remove(dir)
    local path = dir .. ".safetensors"
    local function registry(m)
      local reg = ck.registry()
      reg:register { name = "embeddings",
        state = function()
          local ts = {}
          for _, name in ipairs(m.tbe.table_names) do
            ts[name] = m:table(name)
            for k, s in pairs(m:state(name)) do ts[name .. "." .. k] = s end
          end
          return { tensors = ts, meta = { step = m.tbe:step() } }
        end,
        load = function(_, meta) m.tbe:set_step(meta.step) end }
      hints.register(reg, m.tbe)
      return reg
    end
    local a = make_permuted("cpu", "host", "adam")
    assert(a.tbe:set_counting(true))
    train(a, 2, 30)
    assert(a.tbe:relayout("a", "counts"))
    assert(a.tbe:relayout("c", (random_perm(1000, 2))))
    train(a, 2, 40)
    assert(registry(a):save(path, { step = 4 }))
    local counts, perm = a.tbe:counts("b"):totable(), a.tbe:permutation("c"):totable()
    local want = train(a, 3, 50)
    local b = make_permuted("cpu", "host", "adam")
    assert(registry(b):load(path))
    assert.is_true(b.tbe:counting("b"))
    assert.same(counts, b.tbe:counts("b"):totable())
    assert.same(perm, b.tbe:permutation("c"):totable())
    assert.is_nil(b.tbe:permutation("b"))
    assert.same(want, train(b, 3, 50))
    for _, t in ipairs(PERM_TABLES) do assert.same(logical(a, t.name), logical(b, t.name)) end
    os.remove(path)
  end)

  cuda_it("look up permuted rows on the GPU as the CPU does, forward and fused backward", function()
    for _, place in ipairs { "device", "managed" } do
      local cpu, gpu = make_permuted("cpu", "host", "rowwise_adagrad"), make_permuted(0, place, "rowwise_adagrad")
      for i, t in ipairs(PERM_TABLES) do
        local p = random_perm(t.rows, 20 + i)
        local rc, rg = assert(cpu.tbe:relayout(t.name, p)), assert(gpu.tbe:relayout(t.name, p))
        assert.equal(rc.rows_moved, rg.rows_moved)
        assert.equal(place == "device", rg.on_gpu)
      end
      local a, b = train(cpu, 4, 90), train(gpu, 4, 90, "device")
      assert.same(a[1], b[1], place .. ": step 1")
      for s = 2, 4 do R.close(b[s], a[s], 1e-3, 1e-3, place .. ": step " .. s) end
      for _, t in ipairs(PERM_TABLES) do
        R.close(logical(gpu, t.name), logical(cpu, t.name), t.dtype and 1e-2 or 1e-4, 1e-4,
                place .. " table " .. t.name)
      end
    end
  end)

  cuda_it("swap rows on the GPU as the CPU does (device, managed and pinned tables), training unchanged", function()
    for _, place in ipairs { "device", "managed", "host" } do
      local cpu, gpu = make_permuted("cpu", "host", "adam"), make_permuted(0, place, "adam")
      local plain = make_permuted(0, place, "adam")
      train(cpu, 2, 8)
      train(gpu, 2, 8, "device")
      train(plain, 2, 8, "device")
      for i, t in ipairs(PERM_TABLES) do
        local a, b = random_pairs(t.rows, math.floor(t.rows / 4), 80 + i)
        assert(cpu.tbe:swap_rows(t.name, a, b))
        local r = assert(gpu.tbe:swap_rows(t.name, a, b))
        assert.is_true(r.on_gpu)
        assert.same(cpu.tbe:permutation(t.name):totable(), gpu.tbe:permutation(t.name):totable())
        R.close(gpu:table(t.name):totable(), cpu:table(t.name):totable(), t.dtype and 1e-2 or 1e-4, 1e-4,
                place .. " table " .. t.name)
      end
      assert.same(train(plain, 3, 9, "device"), train(gpu, 3, 9, "device"), place)
      for _, t in ipairs(PERM_TABLES) do assert.same(logical(plain, t.name), logical(gpu, t.name), place) end
    end
  end)

  cuda_it("train bit-identically on the GPU with and without a permutation (device tables)", function()
    local plain, perm = make_permuted(0, "device", "adam"), make_permuted(0, "device", "adam")
    for i, t in ipairs(PERM_TABLES) do assert(perm.tbe:relayout(t.name, (random_perm(t.rows, 40 + i)))) end
    assert.same(train(plain, 5, 3, "device"), train(perm, 5, 3, "device"))
    for _, t in ipairs(PERM_TABLES) do assert.same(logical(plain, t.name), logical(perm, t.name)) end
  end)
end)
