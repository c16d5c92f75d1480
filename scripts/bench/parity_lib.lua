-- What scripts/bench/parity.lua, train_parity.lua and dlrm_speed.lua share with the PyTorch DLRM
-- (scripts/bench/torch_dlrm.py): the model description the Python side builds its DLRM from
-- (every hyperparameter resolved here, so no default is written twice), the checkpoint of a
-- model's weights under the trainer's names, DLRM's training step cut into its phases, with
-- the tables' gradient taken without their fused optimizer step when asked, and running the
-- other programs (datagen, torch_dlrm.py).  Its config loader (M.config) is dlrm.lua's and
-- cache.lua's too.
--   local P = dofile(dir .. "/parity_lib.lua")
local ur = require "uvmrec"
local train = require "uvmrec.train"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local Module = require "uvmrec.nn.Module"
local dense = ur.dense

local M = {}

local RULES = require("uvmrec.optim").RULES -- the defaults for what a config leaves out

-- A config by preset name or file, with --set overrides; nil, message on a bad one.
function M.config(name, sets)
  local path, perr = train.find_config(name)
  if not path then return nil, perr end
  local cfg, err = train.config.load(path, sets)
  if not cfg then return nil, err end
  local def, derr = train.model_def(cfg, path)
  if not def then return nil, derr end
  return cfg, def, path
end

