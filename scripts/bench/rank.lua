-- The CPU ranking of a table's access counters (ur_counts_rank's host path, the radix sort that
-- the hints manager's split and relayout read): CPU seconds a ranking of ROWS counters, order and
-- cumsum, on skewed counts (a power law over shuffled ids, most rows never read) and on uniform
-- random ones; the fastest and the median of --repeat rankings, and a checksum of the order (the
-- same for every build that ranks the same).
-- --device: the counters in HBM, ranked by the GPU (the hints manager's path for device tables), in
-- wall seconds, and ranked twice each repeat: into host outputs made for the call (order, cumsum
-- and by_id, 20 bytes a row, as tbe_stats.snapshot makes them: their first touch is in the time)
-- and into outputs already touched, so that the host's page faults stand apart from the sort; the
-- GPU's order, sums and counts by id checked against the CPU's, every row; and through
-- tbe_stats.snapshot into the last snapshot's outputs (its `into`: the manager's intervals).
--   uvmrec scripts/bench/rank.lua [--rows N] [--repeat N] [--device]
local cli = require "uvmrec.cli"
local cmd = cli.command {
  name = "scripts/bench/rank.lua",
  summary = "CPU seconds of ur_counts_rank on the host (skewed and uniform counts)",
  { "--rows N", "counters ranked", type = "whole", default = 8 * 1024 * 1024, min = 1 },
  { "--repeat N", "rankings of each", type = "whole", default = 5, min = 1 },
  { "--device", "counters in HBM ranked by the GPU: wall seconds into fresh and into touched outputs" },
}
local opt = cmd:parse(arg)
local ffi = require "ffi"
local ur = require "uvmrec"
local tensor = require "uvmrec.tensor"
local stats = require "uvmrec.tbe_stats"
local C = ur.C

local n = opt.rows
local counts = assert(tensor.tensor({ n }, { dtype = "i32" }))
local order = assert(tensor.tensor({ n }, { dtype = "i64" }))
local cumsum = assert(tensor.tensor({ n }, { dtype = "i64" }))
local c = ffi.cast("int32_t *", C.ur_tensor_data(counts.p))
local o = ffi.cast("int64_t *", C.ur_tensor_data(order.p))

-- a fixed generator (xorshift), so that every build ranks the same counts
local state = 88172645463325252ULL
local function rand()
  state = bit.bxor(state, bit.lshift(state, 13))
  state = bit.bxor(state, bit.rshift(state, 7))
  state = bit.bxor(state, bit.lshift(state, 17))
  return tonumber(state % 2147483648ULL) / 2147483648
end

local fills = {
  skewed = function()
    for i = 0, n - 1 do c[i] = 0 end
    -- the i-th hottest of a quarter of the rows read ~1e6 / i^1.05 times, at a random id
    for i = 1, math.floor(n / 4) do c[math.floor(rand() * n)] = math.floor(1e6 / i ^ 1.05) end
  end,
  uniform = function()
    for i = 0, n - 1 do c[i] = math.floor(rand() * 2147483647) end
  end,
}

local function checksum(op)
  local sum = 0ULL
  for i = 0, n - 1, 997 do sum = sum * 31ULL + ffi.cast("uint64_t", op[i]) end
  return (tostring(sum):gsub("ULL$", ""))
end

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local function ranked(st, where)
  assert(st == 0, ffi.string(C.ur_last_error()))
  assert(where == nil or where[0] == 1, "rank.lua --device: the GPU did not rank the counters (no room in HBM?)")
end

