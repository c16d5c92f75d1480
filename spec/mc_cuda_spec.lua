-- uvmrec.mc on the GPU against the CPU reference: the same rows for every id, the same rows
-- reassigned by every round, the same maps, candidates and counts, batch by batch, for every
-- policy, on device KJTs with and without a variable batch per feature, through the
-- candidates' map growing, and twice in a row (the same decisions run to run).  Every test is
-- #cuda.
local ur = require "uvmrec"
local mc = require "uvmrec.mc"
local h = require "helpers"

local cuda_it = h.cuda_it

local same_list = h.same_list

local function host_list(t)
  if t:numel() == 0 then return {} end
  if t:placement() == "device" then t = assert(t:to("host")) end
  return t:totable()
end

local function config(policy, device)
  return { device = device, seed = 5, policy = policy, evict_every = 3, max_candidates = 60,
           distance_power = policy == "distance_lfu" and 1.5 or 1,
           tables = { { name = "a", rows = 50, fallback_rows = 3, features = { "f1", "f2" } },
                      { name = "b", rows = 9, fallback_rows = 1, features = { "f3" } } },
           features = { "f1", "f2", "p", "f3" } }
end

local function batch(r, step, B)
  local values, lengths = {}, {}
  for f = 1, 4 do
    local space = f == 4 and 40 or 400
    for _ = 1, B do
      local n = r(3) - 1
      lengths[#lengths + 1] = n
      for _ = 1, n do values[#values + 1] = (math.floor(space * (r(1000) / 1000) ^ 3) + step * 7) % space end
    end
  end
  return ur.KJT{ keys = { "f1", "f2", "p", "f3" }, values = values, lengths = lengths }
end

local function compare(g, c, what)
  for _, name in ipairs(c.table_names) do
    same_list(g:reassigned(name), c:reassigned(name), what .. " reassigned " .. name)
    local sg, sc = assert(g:state(name)), assert(c:state(name))
    for _, k in ipairs(mc.STATE_TENSORS) do
      same_list(host_list(sg[k]), host_list(sc[k]), what .. " " .. name .. "." .. k)
    end
    local tg, tc = assert(g:stats()).tables[name], assert(c:stats()).tables[name]
    for _, k in ipairs { "resident", "candidates", "lookups", "resident_lookups", "fallback_lookups", "rounds",
                         "fills", "admissions", "evictions", "skipped" } do
      assert.equal(tc[k], tg[k], what .. " " .. name .. " " .. k)
    end
  end
end

describe("uvmrec.mc on the GPU", function()
  for _, policy in ipairs { "lfu", "lru", "distance_lfu" } do
    cuda_it("makes the CPU's decisions batch by batch (" .. policy .. ", device KJTs, VBE)", function()
      local g, c = assert(mc.new(config(policy, 0))), assert(mc.new(config(policy, "cpu")))
      local r = h.rng(3)
      for step = 1, 30 do
        local k = batch(r, step, 24)
        local input = step % 3 == 0 and k:dedup() or k
        local rg = assert(g:remap(assert(input:to("device"))))
        local rc = assert(c:remap(input))
        same_list(host_list(rg:values()), rc:values():totable(), "step " .. step .. " rows")
        compare(g, c, "step " .. step)
        if step % 4 == 0 then
          local ro = assert(g:remap(assert(k:to("device")), { update = false }))
          same_list(host_list(ro:values()), assert(c:remap(k, { update = false })):values():totable(),
                    "step " .. step .. " read-only")
        end
      end
      assert.is_true(assert(c:stats()).evictions > 0, "rounds evicted ids")
    end)
  end

  cuda_it("grows the candidates' map as the CPU does, skipping the same batch", function()
    local cfg = { device = 0, fill = false, evict_every = 100,
                  tables = { { name = "t", rows = 8, fallback_rows = 1 } } }
    local g = assert(mc.new(cfg))
    cfg.device = "cpu"
    local c = assert(mc.new(cfg))
    for i, n in ipairs { 10, 5000, 5000, 20 } do
      local ids, l = {}, {}
      for j = 1, n do ids[j], l[j] = i * 100000 + j, 1 end
      local k = ur.KJT{ keys = { "t" }, values = ids, lengths = l }
      g:remap(assert(k:to("device")))
      c:remap(k)
      compare(g, c, "batch " .. i)
    end
    assert.equal(1, assert(g:stats()).skipped)
  end)

  cuda_it("counts a resident id's lookups past 2^31 as the CPU does (a lane's past 2^26 added apart)", function()
    -- bag 0: 40,000 copies of id 5 read by 65,534 samples; bags 1-2 small, in the same warp
    local cfg = { device = 0, policy = "lfu", evict_every = 1000,
                  tables = { { name = "t", rows = 3, fallback_rows = 1, features = { "a" } } } }
    local g = assert(mc.new(cfg))
    cfg.device = "cpu"
    local c = assert(mc.new(cfg))
    local function i64(list)
      local t = ur.tensor({ #list }, { dtype = "i64" })
      for i, v in ipairs(list) do t:set(i - 1, v) end
      return t
    end
    local N = 40000
    local vals = ur.tensor({ N + 3 }, { dtype = "i64" }):fill(5)
    vals:set(N, 7)
    vals:set(N + 1, 8)
    vals:set(N + 2, 7)
    local offs, inv = i64 { 0, N, N + 1, N + 3 }, ur.tensor({ 65536 }, { dtype = "i64" }):fill(0)
    inv:set(65534, 1)
    inv:set(65535, 2)
    for step, b in ipairs { { values = i64 { 5, 7 }, offsets = i64 { 0, 2 } },
                            { values = vals, offsets = offs, batch_per_feature = { 3 }, inverse = inv },
                            { values = i64 { 8 }, offsets = i64 { 0, 1 } } } do
      local d = { batch_per_feature = b.batch_per_feature }
      for _, k in ipairs { "values", "offsets", "inverse" } do d[k] = b[k] and assert(b[k]:to("device")) end
      same_list(host_list(assert(g:remap(d))), assert(c:remap(b)):totable(), "step " .. step)
      compare(g, c, "step " .. step)
    end
    -- with its lookup as a candidate, which the fill that admitted it kept in the window
    assert.equal(1 + 40000 * 65534, assert(c:state("t")).window:get(0))
    assert(g:round("t"))
    assert(c:round("t"))
    compare(g, c, "the round")
    assert.same({ 0 }, (g:lookup("t", { 5 })))
  end)

  cuda_it("looks ids up after the remaps and rounds queued on an engine stream, as the CPU does", function()
    -- ur_mc_lookup has no stream: it waits for the device, since the engine's streams do not
    -- wait for the NULL stream's work nor it for theirs
    local g, c = assert(mc.new(config("lru", 0))), assert(mc.new(config("lru", "cpu")))
    local s = assert(ur.stream { priority = -1 })
    local r, ids = h.rng(17), {}
    for id = 0, 399 do ids[#ids + 1] = id end
    for step = 1, 12 do
      local b = batch(r, step, 256)
      assert(g:remap(assert(b:to("device")), nil, s))
      assert(c:remap(b))
      local rg, sg = g:lookup("a", ids)
      local rc, sc = c:lookup("a", ids)
      same_list(rg, rc, "step " .. step .. " rows")
      same_list(sg, sc, "step " .. step .. " resident")
    end
    s:sync()
    compare(g, c, "the end")
  end)

  cuda_it("checks a KJT not known checked before the map reads its offsets, and gives rows known checked", function()
    -- offsets past the values (lengths made unchecked, moved to the GPU): the CPU's map refused them by its own
    -- check of the offsets, the GPU's read past the values' end
    local g = assert(mc.new(config("lfu", 0)))
    local over = { keys = { "f1", "f2", "p", "f3" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1, 0, 0, 0, 0 },
                   check = false }
    for _, place in ipairs { "device", "managed" } do
      local k = assert(ur.KJT(over):to(place))
      assert.is_false(k:checked())
      local ok, err = pcall(g.remap, g, k)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("managed collisions: kjt: key 'f2' sample 0: offsets 2..402 disagree with "
        .. "length 400 or pass the 3 values", 1, true), err)
    end
    assert.equal(0, g:step()) -- refused before the map counted a batch
    -- a checked batch's rows, VBE too (the rows' KJT reads the inverse indices as it is made): known checked,
    -- so the collection after the map checks nothing
    local r = h.rng(4)
    local k = batch(r, 1, 16)
    for _, input in ipairs { k, assert(k:dedup()) } do
      local rows = assert(g:remap(assert(input:to("device"))))
      assert.is_true(rows:checked())
    end
  end)

  cuda_it("makes the same decisions run to run", function()
    local runs = {}
    for run = 1, 2 do
      local g = assert(mc.new(config("lfu", 0)))
      local r = h.rng(9)
      local rows = {}
      for step = 1, 20 do
        local out = assert(g:remap(assert(batch(r, step, 64):to("device"))))
        for _, v in ipairs(host_list(out:values())) do rows[#rows + 1] = v end
      end
      runs[run] = rows
    end
    same_list(runs[2], runs[1], "second run")
  end)
end)
