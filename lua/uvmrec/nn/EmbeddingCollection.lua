-- uvmrec.nn.EmbeddingCollection: embedding tables without pooling (sequence features).  The
-- output is [number of values, dim], one row per id in the input's value order (key-major,
-- so feature f's rows are those of its values); every table has the same dim.  Otherwise as
-- uvmrec.nn.EmbeddingBagCollection, whose code it shares.
local EBC = require "uvmrec.nn.EmbeddingBagCollection"

local EC = EBC:extend("EmbeddingCollection")

function EC:__init(opts)
  EBC.__init(self, opts, "none")
end

return EC
