-- What one row width a rank's cache costs the planner's plans (docs/results.md, "Planner: one row
-- width a rank's cache"): each case's tables planned by planner.plan, printed as the predicted
-- step, the proposals, the CPU the planning took (the least of --runs, fresh tables each run) and
-- the row widths each rank caches.  The same script runs on an older tree's planner (one that may
-- cache several widths in a rank's cache) with that tree's lua/ first on LUA_PATH and plain
-- luajit (the uvmrec command prefers its own tree's lua/):
--   uvmrec scripts/bench/planner_widths.lua --case four8 --runs 3
--   mkdir -p /tmp/old && git archive 5e7d6b9 lua | tar x -C /tmp/old &&
--   cp lua/uvmrec/cdef.lua /tmp/old/lua/uvmrec/ &&
--   LUA_PATH='/tmp/old/lua/?.lua;/tmp/old/lua/?/init.lua;;' LUA_CPATH='build/lib/?.so;;' \
--     luajit scripts/bench/planner_widths.lua --case four8
-- Tables: search_spec's synthetic ones (1e2 to 1e7 rows, Zipf 0.8 to 1.3, rowwise Adagrad, seed
-- 7) at each case's dims, the H200 figures' calibration (spec/fixtures/calib_h200_figures.json),
-- batch 4096; the cases where the greedy misses plans take slow reads in place (a synthetic
-- calibration), SGD and no reserve.  --check plans one small case and fails where a rank's
-- cache holds two widths.  The CPU of a plan after the first in one process is the JIT's warm
-- one (256 widths on 5e7d6b9: 0.235, 0.113, 0.090 s): to compare first plans, run --runs 1 in
-- several processes.  --fuzz N plans the reviewer's fuzz models (spec/support/planner_fuzz.lua,
-- which search_spec's check of the greedy reads too: its seeds with 3 to 6 tables on 1 to 4
-- ranks, the first N from --from) by the greedy and by the exhaustive search and counts where
-- the greedy finds no plan or a slower one; --seeds LIST prints both steps for each seed:
--   uvmrec scripts/bench/planner_widths.lua --fuzz 2500 --worst 20
local planner = require "uvmrec.planner"

