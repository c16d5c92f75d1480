local ur = require "uvmrec"
local h = require "helpers"

local ranges = { i8 = { -128, 127 }, u8 = { 0, 255 }, i32 = { -2 ^ 31, 2 ^ 31 - 1 },
                 i64 = { -2 ^ 53, 2 ^ 53 } }

describe("uvmrec.tensor", function()
  it("holds every dtype in every placement this machine has, exactly where exact", function()
    for _, place in ipairs(h.placements()) do
      for _, dt in ipairs(h.dtypes) do
        local t = assert(ur.tensor({ 3, 5 }, { placement = place, dtype = dt }))
        assert.same({ 3, 5 }, t:size())
        assert.equal(15, t:numel())
        assert.equal(dt, t:dtype())
        assert.equal(place, t:placement())
        local vals = { 1, -2, 3.5, 100, 0 }
        if ranges[dt] then vals = { ranges[dt][1], ranges[dt][2], 7, 0, 1 } end
        for i, v in ipairs(vals) do t[i * 3 - 1] = v end
        for i, v in ipairs(vals) do assert.equal(v, t[i * 3 - 1], dt .. " " .. place) end
        t:free()
      end
    end
  end)

  it("rounds f16 and bf16 to nearest even", function()
    local b = ur.tensor({ 4 }, { dtype = "bf16" })
    b[0] = 1 + 2 ^ -8          -- halfway between 1 and 1+2^-7: rounds to even (1)
    b[1] = 1 + 3 * 2 ^ -8      -- halfway between 1+2^-7 and 1+2^-6: rounds to even (1+2^-6)
    b[2] = -1.5 * 2 ^ 127      -- large, exact
    b[3] = 2 ^ -130            -- subnormal in bf16's range
    assert.same({ 1, 1 + 2 ^ -6, -1.5 * 2 ^ 127, 2 ^ -130 }, b:totable())
    local f = ur.tensor({ 5 }, { dtype = "f16" })
    f[0] = 1 + 2 ^ -11         -- halfway: to even (1)
    f[1] = 65504               -- largest finite
    f[2] = 65520               -- rounds to infinity
    f[3] = 2 ^ -24             -- smallest subnormal
    f[4] = 3 * 2 ^ -26         -- 0.75 of the smallest subnormal: rounds up to it
    assert.same({ 1, 65504, math.huge, 2 ^ -24, 2 ^ -24 }, f:totable())
  end)

  it("describes itself in one line: dtype, shape, placement, device, bytes", function()
    local t = ur.tensor({ 1024, 128 }, { dtype = "f16" })
    assert.equal("tensor f16 [1024, 128] host 256.0 KiB", t:describe())
    t:fill(0.5)
    assert.equal("tensor f16 [1024, 128] host 256.0 KiB {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, ...}", tostring(t))
    local u = ur.uvm_tensor({ 10 }, 0)
    assert.matches("^tensor f32 %[10%] managed cuda:0", u:describe())
    assert.equal("tensor (freed)", (function() u:free() return tostring(u) end)())
  end)

  it("shares storage between a view and its tensor, and outlives the tensor", function()
    local t = ur.tensor({ 6, 4 }, { dtype = "i32" })
    for i = 0, 23 do t[i] = i end
    local v = t:view(2, 3)
    assert.same({ 3, 4 }, v:size())
    assert.equal(t:id(), v:id())
    assert.equal(2, t:refs())
    assert.same({ 8, 9, 10, 11 }, v:totable(0, 4))
    v[0] = -1
    assert.equal(-1, t[8])
    local vv = v:view(1, 1)
    assert.same({ 12, 13, 14, 15 }, vv:totable())
    t:free()
    t:free() -- harmless
    assert.equal(2, v:refs())
    assert.equal(-1, v[0])
    assert.matches("view at element 8 of storage", v:describe())
    assert.has_error(function() return t:numel() end, "tensor: used after free()")
  end)

  it("rejects views outside the rows", function()
    local t = ur.tensor({ 6, 4 })
    assert.has_error(function() t:view(5, 2) end,
      "tensor view: rows 5..6 (2 rows) are outside the tensor's 6 rows")
    assert.has_error(function() t:view(-1, 1) end)
  end)

  it("copies between every pair of placements", function()
    local src = ur.tensor({ 64, 3 }, { dtype = "f32" }):uniform(-1, 1, 7)
    local want = src:totable()
    for _, a in ipairs(h.placements()) do
      local ta = assert(src:to(a))
      for _, b in ipairs(h.placements()) do
        local tb = assert(ur.tensor({ 192 }, { placement = b }))
        assert(tb:copy(ta))
        assert.same(want, tb:totable(), a .. " -> " .. b)
      end
    end
  end)

  it("refuses copies whose dtype or size differ, and overlapping ones", function()
    local a = ur.tensor({ 4, 2 })
    assert.has_error(function() ur.tensor({ 4, 2 }, { dtype = "f16" }):copy(a) end,
      "tensor copy: source is f32 [4, 2] but destination is f16 [4, 2]; dtype and element count must match")
    assert.has_error(function() ur.tensor({ 9 }):copy(a) end)
    local big = ur.tensor({ 4, 2 })
    assert.has_error(function() big:view(0, 2):copy(big:view(1, 2)) end)
  end)

  it("fills every dtype, and rejects values a dtype cannot hold", function()
    for _, dt in ipairs(h.dtypes) do
      local v = dt == "u8" and 3 or -3
      local t = ur.tensor({ 1000 }, { dtype = dt }):fill(v)
      assert.same({ v, v }, { t[0], t[999] })
    end
    assert.has_error(function() ur.tensor({ 2 }, { dtype = "u8" }):fill(-3) end,
      "tensor fill: -3 is not an integer that fits u8 (0..255)")
    assert.has_error(function() ur.tensor({ 2 }, { dtype = "i8" }):fill(1.5) end)
    assert.has_error(function() ur.tensor({ 2 }, { dtype = "i32" })[0] = 2 ^ 31 end)
  end)

  it("rejects bad shapes, dtypes, placements, devices and indices", function()
    assert.has_error(function() ur.tensor({ 2, -1 }) end,
      "tensor: size 2 of the shape is -1; expected a whole number >= 0")
    assert.has_error(function() ur.tensor({ 1, 1, 1, 1, 1 }) end)
    assert.has_error(function() ur.tensor({ 2 }, { dtype = "f64" }) end,
      "dtype: 'f64' is not a dtype; expected f32, bf16, f16, i8, u8, i32 or i64")
    assert.has_error(function() ur.tensor({ 2 }, { placement = "gpu" }) end,
      "placement: 'gpu' is not a placement; expected host, pinned, device or managed")
    assert.has_error(function() ur.tensor({ 2 }, { device = 0 }) end)
    assert.has_error(function() ur.tensor({ 2 ^ 40, 2 ^ 20 }) end)
    local t = ur.tensor({ 3 })
    assert.has_error(function() return t[3] end,
      "tensor get: elements 3..3 are outside the tensor's 3 elements (0-based)")
    assert.has_error(function() t.x = 1 end)
  end)

  it("reports device placement without a GPU as an environmental failure", function()
    if ur.gpu() then pending("this machine has a GPU") return end
    local t, err = ur.tensor({ 2 }, { placement = "device" })
    assert.is_nil(t)
    assert.matches("placement 'device' needs a GPU", err)
  end)
end)
