-- uvmrec.train.feed's double-buffered copies: batches come through buffers of their own, equal
-- to the loader's; the events that order them are synchronised only once recorded, whatever
-- number of batches was taken (one batch, then drain: the case an evaluation of a single batch
-- hits); a feed re-attached to a new loader goes on.  The event logic is the engine's on every
-- backend, so host buffers exercise it without a GPU.
local ur = require "uvmrec"
local feed = require "uvmrec.train.feed"

local function loader(samples)
  return assert(ur.data.loader { data = "synthetic:tiny", samples = samples, batch_size = 256 })
end

describe("uvmrec.train.feed", function()
  it("feeds batches through buffers of their own as it does onto a GPU, equal to the loader's", function()
    local function dcnv2()
      return assert(ur.data.loader { data = "synthetic:dcnv2", samples = 700, batch_size = 256, seed = 3 })
    end
    local a, b = dcnv2(), dcnv2()
    local f = feed.new(b, { gpu = true, placement = "managed" })
    local n = 0
    while true do
      local x, y = a:next(), assert(f:next() or true)
      if not x then
        assert.is_true(y)
        break
      end
      n = n + 1
      assert.equal(x.size, y.size)
      assert.equal("managed", y.dense:placement())
      assert.same(x.dense:totable(), y.dense:totable())
      assert.same(x.labels:totable(), y.labels:totable())
      for _, k in ipairs { "values", "offsets" } do
        local t = x.sparse[k](x.sparse)
        assert.same(t:totable(), y.sparse[k]:totable(), k)
      end
    end
    assert.equal(3, n, "two full batches and the rest")
    f:free()
    a:close()
    b:close()
  end)

  it("drains after a single batch and after the data ends", function()
    local l = loader(256)
    local f = feed.new(l, { gpu = true, placement = "host" })
    local b = assert(f:next())
    assert.equal(256, b.size)
    f:drain()
    assert.is_nil(f:next())
    f:drain()
    f:free()
    l:close()
  end)

  it("re-attaches to a new loader and hands over its batches unchanged", function()
    local a, l1, l2 = loader(600), loader(300), loader(600)
    local f = feed.new(l1, { gpu = true, placement = "host" })
    assert(f:next())
    f:attach(l2)
    for _ = 1, 3 do
      local x, y = assert(a:next()), assert(f:next())
      assert.same(x.labels:totable(), y.labels:totable())
      assert.same(x.sparse:values():totable(), y.sparse.values:totable())
    end
    assert.is_nil(f:next())
    f:free()
    for _, l in ipairs { a, l1, l2 } do l:close() end
  end)
end)
