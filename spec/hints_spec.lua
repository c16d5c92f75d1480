-- The hints manager (lua/uvmrec/hints/init.lua) on the CPU: custom policies, bad policies and
-- allowances, the HBM budget, and the policies in `uvmrec train` (each built-in policy's own
-- spec: spec/hints/<policy>_spec.lua).
local ur = require "uvmrec"
local hints = require "uvmrec.hints"
local train = require "uvmrec.train"
local h = require "helpers"
local cmd = require "command"
local H = require "hints_ref"

local tables = H.tables

describe("uvmrec.hints", function()
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
      "hints: policy 'adaptive': unknown option 'margni'; expected band, margin")
    assert.has_error(function() hints.manager(m, { policy = "adaptive", options = { margin = "0.1" } }) end,
      "hints: policy 'adaptive': margin is 0.1 (a string); expected a number like its default, 0.02")
    assert.has_error(function() hints.manager(m, { policy = "adaptive", options = { margin = -0.5 } }) end,
      "hints: policy 'adaptive': margin is -0.5; expected a number in [0, 1)")
    -- a policy without options took any, dropping them
    assert.has_error(function() hints.manager(m, { policy = "hot_prefix", options = { margin = 0.1 } }) end,
      "hints: policy 'hot_prefix' takes no options; got 'margin'")
    assert.has_error(function() hints.manager(m, { allowance = "lots" }) end)
    -- inf (a manager that never steps), 0, negatives and fractions of a step: by lib.whole
    assert.has_error(function() hints.manager(m, { every = 0 }) end, "hints: every is 0; expected a whole number >= 1")
    assert.has_error(function() hints.manager(m, { every = -3 }) end,
      "hints: every is -3; expected a whole number >= 1")
    assert.has_error(function() hints.manager(m, { every = math.huge }) end,
      "hints: every is inf; expected a whole number below 2^63")
    assert.has_error(function() hints.manager(m, { every = "10" }) end,
      "hints: every is 10; expected a whole number >= 1")
    assert.has_error(function() hints.manager(m, { monitor = "always" }) end,
      'hints: monitor \'always\'; expected "end", "interval" or "off" (or true, false)')
    assert.has_error(function() hints.manager(m, { evry = 5 }) end,
      "hints: unknown manager option 'evry'; expected allowance, decay, every, location, monitor, options, "
      .. "policy, stream, tables")
    assert.has_error(function() hints.manager(m, { every = 1.5 }) end,
      "hints: every is 1.5; expected a whole number >= 1")
    assert.has_error(function() hints.manager(m, { decay = "half" }) end,
      "hints: decay is half; expected a number in [0, 1]")
    assert.has_error(function() hints.manager(m, { location = "gpux" }) end,
      "location: 'gpux' is not a location; expected cpu, gpu, cuda:N or a device number (-1 for the CPU, 0..63 "
      .. "for a GPU)")
    -- a table's settings with a typo were ignored (the default policy ran), a non-table raised from inside
    assert.has_error(function() hints.manager(m, { tables = { a = { polcy = "host" } } }) end,
                     "hints: tables.a: unknown option 'polcy'; expected policy, options, allowance")
    assert.has_error(function() hints.manager(m, { tables = { a = "host" } }) end,
                     "hints: tables.a is host; expected {policy =, options =, allowance =}")
    -- options with a policy object already made would be dropped (its own rows = 10 planned)
    local P = hints.policy("top", { rows = 64 })
    function P.plan() return {} end
    local msg = "hints: policy 'top' is an object, made with its options; give options with its class "
                .. "(hints.policy's) or a name, not with an object"
    assert.has_error(function() hints.manager(m, { policy = P.new { rows = 10 }, options = { rows = 256 } }) end, msg)
    assert.has_error(function()
      hints.manager(m, { tables = { a = { policy = P.new { rows = 10 }, options = { rows = 256 } } } })
    end, msg)
    assert.equal(256, hints.manager(m, { policy = P, options = { rows = 256 } }).tables[1].policy.opts.rows)
    -- a misspelt table's or a host table's settings were dropped silently, as was a manager of nothing
    assert.has_error(function() hints.manager(m, { tables = { c = { policy = "host" } } }) end,
                     "hints: tables.c: no table of that name (the collection's: a, b)")
    local mixed = ur.nn.EmbeddingBagCollection { device = "cpu", tables = {
      { name = "a", rows = 100, dim = 4, placement = "managed" },
      { name = "h", rows = 100, dim = 4, placement = "host" } } }
    assert.has_error(function() hints.manager(mixed, { tables = { h = { policy = "host" } } }) end,
                     "hints: tables.h: table h is placed host; hints are for managed tables")
    local host = ur.nn.EmbeddingBagCollection { device = "cpu", tables = { { name = "h", rows = 100, dim = 4 } } }
    assert.has_error(function() hints.manager(host, {}) end,
                     "hints: the collection has no managed table (h host); hints are for managed tables")
    -- a table's options without a policy of its own would be dropped for the default's
    assert.has_error(function() hints.manager(m, { tables = { a = { options = { rows = 256 } } } }) end,
      "hints: tables.a: options without a policy of its own (the default policy takes the manager's options); "
      .. "give tables.a.policy")
  end)

  it("read an allowance one way: a percentage, a fraction below 1, or bytes of at least a row's pages", function()
    local m = tables()
    local total = (8192 * 68 + 2048 * 132)
    local function allowance(v) return hints.manager(m, { policy = "none", allowance = v }).allowance end
    assert.equal(math.floor(0.2 * total), allowance(0.2))
    -- as a config gives it: a string, once read as 0 bytes (a fraction of a byte rounded down)
    assert.equal(math.floor(0.2 * total), allowance("0.2"))
    assert.equal(math.floor(0.25 * total), allowance("25%"))
    assert.equal(total, allowance("100%"))
    assert.equal(0, allowance(0))
    assert.equal(0, allowance("0%"))
    assert.equal(65536, allowance("64KiB"))
    assert.equal(8192, allowance(8192))
    -- 1 is a byte (it was taken as such, silently: nothing placed); it and every count below a
    -- row's pages are refused, naming the row
    local small = "less than one row of any table sharing it takes in whole pages (table a: 8192 bytes, rows of "
                  .. "68 bytes, pages of 4096); 0 places none, '100%' all of it"
    assert.has_error(function() allowance(1) end, "hints: allowance 1 is 1 byte(s), " .. small)
    assert.has_error(function() allowance("1") end, "hints: allowance '1' is 1 byte(s), " .. small)
    assert.has_error(function() allowance("4KiB") end, "hints: allowance '4KiB' is 4096 byte(s), " .. small)
    assert.has_error(function() allowance("150%") end, "hints: allowance '150%'; expected a percentage from 0% to 100%")
    for _, v in ipairs({ 1.5, -0.2, math.huge, "2G", "lots" }) do
      local what = type(v) == "string" and "'" .. v .. "'" or tostring(v)
      assert.has_error(function() allowance(v) end, "hints: allowance " .. what .. " is not bytes (123, '16GiB'), "
                       .. "a fraction below 1 (0.2) nor a percentage ('20%')")
    end
    -- a table's own, against its own rows (b: 132 bytes a row)
    assert.has_error(function()
      hints.manager(m, { tables = { b = { policy = "hot_prefix", allowance = 1000 } } })
    end, "hints: table b: allowance 1000 is 1000 byte(s), less than one row takes in whole pages (table b: 8192 "
         .. "bytes, rows of 132 bytes, pages of 4096); 0 places none, '100%' all of it")
    assert.equal(8192, hints.manager(m, { tables = { b = { policy = "hot_prefix", allowance = 8192 } } })
                         .tables[2].allowance)
  end)

  it("refuse a policy object another manager plans with, and take it once that one is freed", function()
    -- its state is by table name: the second manager's 'a', same name, counted and never laid out
    local P = hints.new("hot_prefix")
    local function run()
      local m = tables()
      local mgr = hints.manager(m, { policy = P, every = 1, allowance = "50%" })
      mgr:start(0)
      H.feed(m, { { 5000, 6000, 7000 }, { 1 } }, 4)
      assert(mgr:step(1))
      return m, mgr
    end
    -- a manager refused for another option does not keep the object (it was claimed before the
    -- monitor was checked, and every later manager refused: no manager to free)
    assert.has_error(function() hints.manager(tables(), { policy = P, monitor = "often" }) end,
      "hints: monitor 'often'; expected \"end\", \"interval\" or \"off\" (or true, false)")
    local m1, mgr1 = run()
    assert.is_truthy(m1.tbe:permutation("a"))
    assert.has_error(run, "hints: policy 'hot_prefix' (an object) plans for another manager already, keeping its "
      .. "state by table name; free that manager first, or give a name or a class (each manager makes its own)")
    mgr1:free()
    local m2, mgr2 = run()
    local p = m2.tbe:permutation("a"):totable()
    for _, id in ipairs { 5000, 6000, 7000 } do assert.is_true(p[id + 1] < 3, "id " .. id .. " at " .. p[id + 1]) end
    mgr2:free()
  end)

  it("take settings for each of 4000 tables in linear time (under 0.4 s CPU to make the manager)", function()
    -- each setting was looked for through every table: 1.03 s CPU at 4000 tables, 0.22 s at 2000
    local list, per = {}, {}
    for i = 1, 4000 do
      list[i] = { name = "t" .. i, rows = 8, dim = 4 }
      per["t" .. i] = { policy = i % 2 == 0 and "hot_prefix" or "host" }
    end
    local m = ur.nn.EmbeddingBagCollection { device = "cpu", placement = "managed", tables = list }
    local c0 = os.clock()
    local mgr = hints.manager(m, { policy = "none", tables = per })
    local cpu = os.clock() - c0
    assert.equal("hot_prefix", mgr.tables[4000].policy.name)
    assert.is_true(cpu < 0.4, ("%.2f s CPU"):format(cpu))
    mgr:free()
    m.tbe:free()
  end)

  it("rank each table into its last ranking's memory; a ranking a policy kept raises once taken or let go", function()
    local C = ur.C
    -- plans nothing; keeps each interval's ranking of each table, and while `look`, reads it
    local P = hints.policy("keeper", {})
    local kept, look = {}, true
    function P.plan(_, stats)
      if look then
        local a = stats.access
        kept[#kept + 1] = { a = a, name = stats.name, mem = C.ur_tensor_data(a.order.p), top = a:topk(1)[1] }
      end
      return {}
    end
    local m = tables()
    local mgr = hints.manager(m, { policy = P, every = 1, allowance = "50%" })
    H.feed(m, { { 5000, 6000 }, { 7, 7 } }, 4) -- no padding reads of id 0: as many reads a feature
    assert(mgr:step(1))
    -- after its interval, a kept ranking still reads as ranked (it was freed there)
    assert.same({ "a", "b" }, { kept[1].name, kept[2].name })
    assert.equal(5000, kept[1].a:topk(1)[1])
    assert.equal(7, kept[2].a:topk(1)[1])
    H.feed(m, { { 3000 }, { 9 } }, 40)
    assert(mgr:step(2))
    -- the second interval ranked into the first's memory, table by table, to the new counts
    assert.same({ kept[1].mem, kept[2].mem }, { kept[3].mem, kept[4].mem })
    assert.same({ 3000, 9 }, { kept[3].top, kept[4].top })
    -- the first's would read them as its own: it raises, naming the table
    assert.has_error(function() return kept[1].a:topk(1) end, "access snapshot of table 'a' used after a later "
      .. "snapshot took its order, sums and counts (snapshot's `into`: it is valid until then)")
    assert.has_error(function() return kept[2].a.total end)
    -- an interval that ranks nothing (the split settled, the plan not looking) lets the last go
    look = false
    assert(mgr:step(3))
    assert.has_error(function() return kept[3].a:topk(1) end, "access snapshot of table 'a' used after its free()")
    look = true
    assert(mgr:step(4))
    assert.equal(3000, kept[5].a:topk(1)[1])
    mgr:free()
    assert.has_error(function() return kept[6].a:topk(1) end, "access snapshot of table 'b' used after its free()")
  end)

  it("fail naming the policy, the table and the value when a plan returns garbage", function()
    local function plan_err(plan)
      local P = hints.policy("junk", {})
      P.plan = plan
      local ok, err = pcall(function() hints.manager(tables(), { policy = P, every = 1 }):start() end)
      assert.is_false(ok)
      return (tostring(err):gsub("^[^:]*:%d+: ", ""))
    end
    assert.equal("hints: policy junk, table 'a': plan returned nil; expected a list of actions",
                 plan_err(function() return nil end))
    assert.equal("hints: policy junk, table 'a': action 1 is 5; expected a table from hints.advise, "
                 .. "hints.prefetch or hints.relayout", plan_err(function() return { 5 } end))
    assert.equal("hints: policy junk, table 'a': action 1 has kind 'move'; expected advise, prefetch or relayout",
                 plan_err(function() return { { kind = "move", first = 0, rows = 1 } } end))
    assert.equal("hints: policy junk, table 'a': action 1 first is 0; expected a whole number",
                 plan_err(function() return { hints.prefetch("0", 10, "gpu") } end))
    assert.equal("hints: policy junk, table 'a': action 1 rows is 2.5; expected a whole number",
                 plan_err(function() return { hints.prefetch(0, 2.5, "gpu") } end))
    assert.equal("hints: policy junk, table 'a': hot_rows is 9000; expected a whole number from 0 to 8192",
                 plan_err(function() return { hot_rows = 9000 } end))
    assert.equal("hints: policy junk, table 'a': hot_rows is x; expected a whole number from 0 to 8192",
                 plan_err(function() return { hot_rows = "x" } end))
    assert.equal("hints: policy junk, table 'a': action 1 relayout swap is -3; expected a whole number from 0 to 8192",
                 plan_err(function() return { hints.relayout { swap = -3 } } end))
    assert.equal("hints: policy junk, table 'a': action 1 relayout swap is 10.5; expected a whole number from 0 to "
                 .. "8192", plan_err(function() return { hints.relayout { swap = 10.5 } } end))
    assert.equal("hints: policy junk, table 'a': action 1 relayout band is x; expected a number >= 0",
                 plan_err(function() return { hints.relayout { swap = 10, band = "x" } } end))
    assert.equal("hints: policy junk, table 'a': action 1 relayout bogus is not \"counts\" nor {swap = k}",
                 plan_err(function() return { hints.relayout("bogus") } end))
    -- a plan is checked whole before any of it is applied: no hint of a plan whose last action is bad
    ur.clear_hint_log()
    assert.equal("hints: policy junk, table 'a': action 2 rows [8190, 8210) are outside 0..8192",
                 plan_err(function()
                   return { hints.prefetch(0, 10, "gpu"), hints.advise(8190, 20, "preferred_location", "gpu") }
                 end))
    assert.same({}, ur.hint_log())
    -- a plan that raises: the policy and the table named, the message kept
    assert.equal("hints: policy junk, table 'a': plan raised: spec: no plan today",
                 plan_err(function() error("spec: no plan today", 0) end))
  end)

  it("refuse a plan that places more in HBM than its allowance, naming policy, table, bytes and allowance", function()
    -- table a: 8192 rows of 64 bytes and rowwise Adagrad's 4: 136 pages of 4 KiB in all; an
    -- allowance of 16 pages.  Plans were applied whatever they placed.
    local function run(plans)
      local P = hints.policy("greedy", {})
      function P:plan(stats)
        if stats.name ~= "a" then return {} end
        self.n = (self.n or 0) + 1
        return plans[self.n] or {}
      end
      local m = tables()
      local mgr = hints.manager(m, { every = 1, policy = "none",
                                     tables = { a = { policy = P, allowance = 16 * 4096 } } })
      local seq = H.last_seq()
      local ok, err = pcall(function()
        mgr:start(0)
        mgr:step(1)
      end)
      mgr:free()
      m.tbe:free() -- what it placed leaves the GPU's count (the host policy's spec reads it)
      return ok, tostring(err), H.log_since(seq)
    end
    local ok, err, log = run({ { hints.prefetch(0, 8192, "gpu") } })
    assert.is_false(ok)
    assert.equal("hints: policy greedy, table 'a': plan places 557056 bytes in HBM (the pages of rows it keeps on "
                 .. "the GPU, 1 ranges); its allowance is 65536 bytes", err)
    assert.same({}, log) -- nothing of it applied
    -- what earlier plans left on the GPU counts: 480 rows (8 pages of rows, 1 of state) and then
    -- rows 4096.. (16 more pages)
    ok, err, log = run({ { hints.advise(0, 480, "preferred_location", "gpu") },
                         { hints.prefetch(4096, 1024, "gpu") } })
    assert.is_false(ok)
    assert.matches("plan places %d+ bytes in HBM %(the pages of rows it keeps on the GPU, 2 ranges%); its "
                   .. "allowance is 65536 bytes", err)
    assert.equal(2, #log) -- the first plan's advice, on the rows and on their state
    -- within it, or giving rows back before taking others: applied
    ok, err = run({ { hints.advise(0, 480, "preferred_location", "gpu") },
                    { hints.prefetch(0, 480, "cpu"), hints.prefetch(4096, 480, "gpu") } })
    assert.is_true(ok, err)
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

-- Hint policies in `uvmrec train` (embeddings.hints, per-table hints, managed placement) on the
-- CPU: a managed run under every policy, relayouts included, gives the losses of a run with
-- host tables bit for bit; resuming from a checkpoint taken after a relayout gives the
-- uninterrupted run's losses; intervals go to metrics.jsonl and a summary line is printed;
-- config errors name the value.

local BASE = { "train.batch_size=256", "eval.samples=0", "eval.min_auc=0", "train.log_every=1",
               "embeddings.hints.every=3",
               "embeddings.hints.allowance=20%" }

-- Losses by step of a run (and its printed lines, its events).
local function run(sets, opts)
  local r = h.train_tiny(BASE, sets, opts)
  return r.losses, r.lines, r.events, r.result
end

-- The losses of a run with these --set values (train.steps first) and its folder, and a folder
-- holding the same run stopped after `at` steps, to resume from.
local function whole_and_stopped(sets, at)
  local whole = cmd.tmpdir()
  local want = run(sets, { out = whole })
  local dir = cmd.tmpdir()
  local first = { unpack(sets) }
  first[1] = "train.steps=" .. at
  run(first, { out = dir })
  return want, whole, dir
end

-- A run's hint intervals (its "hints" events), in order.
local function intervals(events)
  local out = {}
  for _, e in ipairs(events) do
    if e.event == "hints" then out[#out + 1] = e end
  end
  return out
end

-- The last hint interval of a run with these --set values.
local function last_interval(sets)
  local _, _, events = run(sets)
  local all = intervals(events)
  return all[#all]
end

describe("uvmrec.hints in training", function()
  it("gives the host tables' losses bit for bit with managed tables under every policy", function()
    local want = run { "train.steps=10", "embeddings.placement=host" }
    for _, p in ipairs { "none", "host", "hot_prefix", "adaptive" } do
      local got, lines, events = run { "train.steps=10", "embeddings.placement=managed",
                                       "embeddings.hints.policy=" .. p, "embeddings.hints.decay=0.5" }
      assert.same(want, got, "policy " .. p)
      assert.equal(4, #intervals(events), p .. ": intervals at steps 0, 3, 6, 9")
      local summary
      for _, l in ipairs(lines) do summary = l:match("^hints " .. p:gsub("_", "%%_") .. ": .*") or summary end
      assert.truthy(summary, p .. ": no summary line in " .. table.concat(lines, "\n"))
    end
  end)

  it("relays out managed tables (hot_prefix) and reports it in the interval", function()
    local _, _, events = run { "train.steps=4", "embeddings.placement=managed", "embeddings.hints.policy=hot_prefix" }
    local moved = 0
    for _, e in ipairs(intervals(events)) do moved = moved + e.rows_moved end
    assert.is_true(moved > 0)
  end)

  it("takes a policy per table", function()
    local last = last_interval { "train.steps=3", "embeddings.placement=managed", "embeddings.hints.policy=host",
                                 "embeddings.tables.C3.hints.policy=hot_prefix", "embeddings.hints.allowance=100%" }
    assert.equal(0, last.tables.C1.hot_rows)
    assert.is_true(last.tables.C3.hot_rows > 0)
  end)

  it("takes an allowance per table (embeddings.tables.<T>.hints.allowance), the others splitting the rest", function()
    -- no HBM for the managed tables but C3's own: only C3 keeps rows on the GPU
    local last = last_interval { "train.steps=3", "embeddings.placement=managed", "embeddings.hints.policy=hot_prefix",
                                 "embeddings.hints.allowance=0", "embeddings.tables.C3.hints.allowance=100%" }
    assert.equal(0, last.tables.C1.hot_rows)
    assert.equal(0, last.tables.C2.hot_rows)
    assert.is_true(last.tables.C3.hot_rows > 0)
  end)

  it("resumes after a relayout to the uninterrupted run's losses", function()
    local sets = { "train.steps=12", "embeddings.placement=managed", "embeddings.hints.policy=adaptive",
                   "embeddings.hints.decay=0.5", "train.checkpoint_every=5" }
    local want, whole, dir = whole_and_stopped(sets, 5)
    local got = run(sets, { out = dir, resume = dir })
    for s = 6, 12 do assert.equal(want[s], got[s], "step " .. s) end
    -- and the counters the policies plan from: the resumed run's placement at its start does not
    -- decay them once more (it did, and the counts at step 12 differed from the uninterrupted run's)
    local ck = require "uvmrec.checkpoint"
    local a = assert(ck.load(ck.path_for(whole .. "/checkpoints", 12)))
    local b = assert(ck.load(ck.path_for(dir .. "/checkpoints", 12)))
    local n = 0
    for name, t in pairs(a.tensors) do
      if name:match("^layout%..*%.counts$") then
        assert.same(t:totable(), b.tensors[name]:totable(), name)
        n = n + 1
      end
    end
    assert.equal(26, n)
    cmd.rmdir(dir)
    cmd.rmdir(whole)
  end)

  it("resumes a run laid out by its hints with its tables elsewhere, and refuses cached ones by file and table",
    function()
    local sets = { "train.steps=8", "embeddings.placement=managed", "embeddings.hints.policy=adaptive",
                   "train.checkpoint_every=5" }
    local want, whole, dir = whole_and_stopped(sets, 5)
    local path = require("uvmrec.checkpoint").path_for(dir .. "/checkpoints", 5)
    assert.truthy(assert(require("uvmrec.checkpoint").open(path)):info("layout.C1.perm"), "laid out when saved")
    local got = run({ "train.steps=8", "embeddings.placement=host" }, { out = cmd.tmpdir(), resume = path })
    for s = 6, 8 do assert.equal(want[s], got[s], "host, step " .. s) end
    -- a cached table reads the cache's slots: its rows cannot stay laid out as saved (set_permutation
    -- raised from the layout's load, after the other components were loaded)
    local ok, err = pcall(run, { "train.steps=8", "embeddings.placement=cached", "embeddings.cache.load_factor=0.1" },
                          { out = cmd.tmpdir(), resume = path })
    assert.is_false(ok)
    assert.truthy(tostring(err):find(("--resume: checkpoint %s: component 'layout': table C1 was saved laid out by its "
      .. "hints' permutation, which a cached table cannot take (its kernels read the cache's slots); resume it with "
      .. "the table managed, on the device or in host memory (embeddings.placement)"):format(path), 1, true), err)
    cmd.rmdir(dir)
    cmd.rmdir(whole)
  end)

  it("names a bad policy or allowance at its place in the config", function()
    local cfg, err = train.config.load(assert(train.find_config("dlrm_tiny")), { "embeddings.hints.policy=hottest" })
    assert.is_nil(cfg)
    assert.matches("embeddings.hints.policy: 'hottest' is not a hint policy: none, host, hot_prefix, adaptive, or a "
                   .. "path to a .lua file", err, 1, true)
    cfg, err = train.config.load(assert(train.find_config("dlrm_tiny")), { "embeddings.hints.allowance=lots" })
    assert.is_nil(cfg)
    assert.matches("embeddings.hints.allowance: allowance 'lots' is not bytes (123, '16GiB'), a fraction below 1 (0.2) "
                   .. "nor a percentage ('20%')", err, 1, true)
  end)

  it("takes a policy's options from the config, as a default and per table (hints.options)", function()
    -- embeddings.hints had no options key: adaptive's margin and band could not be set from a config
    local path = os.tmpname() .. ".lua"
    cmd.spit(path, [[
local P = require("uvmrec.hints").policy("keep", { keep = 0 }, { keep = { 0, 4 } })
function P:plan() return { hot_rows = self.opts.keep } end
return P
]])
    local last = last_interval { "train.steps=3", "embeddings.placement=managed", "embeddings.hints.policy=" .. path,
                                 "embeddings.hints.options.keep=3", "embeddings.tables.C2.hints.policy=" .. path,
                                 "embeddings.tables.C2.hints.options.keep=2" }
    os.remove(path)
    assert.equal(3, last.tables.C1.hot_rows)
    assert.equal(2, last.tables.C2.hot_rows)
    assert.equal(3, last.tables.C3.hot_rows)
    -- a built-in's, through the training run
    local want = run { "train.steps=7", "embeddings.placement=host" }
    assert.same(want, run { "train.steps=7", "embeddings.placement=managed", "embeddings.hints.policy=adaptive",
                            "embeddings.hints.options.margin=0", "embeddings.hints.options.band=0.5" })
  end)

  it("takes a policy's string and boolean options from the config, its own checks deciding", function()
    -- options were numbers only: 'mode=slow' was "'slow' is not a number", whatever the policy took
    local path = os.tmpname() .. ".lua"
    cmd.spit(path, [[
local P = require("uvmrec.hints").policy("modes", { mode = "fast", strict = false, keep = 0 })
function P:plan() return {} end
return P
]])
    local function load(sets)
      table.insert(sets, 1, "embeddings.hints.policy=" .. path)
      return train.config.load(assert(train.find_config("dlrm_tiny")), sets)
    end
    local cfg = assert(load { "embeddings.hints.options.mode=slow", "embeddings.hints.options.strict=true",
                              "embeddings.hints.options.keep=2" })
    assert.same({ mode = "slow", strict = true, keep = 2 }, cfg.embeddings.hints.options)
    -- the policy's types still hold: a number where its default is a string, a string for a boolean
    local _, err = load { "embeddings.hints.options.mode=3" }
    assert.matches("embeddings.hints.options.mode: policy 'modes': mode is 3 (a number); expected a string like "
                   .. "its default, fast", err, 1, true)
    _, err = load { "embeddings.hints.options.strict=yes" }
    assert.matches("embeddings.hints.options.strict: policy 'modes': strict is yes (a string); expected a boolean "
                   .. "like its default, false", err, 1, true)
    os.remove(path)
    -- and the built-ins' numbers
    _, err = train.config.load(assert(train.find_config("dlrm_tiny")),
                               { "embeddings.hints.policy=adaptive", "embeddings.hints.options.margin=abc" })
    assert.matches("embeddings.hints.options.margin: policy 'adaptive': margin is abc (a string); expected a number "
                   .. "like its default, 0.02", err, 1, true)
  end)

  it("refuses a policy's bad option at its place in the config, before anything is built", function()
    local obj = os.tmpname() .. ".lua"
    cmd.spit(obj, "return { name = 'obj', plan = function() return {} end }\n")
    for _, c in ipairs {
      { { "embeddings.hints.policy=adaptive", "embeddings.hints.options.margin=1" },
        "embeddings.hints.options.margin: policy 'adaptive': margin is 1; expected a number in [0, 1)" },
      { { "embeddings.hints.policy=adaptive", "embeddings.hints.options.marign=0.1" },
        "embeddings.hints.options.marign: policy 'adaptive': unknown option 'marign'; expected band, margin" },
      { { "embeddings.hints.options.margin=0.1" },
        "embeddings.hints.options.margin: policy 'hot_prefix' takes no options; got 'margin'" },
      { { "embeddings.hints.policy=" .. obj, "embeddings.hints.options.margin=0.1" },
        "embeddings.hints.options.margin: policy '" .. obj .. "' is an object, which takes no options; got 'margin'" },
      { { "embeddings.placement=managed", "embeddings.tables.C2.hints.options.band=1" },
        "embeddings.tables.C2.hints.options: options without a policy of table C2's own (embeddings.hints.options "
        .. "are the default policy's); give embeddings.tables.C2.hints.policy" },
      { { "embeddings.placement=managed", "embeddings.tables.C2.hints.policy=adaptive",
          "embeddings.tables.C2.hints.options.band=-1" },
        "embeddings.tables.C2.hints.options.band: policy 'adaptive': band is -1; expected a number in [0, inf)" },
    } do
      local cfg, err = train.config.load(assert(train.find_config("dlrm_tiny")), c[1])
      assert.is_nil(cfg, c[2])
      assert.matches(c[2], err, 1, true)
    end
    os.remove(obj)
  end)

  it("says a policy's failure mid-run by its policy and table, not by a place in the trainer", function()
    -- it said 'uvmrec train: .../lua/uvmrec/train/hooks.lua:193: hints: policy late, ...'
    local path = os.tmpname() .. ".lua"
    cmd.spit(path, [[
local P = require("uvmrec.hints").policy("late", {})
function P.plan(_, stats) if stats.step > 0 then error("no plan at step " .. stats.step, 0) end return {} end
return P
]])
    local _, err, code = cmd.run("train dlrm_tiny --cpu --steps 4 --set embeddings.placement=managed "
                                 .. "--set embeddings.hints.every=2 --set eval.samples=0 --set eval.min_auc=0 "
                                 .. "--set embeddings.hints.policy=" .. cmd.quote(path))
    os.remove(path)
    assert.equal(1, code)
    assert.matches("\nuvmrec train: hints: policy late, table 'C1': plan raised: no plan at step 2\n", "\n" .. err, 1,
                   true)
  end)
end)
