-- uvmrec.cache on the GPU against the CPU reference and against device tables: the same
-- decisions (slots, statistics), the same rows after every step (bit for bit for SGD in f32
-- against device tables on the GPU, which run the same kernels over other rows), and rows
-- written back to host memory on eviction and flush.  Every test is #cuda.
local ur = require "uvmrec"
local h = require "helpers"
local R = require "tbe_ref"

local cuda_it = h.cuda_it
local EBC = ur.nn.EmbeddingBagCollection

local TABLES = { { name = "t0", rows = 700, dim = 16 }, { name = "t1", rows = 300, dim = 16 },
                 { name = "t2", rows = 2000, dim = 16 } }

-- placement: one for every table, or a list of one a table (a "device" table of the CPU's
-- reference collection is a host one)
local function make(device, placement, optimizer, cache, dtype, tables, bounds)
  local o = { tables = {}, device = device, seed = 9, optimizer = optimizer, cache = cache, bounds = bounds }
  for i, t in ipairs(tables or TABLES) do
    local p = type(placement) == "table" and placement[i] or placement
    o.tables[i] = { name = t.name, rows = t.rows, dim = t.dim, dtype = dtype,
                    placement = device == "cpu" and p == "device" and "host" or p }
  end
  return EBC(o)
end

-- The tables a placement caches.
local function cached(placement)
  local r = {}
  for i, t in ipairs(TABLES) do
    if type(placement) ~= "table" or placement[i] == "cached" then r[#r + 1] = t end
  end
  return r
end

local function batch(step)
  local values, offsets = {}, { 0 }
  local shift = math.floor(step / 6) * 131
  for _, t in ipairs(TABLES) do
    for _ = 1, 24 do
      for _ = 1, math.random(0, 3) do
        values[#values + 1] = (math.floor(t.rows * math.random() ^ 3) + shift) % t.rows
      end
      offsets[#offsets + 1] = #values
    end
  end
  return { values = values, offsets = offsets }
end

local function host_copy(t)
  return t:placement() == "host" and t or assert(t:to("host"))
end

local function close(a, b, rel, what)
  a, b = host_copy(a):totable(), host_copy(b):totable()
  R.close(a, b, rel, rel * 1e-2, what)
end

describe("uvmrec.cache on CUDA", function()
  for _, case in ipairs({
    { "sgd", { "sgd", lr = 0.3 }, { slots = 64, shared = true, policy = "lru" } },
    { "rowwise adagrad", { "rowwise_adagrad", lr = 0.1 },
      { load_factor = 0.05, policy = "lfu", decay_batches = 4, min_slots = 0 } },
    { "adam", { "adam", lr = 0.01 }, { slots = 32, shared = true, staging_rows = 8 } },
    -- a collection whose middle table is on the device: the GPU sorts only the cached values
    { "sgd, t1 on the device", { "sgd", lr = 0.3 }, { slots = 64, shared = true, policy = "lru" },
      { "cached", "device", "cached" } },
  }) do
    local name, optimizer, cache, placement = case[1], case[2], case[3], case[4] or "cached"
    cuda_it("makes the CPU's decisions and keeps device tables' rows (" .. name .. ")", function()
      math.randomseed(21)
      local gc = make(0, placement, optimizer, cache)
      local gd = make(0, "device", optimizer)
      local cc = make("cpu", placement, optimizer, cache)
      for step = 1, 24 do
        local b = batch(step)
        local xg, xc = R.input(b, "device"), R.input(b, "host")
        local og, od, oc = gc:forward(xg), gd:forward(xg), cc:forward(xc)
        R.bits_equal(og, od, "step " .. step .. " forward, cached vs device")
        close(og, oc, 1e-5, "step " .. step .. " forward, GPU vs CPU")
        local g = R.tensor(R.randoms(og:numel()), "f32", "device"):view_as(0, { og:size(1), og:size(2) })
        local gh = assert(g:to("host"))
        gc:backward(xg, g)
        gd:backward(xg, g)
        cc:backward(xc, gh)
      end
      local sg, sc = gc.tbe.cache:stats(), cc.tbe.cache:stats()
      for _, f in ipairs({ "lookups", "unique", "hits", "misses", "conflicts", "evictions", "writebacks",
                           "bytes_in", "bytes_out" }) do
        assert.equal(sc[f], sg[f], f)
      end
      assert.is_true(sg.evictions > 0 and sg.writebacks > 0)
      for _, t in ipairs(cached(placement)) do
        local probe = {}
        for r = 0, t.rows - 1 do probe[#probe + 1] = r end
        assert.same(cc.tbe.cache:contains(t.name, probe), gc.tbe.cache:contains(t.name, probe))
      end
      for _, t in ipairs(TABLES) do
        if optimizer[1] == "sgd" then
          R.bits_equal(gc:table(t.name), gd:table(t.name), t.name .. " after flush, cached vs device")
        else
          close(gc:table(t.name), gd:table(t.name), 1e-5, t.name .. " after flush, cached vs device")
        end
        close(gc:table(t.name), cc:table(t.name), 1e-4, t.name .. " after flush, GPU vs CPU")
      end
    end)
  end

  cuda_it("rounds cached f16 and bf16 rows stochastically as device tables do, bit for bit", function()
    for _, dtype in ipairs({ "f16", "bf16" }) do
      math.randomseed(5)
      local cache = { load_factor = 0.05, min_slots = 0 }
      local gc = make(0, "cached", { "sgd", lr = 0.3 }, cache, dtype)
      local gd = make(0, "device", { "sgd", lr = 0.3 }, nil, dtype)
      for step = 1, 12 do
        local x = R.input(batch(step), "device")
        local oc, od = gc:forward(x), gd:forward(x)
        R.bits_equal(oc, od, dtype .. " step " .. step .. " forward")
        local g = R.tensor(R.randoms(oc:numel()), "f32", "device"):view_as(0, { oc:size(1), oc:size(2) })
        gc:backward(x, g)
        gd:backward(x, g)
      end
      for _, t in ipairs(TABLES) do
        R.bits_equal(gc:table(t.name), gd:table(t.name), dtype .. " " .. t.name .. " after flush")
      end
    end
  end)

  -- Rows of 512 bytes with Adam's two states (1.5 KiB to move a row) and about 400 values a
  -- batch, nearly all misses that evict dirty rows: a batch's write-backs (hundreds) outgrow what
  -- the decisions' scratch stages (about 180 bytes a value, tens of rows), so some go home directly
  -- and the rest through the scratch, beside the fills (kernels/cache.cu's move); with the mover
  -- a warp a row, capped at 1 warp (one block of 32) and at 40 (two blocks), each warp many rows.
  cuda_it("moves write-backs home directly and through the scratch beside the fills alike", function()
    local wide = { { name = "w0", rows = 4000, dim = 128 }, { name = "w1", rows = 3000, dim = 128 } }
    local opt = { "adam", lr = 0.01 }
    local gcs, movers = {}, { 0, 1, 40 }
    for k, warps in ipairs(movers) do
      gcs[k] = make(0, "cached", opt, { slots = 512, shared = true, mover_warps = warps }, nil, wide)
    end
    local gd = make(0, "device", opt, nil, nil, wide)
    local cc = make("cpu", "cached", opt, { slots = 512, shared = true }, nil, wide)
    math.randomseed(33)
    for step = 1, 5 do
      local values, offsets = {}, { 0 }
      for _, t in ipairs(wide) do
        for _ = 1, 100 do
          for _ = 1, 2 do values[#values + 1] = math.random(0, t.rows - 1) end
          offsets[#offsets + 1] = #values
        end
      end
      local b = { values = values, offsets = offsets }
      local xg, xc = R.input(b, "device"), R.input(b, "host")
      local od, oc = gd:forward(xg), cc:forward(xc)
      local g = R.tensor(R.randoms(od:numel()), "f32", "device"):view_as(0, { od:size(1), od:size(2) })
      for k, gc in ipairs(gcs) do
        local og = gc:forward(xg)
        R.bits_equal(og, od, ("step %d forward, cached (mover_warps %d) vs device"):format(step, movers[k]))
        close(og, oc, 1e-5, ("step %d forward, GPU (mover_warps %d) vs CPU"):format(step, movers[k]))
        gc:backward(xg, g)
      end
      gd:backward(xg, g)
      cc:backward(xc, assert(g:to("host")))
    end
    local sc = cc.tbe.cache:stats()
    assert.is_true(sc.writebacks > 1000, sc.writebacks .. " write-backs in 5 batches")
    for k, gc in ipairs(gcs) do
      assert.equal(sc.writebacks, gc.tbe.cache:stats().writebacks)
      for _, t in ipairs(wide) do
        close(gc:table(t.name), gd:table(t.name), 1e-5,
              ("%s after flush, cached (mover_warps %d) vs device"):format(t.name, movers[k]))
        close(gc:table(t.name), cc:table(t.name), 1e-4,
              ("%s after flush, GPU (mover_warps %d) vs CPU"):format(t.name, movers[k]))
      end
    end
  end)

  cuda_it("counts its slots against the HBM budget", function()
    -- earlier tests' tensors must not be collected in between
    collectgarbage()
    collectgarbage()
    collectgarbage("stop")
    local before = ur.memory().hbm_used
    local m = make(0, "cached", "sgd", { slots = 4096, shared = true })
    local used = ur.memory().hbm_used - before
    collectgarbage("restart")
    assert.is_true(used >= m.tbe.cache:bytes(), ("%d bytes used for %d"):format(used, m.tbe.cache:bytes()))
    m.tbe:free()
  end)
end)

-- The GPU's own decisions (kernels/cache.cu, a warp per set) against the host reference
-- (engine/src/embedding/cache_cpu.c), batch by batch: the slot id of every value, every count, and the
-- tags at the end, on skewed ids whose hot set moves, with tiny caches (conflicts and
-- staging growth), tables sharing a pool of sets, LFU with decay, a variable batch per
-- feature, and the pipeline's order (batch i+1 prepared on another stream before batch i
-- retires).
describe("uvmrec.cache decisions on CUDA", function()
  local streams = require "uvmrec.stream"
  local FIELDS = { "batches", "lookups", "unique", "hits", "misses", "conflicts", "evictions",
                   "writebacks", "waits", "bytes_in", "bytes_out" }

  local function ids_batch(step, strides, hot)
    local values, offsets = {}, { 0 }
    local shift = math.floor(step / 5) * 97
    for f, t in ipairs(TABLES) do
      for _ = 1, strides and strides[f] or 24 do
        for _ = 1, math.random(0, 4) do
          local r = math.floor(t.rows * math.random() ^ hot)
          values[#values + 1] = (r + shift) % t.rows
        end
        offsets[#offsets + 1] = #values
      end
    end
    return { values = values, offsets = offsets, strides = strides }
  end

  local function same_stats(cc, cg, what, tables)
    local sc, sg = cc:stats(), cg:stats()
    for _, f in ipairs(FIELDS) do assert.equal(sc[f], sg[f], what .. ": " .. f) end
    for _, t in ipairs(tables or TABLES) do
      for _, f in ipairs(FIELDS) do
        assert.equal(sc.tables[t.name][f], sg.tables[t.name][f], what .. ": " .. t.name .. " " .. f)
      end
    end
  end

  for _, case in ipairs({
    { "lru, one shared pool of 2 sets", { slots = 64, shared = true, policy = "lru", staging_rows = 4 },
      nil, nil, true },
    { "lfu with decay, sets per table", { load_factor = 0.04, policy = "lfu", decay_batches = 3, min_slots = 0 } },
    { "lru, variable batch per feature", { load_factor = 0.1, policy = "lru", min_slots = 0 }, { 17, 40, 5 } },
    { "lfu, a shared pool, skew 6", { slots = 160, shared = true, policy = "lfu", decay_batches = 0 }, nil, 6 },
    -- other tables' values among the cached ones' (the GPU gathers the cached values first)
    { "lru, t1 on the device, variable batch per feature", { load_factor = 0.1, policy = "lru", min_slots = 0 },
      { 17, 40, 5 }, nil, nil, { "cached", "device", "cached" } },
    { "lfu, t0 and t2 on the device, a shared pool", { slots = 48, shared = true, policy = "lfu", staging_rows = 4 },
      nil, nil, nil, { "device", "cached", "device" } },
  }) do
    local name, cache, strides, hot, conflicts = case[1], case[2], case[3], case[4] or 3, case[5]
    local placement = case[6] or "cached"
    local tables = cached(placement)
    for _, pipelined in ipairs({ false, true }) do
      cuda_it(("gives the CPU's slot ids and counts batch by batch (%s%s)"):format(name,
              pipelined and ", pipelined" or ""), function()
        math.randomseed(33)
        local g = make(0, placement, { "sgd", lr = 0.2 }, cache).tbe
        local c = make("cpu", placement, { "sgd", lr = 0.2 }, cache).tbe
        local sg = { assert(streams.stream {}), assert(streams.stream {}) }
        local sc = { assert(streams.stream {}), assert(streams.stream {}) }
        local pending = {}
        local staged = 0
        for step = 1, 30 do
          local b = ids_batch(step, strides, hot)
          local xg, xc = R.input(b, "device"), R.input(b, "host")
          -- pipelined: the batch before retires (trained) on its stream, then this one is
          -- prepared on the other while that one may still run
          local k = pipelined and step % 2 + 1 or 1
          while #pending > 0 do
            local p = table.remove(pending, 1)
            assert(g:retire(p.tg, true, sg[p.k]))
            assert(c:retire(p.tc, true, sc[p.k]))
          end
          local rg = assert(g:prepare(xg, sg[k]))
          local rc = assert(c:prepare(xc, sc[k]))
          assert(sg[k]:sync())
          local want, got = rc.ids:totable(), assert(rg.ids:to("host")):totable()
          assert.equal(#want, #got)
          for i = 1, #want do
            if want[i] ~= got[i] then
              error(("step %d value %d (id %d): GPU slot %d, CPU slot %d"):format(step, i,
                    b.values[i], got[i], want[i]))
            end
          end
          same_stats(c.cache, g.cache, "step " .. step, tables)
          staged = staged + c.cache:stats().conflicts
          pending[#pending + 1] = { tg = rg, tc = rc, k = k }
          if not pipelined then
            local p = table.remove(pending, 1)
            assert(g:retire(p.tg, true, sg[p.k]))
            assert(c:retire(p.tc, true, sc[p.k]))
          end
        end
        for _, p in ipairs(pending) do
          assert(g:retire(p.tg, true, sg[p.k]))
          assert(c:retire(p.tc, true, sc[p.k]))
        end
        if conflicts then assert.is_true(staged > 0, "the case makes conflict misses") end
        assert.is_true(g.cache:stats().evictions > 0, "the case evicts")
        -- the GPU's kernel time is counted there, and nowhere else
        local gs = g.cache:stats()
        assert.is_true(gs.gpu_seconds > 0)
        assert.equal(0, c.cache:stats().gpu_seconds)
        -- split by phase, each timed, adding up to the whole
        local ph = gs.gpu_phases
        assert.is_true(ph.lookup > 0 and ph.decide > 0 and ph.place > 0 and ph.retire > 0)
        assert.near(gs.gpu_seconds, ph.lookup + ph.decide + ph.place + ph.retire, 1e-9 * gs.gpu_seconds + 1e-12)
        assert.same({ lookup = 0, decide = 0, place = 0, retire = 0 }, c.cache:stats().gpu_phases)
        for _, t in ipairs(tables) do
          local probe = {}
          for r = 0, t.rows - 1 do probe[#probe + 1] = r end
          assert.same(c.cache:contains(t.name, probe), g.cache:contains(t.name, probe), t.name)
        end
        -- both flush the same rows (the writebacks count them)
        assert(g.cache:flush())
        assert(c.cache:flush())
        same_stats(c.cache, g.cache, "after flush", tables)
        g:free()
        c:free()
      end)
    end
  end

  -- t1's id 300 is out of range, whether t1 is cached or on the device (the prepare checks every
  -- feature's ids, so that the forward need not read its bad-id flag back)
  for _, placement in ipairs({ "cached", { "cached", "device", "cached" } }) do
    local what = type(placement) == "table" and "t1 on the device" or "all cached"
    cuda_it("reports a bad id as the CPU does and decides nothing (" .. what .. ")", function()
      local cache = { slots = 64, shared = true }
      local g = make(0, placement, { "sgd", lr = 0.2 }, cache).tbe
      local c = make("cpu", placement, { "sgd", lr = 0.2 }, cache).tbe
      local b = { values = { 1, 2, 300, 3, 4 }, offsets = { 0, 2, 3, 5 } }
      local xg, xc = R.input(b, "device"), R.input(b, "host")
      local okg, eg = pcall(g.prepare, g, xg)
      local okc, ec = pcall(c.prepare, c, xc)
      assert.is_false(okg)
      assert.is_false(okc)
      assert.equal(ec:match("cache: .*"), eg:match("cache: .*"))
      assert.matches("table 't1' %(feature 't1', sample 0, value 2%) has no row 300", eg)
      same_stats(c.cache, g.cache, "after the error", cached(placement))
      assert.equal(0, g.cache:stats().unique)
      assert.same({ false, false, false }, g.cache:contains("t0", { 1, 2, 3 }))
      g:free()
      c:free()
    end)
  end

  -- bounds "warn" skips ids out of range: a batch whose every id is out of range has values
  -- to sort but no distinct key (the GPU's lookup then leaves out its sort by set), and the
  -- next batch is decided as before
  for _, placement in ipairs({ "cached", { "cached", "device", "cached" } }) do
    local what = type(placement) == "table" and "t1 on the device" or "all cached"
    cuda_it("skips a batch of ids all out of range as the CPU does, then decides the next (" .. what .. ")", function()
      local cache = { slots = 64, shared = true }
      local g = make(0, placement, { "sgd", lr = 0.2 }, cache, nil, nil, "warn").tbe
      local c = make("cpu", placement, { "sgd", lr = 0.2 }, cache, nil, nil, "warn").tbe
      for k, b in ipairs({ { values = { 700, 701, 300, 2000, 2999 }, offsets = { 0, 2, 3, 5 } },
                           { values = { 1, 2, 7, 3, 4 }, offsets = { 0, 2, 3, 5 } } }) do
        local rg = assert(g:prepare(R.input(b, "device")))
        local rc = assert(c:prepare(R.input(b, "host")))
        assert.same(rc.ids:totable(), assert(rg.ids:to("host")):totable(), "batch " .. k)
        same_stats(c.cache, g.cache, "batch " .. k, cached(placement))
        assert.equal(k == 1 and 0 or #cached(placement) == 3 and 5 or 4, g.cache:stats().unique, "batch " .. k)
        assert(g:retire(rg, false))
        assert(c:retire(rc, false))
      end
      g:free()
      c:free()
    end)
  end

  -- every feature's offsets are checked, a table's not cached too: t0's run past the values
  cuda_it("reports bad offsets of a feature not cached as the CPU does", function()
    local placement = { "device", "cached", "cached" }
    local g = make(0, placement, { "sgd", lr = 0.2 }, { slots = 64, shared = true }).tbe
    local c = make("cpu", placement, { "sgd", lr = 0.2 }, { slots = 64, shared = true }).tbe
    local b = { values = { 1, 2, 3, 4, 5 }, offsets = { 0, 9, 3, 5 } }
    local okg, eg = pcall(g.prepare, g, R.input(b, "device"))
    local okc, ec = pcall(c.prepare, c, R.input(b, "host"))
    assert.is_false(okg)
    assert.is_false(okc)
    assert.equal(ec:match("cache: .*"), eg:match("cache: .*"))
    assert.matches("cache: feature 't0' spans values 0..9 of 5; offsets must not decrease", eg, 1, true)
    g:free()
    c:free()
  end)
end)

-- Growing staging when the new slot storage does not fit beside the old under the HBM budget
-- (cache.c, regrow_via_host): the kept slots wait in host memory while the old storage is
-- freed, and the rows, the optimizer state and the outputs are those of a cache that grew
-- beside; when not even that fits, the error names the cache, the rows and the bytes, and the
-- slot storage is as it was.
describe("uvmrec.cache staging growth under the HBM budget", function()
  local ROWS, DIM = 20000, 128
  local CACHE = { slots = 2048, shared = true, staging_rows = 4, min_slots = 0, policy = "lru" }

  local function model()
    return EBC({ device = 0, seed = 4, optimizer = { "adam", lr = 0.01 }, cache = CACHE,
                 tables = { { name = "a", rows = ROWS, dim = DIM, placement = "cached" } } })
  end

  -- 1: 100 rows (no set overflows: no growth); 2: 2600 distinct rows over 2048 slots, so
  -- hundreds of conflict misses and staging grows; 3: more of both.
  local function batches()
    math.randomseed(17)
    local list = {}
    for step, n in ipairs({ 100, 2600, 2600 }) do
      local values, offsets, seen = {}, { 0 }, {}
      while #values < n do
        local r = step == 1 and #values or math.random(0, ROWS - 1)
        if not seen[r] then
          seen[r] = true
          values[#values + 1] = r
          if #values % 50 == 0 then offsets[#offsets + 1] = #values end
        end
      end
      list[step] = R.input({ values = values, offsets = offsets }, "device")
    end
    return list
  end

  local function step(m, x)
    local out = m:forward(x)
    m:backward(x, R.tensor(R.randoms(out:numel()), "f32", "device"):view_as(0, { out:size(1), out:size(2) }))
    return host_copy(out)
  end

  after_each(function()
    ur.set_hbm_budget(nil)
    collectgarbage("restart")
  end)

  -- The cache that grows beside (no budget): its outputs, and its staging rows, slots and bytes
  -- a slot row (with the row id) after the growing batch.
  local function reference(xs)
    math.randomseed(3)
    local m, outs, M = model(), {}, nil
    for i, x in ipairs(xs) do
      outs[i] = step(m, x)
      if i == 2 then M = m.tbe.cache:staging_rows() end
    end
    local c = m.tbe.cache
    assert.is_true(M > 4, "staging grew")
    return m, outs, M, c:slots(), c:bytes() / (c:slots() + 2 * c:staging_rows()) + 8
  end

  -- The batches, a fresh model and the reference's figures, with the collector stopped until
  -- the test ends (the budget is set to within bytes of what is in use).
  local function fresh()
    local xs = batches()
    local beside, outs, M, S, per = reference(xs)
    collectgarbage()
    collectgarbage()
    collectgarbage("stop")
    finally(function() collectgarbage("restart") end)
    math.randomseed(3)
    return xs, model(), beside, outs, M, S, per
  end

  cuda_it("grows through host memory, to the rows and outputs of a cache that grew beside", function()
    local xs, m, beside, outs, M, S, per = fresh()
    R.bits_equal(step(m, xs[1]), outs[1], "step 1")
    -- room for the new storage in place of the old, not beside it
    ur.set_hbm_budget(ur.memory().hbm_used + (S + 2 * M) * per - 1)
    R.bits_equal(step(m, xs[2]), outs[2], "step 2")
    ur.set_hbm_budget(nil)
    assert.same({ 1, 1, M }, { m.tbe.cache:stats().staging_grows, m.tbe.cache:stats().staging_grows_via_host,
                               m.tbe.cache:staging_rows() })
    R.bits_equal(step(m, xs[3]), outs[3], "step 3")
    local s, sb = m.tbe.cache:stats(), beside.tbe.cache:stats()
    assert.same({ sb.staging_grows, 0 }, { s.staging_grows, sb.staging_grows_via_host })
    R.bits_equal(m:table("a"), beside:table("a"), "rows after flush")
    R.bits_equal(m:state("a").exp_avg, beside:state("a").exp_avg, "exp_avg")
    R.bits_equal(m:state("a").exp_avg_sq, beside:state("a").exp_avg_sq, "exp_avg_sq")
  end)

  cuda_it("names the cache, the rows and the bytes when not even that fits, keeps the slots, refuses to go on",
          function()
    local xs, m, _, _, M, S, per = fresh()
    local c = m.tbe.cache
    step(m, xs[1])
    local bytes = c:bytes()
    ur.set_hbm_budget(ur.memory().hbm_used + 2 * (M - 4) * per - 1)
    local ok, err = pcall(step, m, xs[2])
    ur.set_hbm_budget(nil)
    assert.is_false(ok)
    err = tostring(err)
    for _, want in ipairs({
      ("cache of table 'a': growing staging from 4 to %d rows a half asks for slot storage of %d rows ("):format(
        M, S + 2 * M),
      (", %d bytes), which fits neither beside the slots"):format((S + 2 * M) * per),
      "the slot storage is as it was, with 4 staging rows a half, but this batch's placement was decided" }) do
      assert.is_truthy(err:find(want, 1, true), err)
    end
    assert.same({ 4, bytes }, { c:staging_rows(), c:bytes() })
    assert.same({ 0, 0 }, { c:stats().staging_grows, c:stats().staging_grows_via_host })
    -- its tags moved with the batch's decisions: the cache serves nothing more
    local ok2, err2 = pcall(step, m, xs[1])
    assert.is_false(ok2)
    assert.is_truthy(tostring(err2):find("a growth of its staging failed", 1, true), tostring(err2))
  end)

  cuda_it("resets the LFU counts of the rows it drops as the CPU does (one zero_rows on the GPU)", function()
    local g, dropped = h.lfu_after_drop(0)
    local c = h.lfu_after_drop("cpu")
    assert.equal(4, dropped)
    local probe = {}
    for r = 0, 199 do probe[#probe + 1] = r end
    assert.same(c:contains("a", probe), g:contains("a", probe))
    for k = 0, 3 do assert.is_false(g:contains("a", { k })[1], "row " .. k) end
  end)

  cuda_it("leaves its rows where they were when the LFU reset's keys find no HBM (drop fails whole)", function()
    local g = h.lfu_after_drop(0) -- rows 1..31 and 100..103 cached
    local before = g:contains("a", { 4, 5, 6, 7 })
    -- no room for the 4 keys' copy: a budget of one byte (one at the HBM in use passed the drop under
    -- compute-sanitizer, with the JIT off: tensors the collector freed in between made room)
    ur.set_hbm_budget(1)
    local ok, err = pcall(function() return assert(g:drop("a", { 4, 5, 6, 7 })) end)
    ur.set_hbm_budget(nil)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("hbm budget", 1, true), tostring(err))
    -- a drop that fails changes nothing (it cleared the host's tags before the keys' allocation)
    assert.same(before, g:contains("a", { 4, 5, 6, 7 }))
    assert.equal(0, assert(g:drop("a", { 999 }))) -- and the cache still takes a drop
  end)

  cuda_it("ages LFU counts past the 16-bit wrap of their epochs as the CPU does (re-based, not wrapped)", function()
    local g, c = h.lfu_past_wrap(0), h.lfu_past_wrap("cpu")
    local probe = {}
    for r = 0, 999 do probe[#probe + 1] = r end
    for _, t in ipairs({ "a", "b" }) do assert.same(c:contains(t, probe), g:contains(t, probe), t) end
    assert.is_false(g:contains("a", { 0 })[1]) -- the oldest way, not a row of the batch before
    local sg, sc = g:stats(), c:stats()
    for _, f in ipairs({ "lookups", "unique", "hits", "misses", "evictions" }) do assert.equal(sc[f], sg[f], f) end
  end)
end)
