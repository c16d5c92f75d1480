local ffi = require "ffi"
local ur = require "uvmrec"
local h = require "helpers"

-- Philox4x32-10 (Salmon et al., SC'11), written out here as the reference.
local M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
local TWO32 = 4294967296

local function mulhilo(a, b)
  local p = ffi.cast("uint64_t", a) * b
  return tonumber(p / TWO32), tonumber(p % TWO32)
end

local function xor(a, b) return bit.bxor(a, b) % TWO32 end

local function philox(counter, seed)
  local c0, c1, c2, c3 = counter % TWO32, math.floor(counter / TWO32), 0, 0
  local k0, k1 = seed % TWO32, math.floor(seed / TWO32)
  for _ = 1, 10 do
    local hi0, lo0 = mulhilo(M0, c0)
    local hi1, lo1 = mulhilo(M1, c2)
    c0, c1, c2, c3 = xor(xor(hi1, c1), k0), lo1, xor(xor(hi0, c3), k1), lo0
    k0, k1 = (k0 + W0) % TWO32, (k1 + W1) % TWO32
  end
  return c0, c1, c2, c3
end

local function u01(w) return (math.floor(w / 256) + 1) / 16777216 end
local function f32(v) return tonumber(ffi.new("float", v)) end

local function ref_uniform(i, seed, a, b) return a + (b - a) * (1 - u01((philox(i, seed)))) end
local function ref_normal(i, seed, mean, std)
  local w0, w1 = philox(i, seed)
  return mean + std * math.sqrt(-2 * math.log(u01(w0))) * math.cos(2 * math.pi * u01(w1))
end

describe("uvmrec tensor random init", function()
  it("matches Philox4x32-10's published answer for counter 0, key 0", function()
    assert.same({ 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 }, { philox(0, 0) })
    local t = ur.tensor({ 1 }):uniform(0, 1, 0)
    assert.equal((16777216 - 0x6627e8 - 1) / 16777216, t[0])
  end)

  it("draws uniform and normal numbers equal to the reference, element by element", function()
    for _, seed in ipairs { 1, 42, 2 ^ 40 + 7 } do
      local u = ur.tensor({ 257, 3 }):uniform(-0.25, 0.75, seed)
      local n = ur.tensor({ 257, 3 }):normal(1, 2, seed)
      local uv, nv = u:totable(), n:totable()
      for i = 0, 770 do
        assert.equal(f32(ref_uniform(i, seed, -0.25, 0.75)), uv[i + 1])
        h.near(nv[i + 1], f32(ref_normal(i, seed, 1, 2)), 1e-6, "normal " .. i)
      end
    end
  end)

  it("gives a view the numbers of the same elements of its tensor", function()
    local t = ur.tensor({ 100, 8 }):normal(0, 1, 9)
    local v = ur.tensor({ 100, 8 }):view(30, 5):normal(0, 1, 9)
    assert.same(t:totable(240, 40), v:totable())
  end)

  it("is deterministic for a seed and differs across seeds", function()
    local a = ur.tensor({ 1000 }):uniform(0, 1, 5):totable()
    local b = ur.tensor({ 1000 }):uniform(0, 1, 5):totable()
    local c = ur.tensor({ 1000 }):uniform(0, 1, 6):totable()
    assert.same(a, b)
    local same = 0
    for i = 1, 1000 do if a[i] == c[i] then same = same + 1 end end
    assert.is_true(same < 5)
  end)

  it("has the moments of its distribution", function()
    local n = 200000
    local u = ur.tensor({ n }):uniform(-2, 3, 11):totable()
    local z = ur.tensor({ n }):normal(1, 2, 12):totable()
    local su, lo, hi, sz, szz = 0, math.huge, -math.huge, 0, 0
    for i = 1, n do
      su, lo, hi = su + u[i], math.min(lo, u[i]), math.max(hi, u[i])
      sz, szz = sz + z[i], szz + z[i] * z[i]
    end
    assert.is_true(lo >= -2 and hi < 3)
    h.near(su / n, 0.5, 0.02, "uniform mean")
    h.near(sz / n, 1, 0.02, "normal mean")
    h.near(math.sqrt(szz / n - (sz / n) ^ 2), 2, 0.02, "normal std")
  end)

  it("rounds half types from the f32 value, and floors into integer types", function()
    for _, dt in ipairs { "bf16", "f16" } do
      local half = ur.tensor({ 500 }, { dtype = dt }):normal(0, 3, 4)
      local want = ur.tensor({ 500 }, { dtype = dt })
      local full = ur.tensor({ 500 }):normal(0, 3, 4):totable()
      for i = 1, 500 do want[i - 1] = full[i] end
      assert.same(want:totable(), half:totable(), dt)
    end
    local counts = {}
    local ids = ur.tensor({ 20000 }, { dtype = "i32" }):uniform(0, 10, 3):totable()
    for _, v in ipairs(ids) do counts[v] = (counts[v] or 0) + 1 end
    for v = 0, 9 do h.near(counts[v] / 20000, 0.1, 0.01, "share of " .. v) end
    assert.is_nil(counts[10])
  end)

  it("rejects bounds that make no distribution", function()
    local t = ur.tensor({ 4 })
    assert.has_error(function() t:uniform(3, 1, 0) end,
      "tensor rand: uniform bounds [3, 1) are not finite with low <= high")
    assert.has_error(function() t:normal(0, -1, 0) end,
      "tensor rand: normal(mean 0, std -1) needs finite values and std >= 0")
    assert.has_error(function() t:uniform(0, math.huge, 0) end)
    assert.has_error(function() ur.tensor({ 4 }, { dtype = "i8" }):uniform(0, 300, 0) end,
      "tensor rand high - 1: 299 is not an integer that fits i8 (-128..127)")
  end)
end)
