-- uvmrec.dist.plan: where each table's shards live, from a plan spec and the world size
-- (pure Lua, the same on every rank).
local plan = require("uvmrec.dist.plan").plan
local describe_plan = require("uvmrec.dist.plan").describe

local tables = {
  { name = "a", rows = 1000, dim = 16 }, { name = "b", rows = 3, dim = 8 },
  { name = "c", rows = 10, dim = 12 }, { name = "d", rows = 500, dim = 16 },
}

local function shards(p, name)
  local out = {}
  for i, s in ipairs(p.tables[name].shards) do out[i] = { s.rank, s.row0, s.rows, s.col0, s.dim } end
  return out
end

describe("uvmrec.dist.plan", function()
  it("puts whole tables on the least loaded rank, largest first", function()
    local p = plan(tables, "table_wise", 2)
    assert.same({ { 0, 0, 1000, 0, 16 } }, shards(p, "a"))
    assert.same({ { 1, 0, 500, 0, 16 } }, shards(p, "d"))
    assert.same({ { 1, 0, 10, 0, 12 } }, shards(p, "c"))
    assert.same({ { 1, 0, 3, 0, 8 } }, shards(p, "b"))
    assert.same({ [0] = 16000, [1] = 8000 + 120 + 24 }, p.load)
    local fixed = plan(tables, { default = "table_wise", a = { "table_wise", rank = 1 } }, 2)
    assert.same({ { 1, 0, 1000, 0, 16 } }, shards(fixed, "a"))
  end)

  it("splits rows in blocks of ceil(rows / W), blocks past the end empty", function()
    local p = plan(tables, "row_wise", 4)
    assert.same({ { 0, 0, 250, 0, 16 }, { 1, 250, 250, 0, 16 }, { 2, 500, 250, 0, 16 }, { 3, 750, 250, 0, 16 } },
      shards(p, "a"))
    assert.same({ { 0, 0, 1, 0, 8 }, { 1, 1, 1, 0, 8 }, { 2, 2, 1, 0, 8 }, { 3, 3, 0, 0, 8 } }, shards(p, "b"))
    assert.equal(3, p.tables.c.block)
    assert.same({ 9, 1 }, { shards(p, "c")[4][2], shards(p, "c")[4][3] })
  end)

  it("splits columns in multiples of 4, the first shards wider where the dim does not divide", function()
    local p = plan(tables, "column_wise", 3)
    assert.same({ { 0, 0, 1000, 0, 8 }, { 1, 0, 1000, 8, 4 }, { 2, 0, 1000, 12, 4 } }, shards(p, "a"))
    assert.same({ { 1, 0, 3, 0, 4 }, { 2, 0, 3, 4, 4 } }, shards(p, "b")) -- dim 8: two shards, from rank 1
    assert.same({ { 2, 0, 10, 0, 4 }, { 0, 0, 10, 4, 4 }, { 1, 0, 10, 8, 4 } }, shards(p, "c"))
    assert.same({ { 0, 0, 3, 0, 4 }, { 0, 0, 3, 4, 4 } },
      shards(plan(tables, { b = { "column_wise", ranks = { 0, 0 } } }, 1), "b"))
  end)

  it("replicates data-parallel tables and mixes kinds per table", function()
    local p = plan(tables, { default = "data_parallel", a = "row_wise", c = "column_wise" }, 2)
    assert.same({ "row_wise", "data_parallel", "column_wise", "data_parallel" },
      { p.tables.a.kind, p.tables.b.kind, p.tables.c.kind, p.tables.d.kind })
    assert.same({ { 0, 0, 3, 0, 8 }, { 1, 0, 3, 0, 8 } }, shards(p, "b"))
    assert.equal("a row_wise: rank 0 rows 0..499, rank 1 rows 500..999\nb data_parallel\n"
      .. "c column_wise: rank 0 cols 0..7, rank 1 cols 8..11\nd data_parallel", describe_plan(p))
    -- b's 3 rows over 4 ranks: blocks of 1, rank 3's past the table's end (it read "rows 3..2")
    assert.equal("a data_parallel\nb row_wise: rank 0 rows 0..0, rank 1 rows 1..1, rank 2 rows 2..2, rank 3 no rows\n"
      .. "c data_parallel\nd data_parallel",
      describe_plan(plan(tables, { default = "data_parallel", b = "row_wise" }, 4)))
  end)

  it("gives the tables C1..Cn the kinds in turn (the benches' and specs' mixed plan)", function()
    local in_turn = require("uvmrec.dist.plan").in_turn
    assert.same({ C1 = "table_wise", C2 = "row_wise", C3 = "column_wise", C4 = "data_parallel", C5 = "table_wise" },
      in_turn(5))
    assert.same({ C1 = "row_wise", C2 = "data_parallel", C3 = "row_wise" }, in_turn(3, { "row_wise", "data_parallel" }))
    assert.has_error(function() in_turn(0) end, "dist plan: in_turn: 0 tables; expected a count >= 1")
    assert.has_error(function() in_turn(2, { "row_wise", "diagonal" }) end,
      "dist plan: in_turn: sharding 'diagonal' is not table_wise, row_wise, column_wise or data_parallel")
    assert.has_error(function() in_turn(2, {}) end, "dist plan: in_turn: kinds is not a list of sharding kinds")
  end)

  it("names what a spec gets wrong", function()
    assert.has_error(function() plan(tables, "diagonal", 2) end,
      "dist plan: table 'a': sharding 'diagonal' is not table_wise, row_wise, column_wise or data_parallel")
    assert.has_error(function() plan(tables, { z = "row_wise" }, 2) end,
      "dist plan: sharding names table 'z', which the collection lacks")
    assert.has_error(function() plan({ { name = "m", rows = 9, dim = 4, pooling = "mean" } }, "row_wise", 2) end,
      "dist plan: table 'm': row_wise sharding pools partial bags by sum over the ranks, and the table pools by mean")
    assert.has_error(function() plan(tables, { b = { "column_wise", ranks = { 0, 1, 0 } } }, 2) end,
      "dist plan: table 'b': 3 column shards of a dim of 8; expected 1 to 2 (multiples of 4 columns)")
    -- a dim of 10 gave shards of 8 + 4 columns (12), one of 6 a single shard of 4
    assert.has_error(function() plan({ { name = "e", rows = 5, dim = 10 } }, "column_wise", 2) end,
      "dist plan: table 'e': column_wise splits whole groups of 4 columns, and its dim 10 is not a multiple of 4")
    assert.has_error(function() plan({ { name = "e", rows = 5, dim = 6 } }, "column_wise", 3) end,
      "dist plan: table 'e': column_wise splits whole groups of 4 columns, and its dim 6 is not a multiple of 4")
    -- options a kind does not take were ignored: a misspelled rank, a rank for row_wise
    assert.has_error(function() plan(tables, { a = { "table_wise", rnak = 1 } }, 2) end,
      "dist plan: table 'a': table_wise sharding takes no option 'rnak' (table_wise takes rank, column_wise ranks)")
    assert.has_error(function() plan(tables, { a = { "row_wise", rank = 1 } }, 2) end,
      "dist plan: table 'a': row_wise sharding takes no option 'rank' (table_wise takes rank, column_wise ranks)")
    assert.has_error(function() plan(tables, { default = { kind = "column_wise", rank = 1 } }, 2) end,
      "dist plan: table 'a': column_wise sharding takes no option 'rank' (table_wise takes rank, column_wise ranks)")
    assert.has_error(function() plan(tables, { a = { "table_wise", rank = 2 } }, 2) end,
      "dist plan: table 'a': table_wise on rank 2; expected 0..1")
    assert.has_error(function() plan(tables, "row_wise", 0) end, "dist plan: world 0 is not a number of ranks")
    -- inf passed, and the plan failed in Lua's words ("table overflow")
    assert.has_error(function() plan(tables, "row_wise", math.huge) end,
      "dist plan: world inf is not a number of ranks")
  end)
end)
