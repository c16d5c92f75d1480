-- Quantized rows and collections (uvmrec.qtbe, ur_rows_quantize, ur_qtbe_*): rows quantized to
-- each format against a plain reference of the format written here (the f16 scale and bias
-- each row must get, its codes, their packing), round trips within each format's bound, the
-- forward (pooled sum and mean, weighted, unpooled, ids taken modulo, a row permutation) against
-- a float64 reference over the dequantized rows, f32 tables giving the EmbeddingBagCollection's
-- bits, the bounds checks, and every documented error.
local ffi = require "ffi"
local ur = require "uvmrec"
local qtbe = require "uvmrec.qtbe"
local tbe = require "uvmrec.tbe"
local R = require "tbe_ref"
local compare = require "uvmrec.compare"
local wall_limit = require("helpers").seconds

local C = ur.C
local LEVELS = { int8 = 255, int4 = 15, int2 = 3 }
local BITS = { int8 = 8, int4 = 4, int2 = 2 }

local f32buf = ffi.new("float[1]")
local function f32(x)
  f32buf[0] = x
  return f32buf[0]
end

-- f16 from its bits, and the f16 values next to x, from the definition of the format.
local function f16_value(h)
  local sign = h >= 0x8000 and -1 or 1
  local e, m = math.floor(h / 1024) % 32, h % 1024
  if e == 0 then return sign * m * 2 ^ -24 end
  return sign * (1 + m / 1024) * 2 ^ (e - 15)
end

local function f16_ulp(a)  -- the spacing of f16 values at magnitude a
  if a < 2 ^ -14 then return 2 ^ -24 end
  return 2 ^ (math.floor(math.log(a) / math.log(2) + 1e-12) - 10)
end

-- The largest f16 <= x (down) or the smallest >= x (up).
local function f16_toward(x, up)
  local u = f16_ulp(math.abs(x))
  local v = (up and math.ceil(x / u) or math.floor(x / u)) * u
  -- crossing a power of two downward in magnitude can need the finer spacing below it
  local u2 = f16_ulp(math.abs(v) * (1 - 2 ^ -12))
  if u2 < u then v = (up and math.ceil(x / u2) or math.floor(x / u2)) * u2 end
  return v
end

-- Rows of a tensor as Lua lists of numbers (any dtype).
local rows_of = require("helpers").rows

-- A stored row in a format, decoded from its bytes by the layout uvmrec.h states.
local function decode(bytes, format, dim)
  local scale = f16_value(bytes[1] + 256 * bytes[2])
  local bias = f16_value(bytes[3] + 256 * bytes[4])
  local bits, per = BITS[format], 8 / BITS[format]
  local codes, vals = {}, {}
  for c = 0, dim - 1 do
    local byte = bytes[5 + math.floor(c / per)]
    local q = math.floor(byte / 2 ^ (bits * (c % per))) % 2 ^ bits
    codes[c + 1] = q
    vals[c + 1] = f32(q * scale + bias)
  end
  return vals, scale, bias, codes
end

-- Random rows of several kinds: spread around 0, all positive, large, tiny, constant, one spike.
local function sample_rows(n, dim, seed)
  math.randomseed(seed)
  local rows = {}
  for r = 1, n do
    local kind, row = r % 7, {}
    for c = 1, dim do
      local u = math.random() * 2 - 1
      row[c] = kind == 0 and u * 0.1 or kind == 1 and 0.2 + math.random() * 0.5 or kind == 2 and u * 300
               or kind == 3 and u * 1e-6 or kind == 4 and -0.375 or kind == 5 and (c == 3 and 2.5 or 0) or u * 0.01
    end
    rows[r] = row
  end
  return rows
end

