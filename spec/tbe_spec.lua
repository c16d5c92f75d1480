-- Page prefetch of managed tables (ur_tbe_prefetch_pages, tbe:page_runs, tbe:prefetch_pages)
-- and the prefetch pipeline over managed tables.  On the CPU: the runs of pages a batch's rows
-- touch, exactly (f32, f16 and bf16 rows, rows straddling pages, a permutation, adjacent pages
-- merged, ranges the hint record keeps on the GPU skipped, optimizer state, bad ids, random
-- batches against a plain reference), the errors of bad input, and training through the
-- pipeline (and `uvmrec train` with train.pipeline) as the plain loop does, bit for bit.  On
-- the GPU (#cuda): the runs asked for report prefetched to the GPU, and managed tables trained
-- through the pipeline give the plain loop's and device tables' outputs and weights.  Rows drawn
-- again (tbe:reset_rows, what managed collisions do to a row given to another id): as a fresh
-- collection draws them, with their state and counters zeroed, through a row layout and a
-- software cache; on the GPU, the CPU's numbers.
local ffi = require "ffi"
local ur = require "uvmrec"
local h = require "helpers"
local cmd = require "command"
local R = require "tbe_ref"
local tbe = require "uvmrec.tbe"
local Prefetch = require "uvmrec.pipeline.Prefetch"

local cuda_it = h.cuda_it
local C = ur.C
local P = 4096

-- Every test runs with 4 KiB hint pages; the page size in force before is restored after.
local saved_page
local function with_pages(fn)
  return function()
    saved_page = ur.hint_page_bytes()
    ur.set_hint_page_bytes(P)
    local ok, err = pcall(fn)
    ur.set_hint_page_bytes(saved_page)
    if not ok then error(err, 0) end
  end
end

-- Runs as "table/tensor first+bytes[ skipped]" strings, for readable comparisons.
local function show(runs)
  local s = {}
  for i, r in ipairs(runs) do
    s[i] = ("%s/%s %d+%d%s"):format(r.table, r.tensor, r.first, r.bytes, r.skipped and " skipped" or "")
  end
  return s
end

-- One bag per feature (batch 1) holding the given ids, features in the collection's order.
local function batch(c, ids)
  local values, offsets = {}, { 0 }
  for _, f in ipairs(c.features) do
    for _, id in ipairs(ids[f] or {}) do values[#values + 1] = id end
    offsets[#offsets + 1] = #values
  end
  return R.input({ values = values, offsets = offsets }, "host")
end

-- a: f32 dim 16 (64-byte rows, 4 pages); b: f16 dim 24 (48-byte rows: row 85 straddles pages
-- 0 and 1; 3 pages); h: host, never looked at; d: bf16 dim 8 (16-byte rows, 4 pages).  Each is
-- the only table of its storage, so its rows start at byte 0.
local function collection(opts)
  opts = opts or {}
  return assert(tbe.new { device = "cpu", optimizer = opts.optimizer or "sgd", bounds = opts.bounds,
    tables = {
      { name = "a", rows = 256, dim = 16, dtype = "f32", placement = "managed" },
      { name = "b", rows = 256, dim = 24, dtype = "f16", placement = "managed" },
      { name = "h", rows = 64, dim = 8, dtype = "f32", placement = "host" },
      { name = "d", rows = 1024, dim = 8, dtype = "bf16", placement = "managed" },
    } })
end

-- The plain reference: a set of pages per (table, tensor) from each id's bytes, then sorted and
-- coalesced.  layout[name] = { {tensor =, base =, row_bytes =, alloc =}, ... }.
local function reference(c, ids, layout, perms)
  local out = {}
  for _, name in ipairs(c.table_names) do
    for _, L in ipairs(layout[name] or {}) do
      local pages, list = {}, {}
      for _, id in ipairs(ids[name] or {}) do
        if id >= 0 and id < c.rows[name] then
          local row = perms and perms[name] and perms[name][id + 1] or id
          local b = L.base + row * L.row_bytes
          for pg = math.floor(b / P), math.floor((b + L.row_bytes - 1) / P) do
            if not pages[pg] then
              pages[pg] = true
              list[#list + 1] = pg
            end
          end
        end
      end
      table.sort(list)
      local k = 1
      while k <= #list do
        local e = k
        while e < #list and list[e + 1] == list[e] + 1 do e = e + 1 end
        local first, last = list[k] * P, math.min((list[e] + 1) * P, L.alloc)
        out[#out + 1] = { table = name, tensor = L.tensor, first = first, bytes = last - first, skipped = false }
        k = e + 1
      end
    end
  end
  return out
end

describe("uvmrec.tbe page runs (ur_tbe_page_runs)", function()
  it("has the layouts the header declares", function()
    assert.equal(tonumber(C.ur_sizeof_page_run()), ffi.sizeof("ur_page_run"))
    assert.equal(tonumber(C.ur_sizeof_page_stats()), ffi.sizeof("ur_page_stats"))
  end)

  it("turns rows into merged runs of pages per table (f32, f16, bf16; straddling rows; a permutation)",
     with_pages(function()
    local c = collection()
    -- d keeps row id at physical row 1023 - id
    local perm = R.tensor((function()
      local p = {}
      for id = 0, 1023 do p[id + 1] = 1023 - id end
      return p
    end)(), "i64")
    assert(c:set_permutation("d", perm))
    local runs, st = c:page_runs(batch(c, {
      a = { 1, 2, 130, 255, 2 },  -- pages 0, 2, 3: runs [0, 4096) and [8192, 16384)
      b = { 85, 200, 10 },        -- row 85 is bytes 4080..4128: pages 0..2 merge into one run
      h = { 3, 60 },              -- host table: not looked at
      d = { 0, 5, 1000 },         -- physical rows 1023, 1018 (page 3) and 23 (page 0)
    }))
    assert.same({ "a/weights 0+4096", "a/weights 8192+8192", "b/weights 0+12288",
                  "d/weights 0+4096", "d/weights 12288+4096" }, show(runs))
    assert.equal(11, st.ids)
    assert.equal(4 + 3 + 3, st.rows)
    assert.equal(3 + 3 + 2, st.pages)
    assert.equal(5, st.runs)
    assert.equal(0, st.runs_skipped)
    assert.equal(4096 + 8192 + 12288 + 4096 + 4096, st.bytes)
    assert.is_false(st.issued)
    -- the permutation changes: the runs follow it
    assert(c:set_permutation("d", nil))
    runs = c:page_runs(batch(c, { d = { 0, 5, 1000 } }))
    assert.same({ "d/weights 0+4096", "d/weights 12288+4096" }, show(runs))
    runs = c:page_runs(batch(c, { d = { 300, 600 } })) -- pages 1 and 2: one run
    assert.same({ "d/weights 4096+8192" }, show(runs))
    c:free()
  end))

  it("skips runs lying wholly in ranges preferred on or prefetched to the GPU, not partly", with_pages(function()
    local c = collection()
    local a = c:table("a")
    assert(a:advise(128 * 16, 128 * 16, "preferred_location", "gpu")) -- rows 128..255: pages 2, 3
    local ids = { a = { 1, 130, 255 } }
    local runs, st = c:page_runs(batch(c, ids))
    assert.same({ "a/weights 0+4096", "a/weights 8192+8192 skipped" }, show(runs))
    assert.equal(1, st.runs_skipped)
    assert.equal(4096, st.bytes)
    assert.equal(8192, st.bytes_skipped)
    -- toward the CPU nothing is preferred there: nothing skipped
    runs = c:page_runs(batch(c, ids), "cpu")
    assert.same({ "a/weights 0+4096", "a/weights 8192+8192" }, show(runs))
    -- a run of which only a part is on the GPU is asked for whole
    assert(a:advise(192 * 16, 64 * 16, "unset_preferred_location", "gpu"))   -- page 3 no longer
    runs = c:page_runs(batch(c, ids))
    assert.same({ "a/weights 0+4096", "a/weights 8192+8192" }, show(runs))
    -- prefetched there counts too
    assert(a:prefetch(192 * 16, 64 * 16, "gpu"))
    runs = c:page_runs(batch(c, ids))
    assert.same({ "a/weights 0+4096", "a/weights 8192+8192 skipped" }, show(runs))
    a:free()
    c:free()
  end))

  it("includes managed optimizer state (rowwise Adagrad's 4-byte rows)", with_pages(function()
    local c = collection { optimizer = "rowwise_adagrad" }
    local s = c:state("a").sum
    local base = tonumber(C.ur_tensor_offset(s.p)) * 4
    local runs = c:page_runs(batch(c, { a = { 1, 255 } }))
    -- the sums of all tables share one f32 storage; a's start at `base`: rows 1 and 255 are
    -- bytes base + 4 .. base + 1024, one run from the page of the first
    assert.equal(3, #runs)
    assert.same({ "a/weights 0+4096", "a/weights 12288+4096" }, { show(runs)[1], show(runs)[2] })
    assert.equal("sum", runs[3].tensor)
    assert.equal(math.floor((base + 4) / P) * P, runs[3].first)
    assert.is_true(runs[3].first + runs[3].bytes >= base + 1024)
    s:free()
    c:free()
  end))

  it("fails on a bad id as the forward does under bounds fatal, skips it under warn", with_pages(function()
    local c = collection()
    local input = batch(c, { a = { 1 }, b = { 2, 256 } })
    local msg = "tbe: table 'b' (feature 'b', sample 0, value 2) has no row 256; ids run 0..255"
    assert.has_error(function() c:page_runs(input) end, msg)
    assert.has_error(function() c:prefetch_pages(input) end, msg)
    local out = assert(c:new_output(input))
    assert.has_error(function() c:forward(input, out) end, msg) -- the forward's own
    c:free()
    c = collection { bounds = "warn" }
    local runs, st = c:page_runs(batch(c, { a = { 1, -4 }, b = { 2, 256 } }))
    assert.same({ "a/weights 0+4096", "b/weights 0+4096" }, show(runs))
    assert.equal(2, st.skipped_ids)
    assert.equal(2, st.rows)
    c:free()
  end))

  it("names the object, the value and the expectation for bad input", with_pages(function()
    local c = collection()
    local function err_of(input)
      local ok, e = pcall(c.page_runs, c, input)
      assert.is_false(ok)
      return (tostring(e):gsub("^[^:]*:%d+: ", ""))
    end
    local good = batch(c, { a = { 1 } })
    assert.equal("tbe: prefetch_pages: values is i32 with 1 dimensions; expected i64 with 1",
                 err_of({ values = R.tensor({ 1 }, "i32"), offsets = good.offsets }))
    assert.equal("tbe: prefetch_pages: 5 bags do not split evenly over 4 features; pass stride_per_key_per_rank "
                 .. "for a variable batch",
                 err_of({ values = good.values, offsets = R.tensor({ 0, 1, 1, 1, 1, 1 }, "i64") }))
    assert.equal("tbe: prefetch_pages: offsets end at 3 for 1 value",
                 err_of({ values = good.values, offsets = R.tensor({ 0, 1, 1, 1, 3 }, "i64") }))
    assert.equal("tbe: prefetch_pages: offsets[2] = 0 is below offsets[1] = 1; offsets must not decrease",
                 err_of({ values = good.values, offsets = R.tensor({ 0, 1, 0, 1, 1 }, "i64") }))
    assert.equal("tbe: prefetch_pages: stride_per_key_per_rank sums to 3 bags but offsets hold 4",
                 err_of({ values = good.values, offsets = good.offsets,
                         stride_per_key_per_rank = { { 1 }, { 1 }, { 1 }, { 0 } } }))
    local st = ffi.new("ur_page_stats")
    assert.equal(C.UR_STATUS_INVALID, C.ur_tbe_page_runs(c.h.p, good.values.p, good.offsets.p, nil, st, -7))
    assert.equal("tbe: prefetch_pages: location -7 is not a location; expected -1 (cpu), -2 (the collection's "
                 .. "gpu) or a GPU number", ffi.string(C.ur_last_error()))
    assert.has_error(function() c:page_runs(good, "moon") end)
    c:free()
  end))

  it("matches a plain reference on random batches (variable batch, permutations, state)", with_pages(function()
    math.randomseed(17)
    for round = 1, 4 do
      local opt = round % 2 == 0 and "adam" or "rowwise_adagrad"
      local c = assert(tbe.new { device = "cpu", optimizer = opt, seed = round, tables = {
        { name = "x", rows = 3000, dim = 12, dtype = "f16", placement = "managed", features = { "x1", "x2" } },
        { name = "y", rows = 777, dim = 36, dtype = "f32", placement = "managed" },
        { name = "z", rows = 5000, dim = 4, dtype = "bf16", placement = "managed" },
        { name = "w", rows = 100, dim = 8, dtype = "f32", placement = "host" },
      } })
      local perms = {}
      for _, name in ipairs { "x", "z" } do
        local n, p = c.rows[name], {}
        for i = 1, n do p[i] = i - 1 end
        for i = n, 2, -1 do
          local j = math.random(i)
          p[i], p[j] = p[j], p[i]
        end
        perms[name] = p
        local t = R.tensor(p, "i64")
        assert(c:relayout(name, t))
        t:free()
      end
      local layout = {}
      for _, name in ipairs { "x", "y", "z" } do
        local ts = { { "weights", c:table(name) } }
        for _, sn in ipairs(c.state_names) do ts[#ts + 1] = { sn, c:state(name)[sn] } end
        layout[name] = {}
        for _, e in ipairs(ts) do
          local x = e[2]
          local es = x:nbytes() / x:numel()
          -- the allocation's end is left open: the engine clamps to it (below)
          local base = tonumber(C.ur_tensor_offset(x.p)) * es
          layout[name][#layout[name] + 1] = { tensor = e[1], base = base, row_bytes = x:nbytes() / c.rows[name],
                                             alloc = math.huge }
        end
      end
      local strides = {}
      for f = 1, 5 do strides[f] = math.random(0, 40) end
      local values, offsets, ids = {}, { 0 }, { x = {}, y = {}, z = {}, w = {} }
      for f, fname in ipairs(c.features) do
        local tname = fname:match("^x") and "x" or fname
        for _ = 1, strides[f] do
          for _ = 1, math.random(0, 4) do
            local id = math.floor(c.rows[tname] * math.random() ^ 3)
            values[#values + 1] = id
            table.insert(ids[tname], id)
          end
          offsets[#offsets + 1] = #values
        end
      end
      local input = R.input({ values = values, offsets = offsets, strides = strides }, "host")
      local runs, st = c:page_runs(input)
      local want = reference(c, ids, layout, perms)
      -- the last run of a tensor may end at its allocation's end: compare with that clamped
      for i, r in ipairs(want) do
        if runs[i] and runs[i].first == r.first and runs[i].bytes < r.bytes then r.bytes = runs[i].bytes end
      end
      assert.same(show(want), show(runs), "round " .. round)
      local pages = 0
      for _, r in ipairs(want) do pages = pages + math.ceil(r.bytes / P) end
      assert.equal(pages, st.pages, "round " .. round)
      assert.equal(#values - #ids.w, st.ids)
      c:free()
    end
  end))
end)

-- ---- the pipeline over managed tables ----

local TABLES = { { name = "a", rows = 3000, dim = 16 }, { name = "b", rows = 900, dim = 8, dtype = "f16" } }

local function make(device, placement)
  local o = { tables = {}, device = device, seed = 4, optimizer = { "rowwise_adagrad", lr = 0.1 } }
  for i, t in ipairs(TABLES) do
    o.tables[i] = { name = t.name, rows = t.rows, dim = t.dim, dtype = t.dtype, placement = placement }
  end
  return ur.nn.EmbeddingBagCollection(o)
end

local function batches(n, placement)
  return R.train_batches(n, TABLES, placement, function(k, t)
    return (k * 37 + math.floor(t.rows * math.random() ^ 2)) % t.rows
  end)
end

describe("uvmrec.pipeline.Prefetch over managed tables", function()
  it("prefetches each batch's pages with pages = true and trains as the plain loop does", with_pages(function()
    local list = batches(10, "host")
    local ref = make("cpu", "managed")
    local want = R.train_plain(ref, list)
    local m = make("cpu", "managed")
    local outs, n, stats = R.train_piped(m, list, { pages = true })
    assert.equal(10, n)
    for i = 1, 10 do R.bits_equal(outs[i], want[i], "batch " .. i) end
    for _, t in ipairs(TABLES) do R.bits_equal(m:table(t.name), ref:table(t.name), "table " .. t.name) end
    -- the stats are the sums of what page_runs says of each batch
    local probe = make("cpu", "managed")
    local pages, bytes = 0, 0
    for _, b in ipairs(list) do
      local _, st = probe:page_runs(b.sparse)
      pages, bytes = pages + st.pages, bytes + st.bytes
    end
    assert.is_true(pages > 0)
    assert.equal(pages, stats.pages)
    assert.equal(bytes, stats.page_bytes)
    assert.equal(10, stats.prefetched)
  end))

  it("leaves page prefetch off by default, and refuses it without managed tables", function()
    local list = batches(3, "host")
    local _, n, stats = R.train_piped(make("cpu", "managed"), list)
    assert.equal(3, n)
    assert.is_nil(stats.pages)
    assert.equal(0, stats.prefetched)
    assert.has_error(function()
      Prefetch.new { collection = make("cpu", "host"), source = { next = function() end }, pages = true }
    end, "Prefetch: pages = true needs a collection with managed tables")
    assert.has_error(function()
      Prefetch.new { collection = make("cpu", "managed"), source = { next = function() end }, pages = 1 }
    end, "Prefetch: pages is 1; expected true or false")
  end)

  it("trains managed tables in `uvmrec train` with train.pipeline as without it", function()
    local function losses(sets)
      return h.train_tiny({ "train.batch_size=256", "eval.samples=0", "eval.min_auc=0", "train.log_every=1",
        "train.steps=6", "embeddings.hints.every=2", "embeddings.hints.allowance=20%" }, sets).losses
    end
    local want = losses { "embeddings.placement=host" }
    assert.equal(6, #want)
    for _, policy in ipairs { "hot_prefix", "none" } do
      local got = losses { "embeddings.placement=managed", "embeddings.hints.policy=" .. policy, "train.pipeline=true" }
      assert.same(want, got, policy)
    end
  end)

  cuda_it("prefetch_pages leaves the runs asked for prefetched to the GPU, skipping the hot prefix",
          with_pages(function()
    -- CUPTI's counters (not under compute-sanitizer) count managed memory allocated after start:
    -- what moved is measured; a probe's timing cannot tell 4 KiB pages apart (residency)
    local monitored = ur.monitor.start()
    local c = assert(tbe.new { device = 0, optimizer = "sgd", tables = {
      { name = "a", rows = 4096, dim = 16, dtype = "f32", placement = "managed" },
      { name = "b", rows = 4096, dim = 24, dtype = "bf16", placement = "managed" } } })
    local a = c:table("a")
    -- rows 0..1023 (pages 0..15) preferred on the GPU, the rest on the host, read in place
    assert(a:advise(0, 1024 * 16, "preferred_location", "gpu"))
    assert(a:advise(1024 * 16, 3072 * 16, "preferred_location", "cpu"))
    assert(a:advise(0, 4096 * 16, "accessed_by", "gpu"))
    local input = batch(c, { a = { 3, 700, 2000, 2001, 4095 }, b = { 5, 4000 } })
    local s = assert(ur.stream())
    if monitored then ur.monitor.read(true) end
    local st = assert(c:prefetch_pages(input, s))
    assert(s:sync())
    assert.is_true(st.issued)
    local moved = monitored and assert(ur.monitor.read(true)).bytes_htod
    local runs = c:page_runs(input)
    local asked, asked_bytes = 0, 0
    for _, r in ipairs(runs) do
      local x = c:table(r.table)
      local es = x:nbytes() / x:numel()
      local off = (r.first - tonumber(C.ur_tensor_offset(x.p)) * es) / es
      local n = math.min(r.bytes / es, x:numel() - off)
      local adv = assert(x:advised(off, n))
      if r.skipped then
        assert.equal(r.table, "a")
        assert.equal("cuda:0", adv.preferred_location)
      else
        asked, asked_bytes = asked + 1, asked_bytes + r.bytes
        assert.equal("cuda:0", adv.last_prefetch_location, ("run %s %d+%d"):format(r.table, r.first, r.bytes))
      end
      x:free()
    end
    assert.equal(st.runs - st.runs_skipped, asked)
    assert.is_true(st.runs_skipped >= 1 and asked >= 3)
    if moved then -- the runs' pages started on the host, where the tables were drawn
      assert.is_true(moved >= asked_bytes, ("moved %d bytes to the GPU for runs of %d"):format(moved, asked_bytes))
    end
    a:free()
    s:free()
    c:free()
  end))

  cuda_it("trains managed tables through the pipeline as the plain loop and device tables do, bit for bit",
          with_pages(function()
    local list = batches(24, "pinned")
    local dev = make(0, "device")
    local want = R.train_plain(dev, list)
    local ref = make(0, "managed")
    local want_managed = R.train_plain(ref, list)
    local m = make(0, "managed")
    local outs, n, stats = R.train_piped(m, list, { pages = true })
    assert.equal(24, n)
    assert.is_true(stats.page_bytes > 0)
    for i = 1, 24 do
      R.bits_equal(outs[i], want[i], "batch " .. i .. " (device tables)")
      R.bits_equal(outs[i], want_managed[i], "batch " .. i .. " (plain loop)")
    end
    for _, t in ipairs(TABLES) do
      R.bits_equal(m:table(t.name), dev:table(t.name), "table " .. t.name)
      R.bits_equal(m:state(t.name).sum, dev:state(t.name).sum, "state " .. t.name)
    end
  end))
end)

describe("uvmrec.tbe reset_rows (ur_tbe_reset_rows)", function()
  local EBC = ur.nn.EmbeddingBagCollection
  local ROWS = 40

  local function build(o)
    local t = { { name = "t0", rows = ROWS, dim = 8, dtype = o.dtype, placement = o.placement },
                { name = "t1", rows = 30, dim = 8, dtype = o.dtype, placement = o.placement } }
    return EBC{ tables = t, device = o.device or "cpu", seed = 3, optimizer = { o.optimizer, lr = 0.3 },
                cache = o.placement == "cached" and { slots = 64 } or nil }
  end

  -- steps of training on every row of t0 in turn and random rows of t1; place: where the
  -- inputs go ("device" for a collection on the GPU)
  local function train(e, steps, place)
    local r = h.rng(11)
    for step = 1, steps do
      local values, lengths = {}, {}
      for i = 1, 16 do -- every row of t0 in turn
        values[i] = (step * 16 + i) % ROWS
        lengths[i] = 1
      end
      for i = 17, 32 do
        values[i] = r(30) - 1
        lengths[i] = 1
      end
      local k = ur.KJT{ keys = { "t0", "t1" }, values = values, lengths = lengths }
      if place then k = assert(k:to(place)) end
      local out = e:forward(k)
      local grad = ur.tensor(out:size()):uniform(-1, 1, 5)
      e:backward(k, place and assert(grad:to(place)) or grad)
    end
  end

  local function rows_of(t, dim)
    local flat, out = t:totable(), {}
    for r = 0, #flat / dim - 1 do
      out[r] = { unpack(flat, r * dim + 1, r * dim + dim) }
    end
    return out
  end

  for _, case in ipairs {
    { dtype = "f32", optimizer = "rowwise_adagrad", placement = "host" },
    { dtype = "f16", optimizer = "adam", placement = "managed", relayout = true },
    { dtype = "bf16", optimizer = "adagrad", placement = "managed" },
    { dtype = "f32", optimizer = "rowwise_adagrad", placement = "cached" },
  } do
    local what = ("%s, %s, %s%s"):format(case.dtype, case.optimizer, case.placement,
                                         case.relayout and ", relaid out" or "")
    it("draws rows again as at creation and zeroes their state and counters (" .. what .. ")", function()
      local a, fresh = build(case), build(case)
      if case.placement ~= "cached" then a.tbe:set_counting(true) end
      train(a, 6)
      if case.relayout then assert(a.tbe:relayout("t0", "counts")) end
      local perm = case.relayout and a.tbe:permutation("t0"):totable() or nil
      local function phys(r) return perm and perm[r + 1] or r end
      local before = rows_of(a:table("t0"), 8)
      local reset = { 3, 17, 39 }
      assert(a.tbe:reset_rows("t0", reset))
      local after, init = rows_of(a:table("t0"), 8), rows_of(fresh:table("t0"), 8)
      local is_reset = {}
      for _, r in ipairs(reset) do
        is_reset[phys(r)] = true
        assert.are.same(init[r], after[phys(r)], "row " .. r .. " as first drawn")
        assert.are_not.same(before[phys(r)], after[phys(r)], "row " .. r .. " had trained")
      end
      for p = 0, ROWS - 1 do
        if not is_reset[p] then assert.are.same(before[p], after[p], "physical row " .. p .. " untouched") end
      end
      for sname, st in pairs(a:state("t0")) do
        local per = st:numel() / ROWS
        local v = st:totable()
        local nonzero = 0
        for p = 0, ROWS - 1 do
          for c = 1, per do
            local x = v[p * per + c]
            if is_reset[p] then
              assert.equal(0, x, sname .. " of reset physical row " .. p)
            elseif x ~= 0 then
              nonzero = nonzero + 1
            end
          end
        end
        assert.is_true(nonzero > 0, sname .. ": other rows keep their state")
      end
      if case.placement ~= "cached" then
        local counts = a.tbe:counts("t0"):totable()
        for _, r in ipairs(reset) do assert.equal(0, counts[r + 1], "counter of row " .. r) end
        assert.is_true(counts[2] + counts[3] > 0, "other counters kept")
      else
        -- the cache must not serve the trained copy: a forward reads the row as first drawn
        local k = ur.KJT{ keys = { "t0", "t1" }, values = { 17, 0 }, lengths = { 1, 1 } }
        local got, want = a:forward(k):totable(), fresh:forward(k):totable()
        assert.are.same({ unpack(want, 1, 8) }, { unpack(got, 1, 8) })
      end
    end)
  end

  it("names the table and the bad id", function()
    local e = build { dtype = "f32", optimizer = "sgd", placement = "host" }
    local ok, err = pcall(function() e.tbe:reset_rows("t1", { 2, 30 }) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("tbe: reset_rows: ids[1] = 30 is outside table 't1' (rows 0..29)", 1, true))
    ok, err = pcall(function() e.tbe:reset_rows("t9", { 1 }) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("no table named 't9'", 1, true))
    -- a fractional id, step or seed is refused, not truncated (row 1 reset for 1.5)
    assert.has_error(function() e.tbe:reset_rows("t1", { 2, 1.5 }) end,
                     "embedding collection: reset_rows ids[2] is 1.5; expected a whole number that fits i64")
    assert.has_error(function() e.tbe:set_step(1.5) end,
                     "embedding collection: step is 1.5; expected a whole number >= 0")
    assert.has_error(function() e.tbe:init_table("t1", 0, 1, 0.5) end,
                     "embedding collection: init_table seed is 0.5; expected a whole number >= 0")
  end)

  cuda_it("draws the CPU's numbers on the GPU (device and managed tables)", function()
    for _, placement in ipairs { "device", "managed" } do
      local case = { dtype = "bf16", optimizer = "rowwise_adagrad", placement = placement, device = 0 }
      local g, c = build(case), build { dtype = "bf16", optimizer = "rowwise_adagrad", placement = "host" }
      train(g, 3, "device")
      assert(g.tbe:reset_rows("t0", { 0, 5, 38 }))
      local rg, rc = rows_of(assert(g:table("t0"):to("host")), 8), rows_of(c:table("t0"), 8)
      for _, r in ipairs { 0, 5, 38 } do assert.are.same(rc[r], rg[r], placement .. ": row " .. r) end
      local sum = assert(g:state("t0").sum:to("host")):totable()
      for _, r in ipairs { 0, 5, 38 } do assert.equal(0, sum[r + 1], placement .. ": state of row " .. r) end
    end
  end)
end)

describe("uvmrec.tbe tables at build time", function()
  -- A collection's tables drawn in a process of its own: a digest of every element, and its
  -- first elements against the tensor generator for the table's seed (Philox's numbers).
  local script = [[
    local ffi = require "ffi"
    local ur = require "uvmrec"
    local place, device = arg[1], arg[2] == "gpu" and 0 or "cpu"
    local c = assert(require("uvmrec.tbe").new { seed = 5, device = device, tables = {
      { name = "a", rows = 70001, dim = 16, placement = place }, { name = "b", rows = 3, dim = 8, placement = place },
      { name = "c", rows = 4099, dim = 12, dtype = "bf16", placement = place } } })
    local h = 2166136261ULL
    for i, name in ipairs { "a", "b", "c" } do
      local w = c:table(name)
      local host = assert(w:to("host"))
      local n = host:nbytes() / 2
      local q = ffi.cast("uint16_t *", ur.C.ur_tensor_data(host.p))
      for k = 0, n - 1 do h = bit.bxor(h, q[k]) * 16777619ULL end
      local rows = ({ 70001, 3, 4099 })[i]
      local seed = bit.bxor(ffi.cast("uint64_t", 5), ffi.cast("uint64_t", i) * 0xD1B54A32D192ED03ULL)
      local m = math.min(500, host:numel())
      local ref = ur.tensor({ m }, { dtype = host:dtype() }):uniform(-1 / math.sqrt(rows), 1 / math.sqrt(rows), seed)
      for k = 0, m - 1 do assert(ref:get(k) == host:get(k), name .. " element " .. k) end
    end
    print("digest " .. tostring(h))
  ]]

  local function digest(env, place, gpu)
    local dir = cmd.tmpdir()
    cmd.spit(dir .. "/draw.lua", script)
    local out, err, code = cmd.sh(("%s %s %s/draw.lua %s %s"):format(env, cmd.quote(cmd.bin()), dir, place,
      gpu and "gpu" or "cpu"))
    cmd.rmdir(dir)
    assert.equal(0, code, err)
    return out:match("digest (%S+)")
  end

  it("draws the same numbers on one thread and on several, each Philox's for the table's seed", function()
    local one = digest("UR_NUM_THREADS=1", "host")
    assert.is_not_nil(one)
    assert.equal(one, digest("UR_NUM_THREADS=3", "host"))
    assert.equal(one, digest("UR_NUM_THREADS=3", "managed"))
  end)

  cuda_it("draws pinned host tables of a GPU collection on the GPU (streamed down) as the CPU draws them", function()
    local cpu = digest("UR_NUM_THREADS=2", "host")
    assert.equal(cpu, digest("", "host", true))
    assert.equal(cpu, digest("", "managed", true))
    assert.equal(cpu, digest("", "device", true))
  end)
end)

-- Rowwise Adagrad split around the row sums (ur_tbe_set_row_sums, ur_tbe_row_sums), what
-- uvmrec.dist.sharded does for tables in several column shards.
describe("uvmrec.tbe row sums (rowwise Adagrad over column shards)", function()
  local hp = { lr = 0.05, eps = 1e-3, weight_decay = 0.01, max_grad = 0.7 }
  local function optimizer(kind)
    return { kind or "rowwise_adagrad", lr = hp.lr, eps = hp.eps, weight_decay = hp.weight_decay,
             max_grad = hp.max_grad }
  end
  -- x: 40 x 12 whole (features f), or as columns [0, 8) and [8, 12) (features f0, f1, each
  -- reading f's ids); y: 9 x 8 bf16 with stochastic rounding, whole either way (feature g)
  local function whole(device)
    return assert(tbe.new { device = device or "cpu", seed = 6, optimizer = optimizer(), stochastic_rounding = true,
                            tables = { { name = "x", rows = 40, dim = 12, features = { "f" } },
                                       { name = "y", rows = 9, dim = 8, dtype = "bf16", features = { "g" } } } })
  end
  local function shards(device)
    local function part(col0, dim, f)
      return { name = "x/" .. f, rows = 40, dim = dim, features = { f },
               shard = { logical = 0, rows = 40, dim = 12, col0 = col0 } }
    end
    return assert(tbe.new { device = device or "cpu", seed = 6, optimizer = optimizer(), stochastic_rounding = true,
                            tables = { part(0, 8, "f0"), part(8, 4, "f1"),
                                       { name = "y", rows = 9, dim = 8, dtype = "bf16", features = { "g" },
                                         shard = { logical = 1, rows = 9, dim = 8 } } } })
  end
  -- A batch of B samples: ids of f (repeated as f0, f1 for the shards) and g, weighted.
  local function inputs(B, placement)
    local f, g, fo, go, fw, gw = {}, {}, { 0 }, { 0 }, {}, {}
    for _ = 1, B do
      for _ = 1, math.random(0, 3) do f[#f + 1], fw[#fw + 1] = math.random(0, 29), math.random() end
      fo[#fo + 1] = #f
      for _ = 1, math.random(0, 2) do g[#g + 1], gw[#gw + 1] = math.random(0, 8), math.random() end
      go[#go + 1] = #g
    end
    local function join(lists, offs, ws)
      local v, o, w = {}, { 0 }, {}
      for i, l in ipairs(lists) do
        for k = 1, #l do v[#v + 1], w[#w + 1] = l[k], ws[i][k] end
        for b = 2, #offs[i] do o[#o + 1] = o[#o] + offs[i][b] - offs[i][b - 1] end
      end
      local raw = { values = v, offsets = o, weights = w, batch = B }
      return R.input(raw, placement), raw
    end
    local wi, wb = join({ f, g }, { fo, go }, { fw, gw })
    local si, sb = join({ f, f, g }, { fo, fo, go }, { fw, fw, gw })
    return wi, si, wb, sb
  end
  local function sums(c, name, placement)
    local t = assert(ur.tensor({ c.rows[name] }, { placement = placement or "host" }))
    c:set_row_sums(name, t)
    return t
  end

  it("gives each row read its squared gradient's sum; a table lent its own steps as the fused step, bit for bit",
     function()
    math.randomseed(21)
    local fused, split = whole(), whole()
    local sx, sy = sums(split, "x"), sums(split, "y")
    for step = 1, 3 do
      local input, _, b = inputs(13)
      local out = fused:forward(input)
      assert.same(out:totable(), split:forward(input):totable())
      local grad = R.tensor(R.randoms(out:numel()), "f32"):view_as(0, out:size())
      local before = R.snapshot(split)
      assert(split:row_sums(input, grad))
      -- nothing stepped
      assert.same(before, R.snapshot(split))
      assert.equal(step - 1, split:step())
      -- the sums against float64: each read row's, 0 elsewhere
      local rg = R.row_grads(b, R.layout(split), grad:totable(), 20)
      for name, s in pairs { x = sx, y = sy } do
        local dim = split.dims[name]
        local want = R.row_sq(rg[name] or {}, hp, function(r)
          local row = {}
          for k = 1, dim do row[k] = before[name][r * dim + k] end
          return row
        end)
        local got = s:totable()
        for r = 0, #got - 1 do
          if want[r] then R.close({ got[r + 1] }, { want[r] }, 1e-5, 1e-7, name .. " row " .. r)
          else assert.equal(0, got[r + 1], name .. " row " .. r .. " (not read)") end
        end
      end
      assert(fused:backward(input, grad))
      assert(split:backward(input, grad))
      for name in pairs(R.snapshot(fused)) do R.bits_equal(fused:table(name), split:table(name), name) end
      for _, name in ipairs { "x", "y" } do
        R.bits_equal(fused:state(name).sum, split:state(name).sum, name .. " sum")
      end
    end
  end)

  it("writes the row sums under a raised guard gate, which holds back only the step", function()
    math.randomseed(23)
    local open, gated = whole(), whole()
    local so, sg = sums(open, "x"), sums(gated, "x")
    local flags = assert(ur.tensor({ 4 }, { dtype = "i32" }))
    assert(flags:fill(0))
    gated:set_gate(flags)
    local input = inputs(11)
    local out = open:forward(input)
    gated:forward(input)
    local grad = R.tensor(R.randoms(out:numel()), "f32"):view_as(0, out:size())
    assert(flags:fill(1)) -- the guard saw a non-finite value this step
    assert(open:row_sums(input, grad))
    assert(gated:row_sums(input, grad))
    -- another rank's column shards add these sums, gated or not
    assert.same(so:totable(), sg:totable())
    local nonzero = 0
    for _, v in ipairs(sg:totable()) do if v ~= 0 then nonzero = nonzero + 1 end end
    assert.is_true(nonzero > 0, "no row read")
    local before = R.snapshot(gated)
    assert(gated:backward(input, grad))
    assert.same(before, R.snapshot(gated)) -- the step itself held back
    gated:set_gate(nil)
    flags:free()
  end)

  it("steps column shards as the whole table when their sums are added: rows and state within rounding", function()
    math.randomseed(22)
    local w, s, alone = whole(), shards(), shards()
    local s0, s1 = sums(s, "x/f0"), sums(s, "x/f1")
    for step = 1, 4 do
      local wi, si = inputs(17)
      local out = w:forward(wi)
      -- after a step the rows agree within rounding, so the outputs too
      R.close(s:forward(si):totable(), out:totable(), step == 1 and 0 or 1e-5, step == 1 and 0 or 1e-7, "out")
      alone:forward(si)
      local grad = R.tensor(R.randoms(out:numel()), "f32"):view_as(0, out:size())
      assert(s:row_sums(si, grad))
      -- the all-reduce's part, here in one process: both shards take the sum of the two
      local a, b = s0:totable(), s1:totable()
      for i = 1, #a do a[i] = a[i] + b[i] end
      local total = R.tensor(a, "f32")
      assert(s0:copy(total))
      assert(s1:copy(total))
      assert(w:backward(wi, grad))
      assert(s:backward(si, grad))
      assert(alone:backward(si, grad))
      local wx, p0, p1 = w:table("x"):totable(), s:table("x/f0"):totable(), s:table("x/f1"):totable()
      local joined = {}
      for r = 0, 39 do
        for k = 1, 8 do joined[r * 12 + k] = p0[r * 8 + k] end
        for k = 1, 4 do joined[r * 12 + 8 + k] = p1[r * 4 + k] end
      end
      R.close(joined, wx, 1e-5, 1e-7, "x after step " .. step)
      local ws = w:state("x").sum:totable()
      R.close(s:state("x/f0").sum:totable(), ws, 1e-5, 1e-9, "x/f0 sum after step " .. step)
      R.bits_equal(s:state("x/f0").sum, s:state("x/f1").sum, "the shards' sums")
      -- y has no row sums: its fused step, bit for bit
      R.bits_equal(w:table("y"), s:table("y"), "y after step " .. step)
      -- shards stepping alone take their own columns' mean: not the whole row's
      local own = alone:state("x/f1").sum:totable()
      local off = 0
      for i = 1, #ws do off = math.max(off, math.abs(own[i] - ws[i]) / math.max(ws[i], 1e-6)) end
      assert.is_true(off > 1e-2, "shards alone agree with the whole table; the spec could not fail")
    end
  end)

  it("names the table, the value and the expectation for bad input", function()
    local c = whole()
    assert.has_error(function() c:set_row_sums("q", ur.tensor { 40 }) end,
      "embedding collection: no table named 'q' (tables: x, y)")
    assert.has_error(function() c:set_row_sums("x", ur.tensor { 39 }) end,
      "tbe set_row_sums: table 'x': the sums are f32 of 39 elements; expected f32 of 40 (one per row)")
    assert.has_error(function() c:set_row_sums("x", ur.tensor({ 40 }, { dtype = "i32" })) end,
      "tbe set_row_sums: table 'x': the sums are i32 of 40 elements; expected f32 of 40 (one per row)")
    local t = ur.tensor { 40 }
    c:set_row_sums("x", t)
    assert.has_error(function() c:set_row_sums("y", t:view_as(0, { 9 })) end,
      "tbe set_row_sums: table 'y': the sums overlap table 'x''s; each table needs its own")
    c:set_row_sums("x", nil)
    local input = inputs(2)
    assert.has_error(function() c:row_sums(input, ur.tensor { 2, 20 }) end,
      "tbe row_sums: no table of the collection has row sums (ur_tbe_set_row_sums)")
    local ada = assert(tbe.new { device = "cpu", optimizer = optimizer("adagrad"),
                                 tables = { { name = "x", rows = 40, dim = 12 } } })
    assert.has_error(function() ada:set_row_sums("x", ur.tensor { 40 }) end,
      "tbe set_row_sums: table 'x': row sums are rowwise Adagrad's, and the collection's optimizer is adagrad")
    c:free()
    ada:free()
  end)

  cuda_it("gives the CPU's sums and steps on the GPU, within the warp's rounding", function()
    math.randomseed(23)
    local cpu, gpu = shards(), shards(0)
    local c0, c1 = sums(cpu, "x/f0"), sums(cpu, "x/f1")
    local g0, g1 = sums(gpu, "x/f0", "device"), sums(gpu, "x/f1", "device")
    for step = 1, 3 do
      local _, si, _, sb = inputs(33)
      local sg = R.input(sb, "device")
      local out = cpu:forward(si)
      -- the same tables give the same bits; after a step they differ by the steps' rounding
      if step == 1 then
        assert.same(out:totable(), gpu:forward(sg):totable(), "forward 1")
      else
        R.close(gpu:forward(sg):totable(), out:totable(), 1e-5, 1e-7, "forward " .. step)
      end
      local grad = R.tensor(R.randoms(out:numel()), "f32"):view_as(0, out:size())
      local gg = assert(grad:to("device"))
      assert(cpu:row_sums(si, grad))
      assert(gpu:row_sums(sg, gg))
      R.close(g0:totable(), c0:totable(), 1e-6, 1e-9, "x/f0 sums " .. step)
      R.close(g1:totable(), c1:totable(), 1e-6, 1e-9, "x/f1 sums " .. step)
      for _, pair in ipairs { { c0, c1 }, { g0, g1 } } do
        local a, b = pair[1]:totable(), pair[2]:totable()
        for i = 1, #a do a[i] = a[i] + b[i] end
        local total = R.tensor(a, "f32", pair[1]:placement())
        assert(pair[1]:copy(total))
        assert(pair[2]:copy(total))
      end
      assert(cpu:backward(si, grad))
      assert(gpu:backward(sg, gg))
      for _, name in ipairs { "x/f0", "x/f1" } do
        R.close(gpu:table(name):totable(), cpu:table(name):totable(), 1e-5, 1e-7, name .. " step " .. step)
        R.close(gpu:state(name).sum:totable(), cpu:state(name).sum:totable(), 1e-5, 1e-9, name .. " sum " .. step)
      end
    end
  end)
end)

describe("uvmrec.tbe stochastic rounding (tbe_plan.h)", function()
  it("rounds normal values by integer steps to the float path's bits, f16 and bf16 "
    .. "(engine/tests/round_sr_check.c: every exponent's edges around the threshold, random values)", function()
    local out, why = h.run_c_check("round_sr_check")
    if not out then return pending(why) end
    assert.matches("round_sr_check: ok, %d+ compared", out)
  end)
end)

describe("uvmrec.tbe bad input", function()
  it("names an input without offsets and a stochastic_rounding that is not true or false", function()
    local c = assert(tbe.new { device = "cpu", tables = { { name = "t", rows = 8, dim = 4 } } })
    assert.has_error(function() assert(c:forward { values = R.tensor({}, "i64"), offsets = R.tensor({}, "i64") }) end,
                     "tbe: offsets is empty; expected bags + 1 entries")
    for _, v in ipairs { 0, "no" } do
      assert.has_error(function()
        tbe.new { device = "cpu", tables = { { name = "t", rows = 8, dim = 4 } }, stochastic_rounding = v }
      end, ("embedding collection: stochastic_rounding is %s; expected true or false"):format(v))
    end
    c:free()
  end)

  it("names the counts of a collection without tables or features (ur_tbe_new, past the Lua checks)", function()
    local cfg = ffi.new("ur_tbe_config", { device = -1, out_dtype = C.UR_DTYPE_F32 })
    cfg.optim.kind = C.UR_OPTIM_KIND_SGD
    local tc = ffi.new("ur_tbe_table_config[1]", { { name = "t", rows = 8, dim = 4, place = C.UR_PLACE_HOST,
                                                     state_place = -1 } })
    local ft, out = ffi.new("int32_t[1]", 0), ffi.new("ur_tbe *[1]")
    for _, n in ipairs { { 0, 1 }, { 1, 0 } } do
      assert.equal(C.UR_STATUS_INVALID, C.ur_tbe_new(out, cfg, n[1], tc, n[2], ft, nil))
      assert.equal(("tbe: %d tables and %d features; expected at least one of each"):format(n[1], n[2]),
                   ffi.string(C.ur_last_error()))
    end
    assert.equal(0, C.ur_tbe_new(out, cfg, 1, tc, 1, ft, nil), ffi.string(C.ur_last_error()))
    C.ur_tbe_free(out[0])
  end)

  it("checks a KJT not known checked before any entry reads it through its offsets, and a checked one not at all",
    function()
    local function coll(placement)
      return assert(tbe.new { device = "cpu", tables = { { name = "t", rows = 64, dim = 4, features = { "a", "b" },
                                                           placement = placement } } })
    end
    local plain, managed, cached = coll(), coll("managed"), coll("cached")
    -- made unchecked (lengths {1, 1, 400, 1} for 4 values), then its offsets rewritten in order within the values:
    -- a's bags empty, b's second reading all four ids, a's among them.  Every entry read them as given (forward,
    -- backward, sparse_grad gave b's sample 1 the sum of four rows; the pages and the cache took them too): the
    -- CPU's own check of the offsets asks only that they be in order and end at the values' count, and a GPU's
    -- kernels trust them (a KJT with offsets past its values was read out of bounds there)
    local function odd()
      local k = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3, 4 }, lengths = { 1, 1, 400, 1 }, check = false }
      local o = k:offsets()
      for i, x in ipairs { 0, 0, 0, 0, 4 } do o:set(i - 1, x) end
      return k
    end
    local grad = ur.tensor({ 2, 8 }):fill(1)
    local want = "embedding collection: kjt: key 'a' sample 0: offsets 0..0 disagree with length 1 or pass the 4 values"
    local entries = {
      forward = function(k) return plain:forward(k) end,
      backward = function(k) return plain:backward(k, grad) end,
      sparse_grad = function(k) return plain:sparse_grad(k, grad) end,
      far_prefetch = function(k) return plain:far_prefetch(k) end,
      page_runs = function(k) return managed:page_runs(k) end,
      prefetch_pages = function(k) return managed:prefetch_pages(k) end,
      prepare = function(k) return cached:prepare(k) end,
      ["cached forward"] = function(k) return cached:forward(k) end,
    }
    for name, call in pairs(entries) do
      local k = odd()
      assert.is_false(k:checked(), name)
      local ok, err = pcall(call, k)
      assert.is_false(ok, name)
      assert.equal(want, (tostring(err):gsub("^[^:]*:%d+: ", "")), name)
      assert.is_false(k:checked(), name) -- still not known checked: the next entry checks it again
    end
    -- bags that pass the values and a length below 0: named as the KJT's (the CPU's check named offsets)
    local over = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1 }, check = false }
    assert.has_error(function() plain:forward(over) end,
      "embedding collection: kjt: key 'b' sample 0: offsets 2..402 disagree with length 400 or pass the 3 values")
    local neg = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 2, -1, 1, 1 }, check = false }
    assert.has_error(function() plain:forward(neg) end,
      "embedding collection: kjt: key 'a' sample 1 (lengths[1]) has length -1; lengths must be >= 0")
    -- written right after: checked once by the first entry, then known checked (no check again)
    local fixed = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 2, -1, 1, 1 }, check = false }
    fixed:lengths():set(0, 1)
    fixed:lengths():set(1, 0)
    fixed:offsets():set(1, 1)
    assert.is_false(fixed:checked())
    local sound = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 0, 1, 1 } }
    assert.same(plain:forward(sound):totable(), assert(plain:forward(fixed)):totable())
    assert.is_true(fixed:checked())
    -- a KJT known checked is not looked at (the mark holds for the contents as checked: whoever writes into
    -- its tensors validates it again): lengths the collection does not read, written wrong, change nothing
    local k = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 0, 1, 1 } }
    k:lengths():set(0, -7)
    assert.same(plain:forward(sound):totable(), assert(plain:forward(k)):totable())
    assert.is_true(k:checked())
    for _, c in ipairs { plain, managed, cached } do c:free() end
  end)
end)
