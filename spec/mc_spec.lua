-- uvmrec.mc, managed collisions, on the CPU: the engine's map against the plain reference
-- (spec/support/mc_ref.lua) on random streams, batch by batch, for every policy; the
-- properties the design promises (one id a row, a frequent id keeps its row, empty and full
-- maps, batches of only new ids, VBE counted as its full batch, the candidates' map growing
-- without counting a batch half); the state round trip; every documented error.
local ur = require "uvmrec"
local mc = require "uvmrec.mc"
local h = require "helpers"
local cmd = require "command"
local R = require "mc_ref"

local same_list = h.same_list

local function totable_n(t) return t:numel() > 0 and t:totable() or {} end

local function i64(list)
  local t = ur.tensor({ #list }, { dtype = "i64" })
  for i, v in ipairs(list) do t:set(i - 1, v) end
  return t
end

local function ones(n)
  local l = {}
  for i = 1, n do l[i] = 1 end
  return l
end

-- A random configuration: 1 to 3 tables, their features (one may pass through), settings.
local function random_config(r, policy)
  local cfg = { tables = {}, seed = r(1000), device = "cpu", features = {} }
  local nt = r(3)
  for i = 1, nt do
    local rows = 2 + r(40)
    local t = { name = "t" .. i, rows = rows, features = {},
                policy = policy, evict_every = r(6), fallback_rows = r(math.min(4, rows - 1)),
                max_candidates = r(3) == 1 and r(12) or 1000, decay = ({ 0.5, 0.75, 1 })[r(3)],
                distance_power = ({ 1, 1.5, 2 })[r(3)], fill = r(4) ~= 1 }
    for j = 1, r(2) do
      local f = ("f%d_%d"):format(i, j)
      t.features[j] = f
      cfg.features[#cfg.features + 1] = f
    end
    cfg.tables[i] = t
  end
  if r(2) == 1 then table.insert(cfg.features, r(#cfg.features + 1), "plain") end
  return cfg
end

-- A batch of B samples: Zipf-like ids over a space a few times the table, multi-hot bags,
-- now and then an id of -1, a negative id or one past 2^40.
local function random_batch(r, ref, B, shift)
  local batch = {}
  for f = 1, #ref.features do
    local tb = ref.table_of[f]
    local space = tb and 4 * tb.rows or 50
    batch[f] = {}
    for b = 1, B do
      local bag = {}
      for _ = 1, r(4) - 1 do
        local u = r(1000000) / 1000000
        local id = (math.floor(space * u ^ 3) + shift) % space
        local odd = r(40)
        if odd == 1 then id = -1 elseif odd == 2 then id = -7 - r(5) elseif odd == 3 then id = 2 ^ 40 + r(9) end
        bag[#bag + 1] = id
      end
      batch[f][b] = bag
    end
  end
  return batch
end

-- A map of a random configuration after `steps` random batches; its configuration, the
-- generator and the reference that saw the same batches, to go on with.
local function streamed(seed, policy, steps)
  local r = h.rng(seed)
  local cfg = random_config(r, policy)
  local m, ref = assert(mc.new(cfg)), R.new(cfg)
  for step = 1, steps do
    local batch = random_batch(r, ref, 8, step)
    ref:remap(batch, true)
    m:remap(ur.KJT(R.kjt_fields(cfg.features, batch)))
  end
  return m, cfg, r, ref
end

local function compare_state(m, ref, name, what)
  local st = assert(m:state(name))
  local want = ref:state(name)
  for _, k in ipairs(mc.STATE_TENSORS) do same_list(totable_n(st[k]), want[k], what .. " " .. name .. "." .. k) end
  local s, ws = assert(m:stats()).tables[name], ref:stats(name)
  for k, v in pairs(ws) do assert.equal(v, s[k], what .. " " .. name .. " stats." .. k) end
end

describe("uvmrec.mc", function()
  for _, policy in ipairs { "lfu", "lru", "distance_lfu" } do
    it("makes the reference's decisions batch by batch on random streams (" .. policy .. ")", function()
      local evicted = 0
      for seed = 1, 6 do
        local r = h.rng(seed * 7919 + #policy)
        local cfg = random_config(r, policy)
        local m = assert(mc.new(cfg))
        local ref = R.new(cfg)
        for step = 1, 40 do
          local batch = random_batch(r, ref, 1 + r(12), math.floor(step / 10) * 17)
          local want = ref:remap(batch, true)
          local got = assert(m:remap(ur.KJT(R.kjt_fields(cfg.features, batch))))
          local what = ("seed %d step %d"):format(seed, step)
          same_list(got:values():totable(), want, what .. " rows")
          for _, tb in ipairs(ref.tables) do
            same_list(m:reassigned(tb.name), tb.reassigned, what .. " reassigned " .. tb.name)
            evicted = evicted + #tb.reassigned
          end
          if step % 7 == 0 then
            for _, tb in ipairs(ref.tables) do compare_state(m, ref, tb.name, what) end
          end
          -- a read-only pass changes nothing
          if step % 5 == 0 then
            local ro = assert(m:remap(ur.KJT(R.kjt_fields(cfg.features, batch)), { update = false }))
            same_list(ro:values():totable(), ref:remap(batch, false), what .. " read-only rows")
          end
        end
        for _, tb in ipairs(ref.tables) do compare_state(m, ref, tb.name, "seed " .. seed .. " end") end
        assert.equal(40, m:step())
        m:free()
      end
      assert.is_true(evicted > 20, "rounds evicted ids (" .. evicted .. ")")
    end)
  end

  it("never gives two resident ids one row, and sends the others to the fallback rows", function()
    local r = h.rng(42)
    local m = assert(mc.new{ tables = { { name = "t", rows = 30, fallback_rows = 3 } }, evict_every = 2,
                             device = "cpu" })
    for step = 1, 30 do
      local ids = {}
      for i = 1, 50 do ids[i] = math.floor(200 * (r(1000) / 1000) ^ 2) + step end
      local k = ur.KJT{ keys = { "t" }, values = ids, lengths = ones(50) }
      local rows = assert(m:remap(k)):values():totable()
      local st = assert(m:state("t"))
      local held, seen = {}, {}
      for row, id in ipairs(st.ids:totable()) do
        if id ~= -1 then
          assert.is_nil(held[id], ("step %d: id %d holds rows %s and %d"):format(step, id, tostring(held[id]), row - 1))
          held[id] = row - 1
        end
      end
      for i, id in ipairs(ids) do
        if held[id] then
          assert.equal(held[id], rows[i], ("step %d: resident id %d reads its row"):format(step, id))
        else
          assert.is_true(rows[i] >= 27 and rows[i] < 30, ("step %d: id %d reads a fallback row"):format(step, id))
        end
        if seen[rows[i]] and rows[i] < 27 then
          assert.equal(seen[rows[i]], id, ("step %d: row %d read by two ids"):format(step, rows[i]))
        end
        seen[rows[i]] = id
      end
    end
  end)

  it("keeps the row of an id that stays frequent across rounds", function()
    for _, policy in ipairs { "lfu", "lru", "distance_lfu" } do
      local m = assert(mc.new{ tables = { { name = "t", rows = 8, fallback_rows = 1 } }, policy = policy,
                               evict_every = 1, device = "cpu" })
      local first
      for step = 1, 40 do
        -- id 5 in every batch, many times; the rest churn through a space far larger than the map
        local ids = { 5, 5, 5, 5 }
        for i = 1, 12 do ids[#ids + 1] = 100 + step * 12 + i end
        local rows = assert(m:remap(ur.KJT{ keys = { "t" }, values = ids, lengths = ones(#ids) })):values():totable()
        if step >= 2 then
          first = first or rows[1]
          assert.equal(first, rows[1], policy .. ": step " .. step .. ": id 5 keeps its row")
          assert.is_true(first < 7, policy .. ": id 5 is resident")
        end
      end
      local s = assert(m:stats())
      assert.is_true(s.evictions > 50, policy .. ": the others were evicted round after round")
    end
  end)

  it("sends everything to the fallback rows while the map is empty, and fills it before the next batch", function()
    local m = assert(mc.new{ tables = { { name = "t", rows = 10, fallback_rows = 2 } }, device = "cpu" })
    local k = ur.KJT{ keys = { "t" }, values = { 3, 4, 4, 9 }, lengths = { 1, 2, 1 } }
    local rows = assert(m:remap(k)):values():totable()
    for i, row in ipairs(rows) do assert.is_true(row >= 8, "id " .. i .. " on a fallback row") end
    local s = assert(m:stats())
    assert.are.same({ 0, 3, 4, 0, 4 }, { s.resident, s.candidates, s.lookups, s.resident_lookups, s.fallback_lookups })
    rows = assert(m:remap(k)):values():totable()
    assert.are.same({ 1, 0, 0, 2 }, rows) -- 4 (twice) first, then 3 and 9 by id
    s = assert(m:stats())
    assert.are.same({ 3, 0, 1, 3, 0 }, { s.resident, s.candidates, s.fills, s.admissions, s.evictions })
    -- fill off: nothing is admitted before the first eviction round
    local m2 = assert(mc.new{ tables = { { name = "t", rows = 10, fallback_rows = 2 } }, fill = false,
                              evict_every = 3, device = "cpu" })
    for _ = 1, 3 do rows = assert(m2:remap(k)):values():totable() end
    assert.is_true(rows[1] >= 8, "still on a fallback row before the round")
    rows = assert(m2:remap(k)):values():totable()
    assert.are.same({ 1, 0, 0, 2 }, rows)
  end)

  it("evicts from a full map only ids that rank below a candidate", function()
    local m = assert(mc.new{ tables = { { name = "t", rows = 4, fallback_rows = 1 } }, evict_every = 2,
                             decay = 1, device = "cpu" })
    local function run(ids)
      return assert(m:remap(ur.KJT{ keys = { "t" }, values = ids, lengths = ones(#ids) })):values():totable()
    end
    run { 1, 1, 1, 2, 2, 3 }           -- step 1: candidates
    run { 1, 2, 3 }                   -- step 2: filled (1, 2, 3 on rows 0, 1, 2): full
    local s = assert(m:stats())
    assert.are.same({ 3, 3 }, { s.resident, s.capacity })
    run { 7 }                          -- step 3: round before it (step 2 even): 7 is no candidate yet
    run { 8, 8, 8, 8, 8, 8, 8, 8 }     -- step 4: 7 (1 lookup) and 8 (8) wait
    local rows = run { 8, 3 }          -- round: 8 (8 lookups) beats 3 (2), 7 (1) loses to 2 (3)
    assert.equal(2, rows[1], "8 took row 2, which was 3's")
    assert.is_true(rows[2] == 3, "3 went to the fallback row")
    assert.are.same({ 2 }, m:reassigned("t"))
    s = assert(m:stats())
    assert.are.same({ 1, 1 }, { s.evictions, s.rounds - 1 })
    local _, res = m:lookup("t", { 1, 2, 3, 7, 8 })
    assert.are.same({ true, true, false, false, true }, res)
    -- an id or step that is no whole number is refused (the cast read 8.5 as 8)
    assert.has_error(function() m:lookup("t", { 8.5 }) end,
                     "mc: lookup ids[1] is 8.5; expected a whole number that fits i64")
    assert.has_error(function() m:set_step(2.5) end)
  end)

  it("breaks lru's ties by every lookup since the last eviction round, before a fill admitted the id too", function()
    -- the lookups an id had as a candidate went into its count when a fill admitted it, which
    -- lru does not read: id 10 (6 lookups) lost its row to id 30 (3) on the tie of their steps
    local m = assert(mc.new{ tables = { { name = "t", rows = 3, fallback_rows = 1 } }, policy = "lru",
                             evict_every = 3, device = "cpu" })
    local function run(ids) assert(m:remap(ur.KJT{ keys = { "t" }, values = ids, lengths = ones(#ids) })) end
    run { 10, 10, 10, 10, 10, 20 }  -- step 1: candidates
    run { 10, 20, 20, 20, 20, 30, 30, 30 } -- filled before it: 10 and 20 resident; 30 waits
    assert.same({ true, true, false }, select(2, m:lookup("t", { 10, 20, 30 })))
    run { -1 }                      -- step 3
    run { -1 }                      -- the round: 30 (step 2, 3 lookups) against 10 (step 2, 6)
    assert.same({}, m:reassigned("t"))
    assert.same({ true, true, false }, select(2, m:lookup("t", { 10, 20, 30 })))
    assert.same({ 1, 0 }, { assert(m:stats()).rounds, assert(m:stats()).evictions })
  end)

  it("takes ids past 2^53 as 64-bit integers, where no Lua number holds them", function()
    local ffi = require "ffi"
    local m = assert(mc.new{ tables = { { name = "t", rows = 4, fallback_rows = 1 } }, device = "cpu" })
    local big = ffi.new("int64_t", 2 ^ 53) + 1 -- as a Lua number it reads as 2^53
    for _ = 1, 2 do assert(m:remap(ur.KJT{ keys = { "t" }, values = { big, big, 2 ^ 53 }, lengths = ones(3) })) end
    -- both resident, each on its own row (2^53 + 1 had been refused in a list: 'is cdata')
    local rows, res = m:lookup("t", { big, 2 ^ 53, ffi.new("uint64_t", 2 ^ 53) + 1, -big })
    assert.are.same({ true, true, true, false }, res)
    assert.are_not.equal(rows[1], rows[2])
    assert.equal(rows[1], rows[3])
    assert.has_error(function() m:lookup("t", { ffi.new("uint64_t", 2 ^ 63) }) end,
                     "mc: lookup ids[1] is 9223372036854775808ULL; expected a whole number that fits i64")
    assert.has_error(function() ur.KJT{ keys = { "t" }, values = { 1 }, lengths = { ffi.new("int64_t", 2 ^ 31) } } end,
                     "kjt: lengths[1] is 2147483648LL; expected a whole number that fits i32")
  end)

  it("admits from a batch of only new ids, best first, and forgets the rest at the next round", function()
    local m = assert(mc.new{ tables = { { name = "t", rows = 6, fallback_rows = 1 } }, evict_every = 2,
                             device = "cpu" })
    local ids = { 50, 51, 51, 52, 52, 52, 53, 54, 55, 56 }
    m:remap(ur.KJT{ keys = { "t" }, values = ids, lengths = ones(#ids) })
    local rows = assert(m:remap(ur.KJT{ keys = { "t" }, values = { 52, 51, 50, 56 }, lengths = { 1, 1, 1, 1 } }))
    assert.are.same({ 0, 1, 2, 5 }, rows:values():totable())
    assert.equal(2, assert(m:stats()).candidates, "55 and 56 wait (the map took 5)")
    -- the round: 56 (2 lookups) takes the row of 54 (1); 55 (1) ties with 53 (1) and loses, the
    -- lower id winning; the candidates are forgotten, and 60 waits
    m:remap(ur.KJT{ keys = { "t" }, values = { 60 }, lengths = { 1 } })
    assert.are.same({ 4 }, m:reassigned("t"))
    local _, res = m:lookup("t", { 53, 54, 55, 56 })
    assert.are.same({ true, false, false, true }, res)
    assert.equal(1, assert(m:stats()).candidates)
  end)

  it("counts a VBE batch as its full batch", function()
    local cfg = { tables = { { name = "t", rows = 12, fallback_rows = 2, features = { "a", "b" } } },
                  evict_every = 2, device = "cpu" }
    local full, vbe = assert(mc.new(cfg)), assert(mc.new(cfg))
    local r = h.rng(5)
    for step = 1, 12 do
      local values, lengths = {}, {}
      for _ = 1, 2 do
        for _ = 1, 16 do
          local n = r(4) == 1 and 2 or 1
          lengths[#lengths + 1] = n
          for _ = 1, n do values[#values + 1] = math.floor(20 * (r(100) / 100) ^ 2) + step end
        end
      end
      local k = ur.KJT{ keys = { "a", "b" }, values = values, lengths = lengths }
      local d = k:dedup()
      assert.is_true(d:values():numel() < k:values():numel(), "the batch has repeated bags")
      local a = assert(full:remap(k))
      local b = assert(vbe:remap(d))
      -- rows of checked batches are known checked, VBE too (made unchecked, the make's pass read its inverse
      -- indices): the collection after the map checks them no more (on a GPU that check waits for the device)
      assert.is_true(a:checked())
      assert.is_true(b:checked())
      same_list(b:expand():values():totable(), a:values():totable(), "step " .. step .. " rows")
      same_list(vbe:reassigned("t"), full:reassigned("t"), "step " .. step .. " reassigned")
    end
    local sa, sb = assert(full:state("t")), assert(vbe:state("t"))
    for _, key in ipairs(mc.STATE_TENSORS) do
      same_list(totable_n(sb[key]), totable_n(sa[key]), "state " .. key)
    end
    assert.equal(assert(full:stats()).lookups, assert(vbe:stats()).lookups)
  end)

  it("grows the candidates' map, and counts a batch too big for it not at all rather than in part", function()
    local m = assert(mc.new{ tables = { { name = "t", rows = 8, fallback_rows = 1 } }, fill = false,
                             evict_every = 100, device = "cpu" })
    local function run(first, n)
      local ids = {}
      for i = 1, n do ids[i] = first + i end
      assert(m:remap(ur.KJT{ keys = { "t" }, values = ids, lengths = ones(n) }))
    end
    run(0, 10)
    assert.equal(10, assert(m:stats()).candidates)
    run(1000, 5000) -- 5000 new ids: more than the map sized for 10-id batches holds at half load
    assert.equal(10, assert(m:stats()).candidates, "the big batch's candidates were not counted")
    assert.equal(1, assert(m:stats()).skipped)
    run(10000, 5000) -- the map grew for batches of 5000
    assert.equal(5010, assert(m:stats()).candidates)
    assert.equal(10010, assert(m:stats()).lookups, "every lookup was counted")
  end)

  it("restores a table's map exactly from its state", function()
    local a, cfg, r, ref = streamed(77, "distance_lfu", 15)
    local b = assert(mc.new(cfg))
    for _, name in ipairs(a.table_names) do assert(b:load_state(name, assert(a:state(name)))) end
    b:set_step(a:step())
    for step = 16, 30 do
      local batch = random_batch(r, ref, 8, step)
      local k = R.kjt_fields(cfg.features, batch)
      local ra = assert(a:remap(ur.KJT(k))):values():totable()
      same_list(assert(b:remap(ur.KJT(k))):values():totable(), ra, "step " .. step)
    end
    for _, name in ipairs(a.table_names) do
      local sa, sb = assert(a:state(name)), assert(b:state(name))
      for _, key in ipairs(mc.STATE_TENSORS) do
        same_list(totable_n(sb[key]), totable_n(sa[key]), name .. "." .. key)
      end
      for _, key in ipairs(mc.STATE_COUNTS) do assert.equal(sa[key], sb[key], name .. " " .. key) end
    end
  end)

  -- One table "t" of 8 rows that fills nothing, and run(m, first, n): a batch of the n ids
  -- first + 1 .. first + n (the candidates' map's size, restored: the two cases below).
  local sized = { tables = { { name = "t", rows = 8, fallback_rows = 1 } }, fill = false, evict_every = 100,
                  max_candidates = 100000, device = "cpu" }
  local function run(m, first, n)
    local ids = {}
    for i = 1, n do ids[i] = first + i end
    assert(m:remap(ur.KJT{ keys = { "t" }, values = ids, lengths = ones(n) }))
  end

  it("restores the candidates' map's size, so that it counts and skips the batches the saved map would", function()
    local a = assert(mc.new(sized))
    run(a, 0, 3000)      -- then the map has room for 3000 candidates and two such batches: 32768 slots
    run(a, 5000, 14000)  -- 3000 + 14000 candidates overfill it at half load: not counted
    local st = assert(a:state("t"))
    assert.same({ 1, 14000, 32768 }, { st.skipped, st.batch_max, st.slots })
    local b = assert(mc.new(sized))
    assert(b:load_state("t", st))
    b:set_step(a:step())
    -- a batch of 10 ids, then one of 4000: the map grows for batches of 14000 before the first
    -- and counts the second; one sized for the candidates and that batch of 10 would not
    for _, m in ipairs { a, b } do
      run(m, 100000, 10)
      run(m, 200000, 4000)
    end
    local sa, sb = assert(a:stats()), assert(b:stats())
    assert.same({ 7010, 1 }, { sa.candidates, sa.skipped })
    assert.same({ sa.candidates, sa.skipped, sa.lookups }, { sb.candidates, sb.skipped, sb.lookups })
    local ea, eb = assert(a:state("t")), assert(b:state("t"))
    for _, key in ipairs(mc.STATE_TENSORS) do same_list(totable_n(eb[key]), totable_n(ea[key]), key) end
    for _, key in ipairs(mc.STATE_COUNTS) do assert.equal(ea[key], eb[key], key) end
  end)

  it("saves the counts its stats show, those since reset_stats too", function()
    -- after reset_stats the state held the lookups since the map was made beside the rounds
    -- since the reset: a map restored from it showed 30 lookups where the saved one showed 10
    local a, cfg, r, ref = streamed(31, "lfu", 8)
    a:reset_stats()
    for step = 9, 12 do a:remap(ur.KJT(R.kjt_fields(cfg.features, random_batch(r, ref, 8, step)))) end
    local b = assert(mc.new(cfg))
    for _, name in ipairs(a.table_names) do assert(b:load_state(name, assert(a:state(name)))) end
    local sa, sb = assert(a:stats()), assert(b:stats())
    for _, k in ipairs { "lookups", "resident_lookups", "fallback_lookups", "rounds", "fills", "admissions",
                         "evictions", "skipped", "resident", "candidates" } do
      assert.equal(sa[k], sb[k], k)
      for _, name in ipairs(a.table_names) do assert.equal(sa.tables[name][k], sb.tables[name][k], name .. " " .. k) end
    end
    assert.is_true(sa.lookups > 0, "lookups since the reset")
  end)

  it("restores into a map that has counted batches as into a fresh one", function()
    -- the used map's last batch (20000 ids) stayed in its counters after the restore and sized
    -- the candidates' map as if the saved map had seen it: batch_max 20000 and 131072 slots
    local a, used = assert(mc.new(sized)), assert(mc.new(sized))
    run(a, 0, 10)
    run(a, 100, 10)
    run(used, 1000, 20000)
    assert(used:load_state("t", assert(a:state("t"))))
    used:set_step(a:step())
    for _, m in ipairs { a, used } do run(m, 50000, 10) end
    local sa, su = assert(a:state("t")), assert(used:state("t"))
    assert.same({ 10, 4096 }, { sa.batch_max, sa.slots })
    for _, key in ipairs(mc.STATE_COUNTS) do assert.equal(sa[key], su[key], key) end
    for _, key in ipairs(mc.STATE_TENSORS) do same_list(totable_n(su[key]), totable_n(sa[key]), key) end
  end)

  it("counts a resident id's lookups past 2^31 between rounds, and ranks it by all of them", function()
    -- a bag of 40,000 copies of id 5 read by 65,535 samples (VBE): 2,621,400,000 lookups in one
    -- batch; in 32 bits the window wrapped negative and a round gave id 5's row to an id seen once
    local m = assert(mc.new{ tables = { { name = "t", rows = 2, fallback_rows = 1, features = { "a" } } },
                             policy = "lfu", evict_every = 1000, device = "cpu" })
    assert(m:remap{ values = i64 { 5 }, offsets = i64 { 0, 1 } }) -- a candidate, filled in before the next
    local N = 40000
    local vals = ur.tensor({ N + 1 }, { dtype = "i64" }):fill(5)
    vals:set(N, 7)
    local inv = ur.tensor({ 65536 }, { dtype = "i64" }):fill(0)
    inv:set(65535, 1)
    assert(m:remap{ values = vals, offsets = i64 { 0, N, N + 1 }, batch_per_feature = { 2 }, inverse = inv })
    local st = assert(m:state("t"))
    -- its lookup as a candidate, kept by the fill that admitted it, and this batch's
    assert.same({ 5, 1 + 40000 * 65535 }, { st.ids:get(0), st.window:get(0) })
    assert.equal("i64", st.window:dtype())
    local s = assert(m:stats())
    assert.same({ 40000 * 65535 + 2, 40000 * 65535, 2 }, { s.lookups, s.resident_lookups, s.fallback_lookups })
    assert(m:remap{ values = i64 { 7 }, offsets = i64 { 0, 1 } }) -- id 7 a candidate again
    assert(m:round("t"))
    local rows, resident = m:lookup("t", { 5, 7 })
    assert.same({ 0, 1 }, rows)
    assert.same({ true, false }, resident, "id 5 keeps its row")
    -- decayed, its count is (1 + 2,621,400,000) lookups x 65536 x 0.5, exact in 64 bits
    assert.equal((1 + 40000 * 65535) * 65536 / 2, assert(m:state("t")).counts:get(0))
  end)

  it("restores a state saved with 32-bit lookup counts (window, cand_counts)", function()
    local a, cfg = streamed(12, "lfu", 10)
    local b = assert(mc.new(cfg))
    for _, name in ipairs(a.table_names) do
      local st = assert(a:state(name))
      for _, key in ipairs { "window", "cand_counts" } do
        local narrow = ur.tensor({ st[key]:numel() }, { dtype = "i32" })
        for i = 0, st[key]:numel() - 1 do narrow:set(i, st[key]:get(i)) end
        st[key] = narrow
      end
      assert(b:load_state(name, st))
      local sa, sb = assert(a:state(name)), assert(b:state(name))
      for _, key in ipairs(mc.STATE_TENSORS) do
        same_list(totable_n(sb[key]), totable_n(sa[key]), name .. "." .. key)
      end
    end
  end)

  it("leaves a table's map as it was when a restore cannot have its memory", function()
    local m = assert(mc.new{ tables = { { name = "t", rows = 9, fallback_rows = 1 } }, evict_every = 100,
                             device = "cpu" })
    assert(m:remap(ur.KJT{ keys = { "t" }, values = { 100, 101, 102 }, lengths = { 1, 1, 1 } }))
    assert(m:remap(ur.KJT{ keys = { "t" }, values = { 100, 103 }, lengths = { 1, 1 } }))
    local before, rows = assert(m:state("t")), m:lookup("t", { 100, 101, 102, 103 })
    assert.same({ 0, 1, 2, 8 }, rows, "103 a candidate, the others resident")
    local other = assert(mc.new{ tables = { { name = "t", rows = 9, fallback_rows = 1 } }, evict_every = 100,
                                 device = "cpu" })
    assert(other:remap(ur.KJT{ keys = { "t" }, values = { 1, 2 }, lengths = { 1, 1 } }))
    assert(other:remap(ur.KJT{ keys = { "t" }, values = { 3 }, lengths = { 1 } }))
    local st = assert(other:state("t"))
    -- batches of 2^40 ids (as a checkpoint may say): a map sized for them, 2^43 slots, is more
    -- than the host has; the state is one the engine could have made, so the check passes
    st.batch_max, st.slots = 2 ^ 40, 0
    assert.is_nil(m:check_state("t", st))
    local ok, err = m:load_state("t", st)
    assert.is_nil(ok)
    assert.equal("mc: out of host memory for the 8796093022208 candidate slots of table 't'", err)
    local after = assert(m:state("t"))
    for _, key in ipairs(mc.STATE_TENSORS) do same_list(totable_n(after[key]), totable_n(before[key]), key) end
    for _, key in ipairs(mc.STATE_COUNTS) do assert.equal(before[key], after[key], key) end
    assert.same(rows, (m:lookup("t", { 100, 101, 102, 103 })))
    assert(m:remap(ur.KJT{ keys = { "t" }, values = { 104 }, lengths = { 1 } })) -- and it works on
    assert.same({ 0, 1, 2, 3 }, (m:lookup("t", { 100, 101, 102, 103 })))
  end)

  it("asks for no memory once a batch's rounds ran, so no batch fails after changing the map", function()
    -- build/bin/mc_oom (spec/support/mc_oom.c): the engine with every allocation failing from the
    -- end of a round to the end of the batch's remap.  The CPU's remap took its per-table
    -- counts then: batch 2 failed for memory ("mc: out of host memory") with its round's three
    -- admissions made
    local p = h.test_program("mc_oom")
    if not p then return end
    local out, err, code = cmd.sh(cmd.quote(p))
    assert.equal(0, code, out .. err)
    assert.equal("batch 2: 0 ok\nrefused 0 allocations\nrounds 1 admissions 3 resident 100: 1\n", out)
  end)

  it("computes distance_lfu's power with the engine's exp and log", function()
    for _, x in ipairs { 1, 2, 3.5, 17, 1000, 123456 } do
      h.near(R.exp(1.5 * R.log(x)), x ^ 1.5, 1e-14, "x^1.5 at " .. x)
    end
  end)

  describe("errors", function()
    local function msg(f)
      local ok, err = pcall(f)
      assert.is_false(ok)
      return tostring(err)
    end

    it("names the table and the value of a bad setting", function()
      assert.truthy(msg(function() mc.new{ tables = { { name = "t", rows = 1 } }, device = "cpu" } end)
        :find("managed collisions: table 't' rows is 1; expected a whole number >= 2", 1, true))
      assert.truthy(msg(function()
        mc.new{ tables = { { name = "t", rows = 5, fallback_rows = 5 } }, device = "cpu" }
      end)
        :find("mc: table 't' has 5 fallback rows; expected 1 .. 4 (rows - 1)", 1, true))
      assert.truthy(msg(function() mc.new{ tables = { { name = "t", rows = 5, policy = "mru" } }, device = "cpu" } end)
        :find("managed collisions: table 't' policy 'mru' is not lfu, lru or distance_lfu", 1, true))
      assert.truthy(msg(function() mc.new{ tables = { { name = "t", rows = 5 } }, decay = 0, device = "cpu" } end)
        :find("mc: table 't' decay 0; expected a value in (0, 1]", 1, true))
      assert.truthy(msg(function()
        mc.new{ tables = { { name = "t", rows = 5 } }, distance_power = 20, device = "cpu" }
      end)
        :find("mc: table 't' distance_power 20; expected a value in (0, 16]", 1, true))
      assert.truthy(msg(function() mc.new{ tables = { { name = "t", rows = 5 } }, evict_every = 0, device = "cpu" } end)
        :find("managed collisions: table 't' evict_every is 0; expected a whole number >= 1", 1, true))
      assert.truthy(msg(function() mc.new{ tables = { { name = "t", rows = 5, colour = 1 } }, device = "cpu" } end)
        :find("managed collisions: unknown table option 'colour'; expected decay, distance_power, evict_every, "
          .. "fallback_rows, features, fill, max_candidates, name, policy, rows", 1, true))
      -- beyond 2^63 a cast gave the engine -2^63 ('evict_every -9223372036854775808'), and a seed
      -- of 2^64 hashed as the seed 0
      assert.truthy(msg(function() mc.new{ tables = { { name = "t", rows = 5 } }, evict_every = math.huge,
                                           device = "cpu" } end)
        :find("managed collisions: table 't' evict_every is inf; expected a whole number below 2^63", 1, true))
      assert.truthy(msg(function() mc.new{ tables = { { name = "t", rows = 5 } }, seed = 2 ^ 64, device = "cpu" } end)
        :find("managed collisions: seed is 1.844674407371e+19; expected a whole number below 2^63", 1, true))
      assert.truthy(msg(function() mc.new{ tables = { { name = "t", rows = 5, features = { "a" } } },
                                           features = { "b" }, device = "cpu" } end)
        :find("managed collisions: feature 'a' of table 't' is not in features", 1, true))
    end)

    it("names what is wrong with an input", function()
      local m = assert(mc.new{ tables = { { name = "t", rows = 5, features = { "a", "b" } } }, device = "cpu" })
      assert.truthy(msg(function() m:remap(ur.KJT{ keys = { "b", "a" }, values = { 1 }, lengths = { 1, 0 } }) end)
        :find("managed collisions: the input's keys {b, a} are not the map's features {a, b}", 1, true))
      local v = i64 { 1, 2, 3 }
      assert.truthy(msg(function() m:remap{ values = v, offsets = i64 { 0, 0, 0 } } end)
        :find("mc: offsets run from 0 to 0; expected 0 to 3 (the values)", 1, true))
      assert.truthy(msg(function() m:remap{ values = v, offsets = i64 { 0, 2, 1, 3 } } end)
        :find("mc: 3 bags for 2 features; expected a multiple (or batch_per_feature)", 1, true))
      assert.truthy(msg(function() m:remap{ values = v, offsets = i64 { 0, 2, 1, 1, 3 } } end)
        :find("mc: offsets[2] = 1 is below offsets[1] = 2; offsets must not decrease", 1, true))
      -- a KJT made unchecked, its offsets then rewritten in order within the values (a's bags empty, b's second
      -- reading every id): mapped as given (a GPU's map reads offsets past the values too); checked first now
      local odd = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1 }, check = false }
      local o = odd:offsets()
      for i, x in ipairs { 0, 0, 0, 0, 3 } do o:set(i - 1, x) end
      assert.truthy(msg(function() m:remap(odd) end):find("managed collisions: kjt: key 'a' sample 0: offsets 0..0 "
        .. "disagree with length 1 or pass the 3 values", 1, true))
      assert.equal(0, m:step()) -- refused before the map counted it
      assert.truthy(msg(function() m:remap{ values = v, offsets = i64 { 0, 2, 3 }, batch_per_feature = { 1, 2 } } end)
        :find("mc: batch_per_feature sums to more than the 2 bags offsets hold (2 at feature 1, after 1)", 1, true))
      assert.truthy(msg(function() m:remap{ values = v, offsets = i64 { 0, 2, 3 }, batch_per_feature = { 1, 0 } } end)
        :find("mc: batch_per_feature sums to 1, but offsets hold 2 bags", 1, true))
      -- sums that would wrap past 2^63 to the bags' count are refused before any is read
      local five = assert(mc.new{ tables = { { name = "t", rows = 5, features = { "a", "b", "c", "d", "e" } } },
                                  device = "cpu" })
      assert.truthy(msg(function() five:remap{ values = i64 {}, offsets = i64 { 0 },
        batch_per_feature = { 2 ^ 40, 2 ^ 62, 2 ^ 62, 2 ^ 62, 2 ^ 62 - 2 ^ 40 } } end)
        :find("mc: batch_per_feature sums to more than the 0 bags offsets hold (1099511627776 at feature 0, after 0)",
              1, true))
      assert.truthy(msg(function() m:remap({ values = v, offsets = i64 { 0, 2, 3 } },
                                           { out = ur.tensor({ 2 }, { dtype = "i64" }) }) end)
        :find("mc: out has 2 entries for 3 values", 1, true))
      assert.truthy(msg(function() m:remap{ values = ur.tensor({ 3 }), offsets = i64 { 0, 2, 3 } } end)
        :find("mc: values is f32 with 1 dimensions; expected i64 [n]", 1, true))
      local k = ur.KJT{ keys = { "a", "b" }, values = { 1, 2 }, lengths = { 1, 1, 0, 0 } }:dedup()
      local inv = k:inverse_indices()
      inv:set(0, 5)
      local per = k:stride_per_key_per_rank()
      assert.truthy(msg(function() m:remap{ values = k:values(), offsets = k:offsets(),
        batch_per_feature = { per[1][1], per[2][1] }, inverse = inv } end)
        :find("mc: inverse[0] = 5 for feature 0, which has", 1, true))
      assert.truthy(msg(function() m:lookup("u", { 1 }) end)
        :find("managed collisions: no table named 'u' (tables: t)", 1, true))
    end)

    it("leaves the caller's table names alone when it cannot copy them", function()
      -- a table's name is copied; when the copy could not be had, ur_mc_free freed the caller's
      -- own string in the copy's place (here a name of 256 MiB under a capped address space:
      -- reading it afterwards read unmapped memory)
      local out = h.capped_child [[
        ffi.cdef "void *malloc(size_t); void free(void *); void *memset(void *, int, size_t);"
        local ur = require "uvmrec"
        local C = require("uvmrec.lib").C
        local n = 256 * 1024 * 1024
        local name = ffi.cast("char *", ffi.C.malloc(n + 1))
        ffi.C.memset(name, 97, n)
        name[n] = 0
        local tc = ffi.new("ur_mc_table_config[1]")
        tc[0].name, tc[0].rows, tc[0].fallback_rows, tc[0].evict_every, tc[0].max_candidates = name, 10, 1, 1, 1
        tc[0].decay, tc[0].distance_power, tc[0].fill = 0.5, 1, 1
        local cfg = ffi.new("ur_mc_config")
        cfg.device = -1
        local ft, out = ffi.new("int32_t[1]", 0), ffi.new("ur_mc *[1]")
        cap(64 * 1024)
        local st = C.ur_mc_new(out, cfg, 1, tc, 1, ft)
        uncap()
        print(st == C.UR_STATUS_OOM, ffi.string(C.ur_last_error()), out[0] == nil)
        print("the name still reads", ffi.string(name, 3), name[n] == 0)
        ffi.C.free(name)
      ]]
      if not out then
        return pending("a sanitizer build: its shadow memory does not fit under a capped address space")
      end
      assert.equal("true\tmc: out of host memory\ttrue\nthe name still reads\taaa\ttrue\n", out)
    end)

    it("refuses a state that is not a map", function()
      local m = assert(mc.new{ tables = { { name = "t", rows = 5, fallback_rows = 1 } }, device = "cpu" })
      local st = assert(m:state("t"))
      st.ids = ur.tensor({ 4 }, { dtype = "i64" }):fill(-1)
      st.ids:set(2, 9)
      assert.truthy(msg(function() m:load_state("t", st) end)
        :find("mc: state of table 't': row 0 is free but row 2 holds id 9; resident rows come first", 1, true))
      st.ids:set(0, 9)
      st.ids:set(1, 9)
      st.ids:set(2, -1)
      assert.truthy(msg(function() m:load_state("t", st) end)
        :find("mc: state of table 't': id 9 appears twice among the residents and candidates", 1, true))
      st.ids = ur.tensor({ 3 }, { dtype = "i64" }):fill(-1)
      assert.truthy(msg(function() m:load_state("t", st) end)
        :find("mc: state of table 't': ids is i64 [3]; expected i64 [4]", 1, true))
      st = assert(m:state("t"))
      assert.is_nil(m:check_state("t", st))
      st.slots = 3000
      local want = "mc: state of table 't': slots 3000; expected 0 or a power of 2 from 2048 to 4096, at least " ..
        "twice its 0 candidates (at most what max_candidates 1024 and batch_max -1 can need)"
      assert.equal(want, m:check_state("t", st))
      assert.truthy(msg(function() m:load_state("t", st) end):find(want, 1, true))
      st.slots, st.batch_max = 2048, -2
      assert.equal("mc: state of table 't': batch_max -2; expected -1 (no batch counted) .. 1099511627776",
        m:check_state("t", st))
      st.batch_max = -1
      -- the counts and steps a round ranks by: none negative (nor counts past 2^62)
      for _, case in ipairs { { "window", 2, -1 }, { "counts", 0, -65536 }, { "last", 3, -2 },
                              { "counts", 1, 2 ^ 62 + 2 ^ 12 } } do
        local good = st[case[1]]
        st[case[1]] = ur.tensor({ 4 }, { dtype = "i64" }):fill(0)
        st[case[1]]:set(case[2], case[3])
        assert.equal(("mc: state of table 't': %s[%d] = %d; expected 0 .. %s"):format(case[1], case[2], case[3],
          case[1] == "counts" and "4611686018427387904" or "9223372036854775807"), m:check_state("t", st))
        st[case[1]] = good
      end
      local good = st.cand_counts
      st.cand_counts = ur.tensor({ 1 }, { dtype = "i32" })
      assert.equal("mc: state of table 't': cand_counts is i32 [1]; expected i64 (or i32) [0]", m:check_state("t", st))
      st.cand_counts = good
      local good_ids = st.cand_ids
      st.cand_ids = ur.tensor({ 1 }, { dtype = "i32" })
      assert.equal("mc: state of table 't': cand_ids is i32 [1]; expected i64 [any length]", m:check_state("t", st))
      st.cand_ids = good_ids
      st.evictions = 1.5
      assert.equal("mc: state of table 't': evictions is 1.5; expected a whole number", m:check_state("t", st))
      st.evictions = -3
      assert.equal("mc: state of table 't': evictions -3; expected >= 0", m:check_state("t", st))
    end)
  end)
end)
