-- Hint policies and their manager (lua/uvmrec/hints/) on the CPU: managed tables there are host
-- memory whose hints the engine validates and records, so what each policy chose is read back
-- from the hint log and the engine's record, and checked against the counts it was given.
local ur = require "uvmrec"
local R = require "tbe_ref"
local hints = require "uvmrec.hints"

local EBC = ur.nn.EmbeddingBagCollection
local PAGE = 4096

-- Two managed tables: a (8192 rows of 64 bytes, rowwise Adagrad's 4-byte state beside) and b.
local function tables()
  return EBC { tables = { { name = "a", rows = 8192, dim = 16 }, { name = "b", rows = 2048, dim = 32 } },
               device = "cpu", placement = "managed", optimizer = { "rowwise_adagrad", lr = 0.1 }, seed = 2 }
end

-- One forward: feature t reads each id of hot[t] `times` times (one id a bag); the shorter
-- feature is padded with reads of id 0 (features of a batch have the same number of bags).
local function feed(m, hot, times)
  local na, nb = #hot[1] * times, #hot[2] * times
  local B = math.max(na, nb)
  local vals, offs = {}, { 0 }
  for t, n in ipairs { na, nb } do
    local ids = hot[t]
    for i = 1, B do
      if i <= n then vals[#vals + 1] = ids[(i - 1) % #ids + 1] else vals[#vals + 1] = 0 end
      offs[#offs + 1] = #vals
    end
  end
  m:forward { values = R.tensor(vals, "i64"), offsets = R.tensor(offs, "i64") }
end

-- The log's records since `since`, per tensor id: {advice or "prefetch", location, bytes}.
local function log_since(since)
  local out = {}
  for _, r in ipairs(ur.hint_log(since)) do
    out[#out + 1] = { kind = r.kind, advice = r.advice, location = r.location, tensor = r.tensor_id,
                      b0 = r.range.byte_begin, b1 = r.range.byte_end }
  end
  return out
end

local function last_seq()
  local l = ur.hint_log()
  return #l > 0 and l[#l].seq or 0
end

describe("uvmrec.hints policies", function()
  it("host: every row preferred on the host and accessed by the GPU, once, nothing counted on the GPU", function()
    local m = tables()
    local gpu0 = ur.memory().managed_on_gpu
    local s0 = last_seq()
    local mgr = hints.manager(m, { policy = "host", every = 5 })
    mgr:start(0)
    local log = log_since(s0)
    -- 2 tables x (weights, state) x (preferred, accessed_by, prefetch)
    assert.equal(12, #log)
    for _, name in ipairs { "a", "b" } do
      local ad = m:table(name):advised()
      assert.equal("cpu", ad.preferred_location)
      assert.same({ "cuda:0" }, ad.accessed_by)
      assert.equal("cpu", ad.last_prefetch_location)
    end
    assert.equal(gpu0, ur.memory().managed_on_gpu)
    feed(m, { { 1, 2 }, { 3 } }, 4)
    local s1 = last_seq()
    assert(mgr:step(5))
    assert.equal(0, #log_since(s1))
    mgr:free()
  end)

  it("none: no hint at all", function()
    local m = tables()
    local s0 = last_seq()
    local mgr = hints.manager(m, { policy = "none", every = 2 })
    mgr:start(0)
    feed(m, { { 5 }, { 6 } }, 3)
    mgr:step(2)
    assert.equal(0, #log_since(s0))
    mgr:free()
  end)

  it("hot_prefix: lays the counted rows out first and puts the prefix the allowance holds on the GPU", function()
    local m = tables()
    -- a holds 8192 x 68 bytes, b 2048 x 132: an allowance of 100 KiB
    local mgr = hints.manager(m, { policy = "hot_prefix", every = 10, allowance = 100 * 1024 })
    mgr:start(0)
    -- hot ids of a: 100 ids read 5 times; b: 40 ids 5 times; everything else never
    local ha, hb = {}, {}
    for i = 1, 100 do ha[i] = (i * 797) % 8192 end
    for i = 1, 40 do hb[i] = (i * 131) % 2048 end
    feed(m, { ha, hb }, 5)
    local s0 = last_seq()
    local rec = assert(mgr:step(10))
    -- the counted rows now sit at the front, hottest first (ties by id)
    local pa = m.tbe:permutation("a"):totable()
    local sorted = {}
    for i, id in ipairs(ha) do sorted[i] = id end
    table.sort(sorted)
    for rank, id in ipairs(sorted) do assert.equal(rank - 1, pa[id + 1]) end
    -- both hot sets fit: every counted row is on the GPU, the split fills the rest by bytes
    local ka, kb = mgr.tables[1].k, mgr.tables[2].k
    assert.is_true(ka >= 100 and kb >= 40, ka .. " " .. kb)
    assert.is_true(ka * 68 + kb * 132 <= 100 * 1024)
    assert.equal(1, rec.coverage)
    -- the log: weights of a [0, ka rows) preferred on the GPU, the rest on the host
    local w = m:table("a")
    local hot = w:advised(0, math.floor(ka * 64 / PAGE) * PAGE / 4) -- its whole pages
    assert.equal("cuda:0", hot.preferred_location)
    assert.equal("cuda:0", hot.last_prefetch_location)
    local first_cold = math.ceil(ka * 64 / PAGE) * PAGE / 64 -- the first row of a page of its own
    local cold = w:advised(first_cold * 16, (8192 - first_cold) * 16)
    assert.equal("cpu", cold.preferred_location)
    assert.same({ "cuda:0" }, cold.accessed_by)
    -- what is counted on the GPU is what the policies placed, within the allowance
    assert.is_true(rec.bytes_on_gpu <= 100 * 1024)
    local kinds = {}
    for _, r in ipairs(log_since(s0)) do kinds[r.kind .. ":" .. (r.advice or "") .. ":" .. r.location] = true end
    assert.is_true(kinds["advise:preferred_location:cuda:0"] and kinds["prefetch::cuda:0"] and
                   kinds["advise:preferred_location:cpu"] and kinds["advise:accessed_by:cuda:0"] or false)
    -- a later interval with the same allowance changes nothing
    local s1 = last_seq()
    assert(mgr:step(20))
    assert.equal(0, #log_since(s1))
    mgr:free()
  end)

  it("split the allowance over tables by counts: the hottest rows of all tables first, by the pages they touch",
     function()
    collectgarbage() -- earlier tests' tables leave the engine's record of GPU bytes
    local gpu0 = ur.memory().managed_on_gpu
    local m = tables()
    -- a's hot rows and b's take one page of weights and one of state each after the relayout
    -- (four pages); b's 600 rows read once would take 20 pages more: the allowance holds 10
    local mgr = hints.manager(m, { policy = "hot_prefix", every = 1, allowance = 10 * PAGE })
    mgr:start(0)
    local ha, hb = {}, {}
    for i = 1, 30 do ha[i] = i * 11 end
    for i = 1, 600 do hb[i] = i + 10 end
    feed(m, { ha, { 1, 2, 3 } }, 20) -- a's 30 ids and b's 3 ids are read 20 times
    feed(m, { { 4000 }, hb }, 1)      -- b's 600 others once (a's feature padded with id 0)
    local rec = assert(mgr:step(1))
    local ka, kb = mgr.tables[1].k, mgr.tables[2].k
    assert.is_true(ka >= 32, "a: " .. ka) -- its 30 hot ids, id 0 (the padding) and id 4000
    assert.is_true(kb >= 3 and kb < 600, "b: " .. kb)
    assert.is_true(rec.bytes_on_gpu - gpu0 <= 10 * PAGE, "on the GPU: " .. rec.bytes_on_gpu - gpu0)
    mgr:free()
  end)

  it("adaptive: re-ranks as the stream drifts and swaps only the rows that crossed", function()
    local m = tables()
    local mgr = hints.manager(m, { policy = "adaptive", every = 1, allowance = 64 * 1024, decay = 0 })
    mgr:start(0)
    local first = {}
    for i = 1, 100 do first[i] = i * 3 end
    feed(m, { first, { 1 } }, 4)
    assert(mgr:step(1))
    local ka = mgr.tables[1].k
    local probe = { values = R.tensor({ 3, 6, 9, 1 }, "i64"), offsets = R.tensor({ 0, 1, 2, 3, 4 }, "i64") }
    local before = m:forward(probe)
    local w_before = before:totable()
    -- the same stream: within the margin, nothing moves
    feed(m, { first, { 1 } }, 4)
    local rec = assert(mgr:step(2))
    assert.equal(0, rec.rows_moved)
    -- another stream: 50 new hot ids, outside the prefix
    local second = {}
    for i = 1, 50 do second[i] = 5000 + i end
    feed(m, { second, { 1 } }, 8)
    local s0 = last_seq()
    rec = assert(mgr:step(3))
    assert.is_true(rec.rows_moved > 0 and rec.rows_moved <= 2 * 50, "moved " .. rec.rows_moved)
    local pa, k2 = m.tbe:permutation("a"):totable(), mgr.tables[1].k
    for _, id in ipairs(second) do assert.is_true(pa[id + 1] < k2, "id " .. id .. " at " .. pa[id + 1]) end
    -- the share moved a little with the counts: only rows between the old end and the new one
    -- are advised again (the prefix is prefetched again: its rows were rewritten)
    local wid = m:table("a"):id()
    local lo = math.floor(math.min(ka, k2) * 64 / PAGE) * PAGE
    for _, r in ipairs(log_since(s0)) do
      if r.tensor == wid and r.kind == "advise" then assert.is_true(r.b0 >= lo, r.b0 .. " < " .. lo) end
    end
    -- lookups read the same values after the swap
    local after = m:forward(probe)
    assert.same(w_before, after:totable())
    mgr:free()
  end)

  it("a custom policy is one short Lua file", function()
    local path = os.tmpname() .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write([[
local hints = require "uvmrec.hints"
local P = hints.policy("top_pages", { rows = 64 })
function P:plan(stats, allowance)
  if self.done[stats.name] then return {} end
  self.done[stats.name] = true
  local k = math.min(self.opts.rows, stats:prefix_rows(allowance))
  return hints.split({ hints.relayout("counts") }, stats.rows, k)
end
return P
]])
    f:close()
    local m = tables()
    local mgr = hints.manager(m, { policy = path, options = { rows = 128 }, every = 1, allowance = "50%" })
    mgr:start(0)
    assert.equal(128, mgr.tables[1].k)
    assert.equal("top_pages", mgr.tables[1].policy.name)
    mgr:free()
    os.remove(path)
  end)

  it("report bad policies, options and allowances clearly", function()
    local m = tables()
    assert.has_error(function() hints.manager(m, { policy = "hottest" }) end,
      "hints: no policy 'hottest'; built in: none, host, hot_prefix, adaptive, or a path to a .lua file")
    assert.has_error(function() hints.manager(m, { policy = "adaptive", options = { margni = 1 } }) end,
      "hints: policy 'adaptive' has no option 'margni'")
    assert.has_error(function() hints.manager(m, { allowance = "lots" }) end)
    assert.has_error(function() hints.manager(m, { every = 0 }) end, "hints: every must be >= 1 step")
  end)

  it("keep what they place within the HBM budget, or fail naming it", function()
    local m = tables()
    assert(ur.set_hbm_budget(16 * 1024))
    local ok, err = pcall(function()
      local mgr = hints.manager(m, { policy = "hot_prefix", allowance = 400 * 1024 })
      mgr:start(0)
    end)
    assert(ur.set_hbm_budget(0))
    assert.is_false(ok)
    assert.matches("hbm budget: preferred_location on managed tensor #%d+ asks for", tostring(err))
  end)
end)
