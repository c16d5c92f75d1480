-- Records spec/fixtures/planner_exhaustive_400.txt: for search_spec's 200 seeded instances on 1
-- and 2 ranks, at the budgets the file holds, the optimum of the unbounded exhaustive search (as
-- a96bebc searched: every assignment below the best so far, no other cut), one width a rank's
-- cache (search.cache_width).  With --check it searches without that rule as well and, for every
-- instance whose optimum moved, says whether the optimum without the rule cached two widths in
-- one of a rank's caches (the rule's doing) or not.
--   ./build/bin/uvmrec scripts/bench/planner_exhaustive_400.lua [--check] > new.txt
local planner = require "uvmrec.planner"
local search = require "uvmrec.planner.search"
package.path = "spec/support/?.lua;" .. package.path -- the specs' instances (run from the tree's root)
local cases = require "planner_cases"
local args = require("uvmrec.cli").command {
  name = "scripts/bench/planner_exhaustive_400.lua",
  summary = "records search_spec's 400 exhaustive optima (spec/fixtures/planner_exhaustive_400.txt) under "
    .. "one row width a rank's cache",
  { "--check", "also search without the rule and say, for each optimum that moved, whether it mixed widths" },
}:parse(arg)
local check = args.check
local cal = assert(planner.calib.load("spec/fixtures/calib_h200_figures.json"))

-- search_spec's instance, the budget aside (the file's)
local function instance(seed, world)
  local tables, profiles, batch = cases.instance(seed)
  return tables, profiles, { world = world, batch = batch, calibration = cal, reserve = 0, search = "exhaustive" }
end

-- The unbounded search over the rank sets search.exhaustive walks, under the rule where the
-- items have widths (search.prep: it.CW); `seen` gets each search's optimum {choice, ranks}.
local function unbounded(seen)
  return function(items, env)
    search.prep(items)
    local W, avail, n = env.world, env.avail, #items
    local order = {}
    for i = 1, n do order[i] = i end
    local function biggest(i) return items[i].options[#items[i].options].hbm end
    table.sort(order, function(a, b) return biggest(a) > biggest(b) end)
    local load, hbm, cw, cn = {}, {}, {}, {}
    for r = 1, W do load[r], hbm[r] = 0, 0 end
    for r = 0, W do cw[r], cn[r] = 0, 0 end
    local all, singles = {}, {}
    for r = 1, W do all[r], singles[r] = r, { r } end
    local choice, ranks, host, visited = {}, {}, 0, 0
    local best, best_choice, best_ranks = math.huge, nil, nil
    local function dfs(d, cur_max)
      visited = visited + 1
      if cur_max >= best then return end
      if d > n then
        best, best_choice, best_ranks = cur_max, {}, {}
        for i = 1, n do best_choice[i], best_ranks[i] = choice[i], ranks[i] end
        return
      end
      local i = order[d]
      local it = items[i]
      for j, o in ipairs(it.options) do
        if not env.host or host + o.host <= env.host then
          local sh = o.shards[1]
          local sets = it.SP[j] and { all } or it.rank and { { it.rank } }
                       or it.SK[j] > 1 and { search.column_ranks(i, it.SK[j], W) } or singles
          local w = items.widths and it.CW[j] or 0
          for _, rs in ipairs(sets) do
            local ok, m = true, cur_max
            for _, r in ipairs(rs) do
              local x = cw[it.SP[j] and 0 or r]
              if hbm[r] + sh.hbm > avail[r] or (w ~= 0 and x ~= 0 and x ~= w) then ok = false break end
              m = math.max(m, load[r] + sh.time)
            end
            if ok and m < best then
              local keys = {}
              for _, r in ipairs(rs) do
                load[r], hbm[r] = load[r] + sh.time, hbm[r] + sh.hbm
                local k = it.SP[j] and 0 or r
                if w ~= 0 and (#keys == 0 or keys[#keys] ~= k) then
                  keys[#keys + 1] = k
                  if cn[k] == 0 then cw[k] = w end
                  cn[k] = cn[k] + 1
                end
              end
              host = host + o.host
              choice[i], ranks[i] = j, rs
              dfs(d + 1, m)
              host = host - o.host
              for _, r in ipairs(rs) do load[r], hbm[r] = load[r] - sh.time, hbm[r] - sh.hbm end
              for _, k in ipairs(keys) do
                cn[k] = cn[k] - 1
                if cn[k] == 0 then cw[k] = 0 end
              end
            end
          end
        end
      end
    end
    dfs(1, 0)
    if not best_choice then return nil, { visited = visited } end
    local part = { load = {}, hbm = {}, ranks = best_ranks }
    for r = 1, W do part.load[r], part.hbm[r] = 0, 0 end
    for i = 1, n do
      local sh = items[i].options[best_choice[i]].shards[1]
      for _, r in ipairs(best_ranks[i]) do
        part.load[r], part.hbm[r] = part.load[r] + sh.time, part.hbm[r] + sh.hbm
      end
    end
    seen[#seen + 1] = { items = items, choice = best_choice, ranks = best_ranks }
    return { choice = best_choice, part = part, cost = best }, { visited = visited }
  end
end

-- whether a search's optimum caches two widths in one of a rank's caches
local cache_width = search.cache_width
local function mixes(s)
  local at = {}
  for i, it in ipairs(s.items) do
    local kind, w = cache_width(it, it.options[s.choice[i]])
    if kind then
      for _, r in ipairs(s.ranks[i]) do
        local key = r .. kind
        if at[key] and at[key] ~= w then return true end
        at[key] = w
      end
    end
  end
  return false
end

local function optimum(line, rule)
  local seed, W, budget = line:match("^(%d+) (%d+) (%d+) ")
  local tables, profiles, opts = instance(tonumber(seed), tonumber(W))
  local seen = {}
  local exhaustive = search.exhaustive
  search.exhaustive = unbounded(seen)
  -- without the rule: no option has a width (search.prep, and planner.plan's check of the plan)
  if not rule then search.cache_width = function() return nil end end
  local ok, p = pcall(planner.plan, tables, profiles, tonumber(budget), opts)
  search.exhaustive, search.cache_width = exhaustive, cache_width
  assert(ok, p)
  return assert(p).data.step_seconds, seen, seed, W, budget
end

local f = assert(io.open("spec/fixtures/planner_exhaustive_400.txt"))
local moved, mixed, same_old = 0, 0, 0
for line in f:lines() do
  local step, _, seed, W, budget = optimum(line, true)
  local recorded = tonumber(line:match("(%S+)$"))
  if check then
    local old, seen = optimum(line, false)
    -- the search without the rule finds the recorded optimum again
    if math.abs(old - recorded) <= 1e-12 * recorded then same_old = same_old + 1 end
    if math.abs(step - recorded) > 1e-12 * recorded then
      moved = moved + 1
      local m = false
      for _, s in ipairs(seen) do m = m or mixes(s) end
      if m then mixed = mixed + 1 end
      io.stderr:write(("seed %s on %s ranks: %.17g -> %.17g (%+.3f%%), the optimum without the rule %s\n"):format(
        seed, W, recorded, step, 100 * (step / recorded - 1), m and "mixed widths in a cache" or "DID NOT MIX"))
    end
  end
  print(("%s %s %s %.17g"):format(seed, W, budget, step))
end
f:close()
if check then
  io.stderr:write(("%d of 400 found again without the rule; %d moved with it, %d of them where the optimum "
    .. "without it mixed widths\n"):format(same_old, moved, mixed))
end
