-- uvmrec.data.Batch: the one shape of a batch, a KJT on every placement; to() copies it, into
-- buffers kept for a run without allocating (the views are the buffers'); release frees a copy
-- and gives a loader's batch back; where the data stands after it; each misuse named.
local ur = require "uvmrec"
local Batch = require "uvmrec.data.batch"
local h = require "helpers"

local function loader(samples) return h.tiny_loader(samples, 128) end

local function same(a, b)
  assert.equal(a.size, b.size)
  assert.same(a.dense:totable(), b.dense:totable())
  assert.same(a.labels:totable(), b.labels:totable())
  assert.same(a.sparse:totable(), b.sparse:totable())
end

describe("uvmrec.data.Batch", function()
  it("is what the loader gives: a KJT of the tables' features, its position, given back on release", function()
    local l = loader(256)
    local b = assert(l:next())
    assert.is_true(Batch.is(b))
    assert.is_true(require("uvmrec.kjt").is(b.sparse))
    assert.same({ epoch = 0, sample = 128 }, b:position())
    assert.equal("C1", b.sparse:keys()[1])
    b:release()
    b:release() -- twice is harmless
    assert.has_error(function() return b.dense:numel() end, "tensor: used after free()")
    assert(l:next())
    l:close()
  end)

  it("copies to every placement, and into buffers kept for a run: the same buffers each time", function()
    local l = loader(640)
    local bufs = Batch.buffers("managed")
    local ids = {}
    for k = 1, 5 do
      local b = assert(l:next())
      for _, place in ipairs(h.placements()) do
        local c = b:to(place)
        assert.equal(place, c.sparse:placement())
        same(b, c)
        c:release()
      end
      local c = b:to("managed", nil, bufs)
      assert.equal("managed", c.dense:placement())
      same(b, c)
      ids[k] = ur.C.ur_tensor_id(c.sparse:values().p)
      assert.same({ b.epoch, b.first }, { c.epoch, c.first })
    end
    for k = 2, 5 do assert.equal(ids[1], ids[k], "batch " .. k .. "'s values in the first batch's buffer") end
    bufs:free()
    l:close()
    assert.has_error(function() Batch.new { sparse = {}, size = 1 } end, "Batch: sparse must be a KJT, got table")
    assert.has_error(function() Batch.new { sparse = ur.KJT { keys = { "a" }, values = {}, lengths = { 0 } } } end,
      "Batch: size must be the number of samples")
    assert.has_error(function() Batch.new { size = 1, sparse = ur.KJT { keys = { "a" }, values = {}, lengths = { 0 } },
                                            grad = 1 } end,
      "Batch: unknown field 'grad'; expected dense, epoch, first, groups, labels, next, ready, release, "
      .. "size, sparse")
    local mine = Batch.new { sparse = ur.KJT { keys = { "a" }, values = { 3 }, lengths = { 1 } }, size = 1 }
    assert.is_nil(mine:position())
    assert.has_error(function() mine:to("host", nil, Batch.buffers("managed")) end,
      "Batch:to: buffers in managed, not host")
  end)
end)
