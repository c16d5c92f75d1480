-- The hot_prefix policy (lua/uvmrec/hints/hot_prefix.lua) through the hints manager on the CPU:
-- the relayout by counts, the prefix the allowance holds, the allowance split over tables.
local ur = require "uvmrec"
local H = require "hints_ref"

local feed, log_since, last_seq = H.feed, H.log_since, H.last_seq
local PAGE = H.PAGE

describe("uvmrec.hints.hot_prefix", function()
  it("lays the counted rows out first and puts the prefix the allowance holds on the GPU", function()
    collectgarbage() -- earlier specs' tables leave the engine's record of GPU bytes
    local gpu0 = ur.memory().managed_on_gpu
    -- a holds 8192 x 68 bytes, b 2048 x 132: an allowance of 100 KiB
    local m, mgr = H.started { policy = "hot_prefix", every = 10, allowance = 100 * 1024 }
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
    assert.is_true(rec.bytes_on_gpu - gpu0 <= 100 * 1024, "on the GPU: " .. rec.bytes_on_gpu - gpu0)
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

  it("splits the allowance over tables by counts: the hottest rows of all tables first, by the pages they touch",
     function()
    collectgarbage() -- earlier specs' tables leave the engine's record of GPU bytes
    local gpu0 = ur.memory().managed_on_gpu
    -- a's hot rows and b's take one page of weights and one of state each after the relayout
    -- (four pages); b's 600 rows read once would take 20 pages more: the allowance holds 10
    local m, mgr = H.started { policy = "hot_prefix", every = 1, allowance = 10 * PAGE }
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
end)
