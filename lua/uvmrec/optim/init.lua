-- uvmrec.optim: the optimizers, one home for their names, defaults and settings.  One engine
-- struct, ur_optim_config, carries them for the dense parameters (SGD, Adagrad, Adam, AdamW with
-- PyTorch's formulas: one C call per step, one GPU launch per 48 parameters) and for the
-- embedding tables, whose optimizer is fused into their backward (sgd, rowwise_adagrad,
-- adagrad, adam); the kinds are the engine's ur_optim_kind values.  Learning rates follow one
-- schedule over parameter groups (uvmrec.optim.schedule).
--
--   local opt = ur.optim.Adam(model:parameters(), {lr = 1e-3})
--   model:zero_grad(); model:backward(x, g); opt:step()
--   local lrs = ur.optim.Schedule(ur.optim.schedule.dlrm{...}, {opt, model.embeddings})
--
-- Settings: lr, weight_decay (L2; AdamW's decoupled), eps, betas = {beta1, beta2} (Adam; a table
-- optimizer also takes beta1 =, beta2 =), momentum and nesterov (dense SGD), max_grad (tables:
-- clipping), zero_grad (dense: the step zeroes the gradients), initial_accumulator_value (dense
-- Adagrad).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local C = lib.C

local M = {}

-- Per optimizer: its engine kind, who takes it, its defaults, its state and its class name.
-- state: f32 values of optimizer state per element (dense) or per row of dim (tables).
M.RULES = {
  sgd = { kind = C.UR_OPTIM_KIND_SGD, dense = true, tables = true, class = "SGD",
          defaults = { lr = 0.01 }, state = function() return 0 end },
  adagrad = { kind = C.UR_OPTIM_KIND_ADAGRAD, dense = true, tables = true, class = "Adagrad",
              defaults = { lr = 0.01, eps = 1e-10 }, state = function(dim) return dim end },
  adam = { kind = C.UR_OPTIM_KIND_ADAM, dense = true, tables = true, class = "Adam",
           defaults = { lr = 0.001, eps = 1e-8, beta1 = 0.9, beta2 = 0.999 },
           state = function(dim) return 2 * dim end },
  adamw = { kind = C.UR_OPTIM_KIND_ADAMW, dense = true, class = "AdamW",
            defaults = { lr = 0.001, eps = 1e-8, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.01 },
            state = function(dim) return 2 * dim end },
  rowwise_adagrad = { kind = C.UR_OPTIM_KIND_ROWWISE_ADAGRAD, tables = true, class = "RowwiseAdagrad",
                      defaults = { lr = 0.01, eps = 1e-8 }, state = function() return 1 end },
}

-- The names `side` takes ("dense" or "tables"), sorted.
function M.names(side)
  local out = {}
  for name, r in pairs(M.RULES) do
    if r[side] then out[#out + 1] = name end
  end
  table.sort(out)
  return out
end

-- f32 values of state a row of `dim` carries in the tables (sgd 0, rowwise_adagrad 1, ...).
function M.state_floats(name, dim)
  local r = M.RULES[name]
  if not r or not r.tables then
    error(("optim: '%s' is not an optimizer of embedding tables (%s)"):format(tostring(name),
          table.concat(M.names("tables"), ", ")), 2)
  end
  return r.state(dim)
end

local KEYS = {
  dense = { lr = true, eps = true, weight_decay = true, momentum = true, nesterov = true, betas = true,
            zero_grad = true, initial_accumulator_value = true },
  tables = { lr = true, eps = true, weight_decay = true, betas = true, beta1 = true, beta2 = true,
             max_grad = true },
}

local function number(who, opts, key, default, level)
  local v = opts[key]
  if v == nil then return default end
  if type(v) ~= "number" or v ~= v or v < 0 or v == math.huge then
    error(("%s: %s must be a finite number >= 0, got %s"):format(who, key, tostring(v)), level + 1)
  end
  return v
end

-- The engine's ur_optim_config for optimizer `name` on `side` ("dense" or "tables") with
-- settings opts (KEYS[side], defaults from M.RULES); `who` opens error messages.  Returns
-- the struct and the settings as numbers.
function M.config(name, side, opts, who, level)
  level = (level or 1) + 1
  local r = M.RULES[name]
  if not r or not r[side] then
    error(("%s: optimizer '%s' is not one of %s"):format(who, tostring(name),
          table.concat(M.names(side), ", ")), level)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if not KEYS[side][k] then
      error(("%s: unknown optimizer setting '%s'"):format(who, k), level)
    end
  end
  local d = r.defaults
  local betas = opts.betas or {}
  local s = {
    lr = number(who, opts, "lr", d.lr, level),
    eps = number(who, opts, "eps", d.eps or 0, level),
    weight_decay = number(who, opts, "weight_decay", d.weight_decay or 0, level),
    momentum = number(who, opts, "momentum", 0, level),
    beta1 = opts.beta1 or betas[1] or d.beta1 or 0,
    beta2 = opts.beta2 or betas[2] or d.beta2 or 0,
    max_grad = number(who, opts, "max_grad", 0, level),
    initial_accumulator_value = number(who, opts, "initial_accumulator_value", 0, level),
  }
  local c = ffi.new("ur_optim_config")
  c.kind = r.kind
  c.nesterov = opts.nesterov and 1 or 0
  c.zero_grad = opts.zero_grad and 1 or 0
  c.lr, c.eps, c.weight_decay, c.momentum = s.lr, s.eps, s.weight_decay, s.momentum
  c.beta1, c.beta2, c.max_grad = s.beta1, s.beta2, s.max_grad
  return c, s
end

local Optimizer = require "uvmrec.optim.Optimizer"
local schedule = require "uvmrec.optim.schedule"
M.Optimizer, M.schedule, M.Schedule = Optimizer, schedule, schedule.Schedule

-- The dense optimizers: SGD (lr 0.01, momentum 0, nesterov false), Adagrad (lr 0.01, eps 1e-10,
-- initial_accumulator_value 0), Adam (lr 1e-3, betas {0.9, 0.999}, eps 1e-8, weight_decay 0 as
-- an L2 term), AdamW (as Adam, weight_decay 0.01 decoupled: p = p (1 - lr wd) first).
function M.SGD(params, opts) return Optimizer.new("sgd", params, opts, 2) end
function M.Adagrad(params, opts) return Optimizer.new("adagrad", params, opts, 2) end
function M.Adam(params, opts) return Optimizer.new("adam", params, opts, 2) end
function M.AdamW(params, opts) return Optimizer.new("adamw", params, opts, 2) end

-- The dense optimizer of a name ("sgd", ...) over params.
function M.dense(name, params, opts)
  local r = M.RULES[name]
  if not r or not r.dense then
    error(("optim: '%s' is not a dense optimizer (%s)"):format(tostring(name),
          table.concat(M.names("dense"), ", ")), 2)
  end
  return Optimizer.new(name, params, opts, 2)
end

return M
