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
-- Settings: lr, weight_decay (L2; AdamW's decoupled), eps, betas = {beta1, beta2} or beta1 =,
-- beta2 = (Adam; one spelling, the other beta its default), momentum and nesterov (dense SGD), max_grad (tables:
-- clipping), clip_norm (dense: clipping by the gradients' global norm, PyTorch's clip_grad_norm_;
-- 0 none), zero_grad (dense: the step zeroes the gradients), initial_accumulator_value (dense
-- Adagrad).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local C = lib.C

local M = {}

-- Per optimizer: its engine kind, who takes it, its defaults, its state, its class name and
-- the settings of its own (takes; every optimizer takes lr, weight_decay, zero_grad and
-- max_grad where its side does).
-- state: f32 values of optimizer state per element (dense) or per row of dim (tables).
local ADAM_TAKES = { eps = true, betas = true, beta1 = true, beta2 = true }
M.RULES = {
  sgd = { kind = C.UR_OPTIM_KIND_SGD, dense = true, tables = true, class = "SGD",
          defaults = { lr = 0.01 }, state = function() return 0 end,
          takes = { momentum = true, nesterov = true } },
  adagrad = { kind = C.UR_OPTIM_KIND_ADAGRAD, dense = true, tables = true, class = "Adagrad",
              defaults = { lr = 0.01, eps = 1e-10 }, state = function(dim) return dim end,
              takes = { eps = true, initial_accumulator_value = true } },
  adam = { kind = C.UR_OPTIM_KIND_ADAM, dense = true, tables = true, class = "Adam",
           defaults = { lr = 0.001, eps = 1e-8, beta1 = 0.9, beta2 = 0.999 },
           state = function(dim) return 2 * dim end, takes = ADAM_TAKES },
  adamw = { kind = C.UR_OPTIM_KIND_ADAMW, dense = true, class = "AdamW",
            defaults = { lr = 0.001, eps = 1e-8, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.01 },
            state = function(dim) return 2 * dim end, takes = ADAM_TAKES },
  rowwise_adagrad = { kind = C.UR_OPTIM_KIND_ROWWISE_ADAGRAD, tables = true, class = "RowwiseAdagrad",
                      defaults = { lr = 0.01, eps = 1e-8 }, state = function() return 1 end,
                      takes = { eps = true } },
}
local COMMON = { lr = true, weight_decay = true, zero_grad = true, max_grad = true, clip_norm = true }

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
            beta1 = true, beta2 = true, zero_grad = true, initial_accumulator_value = true, clip_norm = true },
  tables = { lr = true, eps = true, weight_decay = true, betas = true, beta1 = true, beta2 = true,
             max_grad = true },
}

