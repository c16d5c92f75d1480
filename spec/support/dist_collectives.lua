-- Run by spec/dist/comm_spec.lua as every rank of `uvmrec launch -n W`: each collective of the
-- job's communicator on random host tensors, against a reference each rank computes from every
-- rank's inputs (drawn from seeds by rank, so each rank knows them all).  Fails (exit 1) at the
-- first difference; prints "rank R: ok" and the communicator's statistics.
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local compare = require "uvmrec.compare"

local comm = assert(dist.init { cpu = true })
local rank, world = dist.rank(), dist.world()

local function draw(n, seed, dtype)
  local t = ur.tensor({ n }, { dtype = dtype or "f32" })
  if dtype == "i64" or dtype == "i32" then return t:uniform(-1000, 1000, seed) end
  return t:uniform(-1, 1, seed)
end

local function same(got, want, tol, what)
  assert(#got == #want, ("%s: %d values, expected %d"):format(what, #got, #want))
  local worst, i = compare.maxrel(got, want)
  if worst > (tol or 0) then
    error(("rank %d: %s[%d] is %.9g, expected %.9g"):format(rank, what, i, got[i], want[i]), 0)
  end
end

-- all_reduce: sum (f32 within rounding; i64 and f64 exactly), max, min; in place and not.
for _, case in ipairs { { "f32", "sum", 1e-6 }, { "i64", "sum", 0 }, { "f64", "sum", 1e-15 },
                        { "f32", "max", 0 }, { "i32", "min", 0 } } do
  local dtype, op, tol = case[1], case[2], case[3]
  local n = 37
  local mine = draw(n, 10 + rank, dtype)
  local want = {}
  for i = 1, n do want[i] = op == "sum" and 0 or nil end
  for r = 0, world - 1 do
    local v = draw(n, 10 + r, dtype):totable()
    for i = 1, n do
      if op == "sum" then want[i] = want[i] + v[i]
      elseif op == "max" then want[i] = math.max(want[i] or -math.huge, v[i])
      else want[i] = math.min(want[i] or math.huge, v[i]) end
    end
  end
  local out = ur.tensor({ n }, { dtype = dtype })
  assert(comm:all_reduce(mine, out, op))
  assert(comm:wait())
  same(out:totable(), want, tol, "all_reduce " .. dtype .. " " .. op)
  assert(comm:all_reduce(mine, op)) -- in place
  assert(comm:wait())
  same(mine:totable(), want, tol, "all_reduce in place " .. dtype .. " " .. op)
end

-- reduce_scatter: rank r gets the sum of block r.
do
  local n = 5
  local mine = draw(n * world, 20 + rank)
  local want = {}
  for i = 1, n do want[i] = 0 end
  for r = 0, world - 1 do
    local v = draw(n * world, 20 + r):totable()
    for i = 1, n do want[i] = want[i] + v[rank * n + i] end
  end
  local out = ur.tensor({ n })
  assert(comm:reduce_scatter(mine, out))
  assert(comm:wait())
  same(out:totable(), want, 1e-6, "reduce_scatter")
end

-- f16 and bf16 sums (MPI reduces no halves: the comm reduces them as f32 and rounds once, after an
-- all-to-all posted before them): the sum of every rank's values rounded to the dtype, within its
-- unit in the last place (the reference adds in another order).
for _, dtype in ipairs { "bf16", "f16" } do
  local n = 33
  local mine = draw(n * world, 50 + rank, dtype)
  local sum = {}
  for i = 1, n * world do sum[i] = 0 end
  for r = 0, world - 1 do
    for i, x in ipairs(draw(n * world, 50 + r, dtype):totable()) do sum[i] = sum[i] + x end
  end
  local rounded = ur.tensor({ n * world }, { dtype = dtype })
  for i = 1, n * world do rounded[i - 1] = sum[i] end
  local want, part_want = rounded:totable(), {}
  for i = 1, n do part_want[i] = want[rank * n + i] end
  local ulp = dtype == "bf16" and 2 ^ -8 or 2 ^ -11
  local ones, counts = ur.tensor({ world }):fill(1), {}
  for r = 1, world do counts[r] = 1 end
  local got, out = ur.tensor({ world }), ur.tensor({ n * world }, { dtype = dtype })
  local part = ur.tensor({ n }, { dtype = dtype })
  assert(comm:all_to_all(ones, got, counts, counts))
  assert(comm:all_reduce(mine, out))
  assert(comm:reduce_scatter(mine, part))
  assert(comm:wait())
  same(out:totable(), want, ulp, "all_reduce " .. dtype)
  same(part:totable(), part_want, ulp, "reduce_scatter " .. dtype)
  assert(comm:all_reduce(mine)) -- in place; MPI's barrier completes it, as a wait does
  assert(comm:barrier())
  same(mine:totable(), want, ulp, "all_reduce in place " .. dtype)
end

-- all_gather with uneven counts (rank r gives r + 2 values), i64 exactly.
do
  local counts, want = {}, {}
  for r = 0, world - 1 do
    counts[r + 1] = r + 2
    for _, x in ipairs(draw(r + 2, 30 + r, "i64"):totable()) do want[#want + 1] = x end
  end
  local out = ur.tensor({ #want }, { dtype = "i64" })
  assert(comm:all_gather(draw(rank + 2, 30 + rank, "i64"), out, counts))
  assert(comm:wait())
  same(out:totable(), want, 0, "all_gather")
end

-- broadcast from the last rank.
do
  local root = world - 1
  local t = rank == root and draw(9, 40, "i32") or ur.tensor({ 9 }, { dtype = "i32" }):fill(0)
  assert(comm:broadcast(t, root))
  assert(comm:wait())
  same(t:totable(), draw(9, 40, "i32"):totable(), 0, "broadcast")
end

-- all_to_all with uneven splits: rank s sends (s + d) % 3 + 1 values to rank d; two of them
-- grouped, as the input distribution groups lengths, values and weights.
do
  local function count(s, d) return (s + d) % 3 + 1 end
  local function block(s, d) return draw(count(s, d), 1000 * s + d) end
  local send, sc, rc, want = {}, {}, {}, {}
  for d = 0, world - 1 do
    sc[d + 1] = count(rank, d)
    for _, x in ipairs(block(rank, d):totable()) do send[#send + 1] = x end
  end
  for s = 0, world - 1 do
    rc[s + 1] = count(s, rank)
    for _, x in ipairs(block(s, rank):totable()) do want[#want + 1] = x end
  end
  local t = ur.tensor({ #send })
  for i, x in ipairs(send) do t[i - 1] = x end
  local out, out2 = ur.tensor({ #want }), ur.tensor({ #want })
  local doubled = ur.tensor({ #send })
  for i, x in ipairs(send) do doubled[i - 1] = 2 * x end
  assert(comm:group_start())
  assert(comm:all_to_all(t, out, sc, rc))
  assert(comm:all_to_all(doubled, out2, sc, rc))
  assert(comm:group_end())
  assert(comm:wait())
  same(out:totable(), want, 0, "all_to_all")
  for i = 1, #want do want[i] = 2 * want[i] end
  same(out2:totable(), want, 0, "grouped all_to_all")
end

assert(comm:barrier())
local s = comm:stats()
-- 14 all_reduces, 3 reduce_scatters, 1 all_gather, 1 broadcast, 4 all_to_alls, 3 barriers
assert(s.calls == 26, "calls: " .. s.calls)
assert(world == 1 or s.bytes_sent > 0, "bytes sent")
print(("rank %d: ok (%s; %d calls, %d bytes sent, %d received)"):format(rank, tostring(comm), s.calls,
  s.bytes_sent, s.bytes_received))
