-- uvmrec.train.source: the loader's batches copied into buffers of their own (as onto a GPU),
-- equal to the loader's, each a Batch whose sparse is a KJT with the keys checked by the
-- embedding collection; the events that order the copies are synchronised only once recorded,
-- whatever number of batches was taken (one batch, then drain: the case an evaluation of a
-- single batch hits); a source re-attached to a new loader goes on; a step limit; a ring of
-- batches held in place, taken in turn; a config's first batches held.  The event logic is the
-- engine's on every backend, so host and managed buffers exercise it without a GPU.
local ur = require "uvmrec"
local source = require "uvmrec.train.source"
local Batch = require "uvmrec.data.batch"
local loader = require("helpers").tiny_loader

describe("uvmrec.train.source", function()
  it("copies the loader's batches into buffers of their own, equal to the loader's, a KJT each", function()
    local function dcnv2()
      return assert(ur.data.loader { data = "synthetic:dcnv2", samples = 700, batch_size = 256, seed = 3 })
    end
    local a, b = dcnv2(), dcnv2()
    local f = source.loader(b, { placement = "managed" })
    local n = 0
    while true do
      local x, y = a:next(), assert(f:next() or true)
      if not x then
        assert.is_true(y)
        break
      end
      n = n + 1
      assert.is_true(Batch.is(y))
      assert.equal(x.size, y.size)
      assert.same({ x.epoch, x.first }, { y.epoch, y.first })
      assert.equal("managed", y.dense:placement())
      assert.equal("managed", y.sparse:placement())
      assert.same(x.dense:totable(), y.dense:totable())
      assert.same(x.labels:totable(), y.labels:totable())
      assert.same(x.sparse:keys(), y.sparse:keys())
      for _, k in ipairs { "values", "lengths", "offsets" } do
        assert.same(x.sparse[k](x.sparse):totable(), y.sparse[k](y.sparse):totable(), k)
      end
    end
    assert.equal(3, n, "two full batches and the rest")
    f:free()
    a:close()
    b:close()
  end)

  it("drains after a single batch and after the data ends, and stops at its step limit", function()
    local l = loader(256)
    local f = source.loader(l, { placement = "host" })
    local b = assert(f:next())
    assert.equal(256, b.size)
    f:drain()
    assert.is_nil(f:next())
    f:drain()
    f:free()
    l:close()
    local l2 = loader(2560)
    local g = source.loader(l2, { steps = 2 })
    assert(g:next())
    assert(g:next())
    assert.is_nil(g:next())
    g:close()
    l2:close()
  end)

  it("re-attaches to a new loader and hands over its batches unchanged", function()
    local a, l1, l2 = loader(600), loader(300), loader(600)
    local f = source.loader(l1, { placement = "host" })
    assert(f:next())
    f:attach(l2)
    for _ = 1, 3 do
      local x, y = assert(a:next()), assert(f:next())
      assert.same(x.labels:totable(), y.labels:totable())
      assert.same(x.sparse:values():totable(), y.sparse:values():totable())
    end
    assert.is_nil(f:next())
    f:free()
    for _, l in ipairs { a, l1, l2 } do l:close() end
  end)

  it("holds batches in place and takes them in turn from a ring, to a step limit", function()
    local held = source.hold(loader(1024), 3)
    local r = source.ring(held, 7)
    local got = {}
    while true do
      local b = r:next()
      if not b then break end
      got[#got + 1] = b
    end
    assert.equal(7, #got)
    assert.same({ held[1], held[2], held[3], held[1] }, { got[1], got[2], got[3], got[7] })
    assert.equal("host", held[1].sparse:placement())
    assert.same({ 0, 256 }, { held[2].epoch, held[2].first })
    for _, b in ipairs(held) do b:release() end
    assert.has_error(function() source.ring({}) end, "source.ring: expected a list of batches")
  end)

  it("holds n batches of a config's data from its start, and gives the options of a loader of them", function()
    local train = require "uvmrec.train"
    local path = assert(train.find_config("dlrm_tiny"))
    local cfg = assert(train.config.load(path, { "train.batch_size=64", "train.epochs=2" }))
    local held, opts = assert(source.hold_data(cfg, 3))
    assert.equal(3, #held)
    assert.same({ 192, 1, 64 }, { opts.samples, opts.epochs, opts.batch_size })
    local ref = assert(ur.data.loader(opts))
    for i = 1, 3 do
      local x, y = assert(ref:next()), held[i]
      assert.same({ 64, x.first }, { y.size, y.first })
      assert.same(x.dense:totable(), y.dense:totable())
      assert.same(x.labels:totable(), y.labels:totable())
      assert.same(x.sparse:values():totable(), y.sparse:values():totable())
    end
    assert.is_nil(ref:next(), "one epoch of 3 batches")
    ref:close()
    for _, b in ipairs(held) do b:release() end
    cfg.data.train = ""
    local none, err = source.hold_data(cfg, 3)
    assert.is_nil(none)
    assert.equal("no training data: give --data SPEC or data.train in the config", err)
  end)
end)
