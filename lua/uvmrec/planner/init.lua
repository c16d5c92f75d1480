-- uvmrec.planner: where each embedding table lives (device, managed with a hot prefix, cached
-- with a load factor, host), how it is sharded over ranks and on which ones, chosen from
-- measured costs (a calibration) and the tables' access profiles, within an HBM budget.
--
--   local planner = require "uvmrec.planner"
--   local plan = assert(planner.plan(tables, profiles, "16GiB", {
--     world = 1, batch = 65536, calibration = "h200", dense = {...}, loader = {values = 40},
--     hints_every = 100 }))
--   print(plan:table())                       -- one row per table, totals per rank, step time
--   assert(plan:save("plan.json"))            -- JSON; planner.load(path) reads it back
--   local p2 = plan:with("C3", { placement = "device" })   -- an edited plan, re-predicted
--   print(plan:compare(p2))
--
-- tables: { {name, rows, dim, dtype, optimizer, hot, fixed = {placement, sharding,
-- load_factor, prefix_fraction, rank (0-based: a table_wise table's)}}, ... }; profiles:
-- {[name] = uvmrec.planner.profile};
-- budget: HBM per rank (bytes or "16GiB").  docs/planner.md has the model and an example.
local cost = require "uvmrec.planner.cost"
local search = require "uvmrec.planner.search"
local calib = require "uvmrec.planner.calib"
local json = require "uvmrec.json"
local things, shown = require("uvmrec.lib").things, require("uvmrec.lib").shown

local M = {}
M.profile = require "uvmrec.planner.profile"
M.hitrate = require "uvmrec.planner.hitrate"
M.calib, M.cost, M.search = calib, cost, search
M.FORMAT, M.VERSION = "uvmrec-plan", 1

local Plan = {}
Plan.__index = Plan
M.Plan = Plan

-- Bytes from a finite number >= 0 (the planner's sums of bytes are not whole: a budget it
-- names may come back) or a size string, read by uvmrec.lib's one parser of sizes; nil,
-- message otherwise (math.huge made a plan that no file could hold).
function M.bytes(v)
  if type(v) == "number" and v >= 0 and v < math.huge then return v end
  return require("uvmrec.lib").bytes(v)
end

local function fmt_bytes(b)
  local a = math.abs(b)
  if a >= 1024 ^ 4 then return ("%.2f TiB"):format(b / 1024 ^ 4) end
  if a >= 1024 ^ 3 then return ("%.2f GiB"):format(b / 1024 ^ 3) end
  if a >= 1024 ^ 2 then return ("%.1f MiB"):format(b / 1024 ^ 2) end
  if a >= 1024 then return ("%.1f KiB"):format(b / 1024) end
  return ("%d B"):format(b)
end
M.fmt_bytes = fmt_bytes

local function fmt_count(n)
  if n >= 1e9 then return ("%.2fG"):format(n / 1e9) end
  if n >= 1e6 then return ("%.2fM"):format(n / 1e6) end
  if n >= 1e4 then return ("%.1fk"):format(n / 1e3) end
  return ("%d"):format(n)
end

local function fmt_time(s)
  if s >= 1 then return ("%.3f s"):format(s) end
  if s >= 1e-3 then return ("%.3f ms"):format(s * 1e3) end
  return ("%.1f us"):format(s * 1e6)
end
M.fmt_time = fmt_time

-- ---- building ----

local function resolve_calib(c)
  if c == nil then c = "h200" end
  if type(c) == "table" and getmetatable(c) == calib.Calib then return c end
  if type(c) == "table" then return calib.from_table(c) end
  return calib.find(c)
end

-- What a table's fixed settings cannot mean (nil when they can): a key the planner does not read
-- (a misspelt one was dropped and the table planned freely), or a rank outside the world or on a
-- table not table_wise (a rank places a table_wise table, as embeddings.tables.<T>.rank does).
local FIXED = { "placement", "sharding", "load_factor", "prefix_fraction", "rank" }

-- Why `r` is no rank of a plan of `world` ranks (nil when it is one): the one check of a pinned
-- rank, whoever names it (a table's fixed rank, a config's embeddings.tables.<T>.rank, a choice
-- given to plan:with), each message naming the key its user wrote.
local function rank_error(r, world)
  if type(r) == "number" and r >= 0 and r < world and r == math.floor(r) then return nil end
  return ("%s; expected a rank from 0 to %d (the plan is for %s)"):format(
    type(r) == "number" and tostring(r) or ("'%s'"):format(tostring(r)), world - 1, things(world, "rank"))
end

local function fixed_error(t, world)
  local f = t.fixed
  if f == nil then return nil end
  if type(f) ~= "table" then
    return ("table %s: fixed is a %s; expected a table of %s"):format(tostring(t.name), type(f),
      table.concat(FIXED, ", "))
  end
  local ok, err = pcall(require("uvmrec.lib").known_keys, f, FIXED, "table " .. tostring(t.name) .. ": fixed", 1, "key")
  if not ok then return (tostring(err):gsub("^[^\n]-:%d+: ", "")) end
  -- each value as the cost model reads it: a placement or sharding of another spelling had no
  -- choice and no word of the names; a prefix fraction past [0, 1] was clamped unsaid
  local function one_of(v, list)
    for _, x in ipairs(list) do if v == x then return true end end
    return false
  end
  for _, k in ipairs({ { "placement", cost.PLACEMENTS }, { "sharding", cost.SHARDINGS } }) do
    local v = f[k[1]]
    if v ~= nil and not one_of(v, k[2]) then
      return ("table %s: fixed %s %s; expected %s or %s"):format(t.name, k[1], shown(v),
        table.concat(k[2], ", ", 1, #k[2] - 1), k[2][#k[2]])
    end
  end
  local pf, lf = f.prefix_fraction, f.load_factor
  if pf ~= nil and not (type(pf) == "number" and pf >= 0 and pf <= 1) then
    return ("table %s: fixed prefix_fraction %s; expected a number from 0 to 1"):format(t.name, shown(pf))
  end
  if lf ~= nil and not (type(lf) == "number" and lf > 0 and lf <= 1) then
    return ("table %s: fixed load_factor %s; expected a number in (0, 1]"):format(t.name, shown(lf))
  end
  local r = f.rank
  if r == nil then return nil end
  local rerr = rank_error(r, world)
  if rerr then return ("table %s: fixed rank %s"):format(t.name, rerr) end
  if f.sharding and f.sharding ~= "table_wise" then
    return ("table %s: fixed rank %d and sharding %s: a rank places a table_wise table"):format(t.name, r, f.sharding)
  end
end

-- The options M.plan reads (a misspelt one, wrold = 2, planned one rank).
local OPTIONS = { "arena_block", "batch", "calibration", "dense", "depth", "fractions", "gpus", "hints_every",
                  "host_memory", "loader", "max_nodes", "output_bytes", "page_bytes", "pipeline", "policy", "reserve",
                  "search", "sms", "threshold", "world" }

-- Why option values that no check below them reads are not what they can mean (nil when they
-- are): a reserve below 0 gave the tables HBM the budget does not have, a depth below 1 negative
-- pinned bytes, prefix fractions past 1 or below 0 were clamped unsaid; a string raised.
local function options_error(opts)
  local ok, err = pcall(require("uvmrec.lib").known_keys, opts, OPTIONS, "planner", 1)
  if not ok then return (tostring(err):gsub("^[^\n]-:%d+: ", "")) end
  local r = opts.reserve
  if r ~= nil and not (type(r) == "number" and r >= 0 and r < math.huge) then
    return ("planner: reserve %s; expected bytes (>= 1) or a fraction of the budget from 0 to below 1"):format(shown(r))
  end
  local d = opts.depth
  if d ~= nil and not (type(d) == "number" and d >= 1 and d < math.huge and d == math.floor(d)) then
    return ("planner: depth %s; expected the pinned batches the loader keeps, a whole number >= 1"):format(shown(d))
  end
  local f = opts.fractions
  if f ~= nil then
    if type(f) ~= "table" or #f == 0 then
      return ("planner: fractions is a %s; expected a list of numbers in (0, 1]"):format(type(f))
    end
    for i, x in ipairs(f) do
      if not (type(x) == "number" and x > 0 and x <= 1) then
        return ("planner: fractions[%d] is %s; expected prefix fractions and load factors in (0, 1]"):format(i,
          shown(x))
      end
    end
  end
end

-- "a", "a and b", "a, b and c".
local function listed(list)
  if #list < 2 then return list[1] or "" end
  return table.concat(list, ", ", 1, #list - 1) .. " and " .. list[#list]
end

-- Ranks r (1-based) as a message names them: "rank 0", "ranks 0 and 1".
local function ranks_named(rs)
  local s = {}
  for k, r in ipairs(rs) do s[k] = tostring(r - 1) end
  return (#s == 1 and "rank " or "ranks ") .. listed(s)
end

-- Item i's one cached choice's width, sharding and shard count where its every choice has the
-- same (its fixed settings leave it cached only), and the caches it is in: {"row"} (every rank's
-- row-wise shards'), ranks r (1-based) its fixed rank or its column shards name, or nil (a
-- table_wise shard on any rank); nil where it has a choice of another.
local function cached_only(items, i, world)
  local it = items[i]
  local o1 = it.options[1]
  if not o1 then return nil end
  for _, o in ipairs(it.options) do
    if not (o.placement == "cached" and o.width == o1.width and o.sharding == o1.sharding
            and o.shards_count == o1.shards_count) then
      return nil
    end
  end
  local keys
  if o1.sharding == "row_wise" then
    keys = { "row" }
  elseif o1.sharding == "column_wise" then
    keys = search.column_ranks(i, o1.shards_count, world)
  elseif world == 1 or it.rank then
    keys = { it.rank or 1 }
  end
  return o1, keys
end

-- A rank's cached tables share one cache, whose rows have one dim and dtype (ur_cache_new
-- refuses two; planner.search keeps to it): tables whose fixed settings leave them only cached
-- choices, on ranks those settings name (a fixed rank; a column-wise table's shards, on the
-- ranks a run puts them: search.column_ranks), at two widths in one cache are refused, naming
-- both, the rank and the widths; so are the other such tables (table_wise, on any rank) where
-- their widths that no such rank caches are more than the ranks left.  The search would find no
-- plan, and the error would have been about the budget, or host memory not given (a dim-8
-- column-wise table's dim-4 shards on both of 2 ranks beside a dim-16 table).
local function fixed_widths(items, world)
  local held, holders, loose = {}, {}, {}
  for i, it in ipairs(items) do
    local o1, keys = cached_only(items, i, world)
    if o1 then
      for _, k in ipairs(keys or {}) do
        local h = held[k]
        if h and h.width ~= o1.width then
          return ("planner: tables %s (%s) and %s (%s) are fixed cached %s, whose cache holds rows of one dim "
            .. "and dtype (the engine's cache refuses two): give one of them another placement%s"):format(h.name,
            h.width, it.name, o1.width, k == "row" and "row_wise, in every rank's row-wise shards' cache"
            or ("on rank %d"):format(k - 1), world > 1 and ", rank or sharding" or "")
        end
        held[k] = h or { name = it.name, width = o1.width }
      end
      if not keys then
        loose[#loose + 1] = { name = it.name, width = o1.width }
      elseif o1.sharding ~= "row_wise" then
        holders[#holders + 1] = ("%s (%s)%s on %s"):format(it.name, o1.width, o1.sharding == "column_wise"
          and " column_wise" or "", ranks_named(keys))
      end
    end
  end
  -- the table-wise ones: a width some rank's cache holds may go there; each other width needs an
  -- empty rank of its own
  local ranked, taken = {}, 0
  for k, h in pairs(held) do
    if k ~= "row" then ranked[h.width], taken = true, taken + 1 end
  end
  local seen, widths, names = {}, {}, {}
  for _, t in ipairs(loose) do
    if not ranked[t.width] then
      if not seen[t.width] then seen[t.width], widths[#widths + 1] = true, t.width end
      names[#names + 1] = ("%s (%s)"):format(t.name, t.width)
    end
  end
  local left = world - taken
  if #widths <= left then return nil end
  -- the tables to move: of each width past the ranks left
  local give = #names == #widths and ("%d of them"):format(#widths - left)
               or ("the tables of %d of those widths"):format(#widths - left)
  if taken == 0 then
    return ("planner: tables %s are fixed cached at %d row widths, and each of the %d ranks has one cache for its "
      .. "table- and column-wise shards, of one width (the engine's cache refuses two): give %s another placement "
      .. "or sharding"):format(listed(names), #widths, world, give)
  end
  local busy, free = {}, {}
  for r = 1, world do
    local list = held[r] and busy or free
    list[#list + 1] = r
  end
  local subject = #names == 1 and "table " .. names[1] .. " is" or "tables " .. listed(names) .. " are"
  local head
  if #widths == 1 then
    head = ("%s fixed cached table_wise, and no rank's cache can take %s width"):format(subject,
      #names == 1 and "its" or "their")
    give = #names == 1 and "it" or "them"
  else
    head = ("%s fixed cached table_wise at %d widths that no rank's cache holds, and %s"):format(subject, #widths,
      left == 0 and "no rank is left for them" or ("only %s left (%s)"):format(things(left, "rank is", "ranks are"),
      ranks_named(free)))
  end
  return ("planner: %s: each rank has one cache for its table- and column-wise shards, of one dim and dtype (the "
    .. "engine's cache refuses two), and tables fixed cached hold the caches of %s: %s; give %s another placement or "
    .. "sharding, or one of the tables that hold ranks"):format(head, ranks_named(busy), listed(holders), give)
end

-- Two tables that `choice` caches at two widths on one rank (search.cache_clash's or a
-- partition's {rank, row_wise, a, b}), after `head`.
local function two_widths(S, choice, m, head)
  local a, b = S.items[m.a], S.items[m.b]
  return ("%s tables %s (%s) and %s (%s) on rank %d, %s (the engine's cache refuses two)"):format(head, a.name,
    a.options[choice[m.a]].width, b.name, b.options[choice[m.b]].width, m.rank - 1, m.row_wise
    and "both row_wise: the rank's row-wise shards share one cache, whose rows have one dim and dtype"
    or "whose cache holds rows of one dim and dtype")
end

-- The planning problem: context, cost tables, options (frontiers), fixed HBM per rank.
local function setup(tables, profiles, budget, opts)
  opts = opts or {}
  local oerr = options_error(opts)
  if oerr then return nil, oerr end
  local B, err = M.bytes(budget)
  if not B then return nil, "planner: budget: " .. err end
  local cal, cerr = resolve_calib(opts.calibration)
  if not cal then return nil, "planner: " .. cerr end
  local world = opts.world or opts.gpus or 1
  -- inf passed a check of its own and raised in the cost tables ("table index is NaN")
  if not require("uvmrec.lib").whole_in(world, 1, 2 ^ 31) then
    return nil, "planner: world (gpus) must be a whole number >= 1"
  end
  local ok, ctx = pcall(cost.context, { calib = cal, batch = opts.batch or 65536, world = world,
    policy = opts.policy, pipeline = opts.pipeline, fractions = opts.fractions, hints_every = opts.hints_every,
    -- the hint pages: the GPU's 2 MiB, the CPU backend's system pages (4 KiB)
    page_bytes = opts.page_bytes or (cal.backend == "cpu" and 4096 or nil),
    -- the dense part's arena: device blocks on a GPU, host blocks on the CPU backend (nn.arena)
    arena_block = opts.arena_block or require("uvmrec.nn.arena").BLOCK[cal.backend == "cpu" and "host" or "device"],
    -- the dense ops' workspaces: a GPU's (the CPU backend has none)
    workspaces = cal.backend ~= "cpu", sms = opts.sms,
    output_bytes = opts.output_bytes,
    -- the evaluations' rows a rank, over whose values a cache's scratch grows (a bad one is
    -- cost.dense_model's to refuse, below)
    eval_batch = type(opts.dense) == "table" and require("uvmrec.lib").whole_in(opts.dense.eval_batch, 0, 2 ^ 53)
      and opts.dense.eval_batch or nil })
  if not ok then return nil, "planner: " .. tostring(ctx):gsub("^[^\n]-:%d+: ", "") end
  -- a search or threshold of another spelling ran the greedy search, its default stop
  local search_how = opts.search
  if search_how ~= nil and search_how ~= "auto" and search_how ~= "greedy" and search_how ~= "exhaustive" then
    return nil, ("planner: search '%s'; expected auto, greedy or exhaustive"):format(tostring(search_how))
  end
  local th = opts.threshold
  -- it counts proposals: 1.5 stopped after 2
  local whole = type(th) == "number" and th >= 1 and th < math.huge and th == math.floor(th)
  if th ~= nil and th ~= false and not whole then
    return nil, ("planner: threshold %s; expected a whole number >= 1, or false (no early stop)"):format(tostring(th))
  end
  local cts = {}
  local ids = 0
  local named = {}
  -- (each raised: "bad argument #1 to 'ipairs'", "attempt to index local 't'", "table index is nil")
  if type(tables) ~= "table" then
    return nil, ("planner: tables is a %s; expected a list of tables {name, rows, dim, ...}"):format(type(tables))
  end
  for i, t in ipairs(tables) do
    if type(t) ~= "table" then
      return nil, ("planner: tables[%d] is a %s; expected a table {name, rows, dim, ...}"):format(i, type(t))
    end
    if type(t.name) ~= "string" then
      return nil, ("planner: tables[%d] has no name (%s); expected a string"):format(i, tostring(t.name))
    end
    -- two tables of one name would share a plan's row and config keys
    if named[t.name] then return nil, ("planner: tables %d and %d are both named %s"):format(named[t.name], i,
      tostring(t.name)) end
    named[t.name] = i
    local p = profiles and profiles[t.name] or t.profile
    if not p then return nil, ("planner: table %s has no access profile"):format(tostring(t.name)) end
    local ferr = fixed_error(t, world)
    if ferr then return nil, "planner: " .. ferr end
    local tok, ct = pcall(cost.table, { name = t.name, rows = t.rows, dim = t.dim, dtype = t.dtype,
      optimizer = t.optimizer, hot = t.hot, profile = p, fixed = t.fixed })
    if not tok then return nil, "planner: " .. tostring(ct):gsub("^[^\n]-:%d+: ", "") end
    cts[i] = ct
    ids = ids + ct.hot
  end
  local dense = { time = 0, hbm = 0, mem = { params = 0, activations = 0 }, mlp = 0, interaction = 0,
                  optimizer = 0, fixed = 0, comm = 0 }
  if opts.dense then
    local dok, dm = pcall(cost.dense_model, opts.dense)
    if not dok then return nil, "planner: " .. tostring(dm):gsub("^[^\n]-:%d+: ", "") end
    dense = cost.dense(dm, ctx)
  end
  -- the synthetic loader's batches (opts.loader = {values = a sample's}); a file reader's cost is
  -- not modelled
  local loader = 0
  if opts.loader then
    local v = opts.loader.values
    if type(v) ~= "number" or not (v > 0 and v < math.huge) then
      return nil, ("planner: loader.values is %s; expected the values a sample has (> 0)"):format(tostring(v))
    end
    loader = cost.loader(ctx, v)
  end
  local pipe = cost.pipeline(ctx, ids, #tables, opts.dense and opts.dense.dense_features, opts.depth)
  local reserve = opts.reserve or 0.05
  local reserve_fraction = reserve < 1 and reserve or nil
  if reserve < 1 then reserve = math.floor(reserve * B) end
  local fixed = { dense = dense.hbm, pipeline = pipe.device, reserve = reserve, reserve_fraction = reserve_fraction }
  local fixed_total = dense.hbm + pipe.device + reserve
  local host_limit, host_given
  if opts.host_memory then
    local h, herr = M.bytes(opts.host_memory)
    if not h then return nil, "planner: host memory: " .. herr end
    host_limit, host_given = h - world * pipe.pinned, h
  end
  local items = {}
  for i, t in ipairs(cts) do
    local options, why = cost.options(t, ctx)
    if #options == 0 then
      local reasons = {}
      for sh, r in pairs(why or {}) do reasons[#reasons + 1] = sh .. ": " .. r end
      table.sort(reasons)
      return nil, ("planner: table %s: no choice satisfies its fixed settings (%s)%s"):format(t.name,
        json.encode(t.fixed or {}), #reasons > 0 and ("; " .. table.concat(reasons, "; ")) or "")
    end
    -- the choices without a cache, for the plan without one (M.plan), cut to their frontier
    -- below; the others are let go here (1000 tables on 8 ranks keep 6.5 of 51 a table in the two
    -- frontiers, where all were held, and walked by every pass of the collector)
    local no_cache = {}
    for _, o in ipairs(options) do if o.placement ~= "cached" then no_cache[#no_cache + 1] = o end end
    items[i] = { name = t.name, options = search.frontier(options, B - fixed_total), table = t, no_cache = no_cache,
                 rank = t.fixed and t.fixed.rank and t.fixed.rank + 1, not_offered = why }
  end
  -- Where cached choices have two widths, a rank's cache may bar a table's (search.lua: one row
  -- width a cache): its frontier without a cache is kept beside its frontier (a column-wise table
  -- whose shards find a cache of another width had only device choices left there, too large)
  local widths = {}
  for _, it in ipairs(items) do
    for _, o in ipairs(it.options) do if o.width then widths[o.width] = true end end
  end
  if next(widths, next(widths)) then
    for _, it in ipairs(items) do
      local have, more = {}, false
      for _, o in ipairs(it.options) do have[o] = true end
      for _, o in ipairs(search.frontier(it.no_cache, B - fixed_total)) do
        if not have[o] then it.options[#it.options + 1], more = o, true end
      end
      if more then
        table.sort(it.options, function(a, b)
          if a.hbm ~= b.hbm then return a.hbm < b.hbm end
          return a.time < b.time
        end)
      end
    end
  end
  local werr = fixed_widths(items, world)
  if werr then return nil, werr end
  -- On one rank a cache scratches over the whole batch's values, whichever tables it holds, and
  -- has one set of staging rows (of the widest cached row): room for both wherever a table may
  -- be cached, counted in the plan where one is (M.build)
  if world == 1 then
    local rb = 0
    for _, it in ipairs(items) do
      for _, o in ipairs(it.options) do
        if o.placement == "cached" then rb = math.max(rb, o.row_bytes) end
      end
    end
    if rb > 0 then
      fixed.cache_batch = cost.cache_batch_scratch(ctx.batch * ids, ctx)
      fixed.cache_staging = cost.cache_staging(ctx, rb)
      fixed.cache_room = fixed.cache_batch + fixed.cache_staging.cache_slots + fixed.cache_staging.cache_meta
      fixed_total = fixed_total + fixed.cache_room
    end
  end
  if world > 1 then
    for _, it in ipairs(items) do
      for _, o in ipairs(it.options) do fixed.cache_shares = fixed.cache_shares or o.placement == "cached" or nil end
    end
  end
  local avail = {}
  for r = 1, world do avail[r] = B - fixed_total end
  -- the plan without a cache has the cache's room back (M.plan: uncached)
  for _, it in ipairs(items) do it.no_cache = search.frontier(it.no_cache, avail[1] + (fixed.cache_room or 0)) end
  return { ctx = ctx, calib = cal, budget = B, world = world, tables = cts, items = items, dense = dense,
           loader = loader,
           pipe = pipe, fixed = fixed, fixed_total = fixed_total, avail = avail, host_limit = host_limit,
           host_given = host_given,
           opts = opts, input_tables = tables, profiles = profiles }
end

-- The least HBM per rank the tables need at world size W (every table at its smallest choice,
-- largest first onto the emptiest rank), plus the fixed part; nil when W cannot be evaluated,
-- or (with cap) when it is over cap by a bound that prices no table: every choice of a table
-- holds its pooled outputs and their gradients for the world's W·B samples over its shards
-- (cost.option's outputs), so the fullest rank holds at least 2·B·dim·output bytes of every
-- table.  Without it the fewest-GPUs search priced every table's choices at each world it
-- tried, up to 65536 ranks, where more GPUs do not help: 1000 tables on 8 ranks took 10 s.
local function min_budget(S, W, cap)
  local ctx = S.ctx
  if W ~= S.world then
    local ok, c = pcall(cost.context, { calib = S.calib, batch = ctx.batch, world = W, policy = ctx.policy,
      pipeline = ctx.pipeline, page_bytes = ctx.page_bytes, fractions = ctx.fractions,
      output_bytes = ctx.output_bytes, arena_block = ctx.arena_block, eval_batch = ctx.eval_batch })
    if not ok then return nil end
    ctx = c
  end
  local fixed_w
  if W ~= S.world then
    local dense = S.opts.dense and cost.dense(cost.dense_model(S.opts.dense), ctx).hbm or 0
    fixed_w = dense + S.fixed.pipeline + S.fixed.reserve
  end
  if cap then
    local outputs = 0
    for _, t in ipairs(S.tables) do outputs = outputs + 2 * ctx.batch * t.dim * ctx.output_bytes end
    if outputs + (fixed_w or S.fixed_total - (S.fixed.cache_room or 0)) > cap then return nil end
  end
  -- no share of a rank's cache scratch held (search.lua's items.relaxed): a bound from below, where
  -- holding them at every table's smallest choice asks more than plans of larger choices need
  -- (dlrm_kaggle with C3 and C21 cached on 2 ranks: 2.15 GiB, where 1.95 GiB plans)
  local items = { relaxed = true }
  for i, t in ipairs(S.tables) do
    -- the room a rank of W has, as setup gives the frontier its own (a choice no rank holds
    -- would say more GPUs do not help where spreading the table does)
    local fr = W == S.world and S.items[i].options or search.frontier(cost.options(t, ctx), S.budget - fixed_w)
    items[i] = { name = t.name, options = { fr[1] }, rank = S.items[i].rank }
  end
  local choice = {}
  for i = 1, #items do choice[i] = 1 end
  local inf = {}
  for r = 1, W do inf[r] = math.huge end
  -- (the caches' widths aside: a bound on the HBM, whose message names what does not fit)
  local p = search.partition(items, choice, { world = W, avail = inf, any_width = true }, true)
  local m, full = 0, 1
  for r = 1, W do if p.hbm[r] > m then m, full = p.hbm[r], r end end
  -- the tables fixed to the fullest rank (more GPUs do not move them)
  local pinned = { rank = full - 1 }
  for _, i in ipairs(items.pinned) do
    if items[i].rank == full then pinned[#pinned + 1] = items[i].name end
  end
  local fixed = S.fixed_total
  -- the cache's room only where a table's smallest choice is a cache (planner.plan searches the
  -- plan without one when the room does not fit)
  local room = false
  for _, it in ipairs(items) do room = room or it.options[1].placement == "cached" end
  if not room then fixed = fixed - (S.fixed.cache_room or 0) end
  if W ~= S.world then fixed = fixed_w end
  return m + fixed, fixed, pinned
end

-- The least budget a plan of every table at its smallest choice fits: min_budget's need holds the
-- reserve of S.budget, and a reserve given as a share of the budget grows with it.
local function least_budget(S, need)
  local f = S.fixed.reserve_fraction
  if not f then return need end
  return math.ceil((need - S.fixed.reserve) / (1 - f))
end

-- The dense part's bytes, by what holds them (cost.dense's mem).
local function dense_parts(S)
  local m = S.dense.mem
  if not m.arena_blocks then return fmt_bytes(S.fixed.dense) end
  return ("%s: parameters, gradients and optimizer state %s, the model's arena %s in %s of %s "
    .. "(nn.arena) for %s of activations at a batch of %d%s"):format(fmt_bytes(S.fixed.dense), fmt_bytes(m.params),
    fmt_bytes(m.activations), things(m.arena_blocks, "block"), fmt_bytes(m.arena_block),
    fmt_bytes(m.activations_used), S.ctx.batch, (m.eval_batch or 0) > 0
    and (" and evaluation batches of %d (%s of it)"):format(m.eval_batch, fmt_bytes(m.eval_activations)) or "")
    .. ((m.workspaces or 0) > 0 and (", the dense ops' workspaces %s on %s"):format(fmt_bytes(m.workspaces),
      things(m.workspace_streams, "stream")) or "")
end

-- Why the search found no plan where every table's smallest choice fits the HBM per rank
-- (min_budget's bound, which sets the caches' widths aside) and the host memory: one row width a
-- rank's cache, the one rule that bound leaves out.  The tables and widths named: where the
-- smallest choices, kept to one width a cache, fail to partition (search.partition's failure: a
-- cache of another width, or no room on the ranks whose cache takes a shard's width), and the
-- tables cached in every choice with the ranks their settings put them on.  This was reported as
-- host memory short, given or not (a dim-8 column-wise table fixed cached beside a dim-16 one).
local function width_failure(S, info, need)
  search.prep(S.items) -- (its widths: the search may have run on relaxed(S)'s)
  local names = S.items.width_names or {}
  if #names < 2 then
    -- (not met: with one width every table at its smallest choice partitions as min_budget's
    -- bound does, and it is the greedy's last proposal)
    return ("planner: the search found no plan, though every table's smallest choice fits the HBM (%s per rank at "
      .. "least) and the host memory: the planner's own failure; please report it with the tables"):format(
      fmt_bytes(need))
  end
  local ones = {}
  for i = 1, #S.items do ones[i] = 1 end
  local _, err = search.best_partition(S.items, ones, { world = S.world, avail = S.avail, host = S.host_limit })
  local there = ""
  if err and err.item then
    local b = S.items[err.item]
    if err.width then
      local a = S.items[err.other]
      there = ("; with every table at its smallest choice, %s holds %s's rows (%s) where %s (%s) was to go"):format(
        err.row_wise and "every rank's row-wise shards' cache" or ("rank %d's cache"):format(err.rank - 1), a.name,
        a.options[1].width, b.name, b.options[1].width)
    elseif b.options[1].width then
      there = ("; with every table at its smallest choice, %s (%s) finds no room on the ranks whose cache takes its "
        .. "width"):format(b.name, b.options[1].width)
    end
  end
  local only = {}
  for i, it in ipairs(S.items) do
    local o1, keys = cached_only(S.items, i, S.world)
    if o1 then
      only[#only + 1] = ("%s (%s%s)"):format(it.name, o1.width, o1.sharding == "row_wise" and ", row_wise"
        or o1.sharding == "column_wise" and (", column_wise on %s"):format(ranks_named(keys))
        or keys and (", on %s"):format(ranks_named(keys)) or "")
    end
  end
  -- the exhaustive's info is {visited} (M.plan)
  local exhaustive = info and info.visited ~= nil
  return ("planner: the %s search found no plan that keeps one row width a cache (the engine's cache refuses two; "
    .. "each rank has one cache for its table- and column-wise shards, another for its row-wise ones), though "
    .. "every table's smallest choice fits the HBM%s%s; the cached choices take %s (%s) on %s%s; %s"):format(
    exhaustive and "exhaustive" or "greedy", S.host_limit and " and the host memory" or "", there,
    things(#names, "row width"), table.concat(names, "; "), things(S.world, "rank"),
    #only > 0 and (", and the tables cached in every choice are %s"):format(listed(only)) or "",
    exhaustive and "no arrangement exists: cache fewer widths (another placement or sharding for a table cached in "
      .. "every choice), or give more HBM"
    or "the greedy's partitioner can miss an arrangement: pin tables to ranks (a fixed rank), or search = "
      .. "\"exhaustive\" (every arrangement, for small models), or cache fewer widths (another placement or "
      .. "sharding for a table cached in every choice)")
end

local plan_at -- (M.plan's search; below)

-- Whether a plan of S's tables fits `budget` on W ranks (S.world by default): the greedy search's
-- (the exhaustive finds one wherever it does).
local function plans(S, budget, W)
  local o = {}
  for k, v in pairs(S.opts) do o[k] = v end
  o.search, o.world = "greedy", W or S.world
  return plan_at(S.input_tables, S.profiles, budget, o, true) ~= nil
end

-- Over ranks where a table may be cached, min_budget's bound holds no rank's shares of its cache's
-- scratch (items.relaxed): a budget it names may not plan (dlrm_kaggle with C3 and C21 cached on 2
-- ranks: 1.86 GiB named as fitting, 1.86 to 1.92 GiB refused, 1.95 GiB planned).  The least budget
-- that plans, found by planning from the bound up (1/64 more, doubled, up to 3 times it), then by
-- bisection to a MiB or 0.5%: hi (nil where none up to 3 times the bound plans) and lo, the
-- greatest budget tried that does not; at most 15 plans.
local function least_planned(S, from)
  if plans(S, from) then return from, nil end
  local lo, hi, step = from, nil, 1 / 64
  for _ = 1, 8 do
    local b = math.ceil(from * (1 + step))
    if plans(S, b) then hi = b break end
    lo, step = b, step * 2
  end
  if not hi then return nil, lo end
  for _ = 1, 6 do
    if hi - lo <= math.max(2 ^ 20, 5e-3 * hi) then break end
    local mid = math.floor((lo + hi) / 2)
    if plans(S, mid) then hi = mid else lo = mid end
  end
  return hi, lo
end

-- The least budget infeasible names, from min_budget's bound: checked (a format of the budget and
-- its bytes) where it plans, else bound (the same, as a bound) and the least budget that planned
-- (least_planned), where a rank may hold shares of its cache's scratch (over ranks, a table that
-- may be cached).  Each plan prices every table again: past 256 tables x ranks (search_spec's 300
-- tables on 8 ranks: 0.5 s a plan, 3.2 s for least_planned's 6 against 0.15 s for the refusal)
-- only the bound is planned.  Returns the words and the budget that plans (nil: none found).
local function least_named(S, least, checked, bound)
  if not (S.world > 1 and S.fixed.cache_shares) then return checked:format(fmt_bytes(least), least), least end
  local hi, lo
  if #S.items * S.world <= 256 then
    hi, lo = least_planned(S, least)
  else
    hi, lo = plans(S, least) and least or nil, least
  end
  if hi == least then return checked:format(fmt_bytes(least), least), least end
  local held = "once a rank that caches holds its shards' shares of its cache's scratch"
  if not hi and lo == least then
    return ("%s, and %s does not plan %s"):format(bound:format(fmt_bytes(least), least), fmt_bytes(least), held),
      nil
  elseif not hi then
    return ("%s, and none up to %s (%d bytes) plans %s"):format(bound:format(fmt_bytes(least), least),
      fmt_bytes(lo), lo, held), nil
  end
  return ("%s; a budget of %s (%d bytes) plans, %s (%d bytes do not)"):format(bound:format(fmt_bytes(least), least),
    fmt_bytes(hi), hi, held, lo), hi
end

local function infeasible(S, info)
  local need, fixed, pinned = min_budget(S, S.world)
  local lines = {}
  if S.fixed_total >= S.budget then
    local bound = least_budget(S, need)
    local named, least = least_named(S, bound, "a budget of at least %s (%d bytes) would fit",
      "no budget under %s (%d bytes) fits")
    -- on one rank, room for a cache's scratch over the whole batch and its staging rows where a
    -- table may be cached (over ranks each cached table counts its own values and staging instead)
    local cache = S.fixed.cache_room
    lines[#lines + 1] = ("planner: the model cannot fit: the dense part, the pipeline's buffers%s and the reserve "
      .. "alone take %s of each rank's %s HBM budget (dense %s; pipeline %s;%s reserve %s), and every rank holds "
      .. "%s; %s"):format(
      cache and ", a cache's scratch and staging rows" or "", fmt_bytes(S.fixed_total), fmt_bytes(S.budget),
      dense_parts(S), fmt_bytes(S.fixed.pipeline),
      cache and (" a cache's scratch over the batch's values and staging rows %s (kept while a table may be "
        .. "cached);"):format(fmt_bytes(cache)) or "",
      fmt_bytes(S.fixed.reserve),
      cache and "all but the cache's room: more GPUs do not help with the rest" or "them: more GPUs do not help",
      named)
    return nil, table.concat(lines, "\n"), { shortfall = need - S.budget, min_budget = need, least_budget = least,
                                             bound = bound, dense = S.fixed.dense }
  end
  if need > S.budget then
    local gpus
    if S.calib:has("alltoall") then
      -- the fewest ranks whose smallest plan fits: doubling, then bisection
      local lo, hi = S.world, nil
      local W = S.world
      while W < 65536 do
        W = W * 2
        local nb = min_budget(S, W, S.budget)
        if nb and nb <= S.budget then hi = W break end
        lo = W
      end
      if hi then
        while hi - lo > 1 do
          local mid = math.floor((lo + hi) / 2)
          local nb = min_budget(S, mid, S.budget)
          if nb and nb <= S.budget then hi = mid else lo = mid end
        end
        gpus = hi
      end
    end
    local named, least = least_named(S, need, "the smallest budget that fits is %s", "no budget under %s fits")
    local msg = ("planner: the model cannot fit in %s of HBM per rank on %s: with every table at its "
      .. "smallest choice a rank needs %s (tables %s, fixed %s), %s short; %s")
      :format(fmt_bytes(S.budget), things(S.world, "rank"), fmt_bytes(need), fmt_bytes(need - fixed),
        fmt_bytes(fixed), fmt_bytes(need - S.budget), named)
    -- (the world's bound, like the budget's, holds no shares of a cache's scratch: where a table may
    -- be cached, the world named is planned)
    if gpus and (S.fixed.cache_shares or S.fixed.cache_room) and not plans(S, S.budget, gpus) then
      msg = msg .. ("; fewer than %d GPUs cannot fit at this budget (every table at its smallest choice, a rank's "
        .. "cache scratch aside), and %d did not plan"):format(gpus, gpus)
      gpus = nil
    elseif gpus then
      msg = msg .. (", or %d GPUs at this budget"):format(gpus)
    elseif S.calib:has("alltoall") and #pinned > 0 then
      msg = msg .. ("; more GPUs do not bring it down: the fullest rank, %d, holds %s fixed to it (%s%s)")
        :format(pinned.rank, things(#pinned, "table"), table.concat(pinned, ", ", 1, math.min(#pinned, 8)),
          #pinned > 8 and (", and %d more"):format(#pinned - 8) or "")
    elseif S.calib:has("alltoall") then
      msg = msg .. "; more GPUs do not bring it down (every rank keeps its own batch's outputs)"
    else
      msg = msg .. " (more GPUs: the calibration has no collective rates to plan them)"
    end
    return nil, msg, { shortfall = need - S.budget, min_budget = need, least_budget = least, gpus = gpus }
  end
  -- HBM would do: host memory is short, where given, or one width a cache (width_failure).
  -- "Then" is at each table's smallest choice (the HBM above): the least host memory of any
  -- choice (0 B with every table in HBM, which does not fit) was printed there, and a shortfall
  -- below the limit given
  local host_then = 0
  for _, it in ipairs(S.items) do host_then = host_then + it.options[1].host end
  if not (S.host_limit and host_then > S.host_limit) then
    return nil, width_failure(S, info, need), { min_budget = need, lack = info, widths = true }
  end
  return nil, ("planner: no plan fits both budgets: the tables need %s of HBM per rank at least, which fits, but "
    .. "then %s of host memory against the %s left of the %s given (--host-memory) once the pipeline's pinned "
    .. "batches (%s) have theirs; give more host memory or more HBM"):format(fmt_bytes(need), fmt_bytes(host_then),
    fmt_bytes(math.max(S.host_limit, 0)), fmt_bytes(S.host_given), fmt_bytes(S.host_given - S.host_limit)),
    { host_shortfall = host_then - S.host_limit, min_budget = need, lack = info }
end

-- The combinations of the tables' choices and ranks (a table's choices times the ranks), up to
-- a little past cap.
local function size_of(items, W, cap)
  local n = 1
  for _, it in ipairs(items) do
    n = n * #it.options * (W > 1 and W or 1)
    if n > cap then return n end
  end
  return n
end

-- The exhaustive search: auto takes it where size_of is at most AUTO_EXHAUSTIVE; it gives up
-- past MAX_NODES nodes of its search (about 15 s CPU here: dlrm_kaggle's 26 tables on 2 ranks
-- take 0.5 to 21 million by the budget, on 4 ranks more than 5e7)
local AUTO_EXHAUSTIVE, MAX_NODES = 2e5, 5e7

local function round(x, d) local m = 10 ^ (d or 6) return math.floor(x * m + 0.5) / m end

-- The first rank whose HBM, as M.build counts it, passes the plan's budget by more than tol of it
-- (0: any; nil where none does).
local function over_budget(plan, tol)
  for _, R in ipairs(plan.data.ranks) do
    if R.hbm > plan.data.budget * (1 + (tol or 0)) then return R end
  end
end

-- The budget checks' tolerance (M.plan's and evaluate's of the plans they hand on, and
-- Plan:over_budget's of a plan applied): the search sums a rank's bytes shard by shard (each
-- shard's parts first), M.build part by part over the shards, so the same bytes may differ in their
-- last bits (a sum of n terms by n ulps at most: 1e-13 of it for a thousand shards); a plan over
-- by less is the same plan, neither the planner's bug nor one to refuse.  (Under a byte up to a TiB:
-- a plan edited one byte over is refused.)
local SUMS = 1e-12

-- S's items, the same options, searched with no rank holding its shares of its cache's scratch
-- (search.lua's items.relaxed; M.plan).
local function relaxed(S)
  if not S.relaxed_items then
    local items = { relaxed = true }
    for i, it in ipairs(S.items) do
      items[i] = { name = it.name, options = it.options, table = it.table, rank = it.rank,
                   not_offered = it.not_offered }
    end
    S.relaxed_items = items
  end
  return S.relaxed_items
end

-- The plan: see the top of this file.  opts: world (gpus), batch (per rank), calibration
-- (a name, path, table or calib), dense (cost.dense_model's description), host_memory, policy
-- ("lru" | "lfu"), pipeline, threshold (greedy's early stop, 10; false: none), search ("auto":
-- exhaustive when the instance is small, else greedy; "greedy"; "exhaustive"), max_nodes (the
-- exhaustive search gives up past them, nil and a message: 5e7), reserve (bytes,
-- or a fraction of the budget: 0.05), page_bytes (hint pages: 2 MiB; 4 KiB with a CPU
-- calibration), fractions, depth, loader ({values = a sample's}: the synthetic loader's batches
-- in the step), hints_every (steps between the managed tables' hint intervals: 100), sms (the
-- GPU's multiprocessors, which size the dense ops' workspaces: an H200's 132).
-- probe (plans): a search's failure is nil, no message (infeasible plans again to find its figures).
function plan_at(tables, profiles, budget, opts, probe)
  opts = opts or {}
  local clock = require("uvmrec.lib").C.ur_clock_seconds
  local t0 = clock()
  local S, err = setup(tables, profiles, budget, opts)
  if not S then return nil, err end
  local how = opts.search or "auto"
  local max_nodes = opts.max_nodes or MAX_NODES
  local function run(items, avail, start)
    local env = { world = S.world, avail = avail, host = S.host_limit }
    local best, info, stats = search.greedy_widths(items, env, { threshold = opts.threshold, start = start })
    stats.method = "greedy"
    stats.threshold = opts.threshold == nil and 10 or opts.threshold
    if how == "exhaustive" or how == "auto" and size_of(items, S.world, AUTO_EXHAUSTIVE) <= AUTO_EXHAUSTIVE then
      -- the greedy's plan bounds the branches: only a faster one is searched for
      local ex
      ex, info = search.exhaustive(items, env, best, max_nodes)
      if info.stopped then
        -- it ran for minutes past any wait (26 tables on 4 ranks): a plan it cannot say is the best is
        -- not printed as the optimum
        local size = size_of(items, S.world, 1e15)
        local k = 0
        for _, it in ipairs(items) do k = k + #it.options end
        return nil, ("planner: search exhaustive gave up after %.0e nodes without proving the best plan: %d tables "
          .. "of %.1f choices each on average over %s make %s combinations; use search greedy (or auto, "
          .. "exhaustive up to %.0e combinations)"):format(max_nodes, #items, k / #items, things(S.world, "rank"),
          size > 1e15 and "more than 1e15" or ("%.3g"):format(size), AUTO_EXHAUSTIVE),
          "stopped"
      end
      best, stats = ex, { method = "exhaustive", visited = info.visited }
    end
    return best, info, stats
  end
  -- The plan without a cache: the tables' other choices, in the HBM the cache's room (its
  -- batch scratch and staging rows on one rank) would have taken; nil where a table has no
  -- choice but a cache.
  local function uncached()
    local avail = {}
    for r, a in ipairs(S.avail) do avail[r] = a + (S.fixed.cache_room or 0) end
    local items = {}
    for i, it in ipairs(S.items) do
      if #it.no_cache == 0 then return nil end
      -- the frontier at avail[1] (setup)
      items[i] = { name = it.name, options = it.no_cache, table = it.table, rank = it.rank,
                   not_offered = it.not_offered }
    end
    local best, why, stats = run(items, avail)
    if stats == "stopped" then return nil, nil, why end
    if not best then return nil end
    local U = setmetatable({ items = items }, { __index = S })
    return M.build(U, best, stats), stats
  end
  -- Over ranks a rank's cache scratches over every value its collection gets (rank_caches): the
  -- search holds each shard's share of it on a rank only once the rank caches (search.lua's held).
  -- It runs first without any share held (relaxed: the plans it weighs are a superset, each priced
  -- at most as much), and again holding them only where that plan passes its budget once the
  -- rank's caches are counted: a relaxed plan that fits is the plan the held search would look
  -- for (the exhaustive search's, exactly), and where the plan without a cache is no slower
  -- than the relaxed one, the held search cannot beat it either.  (Held from the start, search_spec's
  -- 1000 tables on 8 ranks took 5 s of CPU for the plan found in 1.2 s: the repairs of its cached
  -- search freed the shares of ranks that cached a table a few MiB at a time, a partition each.)
  local plan, stats, info, best
  if S.fixed_total < S.budget then
    best, info, stats = run(S.world > 1 and relaxed(S) or S.items, S.avail)
    if stats == "stopped" then return nil, info end
    if best then
      local m = search.cache_clash(S.items, best.choice, best.part.ranks)
      if m then error(two_widths(S, best.choice, m, "planner: internal: the search cached"), 2) end
      plan = M.build(S, best, stats)
    elseif not S.fixed.cache_room then
      if probe then return nil end
      return infeasible(S, info)
    end
  end
  -- The searches weigh each table on its own; a rank's cache costs its per-batch share once,
  -- whichever tables it holds (cost.cache_batch_seconds), and on one rank the cache's room is
  -- held wherever a table may be cached, used or not.  So the plan without a cache is searched
  -- too where that room was held, or where the plan caches a table and the cache has a cost per
  -- batch, and the faster one kept.
  -- Over ranks the plan counts a rank's cache over its collections' every value where the search
  -- held room for the cached shards' own (rank_caches): the plan without a cache is searched too
  -- wherever a table may be cached.
  local cached = not plan or S.fixed.cache_room ~= nil or S.fixed.cache_shares ~= nil
  if plan and cost.cache_batch_seconds(S.ctx) > 0 then
    for _, t in ipairs(plan.data.tables) do cached = cached or t.placement == "cached" end
  end
  local plan2, stats2, stopped
  if cached then
    plan2, stats2, stopped = uncached()
    if stopped then return nil, stopped end
  end
  local over = plan and S.world > 1 and over_budget(plan)
  local refused
  if over then
    local relaxed_step = plan.data.step_seconds
    refused = ("planner: no plan fits %s of HBM per rank once a rank's cache scratch is counted over every value its "
      .. "collection gets (the search holding each shard's share of it on a rank that caches found none): the plan "
      .. "searched without them (%.3f ms) needs %s on rank %d, its caches' scratch %s"):format(fmt_bytes(S.budget),
      relaxed_step * 1e3, fmt_bytes(over.hbm), over.rank, fmt_bytes(over.device.cache_scratch))
    plan = nil
    if not (plan2 and plan2.data.step_seconds <= relaxed_step) then
      -- held, starting from the relaxed plan's choice too (search.greedy's opts.start)
      local st
      best, info, st = run(S.items, S.avail, best)
      if st == "stopped" then return nil, info end
      if best then plan, stats = M.build(S, best, st), st end
    end
    for _, s in ipairs({ stats, stats2 }) do
      s.relaxed = { step = relaxed_step, rank = over.rank, hbm = over.hbm }
    end
  end
  if cached then
    if not plan then
      if not plan2 and (refused or probe) then return nil, refused and refused .. "; the plan without a cache: none" end
      if not plan2 then return infeasible(S, info) end
      plan, stats = plan2, stats2
    else
      stats.uncached_step = plan2 and plan2.data.step_seconds or false
      if plan2 and plan2.data.step_seconds < plan.data.step_seconds then
        stats2.cached_step = plan.data.step_seconds
        plan, stats = plan2, stats2
      end
    end
  end
  if not plan then
    if refused then return nil, refused end
    if probe then return nil end
    return infeasible(S, info)
  end
  -- the searches hold at least what M.build counts on every rank (search.lua's held): a plan over
  -- is the planner's bug, never handed on
  local R = over_budget(plan, SUMS)
  if R then
    error(("planner: internal: the plan found needs %s (%.0f bytes) of HBM on rank %d, over the budget of %s "
      .. "(%.0f bytes); its caches' scratch %s"):format(fmt_bytes(R.hbm), R.hbm, R.rank, fmt_bytes(plan.data.budget),
      plan.data.budget, fmt_bytes(R.device.cache_scratch)), 2)
  end
  stats.seconds = round(clock() - t0, 6)
  plan.data.search = stats
  return plan
end

function M.plan(tables, profiles, budget, opts)
  return plan_at(tables, profiles, budget, opts)
end

-- ---- the plan object ----


-- The config keys a table's choice maps onto (train config, per table; the cache's policy is
-- the cache's, one for all cached tables: embeddings.cache.policy, from the plan's policy).
local function config_keys(name, o, hbm_gpu)
  local k = { placement = o.placement, sharding = o.sharding }
  if o.placement == "cached" then k.cache = { load_factor = o.load_factor } end
  if o.placement == "managed" then
    k.hints = { policy = "hot_prefix", allowance = ("%d"):format(hbm_gpu) }
  end
  local prefix = "embeddings.tables." .. name
  local flat = { [prefix .. ".placement"] = o.placement, [prefix .. ".sharding"] = o.sharding }
  if k.cache then
    flat[prefix .. ".cache.load_factor"] = o.load_factor
  end
  if k.hints then
    flat[prefix .. ".hints.policy"] = "hot_prefix"
    flat[prefix .. ".hints.allowance"] = k.hints.allowance
  end
  return k, flat
end

-- A rank's device bytes, by part (M.build's ranks[r].device): its tables' options' parts, then
-- the rank's own.
local DEVICE_PARTS = { unpack(cost.DEVICE_PARTS) }
for _, k in ipairs({ "dense", "pipeline", "reserve" }) do DEVICE_PARTS[#DEVICE_PARTS + 1] = k end

-- Over ranks, a rank's caches (one for its table- and column-wise shards, one for its row-wise
-- ones: uvmrec.dist.sharded's collections), as the engine holds them: each scratches over every
-- value its collection is given, its shards' of every placement (cost.cache_batch_scratch of
-- their lookups), and has one set of staging rows (cost.cache_staging).  The search held a cached
-- shard's own values' scratch and staging rows (its room), and the other shards' shares of the
-- scratch on a rank once the rank caches (planner.search's held): at least what is counted here,
-- where the room is replaced (docs/planner.md, HBM per rank).
local function rank_caches(S, best, ranks)
  local per = {}
  for i, it in ipairs(S.items) do
    local o = it.options[best.choice[i]]
    local k = o.sharding == "row_wise" and 2 or 1
    for _, r in ipairs(best.part.ranks[i]) do
      per[r] = per[r] or { { values = 0, room = 0 }, { values = 0, room = 0 } }
      local c, d = per[r][k], ranks[r].device
      if o.sharding ~= "data_parallel" then c.values, c.room = c.values + o.lookups, c.room + (o.room or 0) end
      if o.staging then
        c.rb = math.max(c.rb or 0, o.row_bytes)
        d.cache_slots, d.cache_meta = d.cache_slots - o.staging.cache_slots, d.cache_meta - o.staging.cache_meta
      end
    end
  end
  for r, kinds in pairs(per) do
    local d = ranks[r].device
    for _, c in ipairs(kinds) do
      d.cache_scratch = d.cache_scratch - c.room + (c.rb and cost.cache_batch_scratch(c.values, S.ctx) or 0)
      if c.rb then
        local st = cost.cache_staging(S.ctx, c.rb)
        d.cache_slots, d.cache_meta = d.cache_slots + st.cache_slots, d.cache_meta + st.cache_meta
      end
    end
  end
end

function M.build(S, best, stats)
  local ctx = S.ctx
  local W = S.world
  local ranks = {}
  for r = 1, W do
    -- the parts a table's option has (cost.option's mem.device) start at 0: a part missing from
    -- DEVICE_PARTS fails below instead of being left out of the total
    local device = {}
    for _, k in ipairs(DEVICE_PARTS) do device[k] = 0 end
    device.dense, device.pipeline, device.reserve = S.fixed.dense, S.fixed.pipeline, S.fixed.reserve
    ranks[r] = { rank = r - 1, tables_hbm = best.part.hbm[r], device = device,
                 managed_on_gpu = 0, pinned = S.pipe.pinned, managed = 0, hints = 0 }
  end
  -- a rank that caches a table pays its cache's per-batch cost once (cost.cache_batch_seconds)
  local kf, caches, cache_batch = cost.cache_batch_seconds(ctx), {}, {}
  for i, it in ipairs(S.items) do
    if it.options[best.choice[i]].placement == "cached" then
      for _, r in ipairs(best.part.ranks[i]) do caches[r] = true end
    end
  end
  for r = 1, W do cache_batch[r] = caches[r] and kf or 0 end
  local load = {}
  local slowest = 0
  for r = 1, W do
    load[r] = best.part.load[r] + cache_batch[r]
    slowest = math.max(slowest, load[r])
  end
  local step = cost.step(slowest + S.dense.time, S.dense.fixed or 0, S.calib.backend, S.loader)
  local out = {}
  for i, it in ipairs(S.items) do
    local o = it.options[best.choice[i]]
    local rs = best.part.ranks[i]
    local sh = o.shards[1]
    for _, r in ipairs(rs) do
      local R = ranks[r]
      for k, v in pairs(sh.mem.device) do R.device[k] = R.device[k] + v end
      R.managed_on_gpu = R.managed_on_gpu + sh.mem.managed_on_gpu
      R.pinned, R.managed = R.pinned + sh.mem.pinned, R.managed + sh.mem.managed
      R.hints = R.hints + (o.hints_seconds or 0)
    end
    local t = it.table
    local fixed = t.fixed and next(t.fixed) ~= nil
    local keys, flat = config_keys(t.name, o, sh.mem.managed_on_gpu)
    local rl = {}
    for j, r in ipairs(rs) do rl[j] = r - 1 end
    out[i] = {
      name = t.name, rows = t.rows, dim = t.dim, dtype = t.dtype, optimizer = t.optimizer, hot = t.hot,
      sharding = o.sharding, shards = o.shards_count, ranks = rl, placement = o.placement,
      prefix_rows = o.prefix, prefix_fraction = o.prefix_fraction, load_factor = o.load_factor,
      slots = o.slots, policy = o.policy, hit_rate = o.hit_rate, coverage = o.coverage,
      misses_per_step = o.misses, distinct_per_step = o.distinct, lookups_per_step = o.lookups,
      hbm_per_shard = sh.hbm, host_per_shard = sh.host, hbm = o.hbm, seconds_per_shard = sh.time,
      comm_per_shard = sh.comm, share = step > 0 and sh.time / step or 0,
      fixed = fixed and t.fixed or nil, config = keys, config_keys = flat,
      profile = t.profile:summary(), not_offered = it.not_offered,
    }
  end
  if S.fixed.cache_batch and caches[1] then
    local d = ranks[1].device
    d.cache_scratch = d.cache_scratch + S.fixed.cache_batch
    d.cache_slots = d.cache_slots + S.fixed.cache_staging.cache_slots
    d.cache_meta = d.cache_meta + S.fixed.cache_staging.cache_meta
  end
  if W > 1 then rank_caches(S, best, ranks) end
  for r, R in ipairs(ranks) do
    R.load, R.cache_batch_seconds = load[r], cache_batch[r]
    -- summed in one order: pairs' order changes from run to run (the last digit of a plan's
    -- device_total with it)
    local d = 0
    for _, k in ipairs(DEVICE_PARTS) do d = d + R.device[k] end
    R.device_total, R.hbm = d, d + R.managed_on_gpu
    R.host = R.pinned + R.managed
    R.step = cost.step(R.load + S.dense.time, S.dense.fixed or 0, S.calib.backend, S.loader)
  end
  -- the hint intervals come every `every` steps: the step is priced with their share, and the
  -- steps between them (most steps: a run's median) without it
  local quiet = 0
  for _, R in ipairs(ranks) do quiet = math.max(quiet, R.load - R.hints) end
  local step_quiet = cost.step(quiet + S.dense.time, S.dense.fixed or 0, S.calib.backend, S.loader)
  local cal = S.calib
  local used = { "hbm_gather", "hbm_gather_repeat", "hbm_copy", "zero_copy_gather", "managed_gather",
                 "tbe_backward_per_id", "cache_per_batch", "cache_per_id", "cache_per_row", "cache_row_fixed",
                 "cache_move",
                 "pipeline_overlap",
                 "hints_per_row",
                 "interaction_dot", "step_overhead", "loader_per_value" }
  local prec = S.opts.dense and S.opts.dense.precision or "f32"
  for _, n in ipairs({ "mlp_", "mlp_act_", "mlp_layer_" }) do used[#used + 1] = n .. prec end
  if W > 1 then for _, n in ipairs({ "alltoall", "allreduce", "reduce_scatter" }) do used[#used + 1] = n end end
  local p = {
    format = M.FORMAT, version = M.VERSION, world = W, batch = ctx.batch, budget = S.budget,
    eval_batch = S.opts.dense and S.opts.dense.eval_batch or 0,
    host_memory = S.opts.host_memory and M.bytes(S.opts.host_memory) or nil, policy = ctx.policy,
    pipeline = ctx.pipeline, calibration = { where = cal.where, machine = cal.machine, backend = cal.backend,
      not_measured = cal:unmeasured(used) },
    tables = out, ranks = ranks,
    dense = { seconds = S.dense.time, mlp = S.dense.mlp, interaction = S.dense.interaction,
              optimizer = S.dense.optimizer, fixed = S.dense.fixed or 0, comm = S.dense.comm, hbm = S.dense.hbm },
    loader_seconds = S.loader,
    step_seconds = step, embedding_seconds = slowest, samples_per_second = W * ctx.batch / step,
    hints_seconds = step - step_quiet, step_seconds_between_hints = step_quiet, hints_every = ctx.hints_every,
    search = stats,
  }
  p.search.seconds = p.search.seconds and round(p.search.seconds, 6)
  local plan = setmetatable({ data = p, _S = S }, Plan)
  return plan
end

-- Plain data (what a plan file holds).
function Plan:totable() return self.data end

-- One row per table, totals per rank against the budget, the predicted step.
function Plan:table()
  local p = self.data
  local L = {}
  local cal = p.calibration
  L[#L + 1] = ("plan: %s on %s, HBM budget %s per rank%s, batch %d per rank, policy %s%s; "
    .. "calibration %s (%s)"):format(things(#p.tables, "table"), things(p.world, "rank"), fmt_bytes(p.budget),
    p.host_memory and (", host memory " .. fmt_bytes(p.host_memory)) or "", p.batch, p.policy,
    p.pipeline and ", prefetch pipeline" or "", tostring(cal.where), tostring(cal.machine))
  if #cal.not_measured > 0 then
    L[#L + 1] = "  not measured: " .. table.concat(cal.not_measured, "; ")
  end
  local head = ("%-8s %11s %5s %-13s %-7s %-9s %-20s %10s %-12s %6s"):format("table", "rows", "dim", "sharding",
    "ranks", "placement", "size", "HBM", "hit/cov", "share")
  L[#L + 1] = head
  local flagged = false
  for _, t in ipairs(p.tables) do
    local size, rate = "-", "-"
    if t.placement == "managed" then
      size = ("prefix %.0f%% (%s)"):format(100 * t.prefix_fraction, fmt_count(t.prefix_rows))
      rate = ("cov %.1f%%"):format(100 * t.coverage)
    elseif t.placement == "cached" then
      size = ("lf %.2f (%s)"):format(t.load_factor, fmt_count(t.slots))
      rate = ("hit %.1f%%"):format(100 * t.hit_rate)
    end
    local rk
    if #t.ranks == p.world and p.world > 1 then rk = "all" else
      local s = {}
      for j, r in ipairs(t.ranks) do s[j] = tostring(r) end
      rk = table.concat(s, ",")
    end
    local sh = t.sharding .. ((t.shards or 1) > 1 and t.sharding == "column_wise" and ("/" .. t.shards) or "")
    local name = t.name .. (t.fixed and "*" or "")
    flagged = flagged or t.fixed ~= nil
    L[#L + 1] = ("%-8s %11s %5d %-13s %-7s %-9s %-20s %10s %-12s %5.1f%%"):format(name, fmt_count(t.rows), t.dim, sh,
      rk, t.placement, size, fmt_bytes(t.hbm), rate, 100 * t.share * #t.ranks)
  end
  if flagged then L[#L + 1] = "* kept as given (fixed per-table settings)" end
  -- the shardings a table was not offered, and why (a plan that never says column_wise
  -- looked like the search's verdict)
  for _, t in ipairs(p.tables) do
    local shs = {}
    for sh in pairs(t.not_offered or {}) do shs[#shs + 1] = sh end
    table.sort(shs)
    for _, sh in ipairs(shs) do
      L[#L + 1] = ("%s: %s not offered: %s"):format(t.name, sh, t.not_offered[sh])
    end
  end
  for _, R in ipairs(p.ranks) do
    local d = R.device
    L[#L + 1] = ("rank %d: HBM %s of %s (device %s: weights %s, optimizer %s, cache slots %s, cache metadata %s, "
      .. "cache scratch %s, outputs %s, dense %s, pipeline %s, reserve %s; managed on GPU %s); host: pinned %s, "
      .. "managed %s; embeddings %s"):format(R.rank, fmt_bytes(R.hbm), fmt_bytes(p.budget), fmt_bytes(R.device_total),
      fmt_bytes(d.weights), fmt_bytes(d.optimizer), fmt_bytes(d.cache_slots), fmt_bytes(d.cache_meta),
      fmt_bytes(d.cache_scratch), fmt_bytes(d.outputs), fmt_bytes(d.dense), fmt_bytes(d.pipeline),
      fmt_bytes(d.reserve), fmt_bytes(R.managed_on_gpu), fmt_bytes(R.pinned), fmt_bytes(R.managed), fmt_time(R.load))
      .. ((R.cache_batch_seconds or 0) > 0 and (" (the cache's per-batch cost %s of it)"):format(
        fmt_time(R.cache_batch_seconds)) or "")
  end
  L[#L + 1] = ("step: %s predicted (embeddings %s on the slowest rank + dense %s: MLPs %s, interaction %s, "
    .. "optimizer %s, all-reduce %s; fixed cost %s, loader %s%s); %s samples/s"):format(fmt_time(p.step_seconds),
    fmt_time(p.embedding_seconds), fmt_time(p.dense.seconds), fmt_time(p.dense.mlp), fmt_time(p.dense.interaction),
    fmt_time(p.dense.optimizer), fmt_time(p.dense.comm), fmt_time(p.dense.fixed or 0), fmt_time(p.loader_seconds or 0),
    p.calibration.backend == "cpu" and ", added" or ", the work and the loader in turn, against the calls",
    fmt_count(p.samples_per_second))
  if (p.hints_seconds or 0) > 0 then
    L[#L + 1] = ("  of which the managed tables' hint intervals %s a step (one interval every %s steps): a step "
      .. "between intervals %s"):format(fmt_time(p.hints_seconds), tostring(p.hints_every or "?"),
      fmt_time(p.step_seconds_between_hints))
  end
  local s = p.search
  if s.method == "greedy" then
    L[#L + 1] = ("search: greedy, %s (first fit at %s, best at %s)%s, %.3f s"):format(things(s.proposals, "proposal"),
      tostring(s.feasible_at), tostring(s.best_at), s.stopped_early and
      (", stopped after %d without improvement"):format(s.threshold) or ", options exhausted", s.seconds or 0)
    if s.widths then
      -- (search.greedy_widths: the figures above are the run whose plan it is)
      L[#L] = L[#L] .. ("; one run a cache width, %d runs, %s in all"):format(s.widths,
        things(s.proposals_all, "proposal"))
    end
  else
    L[#L + 1] = ("search: exhaustive, %s, %.3f s"):format(things(s.visited or 0, "node"), s.seconds or 0)
  end
  return table.concat(L, "\n")
end

-- The plan with table `name` set to `choice` ({placement, sharding, load_factor,
-- prefix_fraction, rank}), every other table as it is, re-predicted.  A rank (0-based) pins
-- the table there, table_wise unless the choice names another sharding (as the config's
-- embeddings.tables.<T>.rank does); a rank outside the plan's is an error.  nil, message when
-- the choice does not fit (the budget is checked as for a search).
local CHOICE = { "placement", "sharding", "load_factor", "prefix_fraction", "rank" }

function Plan:with(name, choice)
  -- a table not in the plan, a choice that is no table or a misspelt key gave the plan unchanged
  local names, found = {}, false
  for i, t in ipairs(self.data.tables) do
    names[i] = t.name
    found = found or t.name == name
  end
  if not found then
    error(("plan: no table named '%s' (tables: %s)"):format(tostring(name), table.concat(names, ", ")), 2)
  end
  if type(choice) ~= "table" then
    error(("plan: the choice for table %s is a %s; expected {placement=, sharding=, load_factor=, "
           .. "prefix_fraction=, rank=}"):format(name, type(choice)), 2)
  end
  require("uvmrec.lib").known_keys(choice, CHOICE, "plan: the choice for table " .. name, 2, "key")
  -- it was refused as an unknown key: a table could be pinned through the config only
  if choice.rank ~= nil then
    local rerr = rank_error(choice.rank, self.data.world)
    if rerr then error(("plan: the choice for table %s: rank %s"):format(name, rerr), 2) end
  end
  local S = self._S
  if not S then return nil, "plan: a plan read from a file has no cost model attached; plan again to edit" end
  local fixed = {}
  for i, t in ipairs(self.data.tables) do
    local f
    if t.name == name then
      f = { placement = choice.placement or t.placement, sharding = choice.sharding or t.sharding,
            load_factor = choice.load_factor, prefix_fraction = choice.prefix_fraction, rank = choice.rank }
      if choice.rank ~= nil and not choice.sharding then f.sharding = "table_wise" end
      if f.placement == "cached" and not f.load_factor then f.load_factor = t.load_factor or 0.2 end
      if f.placement == "managed" and not f.prefix_fraction then f.prefix_fraction = t.prefix_fraction or 0.2 end
    else
      f = { placement = t.placement, sharding = t.sharding, load_factor = t.load_factor,
            prefix_fraction = t.prefix_fraction }
    end
    fixed[i] = f
  end
  return M.evaluate(S.input_tables, S.profiles, S.budget, S.opts, fixed, name)
end

-- Which shard of `choice` found no room on which rank, by how much, and what the rank holds
-- (search.partition's error): "(175.2 MiB more needed by b)" named neither the rank nor the
-- table's rank key that put it there, and gave a free table's whole shard as the need.
local function no_room(S, choice, err)
  local held = {}
  for i, rs in pairs(err.ranks) do
    for _, r in ipairs(rs) do
      if r == err.rank and #held < 8 then held[#held + 1] = S.items[i].name end
    end
  end
  local r = err.rank - 1
  local beside = #held > 0 and (" beside " .. table.concat(held, ", ")) or ""
  -- (search.partition's need: the shard's bytes and the share it makes the rank hold, each named)
  local share = (err.share or 0) > 0 and (" and %s share of rank %d's cache scratch (held once the rank caches), %s")
    or ""
  if not err.item then
    return ("the row_wise and data_parallel tables take %s more on every rank than rank %d has (%s): their shards "
      .. "%s%s"):format(fmt_bytes(err.need - err.left), r, fmt_bytes(err.left), fmt_bytes(err.need - (err.share or 0)),
      share:format("their row-wise collection's", r, fmt_bytes(err.share or 0)))
  end
  local it = S.items[err.item]
  local o = it.options[choice[err.item]]
  local sh = o.shards[1].hbm
  -- (a cached shard on a rank not yet caching has it hold the other shards' shares)
  local what = ("%s's %s %s shard of %s%s"):format(it.name, o.sharding, o.placement, fmt_bytes(sh),
    o.placement == "cached" and (err.share or 0) > 0 and (" and the shares of rank %d's cache scratch it has the "
      .. "rank hold, %s"):format(r, fmt_bytes(err.share)) or share:format("its", r, fmt_bytes(err.share or 0)))
  local left = ("has %s left%s, %s short of %s"):format(fmt_bytes(err.left), beside, fmt_bytes(err.need - err.left),
    what)
  if it.rank then return ("rank %d (table %s's rank) %s"):format(r, it.name, left) end
  if o.sharding == "column_wise" then
    return ("rank %d (where a run puts table %s's column shard: shard s of the plan's table t on rank "
      .. "(t + s) mod %d) %s"):format(r, it.name, S.world, left)
  end
  if err.takes then
    -- (search.partition: the other ranks' caches hold other widths)
    return ("no rank whose cache takes table %s's row width (%s) has room for it: the roomiest of them, rank %d, "
      .. "%s"):format(it.name, o.width, r, left)
  end
  return ("no rank has room for table %s: the roomiest, rank %d, %s"):format(it.name, r, left)
end

-- Re-predicts a given choice for every table (choices[i] as Plan:with takes; tables in order):
-- the plan of those choices, ranks from the partitioner; nil, message when they do not fit.
function M.evaluate(tables, profiles, budget, opts, choices, edited)
  local tabs = {}
  for i, t in ipairs(tables) do
    local c = {}
    for k, v in pairs(t) do c[k] = v end
    local f = {}
    for k, v in pairs(t.fixed or {}) do f[k] = v end
    for k, v in pairs(choices[i] or {}) do f[k] = v end
    c.fixed = f
    tabs[i] = c
  end
  local S, err = setup(tabs, profiles, budget, opts)
  if not S then return nil, err end
  local env = { world = S.world, avail = S.avail, host = S.host_limit }
  local choice = {}
  for i = 1, #S.items do choice[i] = #S.items[i].options end
  -- a partition's failure, the relaxed one's or the held one's: the held one fails on a cache's
  -- width too (a shard placed elsewhere once the shares count), and its error has no `left`
  -- (no_room crashed on it: planner_fuzz's seed 144).  held: the second's (the first's
  -- arrangement passes the budget once the shares count)
  local function refused(perr, held)
    if not perr.width then
      return nil, ("plan: these choices do not fit %s per rank: %s"):format(fmt_bytes(S.budget),
        no_room(S, choice, perr))
    end
    -- the choices put a table there themselves: pinned to the rank, its column shards' ranks, the
    -- row-wise shards' cache, or one rank in all (setup's fixed_widths refuses most of these
    -- first); else the partitioner did, and pinning by hand may find what it missed (seed 20521:
    -- "these choices cache T2 and T1 on rank 0", where pinning them planned)
    local function put(i)
      local it, o = S.items[i], S.items[i].options[choice[i]]
      if perr.row_wise or S.world == 1 or it.rank == perr.rank then return true end
      if o.sharding ~= "column_wise" then return false end
      for _, r in ipairs(search.column_ranks(i, o.shards_count, S.world)) do
        if r == perr.rank then return true end
      end
      return false
    end
    if put(perr.other) and put(perr.item) then
      return nil, two_widths(S, choice, { rank = perr.rank, row_wise = perr.row_wise, a = perr.other, b = perr.item },
        "plan: these choices cache")
    end
    local by, order = {}, {}
    for i, it in ipairs(S.items) do
      local o = it.options[choice[i]]
      if o.placement == "cached" and o.sharding ~= "row_wise" then
        if not by[o.width] then by[o.width], order[#order + 1] = {}, o.width end
        local w = by[o.width]
        w[#w + 1] = it.name .. (it.rank and (" on rank %d"):format(it.rank - 1) or o.sharding == "column_wise"
          and (" column_wise on %s"):format(ranks_named(search.column_ranks(i, o.shards_count, S.world))) or "")
      end
    end
    local ws = {}
    for k, w in ipairs(order) do ws[k] = ("%s (%s)"):format(w, listed(by[w])) end
    return nil, ("plan: the partitioner found no arrangement of these choices' cached tables on the %s that keeps one "
      .. "row width a rank's cache (the engine's cache refuses two)%s: %s; %s (%s) found rank %d's cache holding %s's "
      .. "rows (%s); pin tables to ranks by hand (rank in the choice, or a table's fixed rank)"):format(
      things(S.world, "rank"), held and (" and fits %s per rank once a rank that caches holds its shards' shares of "
        .. "its cache's scratch (the one found without them does not)"):format(fmt_bytes(S.budget)) or "",
      listed(ws), S.items[perr.item].name, S.items[perr.item].options[choice[perr.item]].width,
      perr.rank - 1, S.items[perr.other].name, S.items[perr.other].options[choice[perr.other]].width)
  end
  -- no share of a rank's cache scratch held first, then held where that passes the budget (M.plan)
  local part, perr = search.best_partition(S.world > 1 and relaxed(S) or S.items, choice, env)
  local host = 0
  for i, it in ipairs(S.items) do host = host + it.options[choice[i]].host end
  if part and S.host_limit and host > S.host_limit then
    return nil, ("plan: these choices need %s of host memory; %s are given"):format(fmt_bytes(host),
      fmt_bytes(S.host_limit))
  end
  if not part then return refused(perr) end
  local best = { choice = choice, part = part, cost = search.max_load(part) }
  local p = M.build(S, best, { method = "evaluated", edited = edited, seconds = 0 })
  if over_budget(p) then
    part, perr = search.best_partition(S.items, choice, env)
    if not part then return refused(perr, true) end
    best = { choice = choice, part = part, cost = search.max_load(part) }
    p = M.build(S, best, { method = "evaluated", edited = edited, seconds = 0 })
    local R = over_budget(p, SUMS)
    if R then
      error(("planner: internal: the plan evaluated needs %s of HBM on rank %d, over the budget of %s"):format(
        fmt_bytes(R.hbm), R.rank, fmt_bytes(S.budget)), 2)
    end
  end
  -- the tables' own fixed settings stay flagged; choices applied here are the plan's
  for i, t in ipairs(p.data.tables) do
    local own = tables[i].fixed
    t.fixed = (own and next(own) ~= nil) and own or nil
  end
  return p
end

-- A short account of what differs between two plans (tables, HBM, step).
function Plan:compare(other)
  local a, b = self.data, other.data or other
  local L = {}
  local by = {}
  for _, t in ipairs(b.tables) do by[t.name] = t end
  local function desc(t)
    if t.placement == "cached" then return ("%s %s lf %.2f"):format(t.sharding, t.placement, t.load_factor) end
    if t.placement == "managed" then
      return ("%s %s prefix %.0f%%"):format(t.sharding, t.placement, 100 * t.prefix_fraction)
    end
    return t.sharding .. " " .. t.placement
  end
  for _, t in ipairs(a.tables) do
    local u = by[t.name]
    if not u then
      L[#L + 1] = ("%s: only in the first plan"):format(t.name)
    elseif desc(t) ~= desc(u) then
      L[#L + 1] = ("%s: %s -> %s (HBM %s -> %s)"):format(t.name, desc(t), desc(u), fmt_bytes(t.hbm), fmt_bytes(u.hbm))
    end
  end
  local ha, hb = 0, 0
  for _, R in ipairs(a.ranks) do ha = math.max(ha, R.hbm) end
  for _, R in ipairs(b.ranks) do hb = math.max(hb, R.hbm) end
  L[#L + 1] = ("step %s -> %s (%+.1f%%); fullest rank's HBM %s -> %s"):format(fmt_time(a.step_seconds),
    fmt_time(b.step_seconds), 100 * (b.step_seconds / a.step_seconds - 1), fmt_bytes(ha), fmt_bytes(hb))
  return table.concat(L, "\n")
end

-- ---- plan files ----

-- JSON, one table and one rank a line; numbers are written exactly (%.17g), so a file read
-- back and written again gives the same bytes, and the same data.
function M.encode(p)
  local head = {}
  for k, v in pairs(p) do if k ~= "tables" and k ~= "ranks" then head[k] = v end end
  local function lines(list)
    local out = {}
    for i, x in ipairs(list) do out[i] = "    " .. json.encode(x) end
    return table.concat(out, ",\n")
  end
  local h = json.encode(head)
  return h:sub(1, -2) .. ',\n  "ranks": [\n' .. lines(p.ranks) .. '\n  ],\n  "tables": [\n' .. lines(p.tables)
         .. "\n  ]\n}\n"
end

function Plan:encode() return M.encode(self.data) end

-- Writes the plan file whole (JSON; a .yaml path gets the same text, which YAML's flow syntax
-- reads); true, or nil, message (a full disk included: the file is the old one or the new).
function Plan:save(path)
  local lib = require "uvmrec.lib"
  local text = self:encode()
  local ok, err = lib.check(lib.C.ur_file_write(path, text, #text))
  if not ok then return nil, "plan: " .. err end
  return true
end

-- A plan from a plan file's text; nil, message.
function M.decode(text, where)
  where = where or "plan"
  local t, err = json.decode(text)
  if t == nil then return nil, ("%s: %s"):format(where, tostring(err)) end
  if type(t) ~= "table" or t.format ~= M.FORMAT then
    return nil, ("%s: not a plan file (format %s; expected %q)"):format(where,
      tostring(type(t) == "table" and t.format), M.FORMAT)
  end
  if t.version ~= M.VERSION then
    return nil, ("%s: plan file version %s; this planner reads %d"):format(where, tostring(t.version), M.VERSION)
  end
  if type(t.tables) ~= "table" or type(t.ranks) ~= "table" then return nil, where .. ": no tables or ranks" end
  return setmetatable({ data = t }, Plan)
end

function M.load(path)
  local text, err = require("uvmrec.lib").read_file(path)
  if not text then return nil, "plan: " .. tostring(err) end
  return M.decode(text, path)
end

-- ---- the planning problem of a training config ----

-- The rows of a rank's evaluation batches in a training run of cfg over `world` ranks, as
-- uvmrec.train runs it (train.data, train.evaluate): 0 when it does not evaluate (no data.eval
-- and synthetic data with eval.samples 0); else eval.batch_size (the global batch) sliced over
-- the ranks (the largest slice), and no more than eval.samples held-out synthetic samples.
function M.eval_batch(cfg, world)
  world = world or 1
  local file = cfg.data.eval ~= "" and not cfg.data.eval:match("^synthetic:")
  if cfg.data.eval == "" and not (cfg.data.train:match("^synthetic:") and cfg.eval.samples > 0) then return 0 end
  local rows = cfg.eval.batch_size
  if not file and cfg.eval.samples > 0 then rows = math.min(rows, cfg.eval.samples) end
  return math.ceil(rows / world)
end

-- The tables, access profiles and dense part of training config cfg (uvmrec.train.config), as
-- uvmrec plan and the benchmarks give them to M.plan.  o: world (ranks, 1), batch (per rank;
-- default train.batch_size / world, the global batch's slice),
-- counts (a checkpoint whose access counts profile the tables), profile_steps (profile them from
-- that many batches of the config's data); by default the Zipf exponents of the config's
-- synthetic preset.  A table's placement and cache load factor set in the config are kept
-- (fixed), and over several ranks its sharding and rank.  Returns {tables, profiles, dense, loader
-- (synthetic data: {values = a sample's}), hints_every (embeddings.hints.every), batch, how,
-- seconds}, or nil, message (, 2 when the command line is to blame).
function M.from_config(cfg, o)
  o = o or {}
  local ur = require "uvmrec"
  local train = require "uvmrec.train"
  local synthetic = require "uvmrec.data.synthetic"
  local profile = M.profile
  local e = cfg.embeddings
  local rows = train.config.table_rows(cfg)
  -- train.batch_size is the global batch: each of the world's ranks takes an equal slice
  local world = o.world or 1
  if not o.batch and cfg.train.batch_size % world ~= 0 then
    return nil, ("train.batch_size %d is not a multiple of the %d ranks (each takes an equal slice); give --batch "
      .. "(per rank)"):format(cfg.train.batch_size, world), 2
  end
  local batch = o.batch or cfg.train.batch_size / world

  -- the synthetic preset behind the config's data, when it has one: Zipf exponents, ids a sample
  local synth
  if cfg.data.train:match("^synthetic:") then
    synth = synthetic.resolve(cfg.data.train:match("^synthetic:(.+)$"))
  end

  local tables = {}
  for i, r in ipairs(rows) do
    local name = "C" .. i
    local per = e.tables[name] or {}
    local fixed = {}
    if per.placement and per.placement ~= "auto" then fixed.placement = per.placement end
    if per.cache and per.cache.load_factor then fixed.load_factor = per.cache.load_factor end
    -- over ranks, the table's own sharding and rank too (train --plan refuses a plan that changes
    -- them); on one rank every table is table_wise, on rank 0.  A rank past the plan's is
    -- refused at the config's key: on one rank it was dropped (rank 1, --gpus 1: planned as if
    -- unset), and over ranks the message named the planner's "fixed rank", a key nobody wrote.
    if per.sharding and world > 1 then fixed.sharding = per.sharding end
    if per.rank then
      local rerr = rank_error(per.rank, world)
      if rerr then
        return nil, require("uvmrec.config").message(cfg, "embeddings.tables." .. name .. ".rank", rerr)
      end
      if world > 1 then fixed.rank = per.rank end
    end
    local hot = 1
    local st = synth and synth.tables[i]
    if st then
      local h = st.hot or 1
      hot = type(h) == "table" and ((h[1] or h.min) + (h[2] or h.max)) / 2 or h
    end
    tables[i] = { name = name, rows = r, dim = e.dim, dtype = per.dtype or e.dtype, optimizer = e.optimizer.name,
                  hot = hot, fixed = next(fixed) and fixed or nil }
  end

  -- profiles
  local clock = ur.C.ur_clock_seconds
  local t0 = clock()
  local profiles, how = {}, nil -- luacheck: ignore 311
  if o.counts then
    local ck = require "uvmrec.checkpoint"
    local file, err = ck.open(train.checkpoint_file and train.checkpoint_file(o.counts) or o.counts)
    if not file then return nil, "--counts: " .. tostring(err) end
    local have = {}
    for _, n in ipairs(file:names()) do have[n] = true end
    for i, t in ipairs(tables) do
      local key = have["layout." .. t.name .. ".counts"] and "layout." .. t.name .. ".counts"
                  or have[t.name .. ".counts"] and t.name .. ".counts"
      if not key then
        file:close()
        return nil, (("--counts %s: no access counts for table %s (layout.%s.counts); train with counting on "
             .. "(hints or set_counting) to save them"):format(o.counts, t.name, t.name))
      end
      local v = file:view(key)
      if v:numel() ~= t.rows then
        file:close()
        return nil, ("--counts %s: table %s has %d counts for %d rows"):format(o.counts, t.name, v:numel(), t.rows)
      end
      profiles[t.name] = profile.from_counts(v, { name = t.name, hot = tables[i].hot,
        source = ("counts of %s"):format(o.counts) })
    end
    file:close()
    how = ("access counts of %s"):format(o.counts)
  elseif o.profile_steps then
    local d, derr = train.data(cfg, rows)
    if not d then return nil, derr end
    local lo = {}
    for k, v in pairs(d.train) do lo[k] = v end
    lo.batch_size = batch
    local loader, lerr = ur.data.loader(lo)
    if not loader then return nil, lerr end
    local out, info = profile.from_loader(loader, o.profile_steps, tables)
    loader:close()
    for _, t in ipairs(tables) do
      profiles[t.name] = out[t.name]
      t.hot = out[t.name].hot
    end
    how = ("a pass over %s of %s (%s)"):format(things(info.batches, "batch", "batches"), cfg.data.train,
      things(info.samples, "sample"))
  elseif synth then
    for i, t in ipairs(tables) do
      local st = synth.tables[i]
      profiles[t.name] = profile.zipf { rows = t.rows, s = st and (st.zipf or 0) or 0, hot = t.hot, name = t.name }
    end
    how = ("the Zipf exponents of %s"):format(cfg.data.train)
  else
    return nil, ("the config's data (%s) is not synthetic: give --profile-steps N or --counts CKPT"):format(
      cfg.data.train ~= "" and cfg.data.train or "none"), 2
  end
  local profile_seconds = clock() - t0

  local m = cfg.model
  local dense = { dense_features = m.dense_features, bottom = m.bottom_mlp, top = m.top_mlp,
                  interaction = m.interaction,
                  self_interaction = m.self_interaction, cross_layers = m.cross_layers, cross_rank = m.cross_rank,
                  tables = #tables, dim = e.dim, precision = m.precision, optimizer = cfg.optimizer.name,
                  momentum = cfg.optimizer.momentum, eval_batch = M.eval_batch(cfg, world) }
  -- the synthetic loader's values a sample (ids, dense features, label): its cost is in the step
  local loader
  if synth then
    local ids = 0
    for _, t in ipairs(tables) do ids = ids + t.hot end
    loader = { values = ids + (m.dense_features or 13) + 1 }
  end
  return { tables = tables, profiles = profiles, dense = dense, loader = loader, hints_every = e.hints.every,
           batch = batch, how = how, seconds = profile_seconds }
end

-- ---- a plan applied to a training config (uvmrec train --plan) ----

-- Whether the plan fits its own budget on every rank: nil, or why not (an edited plan, or one
-- written by hand, may not).  Within SUMS, as M.plan checks the plans it hands on.
function Plan:over_budget()
  local p = self.data
  -- a file cut to fewer ranks' figures passed: only the ranks it had were checked
  if #p.ranks ~= p.world then
    return ("the plan has the figures of %s for its %s: the file was edited; plan again"):format(
      things(#p.ranks, "rank"), type(p.world) == "number" and things(p.world, "rank") or tostring(p.world) .. " ranks")
  end
  for _, R in ipairs(p.ranks) do
    if type(R.hbm) ~= "number" or R.hbm > p.budget * (1 + SUMS) then
      return ("rank %d needs %s of HBM (%s), over the plan's budget of %s per rank"):format(R.rank or 0,
        fmt_bytes(R.hbm or 0), type(R.hbm) == "number" and ("%d bytes"):format(R.hbm) or "no figure",
        fmt_bytes(p.budget))
    end
  end
end

-- Sets training config cfg (uvmrec.train.config, loaded and checked) to the plan: each table's
-- placement, cache load factor, hint policy and allowance, and with several ranks its sharding
-- (the plan's config_keys), and the cache policy; the config's own per-table settings must
-- agree with the plan's. `where` names the plan in messages (its file).  Refuses a plan made for
-- another model (tables, rows, dims, dtypes), batch, pipeline or number of ranks (opts.world,
-- default 1), and one over its own HBM budget.  Returns cfg, or nil, message.
function Plan:apply(cfg, where, opts)
  opts = opts or {}
  local tconfig = require "uvmrec.train.config"
  local config = require "uvmrec.config"
  local p = self.data
  where = "--plan " .. tostring(where or "plan")
  local function bad(fmt, ...) return nil, where .. ": " .. fmt:format(...) end
  local e = cfg.embeddings
  local rows = tconfig.table_rows(cfg)
  if #p.tables ~= #rows then
    return bad("the plan has %s and the model %d (embeddings.rows): plan this config with uvmrec plan",
      things(#p.tables, "table"), #rows)
  end
  for i, t in ipairs(p.tables) do
    local name = "C" .. i
    local own = e.tables[name] or {}
    local dtype = own.dtype or e.dtype
    if t.name ~= name then
      return bad("table %d is named %s in the plan; the model's is %s", i, tostring(t.name), name)
    end
    if t.rows ~= rows[i] then
      return bad("table %s has %s rows in the plan and %d in the model (embeddings.rows, max_rows)", name,
        tostring(t.rows), rows[i])
    end
    if t.dim ~= e.dim then return bad("table %s has dim %s in the plan and %d in the model (embeddings.dim)", name,
      tostring(t.dim), e.dim) end
    if t.dtype ~= dtype then
      return bad("table %s is %s in the plan and %s in the model", name, tostring(t.dtype), dtype)
    end
    if t.optimizer ~= e.optimizer.name then
      return bad("table %s was planned with the %s optimizer (its state's bytes) and the model's is %s", name,
        tostring(t.optimizer), e.optimizer.name)
    end
  end
  local world = opts.world or 1
  if p.world ~= world then
    return bad("the plan is for %s and this run has %d", things(p.world, "rank"), world)
  end
  if p.batch * world ~= cfg.train.batch_size then
    return bad("the plan is for a batch of %d per rank and train.batch_size is %d over %s: its cache scratch "
      .. "and step times are for its batch; set train.batch_size=%d or plan again with --batch", p.batch,
      cfg.train.batch_size, things(world, "rank"), p.batch * world)
  end
  -- an evaluation's forward adds its batch's tensors to the model's arena (cost.dense): a plan
  -- covers evaluations in batches up to the one it was made for (a smaller one's fit in its
  -- tensors: the arena only grows), or none
  local ev = M.eval_batch(cfg, world)
  if ev > (p.eval_batch or 0) then
    return bad("the plan is for %s and this run evaluates in batches of %d per rank (eval.batch_size %d, "
      .. "eval.samples %d), whose activations it does not hold: plan this config again, or set eval.samples=0 "
      .. "(no evaluation)", (p.eval_batch or 0) > 0 and ("evaluation batches of %d per rank"):format(p.eval_batch)
      or "no evaluation", ev, cfg.eval.batch_size, cfg.eval.samples)
  end
  if (p.pipeline and true or false) ~= cfg.train.pipeline then
    return bad("the plan was made %s the prefetch pipeline and train.pipeline is %s", p.pipeline and "with" or
      "without", tostring(cfg.train.pipeline))
  end
  local over = self:over_budget()
  if over then return bad("%s", over) end
  local sets, any_cached = {}, false
  for _, t in ipairs(p.tables) do
    -- the keys are the table's choice (config_keys above): a file edited in one and not the
    -- other ran the keys while the plan's figures and its summary told the choice
    local _, want = config_keys(t.name, t, 0)
    for k, v in pairs(want) do
      local got = (t.config_keys or {})[k]
      if not k:match("%.hints%.allowance$") and got ~= v then
        return bad("table %s is %s %s in the plan and its config_keys set %s to %s: the file was edited; change a "
          .. "plan with plan:with (or plan again)", t.name, k:match("[^.]+$"), tostring(v), k, tostring(got))
      end
    end
    for k, v in pairs(t.config_keys or {}) do
      if want[k] == nil then
        return bad("table %s's config_keys set %s to %s, which its choice (%s) does not: the file was edited; change "
          .. "a plan with plan:with (or plan again)", t.name, k, tostring(v), tostring(t.placement))
      end
    end
    local keys = {}
    for k, v in pairs(t.config_keys or {}) do
      if not (world == 1 and k:match("%.sharding$") and v == "table_wise") then keys[#keys + 1] = k end
    end
    if #keys == 0 then return bad("table %s has no config_keys", t.name) end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local v = t.config_keys[k]
      sets[#sets + 1] = { k, type(v) == "number" and ("%.17g"):format(v) or tostring(v), v }
    end
    if world > 1 and t.sharding == "table_wise" then
      sets[#sets + 1] = { "embeddings.tables." .. t.name .. ".rank", ("%d"):format(t.ranks[1]), t.ranks[1] }
    end
    any_cached = any_cached or t.placement == "cached"
  end
  if any_cached then
    sets[#sets + 1] = { "embeddings.cache.policy", p.policy, p.policy }
  end
  -- the config's own values must be the plan's (the planner kept them, flagged as fixed)
  local function get(path)
    local v = cfg
    for key in path:gmatch("[^.]+") do
      if type(v) ~= "table" then return nil end
      v = v[key]
    end
    return v
  end
  for _, s in ipairs(sets) do
    local have = get(s[1])
    local per_table = s[1]:match("^embeddings%.tables%.")
    if have ~= nil and have ~= s[3] and (per_table or config.given(cfg, s[1])) then
      return bad("%s is %s in the config and %s in the plan: plan this config again (its own settings are kept)",
        s[1], tostring(have), tostring(s[3]))
    end
    local ok, err = config.set(cfg, tconfig.schema, s[1] .. "=" .. s[2])
    if not ok then
      if s[1]:match("%.sharding$") then
        return bad("table sharding %s: the training config has no per-table sharding key (%s)", s[2],
          tostring(err):gsub("^%-%-set ", ""))
      end
      return nil, (tostring(err):gsub("^%-%-set ", where .. ": "))
    end
  end
  local err = tconfig.check(cfg)
  if err then return nil, (err:gsub("%-%-set ", where .. ": ")) end
  if world > 1 then
    -- the ranks the run will use (uvmrec.dist.plan's, from the kinds) must be the plan's
    local dtabs = {}
    for i, t in ipairs(p.tables) do dtabs[i] = { name = t.name, rows = t.rows, dim = t.dim } end
    local ok, dp = pcall(require("uvmrec.dist.plan").plan, dtabs, tconfig.sharding(cfg), world)
    if not ok then return bad("%s", tostring(dp)) end
    for _, t in ipairs(p.tables) do
      local got = {}
      for j, sh in ipairs(dp.tables[t.name].shards) do got[j] = sh.rank end
      if table.concat(got, ",") ~= table.concat(t.ranks, ",") then
        return bad("table %s is %s on %s (%s) in the plan, and the run would place it on %s (uvmrec.dist.plan)",
          t.name, t.sharding, things(#t.ranks, "rank"), table.concat(t.ranks, ","), table.concat(got, ","))
      end
    end
  end
  return cfg
end

return M
