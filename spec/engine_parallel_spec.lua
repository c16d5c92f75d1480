-- The engine's parallel loop (engine/src/core/parallel.c: its pool of threads, and threads started
-- per loop where the pool is in use): engine/tests/parallel_check.c, built with parallel.c in it.
local h = require "helpers"
local cmd = require "command"

describe("the engine's parallel loop (parallel.c)", function()
  it("visits each index once in the loop's ranges, on the pool and off it: four callers at once, loops "
    .. "inside a range, a child of fork(); and says what the pool saves a loop", function()
    local dir = cmd.tmpdir()
    local exe, why = h.build_c("engine/tests/parallel_check.c", dir, "parallel_check", true)
    if not exe then return pending(why) end
    local out, err, code = cmd.sh("UR_NUM_THREADS=4 " .. exe)
    assert.equal(0, code, out .. err)
    assert.matches("parallel_check: ok, %d+ loops", out)
    assert.matches("a loop of 4 ranges of about %d+ us each: [%d.]+ us on the pool, [%d.]+ us with threads started",
                   out)
    cmd.rmdir(dir)
  end)
end)
