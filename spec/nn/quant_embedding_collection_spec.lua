-- uvmrec.nn.QuantEmbeddingCollection: a trained EmbeddingCollection quantized gives one row per
-- id as the collection did (f32: its bits; int8: within the reported error).
local ur = require "uvmrec"

describe("nn.QuantEmbeddingCollection", function()
  it("gives each id's row as the EmbeddingCollection did", function()
    local ec = ur.nn.EmbeddingCollection { tables = { { name = "a", rows = 60, dim = 16 },
                                                      { name = "b", rows = 9, dim = 16 } }, device = "cpu", seed = 5 }
    local kjt = ur.KJT { keys = { "a", "b" }, values = { 4, 59, 0, 8, 8, 3 }, lengths = { 2, 1, 2, 1 } }
    local ref = ec:forward(kjt):totable()
    local f = ur.nn.QuantEmbeddingCollection.quantize(ec, { format = "f32" })
    assert.equal("QuantEmbeddingCollection", f:type_name())
    assert.same(ref, f:forward(kjt):totable())
    local q = ur.nn.QuantEmbeddingCollection.quantize(ec, { format = "int8" })
    local got = q:forward(kjt):totable()
    assert.equal(6 * 16, #got)
    local worst = math.max(q.errors.a.max_abs, q.errors.b.max_abs)
    for i = 1, #ref do assert.is_true(math.abs(got[i] - ref[i]) <= worst + 1e-7) end
  end)
end)