-- What a value of setting `key` must be: nil when v is one, else the expectation ("a number in
-- [0, 1)"). One rule for every setting, used here and by the training config (uvmrec.train.config).
-- eps divides (sqrt(state) + eps): 0 gives 0/0 on a row or weight whose gradients were all 0.
function M.setting_expects(key, v)
  local ok, want
  if key == "beta1" or key == "beta2" then
    ok, want = type(v) == "number" and v >= 0 and v < 1, "a number in [0, 1)"
  elseif key == "eps" then
    ok, want = type(v) == "number" and v > 0 and v < math.huge, "a finite number > 0"
  else
    ok, want = type(v) == "number" and v >= 0 and v < math.huge, "a finite number >= 0"
  end
  if not ok then return want end
end

local function setting(who, key, v, default, level)
  if v == nil then return default end
  local want = M.setting_expects(key, v)
  if want then
    error(("%s: %s must be %s, got %s"):format(who, key, want,
          type(v) == "string" and ("'" .. v .. "'") or tostring(v)), level + 1)
  end
  return v
end

-- nil when optimizer `name` on `side` takes setting `key`, else why not (the settings it takes,
-- of those in the set `among`, default all of the side's).
function M.refuses(name, side, key, among)
  local r = M.RULES[name]
  if COMMON[key] or r.takes[key] then return nil end
  local t = {}
  for k in pairs(among or KEYS[side]) do
    if COMMON[k] or r.takes[k] then t[#t + 1] = k end
  end
  table.sort(t)
  return ("%s takes no setting '%s' (its settings: %s)"):format(name, key, table.concat(t, ", "))
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
  if type(opts) ~= "table" then
    error(("%s: the settings must be a table ({lr = ...}), got %s"):format(who, type(opts)), level)
  end
  lib.known_keys(opts, KEYS[side], who, level, "optimizer setting")
  for k in pairs(opts) do
    local why = M.refuses(name, side, k)
    if why then error(who .. ": " .. why, level) end
  end
  for _, k in ipairs { "nesterov", "zero_grad" } do
    if opts[k] ~= nil and type(opts[k]) ~= "boolean" then
      error(("%s: %s must be true or false, got %s"):format(who, k, tostring(opts[k])), level)
    end
  end
  local d = r.defaults
  -- the two spellings of the betas: both at once would leave one of them unused
  if opts.betas ~= nil and (opts.beta1 ~= nil or opts.beta2 ~= nil) then
    error(("%s: betas and %s are two spellings of the same settings: give betas = {beta1, beta2}, or beta1 = "
           .. "and beta2 =, not both"):format(who, opts.beta1 ~= nil and "beta1" or "beta2"), level)
  end
  local betas = opts.betas or {}
  if type(betas) ~= "table" or (opts.betas and #betas ~= 2) then
    local got = type(betas) == "table" and ("a list of %d"):format(#betas) or tostring(betas)
    error(("%s: betas must be a list of two numbers {beta1, beta2}, got %s"):format(who, got), level)
  end
  local s = {
    lr = setting(who, "lr", opts.lr, d.lr, level),
    eps = setting(who, "eps", opts.eps, d.eps or 0, level),
    weight_decay = setting(who, "weight_decay", opts.weight_decay, d.weight_decay or 0, level),
    momentum = setting(who, "momentum", opts.momentum, 0, level),
    beta1 = setting(who, "beta1", opts.beta1 or betas[1], d.beta1 or 0, level),
    beta2 = setting(who, "beta2", opts.beta2 or betas[2], d.beta2 or 0, level),
    max_grad = setting(who, "max_grad", opts.max_grad, 0, level),
    clip_norm = setting(who, "clip_norm", opts.clip_norm, 0, level),
    initial_accumulator_value = setting(who, "initial_accumulator_value", opts.initial_accumulator_value, 0,
                                        level),
  }
  local c = ffi.new("ur_optim_config")
  c.kind = r.kind
  c.nesterov = opts.nesterov and 1 or 0
  c.zero_grad = opts.zero_grad and 1 or 0
  c.lr, c.eps, c.weight_decay, c.momentum = s.lr, s.eps, s.weight_decay, s.momentum
  c.beta1, c.beta2, c.max_grad, c.clip_norm = s.beta1, s.beta2, s.max_grad, s.clip_norm
  return c, s
end

local Optimizer = require "uvmrec.optim.Optimizer"
local schedule = require "uvmrec.optim.schedule"
M.Optimizer, M.schedule, M.Schedule = Optimizer, schedule, schedule.Schedule

-- The dense optimizers: SGD (lr 0.01, momentum 0, nesterov false), Adagrad (lr 0.01, eps 1e-10,
-- initial_accumulator_value 0), Adam (lr 1e-3, betas {0.9, 0.999}, eps 1e-8, weight_decay 0 as
-- an L2 term), AdamW (as Adam, weight_decay 0.01 decoupled: p = p (1 - lr wd) first).  Each
-- takes clip_norm (0 by default: none): the gradients are scaled by min(1, clip_norm / (norm +
-- 1e-6)) before the update, norm the 2-norm of all of them together (opt:grad_norm() reads it).
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
