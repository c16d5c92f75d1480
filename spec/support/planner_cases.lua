-- The planner's seeded test instances, one home for spec/planner/search_spec.lua and the recorder
-- of its exhaustive optima (scripts/bench/planner_exhaustive_400.lua).
local planner = require "uvmrec.planner"

local M = {}

-- Instance `seed`: 3 to 6 tables (rows 1e3..2e7, dims 16..128, Zipf 0.6..1.3 or uniform, 1 to 5
-- ids a sample, three optimizers) with their profiles, a batch, and u in [0, 1) (where the
-- budget lies between the least and the all-in-HBM one's need).
function M.instance(seed)
  math.randomseed(seed)
  local n = math.random(3, 6)
  local tables, profiles = {}, {}
  for i = 1, n do
    local rows = math.floor(10 ^ (3 + 4.3 * math.random()))
    local name = "T" .. i
    local s = math.random() < 0.15 and 0 or 0.6 + 0.7 * math.random()
    tables[i] = { name = name, rows = rows, dim = ({ 16, 32, 64, 128 })[math.random(4)],
                  optimizer = ({ "sgd", "rowwise_adagrad", "adagrad" })[math.random(3)],
                  hot = ({ 1, 1, 2, 5 })[math.random(4)] }
    profiles[name] = planner.profile.zipf { rows = rows, s = s }
  end
  local batch, u = ({ 4096, 16384, 65536 })[math.random(3)], math.random()
  return tables, profiles, batch, u
end

return M
