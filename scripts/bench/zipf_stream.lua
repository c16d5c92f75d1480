-- zipf_stream.lua: the id stream of the cache benches (cache.lua's hit rates, cache_decide.lua):
-- K batches of B samples with one id per table for T tables of N rows, each table's ids drawn
-- Zipf(s) (the continuous CDF inverted) and scattered over the rows by a bijection of [0, N).
-- Batches are {values = i64 [T * B], offsets = i64 [T * B + 1]} in host memory, key-major.
--   local batches = dofile(here .. "/zipf_stream.lua")(T, N, B, K, s)   -- math.random's state
local ffi = require "ffi"
local ur = require "uvmrec"
local C = ur.C

local function zipf_ids(n, s, count, salt, out, at)
  local a = 1 - s
  local big = (n + 1) ^ a - 1
  local function gcd(x, y)
    while y ~= 0 do x, y = y, x % y end
    return x
  end
  local mult = 2654435761 % n
  while mult > 1 and gcd(mult, n) ~= 1 do mult = mult - 1 end
  for k = 0, count - 1 do
    local r = math.floor((1 + math.random() * big) ^ (1 / a)) - 1
    if r >= n then r = n - 1 end
    out[at + k] = (r * mult + salt) % n
  end
end

return function(T, N, B, K, s)
  local batches = {}
  for k = 1, K do
    local v = assert(ur.tensor({ T * B }, { dtype = "i64", placement = "host" }))
    local off = assert(ur.tensor({ T * B + 1 }, { dtype = "i64", placement = "host" }))
    local pv = ffi.cast("int64_t *", C.ur_tensor_data(v.p))
    local po = ffi.cast("int64_t *", C.ur_tensor_data(off.p))
    for t = 0, T - 1 do zipf_ids(N, s, B, t * 7919, pv, t * B) end
    for j = 0, T * B do po[j] = j end
    batches[k] = { values = v, offsets = off }
  end
  return batches
end
