-- The `hot_prefix` hint policy: rows laid out hottest first (once, from the counts), then the
-- prefix that fits the table's HBM allowance preferred on and prefetched to the GPU, and the
-- rest preferred on the host and accessed by the GPU (read in place, no faults).  It plans
-- again only when the allowance moves the prefix's end.
local hints = require "uvmrec.hints"

local P = hints.policy("hot_prefix")

function P:plan(stats, allowance)
  local s = self.state[stats.name] or {}
  self.state[stats.name] = s
  local actions = {}
  if not s.sorted and stats.total > 0 then
    actions[#actions + 1] = hints.relayout("counts")
    s.sorted = true
    s.k = nil -- the rows under the prefix changed: place it again
  end
  local k = stats:prefix_rows(allowance)
  if k == s.k then return actions end
  s.k = k
  return hints.split(actions, stats.rows, k)
end

return P