local function widths(seq)
  local w = { seq.modules[1].in_features }
  for _, l in ipairs(seq.modules) do
    if l.out_features then w[#w + 1] = l.out_features end
  end
  return w
end

-- The description torch_dlrm.py builds from: the model, both optimizers and the schedule,
-- resolved from the config and from the built objects.
function M.describe(cfg, model, opt)
  local e, s = cfg.embeddings, cfg.schedule
  local eo = e.optimizer or {}
  local ename = eo.name or "sgd"
  local names = {}
  for i = 1, model.num_tables do names[i] = "C" .. i end
  return {
    format = 1, name = cfg.name, interaction = model.interaction_kind,
    self_interaction = cfg.model.self_interaction and true or false,
    cross_layers = cfg.model.cross_layers, cross_rank = model.interaction.rank or 0,
    precision = cfg.model.precision, pooling = e.pooling, dim = e.dim,
    rows = train.config.table_rows(cfg), tables = names,
    bottom = widths(model.bottom), top = widths(model.top),
    emb_optim = { name = ename, lr = model.embeddings:lr(), eps = eo.eps or RULES[ename].defaults.eps or 0,
                  weight_decay = eo.weight_decay or 0, beta1 = eo.beta1 or 0.9, beta2 = eo.beta2 or 0.999,
                  max_grad = eo.max_grad or 0 },
    dense_optim = { name = opt.kind, lr = opt:lr(), eps = opt.cfg.eps, momentum = opt.cfg.momentum,
                    nesterov = opt.cfg.nesterov ~= 0, weight_decay = opt.cfg.weight_decay,
                    beta1 = opt.cfg.beta1, beta2 = opt.cfg.beta2, clip_norm = opt.cfg.clip_norm },
    schedule = { name = s.name, warmup_steps = s.warmup_steps, decay_start = s.decay_start,
                 decay_steps = s.decay_steps, power = s.power, min_factor = s.min_factor },
    batch_size = cfg.train.batch_size, log_every = cfg.train.log_every,
    eval_samples = cfg.eval.samples, eval_batch_size = cfg.eval.batch_size,
  }
end

-- t (a parameter's tensor or gradient, [out, in_width]) as the unpadded model has it: a Linear
-- reading a padded input (nn.Linear pad_to) keeps zero columns past its in_features, which
-- the PyTorch model has not.  A new tensor where it must cut, else t.
function M.unpadded(p, t)
  local m = p.module
  if not (m and m.in_width and m.in_width ~= m.in_features and p.name:match("weight$")) then return t end
  local rows = t:size(1)
  local o = { placement = t:placement(), dtype = t:dtype() }
  local keep = assert(ur.tensor({ rows, m.in_features }, o))
  local rest = assert(ur.tensor({ rows, m.in_width - m.in_features }, o))
  dense.split(t, { keep, rest })
  rest:free()
  return keep
end

-- The tensors of a model under the trainer's registry names (uvmrec.train registers
-- "dense" and "embeddings"): dense.<parameter> and embeddings.<table>, as the unpadded model
-- has them.
function M.weights(model)
  local ts = {}
  for _, p in ipairs(model:parameters()) do
    if p.fused then ts["embeddings." .. p.name:gsub("^embeddings%.", "")] = p.tensor
    else ts["dense." .. p.name] = M.unpadded(p, p.tensor) end
  end
  return ts
end

-- Saves the model's weights with the description (meta uvmrec.meta.torch) and the config.
function M.save_weights(path, model, desc, cfg)
  return ck.save(path, { tensors = M.weights(model), meta = {
    ["uvmrec.format"] = tostring(ck.FORMAT or 1), ["uvmrec.meta.torch"] = json.encode(desc),
    ["uvmrec.config"] = json.encode(cfg) } })
end

-- DLRM's training step (models/dlrm.lua: updateOutput, the criterion, backward, the dense
-- optimizer) as named phases over a state table s; the same calls in the same order as
-- DLRM:forward/backward and uvmrec.train.loop.step.  With opts.sparse_grad the last phases
-- take the tables' deduplicated gradient (s.sparse) instead of stepping them, and the dense
-- optimizer does not run.  Returns the list of {name, fn} and s.
function M.phases(model, opt, batch, opts)
  opts = opts or {}
  local s = {}
  local crit = model.criterion
  local pair = model._pair and {} or nil
  local list = {
    { "bottom_fwd", function() s.x = model.bottom:forward(batch.dense) end },
    { "emb_fwd", function() s.e = model.embeddings:forward(batch.sparse) end },
    { "inter_fwd", function()
      if pair then
        pair[1], pair[2] = s.x, s.e
        s.z = model.interaction:forward(pair)
      else
        local rows = Module.rows_cols(s.x)
        s.cat = dense.concat({ s.x, s.e }, model:buffer("cat", Module.dtype_of(s.x), rows,
                                                        model.interaction_width), model.stream)
        s.z = model.interaction:forward(s.cat)
      end
    end },
    { "top_fwd", function() s.logits = model.top:forward(s.z) end },
    { "loss", function()
      s.loss = crit:forward(s.logits, batch.labels)
      s.gl = crit:backward(s.logits, batch.labels)
    end },
    { "top_bwd", function() s.gz = model.top:backward(s.z, s.gl) end },
    { "inter_bwd", function()
      if pair then
        local g = model.interaction:backward(pair, s.gz)
        s.gx, s.ge = g[1], g[2]
      else
        local gc = model.interaction:backward(s.cat, s.gz)
        local rows = Module.rows_cols(gc)
        local dt = Module.dtype_of(gc)
        s.gx = model:buffer("gx", dt, rows, model.interaction_width - model.num_tables * model.dim)
        s.ge = model:buffer("ge", dt, rows, model.num_tables * model.dim)
        dense.split(gc, { s.gx, s.ge }, model.stream)
      end
    end },
    { "bottom_bwd", function() model.bottom:backward(batch.dense, s.gx) end },
  }
  -- The tables' phase ends as DLRM:backward does: the MLPs' weight gradients joined back.
  if opts.sparse_grad then
    list[#list + 1] = { "emb_grad", function()
      s.sparse = model.embeddings:sparse_grad(batch.sparse, s.ge)
      dense.join(model.stream)
    end }
  else
    list[#list + 1] = { "emb_bwd_opt", function()
      model.embeddings:backward(batch.sparse, s.ge)
      dense.join(model.stream)
    end }
    list[#list + 1] = { "dense_opt", function() opt:step(model.stream) end }
  end
  return list, s
end

-- Runs the phases once.
function M.run_phases(list)
  for i = 1, #list do list[i][2]() end
end

-- An f32 host copy of t (bf16 activations converted).
function M.host_f32(t)
  local src = t
  if Module.dtype_of(t) ~= "f32" then
    src = assert(ur.tensor(t:size(), { dtype = "f32", placement = t:placement() }))
    dense.cast(t, src)
  end
  local h = assert(src:to("host"))
  if src ~= t then src:free() end
  return h
end

-- A word quoted for the shell.
M.sh = require("uvmrec.lib").shell_quote

-- Runs a shell command line, echoed first; true when it exits 0.
function M.run(line)
  print("+ " .. line)
  io.stdout:flush()
  local ok, how, code = os.execute(line)
  -- LuaJIT without 5.2 compatibility returns the status alone.
  if type(ok) == "number" then return ok == 0 end
  return ok == true and (how ~= "exit" or code == 0)
end

local HERE = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

-- Writes samples of the config's synthetic data (the preset its data.train names) into dir as
-- day files, by scripts/datagen.lua run as this script runs (days of them, else datagen's
-- default); true, or nil and why (a data.train that is no synthetic preset, datagen failing).
function M.datagen(cfg, dir, samples, days)
  local preset = cfg.data.train:match("^synthetic:(.+)$")
  if not preset then return nil, ("data.train is %s, not a synthetic preset"):format(cfg.data.train) end
  local line = ("%s %s %s --out %s --samples %d"):format(M.sh(require("uvmrec.cli").interpreter()),
    M.sh(HERE .. "/../datagen.lua"), M.sh(preset), M.sh(dir), samples)
  if days then line = line .. (" --days %d"):format(days) end
  if not M.run(line) then return nil, "datagen failed" end
  return true
end

return M
