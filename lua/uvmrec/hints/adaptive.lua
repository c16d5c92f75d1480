-- The `adaptive` hint policy: hot_prefix that follows a drifting distribution.  Each interval it
-- compares the accesses the current prefix takes with those the best prefix of the same size
-- would take (from the decayed counts); only when the gap exceeds `margin` does it swap rows,
-- and then only rows that crossed: the hottest ids outside the prefix trade places with the
-- coldest inside it, pair by pair, while the newcomer was read more than (1 + band) times as
-- often (hysteresis on both: it does not thrash on noise), so rows that stayed hot do not
-- move.  The swaps run on the stream (uvmrec.tbe swap_rows: a kernel on a GPU moves the rows
-- and their optimizer state and updates the permutation in place); between intervals it costs
-- what hot_prefix costs.  Only ranges whose placement changed are advised again.
--   hints.new("adaptive", {margin = 0.02, band = 0.1})
local hints = require "uvmrec.hints"

-- margin: a share of the accesses (the gap is one, from 0 to 1); band: a ratio's excess
local P = hints.policy("adaptive", { margin = 0.02, band = 0.1 }, { margin = { 0, 1 }, band = { 0, math.huge } })
P.rerank = true -- the manager ranks every table each interval for it

function P:plan(stats, allowance)
  local s = self.state[stats.name] or {}
  self.state[stats.name] = s
  local actions = {}
  local k = stats:prefix_rows(allowance)
  if stats.total > 0 then
    if not s.sorted then
      actions[#actions + 1] = hints.relayout("counts")
      s.sorted = true
    else
      local have, best = stats:prefix_accesses(k), stats.access:accesses(k)
      -- this table's alone: a field of the policy held only the last table's
      local gap = (best - have) / stats.total
      if gap > self.opts.margin then
        actions[#actions + 1] = hints.relayout { swap = k, band = self.opts.band }
      end
    end
  end
  if s.k == nil then
    s.k = k
    return hints.split(actions, stats.rows, k)
  end
  -- only the rows between the old end and the new one change placement
  actions.hot_rows = k
  if k > s.k then
    actions[#actions + 1] = hints.advise(s.k, k - s.k, "preferred_location", "gpu")
    actions[#actions + 1] = hints.prefetch(s.k, k - s.k, "gpu")
  elseif k < s.k then
    actions[#actions + 1] = hints.advise(k, s.k - k, "preferred_location", "cpu")
    actions[#actions + 1] = hints.prefetch(k, s.k - k, "cpu")
  end
  -- swapped rows are moved where they live (a kernel on the GPU writes the prefix's pages in
  -- HBM and the rest in place over the link): no page changes sides, nothing to prefetch again
  s.k = k
  return actions
end

return P
