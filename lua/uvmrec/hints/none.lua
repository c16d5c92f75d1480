-- The `none` hint policy: no advice at all, the driver's default behaviour (pages migrate to
-- the GPU on first touch, by page faults).  The baseline the other policies are measured
-- against.
local hints = require "uvmrec.hints"

local P = hints.policy("none")
P.ignores_allowance = true -- the manager ranks no counters to split the allowance for it

function P:plan(stats, allowance) -- luacheck: ignore 212
  return {}
end

return P
