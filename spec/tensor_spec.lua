local ffi = require "ffi"
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
    -- a span whose end passes 64 bits says where it starts and how long it is (its end wrapped)
    local big = ffi.new("int64_t", 2) ^ 63 - 1
    local C, out = ur.C, ffi.new("ur_tensor *[1]")
    assert.equal(C.UR_STATUS_INVALID, C.ur_tensor_view(t.p, out, 2, big))
    assert.equal("tensor view: rows 9223372036854775807 of them from 2 (9223372036854775807 rows) are outside the "
                 .. "tensor's 6 rows", ffi.string(C.ur_last_error()))
    assert.equal(C.UR_STATUS_INVALID, C.ur_tensor_read(t.p, 2, big, ffi.new("float[1]")))
    assert.equal("tensor read: elements 9223372036854775807 of them from 2 are outside the tensor's 24 elements "
                 .. "(0-based)", ffi.string(C.ur_last_error()))
  end)

  it("rejects a view_as offset past the storage, also one whose sum with the view's own overflows", function()
    local v = ur.tensor({ 4, 3 }):fill(1):view(1, 2)
    local huge = ffi.new("int64_t", 2 ^ 62)
    huge = huge + (huge - 1) -- 2^63 - 1: from the view's element 3 it wraps below the storage
    assert.has_error(function() v:view_as(huge, { 1 }) end,
      "tensor view_as: 1 elements at offset 9223372036854775807 from element 3 pass the storage's 12 elements")
    assert.has_error(function() v:view_as(-4, { 1 }) end,
      "tensor view_as: 1 elements at offset -4 from element 3 pass the storage's 12 elements")
    assert.equal(1, v:view_as(-3, { 1 })[0])
    -- a zero dimension does not excuse the others: the rest make at most the largest tensor's bytes
    local big = 2 ^ 62
    local over = "f32 [0, 4611686018427387904, 4]; expected a shape whose dimensions other than 0 make at most "
      .. "2^50 bytes (the largest tensor)"
    assert.has_error(function() v:view_as(0, { 0, big, 4 }) end, "tensor view_as: " .. over)
    assert.has_error(function() ur.tensor({ 0, big, 4 }) end, "tensor: " .. over)
    assert.has_error(function() ur.tensor({ 0, 2 ^ 48 + 1 }) end,
      "tensor: f32 [0, 281474976710657]; expected a shape whose dimensions other than 0 make at most 2^50 bytes "
      .. "(the largest tensor)")
    assert.equal(0, v:view_as(0, { 0, 2 ^ 48, 1 }):numel())
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

  h.cuda_it("reads any span of a device tensor exactly: small ones by a kernel, bigger ones by the copy engines",
    function()
      local n = 5000 -- i8 spans of more than 4096 bytes, the kernel's page, take the copy engines
      for _, dtype in ipairs { "f64", "f32", "bf16", "i8" } do
        local src = ur.tensor({ n }, { dtype = dtype }):uniform(-100, 100, 11)
        local want = src:totable()
        local t = assert(src:to("device"))
        -- word-aligned and not, at the page's size and past it, the whole tensor, the last element
        for _, span in ipairs { { 0, 1 }, { 3, 5 }, { 1, 511 }, { 2, 512 }, { 7, 4097 }, { 0, n }, { n - 1, 1 } } do
          local first, count = span[1], span[2]
          local expect = {}
          for i = 1, count do expect[i] = want[first + i] end
          assert.same(expect, t:totable(first, count), ("%s, %d elements from %d"):format(dtype, count, first))
        end
      end
    end)

  h.cuda_it("a small read waits for its own stream only, not for a big copy the copy engines make for another",
    function()
      local streams = require "uvmrec.stream"
      local clock = ur.C.ur_clock_seconds
      local n = 64 * 1024 * 1024 -- f32: 256 MiB from HBM to pinned memory, milliseconds over the link
      local big = assert(ur.tensor({ n }, { placement = "device" }))
      local host = assert(ur.tensor({ n }, { placement = "pinned" }))
      local small = assert(assert(ur.tensor({ 16 }, { placement = "device" })):fill(3))
      local side = assert(streams.stream())
      assert.equal(3, small:get(0)) -- the first read makes the thread's pinned page
      local t0 = clock()
      assert(host:copy(big, side))
      assert(side:sync())
      local alone = clock() - t0
      assert(host:copy(big, side))
      local t1 = clock()
      local v = small:get(5)
      local read = clock() - t1
      assert(side:sync())
      big:free()
      host:free()
      side:free()
      assert.equal(3, v)
      -- under compute-sanitizer a kernel launch alone takes milliseconds: the value is checked, not the time
      if not os.getenv("UVMREC_SANITIZER") then
        assert.is_true(read < alone / 4, ("a read of 4 bytes took %.3f ms beside a copy of %.3f ms"):format(
          read * 1e3, alone * 1e3))
      end
    end)

  h.cuda_it("a thread that made small reads ends without waiting for the GPU's other work (its page kept)",
    function()
      local command = require "command"
      local dir = command.tmpdir()
      local exe, why = h.build_c("engine/tests/read_threads.c", dir, "read_threads")
      if not exe then return pending(why) end
      -- under compute-sanitizer the values are checked, not the times
      local out, err, code = command.sh(exe .. " 4" .. (os.getenv("UVMREC_SANITIZER") and " values" or ""))
      command.rmdir(dir)
      assert.equal(0, code, out .. err)
      assert.matches("read_threads: ok", out)
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
    -- 2^63 - 1 is no double: i64's last is 2^63 - 1024, and 2^63 does not fit
    local i64 = ur.tensor({ 2 }, { dtype = "i64" })
    i64[0], i64[1] = 2 ^ 63 - 1024, -2 ^ 63
    assert.same({ 2 ^ 63 - 1024, -2 ^ 63 }, i64:totable())
    assert.has_error(function() i64[0] = 2 ^ 63 end,
      "tensor set: 9.2233720368547758e+18 is not an integer that fits i64 (-9223372036854775808..9223372036854775807)")
    assert.has_error(function() i64:fill(2 ^ 63) end)
  end)

  it("rejects bad shapes, dtypes, placements, devices and indices", function()
    assert.has_error(function() ur.tensor({ 2, -1 }) end,
      "tensor: size 2 of the shape is -1; expected a whole number >= 0")
    assert.has_error(function() ur.tensor({ 1, 1, 1, 1, 1 }) end)
    assert.has_error(function() ur.tensor({ 2 }, { dtype = "f128" }) end,
      "dtype: 'f128' is not a dtype; expected f32, bf16, f16, i8, u8, i32, i64 or f64")
    assert.has_error(function() ur.tensor({ 2 }, { placement = "gpu" }) end,
      "placement: 'gpu' is not a placement; expected host, pinned, device or managed")
    -- options that were passed over, giving an f32 host tensor (refused at the caller's line)
    h.raises_at_caller(function() ur.tensor({ 2 }, "i32") end,
      'tensor: options are string i32; expected a table such as {dtype = "i32"}')
    h.raises_at_caller(function() ur.tensor({ 2 }, { dtyp = "i32" }) end,
      "tensor: unknown option 'dtyp'; expected dtype, placement, device")
    h.raises_at_caller(function() ur.uvm_tensor({ 2 }, "i32") end,
      'tensor: options are string i32; expected a table such as {dtype = "i32"}')
    h.raises_at_caller(function() ur.uvm_tensor({ 2 }, { dtyp = "i32" }) end,
      "tensor: unknown option 'dtyp'; expected dtype, device (a managed tensor's placement is managed)")
    assert.has_error(function() ur.uvm_tensor({ 2 }, { placement = "host" }) end,
      "tensor: unknown option 'placement'; expected dtype, device (a managed tensor's placement is managed)")
    -- one value, so that the REPL shows the tensor and no nil after it
    assert.equal(1, select("#", ur.tensor({ 2 })))
    assert.equal(1, select("#", ur.uvm_tensor({ 2 }, -1)))
    assert.has_error(function() ur.tensor({ 2 }, { device = 0 }) end)
    assert.has_error(function() ur.tensor({ 2 ^ 40, 2 ^ 20 }) end)
    local t = ur.tensor({ 3 })
    assert.has_error(function() return t[3] end,
      "tensor get: elements 3..3 are outside the tensor's 3 elements (0-based)")
    assert.has_error(function() return t[0.5] end, "tensor get: element index is 0.5; expected a whole number")
    assert.has_error(function() t[1.5] = 1 end, "tensor set: element index is 1.5; expected a whole number")
    assert.has_error(function() t.x = 1 end)
  end)

  it("takes whole numbers where the engine takes an integer, and names any other value", function()
    -- each was cast: inf to -2^63 ("dimension 1 is -9223372036854775808"), 2.5 to 2, 0.5 to 0
    assert.has_error(function() ur.tensor({ math.huge }) end,
      "tensor: size 1 of the shape is inf; expected a whole number below 2^63")
    assert.has_error(function() ur.tensor({ 2, 2 ^ 63 }) end,
      "tensor: size 2 of the shape is 9.2233720368548e+18; expected a whole number below 2^63")
    local t = ur.tensor({ 4, 2 }):uniform(0, 1, 3)
    assert.has_error(function() t:view(1, 2.5) end, "tensor view: nrows is 2.5; expected a whole number")
    assert.has_error(function() t:view(0.5, 1) end, "tensor view: row0 is 0.5; expected a whole number")
    assert.has_error(function() t:view(0, math.huge) end,
      "tensor view: nrows is inf; expected a whole number below 2^63")
    assert.has_error(function() t:view_as(0.5, { 2 }) end, "tensor view_as: offset is 0.5; expected a whole number")
    assert.has_error(function() t:totable(0.5, 2) end, "tensor totable: first is 0.5; expected a whole number")
    assert.has_error(function() t:totable(1, 1.5) end, "tensor totable: count is 1.5; expected a whole number")
    -- a count past the tensor is the engine's range error, not a failed allocation of its buffer
    assert.has_error(function() t:totable(0, 2 ^ 40) end,
      "tensor read: elements 0..1099511627775 are outside the tensor's 8 elements (0-based)")
    assert.has_error(function() t:totable(0, math.huge) end,
      "tensor totable: count is inf; expected a whole number below 2^63")
    assert.has_error(function() return t[math.huge] end,
      "tensor get: element index is inf; expected a whole number below 2^63")
    assert.has_error(function() return t[0 / 0] end,
      ("tensor get: element index is %s; expected a whole number"):format(tostring(0 / 0)))
    -- size(i): 0 and 3 were -1, 1.5 the first dimension
    for _, i in ipairs { 0, 3, 1.5 } do
      assert.has_error(function() t:size(i) end,
        ("tensor size: dimension is %s; expected a whole number from 1 to 2"):format(tostring(i)))
    end
    assert.equal(2, t:size(2))
    -- 64-bit integers are whole numbers: t[5LL] was nil (looked up among the methods)
    t[5LL] = 0.25
    assert.equal(0.25, t[5LL])
    assert.equal(0.25, t:get(5ULL))
    assert.same(t:totable(2, 3), t:totable(2LL, 3LL))
    assert.same(t:view(1, 2):totable(), t:view(1LL, 2LL):totable())
    assert.same({ 2, 3 }, ur.tensor({ 2LL, 3ULL }):size())
    assert.has_error(function() ur.tensor({ 2, -3LL }) end,
      "tensor: size 2 of the shape is -3LL; expected a whole number >= 0")
  end)

  it("raises misuse at the caller's line: shapes, dtypes, placements, devices, advice, ranges, indices", function()
    local t = ur.uvm_tensor({ 64, 4 })
    local file = debug.getinfo(1, "S").short_src
    local function at(line, f)
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.equal(file .. ":" .. line .. ":", tostring(err):match("^[^:]*:%d+:"), tostring(err))
    end
    local l = debug.getinfo(1, "l").currentline
    at(l + 1, function() local x = ur.tensor({ 2, -1 }) return x end)
    at(l + 2, function() local x = ur.tensor({}) return x end)
    at(l + 3, function() local x = ur.uvm_tensor({ -2 }) return x end)
    at(l + 4, function() local x = ur.tensor({ 2 }, { dtype = "f8" }) return x end)
    at(l + 5, function() local x = ur.tensor({ 2 }, { placement = "gpu" }) return x end)
    at(l + 6, function() local x = ur.tensor({ 2 }, { placement = "managed", device = "mars" }) return x end)
    at(l + 7, function() local x = t:to("mars") return x end)
    at(l + 8, function() local x = t:view_as(0, { -1 }) return x end)
    at(l + 9, function() local x = t:advise(0, 8, "bogus", "cpu") return x end)
    at(l + 10, function() local x = t:advise(0, 8, "preferred_location", "mars") return x end)
    at(l + 11, function() local x = t:prefetch(0, 8, "mars") return x end)
    at(l + 12, function() local x = t:advise(0, 1000, "preferred_location", "cpu") return x end)
    at(l + 13, function() local x = t:fill("x") return x end)
    at(l + 14, function() local x = t[1000] return x end)
    at(l + 15, function() t[1000] = 1 end)
    at(l + 16, function() local x = t:get(1000) return x end)
    at(l + 17, function() local x = t:view(60, 10) return x end)
    at(l + 18, function() local x = ur.uvm_tensor({ 2 }, { dtyp = "i32" }) return x end)
  end)

  h.no_gpu_it("reports device placement without a GPU as an environmental failure", function()
    local t, err = ur.tensor({ 2 }, { placement = "device" })
    assert.is_nil(t)
    assert.matches("placement 'device' needs a GPU", err)
  end)

  h.asan_it("shows the address sanitizer a read one element past a tensor's end (make SAN=1)", function()
    -- host storage was whole pages: a read past a tensor's last element stayed in the last one
    assert.equal("heap-buffer-overflow", h.asan_over_read('t = ur.tensor({ 3 })'))
    assert.equal("heap-buffer-overflow", h.asan_over_read('t = ur.tensor({ 5 }, { dtype = "i64" }):view(1, 4)'))
    if ur.gpu() then return end -- pinned and managed memory are the driver's then
    assert.equal("heap-buffer-overflow", h.asan_over_read('t = ur.tensor({ 3 }, { placement = "pinned" })'))
    -- managed storage keeps whole hint pages: past its bytes they are poisoned
    assert.equal("use-after-poison", h.asan_over_read('t = ur.tensor({ 3 }, { placement = "managed" })'))
  end)
end)

local philox = h.philox

local function u01(w) return (math.floor(w / 256) + 1) / 16777216 end
local function f32(v) return tonumber(ffi.new("float", v)) end

local function ref_uniform(i, seed, a, b) return a + (b - a) * (1 - u01((philox(i, seed)))) end
local function ref_normal(i, seed, mean, std)
  local w0, w1 = philox(i, seed)
  return mean + std * math.sqrt(-2 * math.log(u01(w0))) * math.cos(2 * math.pi * u01(w1))
end

describe("uvmrec.tensor.dtype_bytes", function()
  it("gives an element's bytes by the dtype's name, and names an unknown one", function()
    local T = require "uvmrec.tensor"
    assert.same({ 4, 2, 2, 1, 1, 4, 8, 8 }, { T.dtype_bytes("f32"), T.dtype_bytes("bf16"), T.dtype_bytes("f16"),
      T.dtype_bytes("i8"), T.dtype_bytes("u8"), T.dtype_bytes("i32"), T.dtype_bytes("i64"), T.dtype_bytes("f64") })
    assert.has_error(function() T.dtype_bytes("f24") end)
  end)
end)

describe("uvmrec.tensor random init", function()
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

  it("takes a seed that is a whole number from 0 to below 2^63, an int64_t from 0 or any uint64_t", function()
    -- the cast drew seed 1's numbers for 1.5, seed 0's for 2^64, one set for -1, inf and NaN
    local t = ur.tensor({ 4 })
    for _, bad in ipairs { { 1.5, ">= 0" }, { -1, ">= 0" }, { 0 / 0, ">= 0" }, { 2 ^ 64, "below 2^63" },
                           { math.huge, "below 2^63" }, { "7", ">= 0" } } do
      assert.has_error(function() t:normal(0, 1, bad[1]) end,
        ("tensor rand: seed is %s; expected a whole number %s"):format(tostring(bad[1]), bad[2]))
      assert.has_error(function() t:uniform(0, 1, bad[1]) end,
        ("tensor rand: seed is %s; expected a whole number %s"):format(tostring(bad[1]), bad[2]))
    end
    local a = t:normal(0, 1, 7):totable()
    assert.same(a, t:normal(0, 1, 7ULL):totable())
    assert.same(a, t:normal(0, 1, 7LL):totable())
    -- every uint64_t is a seed (the tables draw theirs as one); an int64_t below 0 is not
    assert.are_not.same(a, t:normal(0, 1, 0xD1B54A32D192ED03ULL):totable())
    assert.has_error(function() t:normal(0, 1, -1LL) end, "tensor rand: seed is -1LL; expected a whole number >= 0")
    assert.are_not.same(a, t:normal(0, 1, 8):totable())
    assert.same(t:uniform(0, 1, 0):totable(), t:uniform(0, 1):totable())
  end)

  it("names a bound, mean or std that is no number", function()
    -- each failed in the FFI's words: "bad argument #4 to 'ur_tensor_rand' (cannot convert 'string' to 'double')"
    local t = ur.tensor({ 4 })
    assert.has_error(function() t:uniform("0", 1, 1) end, "tensor rand: uniform low is string 0; expected a number")
    assert.has_error(function() t:uniform(0, true, 1) end,
      "tensor rand: uniform high is boolean true; expected a number")
    assert.has_error(function() t:normal(0, "1", 1) end, "tensor rand: normal std is string 1; expected a number")
    assert.has_error(function() t:normal(false) end, "tensor rand: normal mean is boolean false; expected a number")
  end)
end)

-- Memory hints on managed tensors (advise, prefetch, advised) and the engine's record of them:
-- 16 pages of f32 at the default 4 KiB hint page.
local function table16()
  local t = ur.uvm_tensor({ 16 * 1024 }, 0)
  return t, 1024 -- elements per page
end

local function last_log() local l = ur.hint_log() return l[#l] end
-- The seq of the newest record (0 for none): the log keeps only its newest records, so a count
-- of its entries stops growing once it is full, and specs count by seq instead.
local function last_seq() local l = last_log() return l and l.seq or 0 end

describe("uvmrec.tensor memory hints", function()
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
    local before = last_seq()
    t:advise(0, 4 * pg, "read_mostly", "cpu")
    t:prefetch(pg, pg, "cuda:0")
    t:advise(0, pg, "cudaMemAdviseSetAccessedBy", -1)
    local log = ur.hint_log(before)
    assert.equal(3, #log)
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
    local n0 = last_seq()
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
    -- a fraction was cast: advise(0.5, 2.7) advised elements 0 and 1
    assert.has_error(function() t:advise(0.5, 4, "read_mostly", "cpu") end,
      "advise: offset is 0.5; expected a whole number")
    assert.has_error(function() t:prefetch(0, 2.7, "cpu") end, "prefetch: numel is 2.7; expected a whole number")
    assert.has_error(function() t:advised(0, math.huge) end,
      "advised: numel is inf; expected a whole number below 2^63")
    assert.has_error(function() t:residency(1.5) end, "residency: offset is 1.5; expected a whole number")
    assert.equal(n0, last_seq()) -- nothing rejected was recorded
  end)

  -- without one every cuda:N up to 63 is recorded
  h.cuda_it("refuses a GPU that does not exist when there is one", function()
    local t = table16()
    assert.has_error(function() t:advise(0, 4, "accessed_by", "cuda:" .. ur.devices()) end)
  end)

  h.no_gpu_it("says that residency and the migration monitor need a GPU", function() -- with one: cuda_spec
    local t = table16()
    local r, err = t:residency()
    assert.is_nil(r)
    assert.matches("residency: measuring where pages are needs a GPU", err)
    local ok, err2 = ur.monitor.start()
    assert.is_nil(ok)
    assert.matches("monitor: measuring migration needs a GPU and CUPTI", err2)
  end)
end)
