-- uvmrec.optim.schedule: learning-rate schedules, each a function of the 1-based number of
-- the update about to be made, giving its learning rate.
local M = {}

local function need(opts, key, min)
  local v = opts[key]
  if type(v) ~= "number" or v ~= v or v < (min or 0) then
    error(("schedule: %s must be a number >= %g, got %s"):format(key, min or 0, tostring(v)), 3)
  end
  return v
end

-- lr = base * step / warmup for the first warmup steps, then base.
function M.linear_warmup(opts)
  local base, w = need(opts, "base"), need(opts, "warmup", 1)
  return function(step) return step < w and base * step / w or base end
end

-- From step `start` on, lr = max(min, base * ((start + steps - step) / steps)^power), held at
-- its last value after `steps` steps; base before start.
function M.polynomial(opts)
  local base, start, steps = need(opts, "base"), need(opts, "start"), need(opts, "steps", 1)
  local power, min = opts.power or 2, opts.min or 0
  local last = math.max(min, base * (1 / steps) ^ power)
  return function(step)
    if step < start then return base end
    if step >= start + steps then return last end
    return math.max(min, base * ((start + steps - step) / steps) ^ power)
  end
end

-- lr = base * gamma^floor((step - 1) / every).
function M.step_decay(opts)
  local base, every, gamma = need(opts, "base"), need(opts, "every", 1), need(opts, "gamma")
  return function(step) return base * gamma ^ math.floor((step - 1) / every) end
end

-- The public DLRM code's schedule: linear warmup, constant, then polynomial decay (power 2)
-- to min: {base, warmup, decay_start, decay_steps, power = 2, min = 0}.
function M.dlrm(opts)
  local warm = M.linear_warmup { base = need(opts, "base"), warmup = opts.warmup or 1 }
  local decay = M.polynomial { base = opts.base, start = need(opts, "decay_start"),
                               steps = need(opts, "decay_steps", 1), power = opts.power or 2,
                               min = opts.min or 0 }
  local w = opts.warmup or 1
  return function(step)
    if step < w then return warm(step) end
    return decay(step)
  end
end

return M
