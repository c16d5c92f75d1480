-- The engine's parallel loop (engine/src/core/parallel.c: its pool of threads, and threads started
-- per loop where the pool is in use): engine/tests/parallel_check.c, built with parallel.c in it.
local h = require "helpers"

describe("the engine's parallel loop (parallel.c)", function()
  it("visits each index once in the loop's ranges, on the pool and off it: four callers at once, loops "
    .. "inside a range, a child of fork(); and says what the pool saves a loop", function()
    local out, why = h.run_c_check("parallel_check", "UR_NUM_THREADS=4")
    if not out then return pending(why) end
    assert.matches("parallel_check: ok, %d+ loops", out)
    assert.matches("a loop of 4 ranges of about %d+ us each: [%d.]+ us on the pool, [%d.]+ us with threads started",
                   out)
  end)
end)
