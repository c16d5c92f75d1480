-- uvmrec.optim.schedule: learning-rate schedules, each a function of the 1-based number of
-- the update about to be made, giving its learning rate (base, default 1: a factor), and the
-- one way they act: a Schedule over parameter groups.
local M = {}

local function need(opts, key, min, default)
  local v = opts[key]
  if v == nil then v = default end
  if type(v) ~= "number" or v ~= v or v < (min or 0) or v == math.huge then
    error(("schedule: %s must be a finite number >= %g, got %s"):format(key, min or 0, tostring(v)), 3)
  end
  return v
end

-- lr = base * step / warmup for the first warmup steps, then base.
function M.linear_warmup(opts)
  local base, w = need(opts, "base", 0, 1), need(opts, "warmup", 1)
  return function(step) return step < w and base * step / w or base end
end

-- From step `start` on, lr = max(min, base * ((start + steps - step) / steps)^power), held at
-- its last value after `steps` steps; base before start.
function M.polynomial(opts)
  local base, start, steps = need(opts, "base", 0, 1), need(opts, "start"), need(opts, "steps", 1)
  local power, min = need(opts, "power", 0, 2), need(opts, "min", 0, 0)
  local last = math.max(min, base * (1 / steps) ^ power)
  return function(step)
    if step < start then return base end
    if step >= start + steps then return last end
    return math.max(min, base * ((start + steps - step) / steps) ^ power)
  end
end

-- lr = base * gamma^floor((step - 1) / every).
function M.step_decay(opts)
  local base, every, gamma = need(opts, "base", 0, 1), need(opts, "every", 1), need(opts, "gamma")
  return function(step) return base * gamma ^ math.floor((step - 1) / every) end
end

-- The public DLRM code's schedule: linear warmup, constant, then polynomial decay (power 2)
-- to min: {base, warmup, decay_start, decay_steps, power = 2, min = 0}.
function M.dlrm(opts)
  local base = need(opts, "base", 0, 1)
  local warm = M.linear_warmup { base = base, warmup = opts.warmup or 1 }
  local decay = M.polynomial { base = base, start = need(opts, "decay_start"),
                               steps = need(opts, "decay_steps", 1), power = opts.power or 2,
                               min = opts.min or 0 }
  local w = opts.warmup or 1
  return function(step)
    if step < w then return warm(step) end
    return decay(step)
  end
end

-- Schedule(factor, groups): a schedule acting on parameter groups, each an object with lr()
-- and set_lr(lr) (a dense optimizer, an embedding collection's fused one).  Each group keeps
-- the rate it had when the Schedule was made as its base; set(step) gives every group base *
-- factor(step).  Given to uvmrec.train.loop.run as a hook, it sets each step's rates before
-- the step.
local Schedule = {}
Schedule.__index = Schedule

function M.Schedule(factor, groups)
  if type(factor) ~= "function" then
    error("Schedule: factor must be a function of the step, got " .. type(factor), 2)
  end
  if type(groups) ~= "table" or #groups == 0 then error("Schedule: expected a list of parameter groups", 2) end
  local base = {}
  for i, g in ipairs(groups) do
    if type(g) ~= "table" or type(g.lr) ~= "function" or type(g.set_lr) ~= "function" then
      error(("Schedule: group %d has no lr() and set_lr(lr)"):format(i), 2)
    end
    base[i] = g:lr()
  end
  return setmetatable({ factor = factor, groups = groups, base = base }, Schedule)
end

-- Every group's rate for update number `step` (1-based).
function Schedule:set(step)
  local f = self.factor(step)
  for i, g in ipairs(self.groups) do g:set_lr(self.base[i] * f) end
  return self
end

-- As a hook: before each step, that step's rates.
function Schedule:before(run) self:set(run.step + 1) end

return M
