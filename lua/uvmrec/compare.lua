-- Relative differences between two lists of numbers (a result and its reference b), for the
-- checks that compare a backend with another: the specs' references (spec/support/dense_ref.lua)
-- and the benchmarks' correctness checks before they time anything.  A NaN difference is
-- math.huge, so it fails every tolerance.
local M = {}

local function same_length(a, b)
  if #a ~= #b then error(("compare: the lists have %d and %d elements; expected as many"):format(#a, #b), 3) end
end

-- Largest |a - b| / max(1, |b|), element by element, and the (1-based) index where it is, so
-- that a check can name the element (nil where no element differs).
function M.maxrel(a, b)
  same_length(a, b)
  local m, at = 0, nil
  for i = 1, #a do
    local d = math.abs(a[i] - b[i]) / math.max(1, math.abs(b[i]))
    if d ~= d then return math.huge, i end
    if d > m then m, at = d, i end
  end
  return m, at
end

-- ||a - b|| / ||b||, the lists as whole vectors: for gradients through ReLUs, whose masks two
-- backends may set apart where a pre-activation is within rounding of zero (one element then
-- differs by a whole gradient value).
function M.normrel(a, b)
  same_length(a, b)
  local d, n = 0, 0
  for i = 1, #a do
    d = d + (a[i] - b[i]) ^ 2
    n = n + b[i] ^ 2
  end
  if d ~= d then return math.huge end
  return math.sqrt(d) / math.max(math.sqrt(n), 1e-30)
end

return M
