local ffi = require "ffi"
local ur = require "uvmrec"
local R = require "tbe_ref"

local EC = ur.nn.EmbeddingCollection

local function make(opts)
  return EC {
    tables = {
      { name = "seq", rows = 50, dim = 16, features = { "clicks", "views" } },
      { name = "ids", rows = 9, dim = 16, dtype = "bf16" },
    },
    optimizer = opts.optimizer, device = "cpu", seed = 3, bounds = opts.bounds,
  }
end

describe("uvmrec.nn.EmbeddingCollection", function()
  it("gives one (weighted) row per value, in value order", function()
    math.randomseed(21)
    local m = make {}
    local b = R.batch({ 50, 50, 9 }, { batch = 7, weighted = true, force = { [3] = 0, [4] = 30 } })
    local out = m:forward(R.input(b))
    assert.same({ #b.values, 16 }, out:size())
    local t = R.snapshot(m.tbe)
    local want = {}
    for _, g in ipairs(R.bags(b, 3)) do
      local name = g.f == 3 and "ids" or "seq"
      for i = g.first, g.last do
        for k = 1, 16 do want[(i - 1) * 16 + k] = b.weights[i] * t[name][b.values[i] * 16 + k] end
      end
    end
    R.close(out:totable(), want, 1e-7, 0, "rows")
  end)

  it("steps each row once with the sum of its values' gradients", function()
    math.randomseed(22)
    local m = make { optimizer = { "sgd", lr = 0.5 } }
    local b = R.batch({ 50, 50, 9 }, { batch = 5, weighted = true })
    local input = R.input(b)
    local before = R.snapshot(m.tbe)
    local out = m:forward(input)
    local grad = R.randoms(out:numel())
    local g = ur.tensor(out:size())
    assert(ur.C.ur_tensor_write(g.p, 0, #grad, ffi.new("float[?]", #grad, grad)) == 0)
    m:backward(input, g)
    local want = { seq = { unpack(before.seq) }, ids = { unpack(before.ids) } }
    for _, bg in ipairs(R.bags(b, 3)) do
      local name = bg.f == 3 and "ids" or "seq"
      for i = bg.first, bg.last do
        for k = 1, 16 do
          local at = b.values[i] * 16 + k
          want[name][at] = want[name][at] - 0.5 * b.weights[i] * grad[(i - 1) * 16 + k]
        end
      end
    end
    local after = R.snapshot(m.tbe)
    R.close(after.seq, want.seq, 1e-5, 1e-6, "seq")
    R.close(after.ids, want.ids, 2 ^ -7, 1e-6, "ids (bf16)")
  end)

  it("needs one dim for all tables and pooling none", function()
    assert.has_error(function()
      EC { tables = { { name = "a", rows = 5, dim = 8 }, { name = "b", rows = 5, dim = 16 } }, device = "cpu" }
    end, "tbe: pooling none needs one dim for all tables; 'b' has 16 but 'a' has 8")
    assert.has_error(function()
      EC { tables = { { name = "a", rows = 5, dim = 8, pooling = "sum" } }, device = "cpu" }
    end, "EmbeddingCollection: table 'a' pools by sum; this module takes pooling none")
    assert.has_error(function()
      local m = make {}
      m:forward(R.input { values = { 1 }, offsets = { 0, 1, 1, 1 }, strides = { 1, 1, 1 },
                          inverse_indices = { 0, 0, 0 } })
    end, "EmbeddingCollection(2 tables, 3 features -> 16, sgd): tbe: pooling none takes no inverse indices")
  end)

  it("zeroes the row of a bad id under warn", function()
    local m = make { bounds = "warn" }
    local out = m:forward(R.input { values = { 3, 99, 4 }, offsets = { 0, 2, 2, 3 }, batch = 1 })
    local t = out:totable()
    for k = 17, 32 do assert.equal(0, t[k]) end
    assert.are_not.equal(0, t[1])
    assert.equal(1, m:skipped())
  end)
end)
