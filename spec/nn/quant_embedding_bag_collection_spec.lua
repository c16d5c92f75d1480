-- uvmrec.nn.QuantEmbeddingBagCollection: a trained EmbeddingBagCollection quantized (every table,
-- or per table) pools as the collection did, within each format's error; built from options and
-- loaded row by row it pools the rows given; it has no gradient.
local ur = require "uvmrec"
local qtbe = require "uvmrec.qtbe"

local function kjt()
  return ur.KJT { keys = { "u", "v", "w" }, values = { 3, 17, 5, 5, 0, 99, 2, 41, 7 },
                  weights = { 0.5, -1, 2, 1, 0.25, 1, -0.5, 1, 3 }, lengths = { 2, 1, 1, 0, 2, 3 } }
end

describe("nn.QuantEmbeddingBagCollection", function()
  it("pools a quantized copy of a trained collection within the error each table reports", function()
    local ebc = ur.nn.EmbeddingBagCollection { tables = { { name = "t", rows = 100, dim = 24, features = { "u", "w" } },
                                                          { name = "s", rows = 50, dim = 8, features = { "v" },
                                                            pooling = "mean" } },
                                              features = { "u", "v", "w" }, device = "cpu", seed = 3 }
    local ref = ebc:forward(kjt()):totable()
    for _, format in ipairs { "fp16", "int8", "int4", "int2" } do
      local q = ur.nn.QuantEmbeddingBagCollection.quantize(ebc, { format = format, formats = { s = "int8" } })
      local got = q:forward(kjt()):totable()
      -- |weights| of a bag sum to at most 4.5 here (w, sample 2)
      local bound = 4.5 * math.max(q.errors.t.max_abs, q.errors.s.max_abs) + 1e-6
      local moved = 0
      for i = 1, #ref do moved = math.max(moved, math.abs(got[i] - ref[i])) end
      assert.is_true(moved > 0 and moved <= bound, ("%s: moved %g, bound %g"):format(format, moved, bound))
      assert.equal(format, q.qtbe.formats.t)
      assert.equal("int8", q.qtbe.formats.s)
    end
  end)

  it("names what it cannot quantize: an option or table it does not know, the table of a bad row", function()
    local ebc = ur.nn.EmbeddingBagCollection { tables = { { name = "t", rows = 10, dim = 8 },
                                                          { name = "s", rows = 20, dim = 8 } }, device = "cpu" }
    local Q = ur.nn.QuantEmbeddingBagCollection
    -- each was ignored: every table took the default int8
    assert.has_error(function() Q.quantize(ebc, { fromat = "int4" }) end,
                     "quantized collection: unknown option 'fromat'; expected bounds, device, format, formats, "
                     .. "output_dtype, placement")
    assert.has_error(function() Q.quantize(ebc, { formats = { S = "int4" } }) end,
                     "quantized collection: formats names table 'S', which the collection does not have (tables: t, s)")
    local w = ebc.tbe:table("s")
    w:set(5 * 8 + 3, 0 / 0)
    w:free()
    -- the engine's message named row 5 alone
    assert.has_error(function() Q.quantize(ebc, { format = "int8" }) end,
                     "quantized collection: table 's': rows quantize: row 5 holds a value that is not finite or "
                     .. "beyond what int8 stores (|x| up to 32768)")
  end)

  it("pools the rows it is given, built from options", function()
    local q = ur.nn.QuantEmbeddingBagCollection {
      tables = { { name = "t", rows = 100, dim = 24, features = { "u", "w" }, format = "int8" },
                 { name = "s", rows = 100, dim = 8, features = { "v" }, format = "fp16" } },
      features = { "u", "v", "w" }, device = "cpu" }
    local rows = {}
    for _, t in ipairs { { "t", 24, "int8" }, { "s", 8, "fp16" } } do
      local src = ur.tensor({ 100, t[2] }):uniform(-1, 1, #t[1])
      rows[t[1]] = qtbe.dequantize(qtbe.quantize(src, t[3]), t[3], t[2]):totable()
      assert(q:load(t[1], (qtbe.quantize(src, t[3]))))
    end
    local out = q:forward(kjt()):totable()
    -- sample 1 of u: ids 3 and 17 with weights 0.5 and -1
    for c = 1, 24 do
      local want = 0.5 * rows.t[3 * 24 + c] - rows.t[17 * 24 + c]
      assert.is_true(math.abs(out[c] - want) <= 1e-6)
    end
    for _, method in ipairs { "backward", "updateGradInput", "accGradParameters" } do
      assert.has_error(function() q[method](q, kjt(), ur.tensor({ 2, 56 })) end,
                       "QuantEmbeddingBagCollection: quantized tables are for inference; they have no gradient")
    end
    assert.same({}, q:parameters())
    assert.has_error(function()
      ur.nn.QuantEmbeddingBagCollection { tables = { { name = "t", rows = 4, dim = 8 } }, pooling = "none" }
    end, "QuantEmbeddingBagCollection: pooling none; this module takes pooling sum or mean")
  end)
end)
