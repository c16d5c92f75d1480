local ur = require "uvmrec"
local R = require "tbe_ref"
local h = require "helpers"

local EBC = ur.nn.EmbeddingBagCollection
-- make {}'s collection, as its errors begin (Module:op)
local EBC60 = "EmbeddingBagCollection(3 tables, 4 features -> 60, sgd): "

-- Three tables of mixed dims and dtypes, four features (two share t_a).
local function make(opts)
  local o = {
    tables = {
      { name = "t_a", rows = 37, dim = 12, features = { "f_a", "f_a2" }, pooling = opts.pool_a },
      { name = "t_b", rows = 101, dim = 4, dtype = opts.dtype_b, pooling = opts.pool_b },
      { name = "t_c", rows = 8, dim = 32, dtype = opts.dtype_c },
    },
    optimizer = opts.optimizer, seed = opts.seed or 11, bounds = opts.bounds,
    stochastic_rounding = opts.sr, output_dtype = opts.output_dtype, device = "cpu",
    placement = opts.placement,
  }
  return EBC(o)
end

local rows_of = R.rows_of

local function poolings(opts)
  return { t_a = opts.pool_a or "sum", t_b = opts.pool_b or "sum", t_c = "sum" }
end

describe("uvmrec.nn.EmbeddingBagCollection", function()
  it("pools weighted and unweighted bags by sum and mean like a float64 reference", function()
    math.randomseed(1)
    for _, weighted in ipairs { false, true } do
      for _, pools in ipairs { { "sum", "sum" }, { "mean", "sum" }, { "sum", "mean" } } do
        local opts = { pool_a = pools[1], pool_b = pools[2] }
        local m = make(opts)
        local b = R.batch(rows_of(m), { batch = 23, weighted = weighted, big = 1000 })
        local out = m:forward(R.input(b))
        assert.same({ 23, 12 + 12 + 4 + 32 }, out:size())
        local want, mag = R.forward(b, R.layout(m.tbe, poolings(opts)), R.snapshot(m.tbe), 60)
        R.close(out:totable(), want, 2e-6, 1e-7, "pooled " .. pools[1] .. "/" .. pools[2], mag)
      end
    end
  end)

  it("reads f16 and bf16 tables and pools in f32; a bag of 1000 and empty bags included", function()
    math.randomseed(2)
    local m = make { dtype_b = "f16", dtype_c = "bf16" }
    local force = { [1] = 1000, [2] = 0, [30] = 1 }
    local b = R.batch(rows_of(m), { batch = 20, weighted = true, force = force })
    local out = m:forward(R.input(b))
    local want, mag = R.forward(b, R.layout(m.tbe), R.snapshot(m.tbe), 60)
    R.close(out:totable(), want, 2e-6, 1e-7, "half tables", mag)
    for k = 0, 11 do assert.equal(0, out[60 + k]) end -- bag 2: feature f_a, sample 1, empty
  end)

  it("writes a bf16 output rounded from the f32 sums", function()
    math.randomseed(3)
    local m = make { output_dtype = "bf16" }
    local b = R.batch(rows_of(m), { batch = 9, weighted = true })
    local out = m:forward(R.input(b))
    assert.equal("bf16", out:dtype())
    local want = R.forward(b, R.layout(m.tbe), R.snapshot(m.tbe), 60)
    R.close(out:totable(), want, 2 ^ -8, 1e-6, "bf16 output")
  end)

  it("gives zeros for empty bags, also under mean", function()
    local m = make { pool_a = "mean" }
    local b = { values = {}, offsets = { 0, 0, 0, 0, 0 }, batch = 1 }
    local out = m:forward(R.input(b))
    for _, v in ipairs(out:totable()) do assert.equal(0, v) end
  end)

  for _, kind in ipairs { "sgd", "rowwise_adagrad", "adagrad", "adam" } do
    it("steps " .. kind .. " on exactly the rows the batch read, as its formula says", function()
      math.randomseed(#kind)
      local hp = { lr = 0.05, eps = 1e-3, weight_decay = 0.01, beta1 = 0.8, beta2 = 0.95, max_grad = 0.7 }
      local opt = { kind, lr = hp.lr, weight_decay = hp.weight_decay, max_grad = hp.max_grad }
      if kind ~= "sgd" then opt.eps = hp.eps end -- sgd takes none
      if kind == "adam" then opt.beta1, opt.beta2 = hp.beta1, hp.beta2 end
      local opts = { optimizer = opt, pool_a = "mean" }
      local m = make(opts)
      local layout = R.layout(m.tbe, poolings(opts))
      local w = R.snapshot(m.tbe)
      local state = {}
      for name, t in pairs(w) do
        local dim = m.tbe.dims[name]
        state[name] = {}
        for r = 0, #t / dim - 1 do state[name][r] = { s1 = {}, s2 = {} } end
        for r = 0, #t / dim - 1 do
          for k = 1, dim do state[name][r].s1[k], state[name][r].s2[k] = 0, 0 end
        end
      end
      for step = 1, 3 do
        local b = R.batch(rows_of(m), { batch = 15, weighted = true })
        local input = R.input(b)
        local out = m:forward(input)
        local grad = R.randoms(out:numel())
        local gt = ur.tensor(out:size())
        assert(ur.C.ur_tensor_write(gt.p, 0, #grad, require("ffi").new("float[?]", #grad, grad)) == 0)
        m:backward(input, gt)
        hp.step = step
        local rg = R.row_grads(b, layout, grad, 60)
        for name, rows in pairs(rg) do
          local dim = m.tbe.dims[name]
          for r, g in pairs(rows) do
            local row = {}
            for k = 1, dim do row[k] = w[name][r * dim + k] end
            local st = state[name][r]
            local nw, n1, n2 = R.step(kind, hp, row, g, st.s1, st.s2)
            for k = 1, dim do w[name][r * dim + k] = nw[k] end
            if kind ~= "sgd" then st.s1 = n1 end
            if kind == "adam" then st.s2 = n2 end
          end
        end
        local got = R.snapshot(m.tbe)
        for name, t in pairs(got) do R.close(t, w[name], 2e-5, 2e-6, kind .. " step " .. step .. " " .. name) end
        -- state too, as the collection names it
        if kind ~= "sgd" then
          for name, s in pairs(m:optimizer_state()) do
            local dim = m.tbe.dims[name]
            local first = s.sum or s.exp_avg
            local vals = first:totable()
            if kind == "rowwise_adagrad" then
              assert.same({ m.tbe.rows[name] }, first:size())
              for r, st in pairs(state[name]) do R.close({ vals[r + 1] }, { st.s1[1] }, 2e-5, 1e-7, "sum " .. name) end
            else
              assert.same({ m.tbe.rows[name], dim }, first:size())
              for r, st in pairs(state[name]) do
                for k = 1, dim do R.close({ vals[r * dim + k] }, { st.s1[k] }, 2e-5, 1e-7, "state " .. name) end
              end
            end
          end
        end
      end
    end)
  end

  it("is bit-identical run to run, f16 stochastic rounding included", function()
    local runs = {}
    for run = 1, 2 do
      math.randomseed(77)
      local m = make { optimizer = { "adagrad", lr = 0.1 }, dtype_b = "f16", dtype_c = "bf16", seed = 5 }
      for _ = 1, 3 do
        local b = R.batch(rows_of(m), { batch = 40, weighted = true })
        local input = R.input(b)
        local out = m:forward(input)
        local g = ur.tensor(out:size()):uniform(-1, 1, 9)
        m:backward(input, g)
      end
      runs[run] = R.snapshot(m.tbe)
    end
    assert.same(runs[1], runs[2])
  end)

  it("steps deterministically on the CPU when told it need not (deterministic = false)", function()
    -- the atomic SGD step is the GPU's; the CPU's reference for it is the sorted step itself
    local runs = {}
    for run, det in ipairs { true, false } do
      math.randomseed(78)
      local m = make { optimizer = { "sgd", lr = 0.3, deterministic = det } }
      assert.equal(det, m.tbe.deterministic)
      for s = 1, 2 do
        local b = R.batch(rows_of(m), { batch = 40, weighted = true, hot = { 2, 300 } })
        local input = R.input(b)
        local out = m:forward(input)
        m:backward(input, ur.tensor(out:size()):uniform(-1, 1, s))
      end
      runs[run] = R.snapshot(m.tbe)
    end
    assert.same(runs[1], runs[2])
    assert.has_error(function()
      make { optimizer = { "sgd", deterministic = "no" } }
    end, "embedding collection: optimizer deterministic must be true or false, got no")
  end)

  it("rounds f16 and bf16 rows stochastically: within one step of the f32 result, unbiased", function()
    for _, dt in ipairs { "f16", "bf16" } do
      local m = EBC { tables = { { name = "t", rows = 1, dim = 1024, dtype = dt } }, device = "cpu",
                      optimizer = { "sgd", lr = 1 }, seed = 3 }
      m:table("t"):fill(1)
      -- one bag reading row 0; gradient 1/3 of an ulp at 1 below: the update is 1 - 2^-k / 3
      local ulp = dt == "f16" and 2 ^ -11 or 2 ^ -8
      local input = R.input { values = { 0 }, offsets = { 0, 1 }, batch = 1 }
      m:forward(input)
      local g = ur.tensor({ 1, 1024 }):fill(ulp / 3)
      m:backward(input, g)
      local got = m:table("t"):totable()
      local down, mean = 0, 0
      for _, v in ipairs(got) do
        assert.is_true(v == 1 or v == 1 - ulp, dt .. " " .. v)
        if v < 1 then down = down + 1 end
        mean = mean + v / 1024
      end
      -- P(round down) = 1/3: 1024 draws give 341 +- 45 (3 sigma)
      assert.is_true(down > 296 and down < 386, dt .. " rounded down " .. down .. " of 1024")
      assert.is_true(math.abs(mean - (1 - ulp / 3)) < ulp / 10)
    end
  end)

  it("rounds to nearest when stochastic rounding is off", function()
    local m = EBC { tables = { { name = "t", rows = 1, dim = 8, dtype = "bf16" } }, device = "cpu",
                    optimizer = { "sgd", lr = 1 }, stochastic_rounding = false }
    m:table("t"):fill(1)
    local input = R.input { values = { 0 }, offsets = { 0, 1 }, batch = 1 }
    m:forward(input)
    m:backward(input, ur.tensor({ 1, 8 }):fill(2 ^ -8 / 3))
    for _, v in ipairs(m:table("t"):totable()) do assert.equal(1, v) end
  end)

  it("fails on an id outside its table under fatal, naming table, feature, sample and id", function()
    local m = make {}
    local b = { values = { 1, 2, 3, 4, 500, 6 }, offsets = { 0, 1, 2, 3, 4, 5, 5, 6, 6 }, batch = 2 }
    assert.has_error(function() m:forward(R.input(b)) end,
      EBC60 .. "tbe: table 't_b' (feature 't_b', sample 0, value 4) has no row 500; ids run 0..100")
    b.values[5] = -1
    assert.has_error(function() m:forward(R.input(b)) end,
      EBC60 .. "tbe: table 't_b' (feature 't_b', sample 0, value 4) has no row -1; ids run 0..100")
  end)

  it("skips and counts bad ids under warn, and leaves their rows out of backward", function()
    local m = make { bounds = "warn", optimizer = { "sgd", lr = 1 } }
    local good = { values = { 1, 2, 3, 4, 5, 6 }, offsets = { 0, 1, 2, 3, 4, 5, 5, 6, 6 }, batch = 2 }
    local bad = { values = { 1, 2, 3, 4, 500, 6 }, offsets = good.offsets, batch = 2 }
    local want = m:forward(R.input(good)):totable()
    local got = m:forward(R.input(bad)):totable()
    for k = 25, 28 do want[k] = 0 end -- feature t_b, sample 0 (columns 24..27): its only id skipped
    assert.same(want, got)
    assert.equal(1, m:skipped())
    local before = R.snapshot(m.tbe)
    m:backward(R.input(bad), ur.tensor({ 2, 60 }):fill(1))
    local after = R.snapshot(m.tbe)
    assert.same(before.t_b, after.t_b) -- row 5 would have been t_b's; nothing else read t_b
    assert.equal(1, m:skipped())
  end)

  it("checks nothing under off on the GPU, and skips bad ids on the CPU without counting", function()
    local m = make { bounds = "off" }
    local b = { values = { 1, 2, 3, 4, 500, 6 }, offsets = { 0, 1, 2, 3, 4, 5, 5, 6, 6 }, batch = 2 }
    assert.truthy(m:forward(R.input(b)))
    assert.equal(0, m:skipped())
  end)

  it("takes a variable batch per feature, flat or expanded to the full batch", function()
    math.randomseed(8)
    local m = make {}
    local rows = rows_of(m)
    local b = R.batch(rows, { strides = { 3, 1, 4, 2 }, weighted = true })
    local layout = R.layout(m.tbe)
    local tables = R.snapshot(m.tbe)
    local flat = m:forward(R.input(b))
    assert.same({ 3 * 12 + 1 * 12 + 4 * 4 + 2 * 32 }, flat:size())
    local want, mag = R.forward(b, layout, tables, 60)
    R.close(flat:totable(), want, 2e-6, 1e-7, "vbe flat", mag)
    -- five samples; each feature's sample reads one of that feature's bags
    b.inverse_indices = {}
    for f, nb in ipairs(b.strides) do
      for s = 0, 4 do b.inverse_indices[(f - 1) * 5 + s + 1] = (s * 7 + f) % nb end
    end
    local full = m:forward(R.input(b))
    assert.same({ 5, 60 }, full:size())
    R.close(full:totable(), R.expand(want, b, layout, 60, 5), 2e-6, 1e-6, "vbe expanded")
  end)

  it("sums a VBE bag's gradient over the samples that read it, in the same step as the full batch", function()
    math.randomseed(9)
    local opt = { "sgd", lr = 0.5 }
    local m1, m2 = make { optimizer = opt }, make { optimizer = opt }
    local rows = rows_of(m1)
    local b = R.batch(rows, { strides = { 2, 3, 1, 2 }, weighted = true })
    b.inverse_indices = {}
    local nfull = 4
    for f, nb in ipairs(b.strides) do
      for s = 0, nfull - 1 do b.inverse_indices[(f - 1) * nfull + s + 1] = (s + f) % nb end
    end
    -- the same batch written out in full
    local bags = R.bags(b, 4)
    local fb = { values = {}, offsets = { 0 }, weights = {}, batch = nfull }
    local first_bag = { 0, 2, 5, 6 }
    for f = 1, 4 do
      for s = 0, nfull - 1 do
        local g = bags[first_bag[f] + b.inverse_indices[(f - 1) * nfull + s + 1] + 1]
        for i = g.first, g.last do
          fb.values[#fb.values + 1] = b.values[i]
          fb.weights[#fb.weights + 1] = b.weights[i]
        end
        fb.offsets[#fb.offsets + 1] = #fb.values
      end
    end
    local grad = ur.tensor({ nfull, 60 }):uniform(-1, 1, 4)
    local vin, fin = R.input(b), R.input(fb)
    m1:forward(vin)
    m1:backward(vin, grad)
    m2:forward(fin)
    m2:backward(fin, grad)
    local s1, s2 = R.snapshot(m1.tbe), R.snapshot(m2.tbe)
    for name, t in pairs(s1) do R.close(t, s2[name], 1e-5, 1e-6, "vbe step " .. name) end
  end)

  it("returns the deduplicated gradient instead of a step", function()
    math.randomseed(10)
    local m = make { pool_a = "mean", optimizer = { "sgd", lr = 1 } }
    local before = R.snapshot(m.tbe)
    local b = R.batch(rows_of(m), { batch = 12, weighted = true })
    local input = R.input(b)
    local grad = R.randoms(12 * 60)
    local gt = ur.tensor({ 12, 60 })
    assert(ur.C.ur_tensor_write(gt.p, 0, #grad, require("ffi").new("float[?]", #grad, grad)) == 0)
    local sg = m:sparse_grad(input, gt)
    local want = R.row_grads(b, R.layout(m.tbe, { t_a = "mean", t_b = "sum", t_c = "sum" }), grad, 60)
    for name, rows in pairs(want) do
      local ids = {}
      for r in pairs(rows) do ids[#ids + 1] = r end
      table.sort(ids)
      assert.same(ids, sg[name].rows:totable())
      local dim = m.tbe.dims[name]
      assert.same({ #ids, dim }, sg[name].grad:size())
      local flat = {}
      for _, r in ipairs(ids) do for k = 1, dim do flat[#flat + 1] = rows[r][k] end end
      R.close(sg[name].grad:totable(), flat, 1e-5, 1e-6, "sparse grad " .. name)
    end
    assert.same(before, R.snapshot(m.tbe))
  end)

  it("agrees with finite differences of its output", function()
    math.randomseed(12)
    local m = make { pool_a = "mean" }
    local b = R.batch(rows_of(m), { batch = 6, weighted = true, force = { [1] = 3 } })
    local input = R.input(b)
    local proj = ur.tensor({ 6, 60 }):uniform(-1, 1, 2)
    local pv = proj:totable()
    local function loss()
      local o = m:forward(input):totable()
      local s = 0
      for i = 1, #o do s = s + o[i] * pv[i] end
      return s
    end
    local sg = m:sparse_grad(input, proj)
    local t = m:table("t_a")
    local row = sg.t_a.rows[0]
    for _, k in ipairs { 0, 5, 11 } do
      local at = row * 12 + k
      R.close({ h.central_difference(loss, t, at, 2 ^ -6) }, { sg.t_a.grad[k] }, 1e-3, 1e-4,
              "finite difference at " .. k)
    end
  end)

  it("shows each table as a view of the batched storage, and lists them as parameters", function()
    local m = make { optimizer = "adam", dtype_c = "f16" }
    local a, b = m:table("t_a"), m:table("t_b")
    assert.same({ 37, 12 }, a:size())
    assert.same({ 101, 4 }, b:size())
    assert.equal(a:id(), b:id()) -- f32 tables share one storage
    assert.are_not.equal(a:id(), m:table("t_c"):id())
    assert.equal("f16", m:table("t_c"):dtype())
    a[5] = 0.25
    assert.equal(0.25, m:table("t_a")[5])
    local names = {}
    for _, p in ipairs(m:parameters()) do
      names[#names + 1] = p.name
      assert.is_nil(p.grad)
      assert.is_true(p.fused)
    end
    assert.same({ "t_a", "t_b", "t_c" }, names)
    local s = m:state("t_b")
    assert.same({ 101, 4 }, s.exp_avg:size())
    assert.same({ 101, 4 }, s.exp_avg_sq:size())
    assert.same({ "t_a", "t_b", "t_c" }, (function()
      local k = {}
      for n in pairs(m:optimizer_state()) do k[#k + 1] = n end
      table.sort(k)
      return k
    end)())
  end)

  it("starts uniform in +-1/sqrt(rows), seeded, the same in every placement", function()
    local m1 = make { seed = 4 }
    local m2 = make { seed = 4, placement = "managed" }
    local m3 = make { seed = 5 }
    assert.equal("managed", m2:table("t_a"):placement())
    local s1, s2, s3 = R.snapshot(m1.tbe), R.snapshot(m2.tbe), R.snapshot(m3.tbe)
    assert.same(s1, s2)
    assert.are_not.same(s1.t_a, s3.t_a)
    for name, t in pairs(s1) do
      local bound = 1 / math.sqrt(m1.tbe.rows[name])
      for _, v in ipairs(t) do assert.is_true(v >= -bound and v < bound, name .. " " .. v) end
    end
    local again = m1.tbe:init_table("t_b", -2, -1, 99)
    assert.truthy(again)
    for _, v in ipairs(m1:table("t_b"):totable()) do assert.is_true(v >= -2 and v < -1) end
  end)

  it("gives managed tables the results of host tables", function()
    math.randomseed(13)
    local m1 = make { optimizer = "rowwise_adagrad" }
    local m2 = make { optimizer = "rowwise_adagrad", placement = "managed" }
    local b = R.batch(rows_of(m1), { batch = 10, weighted = true })
    local i1 = R.input(b)
    local i2 = R.input(b, "managed")
    assert.same(m1:forward(i1):totable(), m2:forward(i2):totable())
    local g = ur.tensor({ 10, 60 }):uniform(-1, 1, 1)
    m1:backward(i1, g)
    m2:backward(i2, g)
    assert.same(R.snapshot(m1.tbe), R.snapshot(m2.tbe))
  end)

  it("takes a KJT whose keys are its features, and refuses one in another order", function()
    local m = make {}
    local kjt = ur.KJT { keys = { "f_a", "f_a2", "t_b", "t_c" }, values = { 1, 2, 3, 4, 5 },
                         lengths = { 1, 0, 1, 1, 0, 1, 1, 0 } }
    local out = m:forward(kjt)
    local want = m:forward(R.input { values = { 1, 2, 3, 4, 5 }, offsets = { 0, 1, 1, 2, 3, 3, 4, 5, 5 }, batch = 2 })
    assert.same(want:totable(), out:totable())
    local wrong = ur.KJT { keys = { "f_a2", "f_a", "t_b", "t_c" }, values = { 1 },
                           lengths = { 1, 0, 0, 0, 0, 0, 0, 0 } }
    assert.has_error(function() m:forward(wrong) end,
      EBC60 .. "embedding collection: the input's keys {f_a2, f_a, t_b, t_c} are not the collection's features " ..
      "{f_a, f_a2, t_b, t_c}")
  end)

  it("rejects each bad configuration with a message naming it", function()
    local function bad(tables, extra, msg)
      local o = { tables = tables, device = "cpu" }
      for k, v in pairs(extra or {}) do o[k] = v end
      assert.has_error(function() EBC(o) end, msg)
    end
    bad({ { name = "x", rows = 10, dim = 6 } }, nil,
        "tbe: table 'x' has dim 6; expected a multiple of 4 from 4 to 1024")
    bad({ { name = "x", rows = 10, dim = 2048 } }, nil,
        "tbe: table 'x' has dim 2048; expected a multiple of 4 from 4 to 1024")
    bad({ { name = "x", rows = 10, dim = 8, dtype = "i8" } }, nil,
        "embedding collection: table 'x' dtype 'i8' is not one of bf16, f16, f32")
    bad({ { name = "x", rows = 0, dim = 8 } }, nil,
        "embedding collection: table 'x' rows is 0; expected a whole number >= 1")
    bad({ { name = "x", rows = 10, dim = 8 }, { name = "y", rows = 10, dim = 8, pooling = "none" } }, nil,
        "EmbeddingBagCollection: table 'y' pools by none; this module takes pooling sum or mean")
    bad({ { name = "x", rows = 10, dim = 8, placement = "device" } }, nil,
        "tbe: table 'x' placement 'device' needs the collection on a GPU, and it runs on the CPU (device -1)")
    bad({ { name = "x", rows = 10, dim = 8 } }, { optimizer = "lamb" },
        "embedding collection: optimizer 'lamb' is not one of adagrad, adam, rowwise_adagrad, sgd")
    bad({ { name = "x", rows = 10, dim = 8 } }, { optimizer = { "sgd", lr = -1 } },
        "embedding collection: lr must be a finite number >= 0, got -1")
    bad({ { name = "x", rows = 10, dim = 8 } }, { optimizer = { "adam", beta1 = 1 } },
        "embedding collection: beta1 must be a number in [0, 1), got 1")
    bad({ { name = "x", rows = 10, dim = 8 } }, { optimizer = { "sgd", eps = 1e-3 } },
        "embedding collection: sgd takes no setting 'eps' (its settings: lr, max_grad, weight_decay)")
    bad({ { name = "x", rows = 10, dim = 8 } }, { bounds = "maybe" },
        "embedding collection: bounds check 'maybe' is not one of fatal, off, warn")
    bad({ { name = "x", rows = 10, dim = 8 }, { name = "x", rows = 5, dim = 8 } }, nil,
        "embedding collection: two tables are named 'x'")
    bad({ { name = "x", rows = 10, dim = 8, features = { "f" } },
          { name = "y", rows = 5, dim = 8, features = { "f" } } }, nil,
        "embedding collection: feature 'f' is on tables 'x' and 'y'")
    bad({ { name = "x", rows = 10, dim = 8, colour = 3 } }, nil, "embedding collection: unknown table option 'colour'; "
        .. "expected dim, dtype, features, name, placement, pooling, rows, shard, state_placement")
  end)

  it("rejects inputs that do not fit, naming what is wrong", function()
    local m = make {}
    local function bad(b, msg, grad)
      assert.has_error(function()
        local input = R.input(b)
        if grad then m:backward(input, grad) else m:forward(input) end
      end, msg)
    end
    bad({ values = { 1, 2, 3 }, offsets = { 0, 1, 2, 3 }, batch = 1 },
        EBC60 .. "tbe: 3 bags do not split evenly over 4 features; pass stride_per_key_per_rank for a variable batch")
    bad({ values = { 1, 2 }, offsets = { 0, 2, 1, 2, 2 }, batch = 1 },
        EBC60 .. "tbe: offsets[2] = 1 is below offsets[1] = 2 (feature 'f_a2', sample 0); offsets must not decrease")
    bad({ values = { 1, 2 }, offsets = { 0, 1, 1, 1, 1 }, batch = 1 },
        EBC60 .. "tbe: offsets end at 1 for 2 values")
    bad({ values = { 1 }, offsets = { 0, 1, 1, 1, 1 }, weights = { 1, 2 }, batch = 1 },
        EBC60 .. "tbe: 2 weights for 1 value; expected one each")
    bad({ values = { 1 }, offsets = { 0, 1, 1, 1, 1 }, batch = 1 },
        EBC60 .. "tbe: grad_out has shape [3, 60]; expected [1, 60]", ur.tensor({ 3, 60 }))
    bad({ values = { 1 }, offsets = { 0, 1, 1, 1, 1 }, batch = 1 },
        EBC60 .. "tbe: grad_out is f16 with 2 dimensions; expected f32 with 2", ur.tensor({ 1, 60 }, { dtype = "f16" }))
    bad({ values = { 1 }, offsets = { 0, 1, 1, 1, 1 }, strides = { 1, 1, 1, 2 }, batch = 1 },
        EBC60 .. "tbe: stride_per_key_per_rank sums to 5 bags but offsets hold 4")
    local b = { values = { 1 }, offsets = { 0, 1, 1, 1, 1 }, strides = { 1, 1, 1, 1 },
                inverse_indices = { 0, 0, 0, 1 } }
    bad(b, EBC60 .. "tbe: feature 't_c' sample 0 has inverse index 1; expected 0..0")
  end)
end)
