-- VBE over ranks (uvmrec.dist.sharded's set_vbe): each rank sends, per feature, its distinct bags
-- and every sample's bag; the receiving shards pool the distinct bags and expand the pooled rows.
-- The outputs equal VBE off bit for bit on the same tables, the tables within rounding after
-- steps (the gradients of a repeated bag are summed before they reach its rows), and the input
-- exchange's bytes change by the measured dedup factor (scripts/bench/dist_vbe.lua over 4 ranks
-- as processes on the CPU, Zipf ids).
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local command = require "command"
local h = require "helpers"

local function opts()
  return { tables = { { name = "a", rows = 100, dim = 16, features = { "f", "g" } },
                      { name = "b", rows = 7, dim = 8, dtype = "f16" }, { name = "c", rows = 30, dim = 12 } },
           optimizer = { "adam", lr = 0.05 }, device = "cpu", seed = 5 }
end

-- Bags drawn from few ids, so many repeat.
local function batch(rng, n) return h.weighted_kjt(rng, { "f", "g", "b", "c" }, n, 3, 3, 2) end

describe("VBE over ranks", function()
  for _, plan in ipairs { "table_wise", "row_wise", "column_wise", "data_parallel" } do
    it("gives VBE off's outputs bit for bit and its tables within rounding in a world of one: " .. plan, function()
      local comm = assert(dist.comm())
      local off, on = dist.shard(opts(), plan, comm), dist.shard(opts(), plan, comm):set_vbe(true)
      local rng = h.rng(3)
      for step = 1, 3 do
        local kjt = batch(rng, 16)
        local a, b = off:forward(kjt):totable(), on:forward(kjt):totable()
        if step == 1 then assert.same(a, b) end
        for i = 1, #a do assert.near(a[i], b[i], 1e-5 * math.max(math.abs(a[i]), 1)) end
        local g = ur.tensor({ 16, off.out_dim }):uniform(-1, 1, step)
        off:backward(kjt, g)
        on:backward(kjt, g)
        for _, t in ipairs { "a", "b", "c" } do
          local x, y = off:full_table(t):totable(), on:full_table(t):totable()
          for i = 1, #x do assert.near(x[i], y[i], 1e-5 * math.max(math.abs(x[i]), 1e-2), t) end
        end
      end
      off:free()
      on:free()
    end)
  end

  h.mpi_it("sends fewer bytes over 4 ranks where bags repeat, with VBE off's outputs", function()
    local out, err, code = command.sh(command.bin()
      .. " launch -n 4 scripts/bench/dist_vbe.lua --batch 16384 --steps 2")
    assert.equal(0, code, out .. err)
    assert.matches("step 1 input exchange %d+ bytes off, %d+ on %([%d.]+x%); outputs equal; tables within", out)
    for w in out:gmatch("tables within (%S+) relative") do assert.is_true(tonumber(w) < 1e-4, w) end
    local off, on, factor = out:match("vbe: 4 ranks, global batch 16384, synthetic:tiny, plan mixed: (%d+) bytes off, "
      .. "(%d+) on, factor ([%d.]+)")
    assert.is_truthy(off, out)
    assert.is_true(tonumber(on) < tonumber(off), out)
    assert.is_true(tonumber(factor) > 1.1, out)
  end)
end)
