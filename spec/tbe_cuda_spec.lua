-- The embedding collection's CUDA kernels against the CPU reference backend.  Every test is
-- #cuda: pending without a GPU.  Forward sums in the CPU's order, unfused, so it must match
-- bit for bit; backward matches within rounding (rowwise Adagrad reduces a row across a warp,
-- and rows read more than 256 times are summed in chunks), bit for bit for SGD on f32 rows read
-- fewer times, and is bit-identical run to run, but for the atomic SGD step asked for with
-- deterministic = false (within rounding).
local ur = require "uvmrec"
local h = require "helpers"
local R = require "tbe_ref"

local cuda_it = h.cuda_it
local EBC, EC = ur.nn.EmbeddingBagCollection, ur.nn.EmbeddingCollection

-- Tables of every shape the kernels pick from: widths of 1 to 8 slots per lane, f32 and
-- halves (16-byte half loads when every table is a half with a dim divisible by 8).
local SHAPES = {
  mixed = {
    { name = "a", rows = 300, dim = 128, features = { "a1", "a2" } },
    { name = "b", rows = 77, dim = 12, dtype = "f16" },
    { name = "c", rows = 50, dim = 1024, dtype = "bf16" },
    { name = "d", rows = 1000, dim = 260 },
  },
  halves = {
    { name = "a", rows = 300, dim = 128, dtype = "f16", features = { "a1", "a2" } },
    { name = "b", rows = 90, dim = 512, dtype = "bf16" },
  },
  narrow = {
    { name = "a", rows = 5000, dim = 4 },
    { name = "b", rows = 64, dim = 64, pooling = "mean" },
  },
  -- rows read 9 to 256 times at the widest dims (a bf16 gradient's stage holds 4 rows of 1024)
  wide = {
    { name = "a", rows = 6, dim = 1024 },
    { name = "b", rows = 30, dim = 260 },
  },
}

local function pair(shape, opts)
  local function make(dev, place)
    local o = { tables = {}, device = dev, placement = place, seed = 17 }
    for k, v in pairs(opts or {}) do
      if k ~= "gpu_placement" then o[k] = v end
    end
    for i, t in ipairs(SHAPES[shape]) do
      local c = {}
      for k, v in pairs(t) do c[k] = v end
      if o.pooling then c.pooling = nil end
      o.tables[i] = c
    end
    return (o.pooling == "none" and EC or EBC)(o)
  end
  return make("cpu", "host"), make(0, (opts and opts.gpu_placement) or "device")
end

local rows_of = R.rows_of

-- f32 tables within rel (and abs); halves within one step of their grid (1e-2 covers bf16's
-- 2^-8), where f32 results that differ in the last bit straddle a rounding point.
local function same_tables(a, b, rel, what, abs)
  local sa, sb = R.snapshot(a.tbe), R.snapshot(b.tbe)
  for name, t in pairs(sa) do
    local r = a:table(name):dtype() == "f32" and rel or 1e-2
    R.close(sb[name], t, r, abs or r * 1e-2, what .. " table " .. name)
  end
end

-- Forward must match exactly on the first step; later steps read rows that a backward may have
-- rounded differently (rowwise Adagrad's reduction, hot rows), so they match within tolerance.
local function train(cpu, gpu, b, steps, seed)
  local ci, gi = R.input(b), R.input(b, "device")
  for s = 1, steps do
    local co, go = cpu:forward(ci), gpu:forward(gi)
    if s == 1 then
      assert.same(co:totable(), go:totable(), "forward, step 1")
    else
      R.close(go:totable(), co:totable(), 1e-3, 1e-3, "forward, step " .. s)
    end
    local g = ur.tensor(co:size(), { dtype = co:dtype() }):uniform(-1, 1, seed + s)
    local gg = assert(g:to("device"))
    cpu:backward(ci, g)
    gpu:backward(gi, gg)
  end
end

describe("embedding collections on CUDA", function()
  cuda_it("pool every table shape, dtype and pooling exactly as the CPU does", function()
    for _, shape in ipairs { "mixed", "halves", "narrow" } do
      for _, out_dtype in ipairs { "f32", "bf16" } do
        math.randomseed(#shape)
        local cpu, gpu = pair(shape, { output_dtype = out_dtype })
        local b = R.batch(rows_of(cpu), { batch = 70, weighted = true, big = 1000, force = { [3] = 1000, [4] = 0 } })
        assert.same(cpu:forward(R.input(b)):totable(), gpu:forward(R.input(b, "device")):totable(),
                    shape .. " " .. out_dtype)
        local u = R.batch(rows_of(cpu), { batch = 33 })
        assert.same(cpu:forward(R.input(u)):totable(), gpu:forward(R.input(u, "device")):totable(),
                    shape .. " unweighted")
      end
    end
  end)

  for _, kind in ipairs { "sgd", "rowwise_adagrad", "adagrad", "adam" } do
    cuda_it("steps " .. kind .. " like the CPU, halves with stochastic rounding", function()
      for _, shape in ipairs { "mixed", "halves", "narrow" } do
        math.randomseed(#kind + #shape)
        local opt = { kind, lr = 0.05, weight_decay = 0.01, max_grad = 0.8 }
        local cpu, gpu = pair(shape, { optimizer = opt })
        local b = R.batch(rows_of(cpu), { batch = 50, weighted = true, force = { [2] = 1000 } })
        train(cpu, gpu, b, 3, 40)
        same_tables(cpu, gpu, 1e-5, kind .. " " .. shape)
      end
    end)
  end

  cuda_it("sums rows read thousands of times in chunks over many CTAs, deterministically (f32 and bf16 "
    .. "gradients)", function()
    for _, out in ipairs { "f32", "bf16" } do
      local runs = {}
      for run = 1, 2 do
        math.randomseed(5)
        local cpu, gpu = pair("narrow", { optimizer = { "adagrad", lr = 0.1 }, output_dtype = out })
        local b = R.batch(rows_of(cpu), { batch = 400, hot = { 7, 5000 } })
        train(cpu, gpu, b, 2, 70)
        -- 5000 gradients summed in 20 chunks of 8 runs round differently from one running sum: the
        -- step (lr 0.1) agrees to about 1e-4 of itself
        same_tables(cpu, gpu, 1e-5, "hot rows " .. out, 2e-5)
        runs[run] = R.snapshot(gpu.tbe)
      end
      assert.same(runs[1], runs[2], out)
    end
  end)

  cuda_it("sums bf16 gradient rows read 9 to 256 times from shared memory as the CPU does, bit for bit, "
    .. "at every width (32 to 4 rows a stage)", function()
    for _, shape in ipairs { "narrow", "wide" } do
      math.randomseed(44)
      local cpu, gpu = pair(shape, { optimizer = { "sgd", lr = 0.5, weight_decay = 0.01 }, output_dtype = "bf16" })
      -- row 3 of the first table 77 times in one bag: a stage's rows not a multiple of 77
      local b = R.batch(rows_of(cpu), { batch = 60, weighted = true, hot = { 3, 77 } })
      local ci, gi = R.input(b), R.input(b, "device")
      local co, go = cpu:forward(ci), gpu:forward(gi)
      assert.same(co:totable(), go:totable(), shape .. " forward")
      local g = ur.tensor(co:size(), { dtype = "bf16" }):uniform(-1, 1, 45)
      cpu:backward(ci, g)
      gpu:backward(gi, assert(g:to("device")))
      assert.same(R.snapshot(cpu.tbe), R.snapshot(gpu.tbe), shape)
    end
  end)

  cuda_it("sums rows read up to 256 times as the CPU does, bit for bit: payloads by bag and by value", function()
    -- f32 tables under SGD: the same sum in the same order, the same step; weighted bags carry
    -- the value (its weight, its bag), plain ones the bag, mean pooling the bag's length
    for _, weighted in ipairs { false, true } do
      math.randomseed(weighted and 31 or 32)
      local cpu, gpu = pair("narrow", { optimizer = { "sgd", lr = 0.5, weight_decay = 0.01 } })
      local b = R.batch(rows_of(cpu), { batch = 60, weighted = weighted, hot = { 3, 200 } })
      local ci, gi = R.input(b), R.input(b, "device")
      local co, go = cpu:forward(ci), gpu:forward(gi)
      local g = ur.tensor(co:size()):uniform(-1, 1, 33)
      cpu:backward(ci, g)
      gpu:backward(gi, assert(g:to("device")))
      assert.same(R.snapshot(cpu.tbe), R.snapshot(gpu.tbe), "weighted " .. tostring(weighted))
      assert.same(co:totable(), go:totable())
    end
  end)

  cuda_it("steps the rows beside a long segment bit for bit: a warp's windows pass over its entries", function()
    -- row 3 read 700 times is summed in chunks (within rounding); every other row, read a few
    -- times, shares its warp's 32 segments with it and must come out as the CPU's, bit for bit
    for _, weighted in ipairs { false, true } do
      math.randomseed(weighted and 41 or 42)
      local cpu, gpu = pair("narrow", { optimizer = { "sgd", lr = 0.5 } })
      local b = R.batch(rows_of(cpu), { batch = 300, weighted = weighted, hot = { 3, 700 } })
      local ci, gi = R.input(b), R.input(b, "device")
      local co = cpu:forward(ci)
      gpu:forward(gi)
      local g = ur.tensor(co:size()):uniform(-1, 1, 43)
      cpu:backward(ci, g)
      gpu:backward(gi, assert(g:to("device")))
      local sc, sg = R.snapshot(cpu.tbe), R.snapshot(gpu.tbe)
      local dim = cpu.tbe.dims.a
      local rc, rg = {}, {} -- row 3 of table a, taken out of both
      for i = 1, dim do
        rc[i], rg[i] = sc.a[3 * dim + i], sg.a[3 * dim + i]
        sc.a[3 * dim + i], sg.a[3 * dim + i] = 0, 0
      end
      R.close(rg, rc, 1e-5, 1e-6, "the long segment's row")
      assert.same(sc, sg, "weighted " .. tostring(weighted))
    end
  end)

  cuda_it("steps SGD by atomics without sorting when not deterministic, within rounding of the CPU", function()
    for _, shape in ipairs { "narrow", "mixed" } do
      math.randomseed(#shape + 50)
      local opt = { "sgd", lr = 0.3, deterministic = false }
      local cpu, gpu = pair(shape, { optimizer = opt })
      local b = R.batch(rows_of(cpu), { batch = 200, weighted = true, hot = { 4, 3000 } })
      train(cpu, gpu, b, 2, 90)
      -- "mixed" has half tables: the collection keeps the sorted step, exactly the CPU's rows
      -- except where rows read thousands of times are summed in chunks
      same_tables(cpu, gpu, 1e-4, "atomic SGD " .. shape, 1e-4)
    end
    -- a row's thousands of adds land in any order: the atomic step is not the sorted one bit
    -- for bit, but each row is within rounding of it
    math.randomseed(51)
    local _, sorted = pair("narrow", { optimizer = { "sgd", lr = 0.3 } })
    local _, atomic = pair("narrow", { optimizer = { "sgd", lr = 0.3, deterministic = false } })
    local b = R.batch(rows_of(sorted), { batch = 300, hot = { 9, 8000 } })
    for _, m in ipairs { sorted, atomic } do
      local gi = R.input(b, "device")
      local o = m:forward(gi)
      m:backward(gi, ur.tensor(o:size(), { placement = "device" }):uniform(-1, 1, 52))
    end
    local ss, sa = R.snapshot(sorted.tbe), R.snapshot(atomic.tbe)
    for name, t in pairs(ss) do R.close(sa[name], t, 1e-4, 1e-4, "atomic against sorted, table " .. name) end
  end)

  cuda_it("is bit-identical run to run on the GPU, stochastic rounding included", function()
    local runs = {}
    for run = 1, 2 do
      math.randomseed(6)
      local _, gpu = pair("halves", { optimizer = "rowwise_adagrad" })
      local b = R.batch(rows_of(gpu), { batch = 300, weighted = true, hot = { 3, 700 } })
      local gi = R.input(b, "device")
      for s = 1, 3 do
        local o = gpu:forward(gi)
        gpu:backward(gi, ur.tensor(o:size(), { placement = "device" }):uniform(-1, 1, s))
      end
      runs[run] = R.snapshot(gpu.tbe)
    end
    assert.same(runs[1], runs[2])
  end)

  cuda_it("takes VBE batches, flat and expanded, like the CPU", function()
    math.randomseed(7)
    local cpu, gpu = pair("mixed", { optimizer = { "sgd", lr = 0.3 } })
    local b = R.batch(rows_of(cpu), { strides = { 5, 1, 3, 8, 2 }, weighted = true })
    assert.same(cpu:forward(R.input(b)):totable(), gpu:forward(R.input(b, "device")):totable(), "flat")
    b.inverse_indices = {}
    local full = 9
    for f, nb in ipairs(b.strides) do
      for s = 0, full - 1 do b.inverse_indices[(f - 1) * full + s + 1] = (s * 5 + f) % nb end
    end
    train(cpu, gpu, b, 2, 90)
    same_tables(cpu, gpu, 1e-5, "vbe")
  end)

  cuda_it("returns the CPU's deduplicated gradient", function()
    math.randomseed(8)
    local cpu, gpu = pair("mixed", { optimizer = "sgd" })
    local b = R.batch(rows_of(cpu), { batch = 40, weighted = true, hot = { 9, 600 } })
    local g = ur.tensor({ 40, cpu.tbe.out_dim }):uniform(-1, 1, 3)
    local sc = cpu:sparse_grad(R.input(b), g)
    local sg = gpu:sparse_grad(R.input(b, "device"), assert(g:to("device")))
    for name, x in pairs(sc) do
      assert.same(x.rows:totable(), sg[name].rows:totable(), name)
      R.close(sg[name].grad:totable(), x.grad:totable(), 1e-5, 1e-6, "sparse " .. name)
    end
  end)

  cuda_it("reads managed and pinned host tables like device ones", function()
    for _, place in ipairs { "managed", "host" } do
      math.randomseed(9)
      local cpu, gpu = pair("mixed", { optimizer = "adam", gpu_placement = place })
      assert.equal(place == "host" and "pinned" or place, gpu:table("a"):placement())
      local b = R.batch(rows_of(cpu), { batch = 30, weighted = true })
      train(cpu, gpu, b, 2, 11)
      same_tables(cpu, gpu, 1e-5, place)
    end
  end)

  -- 131075 rows of 128 f32 are 64 MiB and 1.5 KiB: past the backend's threshold for pinned memory
  -- of a mapping of its own, asked for huge pages and registered (kernels/backend.cu,
  -- ur_cuda_pinned_map), which the kernels read and step in place
  cuda_it("reads and steps pinned tables of 64 MiB and more (registered mappings) as device ones, bit for bit",
          function()
    math.randomseed(12)
    local function make(place)
      return EBC { tables = { { name = "a", rows = 131075, dim = 128 }, { name = "b", rows = 40, dim = 16 } },
                   device = 0, placement = place, seed = 17, optimizer = { "sgd", lr = 0.3 } }
    end
    local pinned, device = make("host"), make("device")
    assert.equal("pinned", pinned:table("a"):placement())
    R.bits_equal(pinned:table("a"), device:table("a"), "table a as made")
    for step = 1, 3 do
      local x = R.input(R.batch(rows_of(device), { batch = 256 }), "device")
      local op, od = pinned:forward(x), device:forward(x)
      R.bits_equal(op, od, "step " .. step .. " forward")
      local g = assert(ur.tensor(od:size(), { dtype = od:dtype() }):uniform(-1, 1, step):to("device"))
      pinned:backward(x, g)
      device:backward(x, g)
    end
    for _, name in ipairs { "a", "b" } do R.bits_equal(pinned:table(name), device:table(name), "table " .. name) end
    pinned.tbe:free()
    device.tbe:free()
  end)

  cuda_it("gives one row per value under pooling none, like the CPU", function()
    math.randomseed(10)
    local function make(dev, place)
      return EC { tables = { { name = "s", rows = 400, dim = 64, features = { "x", "y" } } },
                  device = dev, placement = place, optimizer = { "sgd", lr = 0.2 }, seed = 2 }
    end
    local cpu, gpu = make("cpu", "host"), make(0, "device")
    local b = R.batch({ 400, 400 }, { batch = 25, weighted = true, force = { [1] = 300 } })
    train(cpu, gpu, b, 2, 12)
    same_tables(cpu, gpu, 1e-6, "none")
  end)

  cuda_it("fails on a bad id under fatal with the CPU's message, and counts under warn", function()
    local cpu, gpu = pair("narrow", {})
    local b = { values = { 1, 2, 3, 70 }, offsets = { 0, 1, 2, 3, 4 }, batch = 2 }
    local msg = "tbe: table 'b' (feature 'b', sample 1, value 3) has no row 70; ids run 0..63"
    -- behind each module's name (Module:op)
    assert.has_error(function() cpu:forward(R.input(b)) end, tostring(cpu) .. ": " .. msg)
    assert.has_error(function() gpu:forward(R.input(b, "device")) end, tostring(gpu) .. ": " .. msg)
    local _, warn = pair("narrow", { bounds = "warn" })
    warn:forward(R.input(b, "device"))
    warn:forward(R.input(b, "device"))
    assert.equal(2, warn:skipped())
  end)

  cuda_it("fails on a bad id under fatal on a stream of its own too: the flag is read after the forward, on it",
    function()
      local streams = require "uvmrec.stream"
      local _, gpu = pair("narrow", {})
      local s = assert(streams.stream())
      gpu:set_stream(s)
      local msg = "tbe: table 'b' (feature 'b', sample 1, value 3) has no row 70; ids run 0..63"
      local bad = R.input({ values = { 1, 2, 3, 70 }, offsets = { 0, 1, 2, 3, 4 }, batch = 2 }, "device")
      local good = R.input({ values = { 1, 2, 3, 7 }, offsets = { 0, 1, 2, 3, 4 }, batch = 2 }, "device")
      -- 1 GiB filled ahead of each forward on its stream: a read not ordered after the forward's
      -- kernels would find the flag as the last reset left it
      local busy = assert(ur.tensor({ 256 * 1024 * 1024 }, { placement = "device" }))
      for i = 1, 4 do
        assert(busy:fill(i, s))
        assert.has_error(function() gpu:forward(bad) end, tostring(gpu) .. ": " .. msg)
        assert(busy:fill(i, s))
        gpu:forward(good)
      end
      assert(s:sync())
      busy:free()
    end)

  cuda_it("checks a KJT not known checked before its kernels read its offsets, in every placement, cached too",
    function()
    local tbe = require "uvmrec.tbe"
    -- offsets past the values (lengths {1, 1, 400, 1} made unchecked, moved to the GPU): the CPU's forward
    -- refused them by its own check of the offsets, the GPU's kernels read 400 ids past the values' end
    local over = { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1 }, check = false }
    local want = "embedding collection: kjt: key 'b' sample 0: offsets 2..402 disagree with length 400 or pass the 3 "
      .. "values"
    for _, tp in ipairs { "device", "cached" } do
      local c = assert(tbe.new { tables = { { name = "t", rows = 64, dim = 4, features = { "a", "b" },
                                              placement = tp } } })
      for _, place in ipairs { "device", "managed", "pinned" } do
        local k = assert(ur.KJT(over):to(place))
        assert.is_false(k:checked())
        assert.has_error(function() c:forward(k) end, want)
        assert.has_error(function() c:backward(k, assert(ur.tensor({ 2, 8 }, { placement = "device" }))) end, want)
        if tp == "cached" then assert.has_error(function() c:prepare(k) end, want) end
        assert.is_false(k:checked())
      end
      -- a sound one made unchecked on the GPU (VBE too: the make's pass reads its inverse indices) is known
      -- checked as made, and read as the CPU reads it
      local cpu = assert(tbe.new { device = "cpu",
                                   tables = { { name = "t", rows = 64, dim = 4, features = { "a", "b" } } } })
      assert(cpu:load("t", assert(c:table("t"):to("host"))))
      local cases = {
        { values = { 1, 2, 3 }, lengths = { 1, 1, 0, 1 } },
        { values = { 1, 2, 3 }, lengths = { 1, 1, 1 }, spk = { { 2 }, { 1 } }, inverse = { 0, 1, 0, 0 } },
      }
      for _, o in ipairs(cases) do
        local function kjt_in(place)
          return assert(ur.KJT { keys = { "a", "b" }, values = R.tensor(o.values, "i64", place),
                                 lengths = R.tensor(o.lengths, "i32", place), stride_per_key_per_rank = o.spk,
                                 inverse_indices = o.inverse and R.tensor(o.inverse, "i64", place), check = false })
        end
        local g = kjt_in("device")
        assert.is_true(g:checked())
        assert.same(assert(cpu:forward(kjt_in("host"))):totable(), assert(assert(c:forward(g)):to("host")):totable())
      end
      c:free()
      cpu:free()
    end
  end)

  cuda_it("gathers rows like the CPU", function()
    local src = ur.tensor({ 1000, 128 }):uniform(-1, 1, 4)
    local ids = R.tensor({ 5, 999, 0, 5, 17, 400, 3 }, "i64")
    local out = ur.tensor({ 7, 128 })
    assert(ur.C.ur_tensor_gather_rows(nil, src.p, ids.p, out.p) == 0)
    local dsrc, dids = assert(src:to("device")), assert(ids:to("device"))
    local dout = ur.tensor({ 7, 128 }, { placement = "device" })
    assert(ur.C.ur_tensor_gather_rows(nil, dsrc.p, dids.p, dout.p) == 0)
    assert.same(out:totable(), dout:totable())
  end)
end)
