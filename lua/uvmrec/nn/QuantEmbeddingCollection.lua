-- uvmrec.nn.QuantEmbeddingCollection: the unpooled QuantEmbeddingBagCollection, one row per id
-- (as uvmrec.nn.EmbeddingCollection, inference only), every table of the same dim.
local QEBC = require "uvmrec.nn.QuantEmbeddingBagCollection"

local QEC = QEBC:extend("QuantEmbeddingCollection")

function QEC:__init(opts)
  QEBC.__init(self, opts, "none")
end

QEC.quantize = QEBC.quantize

return QEC
