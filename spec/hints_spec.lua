local ur = require "uvmrec"

-- 16 pages of f32 at the default 4 KiB hint page.
local function table16()
  local t = ur.uvm_tensor({ 16 * 1024 }, 0)
  return t, 1024 -- elements per page
end

local function last_log() local l = ur.hint_log() return l[#l] end

describe("uvmrec memory hints", function()
  before_each(function() ur.set_hint_page_bytes(4096) end)

  it("rounds a range outward to whole pages and says so", function()
    local t = table16()
    local r = t:advise(5, 3000, "preferred_location", "cpu")
    assert.same({ offset = 5, numel = 3000, byte_begin = 0, byte_end = 12288, page_bytes = 4096,
                  rounded = true }, r)
    r = t:advise(1024, 1024, "accessed_by", "gpu")
    assert.same({ 4096, 8192, false }, { r.byte_begin, r.byte_end, r.rounded })
  end)

  it("records every advise and prefetch in the log, in order", function()
    local t, pg = table16()
    local before = #ur.hint_log()
    t:advise(0, 4 * pg, "read_mostly", "cpu")
    t:prefetch(pg, pg, "cuda:0")
    t:advise(0, pg, "cudaMemAdviseSetAccessedBy", -1)
    local log = ur.hint_log()
    assert.equal(before + 3, #log)
    local a, p, c = log[#log - 2], log[#log - 1], log[#log]
    assert.same({ "advise", "read_mostly", t:id() }, { a.kind, a.advice, a.tensor_id })
    assert.same({ "prefetch", "cuda:0", 4096, 8192 }, { p.kind, p.location, p.range.byte_begin, p.range.byte_end })
    assert.same({ "accessed_by", "cpu" }, { c.advice, c.location })
    assert.equal(ur.gpu(), c.applied)
    assert.same({}, ur.hint_log(c.seq))
    assert.equal(1, #ur.hint_log(c.seq - 1))
  end)

  it("reports the advice in force over a range, and mixed where pages disagree", function()
    local t, pg = table16()
    t:advise(2 * pg, 4 * pg, "preferred_location", "cpu")
    t:advise(2 * pg, 2 * pg, "accessed_by", "gpu")
    t:advise(2 * pg, 2 * pg, "accessed_by", "cpu")
    t:prefetch(2 * pg, 4 * pg, "cpu")
    local a = t:advised(2 * pg, 2 * pg)
    assert.same({ "cpu", "cpu", { "cpu", "cuda:0" }, false }, {
      a.preferred_location, a.last_prefetch_location, a.accessed_by, a.read_mostly })
    assert.equal(ur.gpu(), a.from_driver)
    local b = t:advised(3 * pg, 3 * pg) -- pages 3..5: accessed-by was set on pages 2 and 3 only
    assert.same({ "cpu", "cpu", {}, 0 }, { b.preferred_location, b.last_prefetch_location, b.accessed_by,
                                          b.accessed_by_cpu == "mixed" and 0 or 1 })
    local c = t:advised(0, 4 * pg)
    assert.equal("mixed", c.preferred_location)
    t:advise(0, 16 * pg, "unset_preferred_location", "cpu")
    t:advise(0, 16 * pg, "unset_accessed_by", "gpu")
    t:advise(0, 16 * pg, "unset_accessed_by", "cpu")
    local d = t:advised()
    assert.same({ "none", {} }, { d.preferred_location, d.accessed_by })
  end)

  it("reads read_mostly as true, false or mixed", function()
    local t, pg = table16()
    t:advise(0, 2 * pg, "read_mostly", "gpu")
    assert.is_true(t:advised(0, 2 * pg).read_mostly)
    assert.equal("mixed", t:advised(0, 3 * pg).read_mostly)
    t:advise(0, pg, "unset_read_mostly", "gpu")
    assert.is_false(t:advised(0, pg).read_mostly)
  end)

  it("takes offsets within a view", function()
    local t = ur.uvm_tensor({ 64, 1024 }, 0) -- one 4 KiB page per row
    local v = t:view(10, 4)
    local r = v:advise(1024, 1024, "preferred_location", "cpu")
    assert.same({ 11 * 4096, 12 * 4096 }, { r.byte_begin, r.byte_end })
    assert.equal("cpu", t:advised(11 * 1024, 1024).preferred_location)
    assert.equal("none", t:advised(10 * 1024, 1024).preferred_location)
  end)

  it("rounds to a larger page when told to", function()
    local t = ur.uvm_tensor({ 64 * 1024 }, 0)
    ur.set_hint_page_bytes(65536)
    local r = t:advise(100, 10, "accessed_by", "cpu")
    assert.same({ 0, 65536, true }, { r.byte_begin, r.byte_end, r.rounded })
    assert.has_error(function() ur.set_hint_page_bytes(3000) end,
      "hint page size: 3000 bytes; expected a power of two from 4096 to 2097152")
  end)

  it("accepts every spelling of a location", function()
    local t = table16()
    for _, loc in ipairs { "cpu", -1, "gpu", "cuda:0", 0 } do
      assert.truthy(t:advise(0, 1, "accessed_by", loc))
    end
    if not ur.gpu() then
      t:advise(0, 1, "preferred_location", "gpu")
      assert.equal("cuda:0", last_log().location) -- the current GPU, recorded as the first
    end
  end)

  it("rejects hints on tensors that are not managed, and bad ranges, advice and locations", function()
    local host = ur.tensor({ 4 })
    assert.has_error(function() host:advise(0, 4, "read_mostly", "cpu") end,
      "advise: memory hints need a managed tensor; got tensor f32 [4] host 16 B")
    local t = table16()
    local n0 = #ur.hint_log()
    local range_msg = "range offset %d, numel %d is outside the tensor's 16384 elements"
    for _, bad in ipairs { { -1, 4 }, { 0, 0 }, { 16380, 5 }, { 16384, 1 } } do
      assert.has_error(function() t:advise(bad[1], bad[2], "read_mostly", "cpu") end,
        ("advise: " .. range_msg .. "; expected 0 <= offset, 1 <= numel, offset + numel <= 16384")
          :format(bad[1], bad[2]))
      assert.has_error(function() t:prefetch(bad[1], bad[2], "cpu") end)
      assert.has_error(function() t:advised(bad[1], bad[2]) end)
    end
    assert.has_error(function() t:advise(0, 4, "prefer_gpu", "cpu") end,
      "advice: 'prefer_gpu' is not a memory advice; expected preferred_location, unset_preferred_location, " ..
      "accessed_by, unset_accessed_by, read_mostly or unset_read_mostly (or CUDA's cudaMemAdvise* names)")
    assert.has_error(function() t:advise(0, 4, "accessed_by", "tpu") end,
      "location: 'tpu' is not a location; expected cpu, gpu, cuda:N or a device number " ..
      "(-1 for the CPU, 0..63 for a GPU)")
    assert.has_error(function() t:prefetch(0, 4, {}) end)
    assert.equal(n0, #ur.hint_log()) -- nothing rejected was recorded
  end)

  it("refuses a GPU that does not exist when there is one", function()
    if not ur.gpu() then pending("no GPU: every cuda:N up to 63 is recorded") return end
    local t = table16()
    assert.has_error(function() t:advise(0, 4, "accessed_by", "cuda:" .. ur.devices()) end)
  end)

  it("says that residency and the migration monitor need a GPU", function()
    if ur.gpu() then pending("this machine has a GPU (see cuda_spec)") return end
    local t = table16()
    local r, err = t:residency()
    assert.is_nil(r)
    assert.matches("residency: measuring where pages are needs a GPU", err)
    local ok, err2 = ur.monitor.start()
    assert.is_nil(ok)
    assert.matches("monitor: measuring migration needs a GPU and CUPTI", err2)
  end)
end)
