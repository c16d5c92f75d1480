local ur = require "uvmrec"

local MiB = 2 ^ 20

describe("uvmrec memory and the HBM budget (ur.memory, ur.bytes, ur.set_hbm_budget)", function()
  -- Tensors earlier specs left to the collector must not be freed in the middle of a count.
  before_each(function() collectgarbage() collectgarbage() end)
  after_each(function() ur.set_hbm_budget(nil) end)

  it("counts the bytes of each placement, and gives them back on free", function()
    local m0 = ur.memory()
    local a = ur.tensor({ 1000 }, { dtype = "i64" })
    local b = ur.uvm_tensor({ 250 }, 0)
    local v = a:view(0, 10)
    local m1 = ur.memory()
    assert.same({ 8000, 1000 }, { m1.host - m0.host, m1.managed - m0.managed })
    -- a view allocates nothing: one storage each
    assert.same({ 1, 1, 0, 0 }, { m1.allocs.host - m0.allocs.host, m1.allocs.managed - m0.allocs.managed,
                                  m1.frees.host - m0.frees.host, m1.frees.managed - m0.frees.managed })
    a:free()
    assert.equal(8000, ur.memory().host - m0.host) -- the view holds the storage
    assert.equal(m0.frees.host, ur.memory().frees.host)
    v:free()
    b:free()
    local m2 = ur.memory()
    assert.same({ m0.host, m0.managed }, { m2.host, m2.managed })
    assert.same({ 1, 1 }, { m2.frees.host - m0.frees.host, m2.frees.managed - m0.frees.managed })
  end)

  it("parses sizes with units", function()
    assert.same({ 512 * MiB, 16e9, 3 }, { ur.bytes("512MiB"), ur.bytes("16 GB"), ur.bytes(3) })
    assert.has_error(function() ur.bytes("lots") end,
      "bytes: 'lots' is not a size; expected a number of bytes or e.g. '16GiB'")
    -- a fraction of a byte is no size (set_hbm_budget(0.5) read it as 0: no budget); units in any case
    assert.has_error(function() ur.set_hbm_budget(0.5) end,
      "bytes: '0.5' is not a size; expected a number of bytes or e.g. '16GiB'")
    assert.same({ 16 * 2 ^ 30, 1536 }, { ur.bytes("16gib"), ur.bytes("1.5 KiB") })
    -- the engine's uint64_t took 2^64 as 0 (no budget) and "99999999999 TiB" as 2^63
    local before = ur.hbm_budget()
    assert.has_error(function() ur.set_hbm_budget(2 ^ 64) end,
      "bytes: '1.844674407371e+19' is 2^63 bytes or more; expected a size below 2^63 bytes")
    assert.has_error(function() ur.set_hbm_budget("99999999999 TiB") end,
      "bytes: '99999999999 TiB' is 2^63 bytes or more; expected a size below 2^63 bytes")
    assert.has_error(function() ur.bytes(math.huge) end,
      "bytes: 'inf' is not a size; expected a number of bytes or e.g. '16GiB'")
    assert.has_error(function() ur.bytes(0 / 0) end,
      ("bytes: '%s' is not a size; expected a number of bytes or e.g. '16GiB'"):format(tostring(0 / 0)))
    assert.equal(before, ur.hbm_budget())
    assert.equal(2 ^ 62, ur.bytes(2 ^ 62))
  end)

  it("counts managed bytes preferred on or prefetched to a GPU against the budget", function()
    local t = ur.uvm_tensor({ 2 * MiB / 4 }, 0)       -- 2 MiB, 512 pages
    local half = MiB / 4
    local used0 = ur.memory().hbm_used
    ur.set_hbm_budget(used0 + MiB)
    assert.equal(used0 + MiB, ur.memory().hbm_budget)
    assert.truthy(t:advise(0, half, "preferred_location", "gpu"))
    assert.equal(used0 + MiB, ur.memory().hbm_used)
    assert.equal(MiB, ur.memory().managed_on_gpu)
    -- More would pass the budget: refused, and nothing changes.
    local log0 = ur.hint_log()
    local seq0 = #log0 > 0 and log0[#log0].seq or 0 -- by seq: the log keeps only its newest records
    local ok, err = t:prefetch(half, 1, "gpu")
    assert.is_nil(ok)
    assert.matches("^hbm budget: prefetch on managed tensor #%d+ asks for 4%.0 KiB %(4096 bytes%) on the GPU, " ..
                   "[%d.]+ MiB are in use, and the budget is [%d.]+ MiB", err)
    assert.same({}, ur.hint_log(seq0))
    assert.equal("none", t:advised(half, 1).last_prefetch_location)
    -- A prefetch to the CPU of preferred-GPU pages frees nothing; unsetting the preference does.
    t:prefetch(0, half, "cpu")
    assert.equal(used0 + MiB, ur.memory().hbm_used)
    t:advise(0, half, "unset_preferred_location", "gpu")
    assert.equal(used0, ur.memory().hbm_used)
    assert.truthy(t:prefetch(half, half, "gpu"))
    assert.equal(used0 + MiB, ur.memory().hbm_used)
    assert.is_true(ur.memory().hbm_peak >= used0 + MiB)
    t:free()
    assert.equal(used0, ur.memory().hbm_used)
    assert.equal(0, ur.memory().managed_on_gpu)
    -- the peak counts from a reset (the HBM in use then): a plan's run measures its own
    assert.is_true(ur.memory().hbm_peak >= used0 + MiB)
    ur.reset_hbm_peak()
    assert.equal(used0, ur.memory().hbm_peak)
  end)

  it("lets accessed_by and read_mostly through: they place nothing", function()
    ur.set_hbm_budget(4096)
    local t = ur.uvm_tensor({ MiB }, 0)
    assert.truthy(t:advise(0, MiB, "accessed_by", "gpu"))
    assert.truthy(t:advise(0, MiB, "read_mostly", "gpu"))
    assert.truthy(t:advise(0, MiB, "preferred_location", "cpu"))
  end)
end)