local root = arg[0]:match("^(.*)/scripts/bench/[^/]*$") or "."
local fixture = root .. "/spec/fixtures/calib_h200_figures.json"
-- the fuzz models and the column-wise cases (one home with search_spec's)
package.path = root .. "/spec/support/?.lua;" .. package.path
local fuzz = require "planner_fuzz"

-- search_spec's tables_of(n, seed), each table's dim (and dtype) by its index where dimf is given
local function tables_of(n, seed, dimf, dtypef)
  math.randomseed(seed)
  local tables, profiles = {}, {}
  for i = 1, n do
    local rows = math.floor(10 ^ (2 + 5 * math.random()))
    local name = "T" .. i
    local d = ({ 16, 32, 64, 128 })[math.random(4)] -- drawn always: the same rows and skews at any dims
    tables[i] = { name = name, rows = rows, dim = dimf and dimf(i) or d, optimizer = "rowwise_adagrad",
                  dtype = dtypef and dtypef(i) or nil }
    profiles[name] = planner.profile.zipf { rows = rows, s = 0.8 + 0.5 * math.random(), hot = 1 }
  end
  return tables, profiles
end

local function cycling(i) return 16 * ((i - 1) % 8 + 1) end            -- 16, 32, ..., 128
local function tenth(i) return i % 10 == 0 and 32 or 128 end

local GiB = 2 ^ 30
local function synthetic(n, world, budget, dimf, dtypef)
  return function()
    local tables, profiles = tables_of(n, 7, dimf, dtypef)
    return tables, profiles, world, budget
  end
end
local function all(d) return function() return d end end
local function four(i) return ({ 16, 32, 64, 128 })[(i - 1) % 4 + 1] end
-- name, what, and make() -> tables, profiles, world, budget, calibration ("h200", the default, or "slow")
local cases = {
  { "four8", "1000 tables of four dims (16 to 128) on 8 ranks in 8 GiB", synthetic(1000, 8, 8 * GiB) },
  { "cyc8", "1000 tables, dims cycling 16, 32, ..., 128 (8 widths), 8 ranks, 8 GiB",
    synthetic(1000, 8, 8 * GiB, cycling) },
  { "dtype8", "1000 tables, dims 16 to 128 by f32 and f16 (8 widths), 8 ranks, 8 GiB",
    synthetic(1000, 8, 8 * GiB, four, function(i) return math.floor((i - 1) / 4) % 2 == 0 and "f32" or "f16" end) },
  { "tenth100", "100 tables on 8 ranks in 1 GiB, dim 128, every tenth dim 32", synthetic(100, 8, GiB, tenth) },
  { "four1", "200 tables of four dims on 1 rank in 2 GiB", synthetic(200, 1, 2 * GiB) },
  { "tenth1000", "1000 tables, dim 128, every tenth dim 32, 8 ranks, 8 GiB", synthetic(1000, 8, 8 * GiB, tenth) },
  { "cyc1", "1000 tables on 1 rank in 8 GiB, dims cycling 16 to 128 (8 widths)", synthetic(1000, 1, 8 * GiB, cycling) },
  { "dtype1", "1000 tables on 1 rank in 8 GiB, dims cycling 16 to 128 in f32 and f16 (16 widths)",
    synthetic(1000, 1, 8 * GiB, cycling, function(i) return math.floor((i - 1) / 8) % 2 == 0 and "f32" or "f16" end) },
  { "by4_1", "300 tables on 1 rank in 12 GiB, dims 4 to 1024 by 4 (256 widths)",
    synthetic(300, 1, 12 * GiB, function(i) return 4 * ((i - 1) % 256 + 1) end) },
  { "d128_8", "1000 tables, all dim 128, on 8 ranks in 8 GiB", synthetic(1000, 8, 8 * GiB, all(128)) },
  { "d128_1", "200 tables, all dim 128, on 1 rank in 2 GiB", synthetic(200, 1, 2 * GiB, all(128)) },
  { "d128_200_8", "200 tables, all dim 128, on 8 ranks in 1 GiB", synthetic(200, 8, GiB, all(128)) },
  { "d128_100_4", "100 tables, all dim 128, on 4 ranks in 512 MiB", synthetic(100, 4, GiB / 2, all(128)) },
  { "seed20521", "the reviewer's seed 20521: 4 tables (dims 32, 64, 64, 64; T1 fixed cached), 2 ranks, 45 MiB "
    .. "(slow reads in place)",
    function()
      local tables, profiles, W, budget = fuzz.fuzz(20521)
      return tables, profiles, W, budget, "slow"
    end },
  { "colwise4", "4 ranks, 400 MiB: a dim-8 column-wise table fixed cached (shards on ranks 0, 1), dim-16 and "
    .. "dim-32 tables of 4 M rows fixed cached (slow reads in place)",
    function()
      local tables, profiles, W, budget = fuzz.colwise4()
      return tables, profiles, W, budget, "slow"
    end },
  { "colwise3", "3 ranks, 400 MiB: that column-wise table, a dim-16 table of 4 M rows fixed cached, a dim-64 "
    .. "device table of 1.5 M rows pinned to rank 2 (slow reads in place)",
    function()
      local tables, profiles, W, budget = fuzz.colwise3()
      return tables, profiles, W, budget, "slow"
    end },
}
local names, by_name = {}, {}
for i, c in ipairs(cases) do names[i], by_name[c[1]] = c[1], c end

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/planner_widths.lua",
  summary = "the planner's step, proposals, CPU and each rank's cached widths on the cases of one width a cache",
  mutex = { { "--case", "--check", "--fuzz", "--seeds" }, { "--list", "--check", "--fuzz", "--seeds" } },
  { "--case LIST", "comma-separated cases (--list describes them)", type = "list", choices = names },
  { "--list", "lists the cases" },
  { "--runs N", "plans each case N times, fresh tables each time, and reports the least CPU", type = "whole",
    min = 1, default = 1 },
  { "--search S", "greedy, exhaustive or auto (default: the planner's auto, exhaustive only where the choices "
    .. "are few, as in colwise4 and colwise3)", choices = { "greedy", "exhaustive", "auto" } },
  { "--pin", "plans once more with every table fixed to the plan's choice and rank: the step by hand" },
  { "--check", "plans 200 tables of four dims on 1 rank and fails unless each rank's cache holds one row width" },
  { "--fuzz N", "the greedy against the exhaustive search on the reviewer's fuzz models: the first N seeds from "
    .. "--from with at most 6 tables and 4 ranks; counts and the worst seeds", type = "whole", min = 1 },
  { "--from SEED", "--fuzz's first seed", type = "whole", default = 1 },
  { "--seeds LIST", "the greedy against the exhaustive search on these fuzz seeds (any size), a line each",
    type = "numbers" },
  { "--worst K", "--fuzz lists the K slowest greedy plans against the exhaustive's", type = "whole", default = 10 },
}
local o = cmd:parse(arg)

