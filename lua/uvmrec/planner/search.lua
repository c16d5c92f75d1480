-- The planner's search: which option (uvmrec.planner.cost) each table takes and on which
-- ranks, so that every rank's HBM holds and the step (the slowest rank) is fastest.
--
-- items[i] = { name, options, rank } where options are cost.option results and rank (1-based,
-- optional) the rank a table_wise table is pinned to (a config's embeddings.tables.<T>.rank);
-- env = { world, avail (HBM each rank has for tables), host (bytes of host memory for all
-- ranks, or nil) }.
--
--   frontier(options, room)    the options no other beats on both HBM and time, HBM ascending
--                              (of those whose shard fits room, where none of it does)
--   partition(...)             rank assignment: fixed shards (row_wise, data_parallel) on every
--                              rank, pinned tables on their ranks, the others longest first onto
--                              the least loaded rank that has room (then, if that fails, largest
--                              first); column_wise shards on their fixed ranks (column_ranks)
--   greedy(items, env, opts)   from every table's fastest option, downgrade along the lower
--                              convex hulls by least time added per byte freed until the ranks
--                              fit; each proposal after that goes one downgrade further and
--                              fills the room left with the upgrades that save the most time
--                              per byte; stops after opts.threshold proposals in a row that do
--                              not beat the best (default 10; false: never); with several
--                              ranks, then pairs of changes (pair_phase).  opts.start: a plan
--                              ({choice, part}) to start from too, repaired and shrunk to fit
--                              (its local search run from each start, the fastest kept)
--   greedy_widths(...)         the greedy, but on one rank with cached choices of several row
--                              widths: once a width (the one cache holds one), the fastest plan
--   exhaustive(items, env)     every option of every table on every rank (branch and bound):
--                              the optimum for small instances
-- Over ranks every one of them counts a rank's HBM with the shares of its cache's scratch it holds
-- once it caches (held), but with items.relaxed.
local M = {}
local max, min, huge = math.max, math.min, math.huge
-- the pair phase's bounds (see greedy's pair_phase)
local PAIRS, PAIR_WORK, PAIR_TRIES = 24, 20000, 64

-- ---- options ----

