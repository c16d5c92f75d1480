-- uvmrec.optim: dense optimizers with PyTorch's formulas, fused (one C call per step, one GPU
-- launch per 48 parameters), and learning-rate schedules (uvmrec.optim.schedule).
--
--   local opt = ur.optim.Adam(model:parameters(), {lr = 1e-3})
--   model:zero_grad(); model:backward(x, g); opt:step()
--
-- Common options: lr, weight_decay, schedule (a function of the 1-based step giving the lr,
-- e.g. ur.optim.schedule.dlrm{...}), zero_grad (true: gradients are zeroed by the step).
local Optimizer = require "uvmrec.optim.Optimizer"

local M = { Optimizer = Optimizer, schedule = require "uvmrec.optim.schedule" }

-- SGD: momentum (0), nesterov (false); lr required.
function M.SGD(params, opts) return Optimizer.new("sgd", params, opts, 2) end
-- Adagrad: lr (0.01), eps (1e-10), initial_accumulator_value (0).
function M.Adagrad(params, opts) return Optimizer.new("adagrad", params, opts, 2) end
-- Adam: lr (1e-3), betas ({0.9, 0.999}), eps (1e-8), weight_decay (0, as an L2 term).
function M.Adam(params, opts) return Optimizer.new("adam", params, opts, 2) end
-- AdamW: as Adam, weight_decay (0.01) decoupled: p = p (1 - lr wd) before the update.
function M.AdamW(params, opts) return Optimizer.new("adamw", params, opts, 2) end

return M