if o.list then
  for _, c in ipairs(cases) do print(("%-11s %s"):format(c[1], c[2])) end
  os.exit(0)
end
if o.check then o.case = { "four1" } end
if not o.case and not o.fuzz and not o.seeds then
  cmd:misuse("give --case NAME (--list names them), --check, --fuzz N or --seeds LIST")
end

local calibrations = {}
local function calibration(which)
  if not calibrations[which] then
    calibrations[which] = which == "slow" and fuzz.calibration() or assert(planner.calib.load(fixture))
  end
  return calibrations[which]
end

-- rank (0-based, or "row" for the row-wise shards' cache) -> "width xN, ..." and whether it holds two
local function cached_widths(p)
  local per = {}
  for _, t in ipairs(p.data.tables) do
    if t.placement == "cached" then
      local w = ("%d/%s"):format(t.sharding == "column_wise" and t.dim / t.shards or t.dim, t.dtype or "f32")
      for _, r in ipairs(t.sharding == "row_wise" and { "row" } or t.ranks) do
        per[r] = per[r] or {}
        per[r][w] = (per[r][w] or 0) + 1
      end
    end
  end
  local shown, two = {}, false
  for r, ws in pairs(per) do
    local list = {}
    for w, n in pairs(ws) do list[#list + 1] = ("%s x%d"):format(w, n) end
    table.sort(list)
    shown[r] = table.concat(list, ", ") .. (#list > 1 and "  <- two widths in one cache" or "")
    two = two or #list > 1
  end
  return shown, two
end

local function ms(s) return ("%.6f ms"):format(s * 1e3) end

-- The plan's choices as each table's fixed settings, a table_wise one's rank with them.
local function pinned(p, tables)
  local out = {}
  for i, t in ipairs(p.data.tables) do
    local f = { placement = t.placement, sharding = t.sharding, load_factor = t.load_factor,
                prefix_fraction = t.prefix_fraction, rank = t.sharding == "table_wise" and t.ranks[1] or nil }
    out[i] = { name = t.name, rows = tables[i].rows, dim = tables[i].dim, optimizer = tables[i].optimizer,
               dtype = tables[i].dtype, fixed = f }
  end
  return out
end

-- A seed's line: its model, and the greedy's and exhaustive's steps (planner_fuzz.seed) or why none.
local function versus_line(seed, steps, why)
  local tables, _, world, budget = fuzz.fuzz(seed)
  local head = ("seed %d: %d tables, %d ranks, %s:"):format(seed, #tables, world, budget)
  if not steps then return ("%s %s"):format(head, why) end
  local g, e = steps[1], steps[2]
  return ("%s greedy %s, exhaustive %s%s"):format(head, g and ms(g) or "no plan", e and ms(e) or "no plan",
    g and e and (", ratio %.3f"):format(g / e) or "")
end

if o.seeds then
  for _, seed in ipairs(o.seeds) do print(versus_line(seed, fuzz.seed(seed))) end
  os.exit(0)
end

-- The review's fuzz: the first N seeds whose models have 3 to 6 tables on 1 to 4 ranks (the
-- exhaustive search is quick there), counted by how the greedy's plan compares.
if o.fuzz then
  local n, seed = 0, o.from
  local both, missed, slower, gave_up, errors, fine = 0, {}, 0, {}, {}, 0
  local worst = {}
  local c0 = os.clock()
  while n < o.fuzz do
    if fuzz.small(seed) then
      n = n + 1
      local steps, why = fuzz.seed(seed)
      if not steps then
        local list = why:match("gave up") and gave_up or errors
        list[#list + 1] = seed
      elseif not steps[1] and not steps[2] then
        both = both + 1
      elseif not steps[1] then
        missed[#missed + 1] = seed
      elseif steps[2] then
        local r = steps[1] / steps[2]
        if r > 1.05 then slower = slower + 1 end
        if r > 1 + 1e-9 then worst[#worst + 1] = { seed = seed, r = r, steps = steps } end
        if r <= 1 + 1e-9 then fine = fine + 1 end
      end
    end
    seed = seed + 1
  end
  local cpu = os.clock() - c0
  table.sort(worst, function(a, b) if a.r ~= b.r then return a.r > b.r end return a.seed < b.seed end)
  local function seeds_of(list) return #list > 0 and (" (seeds %s)"):format(table.concat(list, ", ")) or "" end
  print(("fuzz: seeds %d to %d, the %d with at most 6 tables and 4 ranks; greedy against exhaustive, slow reads in "
    .. "place, batch 4096, no reserve"):format(o.from, seed - 1, n))
  print(("  both no plan: %d"):format(both))
  print(("  greedy no plan where the exhaustive plans: %d%s"):format(#missed, seeds_of(missed)))
  print(("  greedy over 5%% slower: %d; slower at all: %d; as fast: %d"):format(slower, #worst, fine))
  print(("  worst: %s"):format(worst[1] and ("%.3f (seed %d)"):format(worst[1].r, worst[1].seed) or "none"))
  print(("  exhaustive gave up: %d%s; errors: %d%s"):format(#gave_up, seeds_of(gave_up), #errors, seeds_of(errors)))
  print(("  CPU %.1f s"):format(cpu))
  for k = 1, math.min(o.worst, #worst) do
    print("  " .. versus_line(worst[k].seed, worst[k].steps))
  end
  os.exit(0)
end

local failed -- what --check fails for
for _, name in ipairs(o.case) do
  local c = by_name[name]
  print(("%s: %s"):format(name, c[2]))
  local best, cpus, err = nil, {}, nil
  for run = 1, o.runs do
    local tables, profiles, world, budget, cal = c[3]()
    local opts = { world = world, batch = 4096, calibration = calibration(cal or "h200"), search = o.search,
                   reserve = cal == "slow" and 0 or nil }
    local c0 = os.clock()
    local p
    p, err = planner.plan(tables, profiles, budget, opts)
    local cpu = os.clock() - c0
    cpus[run] = ("%.3f"):format(cpu)
    if not p then break end
    if not best or cpu < best.cpu then
      best = { cpu = cpu, p = p, tables = tables, profiles = profiles, budget = budget, opts = opts }
    end
  end
  if err then
    failed = "no plan"
    print(("  no plan (search %s): %s"):format(o.search or "auto", tostring(err)))
  else
    local p, s = best.p, best.p.data.search
    print(("  step %s, search %s, %s%s, CPU %.3f s (the least of %d: %s)"):format(ms(p.data.step_seconds),
      s.method, s.proposals and s.proposals .. " proposals" or tostring(s.visited) .. " nodes",
      s.proposals_all and (" (%d in all, one run a width)"):format(s.proposals_all) or "", best.cpu, o.runs,
      table.concat(cpus, ", ")))
    if s.cached_step then print(("  the plan without a cache; the best cached one %s"):format(ms(s.cached_step))) end
    local shown, two = cached_widths(p)
    if two then failed = "a rank's cache holds two row widths" end
    for r = 0, p.data.world - 1 do
      local rk = p.data.ranks[r + 1]
      print(("  rank %d: %s, caches %s"):format(r, rk.load and ms(rk.load) or "-", shown[r] or "nothing"))
    end
    if shown.row then print(("  the row-wise shards' cache: %s"):format(shown.row)) end
    if o.pin then
      local q, qerr = planner.plan(pinned(p, best.tables), best.profiles, best.budget, best.opts)
      print(("  its choices pinned by hand: %s"):format(q and ms(q.data.step_seconds) or tostring(qerr)))
    end
  end
end
if o.check then
  if failed then cmd:fail("check: " .. failed) end
  print("check: ok, one row width a rank's cache")
end
