-- Access profiles of embedding tables, for the planner: how often each row is read, as
-- "classes" of rows that share one probability (rows ranked hottest first), so that every
-- quantity the cost model needs is a short sum over classes:
--   P:coverage(x)       share of lookups taken by the hottest fraction x of the rows
--   P:top(k)            the same for the hottest k rows
--   P:distinct(L)       expected distinct rows among L lookups (a batch's)
--   P:distinct_beyond(k, L)  the same, counting only rows ranked below the hottest k
-- Profiles come from a Zipf exponent (the synthetic generator's distribution, or the continuous
-- one of scripts/bench/zipf_stream.lua), from per-row access counts (a checkpoint's, or a pass
-- over data), or from a pass over batches of a loader.
--
--   local profile = require "uvmrec.planner.profile"
--   local p = profile.zipf { rows = 10131227, s = 1.05, hot = 1 }
--   p:coverage(0.01), p:distinct(65536)
local ffi = require "ffi"
local lib = require "uvmrec.lib"

local M = {}
local Profile = {}
Profile.__index = Profile
M.Profile = Profile

-- ---- numerics ----

local log, exp, abs, floor, min, max = math.log, math.exp, math.abs, math.floor, math.min, math.max

local function log1p(x)
  if abs(x) < 1e-4 then return x * (1 - x * (0.5 - x / 3)) end
  return log(1 + x)
end
M.log1p = log1p

local function expm1(x)
  if abs(x) < 1e-5 then return x * (1 + x * (0.5 + x / 6)) end
  return exp(x) - 1
end
M.expm1 = expm1

-- The chance a row of probability p is read at least once among L lookups.
local function seen(p, L)
  if p <= 0 then return 0 end
  if p >= 1 then return 1 end
  return -expm1(L * log1p(-p))
end
M.seen = seen

-- integral of x^-s over [a, b], stable near s = 1
local function power_integral(a, b, s)
  local lr = log(b / a)
  local e = (1 - s) * lr
  local f = abs(e) < 1e-12 and 1 or expm1(e) / e
  return exp((1 - s) * log(a)) * lr * f
end
M.power_integral = power_integral

-- sum of k^-s for k = a .. b (Euler-Maclaurin with two corrections; a >= 64 keeps it exact to
-- about 1e-12 relative)
local function power_sum(a, b, s)
  if a == b then return exp(-s * log(a)) end
  local fa, fb = exp(-s * log(a)), exp(-s * log(b))
  return power_integral(a, b, s) + (fa + fb) / 2 + s * (fa / a - fb / b) / 12
end

-- ---- construction ----

-- classes: n (rows) and p (each row's probability), p descending; the profile keeps cumulative
-- rows and mass for the rank queries.
local function new(rows, n, p, opts)
  opts = opts or {}
  local self = setmetatable({ rows = rows, n = n, p = p, hot = opts.hot or 1, kind = opts.kind,
                              source = opts.source, name = opts.name, measured = opts.measured }, Profile)
  local cr, cm = { [0] = 0 }, { [0] = 0 }
  local total = 0
  for i = 1, #n do total = total + n[i] * p[i] end
  if total <= 0 then
    -- nothing counted: every row equally likely (the planner's most cautious guess)
    n, p = { rows }, { 1 / rows }
    self.n, self.p, self.uncounted = n, p, true
    total = 1
  end
  for i = 1, #n do
    p[i] = p[i] / total
    cr[i] = cr[i - 1] + n[i]
    cm[i] = cm[i - 1] + n[i] * p[i]
  end
  self.cum_rows, self.cum_mass = cr, cm
  if abs(cr[#n] - rows) > 0.5 then
    error(("profile: classes hold %d rows; the table has %d"):format(cr[#n], rows), 3)
  end
  return self
end
M.new = function(rows, n, p, opts) return new(rows, n, p, opts) end

-- Zipf(s) over ranks 1..rows, P(k) proportional to k^-s: the synthetic generator's draw
-- (engine/src/data/synth.h samples it exactly by rejection-inversion), or variant "continuous":
-- the rank floor(x) - 1 of x with density proportional to x^-s on [1, rows + 1]
-- (scripts/bench/zipf_stream.lua).  s = 0 is uniform.  opts: rows, s, hot (ids per sample),
-- variant, head (ranks kept one per class, 64), ratio (bin growth beyond, 1.1: within a bin
-- the probabilities differ by at most 10%: distinct rows and hit rates move by ~1e-4, a top-k share
-- that ends inside a bin by up to ~3e-4).
function M.zipf(o)
  local rows, s = o.rows, o.s or o.zipf or 0
  if type(rows) ~= "number" or rows < 1 or rows ~= floor(rows) or rows == math.huge then
    error("profile.zipf: rows must be a whole number >= 1", 2)
  end
  -- NaN and math.huge passed, and the planner then failed in its partition, indexing nil
  if type(s) ~= "number" or not (s >= 0 and s < math.huge) then
    error("profile.zipf: s must be a finite number >= 0", 2)
  end
  local variant = o.variant or "discrete"
  if variant ~= "discrete" and variant ~= "continuous" then
    error("profile.zipf: variant must be discrete or continuous", 2)
  end
  local opts = { hot = o.hot, kind = "zipf", name = o.name,
                 source = o.source or ("zipf %g over %s (%s)"):format(s, lib.things(rows, "row"), variant) }
  if s == 0 then return new(rows, { rows }, { 1 }, opts) end
  local head, ratio = min(o.head or 64, rows), o.ratio or 1.1
  local n, p = {}, {}
  local function mass(a, b) -- ranks a..b
    if variant == "continuous" then return power_integral(a, b + 1, s) end
    if a < 64 then
      local m = 0
      for k = a, b do m = m + exp(-s * log(k)) end
      return m
    end
    return power_sum(a, b, s)
  end
  for k = 1, head do
    n[k], p[k] = 1, mass(k, k)
  end
  local a = head + 1
  while a <= rows do
    local b = min(rows, max(a, floor(a * ratio)))
    local m = mass(a, b)
    n[#n + 1], p[#p + 1] = b - a + 1, m / (b - a + 1)
    a = b + 1
  end
  local self = new(rows, n, p, opts)
  self.s, self.variant = s, variant
  return self
end

-- Merges neighbouring classes whose probabilities are within `ratio` of each other (zeros
-- stay apart), so profiles from counts stay short.
local function compress(n, p, ratio)
  local on, op = {}, {}
  local i = 1
  while i <= #n do
    local rows, m, hi = n[i], n[i] * p[i], p[i]
    local j = i + 1
    while j <= #n and p[j] > 0 and hi > 0 and hi <= p[j] * ratio do
      rows, m = rows + n[j], m + n[j] * p[j]
      j = j + 1
    end
    on[#on + 1], op[#op + 1] = rows, m / rows
    i = j
  end
  return on, op
end
M.compress = compress

-- The message for a count below 0 (the ranking read it as 0: a corrupt counter became a cold row).
local function negative(name, row, c, item)
  return ("profile.from_counts: %srow %d%s has count %d; expected counts >= 0"):format(
    name ~= nil and ("table %s "):format(lib.shown(name)) or "", row, item and (" (counts[%d])"):format(item) or "",
    c)
end

-- From per-row access counts: a uvmrec tensor (i32, as tbe:counts() and checkpoints hold them)
-- or a Lua list, each 0 or more.  opts: hot, name, source, ratio (merging classes, 1.01), measured.
function M.from_counts(counts, opts)
  opts = opts or {}
  local tensor = require "uvmrec.tensor"
  local own
  if type(counts) == "table" then
    for i = 1, #counts do
      if counts[i] < 0 then error(negative(opts.name, i - 1, counts[i], i), 2) end
    end
    own = assert(tensor.tensor({ #counts }, { dtype = "i32", placement = "host" }))
    local q = ffi.cast("int32_t *", require("uvmrec.lib").C.ur_tensor_data(own.p))
    for i = 1, #counts do q[i - 1] = counts[i] end
    counts = own
  end
  if counts:dtype() ~= "i32" then error("profile.from_counts: counts must be i32 (got " .. counts:dtype() .. ")", 2) end
  local host = counts
  if counts:placement() ~= "host" and counts:placement() ~= "pinned" then host = assert(counts:to("host")) end
  if not own then -- one pass over the counters (a list was checked before its copy)
    local q = ffi.cast("const int32_t *", require("uvmrec.lib").C.ur_tensor_data(host.p))
    for r = 0, host:numel() - 1 do
      if q[r] < 0 then
        local c = q[r]
        if host ~= counts then host:free() end
        error(negative(opts.name, r, c), 2)
      end
    end
  end
  local a = require("uvmrec.tbe_stats").snapshot(host, opts.name)
  local rows = a.rows
  local cs = a._c
  local n, p = {}, {}
  local prev, run, r = nil, 0, 0
  local last = 0
  while r < rows do
    local c = tonumber(cs[r]) - last
    last = tonumber(cs[r])
    if c == prev then
      run = run + 1
    else
      if prev then n[#n + 1], p[#p + 1] = run, prev end
      prev, run = c, 1
    end
    r = r + 1
  end
  if prev then n[#n + 1], p[#p + 1] = run, prev end
  local total = a.total
  a:free()
  if host ~= counts then host:free() end
  if own then own:free() end
  n, p = compress(n, p, opts.ratio or 1.01)
  local self = new(rows, n, p, { hot = opts.hot, kind = "counts", name = opts.name, measured = opts.measured,
                                 source = opts.source or ("access counts (%s)"):format(lib.things(total, "lookup")) })
  self.lookups = total
  return self
end

-- A pass over `steps` batches of a loader (ur.data.loader): per table, the rows each lookup
-- read (counted) and the distinct rows of each batch (measured).  tables: {name=, rows=} in
-- the loader's key order.  Returns {[name] = profile}, and the pass's {batches, samples,
-- seconds}.
function M.from_loader(loader, steps, tables)
  local tensor = require "uvmrec.tensor"
  local C = require("uvmrec.lib").C
  local T = #tables
  local cnt, stamp, cp, sp = {}, {}, {}, {}
  local looked, distinct = {}, {}
  for t = 1, T do
    cnt[t] = assert(tensor.tensor({ tables[t].rows }, { dtype = "i32", placement = "host" }))
    stamp[t] = assert(tensor.tensor({ tables[t].rows }, { dtype = "i32", placement = "host" }))
    cnt[t]:fill(0)
    stamp[t]:fill(0)
    cp[t] = ffi.cast("int32_t *", C.ur_tensor_data(cnt[t].p))
    sp[t] = ffi.cast("int32_t *", C.ur_tensor_data(stamp[t].p))
    looked[t], distinct[t] = 0, 0
  end
  local t0 = C.ur_clock_seconds()
  local batches, samples = 0, 0
  while batches < steps do
    local b = loader:next()
    if not b then break end
    batches, samples = batches + 1, samples + b.size
    local kj = b.sparse
    -- read through raw pointers below: a batch not known checked (a loader of the caller's own)
    -- is checked first; the engine's loader makes them checked, at no cost here
    assert(require("uvmrec.kjt").need_checked(kj, "planner profile: batch " .. batches, 2))
    local v, off = kj:values(), kj:offsets()
    local stride = kj:stride()
    local vp = ffi.cast("int64_t *", C.ur_tensor_data(v.p))
    local op = ffi.cast("int64_t *", C.ur_tensor_data(off.p))
    for t = 1, T do
      local lo, hi = tonumber(op[(t - 1) * stride]), tonumber(op[t * stride])
      local c, st, rows = cp[t], sp[t], tables[t].rows
      local u = 0
      for j = lo, hi - 1 do
        local id = vp[j]
        if id >= 0 and id < rows then
          c[id] = c[id] + 1
          if st[id] ~= batches then
            st[id] = batches
            u = u + 1
          end
        end
      end
      looked[t] = looked[t] + (hi - lo)
      distinct[t] = distinct[t] + u
    end
    v:free()
    off:free()
  end
  local out = {}
  for t = 1, T do
    local L = batches > 0 and looked[t] / batches or 0
    out[tables[t].name] = M.from_counts(cnt[t], {
      name = tables[t].name, hot = samples > 0 and looked[t] / samples or 1,
      source = ("a pass over %s (%s)"):format(lib.things(batches, "batch", "batches"), lib.things(samples, "sample")),
      measured = { lookups_per_batch = L, distinct_per_batch = batches > 0 and distinct[t] / batches or 0 } })
    cnt[t]:free()
    stamp[t]:free()
  end
  return out, { batches = batches, samples = samples, seconds = C.ur_clock_seconds() - t0 }
end

-- ---- queries ----

-- The class holding rank position k (0 < k <= rows, fractional allowed) and the rows before it.
local function class_at(self, k)
  local cr = self.cum_rows
  local lo, hi = 1, #self.n
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if cr[mid] < k then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- Share of lookups taken by the hottest k rows (k may be fractional: rows of a class are alike).
function Profile:top(k)
  if k <= 0 then return 0 end
  if k >= self.rows then return 1 end
  local i = class_at(self, k)
  return min(1, self.cum_mass[i - 1] + (k - self.cum_rows[i - 1]) * self.p[i])
end

-- Share of lookups taken by the hottest fraction x of the rows.
function Profile:coverage(x) return self:top(x * self.rows) end

-- The coverage curve at fractions xs (default 0.1% to 100%): {{x, coverage}, ...}.
M.CURVE_POINTS = { 0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1 }
function Profile:curve(xs)
  local out = {}
  for i, x in ipairs(xs or M.CURVE_POINTS) do out[i] = { x, self:coverage(x) } end
  return out
end

-- The classes at a batch of L lookups, kept on the profile per L: per class the chance a row is
-- read (q, as seen gives it) and log(1 - q) (lq), and the expected distinct rows (distinct, the
-- sum distinct_raw makes).  The planner prices 70 options a table on 8 ranks at one or two L: the
-- cache's hit rates (planner.hitrate) and a managed prefix's cold rows (distinct_beyond) read them
-- here instead of taking a logarithm and an exponential a class each time.
function M.batch(P, L)
  local views = P._batch
  if not views then views = {} P._batch = views end
  local v = views[L]
  if v then return v end
  local q, lq = {}, {}
  local u = 0
  for i = 1, #P.n do
    local qi = seen(P.p[i], L)
    q[i] = qi
    lq[i] = qi >= 1 and -math.huge or log1p(-qi)
    u = u + P.n[i] * qi
  end
  v = { q = q, lq = lq, distinct = u, L = L }
  views[L] = v
  return v
end

-- Expected distinct rows among L lookups, from the classes alone (M.batch's sum, where a view at
-- L is kept; not made here: a profile asked at many L would keep a view at each).
function Profile:distinct_raw(L)
  local v = self._batch and self._batch[L]
  if v then return v.distinct end
  local s = 0
  local n, p = self.n, self.p
  for i = 1, #n do s = s + n[i] * seen(p[i], L) end
  return s
end

-- Expected distinct rows among L lookups.  A profile counted over a short pass has never seen
-- part of the tail, so its classes give too few distinct rows; where the pass measured the
-- distinct rows of its batches, the classes' figure is scaled to agree with it there.
function Profile:distinct(L)
  local raw = self:distinct_raw(L)
  local m = self.measured
  if m and m.lookups_per_batch and m.lookups_per_batch > 0 and m.distinct_per_batch and m.distinct_per_batch > 0 then
    self._scale = self._scale or m.distinct_per_batch / self:distinct_raw(m.lookups_per_batch)
    return raw * self._scale
  end
  return raw
end

-- Expected distinct rows among L lookups that rank below the hottest k rows (the rows a
-- measured pass never saw, see distinct, rank below every counted one).
function Profile:distinct_beyond(k, L)
  if k >= self.rows then return 0 end
  local extra = self.measured and (self:distinct(L) - self:distinct_raw(L)) or 0
  if k <= 0 then return self:distinct_raw(L) + extra end
  local i0 = class_at(self, k)
  local n, q = self.n, M.batch(self, L).q
  local s = (self.cum_rows[i0] - k) * q[i0]
  for i = i0 + 1, #n do s = s + n[i] * q[i] end
  return s + extra
end

-- Rows read at least once in a very long run (rows of nonzero probability).
function Profile:support()
  local s = 0
  for i = 1, #self.n do if self.p[i] > 0 then s = s + self.n[i] end end
  return s
end

-- A plain summary for plan files and printing.
function Profile:summary()
  local c = {}
  for i, pt in ipairs(self:curve()) do c[i] = { pt[1], pt[2] } end
  return { rows = self.rows, hot = self.hot, kind = self.kind, source = self.source, coverage = c,
           s = self.s, measured = self.measured }
end

return M
