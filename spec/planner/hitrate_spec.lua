local ffi = require "ffi"
local ur = require "uvmrec"
local profile = require "uvmrec.planner.profile"
local hitrate = require "uvmrec.planner.hitrate"
local synthetic = require "uvmrec.data.synthetic"
local tbe = require "uvmrec.tbe"

-- The real cache (CPU backend) on one table of the synthetic generator's Zipf ids: batches of
-- B samples with one id each, the first `warm` batches warm it, the rest are measured.  Returns
-- hits / distinct rows, first touches / distinct rows, hits / rows read before.
local function measure(rows, s, B, K, warm, load_factor, policy)
  local spec = synthetic.spec { num_dense = 1, seed = 77, tables = { { name = "t", rows = rows, zipf = s } } }
  local g = assert(synthetic.generate(spec, 0, B * K))
  local ids = ffi.cast("int64_t *", ur.C.ur_tensor_data(g.ids.p))
  local c = assert(tbe.new { tables = { { name = "t", rows = rows, dim = 4, placement = "cached" } },
    device = "cpu", optimizer = "sgd", cache = { load_factor = load_factor, policy = policy } })
  local cache = c.cache
  local seen = ffi.new("uint8_t[?]", rows)
  local first = 0
  local batches = {}
  for k = 1, K do
    local v = assert(ur.tensor({ B }, { dtype = "i64" }))
    local o = assert(ur.tensor({ B + 1 }, { dtype = "i64" }))
    local pv = ffi.cast("int64_t *", ur.C.ur_tensor_data(v.p))
    local po = ffi.cast("int64_t *", ur.C.ur_tensor_data(o.p))
    local mark = {}
    for i = 0, B - 1 do
      local id = ids[(k - 1) * B + i]
      pv[i], po[i] = id, i
      local n = tonumber(id)
      if seen[n] == 0 and not mark[n] then
        mark[n] = true
        if k > warm then first = first + 1 end
      end
    end
    for n in pairs(mark) do seen[n] = 1 end
    po[B] = B
    batches[k] = { values = v, offsets = o }
  end
  for k = 1, K do
    local x = batches[k]
    if k == warm + 1 then cache:reset_stats() end
    assert(c:retire(assert(c:prepare(x)), true))
  end
  local st = cache:stats()
  local slots = cache:slots()
  for _, x in ipairs(batches) do x.values:free(); x.offsets:free() end
  c:free()
  assert.equal(st.unique, st.hits + st.misses + st.conflicts)
  return { hit_rate = st.hits / st.unique, first_touch = first / st.unique,
           warm_hit_rate = st.hits / (st.unique - first), slots = slots }
end

describe("planner.hitrate", function()
  it("gives the load factor as the hit rate of uniform ids (LRU exactly, LFU within its churn)", function()
    local P = profile.zipf { rows = 100000, s = 0 }
    for _, c in ipairs({ 0.05, 0.3, 0.8 }) do
      assert.near(hitrate.lru(P, 4096, c * 100000).hit_rate, c, 1e-6)
      assert.near(hitrate.lfu(P, 4096, c * 100000, { full = true }).hit_rate, c, 0.005)
      -- 32-way sets overflow when nearly full: only the smaller caches are c
      if c <= 0.3 then assert.near(hitrate.lfu(P, 4096, c * 100000).hit_rate, c, 0.005) end
    end
  end)

  it("takes LFU of one fully associative set as the top rows' share of distinct rows when misses are few", function()
    local P = profile.zipf { rows = 50000, s = 1.1 }
    local L, C = 256, 10000
    local v = profile.batch(P, L)
    -- by hand: the top C rows resident, each class weighed by its chance of being read
    local hit, all, rows = 0, 0, 0
    for i = 1, #P.n do
      local n = P.n[i]
      local inside = math.max(0, math.min(n, C - rows))
      hit = hit + inside * v.q[i]
      all = all + n * v.q[i]
      rows = rows + n
    end
    local r = hitrate.lfu(P, L, C, { full = true })
    -- the batch's few misses take ways from the stable top and add back their repeats
    assert.is_true(math.abs(r.hit_rate - hit / all) < 0.005, ("%.5f vs %.5f"):format(r.hit_rate, hit / all))
    assert.is_true(r.cap < C and r.cap >= C - r.misses - 1)
  end)

  it("matches the real cache's steady-state hit rates on Zipf ids (LRU and LFU, warm and first-touch)", function()
    local rows, s, B, K, W = 200000, 1.05, 2048, 60, 30
    local P = profile.zipf { rows = rows, s = s }
    print()
    for _, policy in ipairs({ "lru", "lfu" }) do
      for _, c in ipairs({ 0.02, 0.1, 0.3 }) do
        local m = measure(rows, s, B, K, W, c, policy)
        local w = hitrate.window(policy, P, B, m.slots, W + 1, K)
        print(("    %s %3.0f%%: hit %.4f (model %.4f), first touch %.4f (%.4f), warm %.4f (%.4f), steady %.4f")
          :format(policy, 100 * c, m.hit_rate, w.hit_rate, m.first_touch, w.first_touch, m.warm_hit_rate,
                  w.warm_hit_rate, w.steady))
        assert.is_true(math.abs(m.hit_rate - w.hit_rate) < 0.02, policy .. " hit rate")
        assert.is_true(math.abs(m.warm_hit_rate - w.warm_hit_rate) < 0.02, policy .. " warm hit rate")
        assert.is_true(math.abs(m.first_touch - w.first_touch) < 0.01, policy .. " first touch")
      end
    end
  end)

  it("solves several LRU sizes at once as one at a time", function()
    local P = profile.zipf { rows = 300000, s = 0.9 }
    local sizes = { 1000, 30000, 150000, 299000 }
    local many = hitrate.lru_many(P, 8192, sizes)
    for j, sz in ipairs(sizes) do
      local one = hitrate.lru(P, 8192, sz)
      assert.near(many[j].hit_rate, one.hit_rate, 1e-9)
      -- Che's fixed point: the expected distinct rows of T batches fill the slots
      local v = profile.batch(P, 8192)
      local occ = 0
      for i = 1, #P.n do occ = occ + P.n[i] * (1 - (1 - v.q[i]) ^ one.T) end
      assert.near(occ / sz, 1, 1e-6)
    end
    assert.equal(1, hitrate.lru(P, 8192, 300000).hit_rate)
    assert.has_error(function() hitrate.rate("fifo", P, 1, 1) end, "hitrate: policy must be lru or lfu, not fifo")
  end)
end)
