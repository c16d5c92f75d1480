-- uvmrec.nn.QuantEmbeddingBagCollection: an inference-only EmbeddingBagCollection whose rows are
-- stored in a serving format (fp16, int8, int4, int2, or f32) and dequantized on the fly
-- (uvmrec.qtbe holds the options and the formats).
--
--   local q = ur.nn.QuantEmbeddingBagCollection.quantize(ebc, { format = "int4" })
--   local out = q:forward(kjt)         -- [batch, sum of the features' dims], as ebc's
--   q.errors.C3.max_abs                -- what quantizing table C3 cost
--
-- Or built empty from qtbe.new's options (tables with a format each) and filled with :load().
-- It has no gradient: backward is an error.
local Module = require "uvmrec.nn.Module"
local qtbe = require "uvmrec.qtbe"
local things = require("uvmrec.lib").things
local table_options = require "uvmrec.table_options"

local QEBC = Module:extend("QuantEmbeddingBagCollection")

-- Shared with QuantEmbeddingCollection, which differs only in its pooling.
function QEBC:__init(opts, pooling)
  Module.__init(self)
  local level = pooling and 4 or 3
  if type(opts) == "table" and opts.qtbe then
    self.qtbe = opts.qtbe
  else
    self.qtbe = assert(qtbe.new(table_options.module_options(self:type_name(), opts, pooling, level), level))
  end
  if (pooling == "none") == self.qtbe.pooled then
    error(("%s: the collection %s"):format(self:type_name(), self.qtbe.pooled and "pools" or "does not pool"), level)
  end
  self.placement = self.qtbe:placement()
  self.device = self.qtbe.device
  self.errors = opts.errors or {}
  self._out_shape = nil
end

-- A quantized copy of a trained (Embedding)BagCollection: opts.format (int8), formats =
-- {table = format}, placement, device, bounds, output_dtype.
function QEBC.quantize(ebc, opts)
  local q, errs = qtbe.from(ebc, opts, 2)
  if not q then error(errs, 2) end
  local cls = ebc.tbe.pooled and QEBC or require "uvmrec.nn.QuantEmbeddingCollection"
  return cls { qtbe = q, errors = errs }
end

function QEBC:updateOutput(input)
  local q = self.qtbe
  self:op(2, q.forward, q, input, self:op(2, table_options.module_output, self, q, input), self.stream)
  return self.output
end

-- backward, updateGradInput, accGradParameters: an error, at the caller's line.
local function no_gradient(self)
  error(self:type_name() .. ": quantized tables are for inference; they have no gradient", 2)
end
QEBC.updateGradInput, QEBC.accGradParameters, QEBC.backward = no_gradient, no_gradient, no_gradient

-- Tables are not parameters here: nothing trains them.
function QEBC.parameters(_, _, out) return out or {} end
function QEBC:table(name) return self.qtbe:table(name) end
function QEBC:load(name, rows, stream) return self.qtbe:load(name, rows, stream) end
function QEBC:set_permutation(name, perm) return self.qtbe:set_permutation(name, perm) end
function QEBC:features() return { unpack(self.qtbe.features) } end
function QEBC:skipped() return self.qtbe:skipped() end
-- bf16 precision makes the output bf16, as EmbeddingBagCollection's (a model's set_precision
-- sets it through set_output_precision; the engine's qtbe took its output dtype only when made).
function QEBC:set_output_precision(precision, level)
  table_options.module_precision(self, self.qtbe, precision, level + 1)
end

function QEBC:to() return self end
function QEBC:zero_grad() return self end

function QEBC:extra_repr()
  local formats = {}
  for _, name in ipairs(self.qtbe.table_names) do formats[self.qtbe.formats[name]] = true end
  local list = {}
  for f in pairs(formats) do list[#list + 1] = f end
  table.sort(list)
  return ("(%s, %s -> %d, %s)"):format(things(#self.qtbe.table_names, "table"), things(#self.qtbe.features, "feature"),
                                       self.qtbe.out_dim, table.concat(list, "/"))
end

return QEBC
