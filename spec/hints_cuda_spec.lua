-- Hint policies on a GPU (#cuda; pending without one): what the CUPTI monitor measured moving
-- after each policy matches the policy's plan (the prefix it prefetched moved, what it left on
-- the host did not, and reading it faults nothing in), where the pages are (a timed read), and
-- training with `managed` tables under each policy gives the losses of `device` tables bit for
-- bit.
local ur = require "uvmrec"
local h = require "helpers"
local R = require "tbe_ref"
local hints = require "uvmrec.hints"

local cuda_it = h.cuda_it
local EBC = ur.nn.EmbeddingBagCollection
local MiB = 2 ^ 20

-- The monitor counts managed memory allocated after it starts: start it before any table.
-- Without CUPTI's counters (under compute-sanitizer, CUPTI's one subscriber is taken) the test
-- is pending.
local function monitor()
  local ok, err = ur.monitor.start()
  if not ok then
    pending("CUPTI unified-memory counters unavailable here: " .. tostring(err))
    return false
  end
  ur.monitor.read(true)
  return true
end

local sanitized = os.getenv("UVMREC_SANITIZER") ~= nil

-- Two managed tables of 64 MiB each (f32 rows of 512 bytes), on the GPU, SGD.
local function tables()
  return EBC { tables = { { name = "a", rows = 131072, dim = 128 }, { name = "b", rows = 131072, dim = 128 } },
               device = 0, placement = "managed", seed = 9 }
end

