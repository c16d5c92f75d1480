-- uvmrec.dist.plan: where each embedding table lives over the ranks of a job.  Pure Lua, the
-- same on every rank (it reads only the tables and the world size), so every rank knows every
-- shard without a collective.
--
--   local plan = require("uvmrec.dist.plan").plan(tables, "row_wise", 4)
--   plan.tables.C3 --> {kind = "row_wise", shards = {{rank = 0, row0 = 0, rows = 250, col0 = 0,
--                       dim = 16}, ...}}
--
-- A spec is a kind for every table ("table_wise", "row_wise", "column_wise", "data_parallel"),
-- or {default = kind, [table] = kind or {kind, rank = r (table_wise) | ranks = {...}
-- (column_wise: the rank of each shard, in column order; a rank may hold several, as on one
-- rank {0, 0} cuts a table in two)}}.
--   table_wise     the whole table on one rank: the largest tables first, each to the rank
--                  holding the fewest bytes so far (ties: the lower rank);
--   row_wise       rows in W blocks of ceil(rows / W), block r on rank r (a block past the
--                  table's end has 0 rows); pools by sum;
--   column_wise    min(W, dim / 4) shards of whole multiples of 4 columns (the first ones one
--                  group of 4 wider where the dim does not divide), shard i on rank (t + i) % W
--                  for table index t; a dim that is not a multiple of 4 is refused;
--   data_parallel  a replica on every rank.
--
-- M.in_turn(n[, kinds]) is the spec giving the config's tables C1..Cn the kinds in turn
-- ({C1 = kinds[1], C2 = kinds[2], ...}; kinds: the four, in the order above): the benchmarks'
-- and the specs' "mixed" plan, with every kind on some table.
local lib = require "uvmrec.lib"

local M = {}

M.KINDS = { table_wise = true, row_wise = true, column_wise = true, data_parallel = true }
local KIND_LIST = "table_wise, row_wise, column_wise or data_parallel"

-- the option each kind takes in {kind, ...}
local OPTION = { rank = "table_wise", ranks = "column_wise" }

local IN_TURN = { "table_wise", "row_wise", "column_wise", "data_parallel" }

local function bad(msg, level) error("dist plan: " .. msg, level + 1) end

local function kind_of(spec, name, level)
  local own = type(spec) == "table" and spec[name]
  local k = own or (type(spec) == "table" and spec.default) or (type(spec) == "string" and spec) or nil
  local opts = {}
  if type(k) == "table" then
    opts = k
    k = k[1] or k.kind
  end
  if k == nil then k = "table_wise" end
  if not M.KINDS[k] then
    bad(("table '%s': sharding '%s' is not %s"):format(name, tostring(k), KIND_LIST), level + 1)
  end
  for key in pairs(opts) do
    if key ~= 1 and key ~= "kind" and OPTION[key] ~= k then
      bad(("table '%s': %s sharding takes no option '%s' (table_wise takes rank, column_wise ranks)")
          :format(name, k, tostring(key)), level + 1)
    end
  end
  return k, opts
end

function M.in_turn(n, kinds)
  kinds = kinds or IN_TURN
  if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then bad(("in_turn: %s tables; expected a count >= 1"):format(
    tostring(n)), 2) end
  if type(kinds) ~= "table" or #kinds == 0 then bad("in_turn: kinds is not a list of sharding kinds", 2) end
  for _, k in ipairs(kinds) do
    if not M.KINDS[k] then bad(("in_turn: sharding '%s' is not %s"):format(tostring(k), KIND_LIST), 2) end
  end
  local spec = {}
  for i = 1, n do spec["C" .. i] = kinds[(i - 1) % #kinds + 1] end
  return spec
end

-- tables: the collection's tables ({name, rows, dim, pooling, features, ...}, as
-- EmbeddingBagCollection takes them; pooling defaults to `pooling`); spec as above; world W.
function M.plan(tables, spec, world, pooling)
  if type(tables) ~= "table" or #tables == 0 then bad("expected the collection's list of tables", 2) end
  -- inf passed a check of its own and failed in a table's growth ("table overflow")
  if not lib.whole_in(world, 1, 2 ^ 31) then
    bad("world " .. tostring(world) .. " is not a number of ranks", 2)
  end
  if spec ~= nil and type(spec) ~= "string" and type(spec) ~= "table" then
    bad("expected a kind (" .. KIND_LIST .. ") or a table {default =, [table] = kind}", 2)
  end
  local names = {}
  for _, t in ipairs(tables) do names[t.name] = true end
  if type(spec) == "table" then
    for k in pairs(spec) do
      if k ~= "default" and not names[k] then
        bad(("sharding names table '%s', which the collection lacks"):format(tostring(k)), 2)
      end
    end
  end
  local plan = { world = world, tables = {}, order = {} }
  local load = {}
  for r = 0, world - 1 do load[r] = 0 end
  local wise = {}
  for i, t in ipairs(tables) do
    local kind, opts = kind_of(spec, t.name, 2)
    local p = { kind = kind, index = i - 1, rows = t.rows, dim = t.dim, shards = {} }
    plan.tables[t.name] = p
    plan.order[i] = t.name
    if kind == "row_wise" then
      local pool = t.pooling or pooling or "sum"
      if pool ~= "sum" then
        bad(("table '%s': row_wise sharding pools partial bags by sum over the ranks, and the table pools by %s")
            :format(t.name, pool), 2)
      end
      local block = math.ceil(t.rows / world)
      p.block = block
      for r = 0, world - 1 do
        local r0 = math.min(r * block, t.rows)
        p.shards[r + 1] = { rank = r, row0 = r0, rows = math.min(t.rows, r0 + block) - r0, col0 = 0, dim = t.dim }
      end
    elseif kind == "column_wise" then
      -- the shards' widths add up to the dim only in whole groups of 4 (tables take no other dim)
      if type(t.dim) ~= "number" or t.dim < 4 or t.dim % 4 ~= 0 then
        bad(("table '%s': column_wise splits whole groups of 4 columns, and its dim %s is not a multiple of 4")
            :format(t.name, tostring(t.dim)), 2)
      end
      local units = t.dim / 4
      local ranks = opts.ranks
      local n = ranks and #ranks or math.min(world, units)
      if n < 1 or n > units then
        bad(("table '%s': %d column shards of a dim of %d; expected 1 to %d (multiples of 4 columns)")
            :format(t.name, n, t.dim, units), 2)
      end
      local col = 0
      for s = 0, n - 1 do
        local width = 4 * (math.floor(units / n) + (s < units % n and 1 or 0))
        local r = ranks and ranks[s + 1] or (i - 1 + s) % world
        if type(r) ~= "number" or r < 0 or r >= world or r ~= math.floor(r) then
          bad(("table '%s': column shard %d on rank %s; expected 0..%d"):format(t.name, s, tostring(r), world - 1), 2)
        end
        p.shards[s + 1] = { rank = r, row0 = 0, rows = t.rows, col0 = col, dim = width }
        load[r] = load[r] + t.rows * width
        col = col + width
      end
    elseif kind == "data_parallel" then
      for r = 0, world - 1 do p.shards[r + 1] = { rank = r, row0 = 0, rows = t.rows, col0 = 0, dim = t.dim } end
    else
      wise[#wise + 1] = { t = t, p = p, rank = opts.rank }
    end
  end
  -- table_wise: fixed ranks first, then the largest tables to the least loaded ranks
  table.sort(wise, function(a, b)
    local sa, sb = a.t.rows * a.t.dim, b.t.rows * b.t.dim
    if sa ~= sb then return sa > sb end
    return a.p.index < b.p.index
  end)
  for _, w in ipairs(wise) do
    local r = w.rank
    if r ~= nil and (type(r) ~= "number" or r < 0 or r >= world or r ~= math.floor(r)) then
      bad(("table '%s': table_wise on rank %s; expected 0..%d"):format(w.t.name, tostring(r), world - 1), 2)
    end
    if r == nil then
      r = 0
      for k = 1, world - 1 do
        if load[k] < load[r] then r = k end
      end
    end
    load[r] = load[r] + w.t.rows * w.t.dim
    w.p.shards[1] = { rank = r, row0 = 0, rows = w.t.rows, col0 = 0, dim = w.t.dim }
  end
  plan.load = load
  return plan
end

-- A line per table, for people: "C3 row_wise: rank 0 rows 0..249, ...".
function M.describe(plan)
  local lines = {}
  for _, name in ipairs(plan.order) do
    local p = plan.tables[name]
    local parts = {}
    for _, s in ipairs(p.shards) do
      if p.kind == "row_wise" then
        -- a table of fewer rows than the ranks leaves the last ranks' blocks past its end, empty
        parts[#parts + 1] = s.rows > 0 and ("rank %d rows %d..%d"):format(s.rank, s.row0, s.row0 + s.rows - 1)
                            or ("rank %d no rows"):format(s.rank)
      elseif p.kind == "column_wise" then
        parts[#parts + 1] = ("rank %d cols %d..%d"):format(s.rank, s.col0, s.col0 + s.dim - 1)
      elseif p.kind == "table_wise" then parts[#parts + 1] = ("rank %d"):format(s.rank) end
    end
    lines[#lines + 1] = ("%s %s%s"):format(name, p.kind, #parts > 0 and ": " .. table.concat(parts, ", ") or "")
  end
  return table.concat(lines, "\n")
end

return M
