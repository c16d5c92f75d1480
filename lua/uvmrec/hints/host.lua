-- The `host` hint policy: every row preferred on the host and accessed by the GPU, so the GPU
-- reads rows in place over the host link (no page faults, no migration); nothing is placed in
-- HBM.  Planned once: later intervals return nothing.
local hints = require "uvmrec.hints"

local P = hints.policy("host")
P.ignores_allowance = true -- the manager ranks no counters to split the allowance for it

function P:plan(stats, allowance) -- luacheck: ignore 212
  if self.done[stats.name] then return {} end
  self.done[stats.name] = true
  return { hot_rows = 0,
    hints.advise(0, stats.rows, "preferred_location", "cpu"),
    hints.advise(0, stats.rows, "accessed_by", "gpu"),
    hints.prefetch(0, stats.rows, "cpu"),
  }
end

return P