local function tensor_of(rows, dtype)
  local dim = #rows[1]
  local t = assert(ur.tensor({ #rows, dim }, { dtype = dtype or "f32" }))
  for r, row in ipairs(rows) do
    for c, v in ipairs(row) do t[(r - 1) * dim + c - 1] = v end
  end
  return t
end

describe("uvmrec.qtbe rows", function()
  it("gives each format's row size", function()
    assert.equal(64, qtbe.row_bytes("f32", 16))
    assert.equal(32, qtbe.row_bytes("fp16", 16))
    assert.equal(20, qtbe.row_bytes("int8", 16))
    assert.equal(12, qtbe.row_bytes("int4", 16))
    assert.equal(8, qtbe.row_bytes("int2", 16))
    assert.equal(8, qtbe.row_bytes("int2", 12))  -- 4 + 3 code bytes, padded to 4
    assert.equal(4 + 512, qtbe.row_bytes("int4", 1024))
    assert.has_error(function() qtbe.row_bytes("int4", 6) end,
                     "quantized rows: dim 6 is not a multiple of 4 from 4 to 1024")
    assert.has_error(function() qtbe.row_bytes("int3", 16) end,
                     "table format 'int3'; expected f32, fp16, int8, int4 or int2")
  end)

  for _, format in ipairs { "int8", "int4", "int2" } do
    it("quantizes to " .. format .. " as the format says: bias and scale in f16, codes packed, within scale/2",
      function()
      for _, dim in ipairs { 4, 16, 36 } do
        local rows = sample_rows(70, dim, dim)
        local src = tensor_of(rows)
        local q, err = qtbe.quantize(src, format)
        assert.equal("u8", q:dtype())
        assert.same({ 70, qtbe.row_bytes(format, dim) }, q:size())
        local back = rows_of(qtbe.dequantize(q, format, dim))
        local stored = rows_of(q)
        local max_abs, sum_sq, max_ratio, big = 0, 0, 0, 0
        for r, row in ipairs(rows) do
          local x = {}
          for c = 1, dim do x[c] = f32(row[c]) end
          local lo, hi, amax = math.huge, -math.huge, 0
          for c = 1, dim do
            lo, hi, amax = math.min(lo, x[c]), math.max(hi, x[c]), math.max(amax, math.abs(x[c]))
          end
          local vals, scale, bias, codes = decode(stored[r], format, dim)
          -- the bias is the largest f16 not above the row's minimum; the scale the smallest f16
          -- not below (max - bias) / levels
          assert.equal(f16_toward(lo, false), bias)
          assert.equal(f16_toward(f32((hi - bias) / LEVELS[format]), true), scale)
          local bound = scale / 2 + 2 ^ -22 * amax
          for c = 1, dim do
            assert.equal(vals[c], back[r][c])          -- the engine's decode is the format's
            local want = scale > 0 and math.floor((x[c] - bias) / scale + 0.5) or 0
            local tie = scale > 0 and math.abs((x[c] - bias) / scale % 1 - 0.5) < 1e-4
            if not tie then assert.equal(math.min(want, LEVELS[format]), codes[c]) end
            local e = math.abs(x[c] - vals[c])
            assert.is_true(e <= bound, ("row %d col %d: |%.9g - %.9g| > %.3g"):format(r, c, x[c], vals[c], bound))
            max_abs, sum_sq = math.max(max_abs, e), sum_sq + e * e
            if bound > 0 then max_ratio = math.max(max_ratio, e / bound) end
            if scale > 0 then big = math.max(big, e / scale) end
          end
          -- no code clamps: the bias and the top code cover the row
          assert.is_true(bias <= lo and bias + LEVELS[format] * scale >= hi)
        end
        assert.is_true(big > 0.3, "errors reach a good part of scale/2 (a test that can fail)")
        assert.near(max_abs, err.max_abs, 1e-12)
        assert.near(math.sqrt(sum_sq / (70 * dim)), err.rms, 1e-9)
        assert.near(max_ratio, err.max_ratio, 1e-9)
        assert.equal(70 * dim, err.count)
      end
    end)
  end

  it("stores fp16 rows within 2^-11 of each value, and f32 rows exactly", function()
    local rows = sample_rows(50, 16, 3)
    local src = tensor_of(rows)
    local h, herr = qtbe.quantize(src, "fp16")
    assert.equal("f16", h:dtype())
    local back = rows_of(qtbe.dequantize(h, "fp16", 16))
    for r, row in ipairs(rows) do
      for c = 1, 16 do
        local x = f32(row[c])
        assert.is_true(math.abs(x - back[r][c]) <= math.max(math.abs(x) * 2 ^ -11, 2 ^ -25))
      end
    end
    assert.is_true(herr.max_ratio <= 1 and herr.max_abs > 0)
    local f, ferr = qtbe.quantize(src, "f32")
    assert.same(src:totable(), f:totable())
    assert.equal(0, ferr.max_abs)
    -- rows are [rows, dim]: a flat tensor is named as such (it read as dim -1)
    assert.has_error(function() qtbe.quantize(ur.tensor({ 8 }):fill(1), "int8") end,
      "quantize: src must be rows [rows, dim], got [8]")
  end)

  it("quantizes f16 and bf16 rows as their f32 values", function()
    local rows = sample_rows(30, 8, 5)
    for _, dt in ipairs { "f16", "bf16" } do
      local src = tensor_of(rows, dt)
      local widened = tensor_of(rows_of(src))
      for _, format in ipairs { "int8", "int2", "fp16" } do
        assert.same(qtbe.quantize(widened, format):totable(), qtbe.quantize(src, format):totable())
      end
    end
  end)

  it("refuses what a format cannot hold, naming the row", function()
    local rows = sample_rows(5, 8, 1)
    rows[4][2] = 0 / 0
    assert.has_error(function() qtbe.quantize(tensor_of(rows), "int8") end,
      "rows quantize: row 3 holds a value that is not finite or beyond what int8 stores (|x| up to 32768)")
    rows[4][2] = 70000
    assert.has_error(function() qtbe.quantize(tensor_of(rows), "fp16") end,
      "rows quantize: row 3 holds a value that is not finite or beyond what fp16 stores (|x| up to 65504)")
    -- f32 holds any finite value: a bound of 32768 named there was the int formats'
    assert.equal(70000, qtbe.quantize(tensor_of(rows), "f32"):get(3 * 8 + 1))
    rows[4][2] = -1 / 0
    assert.has_error(function() qtbe.quantize(tensor_of(rows), "f32") end,
      "rows quantize: row 3 holds a value that is not finite")
  end)

  it("checks shapes and dtypes of the rows", function()
    local src = ur.tensor({ 3, 6 })
    local dst = ur.tensor({ 3, 10 }, { dtype = "u8" })
    local e = ffi.new("ur_qerror")
    assert.equal(C.UR_STATUS_INVALID, C.ur_rows_quantize(src.p, dst.p, e, C.UR_QFORMAT_INT8))
    assert.equal("rows quantize: rows of 6 elements; expected a multiple of 4 from 4 to 1024",
                 ffi.string(C.ur_last_error()))
    src = ur.tensor({ 3, 8 })
    assert.equal(C.UR_STATUS_INVALID, C.ur_rows_quantize(src.p, dst.p, e, C.UR_QFORMAT_INT8))
    assert.equal("rows quantize: dst is u8 [3, 10]; int8 rows of 8 need u8 [3, 12]", ffi.string(C.ur_last_error()))
    local i32 = ur.tensor({ 3, 8 }, { dtype = "i32" })
    assert.equal(C.UR_STATUS_INVALID, C.ur_rows_quantize(i32.p, dst.p, e, C.UR_QFORMAT_INT8))
    assert.equal("rows quantize: src is i32; expected f32, f16 or bf16", ffi.string(C.ur_last_error()))
    assert.equal(C.UR_STATUS_INVALID, C.ur_rows_dequantize(dst.p, src.p, C.UR_QFORMAT_INT4))
    assert.equal("rows dequantize: src is u8 [3, 10]; int4 rows of 8 are u8 [3, 8]", ffi.string(C.ur_last_error()))
    assert.equal(C.UR_STATUS_INVALID, C.ur_rows_quantize(src.p, dst.p, e, 9))
    assert.equal("rows quantize: format 9 is not f32, fp16, int8, int4 or int2", ffi.string(C.ur_last_error()))
  end)
end)

-- ---- the collection ----

-- A collection of two tables sharing three features, rows random in each format, with the
-- rows dequantized by the reference above.
local function build(format, opts)
  opts = opts or {}
  local specs = { { name = "a", rows = 37, dim = 16, features = { "f1", "f3" } },
                  { name = "b", rows = 11, dim = opts.pooling == "none" and 16 or 8, features = { "f2" },
                    pooling = opts.mean and "mean" or nil } }
  local tables, deq = {}, {}
  for i, s in ipairs(specs) do
    local rows = sample_rows(s.rows, s.dim, 10 * i + #format)
    local stored = qtbe.quantize(tensor_of(rows), format)
    tables[i] = { name = s.name, rows = s.rows, dim = s.dim, format = format, features = s.features,
                  pooling = opts.pooling or s.pooling, modulo = opts.modulo and s.rows or nil }
    deq[s.name] = { rows = rows_of(qtbe.dequantize(stored, format, s.dim)), stored = stored }
  end
  local q = assert(qtbe.new { tables = tables, features = { "f1", "f2", "f3" }, device = "cpu",
                              bounds = opts.bounds, output_dtype = opts.output_dtype })
  for _, s in ipairs(specs) do
    local stored = deq[s.name].stored
    if opts.perm then
      -- row id r stored at row p[r]: the stored rows are shuffled to match
      local p, n = {}, s.rows
      for r = 0, n - 1 do p[r + 1] = (r * 5 + 3) % n end
      local shuffled = assert(ur.tensor(stored:size(), { dtype = stored:dtype() }))
      local cols = stored:size(2)
      for r = 0, n - 1 do
        for c = 0, cols - 1 do shuffled[p[r + 1] * cols + c] = stored[r * cols + c] end
      end
      assert(q:load(s.name, shuffled))
      assert(q:set_permutation(s.name, R.tensor(p, "i64")))
    else
      assert(q:load(s.name, stored))
    end
  end
  return q, deq
end

local TABLE_OF = { f1 = "a", f2 = "b", f3 = "a" }

-- The pooled reference in float64: per sample, per feature, the (weighted) sum or mean.
local function reference(deq, batch, b, opts)
  opts = opts or {}
  local out = {}
  local feats = { "f1", "f2", "f3" }
  for s = 1, b do
    for f, name in ipairs(feats) do
      local t = TABLE_OF[name]
      local dim = #deq[t].rows[1]
      local bag = (f - 1) * b + s
      local acc = {}
      for c = 1, dim do acc[c] = 0 end
      local n = batch.offsets[bag + 1] - batch.offsets[bag]
      for i = batch.offsets[bag] + 1, batch.offsets[bag + 1] do
        local id = batch.values[i]
        if opts.modulo then id = id % #deq[t].rows end
        local w = batch.weights and batch.weights[i] or 1
        for c = 1, dim do acc[c] = acc[c] + w * deq[t].rows[id + 1][c] end
      end
      if opts.mean and t == "b" and n > 0 then
        for c = 1, dim do acc[c] = acc[c] / n end
      end
      for c = 1, dim do out[#out + 1] = acc[c] end
    end
  end
  return out
end

local function inputs(batch)
  return { values = R.tensor(batch.values, "i64"), offsets = R.tensor(batch.offsets, "i64"),
           weights = batch.weights and R.tensor(batch.weights, "f32") or nil }
end

local function close(got, want, tol)
  local worst, i = compare.maxrel(got, want)
  if worst > tol then error(("element %d: %.9g, the reference %.9g"):format(i - 1, got[i], want[i]), 2) end
end

-- ur_qtbe_new straight from C, past the Lua checks: "ok" or the engine's message, and the seconds
-- it took.  The C checks are table.c's names, shared with the plain collection.
local function c_new(tnames, fnames, ftable)
  local cfg = ffi.new("ur_qtbe_config", { device = -1, out_dtype = C.UR_DTYPE_F32 })
  local tc = ffi.new("ur_qtbe_table_config[?]", #tnames)
  for i, n in ipairs(tnames) do
    tc[i - 1] = { name = n, rows = 4, dim = 8, format = C.UR_QFORMAT_F32, place = C.UR_PLACE_HOST }
  end
  local names = ffi.new("const char *[?]", #fnames, fnames)
  local out = ffi.new("ur_qtbe *[1]")
  local t0 = os.clock()
  local st = C.ur_qtbe_new(out, cfg, #tnames, tc, #fnames, ffi.new("int32_t[?]", #ftable, ftable), names)
  local seconds = os.clock() - t0
  if out[0] ~= nil then C.ur_qtbe_free(out[0]) end
  return st == 0 and "ok" or ffi.string(C.ur_last_error()), seconds
end

describe("uvmrec.qtbe collection", function()
  for _, format in ipairs(qtbe.FORMATS) do
    it("pools " .. format .. " rows as the float64 reference over the dequantized rows (sum, mean, weighted)",
      function()
      math.randomseed(#format)
      for _, o in ipairs { {}, { mean = true }, { weighted = true }, { weighted = true, mean = true } } do
        local q, deq = build(format, o)
        local batch = R.batch({ 37, 11, 37 }, { batch = 9, weighted = o.weighted })
        local out = assert(q:forward(inputs(batch)))
        assert.same({ 9, 40 }, out:size())
        close(out:totable(), reference(deq, batch, 9, o), 1e-5)
      end
    end)
  end

  it("takes ids modulo each table's rows, and reads them through a row permutation", function()
    math.randomseed(4)
    local q, deq = build("int4", { modulo = true, perm = true })
    local batch = R.batch({ 37, 11, 37 }, { batch = 6 })
    for i = 1, #batch.values do batch.values[i] = batch.values[i] + 37 * 11 * math.random(0, 1000) end
    close(assert(q:forward(inputs(batch))):totable(), reference(deq, batch, 6, { modulo = true }), 1e-5)
  end)

  it("gives one row per id without pooling", function()
    math.randomseed(8)
    local q, deq = build("int8", { pooling = "none" })
    local batch = R.batch({ 37, 11, 37 }, { batch = 5, weighted = true })
    local out = assert(q:forward(inputs(batch)))
    assert.same({ #batch.values, 16 }, out:size())
    local want = {}
    for f, name in ipairs { "f1", "f2", "f3" } do
      for bag = (f - 1) * 5 + 1, f * 5 do
        for i = batch.offsets[bag] + 1, batch.offsets[bag + 1] do
          local row = deq[TABLE_OF[name]].rows[batch.values[i] + 1]
          for c = 1, 16 do want[(i - 1) * 16 + c] = batch.weights[i] * row[c] end
        end
      end
    end
    close(out:totable(), want, 1e-6)
  end)

  it("gives the f32 EmbeddingBagCollection's bits from f32 tables, and stays within the bound for int4",
    function()
    local ebc = ur.nn.EmbeddingBagCollection { tables = { { name = "t", rows = 500, dim = 32, features = { "x", "y" } },
                                                          { name = "u", rows = 40, dim = 32, pooling = "mean" } },
                                              device = "cpu", seed = 9 }
    math.randomseed(12)
    local batch = R.batch({ 500, 500, 40 }, { batch = 64, weighted = true })
    local kjt = ur.KJT { keys = { "x", "y", "u" }, values = batch.values, weights = batch.weights,
                         lengths = (function()
                           local l = {}
                           for i = 1, #batch.offsets - 1 do l[i] = batch.offsets[i + 1] - batch.offsets[i] end
                           return l
                         end)() }
    local ref = ebc:forward(kjt):totable()
    local f = ur.nn.QuantEmbeddingBagCollection.quantize(ebc, { format = "f32" })
    assert.same(ref, f:forward(kjt):totable())
    local q = ur.nn.QuantEmbeddingBagCollection.quantize(ebc, { format = "int4", formats = { u = "fp16" } })
    local got = q:forward(kjt):totable()
    -- each pooled element moves by at most sum |w| * the rows' bound (table t: its largest)
    local worst = q.errors.t.max_abs
    local moved = 0
    for i = 1, #ref do moved = math.max(moved, math.abs(got[i] - ref[i])) end
    local wsum = 0
    for b = 1, 64 * 2 do
      local s = 0
      for i = batch.offsets[b] + 1, batch.offsets[b + 1] do s = s + math.abs(batch.weights[i]) end
      wsum = math.max(wsum, s)
    end
    assert.is_true(moved > 0 and moved <= wsum * worst * (1 + 1e-5) + 1e-6)
    assert.matches("QuantEmbeddingBagCollection%(2 tables, 3 features %-> 96, fp16/int4%)", tostring(q))
    assert.has_error(function() q:backward(kjt, ur.tensor({ 64, 96 })) end)
  end)

  it("fails a bad id under fatal naming table, feature, sample and id; counts it under warn", function()
    local q = build("int8")
    local batch = { values = { 1, 2, 11, 3, 4, 5 }, offsets = { 0, 1, 2, 3, 4, 5, 6 } }
    -- misuse raises, as every engine call's INVALID does (uvmrec.lib)
    local msg = "table 'b' (feature 'f2', sample 0, value 2) has no row 11; ids run 0..10"
    assert.has_error(function() q:forward(inputs(batch)) end, "qtbe: " .. msg)
    -- the plain collection's words (table.c's ur__tbe_bad_id): qtbe said 'has no row for id 11'
    local t = assert(tbe.new { tables = { { name = "a", rows = 37, dim = 16, features = { "f1", "f3" } },
                                          { name = "b", rows = 11, dim = 8, features = { "f2" } } },
                               features = { "f1", "f2", "f3" }, device = "cpu" })
    local ok, err = pcall(function() t:forward(inputs(batch), ur.tensor({ 2, 40 })) end)
    t:free()
    assert.is_false(ok)
    assert.equal("tbe: " .. msg, (tostring(err):gsub("^[^\n]-:%d+: ", "")))
    local m = build("int8", { modulo = true })
    batch.values[3] = -4
    assert.has_error(function() m:forward(inputs(batch)) end,
                     "qtbe: table 'b' (feature 'f2', sample 0, value 2) has no row -4; ids run 0..10")
    batch.values[3] = 11
    local w, deq = build("int8", { bounds = "warn" })
    local out = assert(w:forward(inputs(batch)))
    assert.equal(1, w:skipped())
    close(out:totable(), (function()
      local b2 = { values = { 1, 2, 3, 4, 5 }, offsets = { 0, 1, 2, 2, 3, 4, 5 } }
      return reference(deq, b2, 2)
    end)(), 1e-5)
    local off = build("int8", { bounds = "off" })
    assert(off:forward(inputs(batch)))
    assert.equal(0, off:skipped())
  end)

  it("writes bf16 outputs rounded from the f32 sums", function()
    local q32 = build("int4")
    local q16 = build("int4", { output_dtype = "bf16" })
    math.randomseed(3)
    local batch = R.batch({ 37, 11, 37 }, { batch = 4 })
    local a, b = q32:forward(inputs(batch)), q16:forward(inputs(batch))
    assert.equal("bf16", b:dtype())
    local bb = ur.tensor(a:size())
    ur.dense.cast(b, bb)
    local af, bf = a:totable(), bb:totable()
    for i = 1, #af do assert.is_true(math.abs(af[i] - bf[i]) <= math.abs(af[i]) * 2 ^ -8) end
  end)

  it("finds a duplicate name among 100000 tables or features in well under a second, naming both", function()
    -- Each name was compared with every earlier one: 5e9 comparisons here, 12 s for either list
    -- (0.04 s sorted).  The second of each pair is the last name.
    local N = 100000
    local many, one = {}, { "t1" }
    for i = 1, N do many[i] = "t" .. i end
    many[N] = "t1"
    local msg, seconds = c_new(many, { "f" }, { 0 })
    assert.equal("qtbe: tables 0 and 99999 are both named 't1'", msg)
    assert.is_true(seconds < wall_limit(1), seconds)
    local ftable = {}
    for i = 1, N do ftable[i] = 0 end
    msg, seconds = c_new(one, many, ftable)
    assert.equal("qtbe: features 0 and 99999 are both named 't1'", msg)
    assert.is_true(seconds < wall_limit(1), seconds)
    -- the first holder of the name, whichever comes between; a bad table before the second
    -- holder still speaks first
    assert.equal("qtbe: tables 1 and 3 are both named 'b'", c_new({ "a", "b", "c", "b", "b" }, { "x" }, { 0 }))
    assert.equal("qtbe: features 2 and 4 are both named 'z'",
                 c_new({ "a" }, { "x", "y", "z", "w", "z", "z" }, { 0, 0, 0, 0, 0, 0 }))
    assert.equal("qtbe: feature 3 ('w') maps to table 1; expected 0..0",
                 c_new({ "a" }, { "x", "y", "w", "w" }, { 0, 0, 0, 1 }))
  end)

  it("reports bad input: options, shapes, offsets, permutations", function()
    assert.has_error(function() qtbe.new { tables = { { name = "a", rows = 4, dim = 6 } }, device = "cpu" } end,
                     "qtbe: table 'a' has dim 6; expected a multiple of 4 from 4 to 1024")
    assert.has_error(function() qtbe.new { tables = { { name = "a", rows = 4, dim = 8, format = "int3" } } } end,
                     "table format 'int3'; expected f32, fp16, int8, int4 or int2")
    assert.has_error(function() qtbe.new { tables = { { name = "a", rows = 4, dim = 8, oops = 1 } } } end,
                     "quantized collection: unknown table option 'oops'; expected dim, features, format, modulo, "
                     .. "name, placement, pooling, rows")
    assert.has_error(function()
      qtbe.new { tables = { { name = "a", rows = 4, dim = 8 }, { name = "b", rows = 4, dim = 8, pooling = "none" } },
                 device = "cpu" }
    end, "qtbe: table 'b' pools by none but table 'a' by sum; a collection pools all its tables (sum or mean) or none")
    -- the C checks behind the Lua ones, shared with the plain collection (table.c's names)
    assert.equal("ok", c_new({ "a", "b" }, { "x", "y" }, { 0, 1 }))
    assert.equal("qtbe: tables 0 and 1 are both named 'a'", c_new({ "a", "a" }, { "x", "y" }, { 0, 1 }))
    assert.equal("qtbe: features 0 and 1 are both named 'x'", c_new({ "a", "b" }, { "x", "x" }, { 0, 1 }))
    assert.equal("qtbe: feature 1 ('y') maps to table 2; expected 0..1", c_new({ "a", "b" }, { "x", "y" }, { 0, 2 }))
    assert.equal("qtbe: 0 tables and 1 features; expected at least one of each", c_new({}, { "x" }, { 0 }))
    assert.equal("qtbe: 1 tables and 0 features; expected at least one of each", c_new({ "a" }, {}, {}))
    assert.has_error(function()
      qtbe.new { tables = { { name = "a", rows = 4, dim = 8, placement = "device" } }, device = "cpu" }
    end, "qtbe: table 'a' placement 'device' needs the collection on a GPU, and it runs on the CPU (device -1)")
    local q = build("int2")
    local function fails(batch, msg, out)
      local o = out or ur.tensor({ 2, 40 })
      assert.has_error(function() q:forward(inputs(batch), o) end, msg)
    end
    fails({ values = { 1, 2, 3 }, offsets = { 0, 1, 2, 3, 3, 3 } },
          "qtbe: 6 offsets hold 5 bags, which do not split evenly over 3 features")
    fails({ values = { 1, 2, 3 }, offsets = { 0, 2, 1, 3, 3, 3, 3 } },
          "qtbe: offsets[2] = 1 is below offsets[1] = 2 (feature 'f1', sample 1); offsets must not decrease")
    fails({ values = { 1, 2, 3 }, offsets = { 0, 1, 2, 3, 3, 3, 4 } }, "qtbe: offsets end at 4 for 3 values")
    -- a KJT made unchecked, its offsets then rewritten in order within the values (f1's bags empty, f3's second
    -- reading every id): read as given, as a GPU's kernels read offsets past the values; checked first now
    local odd = ur.KJT { keys = { "f1", "f2", "f3" }, values = { 1, 2, 3 }, lengths = { 1, 1, 1, 1, 400, 1 },
                         check = false }
    local o = odd:offsets()
    for i, x in ipairs { 0, 0, 0, 0, 0, 0, 3 } do o:set(i - 1, x) end
    assert.has_error(function() q:forward(odd, ur.tensor({ 2, 40 })) end,
      "quantized collection: kjt: key 'f1' sample 0: offsets 0..0 disagree with length 1 or pass the 3 values")
    assert.is_false(odd:checked())
    -- no offsets at all: the engine's message, not a shape of -1 rows for the output
    assert.has_error(function() q:forward(inputs({ values = {}, offsets = {} })) end,
                     "qtbe: offsets is empty; expected bags + 1 entries")
    fails({ values = { 1, 2, 3 }, offsets = { 0, 1, 2, 3, 3, 3, 3 } },
          "qtbe: out has shape [3, 40]; expected [2, 40]", ur.tensor({ 3, 40 }))
    -- an out of other than 2 dimensions, named as it is (it said [80 0] of a [80] one, and [2, 40] of [2, 40, 1])
    fails({ values = { 1, 2, 3 }, offsets = { 0, 1, 2, 3, 3, 3, 3 } },
          "qtbe: out has shape [80]; expected [2, 40]", ur.tensor({ 80 }))
    fails({ values = { 1, 2, 3 }, offsets = { 0, 1, 2, 3, 3, 3, 3 } },
          "qtbe: out has shape [2, 40, 1]; expected [2, 40]", ur.tensor({ 2, 40, 1 }))
    fails({ values = { 1, 2, 3 }, offsets = { 0, 1, 2, 3, 3, 3, 3 }, weights = { 1 } },
          "qtbe: 1 weight for 3 values; expected one each")
    assert.has_error(function() q:set_permutation("a", R.tensor({ 0, 1 }, "i64")) end,
                     "qtbe: table 'a' permutation is i64 of 2 elements; expected i64 [37]")
    local bad = {}
    for r = 1, 11 do bad[r] = r % 10 end
    assert.has_error(function() q:set_permutation("b", R.tensor(bad, "i64")) end,
                     "qtbe: table 'b' permutation sends row id 10 to row 1, which another id has")
    assert.has_error(function() q:table("zz") end, "quantized collection: no table named 'zz' (tables: a, b)")
  end)
end)
