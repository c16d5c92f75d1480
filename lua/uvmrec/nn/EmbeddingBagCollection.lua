-- uvmrec.nn.EmbeddingBagCollection: many embedding tables pooled per bag in one pass, with
-- backward fused with the optimizer (uvmrec.tbe holds the options).
--
--   local ebc = ur.nn.EmbeddingBagCollection{
--     tables = { { name = "t_cat", rows = 1e6, dim = 128, features = { "cat" } }, ... },
--     optimizer = { "rowwise_adagrad", lr = 0.01 } }
--   local out = ebc:forward(kjt)       -- [batch, sum of the features' dims]
--   ebc:backward(kjt, grad_out)        -- steps the rows the batch read; no .grad exists
--
-- The input is a KJT (keys in the collection's feature order; a variable batch per key with
-- its stride_per_key_per_rank and inverse_indices) or a table {values=, offsets=[, weights=]
-- [, stride_per_key_per_rank=, inverse_indices=]}.  With cached tables a batch may bring a
-- ticket, its rows brought into the cache ahead (prepare), to forward and backward.  Tables
-- keep the placement they were built with: to() moves nothing, and the optimizer lives in the
-- collection, so parameters() lists the tables (with grad = nil and fused = true) for
-- checkpoints and hint policies only.
local Module = require "uvmrec.nn.Module"
local tbe = require "uvmrec.tbe"
local table_options = require "uvmrec.table_options"
local things = require("uvmrec.lib").things

local EBC = Module:extend("EmbeddingBagCollection")

-- Shared with EmbeddingCollection, which differs only in its pooling (and calls from one
-- level deeper: errors point at the line that built the module).
function EBC:__init(opts, pooling)
  Module.__init(self)
  local level = pooling and 4 or 3
  opts = table_options.module_options(self:type_name(), opts, pooling, level)
  self.options = opts -- what it was built from: uvmrec.dist.shard builds shards from them
  self.tbe = assert(tbe.new(opts, level))
  self.placement = self.tbe:placement()
  self.device = self.tbe.device
  self.precision = self.tbe.output_dtype == "bf16" and "bf16" or "f32"
  self._out_shape = nil
end

-- forward(input[, ticket]) (Module's); in evaluation (no backward follows) the batch's rows are
-- done with at once.  Errors name the module (Module:op), at the line that called forward.
function EBC:updateOutput(input, ticket)
  local t = self.tbe
  self:op(2, t.forward, t, input, self:op(2, table_options.module_output, self, t, input), self.stream, ticket)
  if not self.train then self:op(2, t.retire, t, ticket, false, self.stream) end
  return self.output
end

-- Ids have no gradient.
EBC.updateGradInput = Module.no_grad_input

-- The optimizer step, fused: every row the input read is updated in place.  Called by
-- accGradParameters and backward(input, gradOutput[, ticket]), whose callers its errors name.
local function step(self, input, gradOutput, ticket)
  self:op(3, self.tbe.backward, self.tbe, input, gradOutput, self.stream, ticket)
end

function EBC:accGradParameters(input, gradOutput, ticket)
  step(self, input, gradOutput, ticket)
end

function EBC:backward(input, gradOutput, ticket)
  self:updateGradInput(input, gradOutput)
  step(self, input, gradOutput, ticket)
  return self.gradInput
end

-- A batch's ticket: its rows brought into the cache of the cached tables on stream, ahead of
-- its forward (nil without cached tables); retire(ticket, false) drops a batch never trained.
function EBC:prepare(input, stream) return self.tbe:prepare(input, stream) end
function EBC:retire(ticket, trained, stream) return self.tbe:retire(ticket, trained, stream) end

-- The cache's statistics (uvmrec.cache stats()), or nil without cached tables.
function EBC:cache_stats() return self.tbe.cache and self.tbe.cache:stats() end

-- The deduplicated gradient without a step: { [table] = { rows =, grad = } }.
function EBC:sparse_grad(input, gradOutput)
  local g = self:op(2, self.tbe.sparse_grad, self.tbe, input, gradOutput, self.stream)
  return g -- not a tail call: the error names the line that called sparse_grad
end

function EBC:parameters(prefix, out)
  out = out or {}
  prefix = prefix or ""
  for _, t in ipairs(self.tbe:tables()) do
    out[#out + 1] = { name = prefix .. t.name, tensor = t.tensor, module = self, fused = true }
  end
  return out
end

-- Table `name` as a [rows, dim] view; its optimizer state { sum = } or { exp_avg =, exp_avg_sq = }.
function EBC:table(name) return self.tbe:table(name) end
function EBC:state(name) return self.tbe:state(name) end

-- The collection as a checkpoint component (uvmrec.checkpoint's registry) named `name`: every
-- table and its optimizer state (state() flushes a cache first, so the tables' own storage
-- holds the truth) and the optimizer's step.  Loading leaves a cache empty and drops the far
-- rows' copies (far_refresh): the copies they held are stale.
function EBC:component(name)
  local t = self.tbe
  return { name = name, whole = { "step" },
    state = function()
      local ts = {}
      for _, tn in ipairs(t.table_names) do
        ts[tn] = t:table(tn)
        for k, st in pairs(t:state(tn)) do ts[tn .. "." .. k] = st end
      end
      return { tensors = ts, meta = { step = t:step() } }
    end,
    load = function(_, meta)
      t:set_step(meta.step)
      if t.cache then assert(t.cache:invalidate()) end
      assert(t:far_refresh())
    end }
end

-- Every table's optimizer state, by table name.
function EBC:optimizer_state()
  local out = {}
  for _, name in ipairs(self.tbe.table_names) do out[name] = self.tbe:state(name) end
  return out
end

function EBC:features() return { unpack(self.tbe.features) } end
-- The fused optimizer's learning rate (a parameter group of uvmrec.optim.Schedule).
function EBC:lr() return self.tbe:lr() end
function EBC:set_lr(lr) self.tbe:set_lr(lr) return self end
function EBC:skipped() return self.tbe:skipped() end
function EBC:set_gate(flags) self.tbe:set_gate(flags) return self end
-- The pages of the managed tables' rows an input reads (uvmrec.tbe: prefetch_pages, page_runs).
function EBC:prefetch_pages(input, stream, location) return self.tbe:prefetch_pages(input, stream, location) end
function EBC:page_runs(input, location) return self.tbe:page_runs(input, location) end

-- Tables stay where they were built (their placement is per table).
function EBC:to() return self end

function EBC:zero_grad() return self end

-- bf16 precision makes the output (and the gradient it takes) bf16.  Setting the collection's
-- output dtype has only misuse to fail on (a freed collection): an error naming the module, at
-- the caller's line, with the precision as it was.  A model's set_precision (Module's) sets it
-- through set_output_precision, precision checked, level as error's.
function EBC:set_output_precision(precision, level)
  table_options.module_precision(self, self.tbe, precision, level + 1)
end

function EBC:extra_repr()
  return ("(%s, %s -> %d, %s)"):format(things(#self.tbe.table_names, "table"), things(#self.tbe.features, "feature"),
                                       self.tbe.out_dim, self.tbe.optimizer)
end

return EBC
