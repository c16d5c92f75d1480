-- Hit rates of the software cache (engine/src/embedding/cache.c) from an access profile, per batch: a
-- batch of L lookups reads row i (probability p_i per lookup) with q_i = 1 - (1 - p_i)^L, and
-- the cache's hit rate is hits over the batch's distinct rows, as its own counters count it.
--
-- LRU, Che's approximation under independent references: a row is cached when it was read in
-- the last T batches, T the characteristic time at which the expected distinct rows of T
-- batches fill the slots: sum_i 1 - (1 - q_i)^T = slots.  Hit rate = sum_i q_i (1 - (1 - q_i)^T)
-- / sum_i q_i.
--
-- LFU: the cache keeps the most counted rows, set by set (32 ways, a row's set chosen by a
-- hash): a row stays when fewer than `cap` hotter rows share its set, where cap is the ways
-- minus the misses each set takes per batch (each miss of a batch takes a way of its own, the
-- lowest counted one not locked, so a set that misses m rows in a batch keeps only 32 - m
-- stable rows); the hotter rows sharing a set are Poisson((rank - 1) / sets).  The ways the
-- misses took hold the last batch's missed rows, so a row outside the stable part still hits
-- when it was read the batch before.  Misses and cap are solved together.  With one set of all
-- slots and few misses this is "the top c rows": the coverage of the hottest c.
--
-- Finite runs (the benchmark's view): after k batches a row can only hit if it was read
-- before; `window` gives the rates over batches k0..k1 of a run started cold, split into
-- first-touch misses (rows never read before) and warm hits (hits over rows read before).
local profile = require "uvmrec.planner.profile"

local M = {}
local exp, log, floor, min, max = math.exp, math.log, math.floor, math.min, math.max
local log1p = profile.log1p

M.WAYS = 32

-- sum_i n_i (1 - (1 - q_i)^T) and sum_i n_i q_i (1 - q_i)^T (misses a batch) at T batches.
local function occupancy(P, v, T)
  local n, q, lq = P.n, v.q, v.lq
  local c, m = 0, 0
  for i = 1, #n do
    local stay = exp(T * lq[i]) -- (1 - q)^T
    c = c + n[i] * (1 - stay)
    m = m + n[i] * q[i] * stay
  end
  return c, m
end

-- LRU by Che's approximation.  Returns {hit_rate, misses (rows a batch), distinct, T}.
function M.lru(P, L, slots) return M.lru_many(P, L, { slots })[1] end

-- LRU at several cache sizes (slots each): T bracketed on a grid of log T kept per profile and
-- batch (each point's occupancy computed when first read), then found by regula falsi (Illinois)
-- in log space.
function M.lru_many(P, L, sizes)
  local v = profile.batch(P, L)
  local U = v.distinct
  local support = 0
  for i = 1, #P.n do if v.q[i] > 0 then support = support + P.n[i] end end
  -- the grid: point k (1 .. NG) at log T = k - 13 (-12 .. 45), its occupancy kept per profile and
  -- batch, computed when a search first reads it (a bisection over the points it rises through:
  -- a few of the 58 a size, not all of them a profile); the bracket is the one a walk up the
  -- points finds
  local NG = 58
  local function lt(k) return k - 13 end
  local gc = v.lru_grid
  if not gc then
    gc = {}
    v.lru_grid = gc
  end
  local function at(k)
    local c = gc[k]
    if not c then
      c = (occupancy(P, v, exp(lt(k))))
      gc[k] = c
    end
    return c
  end
  local out = {}
  for j, slots in ipairs(sizes) do
    if U <= 0 then
      out[j] = { hit_rate = 1, misses = 0, distinct = 0, T = math.huge }
    elseif slots >= support then
      out[j] = { hit_rate = 1, misses = 0, distinct = U, T = math.huge }
    elseif slots <= 0 then
      out[j] = { hit_rate = 0, misses = U, distinct = U, T = 0 }
    else
      -- k: the last point before the first one at or above slots (the occupancy rises with T), or
      -- the last point
      local lo, hi = 2, NG + 1
      while lo < hi do
        local mid = floor((lo + hi) / 2)
        if at(mid) < slots then lo = mid + 1 else hi = mid end
      end
      local k = lo - 1
      local a, b = lt(k), lt(min(k + 1, NG))
      local fa, fb = log(max(at(k), 1e-300)) - log(slots), log(max(at(min(k + 1, NG)), 1e-300)) - log(slots)
      local T
      if fa >= 0 then T = exp(a)
      elseif fb <= 0 then T = exp(b)
      else
        local side = 0
        for _ = 1, 30 do
          local x = b - fb * (b - a) / (fb - fa)
          local fx = log(max((occupancy(P, v, exp(x))), 1e-300)) - log(slots)
          if math.abs(fx) < 1e-9 then a, b = x, x break end
          if fx < 0 then
            a, fa = x, fx
            if side == -1 then fb = fb / 2 end
            side = -1
          else
            b, fb = x, fx
            if side == 1 then fa = fa / 2 end
            side = 1
          end
          if b - a < 1e-9 then break end
        end
        T = exp((a + b) / 2)
      end
      local _, m = occupancy(P, v, T)
      out[j] = { hit_rate = 1 - m / U, misses = m, distinct = U, T = T }
    end
  end
  return out
end

-- P(Poisson(mu) <= k)
local function poisson_cdf(mu, k)
  if mu <= 0 then return 1 end
  if k < 0 then return 0 end
  if mu > 745 then
    -- e^-mu underflows: far above k (k < 4096 here) the CDF is 0 to double precision
    if mu > 4 * k + 100 then return 0 end
    local lt, s = -mu, 0
    for j = 0, k do
      if j > 0 then lt = lt + log(mu / j) end
      s = s + exp(lt)
    end
    return min(1, s)
  end
  local t = exp(-mu)
  local s = t
  for j = 1, k do
    t = t * mu / j
    s = s + t
  end
  return min(1, s)
end
M.poisson_cdf = poisson_cdf

-- G(x, k) = integral over [0, x] of P(Poisson(mu) <= k) dmu = sum_{j=0..k} P(Poisson(x) > j).
local function G(x, k)
  if k < 0 or x <= 0 then return 0 end
  local s, F = 0, 0
  if x > 745 then
    -- every P(Poisson(x) <= j) for j <= k is 0 far below the mean
    if x > 4 * k + 100 then return k + 1 end
    local lt = -x
    for j = 0, k do
      if j > 0 then lt = lt + log(x / j) end
      F = F + exp(lt)
      s = s + (1 - min(F, 1))
    end
    return s
  end
  local t = exp(-x)
  for j = 0, k do
    if j > 0 then t = t * x / j end
    F = F + t
    s = s + (1 - min(F, 1))
  end
  return s
end
M.poisson_cdf_integral = G

-- G(x, k) for k = 0 .. kmax, one pass, into out[base + k]: the terms G(x, kmax) sums, each k's
-- sum where the pass reaches it, so every value is G(x, k)'s to the last bit.
local function G_upto(x, kmax, out, base)
  if x <= 0 or x > 745 and x > 4 * kmax + 100 then
    -- nothing, or (far above every k) G's k + 1 for each
    for k = 0, kmax do out[base + k] = x <= 0 and 0 or k + 1 end
    return
  end
  local s, F = 0, 0
  local t, lt = exp(-x), -x
  for j = 0, kmax do
    if x > 745 then
      if j > 0 then lt = lt + log(x / j) end
      F = F + exp(lt)
    else
      if j > 0 then t = t * x / j end
      F = F + t
    end
    s = s + (1 - min(F, 1))
    out[base + j] = (x > 745 and x > 4 * j + 100) and j + 1 or s
  end
end

-- The resident share of each class, for `cap` stable ways a set (fractional caps blend the two
-- whole ones).  Exact ranks (window nil: a long run without decay, whose counts order the rows
-- as their probabilities do), or counts of a window of W batches (Poisson(q W)): a row with
-- count N ranks below the rows of higher counts (and half those of the same count).  A row
-- never read in the `history` batches (default: the window) is not cached; one read before the
-- window (its count decayed to 0) ranks below every counted row.
local function lfu_resident(P, v, sets, cap, window, full, history, gt, gw)
  local n, q, cr = P.n, v.q, P.cum_rows
  local res = {}
  local c0 = floor(cap)
  local frac = cap - c0
  local function in_set(rank)
    if full then return max(0, min(1, cap - rank)) end
    local a = poisson_cdf(rank / sets, c0 - 1)
    if frac > 0 then a = a + frac * (poisson_cdf(rank / sets, c0) - a) end
    return a
  end
  if not window then
    for i = 1, #n do
      if full then
        res[i] = max(0, min(1, (cap - cr[i - 1]) / n[i]))
      else
        -- the class's rows span ranks cr[i-1] .. cr[i]: the mean over them, as the integral of
        -- the Poisson CDF over its mean (G below)
        local a, b = cr[i - 1] / sets, cr[i] / sets
        local r0, r1
        if gt then
          -- the integrals at the class's ends, taken once a hit rate (M.lfu): G(end i, k) at
          -- gt[i * (kmax + 1) + k + 1]
          local ga, gb = (i - 1) * gw + 1, i * gw + 1
          r0 = c0 >= 1 and (gt[gb + c0 - 1] - gt[ga + c0 - 1]) / (b - a) or 0
          if frac > 0 then r1 = (gt[gb + c0] - gt[ga + c0]) / (b - a) end
        else
          r0 = (G(b, c0 - 1) - G(a, c0 - 1)) / (b - a)
          if frac > 0 then r1 = (G(b, c0) - G(a, c0)) / (b - a) end
        end
        if frac > 0 then r0 = r0 + frac * (r1 - r0) end
        res[i] = max(0, min(1, r0))
      end
    end
    return res
  end
  -- counts: pmf of each class over N = 0..nmax (log space), then the rank of a count
  local mu, nmax = {}, 0
  for i = 1, #n do
    mu[i] = q[i] * window
    nmax = max(nmax, floor(mu[i] + 8 * math.sqrt(mu[i]) + 8))
  end
  nmax = min(nmax, 4000)
  local lg = { [0] = 0 }
  for k = 1, nmax + 1 do lg[k] = lg[k - 1] + log(k) end
  local function pmf(m, k)
    if m <= 0 then return k == 0 and 1 or 0 end
    return exp(-m + k * log(m) - lg[k])
  end
  history = history or window
  local zero_seen = {} -- P(count 0 in the window, read in the history)
  for i = 1, #n do
    local never = q[i] >= 1 and 0 or exp(history * log1p(-q[i]))
    zero_seen[i] = max(0, pmf(mu[i], 0) - never)
  end
  local above = {} -- rows with a count above N, plus half those at N
  for k = 0, nmax do above[k] = 0 end
  for i = 1, #n do
    if mu[i] > nmax + 8 * math.sqrt(mu[i]) then
      for k = 0, nmax do above[k] = above[k] + n[i] end
    elseif mu[i] > 0 then
      local tail = 1 -- P(count >= k)
      for k = 0, nmax do
        local pk = pmf(mu[i], k)
        tail = tail - pk
        above[k] = above[k] + n[i] * (max(tail, 0) + (k == 0 and zero_seen[i] or pk) / 2)
      end
    end
  end
  local at = {}
  for k = 0, nmax do at[k] = in_set(above[k]) end
  for i = 1, #n do
    if mu[i] > nmax + 8 * math.sqrt(mu[i]) then
      res[i] = at[nmax]
    elseif mu[i] <= 0 then
      res[i] = 0
    else
      local r, mass = 0, 0
      for k = 1, nmax do
        local pk = pmf(mu[i], k)
        r, mass = r + pk * at[k], mass + pk
      end
      res[i] = r + max(0, 1 - pmf(mu[i], 0) - mass) * at[nmax] + zero_seen[i] * at[0]
    end
  end
  return res
end

-- LFU: resident rows by count, set by set.  opts: ways (32); full (one fully associative set:
-- exactly the top rows); window (batches of counts: nil for a long run without decay, where
-- counts rank rows as their probabilities do; decay_batches D gives about 1.5 D).
function M.lfu(P, L, slots, opts)
  opts = opts or {}
  local v = profile.batch(P, L)
  local U = v.distinct
  if U <= 0 then return { hit_rate = 1, misses = 0, distinct = 0 } end
  local ways = opts.ways or M.WAYS
  local sets = opts.full and 1 or max(1, floor(slots / ways + 0.5))
  local per = opts.full and slots or ways
  local n, q = P.n, v.q
  local res
  -- the Poisson CDF's integrals at every class's ends, for every whole number of ways: the same
  -- at each step of the bisection below, which summed them again (up to 32 terms, four a class a
  -- step: 9 ms a table of 27 cached choices, 9.3 s for 1000 tables on 8 ranks)
  local gt
  if not opts.window and not opts.full then
    gt = {}
    local cr = P.cum_rows
    for i = 0, #n do G_upto(cr[i] / sets, per, gt, i * (per + 1) + 1) end
  end
  -- a row outside the stable part still hits when it was read (and so brought in) the batch
  -- before: the ways the misses took hold the last batch's missed rows
  local function misses_at(cap)
    res = lfu_resident(P, v, sets, cap, opts.window, opts.full, opts.history, gt, per + 1)
    local m = 0
    for i = 1, #n do m = m + n[i] * q[i] * (1 - res[i]) * (1 - q[i]) end
    return m
  end
  -- each miss of a batch takes a way of its own: a set keeps per - (its misses) stable rows
  local lo, hi = 0, per
  for _ = 1, 40 do
    local cap = (lo + hi) / 2
    local need = max(1, misses_at(cap) / sets)
    if cap + need > per then hi = cap else lo = cap end
    if hi - lo < 1e-4 then break end
  end
  local cap = lo
  local m = misses_at(cap)
  return { hit_rate = 1 - m / U, misses = m, distinct = U, cap = cap, sets = sets, resident = res }
end

function M.rate(policy, P, L, slots, opts)
  if policy == "lfu" then return M.lfu(P, L, slots, opts) end
  if policy == "lru" then return M.lru(P, L, slots) end
  error("hitrate: policy must be lru or lfu, not " .. tostring(policy), 2)
end

-- A run started cold, batches k0..k1 (1-based): {hit_rate (hits over distinct rows),
-- first_touch (rows never read before, over distinct rows), warm_hit_rate (hits over rows read
-- before), steady (the rate of a cache warm for ever)}.  A row can only hit at batch k if it was
-- read in one of the k - 1 batches before; LRU keeps it when that was within the last T batches;
-- LFU ranks rows by the counts of those k - 1 batches (or of its decay window, opts.decay_batches
-- D: about 1.5 D batches), evaluated at a few batches of the window.
function M.window(policy, P, L, slots, k0, k1, opts)
  opts = opts or {}
  local v = profile.batch(P, L)
  local st = M.rate(policy, P, L, slots, opts)
  local n, q, lq = P.n, v.q, v.lq
  local ks = {}
  if policy == "lfu" then
    local steps = min(k1 - k0 + 1, 5)
    for j = 0, steps - 1 do ks[#ks + 1] = floor(k0 + (k1 - k0) * (j + 0.5) / steps + 0.5) end
  else
    for k = k0, k1 do ks[#ks + 1] = k end
  end
  local hits, seen_before, distinct = 0, 0, 0
  for _, k in ipairs(ks) do
    local res
    if policy == "lfu" then
      local w = k - 1
      if opts.decay_batches and opts.decay_batches > 0 then w = min(w, 1.5 * opts.decay_batches) end
      res = M.lfu(P, L, slots, { ways = opts.ways, full = opts.full, window = w, history = k - 1 }).resident
    end
    for i = 1, #n do
      local before = 1 - exp((k - 1) * lq[i]) -- read in one of the k - 1 batches before
      local h
      if policy == "lru" then
        h = 1 - exp(min(k - 1, st.T) * lq[i])
      else
        h = min(res[i] + (1 - res[i]) * q[i], before)
      end
      hits = hits + n[i] * q[i] * h
      seen_before = seen_before + n[i] * q[i] * before
      distinct = distinct + n[i] * q[i]
    end
  end
  return { hit_rate = hits / distinct, first_touch = 1 - seen_before / distinct,
           warm_hit_rate = seen_before > 0 and hits / seen_before or 1, steady = st.hit_rate,
           distinct = distinct / #ks }
end

return M
