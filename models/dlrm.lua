-- models/dlrm.lua: DLRM (Naumov et al., 2019) assembled from a training config: a bottom MLP
-- over the dense features, pooled embeddings of the sparse ones, their interaction (DLRM's
-- pairwise dot products, or DCNv2's cross layers over everything side by side), and a top MLP
-- to one logit.  Loaded by the trainer with dofile (a config's model.file); returns
--   { DLRM = the class, build = function(cfg, opts) ... end }.
local ur = require "uvmrec"
local tconfig = require "uvmrec.train.config"
local dense = ur.dense
-- The classes by require, not through the lazy ur.nn namespace, whose cache outlives the
-- reloads of busted's spec files (a stale MLP would build ReLUs Sequential cannot fuse).
local Module = require "uvmrec.nn.Module"
local nn = {
  MLP = require "uvmrec.nn.MLP", EmbeddingBagCollection = require "uvmrec.nn.EmbeddingBagCollection",
  Interaction = require "uvmrec.nn.Interaction", CrossNet = require "uvmrec.nn.CrossNet",
  BCEWithLogits = require "uvmrec.nn.BCEWithLogits",
  ManagedCollisionCollection = require "uvmrec.nn.ManagedCollisionCollection",
}

local DLRM = Module:extend("DLRM")

-- DLRM(cfg, {gpu = true, device = n, sharding = plan}): with gpu, tables go where the config
-- places them on GPU device (default: the current one), else on the host; the dense part is
-- built on the host (to() moves it).  With sharding (a plan as uvmrec.dist.plan reads it), the
-- tables are built as this rank's shards of them (uvmrec.dist.shard).  Environmental failures
-- (memory, the HBM budget) raise.
function DLRM:__init(cfg, opts)
  Module.__init(self)
  opts = opts or {}
  local m, e = cfg.model, cfg.embeddings
  local gpu = opts.gpu and true or false
  self.interaction_kind = m.interaction
  self.num_dense, self.num_tables, self.dim = m.dense_features, #e.rows, e.dim
  self.bottom = nn.MLP({ m.dense_features, unpack(m.bottom_mlp) }, { input_grad = false })

  local rows, tables, own_lf = tconfig.table_rows(cfg), {}, {}
  for i, r in ipairs(rows) do
    local name = "C" .. i
    local own = e.tables[name] or {}
    if own.cache and own.cache.load_factor then own_lf[name] = { load_factor = own.cache.load_factor } end
    local place = own.placement or e.placement
    tables[i] = { name = name, rows = r, dim = e.dim, dtype = own.dtype or e.dtype,
                  -- managed and cached tables run on the CPU too (host memory, hints recorded)
                  placement = ((gpu and place ~= "auto") or place == "managed" or place == "cached")
                              and place or nil }
  end
  local o = e.optimizer or {}
  -- embeddings.cache: the collection's cache options (uvmrec.cache's), with the tables' own
  -- load factors
  local cache = e.cache and { tables = next(own_lf) and own_lf or nil }
  for k in pairs(cache and require("uvmrec.cache").OPTS or {}) do
    if k ~= "tables" then cache[k] = e.cache[k] end
  end
  local ebc = {
    tables = tables, pooling = e.pooling, bounds = e.bounds, seed = cfg.train.seed, cache = cache,
    device = not gpu and "cpu" or opts.device,
    optimizer = { o.name or "sgd", lr = o.lr or cfg.optimizer.lr, eps = o.eps,
                  weight_decay = o.weight_decay, beta1 = o.beta1, beta2 = o.beta2, max_grad = o.max_grad,
                  deterministic = o.deterministic },
  }
  if opts.sharding then
    ebc.vbe = e.vbe -- embeddings.vbe: each rank sends each feature's distinct bags (uvmrec.dist.shard)
    self.embeddings = require("uvmrec.dist").shard(ebc, opts.sharding)
  else
    self.embeddings = nn.EmbeddingBagCollection(ebc)
  end

  -- Managed collisions: raw ids to rows in front of the tables that have them (the map lives
  -- where the collection runs; it has no parameters, and is not among self.modules).
  local managed = tconfig.collisions(cfg)
  if next(managed) and opts.sharding then
    -- a round re-draws rows at the table's counters; a shard's are its logical table's
    error("DLRM: managed collisions (embeddings.collisions) need unsharded tables; this model is sharded "
          .. "(uvmrec.dist): turn one of them off", 0)
  end
  if next(managed) then
    local per = {}
    for i, c in pairs(managed) do per["C" .. i] = c end
    self.collisions = nn.ManagedCollisionCollection { collection = self.embeddings, tables = per,
                                                      seed = cfg.train.seed }
  end

  local d = m.bottom_mlp[#m.bottom_mlp]
  local width
  local pad
  if m.interaction == "dot" then
    -- The interaction's output is padded with zero columns to a multiple of 8, which the top
    -- MLP's first layer reads with zero weights: the same model, on rows the matrix products
    -- take aligned.  interaction_width stays the unpadded model's.
    pad = 8
    self.interaction = nn.Interaction { self_interaction = m.self_interaction, pad = true }
    width = dense.interaction_width(#rows, d, m.self_interaction)
    self._pair = {}
  else
    width = d + #rows * e.dim
    self.interaction = nn.CrossNet(width, m.cross_layers, { rank = m.cross_rank > 0 and m.cross_rank or nil })
  end
  self.interaction_width = width
  self.top = nn.MLP({ width, unpack(m.top_mlp) }, { last = "none", pad_to = pad })
  self.criterion = nn.BCEWithLogits()
  -- The MLPs' weight gradients go to a side stream on the GPU, beside the input gradients and
  -- the tables' backward; backward joins them before it returns.
  for _, mlp in ipairs { self.bottom, self.top } do
    for _, l in ipairs(mlp.modules) do
      if l.fuses_relu then l.async_wgrad = true end
    end
  end
  self.modules = { self.bottom, self.embeddings, self.interaction, self.top, self.criterion }
  for _, c in ipairs(self.modules) do c:share_arena(self) end
end

-- The logits [B, 1] of a batch (uvmrec.data.Batch: dense f32 [B, dense], sparse a KJT, and
-- the ticket of its cached rows when the prefetch pipeline brought them in ahead).  With
-- managed collisions the raw ids become rows first (counted when training).
function DLRM:updateOutput(batch)
  local x = self.bottom:forward(batch.dense)
  self._sparse = self.collisions and self.collisions:forward(batch.sparse) or batch.sparse
  local e = self.embeddings:forward(self._sparse, batch.ticket)
  local z
  if self._pair then
    self._pair[1], self._pair[2] = x, e
    z = self.interaction:forward(self._pair)
  else
    local rows = Module.rows_cols(x)
    self._cat = dense.concat({ x, e }, self:buffer("cat", Module.dtype_of(x), rows,
                                                   self.interaction_width), self.stream)
    z = self.interaction:forward(self._cat)
  end
  self._z = z
  self.output = self.top:forward(z)
  return self.output
end

-- Back through the top MLP, the interaction and the bottom MLP (gradients accumulate in the
-- dense parameters' .grad); the embedding rows the batch read are stepped here, fused, after
-- the guard's check of the dense gradients when there is one (model.guard).
function DLRM:backward(batch, gradOutput)
  local gz = self.top:backward(self._z, gradOutput)
  local gx, ge
  if self._pair then
    local g = self.interaction:backward(self._pair, gz)
    gx, ge = g[1], g[2]
  else
    local gc = self.interaction:backward(self._cat, gz)
    local rows = Module.rows_cols(gc)
    local dt = Module.dtype_of(gc)
    gx = self:buffer("gx", dt, rows, self.interaction_width - self.num_tables * self.dim)
    ge = self:buffer("ge", dt, rows, self.num_tables * self.dim)
    self._parts = self._parts or {}
    self._parts[1], self._parts[2] = gx, ge
    dense.split(gc, self._parts, self.stream)
  end
  self.bottom:backward(batch.dense, gx)
  if self.guard then
    -- train.nonfinite: the tables' step is gated by the check of every dense gradient, so it
    -- waits for the weight gradients of the side stream (uvmrec.train.guard)
    dense.join(self.stream)
    self.guard:check_grads(self.stream)
  end
  self.embeddings:backward(self._sparse, ge, batch.ticket)
  dense.join(self.stream)
  self.gradInput = nil
  return nil
end

DLRM.updateGradInput = DLRM.backward

-- Probabilities f32 [B, 1] of a batch (the sigmoid of the logits), for metrics; managed
-- collisions only look up.
function DLRM:predict(batch)
  local logits
  if self.collisions then
    -- counting back on whether the forward returns or raises (off, training counted nothing)
    local training = self.collisions.train
    self.collisions.train = false
    local ok, out = pcall(self.forward, self, batch)
    self.collisions.train = training
    if not ok then error(out, 0) end
    logits = out
  else
    logits = self:forward(batch)
  end
  local rows = Module.rows_cols(logits)
  if Module.dtype_of(logits) ~= "f32" then
    logits = dense.cast(logits, self:buffer("logits_f32", "f32", rows, 1), self.stream)
  end
  return dense.act_forward(logits, self:buffer("probs", "f32", rows, 1), "sigmoid", self.stream)
end

-- Parameters named by part: bottom.1.weight, embeddings.C3 (fused: no grad), top.3.bias, ...
function DLRM:parameters(prefix, out)
  out = out or {}
  prefix = prefix or ""
  self.bottom:parameters(prefix .. "bottom.", out)
  self.embeddings:parameters(prefix .. "embeddings.", out)
  self.interaction:parameters(prefix .. "interaction.", out)
  self.top:parameters(prefix .. "top.", out)
  return out
end

function DLRM:set_precision(precision, stream)
  for _, c in ipairs(self.modules) do
    local ok, err = c:set_precision(precision, stream)
    if not ok then return nil, err end
  end
  self.precision = precision
  return self
end

-- Numbers for a summary line and the run log.
function DLRM:stats()
  local dense_params, rows, table_bytes = 0, 0, 0
  for _, p in ipairs(self:parameters()) do
    if p.fused then
      rows = rows + p.tensor:size(1)
      table_bytes = table_bytes + p.tensor:nbytes()
    else
      dense_params = dense_params + p.tensor:numel()
    end
  end
  return { dense_params = dense_params, rows = rows, table_bytes = table_bytes,
           tables = self.num_tables, dim = self.dim, interaction = self.interaction_kind,
           interaction_width = self.interaction_width }
end

function DLRM:tostring()
  local s = self:stats()
  local function widths(seq)
    local w = {}
    for _, l in ipairs(seq.modules) do
      if l.out_features then w[#w + 1] = l.out_features end
    end
    return table.concat(w, "-")
  end
  local count, bytes = require("uvmrec.train.progress").count, require("uvmrec.train.progress").bytes
  return ("DLRM: %d dense -> bottom %s; %d tables of dim %d (%s rows, %s); %s interaction (%d) -> top %s; "
    .. "%s dense parameters, %s"):format(self.num_dense, widths(self.bottom), s.tables, s.dim, count(s.rows),
    bytes(s.table_bytes), s.interaction, s.interaction_width, widths(self.top), count(s.dense_params),
    self.precision)
end

local M = { DLRM = DLRM }

-- The model of a config, placed: on the current GPU when one is in use (opts.cpu: never),
-- with the config's precision; with opts.sharding (a plan; dist.init() done), its tables
-- sharded over the job's ranks and its dense part data-parallel.  Returns the model, or nil,
-- message (memory, the HBM budget).
function M.build(cfg, opts)
  opts = opts or {}
  Module.manual_seed(cfg.train.seed)
  local gpu = ur.gpu() and not opts.cpu
  local ok, model = pcall(DLRM, cfg, { gpu = gpu, device = opts.device, sharding = opts.sharding })
  if not ok then return nil, (tostring(model):gsub("^[^\n]-:%d+: ", "")) end
  if gpu then
    local moved, err = model:to("device", opts.device)
    if not moved then return nil, err end
  end
  local set, err = model:set_precision(cfg.model.precision)
  if not set then return nil, err end
  if opts.sharding then require("uvmrec.dist.ddp").data_parallel(model) end
  return model
end

return M