-- room (optional): the HBM a rank has for tables.  When no choice of the frontier has a shard
-- that fits it, the frontier of the choices that do (its smaller totals had hidden them: a
-- device table larger than any rank, on 8 ranks, kept table_wise's 19 GiB on one rank and cut
-- column_wise's 2.4 GiB on each, and no plan was found).  Only then: a frontier of more choices
-- leads the greedy search elsewhere (MLPerf's tables on 8 ranks ended 5% slower).
function M.frontier(options, room)
  local sorted = {}
  for _, o in ipairs(options) do sorted[#sorted + 1] = o end
  table.sort(sorted, function(a, b)
    if a.hbm ~= b.hbm then return a.hbm < b.hbm end
    return a.time < b.time
  end)
  local out, best, fits = {}, huge, not room
  for _, o in ipairs(sorted) do
    if o.time < best * (1 - 1e-12) then
      out[#out + 1] = o
      best = o.time
      fits = fits or o.shards[1].hbm <= room
    end
  end
  if fits then return out end
  local fitting = {}
  for _, o in ipairs(options) do
    if o.shards[1].hbm <= room then fitting[#fitting + 1] = o end
  end
  return #fitting > 0 and M.frontier(fitting) or out
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

-- ---- one row width a cache ----

-- A rank's cached shards share one cache, whose rows have one dim and dtype (ur_cache_new
-- refuses two: "tables sharing a cache have one dim and dtype"); uvmrec.dist.sharded gives a
-- rank's table- and column-wise shards one cache and its row-wise ones another.  Per option,
-- CW[v]: the width of its cache's rows as a number (items.width_names[CW[v]] its "dim 32, f16"),
-- 0 without a cache.  items.widths is true where the cached options have two widths or more:
-- only then do the searches keep to the rule (a model of one width plans as it did before it).
-- The row-wise shards' cache is on every rank at once: its width is kept at index 0 of the
-- partition's per-rank lists (cw, cn: the width a rank's cache holds, and its shards there).
--
-- A rank whose cache is still empty takes any width; a cached table_wise shard goes to the
-- least loaded rank with room that already caches its width, and to an empty one only while
-- its width holds fewer ranks than its share of the model's work (quota: the tables that may
-- cache at that width, by their fastest choice's time, of all tables', over the ranks, at
-- least 1) and, holding a rank already, leaves an empty rank for each width the choice caches
-- that holds none yet (spare), or where no rank of its width has room.  The ranks of pinned and
-- cached column_wise tables take their widths before the walk.  Placing on the least loaded
-- rank alone gave every rank's cache the first width placed (wip/planner-one-width: 8 ranks,
-- the other widths uncached); the quota is the choice's own nowhere, and the widths kept ranks
-- for are a set that few moves change, which fails_again tests.
local function cache_widths(items)
  local ids, names, weight, total = {}, {}, {}, 0
  local column_cached = {} -- the items with a cached column_wise choice
  for i, it in ipairs(items) do
    local CW, seen = {}, {}
    for v, o in ipairs(it.options) do
      local w = 0
      if o.placement == "cached" and o.width then
        w = ids[o.width]
        if not w then
          names[#names + 1] = o.width
          w = #names
          ids[o.width], weight[w] = w, 0
        end
        -- a table_wise cached choice: its table's work counts toward its width's ranks
        if not it.SP[v] and it.SK[v] == 1 and not seen[w] then
          seen[w] = true
          weight[w] = weight[w] + it.T[#it.T]
        end
      end
      CW[v] = w
      if w ~= 0 and not it.SP[v] and it.SK[v] > 1 and column_cached[#column_cached] ~= i then
        column_cached[#column_cached + 1] = i
      end
    end
    it.CW = CW
    if #it.T > 0 then total = total + it.T[#it.T] end
  end
  items.widths, items.width_names, items.column_cached = #names > 1, names, column_cached
  -- by world size, made when first asked for
  items.quota = setmetatable({}, { __index = function(quota, W)
    local q = {}
    for w = 1, #names do q[w] = total > 0 and max(1, math.ceil(W * weight[w] / total - 1e-9)) or 1 end
    quota[W] = q
    return q
  end })
end

-- Whether rank r's cache (cw, cn: see above) takes width w (0: no cache, always).
local function takes(cw, cn, r, w)
  return w == 0 or cn[r] == 0 or cw[r] == w
end

-- ---- a rank's cache scratch ----

-- Over ranks a rank's collection (its table- and column-wise shards; the row-wise shards' is on
-- every rank at once, kept at index 0 as the widths are) hands its cache every shard's values, so
-- the cache's scratch grows with each shard there, cached or not (cost.option: o.room, o.share).
-- A cached shard holds its own room in its HBM; the others' shares are held on a rank only once
-- its collection caches a shard.  Per collection (cc, sn): its cached shards, and the shares of
-- the others (whole bytes: their sums are exact, so what joins and leaves adds up to nothing).
-- Holding every shard's share wherever a table may be cached made plans whose ranks cache
-- nothing slower (search_spec's two-rank seed 131: 2.165 to 3.253 ms, s45-plan-wip); holding the
-- cached shards' own alone let plans pass their budget once planner.build counted the rank's
-- cache over its every value (seed 11: rank 0 1210.8 MiB of 1018.2).
-- The bytes collection r's held shares change by as dc cached shards and ds bytes of the others'
-- shares join it (negative: leave); a shard joining never makes them fewer.
local function held(cc, sn, r, dc, ds)
  local k, s = cc[r], sn[r]
  return (k + dc > 0 and s + ds or 0) - (k > 0 and s or 0)
end

-- The first rank whose cache holds two widths under choice and ranks (a partition's):
-- {rank (1-based), row_wise, a, b (items: a placed first)}, or nil.
function M.cache_clash(items, choice, ranks)
  local first = {}
  for i, it in ipairs(items) do
    local o = it.options[choice[i]]
    if o.placement == "cached" then
      local row = o.sharding == "row_wise"
      for _, r in ipairs(row and { 1 } or ranks[i]) do
        local key = row and 0 or r
        local a = first[key]
        if a and items[a].options[choice[a]].width ~= o.width then
          return { rank = r, row_wise = row, a = a, b = i }
        end
        first[key] = a or i
      end
    end
  end
end

-- A partition's shard of item i at width w on rank r (0: the row-wise shards' cache), or the
-- failure naming the table whose width r's cache holds (`at`: the place in the walk).
local function cache_add(cw, cn, cf, nr, ranks, i, w, r, at)
  if cn[r] > 0 and cw[r] ~= w then
    return { item = i, other = cf[r], width = true, need = 0, at = at, rank = r == 0 and 1 or r, row_wise = r == 0,
             ranks = ranks }
  end
  if cn[r] == 0 then
    cw[r], cf[r] = w, i
    if r > 0 then nr[w] = nr[w] + 1 end
  end
  cn[r] = cn[r] + 1
end

-- Per width, the tables `choice` caches at it on chosen ranks (table_wise and column_wise ones;
-- the row-wise shards' cache is another).
local function cached_tables(items, choice)
  local nt = {}
  for w = 1, #items.width_names do nt[w] = 0 end
  for i, it in ipairs(items) do
    local c = choice[i]
    if it.CW[c] ~= 0 and not it.SP[c] then nt[it.CW[c]] = nt[it.CW[c]] + 1 end
  end
  return nt
end

-- Whether width w, holding a rank, may take one more empty rank: as many stay empty after it as
-- there are widths that tables (nt: cached_tables) cache and no rank holds yet.  The quotas are
-- rounded up, so they can add up to more than the ranks: a width walked early took empty ranks
-- up to its quota and a later one found none (seed 20521: three dim-64 tables took both ranks,
-- and the greedy planned 8.73 ms where 1.84 ms was there).
local function spare(cn, nr, nt, W, w)
  local empty, without = 0, 0
  for r = 1, W do if cn[r] == 0 then empty = empty + 1 end end
  for v = 1, #nt do if v ~= w and nt[v] > 0 and nr[v] == 0 then without = without + 1 end end
  return empty > without
end

-- Flat arrays per item, for the inner loops: per option, total HBM, time and host bytes (H, T,
-- X), a shard's HBM and time (SH, ST), whether it spreads over every rank (SP), its shard
-- count (SK) and its sharding as a number (FAM: changes within one keep the ranks), whether it
-- is cached (CA, 1 or 0) and a shard's share of its rank's cache scratch otherwise (SC: held; 0
-- with items.relaxed, where no share is held); and room for repair's downgrades by option (RV,
-- RR).
local function prep(items)
  if items.prepared then return end
  local fam = {}
  for _, it in ipairs(items) do
    local H, T, X, SH, ST, SP, SK, FAM, CA, SC = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
    for v, o in ipairs(it.options) do
      H[v], T[v], X[v] = o.hbm, o.time, o.host
      CA[v], SC[v] = o.placement == "cached" and 1 or 0, not items.relaxed and o.share or 0
      SH[v], ST[v], SP[v], SK[v] = o.shards[1].hbm, o.shards[1].time, spread(o), o.shards_count
      local key = o.sharding .. "/" .. o.shards_count
      if not fam[key] then fam[key] = #fam + 1 fam[#fam + 1] = key end
      FAM[v] = fam[key]
    end
    it.H, it.T, it.X, it.SH, it.ST, it.SP, it.SK, it.FAM, it.CA, it.SC = H, T, X, SH, ST, SP, SK, FAM, CA, SC
    it.RV, it.RR = {}, {} -- repair's downgrades, by option (ratio_move)
  end
  cache_widths(items)
  -- the pinned tables, placed before the others (their options are all table_wise: cost.options)
  local pinned = {}
  for i, it in ipairs(items) do
    if it.rank then
      for v = 1, #it.options do
        if it.SP[v] or it.SK[v] ~= 1 then
          error(("search: table %s is pinned to rank %d but its option %d has %d shards"):format(it.name,
            it.rank - 1, v, it.SK[v]), 2)
        end
      end
      pinned[#pinned + 1] = i
    end
  end
  items.pinned = pinned
  -- the partitioner's orders, sorted once: every (item, option) whose shards go on chosen ranks,
  -- longest first (ties: largest, then the lower item) and largest first (ties: longest); a
  -- partition walks one and takes the pairs of the choice, in the order a sort of the chosen
  -- shards would give, without sorting them again each time (it ran thousands of times a plan:
  -- the sort's comparisons were half of the greedy search's time)
  for _, by_hbm in ipairs({ false, true }) do
    local pi, pv = {}, {}
    for i, it in ipairs(items) do
      for v = 1, #it.options do
        if not it.SP[v] and not it.rank then pi[#pi + 1], pv[#pv + 1] = i, v end
      end
    end
    local k1, k2 = {}, {}
    for k = 1, #pi do
      local it, v = items[pi[k]], pv[k]
      if by_hbm then k1[k], k2[k] = it.SH[v], it.ST[v] else k1[k], k2[k] = it.ST[v], it.SH[v] end
    end
    local idx = {}
    for k = 1, #pi do idx[k] = k end
    table.sort(idx, function(a, b)
      if k1[a] ~= k1[b] then return k1[a] > k1[b] end
      if k2[a] ~= k2[b] then return k2[a] > k2[b] end
      if pi[a] ~= pi[b] then return pi[a] < pi[b] end
      return pv[a] < pv[b]
    end)
    local oi, ov = {}, {}
    for k, j in ipairs(idx) do oi[k], ov[k] = pi[j], pv[j] end
    items[by_hbm and "order_hbm" or "order_time"] = { oi, ov }
    -- each option's place in the order (repair's test of a failed partition: M.fails_again)
    local key = by_hbm and "PH" or "PT"
    for _, it in ipairs(items) do it[key] = {} end
    for k = 1, #oi do items[oi[k]][key][ov[k]] = k end
  end
  items.prepared = true
end
M.prep = prep

-- ---- partition ----

-- A table_wise shard's ranks, {r}: one list a rank, shared by every partition (a list a table
-- a partition was a sixth of the bytes 1000 tables on 8 ranks allocated); never written to.
local ONE = setmetatable({}, { __index = function(one, r)
  one[r] = { r }
  return one[r]
end })

-- The ranks of the k column shards of the i-th table, in column order, where a run puts them
-- (uvmrec.dist.plan: shard s on rank (i - 1 + s) mod W): a plan that put them on the least
-- loaded ranks was refused by 'train --plan' ("the run would place it on 1,0").
local function column_ranks(i, k, W)
  local rs = {}
  for s = 0, k - 1 do rs[s + 1] = (i - 1 + s) % W + 1 end
  return rs
end
M.column_ranks = column_ranks

-- Ranks for every table's shards under `choice` (frontier index per item).  Returns
-- {load, hbm, ranks = {[i] = {r, ...}}} or nil, {item, need, share, at, rank, left, ranks} when a
-- shard finds no room (at: its place in the order walked, 0 for the spread and pinned shards
-- placed before it; rank: the rank it was to go on, or the roomiest, with `left` bytes there;
-- need: the bytes it takes there, its own and the shares of the rank's cache scratch it makes
-- the rank hold (share, held; need - left is the shortfall: the pinned shards' need was the
-- shortfall, the others' the whole, and the refusal printed `shard - left`, negative where a
-- share was held); with item nil, the spread shards' on every rank and their collection's
-- share; ranks: the shards placed so far, for a message naming what the rank holds).  A table_wise
-- shard's list is ONE[r], shared by every partition: read it, never write to it.  A rank's hbm
-- counts the shares it holds (held: cc, sn, kept in the partition).
function M.partition(items, choice, env, by_hbm)
  prep(items)
  local W, avail = env.world, env.avail
  local load, hbm = {}, {}
  local cc, sn = {}, {}
  for r = 0, W do cc[r], sn[r] = 0, 0 end
  local ranks = {}
  local all = {}
  for r = 1, W do all[r] = r end
  -- one width a cache (cache_widths): each rank's (index 0: the row-wise shards'), its shards
  -- there and the first of them (cw, cn, cf), the ranks each width holds (nr), the tables each
  -- width caches on chosen ranks (nt: cached_tables)
  local widths = items.widths and not env.any_width
  local cw, cn, cf, nr, quota, nt
  if widths then
    cw, cn, cf, nr, quota = {}, {}, {}, {}, items.quota[W]
    for r = 0, W do cw[r], cn[r] = 0, 0 end
    for w = 1, #items.width_names do nr[w] = 0 end
  end
  -- spread shards add the same to every rank: summed once, in the items' order (the sums each
  -- rank had, bit for bit), then set on all ranks (one loop over the ranks per spread table
  -- made a partition O(tables x ranks) before the shards were placed)
  local spread_t, spread_h = 0, 0
  for i, it in ipairs(items) do
    local c = choice[i]
    if it.SP[c] then
      spread_t, spread_h = spread_t + it.ST[c], spread_h + it.SH[c]
      cc[0], sn[0] = cc[0] + it.CA[c], sn[0] + it.SC[c]
      ranks[i] = all
      if widths and it.CW[c] ~= 0 then
        local e = cache_add(cw, cn, cf, nr, ranks, i, it.CW[c], 0, 0)
        if e then return nil, e end
      end
    end
  end
  if cc[0] > 0 then spread_h = spread_h + sn[0] end
  for r = 1, W do
    load[r], hbm[r] = spread_t, spread_h
    if spread_h > avail[r] then
      return nil, { item = nil, need = spread_h, share = cc[0] > 0 and sn[0] or 0, at = 0, rank = r, left = avail[r],
                    ranks = ranks }
    end
  end
  -- pinned tables: on their ranks, before the others take the room
  for _, i in ipairs(items.pinned) do
    local it, c = items[i], choice[i]
    local r = it.rank
    if r > W then return nil, { item = i, need = it.SH[c], at = 0 } end
    local share = held(cc, sn, r, it.CA[c], it.SC[c])
    local sh = it.SH[c] + share
    if hbm[r] + sh > avail[r] then
      return nil, { item = i, need = sh, share = share, at = 0, rank = r, left = avail[r] - hbm[r],
                    ranks = ranks }
    end
    if widths and it.CW[c] ~= 0 then
      local e = cache_add(cw, cn, cf, nr, ranks, i, it.CW[c], r, 0)
      if e then return nil, e end
    end
    load[r], hbm[r] = load[r] + it.ST[c], hbm[r] + sh
    cc[r], sn[r] = cc[r] + it.CA[c], sn[r] + it.SC[c]
    ranks[i] = ONE[r]
  end
  -- a cached column_wise table's ranks are fixed (column_ranks): their caches take its width
  -- before the walk, as the pinned tables' do, and no shard of another width walked before it
  -- takes them (colwise4: a dim-32 table took rank 0 of a dim-8 table's two shards, no plan)
  -- (its ranks are recorded first: a clash found here names the table, which the repair's
  -- width_moves may take off its cache; 87f8955's pass did not, and found no plan for seed 111)
  if widths then
    for _, i in ipairs(items.column_cached) do
      local it, c = items[i], choice[i]
      local w = it.CW[c]
      if w ~= 0 and not it.SP[c] and it.SK[c] > 1 then
        local rs = column_ranks(i, it.SK[c], W)
        ranks[i] = rs
        for _, r in ipairs(rs) do
          local e = cache_add(cw, cn, cf, nr, ranks, i, w, r, 0)
          if e then return nil, e end
        end
      end
    end
  end
  local order = by_hbm and items.order_hbm or items.order_time
  local oi, ov = order[1], order[2]
  for o = 1, #oi do
    local i = oi[o]
    local it, c = items[i], choice[i]
    -- the pairs of other options are skipped
    if c == ov[o] then
      local sh, st, k = it.SH[c], it.ST[c], it.SK[c]
      local a, s = it.CA[c], it.SC[c]
      local w = widths and it.CW[c] or 0
      if k == 1 then
        -- the least loaded rank with room (the first of equals); best is a number throughout,
        -- 0 for none (nil, then a rank, made this loop 7% slower in LuaJIT's traces)
        local best, least = 0, 0
        if w == 0 then
          for r = 1, W do
            local l = load[r]
            if hbm[r] + sh + held(cc, sn, r, a, s) <= avail[r] and (best == 0 or l < least) then best, least = r, l end
          end
        else
          -- a cached shard: of the ranks of its width, and of the empty ones while the width is
          -- under its quota and, holding a rank already, leaves enough of them for the widths
          -- still without one (spare); failing both, of any empty one
          for pass = 1, 2 do
            local claim = pass == 2 or nr[w] == 0
            if not claim and nr[w] < quota[w] then
              nt = nt or cached_tables(items, choice)
              claim = spare(cn, nr, nt, W, w)
            end
            for r = 1, W do
              local l = load[r]
              if hbm[r] + sh + held(cc, sn, r, a, s) <= avail[r] and (cn[r] == 0 and claim or cn[r] > 0 and cw[r] == w)
                 and (best == 0 or l < least) then
                best, least = r, l
              end
            end
            if best > 0 or claim then break end
          end
          if best == 0 then
            -- no room where its width may go: where some rank's cache takes it, room is what the
            -- shard lacks (takes: on the roomiest of those ranks), and the repair frees HBM, as for
            -- any shard.  Reported as a cache of another width in the way, it had the repair take
            -- the table or that width's tables off their cache (planner_fuzz's seed 2084, 2 ranks
            -- in 26 MiB: three dim-32 tables went managed where smaller caches fit, 12.876 ms
            -- against the exhaustive's 11.135)
            local room = 0
            for r = 1, W do
              if (cn[r] == 0 or cw[r] == w) and (room == 0 or avail[r] - hbm[r] > avail[room] - hbm[room]) then
                room = r
              end
            end
            if room > 0 then
              local e = held(cc, sn, room, a, s)
              return nil, { item = i, need = sh + e, share = e, at = o, rank = room,
                            left = avail[room] - hbm[room], ranks = ranks, takes = true }
            end
            -- the ranks with room cache other widths: the least loaded of them, and what it caches
            for r = 1, W do
              if hbm[r] + sh + held(cc, sn, r, a, s) <= avail[r] and (best == 0 or load[r] < least) then
                best, least = r, load[r]
              end
            end
            if best > 0 then return nil, cache_add(cw, cn, cf, nr, ranks, i, w, best, o) end
          else
            cache_add(cw, cn, cf, nr, ranks, i, w, best, o)
          end
        end
        if best == 0 then
          local room = 1
          for r = 2, W do if avail[r] - hbm[r] > avail[room] - hbm[room] then room = r end end
          local e = held(cc, sn, room, a, s)
          return nil, { item = i, need = sh + e, share = e, at = o, rank = room,
                        left = avail[room] - hbm[room], ranks = ranks }
        end
        load[best], hbm[best] = load[best] + st, hbm[best] + sh + held(cc, sn, best, a, s)
        cc[best], sn[best] = cc[best] + a, sn[best] + s
        ranks[i] = ONE[best]
      else
        local rs = column_ranks(i, k, W)
        for _, r in ipairs(rs) do
          local e = held(cc, sn, r, a, s)
          if hbm[r] + sh + e > avail[r] then
            return nil, { item = i, need = sh + e, share = e, at = o, rank = r,
                          left = avail[r] - hbm[r], ranks = ranks }
          end
        end
        -- (its caches took its width before the walk)
        for _, r in ipairs(rs) do
          load[r], hbm[r] = load[r] + st, hbm[r] + sh + held(cc, sn, r, a, s)
          cc[r], sn[r] = cc[r] + a, sn[r] + s
        end
        ranks[i] = rs
      end
    end
  end
  return { load = load, hbm = hbm, ranks = ranks, cw = cw, cn = cn, cc = cc, sn = sn }
end

local function max_load(p)
  local m = 0
  for _, v in ipairs(p.load) do m = max(m, v) end
  return m
end
M.max_load = max_load

-- Whether rank r's cache takes width w once a shard of width `out` leaves it (improve's swaps).
local function takes_after(cw, cn, r, w, out)
  return w == 0 or cn[r] - (out ~= 0 and 1 or 0) == 0 or cw[r] == w
end

-- A shard of width w into (d = 1) or out of (-1) rank r's cache.
local function cache_shift(cw, cn, r, w, d)
  if cw and w ~= 0 then
    if cn[r] == 0 then cw[r] = w end
    cn[r] = cn[r] + d
  end
end

-- Moves and swaps of single-rank shards off the slowest rank while that makes it faster and
-- memory holds (swaps only where the shards are few enough to try every pair), the shares the
-- ranks hold changing with what they cache (held).
local function improve(items, choice, env, p)
  local W, avail = env.world, env.avail
  local load, hbm, ranks = p.load, p.hbm, p.ranks
  local cc, sn = p.cc, p.sn
  -- one width a cache (cache_widths): a cached shard moves only to a cache of its width or an
  -- empty one, and a swap leaves each rank's cache one width
  local cw, cn = p.cw, p.cn
  local units = {}
  for i, it in ipairs(items) do
    local c = choice[i]
    if not it.SP[c] and it.SK[c] == 1 and not it.rank then units[#units + 1] = i end
  end
  local swaps = #units <= 64
  for _ = 1, min(4 * #units + 4, 64) do
    local top = 1
    for r = 2, W do if load[r] > load[top] then top = r end end
    local cur = load[top]
    local bi, bj, br, bnew
    for _, i in ipairs(units) do
      if ranks[i][1] == top then
        local sh = items[i].options[choice[i]].shards[1]
        local wi = cw and items[i].CW[choice[i]] or 0
        local ai, si = items[i].CA[choice[i]], items[i].SC[choice[i]]
        for r = 1, W do
          if r ~= top and hbm[r] + sh.hbm + held(cc, sn, r, ai, si) <= avail[r]
             and (not cw or takes_after(cw, cn, r, wi, 0)) then
            local new = max(cur - sh.time, load[r] + sh.time)
            if new < (bnew or cur) * (1 - 1e-12) then bi, bj, br, bnew = i, nil, r, new end
          end
        end
        if swaps then
          for _, j in ipairs(units) do
            local r = ranks[j][1]
            if r ~= top then
              local sj = items[j].options[choice[j]].shards[1]
              local wj = cw and items[j].CW[choice[j]] or 0
              local aj, s2 = items[j].CA[choice[j]], items[j].SC[choice[j]]
              if hbm[r] - sj.hbm + sh.hbm + held(cc, sn, r, ai - aj, si - s2) <= avail[r]
                 and hbm[top] - sh.hbm + sj.hbm + held(cc, sn, top, aj - ai, s2 - si) <= avail[top]
                 and (not cw or takes_after(cw, cn, r, wi, wj) and takes_after(cw, cn, top, wj, wi)) then
                local new = max(cur - sh.time + sj.time, load[r] + sh.time - sj.time)
                if new < (bnew or cur) * (1 - 1e-12) then bi, bj, br, bnew = i, j, r, new end
              end
            end
          end
        end
      end
    end
    if not bi then break end
    local si = items[bi].options[choice[bi]].shards[1]
    local a, s = items[bi].CA[choice[bi]], items[bi].SC[choice[bi]]
    load[top], hbm[top] = load[top] - si.time, hbm[top] - si.hbm + held(cc, sn, top, -a, -s)
    load[br], hbm[br] = load[br] + si.time, hbm[br] + si.hbm + held(cc, sn, br, a, s)
    cc[top], sn[top], cc[br], sn[br] = cc[top] - a, sn[top] - s, cc[br] + a, sn[br] + s
    ranks[bi] = ONE[br]
    local wi = cw and items[bi].CW[choice[bi]] or 0
    cache_shift(cw, cn, top, wi, -1)
    if bj then
      local sj = items[bj].options[choice[bj]].shards[1]
      local b, t = items[bj].CA[choice[bj]], items[bj].SC[choice[bj]]
      load[br], hbm[br] = load[br] - sj.time, hbm[br] - sj.hbm + held(cc, sn, br, -b, -t)
      load[top], hbm[top] = load[top] + sj.time, hbm[top] + sj.hbm + held(cc, sn, top, b, t)
      cc[br], sn[br], cc[top], sn[top] = cc[br] - b, sn[br] - t, cc[top] + b, sn[top] + t
      ranks[bj] = ONE[top]
      local wj = cw and items[bj].CW[choice[bj]] or 0
      cache_shift(cw, cn, br, wj, -1)
      cache_shift(cw, cn, top, wj, 1)
    end
    cache_shift(cw, cn, br, wi, 1)
  end
  return p
end

-- The better of the two partitions (longest first, largest first), each improved by moves and
-- swaps: feasible, then faster.
local function best_partition(items, choice, env)
  local a, ea = M.partition(items, choice, env, false)
  local b, eb
  if env.world == 1 then
    if ea then ea.at_hbm = -1 end -- one order: the other bounds nothing
  else
    if a then improve(items, choice, env, a) end
    b, eb = M.partition(items, choice, env, true)
    if b then improve(items, choice, env, b) end
    if a and b then return max_load(a) <= max_load(b) and a or b end
    if not a and not b then ea.at_hbm = eb.at end
  end
  -- (fails_again: where the widths are kept apart, the walks kept empty ranks for these)
  if not a and not b and items.widths and not env.any_width then ea.width_tables = cached_tables(items, choice) end
  return a or b, ea or eb
end
M.best_partition = best_partition

-- Whether best_partition, having failed with `err`, fails again, the same way, after item i's
-- choice moved from c to v: both of its options come after the places the two walks stopped at,
-- and neither is spread nor pinned, so the walks up to those places are the same.  Repair's
-- downgrades by ratio move tables that are small and late in the orders while the shard that
-- found no room is locked (the change proposed): each was followed by a whole partition, two
-- walks of O(choices + tables x ranks), up to 8 x tables moves a proposal (1000 tables on 8
-- ranks: 3,582 of 3,782 failed partitions).
-- Where the caches' widths are kept apart (err.width_tables, the choice's cached_tables), the walks
-- also depend on every cached column_wise table (its ranks take its width before the walk) and on
-- which widths the choice caches (the empty ranks kept for them: spare); a move that keeps both
-- is counted into err.width_tables, for the next move's test.
local function fails_again(it, c, v, err)
  if it.rank or it.SP[c] or it.SP[v] then return false end
  local at, ah = err.at, err.at_hbm
  if not (it.PT[c] > at and it.PT[v] > at and it.PH[c] > ah and it.PH[v] > ah) then return false end
  local nt = err.width_tables
  if nt then
    local a, b = it.CW[c], it.CW[v]
    if a ~= 0 and it.SK[c] > 1 or b ~= 0 and it.SK[v] > 1 then return false end
    if a ~= b then
      if a ~= 0 and nt[a] == 1 or b ~= 0 and nt[b] == 0 then return false end
      if a ~= 0 then nt[a] = nt[a] - 1 end
      if b ~= 0 then nt[b] = nt[b] + 1 end
    end
  end
  return true
end
M.fails_again = fails_again

local function host_of(items, choice)
  local s = 0
  for i, it in ipairs(items) do s = s + it.options[choice[i]].host end
  return s
end

-- ---- greedy ----

-- Whether an upgrade of `it` from c to u keeps its ranks rs (a fill's) one width a cache (a
-- cached choice's others of its sharding have its width).
local function cache_takes(cw, cn, it, c, u, rs)
  local w = it.CW[u]
  if w == 0 or it.CW[c] ~= 0 then return true end
  if it.SP[u] then return takes(cw, cn, 0, w) end
  for j = 1, #rs do
    if not takes(cw, cn, rs[j], w) then return false end
  end
  return true
end

-- Upgrades that fit the room the partition left, most time saved per byte first, keeping each
-- table's sharding and ranks.
local function fill(items, choice, part, env, locked, by_gain)
  local W, avail, ranks = env.world, env.avail, part.ranks
  local n = #items
  local slack = {}
  for r = 1, W do slack[r] = avail[r] - part.hbm[r] end
  local host_left = env.host and (env.host - host_of(items, choice)) or huge
  -- each table's best upgrade at the room it has (up[i], or 0; gain[i], its ratio, or false), the
  -- first of the best in the options' order, looked for again only where an upgrade changed the
  -- room: on the ranks it took room on, or everywhere where host memory is bounded.  The pick is
  -- then the first of the best over the tables, as one pass over every table's every upgrade
  -- finds it; that pass a step (13.5 steps a fill at 1000 tables on 8 ranks a tenth of the way
  -- from the least budget) was a quarter of the CPU there.
  local up, gain = {}, {}
  -- one width a cache (cache_widths): an upgrade to a cache keeps the table's ranks, so their
  -- caches must take its width (a cached choice's others of its sharding have its width)
  local cw, cn = part.cw, part.cn
  -- an upgrade to or off a cache changes the shares its ranks hold (held; the row-wise shards'
  -- collection, 0, is every rank's)
  local cc, sn = part.cc, part.sn
  local function look(i)
    local it, c = items[i], choice[i]
    local nops = #it.H
    local bu, bratio = 0, false
    if c < nops and not (locked and locked[i]) then
      local rs = ranks[i]
      local room = huge
      for j = 1, #rs do
        local sl = slack[rs[j]]
        if sl < room then room = sl end
      end
      local T, X, SH, FAM, CA, SC = it.T, it.X, it.SH, it.FAM, it.CA, it.SC
      local fam, sh, t0, x0, nr = FAM[c], SH[c], T[c], X[c], #rs
      local a0, s0, row = CA[c], SC[c], it.SP[c]
      for u = c + 1, nops do
        if FAM[u] == fam then
          local dh = SH[u] - sh
          -- the room on its ranks net of the shares they come to hold, or give back (ex: summed)
          local fits, ex = room, 0
          if CA[u] ~= a0 or SC[u] ~= s0 then
            fits = huge
            for j = 1, #rs do
              local r = rs[j]
              local e = held(cc, sn, row and 0 or r, CA[u] - a0, SC[u] - s0)
              ex = ex + e
              if slack[r] - e < fits then fits = slack[r] - e end
            end
          end
          -- (faster: where a table keeps its choices without a cache beside its frontier, not all are)
          if dh <= fits and X[u] - x0 <= host_left and T[u] < t0 and (not cw or cache_takes(cw, cn, it, c, u, rs)) then
            local ratio = by_gain and (t0 - T[u]) or (t0 - T[u]) / max(dh * nr + ex, 1)
            if not bratio or ratio > bratio then bu, bratio = u, ratio end
          end
        end
      end
    end
    up[i], gain[i] = bu, bratio
  end
  for i = 1, n do look(i) end
  local touched = {}
  while true do
    local bi, bu, bratio
    for i = 1, n do
      local ratio = gain[i]
      if ratio and (not bratio or ratio > bratio) then bi, bu, bratio = i, up[i], ratio end
    end
    if not bi then break end
    local it = items[bi]
    local c = choice[bi]
    local dh, dt = it.SH[bu] - it.SH[c], it.ST[bu] - it.ST[c]
    local dc, ds, row = it.CA[bu] - it.CA[c], it.SC[bu] - it.SC[c], it.SP[c]
    for r = 1, W do touched[r] = false end
    for _, r in ipairs(ranks[bi]) do
      local d = dh + held(cc, sn, row and 0 or r, dc, ds)
      slack[r] = slack[r] - d
      part.hbm[r] = part.hbm[r] + d
      part.load[r] = part.load[r] + dt
      touched[r] = true
    end
    for _, r in ipairs(row and { 0 } or ranks[bi]) do cc[r], sn[r] = cc[r] + dc, sn[r] + ds end
    host_left = host_left - (it.X[bu] - it.X[c])
    if cw and (it.CW[c] == 0) ~= (it.CW[bu] == 0) then
      local w, d = it.CW[bu] ~= 0 and it.CW[bu] or it.CW[c], it.CW[bu] ~= 0 and 1 or -1
      for _, r in ipairs(it.SP[bu] and { 0 } or ranks[bi]) do
        if cn[r] == 0 then cw[r] = w end
        cn[r] = cn[r] + d
      end
    end
    choice[bi] = bu
    for i = 1, n do
      local again = i == bi or env.host ~= nil
      if not again then
        local rs = ranks[i]
        for j = 1, #rs do
          if touched[rs[j]] then
            again = true
            break
          end
        end
      end
      if again then look(i) end
    end
  end
  return choice, part
end

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

-- The better of two fills: most time saved per byte first, and most time saved first (the
-- first alone can leave a large upgrade out for many small ones).
local function fill_best(items, choice, part, env, locked)
  local function again()
    return { load = copy(part.load), hbm = copy(part.hbm), ranks = part.ranks, cw = part.cw and copy(part.cw),
             cn = part.cn and copy(part.cn), cc = copy(part.cc), sn = copy(part.sn) }
  end
  local c1, p1 = fill(items, copy(choice), again(), env, locked, false)
  local c2, p2 = fill(items, copy(choice), again(), env, locked, true)
  if max_load(p2) < max_load(p1) then return c2, p2 end
  return c1, p1
end

-- A plan's choice on its own ranks (ranks[i], a partition's) made to fit: the partition's sums
-- of it, then, while a rank passes its room, the change of one of its tables within its sharding
-- (its ranks kept) that adds the least time per byte it frees there, its other ranks freeing
-- too; then filled.  {choice, part, cost}, or nil where a rank cannot be brought within its room.
-- For a plan searched with no rank's share of its cache's scratch held (planner.plan): its ranks
-- were weighed with the plan, and a partition of its choice from the start put them elsewhere
-- (planner_fuzz's seed 24418 on 3 ranks: 0.986 ms from the partition, 0.686 the optimum).
local function shrink(items, choice, ranks, env)
  local W, avail = env.world, env.avail
  local n = #items
  choice = copy(choice)
  local p = { load = {}, hbm = {}, ranks = ranks, cc = {}, sn = {} }
  for r = 0, W do p.cc[r], p.sn[r] = 0, 0 end
  for r = 1, W do p.load[r], p.hbm[r] = 0, 0 end
  local widths = items.widths and not env.any_width
  if widths then
    p.cw, p.cn = {}, {}
    for r = 0, W do p.cw[r], p.cn[r] = 0, 0 end
  end
  local host = host_of(items, choice)
  local function add(i, d)
    local it, c = items[i], choice[i]
    local row = it.SP[c]
    for _, r in ipairs(ranks[i]) do
      p.load[r] = p.load[r] + d * it.ST[c]
      p.hbm[r] = p.hbm[r] + d * it.SH[c] + held(p.cc, p.sn, row and 0 or r, d * it.CA[c], d * it.SC[c])
    end
    for _, r in ipairs(row and { 0 } or ranks[i]) do
      p.cc[r], p.sn[r] = p.cc[r] + d * it.CA[c], p.sn[r] + d * it.SC[c]
      cache_shift(p.cw, p.cn, r, widths and it.CW[c] or 0, d)
    end
  end
  for i = 1, n do add(i, 1) end
  while true do
    local top, over = 0, 0
    for r = 1, W do
      if p.hbm[r] - avail[r] > over then top, over = r, p.hbm[r] - avail[r] end
    end
    if top == 0 then break end
    local bi, bu, br
    for i = 1, n do
      local it, c = items[i], choice[i]
      local rs, row = ranks[i], it.SP[c]
      local on = false
      for _, r in ipairs(rs) do on = on or r == top end
      if on then
        for u = 1, #it.H do
          if u ~= c and it.FAM[u] == it.FAM[c] and it.T[u] >= it.T[c]
             and (not env.host or host - it.X[c] + it.X[u] <= env.host)
             and (not widths or it.CW[u] == 0 or it.CW[u] == it.CW[c]) then
            -- the bytes freed on each of its ranks: none may take more
            local freed, ok = 0, true
            for _, r in ipairs(rs) do
              local f = it.SH[c] - it.SH[u] - held(p.cc, p.sn, row and 0 or r, it.CA[u] - it.CA[c], it.SC[u] - it.SC[c])
              if f < 0 then ok = false end
              if r == top then freed = f end
            end
            if ok and freed > 0 then
              local ratio = (it.T[u] - it.T[c]) / freed
              if not br or ratio < br then bi, bu, br = i, u, ratio end
            end
          end
        end
      end
    end
    if not bi then return nil end
    add(bi, -1)
    host = host - items[bi].X[choice[bi]] + items[bi].X[bu]
    choice[bi] = bu
    add(bi, 1)
  end
  local c2, p2 = fill_best(items, choice, p, env)
  return { choice = c2, part = p2, cost = max_load(p2) }
end

-- A binary heap, least first by less(a, b) (h.less).
local function heap_down(h, k)
  local less, n = h.less, #h
  while true do
    local l, r, s = 2 * k, 2 * k + 1, k
    if l <= n and less(h[l], h[s]) then s = l end
    if r <= n and less(h[r], h[s]) then s = r end
    if s == k then return end
    h[s], h[k] = h[k], h[s]
    k = s
  end
end
local function heap_push(h, x)
  h[#h + 1] = x
  local less, k = h.less, #h
  while k > 1 do
    local p = math.floor(k / 2)
    if not less(h[k], h[p]) then break end
    h[p], h[k] = h[k], h[p]
    k = p
  end
end
local function heap_pop(h)
  local top = h[1]
  if not top then return nil end
  h[1] = h[#h]
  h[#h] = nil
  heap_down(h, 1)
  return top
end

-- The entries of xs (taken over) in the order less(a, b) gives, drawn as they are read:
-- list:at(k) (nil past list.n), list:entries() (every one, in no order).  A heap built in O(n) and
-- popped one entry at a time: the single changes read the first few of a plan's thousands before
-- one improves or the threshold stops them, and sorting all of them each time (table.sort, its
-- comparisons called back from C) was a tenth of the CPU of 1000 tables on 8 ranks.
local Ordered = {}
Ordered.__index = Ordered
local function ordered(xs, less)
  xs.less = less
  for k = math.floor(#xs / 2), 1, -1 do heap_down(xs, k) end
  return setmetatable({ n = #xs, heap = xs, out = {} }, Ordered)
end
function Ordered:at(k)
  local out = self.out
  while #out < k and self.heap[1] do out[#out + 1] = heap_pop(self.heap) end
  return out[k]
end
function Ordered:entries()
  local all = {}
  for k, x in ipairs(self.out) do all[k] = x end
  for _, x in ipairs(self.heap) do all[#all + 1] = x end
  return all
end

-- The option of item `it` below index c with the most HBM that frees at least `need` bytes
-- (the fastest such: frontiers get faster as they grow), or nil.
local function finishing(it, c, need)
  local H = it.H
  local lim = H[c] - need
  if H[1] > lim then return nil end
  local lo, hi = 1, c - 1
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if H[mid] <= lim then lo = mid else hi = mid - 1 end
  end
  return lo
end

-- The downgrade of item i from option c adding the least time per byte freed: v, ratio.  Without
-- a bound on host memory it depends on (i, c) alone and is kept (it.RV, it.RR): every repair
-- looked again at every table's, twice a proposal.
-- With `uncached` (a table repair took off a cache of a width its rank could not hold), the
-- choices without a cache only, not kept.
local function ratio_move(it, c, host, host_limit, uncached)
  local keep = not host_limit and not uncached
  if keep and it.RV[c] ~= nil then return it.RV[c] or nil, it.RR[c] end
  local H, T, X = it.H, it.T, it.X
  local bv, br
  for v = 1, c - 1 do
    if (not host_limit or host - X[c] + X[v] <= host_limit) and not (uncached and it.CW[v] ~= 0) then
      local ratio = (T[v] - T[c]) / max(H[c] - H[v], 1e-9)
      if not br or ratio < br then bv, br = v, ratio end
    end
  end
  if keep then it.RV[c], it.RR[c] = bv or false, br end
  return bv, br
end

-- A choice without a cache for item `it`, cached at c: the fastest that holds no more HBM, else
-- the smallest (the repair then frees what it lacks); nil where every choice is cached.
local function uncached_move(it, c, host, host_limit)
  local H, T, X, CW = it.H, it.T, it.X, it.CW
  local bv, sv
  for v = 1, #H do
    if CW[v] == 0 and (not host_limit or host - X[c] + X[v] <= host_limit) then
      if H[v] <= H[c] and (not bv or T[v] < T[bv]) then bv = v end
      if not sv or H[v] < H[sv] then sv = v end
    end
  end
  return bv or sv
end

-- Downgrades until the choice fits (aggregate HBM, host memory, then the partition): each time
-- the move, among tables not locked, that adds the least time per byte it frees; with `finish`,
-- once single moves can free all that is still needed, the cheapest of them, unless the best
-- move by ratio followed by the cheapest finishing move costs less.  Returns the partition, or
-- nil when no move is left.
local function repair(items, choice, env, locked, total_avail, finish)
  local agg, host = 0, 0
  local n = #items
  for i, it in ipairs(items) do
    agg, host = agg + it.H[choice[i]], host + it.X[choice[i]]
  end
  local widths = items.widths and not env.any_width
  local mv, mr = {}, {} -- each item's best move by ratio, kept while its choice stays
  local uncached = {} -- the tables taken off a cache of a width their rank could not hold
  local function refresh(i)
    if locked[i] then mv[i], mr[i] = nil, nil return end
    mv[i], mr[i] = ratio_move(items[i], choice[i], host, env.host, uncached[i])
  end
  -- A shard found only caches of other widths (cache_widths): its table goes to a choice
  -- without a cache; where it is locked (the change proposed), the tables caching the other
  -- width on that rank do, all at once.  {{i, v}, ...}, or nil where a table to move is locked
  -- or cached in every choice.
  local function width_moves(err)
    local i = err.item
    local v = not locked[i] and uncached_move(items[i], choice[i], host, env.host)
    if v then return { { i, v } } end
    local w = items[err.other].CW[choice[err.other]]
    local moves = {}
    for j = 1, n do
      local it, c, rs = items[j], choice[j], err.ranks[j]
      local here = false
      if rs and it.CW[c] == w and (it.SP[c] and true or false) == (err.row_wise or false) then
        for k = 1, #rs do here = here or err.row_wise or rs[k] == err.rank end
      end
      if here then
        v = not locked[j] and uncached_move(it, c, host, env.host)
        if not v then return nil end
        moves[#moves + 1] = { j, v }
      end
    end
    return moves
  end
  for i = 1, n do refresh(i) end
  local failed -- the last partition's failure, while every move since leaves it as it was
  for step = 1, 8 * n + 8 do
    local part, err
    if agg <= total_avail * (1 + 1e-12) and (not env.host or host <= env.host) then
      if failed then
        err = failed
      else
        part, err = best_partition(items, choice, env)
        if part then return part, step - 1 end
        failed = err.at and err.at_hbm and err or nil
      end
    end
    local need = max(agg - total_avail, err and err.need or 0)
    local only = err and err.item -- a shard found no room: move that table first
    if only and (locked[only] or not mv[only]) then only = nil end
    -- a cached table whose next downgrade would take it off its cache (its smallest cache does
    -- not fit the ranks of its width) is not moved first: the room may come from others there
    -- (seed 3353: T4 went managed where T1, pinned beside it at the same width, had a smaller
    -- cache to give, 2.604 ms against 1.626)
    if only and widths and items[only].CW[choice[only]] ~= 0 and items[only].CW[mv[only]] == 0 then only = nil end
    local bi, bv
    if err and err.width then
      local moves = width_moves(err)
      if not moves or #moves == 0 then return nil end
      for k = 1, #moves - 1 do
        local i, v = moves[k][1], moves[k][2]
        if failed and not M.fails_again(items[i], choice[i], v, failed) then failed = nil end
        agg, host = agg - items[i].H[choice[i]] + items[i].H[v], host - items[i].X[choice[i]] + items[i].X[v]
        choice[i], uncached[i] = v, true
        refresh(i)
      end
      -- the last as a move of its own, below
      bi, bv = moves[#moves][1], moves[#moves][2]
      uncached[bi] = true
    elseif only then
      bi, bv = only, mv[only]
    else
      local br
      for i = 1, n do
        if mv[i] and (not br or mr[i] < br) then bi, bv, br = i, mv[i], mr[i] end
      end
      if finish and bi and not env.host then
        local fi, fv, ft
        for i = 1, n do
          if not locked[i] then
            local it = items[i]
            local v = finishing(it, choice[i], need)
            if v and (not ft or it.T[v] - it.T[choice[i]] < ft) then fi, fv, ft = i, v, it.T[v] - it.T[choice[i]] end
          end
        end
        if fi and not (fi == bi and fv == bv) then
          local it = items[bi]
          local rest = need - (it.H[choice[bi]] - it.H[bv])
          local ft2
          for i = 1, n do
            if i ~= bi and not locked[i] then
              local v = finishing(items[i], choice[i], rest)
              if v then
                local dt = items[i].T[v] - items[i].T[choice[i]]
                if not ft2 or dt < ft2 then ft2 = dt end
              end
            end
          end
          if not (ft2 and (it.T[bv] - it.T[choice[bi]]) + ft2 < ft) then bi, bv = fi, fv end
        end
      end
    end
    if not bi then return nil end
    local it = items[bi]
    if failed and not M.fails_again(it, choice[bi], bv, failed) then failed = nil end
    agg, host = agg - it.H[choice[bi]] + it.H[bv], host - it.X[choice[bi]] + it.X[bv]
    choice[bi] = bv
    if env.host then
      for i = 1, n do refresh(i) end
    else
      refresh(bi)
    end
  end
  return nil
end

-- Returns the best plan {choice, part, cost} (cost: the slowest rank's seconds) or nil, info
-- (no proposal fit: {need} the HBM the last one lacked), and the search's statistics
-- {proposals, rated, feasible_at, best_at, stopped_early}.
--
-- Proposals: first the descent along the lower convex hulls (least time added per byte freed)
-- until the ranks fit, filled with upgrades into the room left.  Then, from the best plan, one
-- proposal per upgrade (table i to a faster option u), largest time saved first: i is set to u
-- and locked, the others are downgraded until the ranks fit again, and the room left is filled.
-- A proposal that beats the best becomes it, and the upgrades are listed again from there.
function M.greedy(items, env, opts)
  opts = opts or {}
  prep(items)
  local threshold = opts.threshold
  if threshold == nil then threshold = 10 end
  -- a proposal improves when it beats the best by more than this share (the model is not
  -- finer than that: chasing smaller gains only makes the search longer)
  local tol = opts.tolerance or 5e-3
  local n = #items
  local hulls, hpos, choice = {}, {}, {}
  local agg, total_avail = 0, 0
  for r = 1, env.world do total_avail = total_avail + env.avail[r] end
  local heap = { less = function(a, b) return a[1] < b[1] end } -- moves {slope, item}
  local function push(i)
    local h, p = hulls[i], hpos[i]
    if p > 1 then
      local a, b = items[i].options[h[p - 1]], items[i].options[h[p]]
      heap_push(heap, { (a.time - b.time) / max(b.hbm - a.hbm, 1e-9), i })
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
  local stats = { proposals = 0, rated = 0, stopped_early = false, descent = 0 }
  local best, lack
  -- the descent: every step a proposal, rated once the ranks fit
  while true do
    stats.proposals = stats.proposals + 1
    stats.descent = stats.descent + 1
    local part, err
    if agg <= total_avail * (1 + 1e-12) and (not env.host or host <= env.host) then
      part, err = best_partition(items, choice, env)
    else
      err = { need = agg - total_avail }
    end
    if err and err.width then
      -- a cache of another width in the way (cache_widths): the repair takes the table off a
      -- cache (going on down the hulls would take every table of that width off one first)
      local ch = copy(choice)
      local p2 = repair(items, ch, env, {}, total_avail, false)
      if p2 then choice, part = ch, p2 end
    end
    if part then
      stats.rated = stats.rated + 1
      stats.feasible_at = stats.proposals
      local c2, p2 = fill_best(items, choice, part, env)
      best = { choice = c2, part = p2, cost = max_load(p2) }
      stats.best_at = stats.proposals
      break
    end
    lack = err
    local moved = false
    while not moved do
      local move = heap_pop(heap)
      if not move then break end
      local i = move[2]
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
  -- Local search from the first plan that fits: changes of one table at a time (to any of its
  -- options), each repaired and filled around the changed table; a change that beats the best
  -- becomes it and the changes are listed again.  Order: upgrades (most time saved first) and
  -- downgrades (least time lost first) alternately; with several ranks a second run takes the
  -- tables on the slowest rank first (only they make that rank faster), and the better run wins.
  -- Then, with several ranks, pairs of changes (see pair_phase below).
  local W = env.world

  -- The plan of cur.choice with `changes` ({i, u}, ...) applied and locked, the rest repaired
  -- two ways (least time per byte freed; or, once one move can free all that is still needed,
  -- the cheapest such move), each filled: the faster, or nil when neither can be repaired.
  -- What a change can never fit: a shard larger than any rank's room for it (the frontier keeps
  -- such a choice while another of the table's fits: a table_wise device table larger than a
  -- GPU), or, with every other table at its smallest, more HBM than the ranks have or more host
  -- memory than given.  Such a proposal was repaired all the same, through every table's
  -- downgrades with a partition after each, to fail: at the greedy's favourite first (most time
  -- saved), and not counted against the threshold, they were 60% of the CPU of 1000 tables on 8
  -- ranks at a tenth of the way from the least budget (4 failed repairs, 2.7 of 4.5 s).
  local max_room, min_room, min_h, min_x = 0, huge, 0, 0
  local least_h, least_x = {}, {}
  for r = 1, W do max_room, min_room = max(max_room, env.avail[r]), min(min_room, env.avail[r]) end
  for i, it in ipairs(items) do
    local h, x = huge, huge
    for v = 1, #it.H do h, x = min(h, it.H[v]), min(x, it.X[v]) end
    least_h[i], least_x[i], min_h, min_x = h, x, min_h + h, min_x + x
  end
  local function hopeless(changes)
    local h, x = min_h, min_x
    for _, cd in ipairs(changes) do
      local i, u = cd[1], cd[2]
      local it = items[i]
      local room = it.rank and env.avail[it.rank] or it.SP[u] and min_room or max_room
      if it.SH[u] > room then return true end
      h, x = h - least_h[i] + it.H[u], x - least_x[i] + it.X[u]
    end
    return h > total_avail * (1 + 1e-9) or (env.host and x > env.host * (1 + 1e-9))
  end

  local function propose(cur, changes)
    if hopeless(changes) then return nil end
    stats.proposals = stats.proposals + 1
    local lock = {}
    for _, cd in ipairs(changes) do lock[cd[1]] = true end
    local c2, p2, cost
    for _, finish in ipairs({ false, true }) do
      local ch = copy(cur.choice)
      for _, cd in ipairs(changes) do ch[cd[1]] = cd[2] end
      local part, moves = repair(items, ch, env, lock, total_avail, finish)
      if part then
        local c3, p3 = fill_best(items, ch, part, env, lock)
        local k = max_load(p3)
        if not cost or k < cost then c2, p2, cost = c3, p3, k end
      end
      if moves == 0 then break end -- nothing to repair: both ways are the same
    end
    if not cost then return nil end
    stats.rated = stats.rated + 1
    return { choice = c2, part = p2, cost = cost, at = stats.proposals }
  end

  -- plans to start from beside the descent's: opts.start (planner.plan's, searched with no share
  -- held, over its budget once they are) partitioned afresh and repaired, and made to fit on its
  -- own ranks (shrink)
  local starts = { best }
  if opts.start then
    starts[#starts + 1] = propose({ choice = opts.start.choice }, {})
    starts[#starts + 1] = shrink(items, opts.start.choice, opts.start.part.ranks, env)
  end
  if #starts == 0 then return nil, lack or {}, stats end

  -- Every single change from cur: upgrades (faster options) and downgrades, each {i, u, key},
  -- as two Ordered lists (list:at(k), list.n, list:entries()) in the order of `mode`: "gain"
  -- (time saved, time lost), "hot" (the slowest rank's tables first), "hot_est" (as hot, each
  -- net of its bytes at the cheapest byte to free or the most useful byte to take).
  local function changes_of(cur, mode)
    local slowest_first, estimate = mode == "hot" or mode == "hot_est", mode == "hot_est"
    local hot = {}
    if slowest_first then
      local top = 1
      for r = 2, W do if cur.part.load[r] > cur.part.load[top] then top = r end end
      for i = 1, n do
        for _, r in ipairs(cur.part.ranks[i]) do if r == top then hot[i] = true end end
      end
    end
    local ups, downs = {}, {}
    local lambda, mu = huge, 0 -- the cheapest byte to free, the most useful byte to take
    if estimate then
      for i, it in ipairs(items) do
        local o = it.options[cur.choice[i]]
        for u = 1, #it.options do
          local ou = it.options[u]
          local dh = ou.hbm - o.hbm
          if dh > 0 and ou.time < o.time then mu = max(mu, (o.time - ou.time) / dh)
          elseif dh < 0 and ou.time > o.time then lambda = min(lambda, (ou.time - o.time) / -dh) end
        end
      end
      if lambda == huge then lambda = 0 end
    end
    for i, it in ipairs(items) do
      local o = it.options[cur.choice[i]]
      for u = 1, #it.options do
        local ou = it.options[u]
        local dh = ou.hbm - o.hbm
        if ou.time < o.time then
          ups[#ups + 1] = { i, u, o.time - ou.time - (estimate and lambda * max(dh, 0) or 0) }
        elseif u ~= cur.choice[i] then
          downs[#downs + 1] = { i, u, ou.time - o.time - (estimate and mu * max(-dh, 0) or 0) }
        end
      end
    end
    local function order(a, b, up)
      local ha, hb = hot[a[1]] and 1 or 0, hot[b[1]] and 1 or 0
      if ha ~= hb then return ha > hb end
      if a[3] ~= b[3] then
        if up then return a[3] > b[3] end
        return a[3] < b[3]
      end
      if a[1] ~= b[1] then return a[1] < b[1] end
      return a[2] < b[2]
    end
    return ordered(ups, function(a, b) return order(a, b, true) end),
           ordered(downs, function(a, b) return order(a, b, false) end)
  end

  -- Single changes until none of them (or none of `threshold` in a row) beats cur.
  local function singles(cur, mode)
    local nonimp = 0
    while true do
      local ups, downs = changes_of(cur, mode)
      local improved = false
      for k = 1, 2 * max(ups.n, downs.n) do
        local cd = (k % 2 == 1 and ups or downs):at(math.floor((k + 1) / 2))
        local c = cd and propose(cur, { cd })
        if c then
          if c.cost < cur.cost * (1 - tol) then
            cur, nonimp, improved = c, 0, true
            break
          end
          -- only proposals that fit count: one that cannot be repaired says nothing of the best
          nonimp = nonimp + 1
          if threshold and threshold > 0 and nonimp >= threshold then return cur, true end
        end
      end
      if not improved then return cur, false end
    end
  end

  -- Pairs: two tables' changes at once (any two of the listed upgrades and downgrades: an
  -- upgrade paid for by a downgrade, or two of a kind), both locked, the rest repaired and
  -- filled.  A rank's balance often needs two changes at once that neither makes alone (one
  -- table spread over the ranks and another put on one; a table on the lighter rank made
  -- smaller so that one of the slowest rank's fits there): the single changes stop at such
  -- plans.  The first PAIRS upgrades and downgrades (slowest rank's tables first) make up to
  -- PAIRS^2 pairs, each rated in O(1) by a bound on the step a partition of its choice can
  -- reach: the larger of the ranks' mean load and the spread shards' load plus the longest
  -- single-rank shard, plus the HBM it lacks over all ranks at the cheapest byte's time.  The
  -- best by that bound are rated again by the partitioner itself (longest first, without
  -- repair: as many as cost about as much as PAIR_WORK tables partitioned), and tried in that
  -- order, at most PAIR_TRIES of them; the threshold counts afresh here.  Returns the first
  -- pair's plan that beats cur, or nil.
  local function pair_phase(cur)
    local ups, downs = changes_of(cur, "hot")
    downs = downs:entries() -- sorted below, by the time each byte freed costs
    local C = cur.choice
    -- the downgrades that pay: the other ranks' tables first, least time lost per byte freed
    local top_rank = 1
    for r = 2, W do if cur.part.load[r] > cur.part.load[top_rank] then top_rank = r end end
    local hot = {}
    for i = 1, n do
      for _, r in ipairs(cur.part.ranks[i]) do if r == top_rank then hot[i] = true end end
    end
    for _, d in ipairs(downs) do
      local it = items[d[1]]
      local freed = it.H[C[d[1]]] - it.H[d[2]]
      d.per_byte = freed > 0 and (it.T[d[2]] - it.T[C[d[1]]]) / freed or huge
    end
    table.sort(downs, function(a, b)
      local ha, hb = hot[a[1]] and 1 or 0, hot[b[1]] and 1 or 0
      if ha ~= hb then return ha < hb end
      if a.per_byte ~= b.per_byte then return a.per_byte < b.per_byte end
      if a[1] ~= b[1] then return a[1] < b[1] end
      return a[2] < b[2]
    end)
    local lam = huge -- the cheapest byte to free now: what a repair is likely to add per byte
    for i, it in ipairs(items) do
      local c = C[i]
      local H, T = it.H, it.T
      for v = 1, #H do
        if H[v] < H[c] then lam = min(lam, max(T[v] - T[c], 0) / (H[c] - H[v])) end
      end
    end
    if lam == huge then lam = 0 end
    local function count(it, c) return it.SP[c] and W or it.SK[c] end
    local sum, spread_load, agg0 = 0, 0, 0
    local top = { { 0 }, { 0 }, { 0 } } -- the three longest single-rank shards {time, item}
    for i, it in ipairs(items) do
      local c = C[i]
      sum, agg0 = sum + count(it, c) * it.ST[c], agg0 + it.H[c]
      if it.SP[c] then
        spread_load = spread_load + it.ST[c]
      elseif it.ST[c] > top[3][1] then
        top[3] = { it.ST[c], i }
        table.sort(top, function(x, y) return x[1] > y[1] end)
      end
    end
    local function longest(ia, ib)
      for k = 1, 3 do
        local j = top[k][2]
        if j ~= ia and j ~= ib then return top[k][1] end
      end
      return 0
    end
    local list = {}
    for k = 1, min(ups.n, PAIRS) do list[#list + 1] = ups:at(k) end
    for k = 1, min(#downs, PAIRS) do list[#list + 1] = downs[k] end
    local cands = {}
    for a = 1, #list do
      for b = a + 1, #list do
        local ua, db = list[a], list[b]
        local ia, ib = ua[1], db[1]
        if ia ~= ib then
          local A, B = items[ia], items[ib]
          local ca, cb, u, v = C[ia], C[ib], ua[2], db[2]
          local s2 = sum - count(A, ca) * A.ST[ca] + count(A, u) * A.ST[u] - count(B, cb) * B.ST[cb]
                     + count(B, v) * B.ST[v]
          local sp = spread_load - (A.SP[ca] and A.ST[ca] or 0) + (A.SP[u] and A.ST[u] or 0)
                     - (B.SP[cb] and B.ST[cb] or 0) + (B.SP[v] and B.ST[v] or 0)
          local one = max(longest(ia, ib), A.SP[u] and 0 or A.ST[u], B.SP[v] and 0 or B.ST[v])
          local agg2 = agg0 - A.H[ca] + A.H[u] - B.H[cb] + B.H[v]
          local bound = max(s2 / W, sp + one) + lam * max(agg2 - total_avail, 0)
          cands[#cands + 1] = { ua, db, bound, s2, #cands, est = huge }
        end
      end
    end
    local function by(key)
      return function(x, y)
        if x[key] ~= y[key] then return x[key] < y[key] end
        if x[3] ~= y[3] then return x[3] < y[3] end
        if x[4] ~= y[4] then return x[4] < y[4] end
        return x[5] < y[5]
      end
    end
    table.sort(cands, by(3))
    -- (the caches' widths aside: a rough rating, and the repair moves a table off a cache)
    local unbounded = { world = W, avail = {}, any_width = true }
    for r = 1, W do unbounded.avail[r] = huge end
    for k = 1, min(#cands, max(8, math.floor(PAIR_WORK / n))) do
      local cd = cands[k]
      local ch = copy(C)
      ch[cd[1][1]], ch[cd[2][1]] = cd[1][2], cd[2][2]
      local part, err = M.partition(items, ch, env, false)
      if part then
        local _, filled = fill(items, ch, part, env, { [cd[1][1]] = true, [cd[2][1]] = true }, false)
        cd.est = max_load(filled)
      else
        local ia, ib = cd[1][1], cd[2][1]
        local agg2 = agg0 - items[ia].H[C[ia]] + items[ia].H[cd[1][2]] - items[ib].H[C[ib]] + items[ib].H[cd[2][2]]
        cd.est = max_load(M.partition(items, ch, unbounded, false)) + lam * max(err.need, agg2 - total_avail)
      end
    end
    table.sort(cands, by("est"))
    local nonimp = 0
    local total = 0
    for r = 1, W do total = total + cur.part.load[r] end
    -- failing a faster plan, the tried plan no slower whose ranks together work least, if it
    -- cuts their total by the tolerance: its room lets the single changes balance the ranks
    -- (no cycle: such a step cuts the total, and no step makes the slowest rank slower)
    local side, side_total = nil, total * (1 - tol)
    for k = 1, min(#cands, PAIR_TRIES) do
      local c = propose(cur, { cands[k][1], cands[k][2] })
      if c then
        if c.cost < cur.cost * (1 - tol) then return c, false end
        local t2 = 0
        for r = 1, W do t2 = t2 + c.part.load[r] end
        if c.cost <= cur.cost and t2 < side_total then side, side_total = c, t2 end
        nonimp = nonimp + 1
        if threshold and threshold > 0 and nonimp >= threshold then return side, true end
      end
    end
    return side, false
  end

  local modes = W > 1 and { "gain", "hot", "hot_est" } or { "gain" }
  local function local_search(start)
    local top
    for k, mode in ipairs(modes) do
      local b, sb = singles(start, mode)
      if k == 1 or b.cost < top.cost * (1 - 1e-9) then top = b end
      stats.stopped_early = stats.stopped_early or sb
    end
    if W > 1 then
      while true do
        local b, sb = pair_phase(top)
        stats.stopped_early = stats.stopped_early or sb
        if not b then break end
        top, sb = singles(b, "hot")
        stats.stopped_early = stats.stopped_early or sb
      end
    end
    -- the last upgrades kept their tables' ranks: the moves and swaps once more over the final
    -- choice (never slower: they only take what makes the slowest rank faster)
    if W > 1 and top.part then
      improve(items, top.choice, env, top.part)
      top.cost = max_load(top.part)
    end
    return top
  end
  -- from each first plan (the descent's, and opts.start's two), the fastest end (the first of
  -- equals): which start ends fastest differs (planner_fuzz's seed 24418 from shrink's, the 200
  -- tables on 8 ranks of spec/fixtures/planner_greedy_200.txt from the repaired one)
  local won
  for _, start in ipairs(starts) do
    local b = local_search(start)
    if not won or b.cost < won.cost * (1 - 1e-9) then won = b end
  end
  if won.at then stats.best_at = won.at end
  return won, nil, stats
end

-- On one rank every cached table is in the one cache, of one row width (cache_widths), so the
-- best plan is the best over the widths w of the plans whose tables take their choices without
-- a cache or their cached ones of width w: the greedy runs once a width on those choices (their
-- frontier; a table whose choices are all cached at another width bars w) and the fastest plan
-- is kept, its choices as indices of items' options.  Given every width at once, the greedy's
-- cache took the width of the first table the partition placed and its repair moved the others
-- off it: 200 tables of four dims on 1 rank in 2 GiB planned 0.971 ms, and 0.967 ms with the
-- early stop off (search_spec), where caching dim 128 alone plans 0.961 ms (wip/planner-one-width).
-- Its statistics are the winning run's, with widths (the runs) and proposals_all (their
-- proposals summed).  On several ranks, or with one width: M.greedy.
function M.greedy_widths(items, env, opts)
  prep(items)
  if env.world ~= 1 or not items.widths or env.any_width then return M.greedy(items, env, opts) end
  local best, info, stats, all, runs = nil, nil, nil, 0, 0
  for w = 1, #items.width_names do
    local sub, idx = {}, {}
    for i, it in ipairs(items) do
      local keep, at = {}, {}
      for v, o in ipairs(it.options) do
        if it.CW[v] == 0 or it.CW[v] == w then keep[#keep + 1], at[o] = o, v end
      end
      if #keep == 0 then sub = nil break end
      local ops = M.frontier(keep)
      idx[i] = {}
      for v, o in ipairs(ops) do idx[i][v] = at[o] end
      sub[i] = { name = it.name, options = ops, table = it.table, rank = it.rank }
    end
    if sub then
      local b, inf, st = M.greedy(sub, env, opts)
      runs, all = runs + 1, all + st.proposals
      if b and (not best or b.cost < best.cost) then
        for i = 1, #items do b.choice[i] = idx[i][b.choice[i]] end
        best, stats = b, st
      elseif not best and not stats then
        info, stats = inf, st
      end
    end
  end
  if not stats then return M.greedy(items, env, opts) end
  stats.widths, stats.proposals_all = runs, all
  if best then return best, nil, stats end
  return nil, info, stats
end

-- ---- exhaustive ----

-- Every option of every table and every rank assignment (movable shards on any rank, spread
-- ones on all, pinned ones on theirs), by depth-first search with bounds: exact.  A branch is
-- cut when the step it can reach is no faster than the best plan so far (`bound`, the greedy's,
-- when given: it is returned when nothing beats it), by the larger of its slowest rank, the
-- ranks' mean work with every table left at its least, and the least loaded rank plus the
-- longest of the least shards left; or when the tables left do not fit the HBM or the host
-- memory left at their smallest.  Ranks alike (the same load, HBM and room, no table pinned to
-- them) are tried once: the plans on the others are the same plan with the ranks renamed.
-- A rank's HBM counts the shares it holds once it caches (held): a shard placed never makes them
-- fewer, so a rank over its room stays over below it.
-- Before the cuts it visited every assignment below the first plan found, the ranks'
-- permutations included: 26 tables on 2 ranks ran for minutes.  With max_nodes, it gives up
-- past that many nodes: nil, {visited, stopped = true} (no optimum proven).
function M.exhaustive(items, env, bound, max_nodes)
  prep(items)
  local W, avail = env.world, env.avail
  local n = #items
  local order = {}
  for i = 1, n do order[i] = i end
  local function biggest(i) return items[i].options[#items[i].options].hbm end
  table.sort(order, function(a, b) return biggest(a) > biggest(b) end)
  -- per table, its least work over all ranks, shard time, HBM and host bytes; summed over the
  -- tables from depth d on
  local rest_t, rest_h, rest_x, rest_st = {}, {}, {}, {}
  rest_t[n + 1], rest_h[n + 1], rest_x[n + 1], rest_st[n + 1] = 0, 0, 0, 0
  for d = n, 1, -1 do
    local it = items[order[d]]
    local t, h, x, st = huge, huge, huge, huge
    for v = 1, #it.options do
      local k = it.SP[v] and W or it.SK[v]
      t, h, x, st = min(t, k * it.ST[v]), min(h, k * it.SH[v]), min(x, it.X[v]), min(st, it.ST[v])
    end
    rest_t[d], rest_h[d], rest_x[d] = rest_t[d + 1] + t, rest_h[d + 1] + h, rest_x[d + 1] + x
    rest_st[d] = max(rest_st[d + 1], st)
  end
  local total_avail = 0
  for r = 1, W do total_avail = total_avail + avail[r] end
  -- ranks a pinned table or a column shard names are told apart from the others
  local named = {}
  for _, i in ipairs(items.pinned) do named[items[i].rank] = true end
  for i, it in ipairs(items) do
    for v = 1, #it.options do
      if not it.SP[v] and it.SK[v] > 1 then
        for _, r in ipairs(column_ranks(i, it.SK[v], W)) do named[r] = true end
      end
    end
  end
  local load, hbm = {}, {}
  for r = 1, W do load[r], hbm[r] = 0, 0 end
  -- one width a cache (cache_widths): each rank's (index 0: the row-wise shards') and its shards
  local widths = items.widths
  local cw, cn = {}, {}
  for r = 0, W do cw[r], cn[r] = 0, 0 end
  -- the caches' shares (held)
  local cc, sn = {}, {}
  for r = 0, W do cc[r], sn[r] = 0, 0 end
  local NO_RANKS, ROW_CACHE = {}, { 0 }
  local choice, ranks = {}, {}
  -- above the bound by a hair: the plan returned is the first optimum in the search's order, as
  -- without the bound (the greedy's own plan, and any as fast, are found again)
  local best, best_choice, best_ranks = huge, nil, nil
  if bound then best = bound.cost * (1 + 1e-9) end
  local host, work, used = 0, 0, 0
  local visited = 0
  local singles, cols = {}, {}
  for r = 1, W do singles[r] = { r } end
  for i, it in ipairs(items) do
    for v = 1, #it.options do
      if not it.SP[v] and it.SK[v] > 1 then cols[i] = column_ranks(i, it.SK[v], W) end
    end
  end
  local all = {}
  for r = 1, W do all[r] = r end
  -- whether rank set rs takes a rank while leaving a lower one alike to it
  local function renamed(rs)
    local inset = {}
    for _, r in ipairs(rs) do inset[r] = true end
    for _, r in ipairs(rs) do
      if not named[r] then
        for q = 1, r - 1 do
          if not inset[q] and not named[q] and load[q] == load[r] and hbm[q] == hbm[r] and avail[q] == avail[r]
             and cw[q] == cw[r] and cn[q] == cn[r] and cc[q] == cc[r] and sn[q] == sn[r] then
            return true
          end
        end
      end
    end
    return false
  end
  local saved_load, saved_hbm = {}, {}
  for d = 1, n do saved_load[d], saved_hbm[d] = {}, {} end
  local stopped = false
  local function dfs(d, cur_max)
    visited = visited + 1
    if max_nodes and visited > max_nodes then stopped = true end
    if stopped then return end
    if d > n then
      best, best_choice, best_ranks = cur_max, copy(choice), copy(ranks)
      return
    end
    -- (the sums over ranks are rounded apart from each rank's: a hair of slack)
    if used + rest_h[d] > total_avail * (1 + 1e-12) or (env.host and host + rest_x[d] > env.host) then return end
    local least = huge
    for r = 1, W do least = min(least, load[r]) end
    if max(cur_max, (work + rest_t[d]) / W * (1 - 1e-12), least + rest_st[d]) >= best then return end
    local i = order[d]
    local it = items[i]
    for j, o in ipairs(it.options) do
      if not env.host or host + o.host <= env.host then
        local sh = o.shards[1]
        local sets = it.SP[j] and { all } or it.rank and { { it.rank } } or it.SK[j] > 1 and { cols[i] } or singles
        local count = it.SP[j] and W or it.SK[j]
        local w = widths and it.CW[j] or 0
        local a, s = it.CA[j], it.SC[j]
        -- the collections it joins (held): the row-wise shards' (0), or each of its ranks'
        local row = it.SP[j]
        for _, rs in ipairs(sets) do
          local ok, m = true, cur_max
          for _, r in ipairs(rs) do
            if hbm[r] + sh.hbm + held(cc, sn, row and 0 or r, a, s) > avail[r] then ok = false break end
            m = max(m, load[r] + sh.time)
          end
          -- the caches it joins: the row-wise shards' (0), or each of its ranks'
          local at = w == 0 and NO_RANKS or it.SP[j] and ROW_CACHE or rs
          for _, r in ipairs(at) do ok = ok and takes(cw, cn, r, w) end
          if ok and m < best and not (#rs < W and renamed(rs)) then
            -- the sums are put back as they were, not subtracted (the rounding would drift)
            local sl, sv = saved_load[d], saved_hbm[d]
            local ex = 0
            for k, r in ipairs(rs) do
              local e = held(cc, sn, row and 0 or r, a, s)
              sl[k], sv[k] = load[r], hbm[r]
              load[r], hbm[r] = load[r] + sh.time, hbm[r] + sh.hbm + e
              ex = ex + e
            end
            local cs = row and ROW_CACHE or rs
            for _, r in ipairs(cs) do cc[r], sn[r] = cc[r] + a, sn[r] + s end
            local h0, w0, u0 = host, work, used
            host, work, used = host + o.host, work + count * sh.time, used + count * sh.hbm + ex
            choice[i], ranks[i] = j, rs
            for _, r in ipairs(at) do
              cw[r], cn[r] = w, cn[r] + 1
            end
            dfs(d + 1, m)
            for _, r in ipairs(at) do
              cn[r] = cn[r] - 1
              if cn[r] == 0 then cw[r] = 0 end
            end
            host, work, used = h0, w0, u0
            for _, r in ipairs(cs) do cc[r], sn[r] = cc[r] - a, sn[r] - s end
            for k, r in ipairs(rs) do load[r], hbm[r] = sl[k], sv[k] end
          end
        end
      end
    end
  end
  dfs(1, 0)
  if stopped then return nil, { visited = visited, stopped = true } end
  if not best_choice then
    if bound then return bound, { visited = visited } end
    return nil, { visited = visited }
  end
  local part = { load = {}, hbm = {}, ranks = best_ranks }
  for r = 0, W do cc[r], sn[r] = 0, 0 end
  for r = 1, W do part.load[r], part.hbm[r] = 0, 0 end
  for i = 1, n do
    local it, v = items[i], best_choice[i]
    local sh = it.options[v].shards[1]
    for _, r in ipairs(best_ranks[i]) do
      part.load[r], part.hbm[r] = part.load[r] + sh.time, part.hbm[r] + sh.hbm
    end
    for _, r in ipairs(it.SP[v] and ROW_CACHE or best_ranks[i]) do cc[r], sn[r] = cc[r] + it.CA[v], sn[r] + it.SC[v] end
  end
  -- the shares its ranks hold (held)
  for r = 1, W do part.hbm[r] = part.hbm[r] + (cc[0] > 0 and sn[0] or 0) + (cc[r] > 0 and sn[r] or 0) end
  return { choice = best_choice, part = part, cost = best }, { visited = visited }
end

return M
