-- Managed collisions' cost as the sizes grow, on the CPU: T tables of R rows, batches of B
-- samples of one id a table (uniform over an id space 10x the rows; fill rounds off, so the
-- candidates pile up), the remap's CPU time a step after three warm steps and a round that
-- filled the maps, then one eviction round of every table.  Run it at two sizes of one
-- argument: the remap should grow with the ids (T x B) and the round with the candidates
-- (n log n for the ranking), with nothing quadratic.
-- usage: uvmrec scripts/bench/collisions_scale.lua [TABLES] [ROWS] [BATCH] [STEPS]
local ur = require "uvmrec"
local mc = require "uvmrec.mc"

local o = require("uvmrec.cli").command {
  name = "scripts/bench/collisions_scale.lua",
  summary = "managed collisions' remap and eviction round at a given number of tables, rows and batch: CPU time",
  { "[TABLES]", "tables (one feature each)", type = "whole", default = 1 },
  { "[ROWS]", "rows a table", type = "whole", default = 1000000 },
  { "[BATCH]", "samples a batch (one id a table each)", type = "whole", default = 65536 },
  { "[STEPS]", "timed steps", type = "whole", default = 5 },
}:parse(arg)
local T, R, B, steps = o.tables, o.rows, o.batch, o.steps
local tabs, keys = {}, {}
for t = 1, T do
  tabs[t] = { name = "t" .. t, rows = R }
  keys[t] = "t" .. t
end
local m = assert(mc.new { tables = tabs, device = "cpu", evict_every = 2 ^ 40, max_candidates = 2 ^ 40, fill = false })
local n = T * B
local vals = ur.tensor({ n }, { dtype = "i64" })
local lens = ur.tensor({ n }, { dtype = "i32" }):fill(1)
math.randomseed(1)
local function batch()
  for i = 0, n - 1 do vals:set(i, math.random(0, 10 * R - 1)) end
  return ur.KJT { keys = keys, values = vals, lengths = lens }
end
local function rounds() for t = 1, T do assert(m:round("t" .. t)) end end
for _ = 1, 3 do assert(m:remap(batch())) end
rounds()
local spent = 0
for _ = 1, steps do
  local k = batch()
  local c0 = os.clock()
  assert(m:remap(k))
  spent = spent + os.clock() - c0
end
local s = assert(m:stats())
local c0 = os.clock()
rounds()
local round = os.clock() - c0
local s2 = assert(m:stats())
print(("tables %d, rows %d, batch %d: remap %.2f ms a step (%.3f us an id); an eviction round of every table "
  .. "%.3f s (%d candidates, %d evicted); CPU time"):format(T, R, B, 1000 * spent / steps, 1e6 * spent / steps / n,
  round, s.candidates, s2.evictions - s.evictions))