local on = ffi.new("int32_t[1]")
for _, name in ipairs { "skewed", "uniform" } do
  fills[name]()
  if not opt.device then
    local secs = {}
    for r = 1, opt["repeat"] do
      local t0 = os.clock()
      ranked(C.ur_counts_rank(counts.p, order.p, cumsum.p, nil, nil))
      secs[r] = os.clock() - t0
    end
    local m = median(secs)
    print(("%-8s rows %d: CPU s fastest %.3f, median %.3f (of %d); order checksum %s"):format(name, n, secs[1], m,
      #secs, checksum(o)))
  else
    -- the CPU's ranking, every output, to hold the GPU's against
    local want = { order = order, cumsum = cumsum, by_id = assert(tensor.tensor({ n }, { dtype = "i32" })) }
    ranked(C.ur_counts_rank(counts.p, want.order.p, want.cumsum.p, want.by_id.p, nil))
    local host_sum = checksum(o)
    order = assert(tensor.tensor({ n }, { dtype = "i64" }))
    cumsum = assert(tensor.tensor({ n }, { dtype = "i64" }))
    local dev = assert(counts:to("device"))
    local by = assert(tensor.tensor({ n }, { dtype = "i32" }))
    -- the touched outputs' first touch, and the GPU's first sort, before anything is timed
    ranked(C.ur_counts_rank(dev.p, order.p, cumsum.p, by.p, on), on)
    -- tbe_stats.snapshot's, ranked into by the next (its `into`), as the manager's intervals do
    local last = stats.snapshot(dev, name, true)
    local fresh, touched, fresh_cpu, reused = {}, {}, {}, {}
    for r = 1, opt["repeat"] do
      -- as tbe_stats.snapshot: outputs made for the call, their pages first touched by the ranking
      assert(ur.sync())
      local t0, c0 = C.ur_clock_seconds(), os.clock()
      local fo = assert(tensor.tensor({ n }, { dtype = "i64" }))
      local fc = assert(tensor.tensor({ n }, { dtype = "i64" }))
      local fb = assert(tensor.tensor({ n }, { dtype = "i32" }))
      ranked(C.ur_counts_rank(dev.p, fo.p, fc.p, fb.p, on), on)
      fresh[r], fresh_cpu[r] = C.ur_clock_seconds() - t0, os.clock() - c0
      fo:free(); fc:free(); fb:free()
      -- into outputs whose pages were touched
      local t1 = C.ur_clock_seconds()
      ranked(C.ur_counts_rank(dev.p, order.p, cumsum.p, by.p, on), on)
      touched[r] = C.ur_clock_seconds() - t1
      local t2 = C.ur_clock_seconds()
      last = stats.snapshot(dev, name, true, last)
      reused[r] = C.ur_clock_seconds() - t2
      assert(last.rank_on == "device", "rank.lua --device: the GPU did not rank the counters (no room in HBM?)")
    end
    -- the GPU's order, sums and counts by id are the CPU's, every one (ties by id in both), and
    -- the snapshot's, ranked into again and again, too
    for _, got in ipairs { { order = order, cumsum = cumsum, by_id = by }, last } do
      for _, k in ipairs { "order", "cumsum", "by_id" } do
        local ct = k == "by_id" and "int32_t *" or "int64_t *"
        local g, w = ffi.cast(ct, C.ur_tensor_data(got[k].p)), ffi.cast(ct, C.ur_tensor_data(want[k].p))
        for i = 0, n - 1 do
          if g[i] ~= w[i] then
            error(("rank.lua --device: %s %s[%d] is %s on the GPU%s, %s on the CPU"):format(name, k, i, tostring(g[i]),
              got == last and " through tbe_stats.snapshot" or "", tostring(w[i])), 0)
          end
        end
      end
    end
    last:free()
    local dev_sum = checksum(ffi.cast("int64_t *", C.ur_tensor_data(order.p)))
    assert(dev_sum == host_sum)
    print(("%-8s rows %d on the GPU: wall s into fresh outputs %.3f (CPU %.3f), into touched outputs %.3f, "
      .. "through tbe_stats.snapshot into the last one's %.3f (medians of %d); order checksum %s (the CPU's)"):format(
      name, n, median(fresh), median(fresh_cpu), median(touched), median(reused), #fresh, dev_sum))
    dev:free(); by:free(); order:free(); cumsum:free(); want.by_id:free()
    order, cumsum = want.order, want.cumsum
  end
end
