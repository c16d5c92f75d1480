-- The loader's batches drawn where they are used (uvmrec.data.generator): on the CPU with
-- placement "managed" (host memory there), on the GPU with "device" (#cuda).  Against the
-- threaded loader from host memory, batch for batch.
local ur = require "uvmrec"
local h = require "helpers"
local data = ur.data

-- Every batch of a loader as {epoch, first, size, kjt = totable(), dense, labels, groups}.
local function batches(l)
  local out = {}
  for b in l:batches() do
    out[#out + 1] = { epoch = b.epoch, first = b.first, size = b.size, kjt = b.sparse:totable(),
                      dense = b.dense:totable(), labels = b.labels:totable(),
                      groups = b.groups and b.groups:totable() }
  end
  l:close()
  return out
end

local function same(place)
  local specs = {
    data.synthetic_spec { num_dense = 3, seed = 2, groups = 3,
      tables = { { rows = 60, zipf = 1.1 }, { rows = 25, hot = { 0, 3 }, weighted = true }, { rows = 7, hot = 2 } } },
    data.synthetic_spec { num_dense = 2, seed = 8, tables = { { rows = 40 }, { rows = 9, hot = 4 } } },
  }
  local cases = {
    { batch_size = 128, epochs = 2 },
    { batch_size = 300, epochs = 3, drop_last = true },
    { batch_size = 100, epochs = 2, rank = 1, world = 3, position = { epoch = 0, sample = 200 } },
    { batch_size = 64, epochs = 2, position = { epoch = 1, sample = 640 } },
    -- a rank's slices of global batches (uneven where the ranks do not divide a batch)
    { batch_size = 100, epochs = 2, slice_rank = 2, slice_world = 3 },
    { batch_size = 128, epochs = 2, slice_rank = 0, slice_world = 2, position = { epoch = 0, sample = 256 } },
  }
  for si, spec in ipairs(specs) do
    for ci, c in ipairs(cases) do
      local o = { data = { kind = "synthetic", spec = spec }, samples = 1000, depth = 2 }
      for k, v in pairs(c) do o[k] = v end
      local want = batches(assert(data.loader(o)))
      o.placement = place
      local l = assert(data.loader(o))
      local got = batches(l)
      local what = ("spec %d, case %d"):format(si, ci)
      assert.equal(#want, #got, what)
      for i = 1, #want do assert.same(want[i], got[i], what .. ", batch " .. i) end
    end
  end
end

describe("uvmrec.data.generator", function()
  it("gives the loader's batches, drawn in managed memory: epochs, dropped ends, ranks, slices, resumed",
     function()
    same("managed")
  end)

  it("keeps a batch until the next() after the one that returned it, then frees it; knows where it is", function()
    local l = assert(data.loader { data = "synthetic:tiny", samples = 5000, batch_size = 1000, placement = "managed" })
    local b1 = assert(l:next())
    local b2 = assert(l:next())
    assert.equal("managed", b1.dense:placement())
    assert.equal(1000, b1.labels:numel())
    assert(l:next())
    assert.has_error(function() return b1.labels:numel() end, "tensor: used after free()")
    assert.equal(1000, b2.labels:numel())
    assert.same({ epoch = 0, sample = 3000 }, l:position())
    local st = l:stats()
    assert.same({ 3, 3000, 5000 }, { st.batches, st.samples, st.samples_per_epoch })
    l:close()
    l:close()
  end)

  it("refuses a shuffle window: the generator's samples are independent draws already", function()
    assert.has_error(function()
      data.loader { data = "synthetic:tiny", samples = 100, batch_size = 10, placement = "managed",
                    shuffle_window = 50 }
    end, "loader: the generator (placement 'managed') makes batches in sample order; shuffle_window must be 0 (its "
      .. "samples are independent draws already), not 50")
  end)

  h.cuda_it("gives the loader's batches drawn on the GPU, with no host copy", function()
    same("device")
    local l = assert(data.loader { data = "synthetic:mlperf_v1", samples = 65536 * 2, batch_size = 65536,
                                   placement = "device" })
    local b = assert(l:next())
    assert.equal("device", b.dense:placement())
    assert.equal("device", b.sparse:placement())
    l:close()
  end)
end)
