-- The planner's search: which option (uvmrec.planner.cost) each table takes and on which
-- ranks, so that every rank's HBM holds and the step (the slowest rank) is fastest.
--
-- items[i] = { name, options } where options are cost.option results; env = { world, avail
-- (HBM each rank has for tables), host (bytes of host memory for all ranks, or nil) }.
--
--   frontier(options)          the options no other beats on both HBM and time, HBM ascending
--   partition(...)             rank assignment: fixed shards (row_wise, data_parallel) on every
--                              rank, the others longest first onto the least loaded rank that
--                              has room (then, if that fails, largest first)
--   greedy(items, env, opts)   from every table's fastest option, downgrade along the lower
--                              convex hulls by least time added per byte freed until the ranks
--                              fit; each proposal after that goes one downgrade further and
--                              fills the room left with the upgrades that save the most time
--                              per byte; stops after opts.threshold proposals in a row that do
--                              not beat the best (default 10; false: never)
--   exhaustive(items, env)     every option of every table on every rank (branch and bound):
--                              the optimum for small instances
local M = {}
local max, min, huge = math.max, math.min, math.huge

-- ---- options ----

function M.frontier(options)
  local sorted = {}
  for _, o in ipairs(options) do sorted[#sorted + 1] = o end
  table.sort(sorted, function(a, b)
    if a.hbm ~= b.hbm then return a.hbm < b.hbm end
    return a.time < b.time
  end)
  local out, best = {}, huge
  for _, o in ipairs(sorted) do
    if o.time < best * (1 - 1e-12) then
      out[#out + 1] = o
      best = o.time
    end
  end
  return out
end

-- Indices of the frontier's lower convex hull in (hbm, time), hbm ascending.
local function hull(fr)
  local h = {}
  for j = 1, #fr do
    while #h >= 2 do
      local a, b = fr[h[#h - 1]], fr[h[#h]]
      local c = fr[j]
      -- b is above the chord a-c: drop it
      local cross = (b.hbm - a.hbm) * (c.time - a.time) - (b.time - a.time) * (c.hbm - a.hbm)
      if cross <= 0 then h[#h] = nil else break end
    end
    h[#h + 1] = j
  end
  return h
end
M.hull = hull

local function spread(o) return o.sharding == "row_wise" or o.sharding == "data_parallel" end

-- ---- partition ----

-- Ranks for every table's shards under `choice` (frontier index per item).  Returns
-- {load, hbm, ranks = {[i] = {r, ...}}} or nil, {item, need} when a shard finds no room.
function M.partition(items, choice, env, by_hbm)
  local W, avail = env.world, env.avail
  local load, hbm = {}, {}
  for r = 1, W do load[r], hbm[r] = 0, 0 end
  local ranks, units = {}, {}
  for i, it in ipairs(items) do
    local o = it.options[choice[i]]
    if spread(o) then
      local sh = o.shards[1]
      local rs = {}
      for r = 1, W do
        load[r], hbm[r] = load[r] + sh.time, hbm[r] + sh.hbm
        rs[r] = r
      end
      ranks[i] = rs
    else
      units[#units + 1] = i
    end
  end
  for r = 1, W do
    if hbm[r] > avail[r] then return nil, { item = nil, need = hbm[r] - avail[r] } end
  end
  local function key(i)
    local o = items[i].options[choice[i]]
    return by_hbm and o.shards[1].hbm or o.time_max, by_hbm and o.time_max or o.shards[1].hbm
  end
  table.sort(units, function(a, b)
    local ka, ka2 = key(a)
    local kb, kb2 = key(b)
    if ka ~= kb then return ka > kb end
    if ka2 ~= kb2 then return ka2 > kb2 end
    return a < b
  end)
  for _, i in ipairs(units) do
    local o = items[i].options[choice[i]]
    local sh, k = o.shards[1], o.shards_count
    local rs = {}
    if k == 1 then
      local best
      for r = 1, W do
        if hbm[r] + sh.hbm <= avail[r] and (not best or load[r] < load[best]) then best = r end
      end
      if not best then return nil, { item = i, need = sh.hbm } end
      rs[1] = best
    else
      local fit = {}
      for r = 1, W do if hbm[r] + sh.hbm <= avail[r] then fit[#fit + 1] = r end end
      if #fit < k then return nil, { item = i, need = sh.hbm } end
      table.sort(fit, function(a, b) if load[a] ~= load[b] then return load[a] < load[b] end return a < b end)
      for j = 1, k do rs[j] = fit[j] end
    end
    for _, r in ipairs(rs) do load[r], hbm[r] = load[r] + sh.time, hbm[r] + sh.hbm end
    ranks[i] = rs
  end
  return { load = load, hbm = hbm, ranks = ranks }
end

local function max_load(p)
  local m = 0
  for _, v in ipairs(p.load) do m = max(m, v) end
  return m
end
M.max_load = max_load

-- The better of the two partitions (longest first, largest first): feasible, then faster.
local function best_partition(items, choice, env)
  local a, ea = M.partition(items, choice, env, false)
  if env.world == 1 then return a, ea end
  local b, eb = M.partition(items, choice, env, true)
  if a and b then return max_load(a) <= max_load(b) and a or b end
  return a or b, ea or eb
end
M.best_partition = best_partition

local function host_of(items, choice)
  local s = 0
  for i, it in ipairs(items) do s = s + it.options[choice[i]].host end
  return s
end

-- ---- greedy ----

-- Upgrades that fit the room the partition left, most time saved per byte first, keeping each
-- table's sharding and ranks.
local function fill(items, choice, part, env)
  local W, avail = env.world, env.avail
  local slack = {}
  for r = 1, W do slack[r] = avail[r] - part.hbm[r] end
  local host_left = env.host and (env.host - host_of(items, choice)) or huge
  while true do
    local bi, bu, bratio
    for i, it in ipairs(items) do
      local ops = it.options
      local o = ops[choice[i]]
      local rs = part.ranks[i]
      local room = huge
      for _, r in ipairs(rs) do room = min(room, slack[r]) end
      local sh = o.shards[1]
      for u = choice[i] + 1, #ops do
        local ou = ops[u]
        if ou.sharding == o.sharding and ou.shards_count == o.shards_count then
          local dh = ou.shards[1].hbm - sh.hbm
          if dh <= room and ou.host - o.host <= host_left then
            local ratio = (o.time - ou.time) / max(dh * #rs, 1)
            if not bratio or ratio > bratio then bi, bu, bratio = i, u, ratio end
          end
        end
      end
    end
    if not bi then break end
    local o, ou = items[bi].options[choice[bi]], items[bi].options[bu]
    local dh, dt = ou.shards[1].hbm - o.shards[1].hbm, ou.shards[1].time - o.shards[1].time
    for _, r in ipairs(part.ranks[bi]) do
      slack[r] = slack[r] - dh
      part.hbm[r] = part.hbm[r] + dh
      part.load[r] = part.load[r] + dt
    end
    host_left = host_left - (ou.host - o.host)
    choice[bi] = bu
  end
  return choice, part
end

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

-- A binary heap of moves by slope.
local function heap_push(h, slope, i)
  h[#h + 1] = { slope, i }
  local k = #h
  while k > 1 do
    local p = math.floor(k / 2)
    if h[p][1] <= h[k][1] then break end
    h[p], h[k] = h[k], h[p]
    k = p
  end
end
local function heap_pop(h)
  local top = h[1]
  if not top then return nil end
  h[1] = h[#h]
  h[#h] = nil
  local k, n = 1, #h
  while true do
    local l, r, s = 2 * k, 2 * k + 1, k
    if l <= n and h[l][1] < h[s][1] then s = l end
    if r <= n and h[r][1] < h[s][1] then s = r end
    if s == k then break end
    h[s], h[k] = h[k], h[s]
    k = s
  end
  return top[1], top[2]
end

-- Returns the best plan {choice, part, cost} (cost: the slowest rank's seconds) or nil, info
-- (no proposal fit: {need} the HBM the last one lacked), and the search's statistics
-- {proposals, rated, feasible_at, best_at, stopped_early}.
function M.greedy(items, env, opts)
  opts = opts or {}
  local threshold = opts.threshold
  if threshold == nil then threshold = 10 end
  local n = #items
  local hulls, hpos, choice = {}, {}, {}
  local agg, total_avail = 0, 0
  for r = 1, env.world do total_avail = total_avail + env.avail[r] end
  local heap = {}
  local function push(i)
    local h, p = hulls[i], hpos[i]
    if p > 1 then
      local a, b = items[i].options[h[p - 1]], items[i].options[h[p]]
      heap_push(heap, (a.time - b.time) / max(b.hbm - a.hbm, 1e-9), i)
    end
  end
  for i = 1, n do
    local ops = items[i].options
    if #ops == 0 then error(("planner: table %s has no option"):format(items[i].name), 2) end
    hulls[i] = hull(ops)
    hpos[i] = #hulls[i]
    choice[i] = hulls[i][hpos[i]]
    agg = agg + ops[choice[i]].hbm
    push(i)
  end
  local host = host_of(items, choice)
  local stats = { proposals = 0, rated = 0, stopped_early = false }
  local best, nonimp, lack
  while true do
    stats.proposals = stats.proposals + 1
    local part, err
    if agg <= total_avail * (1 + 1e-12) and (not env.host or host <= env.host) then
      part, err = best_partition(items, choice, env)
    else
      err = { need = agg - total_avail }
    end
    if part then
      stats.rated = stats.rated + 1
      stats.feasible_at = stats.feasible_at or stats.proposals
      local c2, p2 = fill(items, copy(choice), part, env)
      local cost = max_load(p2)
      if not best or cost < best.cost * (1 - 1e-12) then
        best = { choice = c2, part = p2, cost = cost }
        stats.best_at = stats.proposals
        nonimp = 0
      else
        nonimp = nonimp + 1
        if threshold and threshold > 0 and nonimp >= threshold then
          stats.stopped_early = true
          break
        end
      end
    else
      lack = err
    end
    -- the next proposal: one more downgrade, least time added per byte freed
    local moved = false
    while not moved do
      local _, i = heap_pop(heap)
      if not i then break end
      local ops, h = items[i].options, hulls[i]
      local from, to = ops[h[hpos[i]]], ops[h[hpos[i] - 1]]
      -- a table whose next step would overrun host memory stays where it is
      if not env.host or host - from.host + to.host <= env.host then
        hpos[i] = hpos[i] - 1
        choice[i] = h[hpos[i]]
        agg, host = agg - from.hbm + to.hbm, host - from.host + to.host
        push(i)
        moved = true
      end
    end
    if not moved then break end
  end
  if not best then return nil, lack or {}, stats end
  return best, nil, stats
end

-- ---- exhaustive ----

-- Every option of every table and every rank assignment (movable shards on any rank, spread
-- ones on all), by depth-first search with bounds: exact for small instances.
function M.exhaustive(items, env)
  local W, avail = env.world, env.avail
  local n = #items
  local order = {}
  for i = 1, n do order[i] = i end
  local function biggest(i) return items[i].options[#items[i].options].hbm end
  table.sort(order, function(a, b) return biggest(a) > biggest(b) end)
  local load, hbm = {}, {}
  for r = 1, W do load[r], hbm[r] = 0, 0 end
  local choice, ranks = {}, {}
  local best, best_choice, best_ranks = huge, nil, nil
  local host = 0
  local visited = 0
  local function combos(k, from, acc, out)
    if #acc == k then out[#out + 1] = { unpack(acc) } return end
    for r = from, W do
      acc[#acc + 1] = r
      combos(k, r + 1, acc, out)
      acc[#acc] = nil
    end
  end
  local rank_sets = {}
  local function sets_of(k)
    if not rank_sets[k] then
      rank_sets[k] = {}
      combos(k, 1, {}, rank_sets[k])
    end
    return rank_sets[k]
  end
  local all = {}
  for r = 1, W do all[r] = r end
  local function dfs(d, cur_max)
    visited = visited + 1
    if cur_max >= best then return end
    if d > n then
      best, best_choice, best_ranks = cur_max, copy(choice), copy(ranks)
      return
    end
    local i = order[d]
    for j, o in ipairs(items[i].options) do
      if not env.host or host + o.host <= env.host then
        local sh = o.shards[1]
        local sets = spread(o) and { all } or sets_of(o.shards_count)
        for _, rs in ipairs(sets) do
          local ok, m = true, cur_max
          for _, r in ipairs(rs) do
            if hbm[r] + sh.hbm > avail[r] then ok = false break end
            m = max(m, load[r] + sh.time)
          end
          if ok and m < best then
            for _, r in ipairs(rs) do load[r], hbm[r] = load[r] + sh.time, hbm[r] + sh.hbm end
            host = host + o.host
            choice[i], ranks[i] = j, rs
            dfs(d + 1, m)
            host = host - o.host
            for _, r in ipairs(rs) do load[r], hbm[r] = load[r] - sh.time, hbm[r] - sh.hbm end
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
  return { choice = best_choice, part = part, cost = best }, { visited = visited }
end

return M
