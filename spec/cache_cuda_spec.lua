-- uvmrec.cache on the GPU against the CPU reference and against device tables: the same
-- decisions (slots, statistics), the same rows after every step (bit for bit for SGD in f32
-- against device tables on the GPU, which run the same kernels over other rows), and rows
-- written back to host memory on eviction and flush.  Every test is #cuda.
local ffi = require "ffi"
local ur = require "uvmrec"
local h = require "helpers"
local R = require "tbe_ref"

local cuda_it = h.cuda_it
local EBC = ur.nn.EmbeddingBagCollection

local TABLES = { { name = "t0", rows = 700, dim = 16 }, { name = "t1", rows = 300, dim = 16 },
                 { name = "t2", rows = 2000, dim = 16 } }

local function make(device, placement, optimizer, cache)
  local o = { tables = {}, device = device, seed = 9, optimizer = optimizer, cache = cache }
  for i, t in ipairs(TABLES) do
    o.tables[i] = { name = t.name, rows = t.rows, dim = t.dim, placement = placement }
  end
  return EBC(o)
end

local function batch(step)
  local values, offsets = {}, { 0 }
  local shift = math.floor(step / 6) * 131
  for _, t in ipairs(TABLES) do
    for _ = 1, 24 do
      for _ = 1, math.random(0, 3) do
        values[#values + 1] = (math.floor(t.rows * math.random() ^ 3) + shift) % t.rows
      end
      offsets[#offsets + 1] = #values
    end
  end
  return { values = values, offsets = offsets }
end

local function host_copy(t)
  return t:placement() == "host" and t or assert(t:to("host"))
end

local function bits_equal(a, b, what)
  a, b = host_copy(a), host_copy(b)
  assert.equal(a:numel(), b:numel(), what)
  local pa = ffi.cast("const uint32_t *", ur.C.ur_tensor_data(a.p))
  local pb = ffi.cast("const uint32_t *", ur.C.ur_tensor_data(b.p))
  for i = 0, a:numel() - 1 do
    if pa[i] ~= pb[i] then
      error(("%s: element %d is %.9g, expected %.9g"):format(what, i, a:get(i), b:get(i)), 2)
    end
  end
end

local function close(a, b, rel, what)
  a, b = host_copy(a):totable(), host_copy(b):totable()
  R.close(a, b, rel, rel * 1e-2, what)
end

describe("uvmrec.cache on CUDA", function()
  for _, case in ipairs({
    { "sgd", { "sgd", lr = 0.3 }, { slots = 64, shared = true, policy = "lru" } },
    { "rowwise adagrad", { "rowwise_adagrad", lr = 0.1 }, { load_factor = 0.05, policy = "lfu", decay_batches = 4 } },
    { "adam", { "adam", lr = 0.01 }, { slots = 32, shared = true, staging_rows = 8 } },
  }) do
    local name, optimizer, cache = case[1], case[2], case[3]
    cuda_it("makes the CPU's decisions and keeps device tables' rows (" .. name .. ")", function()
      math.randomseed(21)
      local gc = make(0, "cached", optimizer, cache)
      local gd = make(0, "device", optimizer)
      local cc = make("cpu", "cached", optimizer, cache)
      for step = 1, 24 do
        local b = batch(step)
        local xg, xc = R.input(b, "device"), R.input(b, "host")
        local og, od, oc = gc:forward(xg), gd:forward(xg), cc:forward(xc)
        bits_equal(og, od, "step " .. step .. " forward, cached vs device")
        close(og, oc, 1e-5, "step " .. step .. " forward, GPU vs CPU")
        local g = R.tensor(R.randoms(og:numel()), "f32", "device"):view_as(0, { og:size(1), og:size(2) })
        local gh = assert(g:to("host"))
        gc:backward(xg, g)
        gd:backward(xg, g)
        cc:backward(xc, gh)
      end
      local sg, sc = gc.tbe.cache:stats(), cc.tbe.cache:stats()
      for _, f in ipairs({ "lookups", "unique", "hits", "misses", "conflicts", "evictions", "writebacks",
                           "bytes_in", "bytes_out" }) do
        assert.equal(sc[f], sg[f], f)
      end
      assert.is_true(sg.evictions > 0 and sg.writebacks > 0)
      for _, t in ipairs(TABLES) do
        local probe = {}
        for r = 0, t.rows - 1 do probe[#probe + 1] = r end
        assert.same(cc.tbe.cache:contains(t.name, probe), gc.tbe.cache:contains(t.name, probe))
        if name == "sgd" then
          bits_equal(gc:table(t.name), gd:table(t.name), t.name .. " after flush, cached vs device")
        else
          close(gc:table(t.name), gd:table(t.name), 1e-5, t.name .. " after flush, cached vs device")
        end
        close(gc:table(t.name), cc:table(t.name), 1e-4, t.name .. " after flush, GPU vs CPU")
      end
    end)
  end

  cuda_it("counts its slots against the HBM budget", function()
    local before = ur.memory().hbm_used
    local m = make(0, "cached", "sgd", { slots = 4096, shared = true })
    local used = ur.memory().hbm_used - before
    assert.is_true(used >= m.tbe.cache:bytes(), ("%d bytes used for %d"):format(used, m.tbe.cache:bytes()))
    m.tbe:free()
  end)
end)
