-- The models where the greedy search missed plans of one row width a cache (docs/planner.md,
-- "Search"): the reviewer's fuzz generator, the hand-written column-wise cases, and each planned
-- by the greedy and by the exhaustive search.  One home for scripts/bench/planner_widths.lua
-- (--fuzz, --seeds, the cases seed20521, colwise4, colwise3) and spec/planner/search_spec.lua.
-- All with slow reads in place (a synthetic calibration: managed and zero-copy at 1e8,
-- collectives at 1e11), batch 4096, no reserve.
local planner = require "uvmrec.planner"

local M = {}

local slow
function M.calibration()
  slow = slow or planner.calib.synthetic {
    managed_gather = 1e8, zero_copy_gather = 1e8, managed_update = 1e8, zero_copy_update = 1e8,
    alltoall = 1e11, allreduce = 1e11, reduce_scatter = 1e11 }
  return slow
end

-- planner.plan's options for these models on `world` ranks by search `how`
function M.opts(world, how)
  return { world = world, batch = 4096, calibration = M.calibration(), search = how, reserve = 0 }
end

-- The reviewer's fuzz model of `seed`: 1 to 8 ranks, 3 to 9 tables (dims 8 to 128, a third
-- f16), some fixed cached, column-wise or row-wise; tables, profiles, world, budget.
function M.fuzz(seed)
  math.randomseed(seed)
  local DIMS, Ws = { 8, 16, 32, 64, 128 }, { 1, 2, 3, 4, 8 }
  local n = math.random(3, 9)
  local W = Ws[math.random(#Ws)]
  local tables, profiles = {}, {}
  for i = 1, n do
    local rows = math.random(1, 40) * 50000
    tables[i] = { name = "T" .. i, rows = rows, dim = DIMS[math.random(#DIMS)], optimizer = "sgd",
                  dtype = math.random() < 0.3 and "f16" or "f32" }
    profiles["T" .. i] = planner.profile.zipf { rows = rows, s = 0.9 + 0.3 * math.random() }
    local r = math.random()
    if r < 0.04 then tables[i].fixed = { placement = "cached" }
    elseif r < 0.07 and W > 1 then tables[i].fixed = { placement = "cached", rank = math.random(0, W - 1) }
    elseif r < 0.14 and W > 1 then tables[i].fixed = { sharding = "column_wise" }
    elseif r < 0.16 and W > 1 then tables[i].fixed = { sharding = "row_wise", placement = "cached" }
    elseif r < 0.19 and W > 1 then tables[i].fixed = { sharding = "column_wise", placement = "cached" } end
  end
  return tables, profiles, W, math.random(20, 400) .. "MiB"
end

-- Whether the fuzz model of `seed` is one the review compared: 3 to 6 tables on 1 to 4 ranks
-- (the exhaustive search takes a fraction of a second there).
function M.small(seed)
  local tables, _, world = M.fuzz(seed)
  return #tables <= 6 and world <= 4
end

-- Hand-written models: { dim, rows (default 1e6), fixed }, SGD, Zipf 1.05.
local function model(spec)
  local tables, profiles = {}, {}
  for i, s in ipairs(spec) do
    tables[i] = { name = "T" .. i, rows = s[2] or 1000000, dim = s[1], optimizer = "sgd", dtype = "f32", fixed = s[3] }
    profiles["T" .. i] = planner.profile.zipf { rows = tables[i].rows, s = 1.05 }
  end
  return tables, profiles
end
local COL = { placement = "cached", sharding = "column_wise" }
local TAB = { placement = "cached", sharding = "table_wise" }

-- 4 ranks, 400 MiB: a dim-8 column-wise table fixed cached (shards on ranks 0 and 1), dim-16
-- and dim-32 tables of 4 M rows fixed cached
function M.colwise4()
  local tables, profiles = model { { 8, 100000, COL }, { 16, 4000000, TAB }, { 32, 4000000, TAB } }
  return tables, profiles, 4, "400MiB"
end

-- 3 ranks, 400 MiB: that column-wise table, a dim-16 table of 4 M rows fixed cached, a dim-64
-- device table of 1.5 M rows pinned to rank 2
function M.colwise3()
  local tables, profiles = model { { 8, 100000, COL }, { 16, 4000000, TAB },
                                   { 64, 1500000, { placement = "device", rank = 2 } } }
  return tables, profiles, 3, "400MiB"
end

-- A model (make() -> tables, profiles, world, budget: fresh tables each call) planned by the
-- greedy and by the exhaustive search: {greedy, exhaustive}, each the step in seconds or false
-- (no plan); or nil and why (the exhaustive gave up, or a search raised an error).
function M.versus(make)
  local steps = {}
  for k, how in ipairs({ "greedy", "exhaustive" }) do
    local tables, profiles, world, budget = make()
    local ok, p, err = pcall(planner.plan, tables, profiles, budget, M.opts(world, how))
    if not ok then return nil, ("%s raised: %s"):format(how, tostring(p)) end
    if not p and tostring(err):match("gave up") then return nil, "the exhaustive gave up" end
    steps[k] = p and p.data.step_seconds or false
  end
  return steps
end

-- The fuzz model of `seed` planned both ways (M.versus).
function M.seed(seed)
  return M.versus(function() return M.fuzz(seed) end)
end

return M
