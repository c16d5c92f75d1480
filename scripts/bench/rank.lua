-- The CPU ranking of a table's access counters (ur_counts_rank's host path, the radix sort that
-- the hints manager's split and relayout read): CPU seconds a ranking of ROWS counters, order and
-- cumsum, on skewed counts (a power law over shuffled ids, most rows never read) and on uniform
-- random ones; the fastest and the median of --repeat rankings, and a checksum of the order (the
-- same for every build that ranks the same).
--   uvmrec scripts/bench/rank.lua [--rows N] [--repeat N]
local cli = require "uvmrec.cli"
local cmd = cli.command {
  name = "scripts/bench/rank.lua",
  summary = "CPU seconds of ur_counts_rank on the host (skewed and uniform counts)",
  { "--rows N", "counters ranked", type = "whole", default = 8 * 1024 * 1024, min = 1 },
  { "--repeat N", "rankings of each", type = "whole", default = 5, min = 1 },
}
local opt = cmd:parse(arg)
local ffi = require "ffi"
local ur = require "uvmrec"
local tensor = require "uvmrec.tensor"
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

for _, name in ipairs { "skewed", "uniform" } do
  fills[name]()
  local secs = {}
  for r = 1, opt["repeat"] do
    local t0 = os.clock()
    local st = C.ur_counts_rank(counts.p, order.p, cumsum.p, nil, nil)
    secs[r] = os.clock() - t0
    assert(st == 0, ffi.string(C.ur_last_error()))
  end
  local sum = 0ULL
  for i = 0, n - 1, 997 do sum = sum * 31ULL + ffi.cast("uint64_t", o[i]) end
  table.sort(secs)
  print(("%-8s rows %d: CPU s fastest %.3f, median %.3f (of %d); order checksum %s"):format(name, n, secs[1],
    secs[math.floor((#secs + 1) / 2)], #secs, tostring(sum):gsub("ULL$", "")))
end