-- Zipf-like ids scattered over the rows (hot ids are not the low ones).
local function batch(n, seed)
  math.randomseed(seed)
  local vals, offs = {}, { 0 }
  for _ = 1, 2 do
    for _ = 1, n do
      local r = math.floor(131072 * math.random() ^ 4)
      vals[#vals + 1] = (r * 40503 + 17) % 131072
      offs[#offs + 1] = #vals
    end
  end
  return { values = R.tensor(vals, "i64", "device"), offsets = R.tensor(offs, "i64", "device") }
end

local function steps(m, n, seed)
  for s = 1, n do
    local inp = batch(4096, seed + s)
    local o = m:forward(inp)
    local g = assert(ur.tensor(o:size(), { placement = "device" }))
    g:uniform(-1, 1, s)
    m:backward(inp, g)
  end
  assert(ur.sync())
end

describe("uvmrec.hints on the GPU", function()
  cuda_it("hot_prefix: the prefix it prefetched moved to the GPU, the rest stays on the host, read in place",
          function()
    if not monitor() then return end
    collectgarbage() -- tables of earlier specs leave the engine's record of GPU bytes
    local gpu0 = ur.memory().managed_on_gpu
    local m = tables()
    local mgr = hints.manager(m, { policy = "hot_prefix", allowance = 32 * MiB, every = 1000, monitor = false })
    assert(mgr:start(0)) -- no counts yet: the allowance split by bytes, prefixes of the identity layout
    steps(m, 4, 1)
    ur.monitor.read(true)
    local rec = assert(mgr:interval(4)) -- relayout by the counts, then the prefixes placed
    assert(ur.sync())
    local mig = assert(ur.monitor.read(true))
    local k = mgr.tables[1].k
    assert.is_true(k > 0 and k < 131072)
    -- the relayout ran on the CPU (managed pages came to the host), then the prefixes went back
    local prefix_bytes = (mgr.tables[1].k + mgr.tables[2].k) * 512
    local what = ("moved %d bytes in, prefixes hold %d"):format(mig.bytes_htod, prefix_bytes)
    assert.is_true(mig.bytes_htod >= 0.8 * prefix_bytes, what) -- prefix pages no moved row touched stay
    assert.is_true(mig.bytes_htod <= 1.05 * prefix_bytes + 4 * MiB, what)
    assert.is_true(rec.bytes_on_gpu - gpu0 <= 32 * MiB, "placed " .. rec.bytes_on_gpu - gpu0)
    -- training reads the cold rows in place: nothing migrates
    steps(m, 4, 100)
    mig = assert(ur.monitor.read(true))
    assert.is_true(mig.bytes_htod < 0.02 * (262144 * 512 - prefix_bytes), "cold rows migrated: " .. mig.bytes_htod)
    local w = m:table("a")
    local hot = assert(w:residency(0, k * 128))
    local cold = assert(w:residency(k * 128 + 128 * 1024, 131072 * 128 - k * 128 - 128 * 1024))
    if not sanitized then -- timings mean nothing under compute-sanitizer
      local refs = (" GB/s (device %.1f, pinned host %.1f)"):format(hot.device_gbps, hot.host_gbps)
      if not hot.fast then -- say where the prefix's pages were: by eighths (2 MiB or so each: a
        -- verdict holds from 1 MiB), and what left the GPU while training
        local part, where = math.floor(k * 128 / 8), {}
        for i = 0, 7 do where[i + 1] = assert(w:residency(i * part, part)).where end
        refs = refs .. ("; its eighths read as %s; %d bytes left the GPU while training"):format(
          table.concat(where, " "), mig.bytes_dtoh)
      end
      assert.is_true(hot.fast, "the prefix reads at " .. hot.gbps .. refs)
      assert.is_false(cold.fast, "the host rows read at " .. cold.gbps .. refs)
    end
    mgr:free()
    m.tbe:free()
  end)

  cuda_it("host: nothing moves to the GPU, before or while training, and the budget holds no byte of it", function()
    if not monitor() then return end
    collectgarbage()
    local m = tables()
    local before = ur.memory().managed_on_gpu
    local mgr = hints.manager(m, { policy = "host", every = 1000, monitor = false })
    assert(mgr:start(0))
    steps(m, 4, 7)
    local mig = assert(ur.monitor.read(true))
    assert.is_true(mig.bytes_htod < MiB, "moved " .. mig.bytes_htod)
    assert.equal(before, ur.memory().managed_on_gpu)
    local r = assert(m:table("b"):residency())
    if not sanitized then assert.is_false(r.fast) end
    mgr:free()
    m.tbe:free()
  end)

  cuda_it("none: the driver migrates the pages training touches, by page faults", function()
    if not monitor() then return end
    local m = tables()
    steps(m, 4, 9)
    local mig = assert(ur.monitor.read(true))
    assert.is_true(mig.bytes_htod > MiB, "moved " .. mig.bytes_htod)
    assert.is_true(mig.gpu_page_faults > 0)
    m.tbe:free()
  end)

  cuda_it("adaptive: a drift swaps only the rows that crossed, and lookups read the same values after", function()
    local m = tables()
    local mgr = hints.manager(m, { policy = "adaptive", allowance = 16 * MiB, every = 1000, decay = 0,
                                   monitor = false })
    assert(mgr:start(0))
    steps(m, 3, 1)
    assert(mgr:interval(3)) -- sorted by counts; decay 0 then forgets them
    steps(m, 3, 5000)       -- another stream: other ids are hot
    local probe = batch(2048, 4242)
    local before = m:forward(probe):totable()
    local counts = { a = m.tbe:counts("a"):totable(), b = m.tbe:counts("b"):totable() } -- decay 0 clears them
    local rec = assert(mgr:interval(6))
    assert.is_true(rec.rows_moved > 0 and rec.rows_moved < 2 * 131072 * 0.2, "moved " .. rec.rows_moved)
    assert.same(before, m:forward(probe):totable())
    -- ranked on the GPU (the CPU's fallback gives the same order: the record tells them apart),
    -- and the coverage measured under the layout the engine holds after the swaps, from the
    -- counters as ranked (neither read back a second time)
    assert.equal("device", rec.rank_on)
    for i, name in ipairs { "a", "b" } do
      assert.equal("device", rec.tables[name].rank_on)
      local c, p = counts[name], m.tbe:permutation(name):totable()
      local covered, total = 0, 0
      for id = 1, #c do
        total = total + c[id]
        if p[id] < mgr.tables[i].k then covered = covered + c[id] end
      end
      assert.equal(covered / total, rec.tables[name].coverage, name)
    end
    mgr:free()
    m.tbe:free()
  end)

  cuda_it("training with managed tables gives the device tables' losses bit for bit, under every policy", function()
    local function losses(placement, policy)
      local sets = { "train.steps=12", "train.batch_size=512", "eval.samples=0", "eval.min_auc=0", "train.log_every=1",
                     "embeddings.placement=" .. placement, "embeddings.hints.every=4",
                     "embeddings.hints.allowance=20%" }
      if policy then sets[#sets + 1] = "embeddings.hints.policy=" .. policy end
      return h.train_tiny(sets, nil, { cpu = false }).losses
    end
    local want = losses("device")
    assert.equal(12, #want)
    for _, p in ipairs { "none", "host", "hot_prefix", "adaptive" } do
      assert.same(want, losses("managed", p), "policy " .. p)
    end
  end)
  -- The monitor's read is a forced flush of CUPTI's buffers (16 ms on the H200): by default a
  -- manager reads it at its summaries only, an interval's record has none; "interval" reads it
  -- each interval too.
  cuda_it("reads the migration monitor at its summaries, and each interval only when asked", function()
    if not monitor() then return end
    for _, mode in ipairs { "end", "interval" } do
      local m = tables() -- fresh: the relayout's interval moves its prefixes in
      local mgr = hints.manager(m, { policy = "hot_prefix", allowance = 32 * MiB, every = 2, monitor = mode })
      assert.equal(mode, mgr.monitor)
      assert(mgr:start(0))
      steps(m, 2, 7)
      local rec = assert(mgr:interval(2))
      steps(m, 2, 9)
      local again = assert(mgr:interval(4))
      if mode == "end" then
        assert.is_nil(rec.migration)
        assert.is_nil(again.migration)
      else
        assert.is_table(rec.migration)
        assert.is_true(rec.migration.bytes_htod > 0, "the relayout's interval moved the prefixes in")
        assert.is_table(again.migration)
      end
      if mode == "end" then
        assert.is_table(mgr:read_monitor())
        assert.is_table(again.migration) -- the last record carries it
      else
        assert.is_nil(mgr:read_monitor())
      end
      assert.matches("migrated [%d.]+ %a+ in / [%d.]+ %a+ out, %d+ faults", mgr:summary())
      mgr:free()
      m.tbe:free()
    end
  end)
end)
