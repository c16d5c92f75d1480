-- CUDA against the CPU backend, and what only a GPU can show: driver attributes, measured
-- residency and migration.  Every test is #cuda: pending without a GPU.
local ur = require "uvmrec"
local h = require "helpers"
local cuda_it = h.cuda_it

local MiB = 2 ^ 20

-- A managed f32 tensor of `mib` MiB filled with v, its pages preferring the host and accessed
-- by the GPU (advised so), and its element count.
local function host_preferred(mib, v)
  local t = ur.uvm_tensor({ mib * MiB / 4 }, 0)
  local n = t:numel()
  t:fill(v)
  t:advise(0, n, "preferred_location", "cpu")
  t:advise(0, n, "accessed_by", "gpu")
  return t, n
end

describe("uvmrec on CUDA", function()
  after_each(function() ur.set_hbm_budget(nil) end)

  cuda_it("reads the device's properties", function()
    local p = assert(ur.device_props(0))
    assert.is_true(#p.name > 0 and p.sm_count > 0 and p.total_bytes > 0 and p.l2_bytes > 0)
    assert.is_true(p.managed_memory)
    assert.truthy(ur.cuda_archs():match("sm_"))
  end)

  cuda_it("draws the CPU's random numbers on the device, for every dtype", function()
    for _, dt in ipairs(h.dtypes) do
      for _, dist in ipairs { "uniform", "normal" } do
        local lo, hi = -3, 7
        if dt == "u8" and dist == "uniform" then lo = 0 end
        local cpu = ur.tensor({ 4099, 3 }, { dtype = dt })
        local gpu = assert(ur.tensor({ 4099, 3 }, { dtype = dt, placement = "device" }))
        cpu[dist](cpu, lo, hi, 77)
        gpu[dist](gpu, lo, hi, 77)
        local a, b = cpu:totable(), gpu:totable()
        if dist == "normal" and dt ~= "u8" then
          -- libm differs between host and device: allow one f32 rounding step (halves and
          -- integers then agree but at rare boundaries, which near() also admits).
          for i = 1, #a do h.near(b[i], a[i], dt:match("f") and 1e-2 or 1, dt .. " " .. i) end
        elseif dist == "uniform" then
          assert.same(a, b, dt .. " " .. dist)
        end
      end
    end
  end)

  cuda_it("draws on a device view the numbers of the same elements of its tensor", function()
    local t = ur.tensor({ 1000, 8 }, { placement = "device" }):uniform(0, 1, 3)
    local v = ur.tensor({ 1000, 8 }, { placement = "device" }):view(500, 10):uniform(0, 1, 3)
    assert.same(t:totable(4000, 80), v:totable())
  end)

  cuda_it("fills on the device like the CPU, for every dtype", function()
    for _, dt in ipairs(h.dtypes) do
      local v = dt == "u8" and 200 or -7
      local g = ur.tensor({ 100003 }, { dtype = dt, placement = "device" }):fill(v)
      assert.same({ v, v, v }, { g[0], g[50000], g[100002] }, dt)
    end
  end)

  cuda_it("copies asynchronously on a stream, ordered by events", function()
    local s = assert(ur.stream { priority = -1 })
    local src = ur.tensor({ 8 * MiB }, { placement = "pinned" }):uniform(0, 1, 5)
    local dev = ur.tensor({ 8 * MiB }, { placement = "device" })
    local back = ur.tensor({ 8 * MiB }, { placement = "pinned" })
    local e0, e1 = ur.event(), ur.event()
    e0:record(s)
    dev:copy(src, s)
    back:copy(dev, s)
    e1:record(s)
    e1:sync()
    assert.same(src:totable(0, 1000), back:totable(0, 1000))
    assert.same(src:totable(8 * MiB - 1000, 1000), back:totable(8 * MiB - 1000, 1000))
    assert.is_true(assert(e0:elapsed(e1)) > 0)
  end)

  cuda_it("counts device tensors against the HBM budget", function()
    local used = ur.memory().hbm_used
    ur.set_hbm_budget(used + MiB)
    local ok = assert(ur.tensor({ MiB / 4 }, { placement = "device" }))
    local t, err = ur.tensor({ 1 }, { placement = "device" })
    assert.is_nil(t)
    assert.matches("^hbm budget: device tensor asks for 4 B", err)
    ok:free()
    assert.equal(used, ur.memory().hbm_used)
  end)

  cuda_it("counts a keyed jagged tensor op's device scratch against the HBM budget while it runs", function()
    local k = assert(assert(ur.KJT { keys = { "a", "b" }, stride = 2, lengths = { 1, 2, 0, 3 },
                                     values = { 5, 6, 7, 8, 9, 10 } }):to("device"))
    local m0 = ur.memory()
    assert.is_true(k:validate())
    assert.same({ m0.hbm_used, m0.workspace }, { ur.memory().hbm_used, ur.memory().workspace },
                "given back after the call")
    ur.set_hbm_budget(m0.hbm_used + 16)
    local ok, err = k:validate()
    assert.is_nil(ok)
    -- validate's scratch (kernels/kjt.cu): three arrays of a key span each and three flags,
    -- each part 256-byte aligned
    assert.matches("^hbm budget: the scratch of kjt validate asks for 1.0 KiB %(1024 bytes%) on the GPU", err)
    assert.same({ m0.hbm_used, m0.workspace }, { ur.memory().hbm_used, ur.memory().workspace })
    ur.set_hbm_budget(nil)
    assert.is_true(k:validate()) -- nothing was lost
  end)

  -- Every entry of kernels/kjt.cu that takes a scratch, under a budget that holds the op's
  -- outputs (allocated before it, named below in bytes) but not its scratch (256-byte parts, at
  -- least one): the budget's own message naming the entry (the case's name unless `entry`
  -- says), not a CUDA failure written over it; nothing kept; and the op whole once the budget
  -- is lifted.
  cuda_it("refuses each keyed jagged tensor op's scratch with the budget's own message", function()
    local k = assert(assert(ur.KJT { keys = { "a", "b" }, stride = 2, lengths = { 1, 2, 0, 3 },
                                     values = { 5, 6, 7, 8, 9, 10 } }):to("device"))
    local v = assert(k:dedup()) -- every bag distinct: 4 bags, a VBE batch
    local rows = assert(ur.tensor({ 4, 1 }):to("device"))
    local function on_device(dtype, shape, list)
      local t = ur.tensor(shape, { dtype = dtype })
      for i, x in ipairs(list) do t[i - 1] = x end
      return assert(t:to("device"))
    end
    -- two samples, keys taking 1 and 2 ids: from_rows' outputs are 6 values, 4 lengths and 5
    -- offsets (104 bytes)
    local ids = on_device("i64", { 2, 3 }, { 1, 2, 3, 4, 5, 6 })
    local lens = on_device("i32", { 2, 2 }, { 1, 2, 0, 1 })
    local cases = {
      -- offsets (40 bytes), then the scan's scratch
      { "offsets", 200,
        function() return ur.KJT { keys = { "a", "b" }, values = k:values(), lengths = k:lengths() } end },
      { "validate", 200, function() return k:validate() end },
      -- 6 values and 4 lengths (64 bytes), then the segment copies' scratch
      { "segment copy", 200, function() return k:permute { 2, 1 } end },
      -- map and inverse (64 bytes)
      { "dedup", 200, function() return k:dedup() end },
      -- the map (32 bytes)
      { "expand", 200, function() return v:expand() end },
      -- the map's scratch (256 bytes beside the map's 32) fits and is given back; then the map,
      -- 4 lengths and 5 offsets (88 bytes) leave 255 for the bag lengths' scratch
      { "bag lengths", 88 + 255, function() return v:expand() end },
      -- the output rows (16 bytes)
      { "expand rows", 200, function() return v:expand(rows) end },
      -- 6 lengths, 7 offsets, 6 values (128 bytes)
      { "bucket count", 200, function() return k:bucketize(2, { a = { block = 5, rows = 10 } }) end },
      { "from rows", 200,
        function() return ur.KJT.from_rows { keys = { "p", "q" }, hot = { 1, 2 }, ids = ids } end },
      -- from_rows' own scratch (768 bytes) fits; the scan of its lengths (its offsets' scratch,
      -- at least 768 more) does not
      { "from rows' offsets", 104 + 768 + 767, entry = "from rows",
        function() return ur.KJT.from_rows { keys = { "p", "q" }, hot = { 1, 2 }, ids = ids, lengths = lens } end },
    }
    local pattern = "^hbm budget: the scratch of kjt (.-) asks for %S+ %S+ %((%d+) bytes%) on the GPU, "
      .. "%S+ %S+ are in use, and the budget is %S+ %S+ %((%d+) bytes%)$"
    for _, c in ipairs(cases) do
      local name, room, run = c[1], c[2], c[3]
      collectgarbage()
      collectgarbage()
      local m0 = ur.memory()
      ur.set_hbm_budget(m0.hbm_used + room)
      local got, err = run()
      ur.set_hbm_budget(nil)
      assert.is_nil(got, name)
      local entry, ask, budget = tostring(err):match(pattern)
      assert.is_truthy(ask, name .. ": " .. tostring(err))
      assert.equal(c.entry or name, entry, name)
      assert.equal(m0.hbm_used + room, tonumber(budget), name)
      assert.is_true(tonumber(ask) >= 256 and tonumber(ask) % 256 == 0, name .. ": " .. err)
      assert.same({ m0.hbm_used, m0.workspace }, { ur.memory().hbm_used, ur.memory().workspace }, name)
      got = assert(run(), name)
      if got ~= true then got:free() end
    end
  end)

  cuda_it("passes hints to the driver and reads them back from it", function()
    local t, n = host_preferred(16, 1)
    local a = t:advised()
    assert.is_true(a.from_driver)
    assert.same({ "cpu", { "cuda:0" } }, { a.preferred_location, a.accessed_by })
    t:prefetch(0, n / 2, "gpu")
    ur.sync()
    assert.equal("cuda:0", t:advised(0, n / 2).last_prefetch_location)
    t:advise(0, n / 4, "preferred_location", "gpu")
    assert.equal("mixed", t:advised(0, n / 2).preferred_location)
    t:advise(0, n, "read_mostly", "gpu")
    assert.is_true(t:advised().read_mostly)
    assert.equal(ur.hint_log()[#ur.hint_log()].applied, true)
  end)

  cuda_it("measures a prefetched range as fast and a host range read in place as slow", function()
    local t, n = host_preferred(64, 2)
    t:prefetch(0, n, "cpu")
    ur.sync()
    local slow = assert(t:residency())
    t:prefetch(0, n, "gpu")
    ur.sync()
    local fast = assert(t:residency())
    if os.getenv("UVMREC_SANITIZER") then
      pending("timings mean nothing under compute-sanitizer") -- its instrumented reads crawl
      return
    end
    local refs = ("(device %.1f, pinned host %.1f GB/s)"):format(fast.device_gbps, fast.host_gbps)
    assert.is_false(slow.fast, ("host range read at %.1f GB/s %s"):format(slow.gbps, refs))
    assert.is_true(fast.fast, ("prefetched range read at %.1f GB/s %s"):format(fast.gbps, refs))
    assert.is_true(fast.gbps > 4 * slow.gbps)
    assert.is_true(fast.device_gbps > 4 * fast.host_gbps, refs) -- 64 MiB reads tell them apart
  end)

  cuda_it("residency names its reference read when the HBM budget has no room for it", function()
    local t = ur.uvm_tensor({ MiB }, 0)
    local used = ur.memory().hbm_used
    ur.set_hbm_budget(used + MiB)
    local r, err = t:residency()
    assert.is_nil(r)
    local want = "^residency: the device reference read of 4194304 bytes %(and %d+ to evict them from L2%): "
    assert.matches(want .. "hbm budget: ", err)
    assert.equal(used, ur.memory().hbm_used)
  end)

  cuda_it("measures prefetched bytes with the migration monitor", function()
    local ok, err = ur.monitor.start()
    if not ok then
      pending("CUPTI unified-memory counters unavailable here: " .. err)
      return
    end
    local t = ur.uvm_tensor({ 64 * MiB / 4 }, 0)
    t:fill(3)
    ur.sync()
    ur.monitor.read(true)
    t:prefetch(0, t:numel(), "gpu")
    ur.sync()
    local m = assert(ur.monitor.read(true))
    h.near(m.bytes_htod, 64 * MiB, 0.05, "bytes moved host to device")
    t:prefetch(0, t:numel(), "cpu")
    ur.sync()
    m = assert(ur.monitor.read(true))
    h.near(m.bytes_dtoh, 64 * MiB, 0.05, "bytes moved device to host")
    ur.monitor.stop()
  end)
end)
