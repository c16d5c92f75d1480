-- cache_run.lua: what the cache benches that measure hit rates (cache.lua's, cache_warm.lua's)
-- share.
--   local cache_run = dofile(here .. "/cache_run.lua")
--
-- cache_run.run: one cache size and policy over zipf_stream.lua's batches: T cached tables of N
-- rows (dim 4, on the CPU, SGD) whose cache holds `fraction` of the rows; batches 1..warm warm
-- it, the cache's counters are reset, and the rest are counted.  With a prefetch stream each
-- batch is prepared on it before the previous one retires (the pipeline's order: k-1's retire is
-- enqueued on the compute stream, then batch k prepared while k-1 may still run, its rows
-- locked).  Checks hits + misses + conflicts = distinct rows (else fail(message)); returns the
-- collection (to free) and the cache's stats.
--   local c, s = cache_run.run { inputs =, tables = T, rows = N, fraction =, policy =, decay = 0,
--                                warm = W, prefetch_stream = nil, fail = cmd.fail }
--
-- cache_run.free(inputs): frees zipf_stream.lua's batches.
--
-- cache_run.plot(out, png): cache_plot.py's PNG of the JSON lines in out; says which it made.
local M = {}

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

function M.run(o)
  local tables = {}
  for t = 1, o.tables do tables[t] = { name = "t" .. t, rows = o.rows, dim = 4, placement = "cached" } end
  local c = assert(require("uvmrec.tbe").new { tables = tables, device = "cpu", optimizer = "sgd",
    cache = { load_factor = o.fraction, policy = o.policy, decay_batches = o.policy == "lfu" and o.decay or 0 } })
  local function run(k0, k1)
    local prev
    for k = k0, k1 do
      if prev then assert(c:retire(prev, true)) end
      prev = assert(c:prepare(o.inputs[k], o.prefetch_stream))
    end
    if prev then assert(c:retire(prev, true)) end
  end
  run(1, o.warm)
  c.cache:reset_stats()
  run(o.warm + 1, #o.inputs)
  local s = c.cache:stats()
  if s.hits + s.misses + s.conflicts ~= s.unique then
    o.fail(("check: %d hits + %d misses + %d conflicts != %d distinct rows"):format(s.hits, s.misses,
           s.conflicts, s.unique))
  end
  return c, s
end

function M.free(inputs)
  for _, x in ipairs(inputs) do
    x.values:free()
    x.offsets:free()
  end
end

function M.plot(out, png)
  -- the first python3 on PATH may lack matplotlib where the system's has it
  local cmd = ("python3 %s/cache_plot.py %q --out %q 2>/dev/null || /usr/bin/python3 %s/cache_plot.py %q --out %q")
              :format(here, out, png, here, out, png)
  local ok = os.execute(cmd)
  if ok == 0 or ok == true then print("plot: " .. png) else print("plot: not made (" .. cmd .. " failed)") end
end

return M
