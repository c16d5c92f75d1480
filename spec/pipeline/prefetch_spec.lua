-- uvmrec.pipeline.Prefetch: trains the same as the plain loop, bit for bit, with tiny caches
-- whose rows are missed, staged, inserted and evicted across the batches in flight (the hard
-- case: a row staged in batch i, needed by batch i+1's prefetch, then written by i's backward);
-- drains or stops at the end; on the GPU (#cuda) the same against device tables.  The #cuda
-- test is the one compute-sanitizer's memcheck and racecheck run.
local ur = require "uvmrec"
local h = require "helpers"
local R = require "tbe_ref"
local Prefetch = require "uvmrec.pipeline.Prefetch"

local cuda_it = h.cuda_it
local EBC = ur.nn.EmbeddingBagCollection

local TABLES = { { name = "a", rows = 120, dim = 8 }, { name = "b", rows = 60, dim = 8 } }

local function make(device, placement, cache, optimizer)
  local o = { tables = {}, device = device, seed = 4, optimizer = optimizer or { "sgd", lr = 0.5 },
              cache = cache }
  for i, t in ipairs(TABLES) do o.tables[i] = { name = t.name, rows = t.rows, dim = t.dim, placement = placement } end
  return EBC(o)
end

-- Batches in host memory: sparse = a KJT, grad = the output's gradient.  Ids are
-- drawn from a small hot range that moves, so consecutive batches share rows.
-- Ids near a hot spot that moves every 4 batches: rows leave and come back.
local function batches(n, placement)
  return R.train_batches(n, TABLES, placement, function(k, t)
    return (math.floor(k / 4) * 7 + math.floor(40 * math.random() ^ 2)) % t.rows
  end)
end

describe("uvmrec.pipeline.Prefetch", function()
  for _, cache in ipairs({ { slots = 32, shared = true, staging_rows = 4 },
                           { load_factor = 0.3, policy = "lfu", decay_batches = 2, min_slots = 0 } }) do
    it(("trains as the plain loop does, bit for bit (%s)"):format(cache.slots and "one set" or "lfu"), function()
      local list = batches(14, "host")
      local m = make("cpu", "cached", cache, { "adam", lr = 0.02 })
      local ref = make("cpu", "host", nil, { "adam", lr = 0.02 })
      local want = R.train_plain(ref, list)
      local outs, n = R.train_piped(m, list)
      assert.equal(14, n)
      for i = 1, 14 do R.bits_equal(outs[i], want[i], "batch " .. i .. " output") end
      for _, t in ipairs(TABLES) do
        R.bits_equal(m:table(t.name), ref:table(t.name), "table " .. t.name)
        R.bits_equal(m:state(t.name).exp_avg_sq, ref:state(t.name).exp_avg_sq, "state " .. t.name)
      end
      local s = m.tbe.cache:stats()
      assert.is_true(s.hits > 0 and s.misses > 0 and s.evictions > 0)
      if cache.slots then
        -- the hard case happened: rows staged in batch i were needed by i+1's prefetch
        assert.is_true(s.conflicts > 0 and s.waits > 0)
      end
      assert.equal(0, m.tbe.cache:in_flight())
    end)
  end

  it("drains the batches in flight at the end, or stops at once with drain = false", function()
    local list = batches(6, "host")
    local _, n = R.train_piped(make("cpu", "cached", { slots = 64 }), list)
    assert.equal(6, n)
    local m = make("cpu", "cached", { slots = 64 })
    local _, n2, stats = R.train_piped(m, list, { drain = false })
    assert.equal(5, n2)      -- the last batch was prefetched, never trained
    assert.equal(6, stats.prefetched)
    assert.equal(0, m.tbe.cache:in_flight())
    local _, n3 = R.train_piped(make("cpu", "cached", { slots = 64 }), list, { steps = 4 })
    assert.equal(4, n3)
  end)

  it("runs without a cache (plain tables), and checks its options", function()
    local list = batches(5, "host")
    local ref = make("cpu", "host")
    local want = R.train_plain(ref, list)
    local m = make("cpu", "host")
    local outs = R.train_piped(m, list)
    for i = 1, 5 do R.bits_equal(outs[i], want[i], "batch " .. i) end
    assert.has_error(function() Prefetch.new { steps = 3 } end,
                     "Prefetch: source must give host batches through next() (a loader)")
    assert.has_error(function() Prefetch.new { source = { next = function() end }, depth = 3 } end,
                     "Prefetch: unknown option 'depth'; expected collection, drain, pages, source, steps, stream")
    -- 1.5 steps ran 2 batches; "10" failed comparing a string in the first take; "no" drained; inf
    -- passed (nil is "until the data ends")
    for _, v in ipairs { 1.5, -1, "10", math.huge } do
      assert.has_error(function() Prefetch.new { source = { next = function() end }, steps = v } end,
                       ("Prefetch: steps is %s; expected a whole number >= 0"):format(v))
    end
    assert.has_error(function() Prefetch.new { source = { next = function() end }, drain = "no" } end,
                     "Prefetch: drain is no; expected true or false")
  end)

  cuda_it("trains on the GPU as device tables do, bit for bit, with a tiny cache", function()
    local list = batches(40, "pinned")
    local ref = make(0, "device")
    local want = R.train_plain(ref, list)
    local m = make(0, "cached", { slots = 32, shared = true, staging_rows = 4 })
    local outs, n = R.train_piped(m, list)
    assert.equal(40, n)
    for i = 1, 40 do R.bits_equal(outs[i], want[i], "batch " .. i .. " output") end
    for _, t in ipairs(TABLES) do R.bits_equal(m:table(t.name), ref:table(t.name), "table " .. t.name) end
    local s = m.tbe.cache:stats()
    assert.is_true(s.conflicts > 0 and s.evictions > 0 and s.writebacks > 0)
  end)

  cuda_it("trains on the GPU with rowwise Adagrad and LRU per-table caches as the CPU cache does", function()
    local list = batches(24, "pinned")
    local cpu_list = batches(24, "host")
    local opt = { "rowwise_adagrad", lr = 0.1 }
    local cache = { load_factor = 0.3 }
    local g = make(0, "cached", cache, opt)
    local c = make("cpu", "cached", cache, opt)
    local outs = R.train_piped(g, list)
    local want = R.train_piped(c, cpu_list)
    for i = 1, 24 do
      R.close(outs[i]:totable(), want[i]:totable(), 1e-5, 1e-7, "batch " .. i)
    end
    local sg, sc = g.tbe.cache:stats(), c.tbe.cache:stats()
    assert.same({ sc.hits, sc.misses, sc.conflicts, sc.evictions }, { sg.hits, sg.misses, sg.conflicts, sg.evictions })
  end)
end)
