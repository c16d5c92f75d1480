-- uvmrec.train.feed's double-buffered copies: the events that order them are synchronised only
-- once recorded, whatever number of batches was taken (one batch, then drain: the case an
-- evaluation of a single batch hits), and a feed re-attached to a new loader goes on.  The
-- event logic is the engine's on every backend, so host buffers exercise it without a GPU.
local ur = require "uvmrec"
local feed = require "uvmrec.train.feed"

local function loader(samples)
  return assert(ur.data.loader { data = "synthetic:tiny", samples = samples, batch_size = 256 })
end

describe("uvmrec.train.feed", function()
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
