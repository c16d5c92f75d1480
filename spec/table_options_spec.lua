-- uvmrec.table_options: the option checks tbe, qtbe and mc share, and the options the nn
-- collection modules pass on.
local table_options = require "uvmrec.table_options"

local O = table_options.checks("test collection")

local function message(f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok)
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

describe("uvmrec.table_options", function()
  it("opens the options: a table of known keys with a non-empty list of tables", function()
    local t = { { name = "a" } }
    assert.equal(t, O.open({ tables = t }, { tables = true }, "", 1))
    assert.equal("test collection: expected a table of options", message(O.open, 3, {}, "", 1))
    assert.equal("test collection: unknown collection option 'x'; expected tables",
                 message(O.open, { tables = t, x = 1 }, { tables = true }, "collection ", 1))
    assert.equal("test collection: tables must be a non-empty list",
                 message(O.open, { tables = {} }, { tables = true }, "", 1))
  end)

  it("names each table once and records it", function()
    local self = { table_index = { a = 0 }, table_names = { "a" } }
    assert.equal("b", O.named(2, { name = "b" }, { name = true }, self, 1))
    assert.same({ { a = 0, b = 1 }, { "a", "b" } }, { self.table_index, self.table_names })
    assert.equal("test collection: table 3 is not a table", message(O.named, 3, 7, { name = true }, self, 1))
    assert.equal("test collection: unknown table option 'rows'; expected name",
                 message(O.named, 3, { name = "c", rows = 1 }, { name = true }, self, 1))
    assert.equal("test collection: table 3 needs a name", message(O.named, 3, { name = "" }, { name = true }, self, 1))
    assert.equal("test collection: two tables are named 'b'",
                 message(O.named, 3, { name = "b" }, { name = true }, self, 1))
    assert.same({ "a", "b" }, self.table_names)
  end)

  it("checks an input's keys against the collection's key order", function()
    O.same_keys({ "x", "y" }, { "x", "y" }, 1)
    assert.equal("test collection: the input's keys {y, x} are not the collection's features {x, y}",
                 message(O.same_keys, { "y", "x" }, { "x", "y" }, 1))
    assert.equal("test collection: the input's keys {x} are not the map's features {x, y}",
                 message(O.same_keys, { "x" }, { "x", "y" }, 1, "map's"))
  end)

  it("gathers the tables' features and the input's key order", function()
    local on, list = {}, {}
    O.features("a", { features = { "x", "y" } }, on, list, 1)
    O.features("b", {}, on, list, 1)
    assert.same({ "x", "y", "b" }, list)
    assert.same({ x = "a", y = "a", b = "b" }, on)
    assert.equal(list, O.key_order(nil, on, list, 1))
    assert.same({ "b", "y", "x" }, O.key_order({ "b", "y", "x" }, on, list, 1))
    assert.equal("test collection: feature 'x' is on tables 'a' and 'c'",
                 message(O.features, "c", { features = { "x" } }, on, {}, 1))
    assert.equal("test collection: table 'c' has a feature that is not a string",
                 message(O.features, "c", { features = { 1 } }, on, {}, 1))
    assert.equal("test collection: features lists 2 names; the tables have 3 features",
                 message(O.key_order, { "x", "y" }, on, list, 1))
    assert.equal("test collection: feature 'z' is on no table", message(O.key_order, { "x", "y", "z" }, on, list, 1))
  end)

  it("finds a table by name, or lists the tables", function()
    local self = { table_index = { a = 0, b = 1 }, table_names = { "a", "b" } }
    assert.equal(1, O.table_index(self, "b", 1))
    assert.equal("test collection: no table named 'c' (tables: a, b)", message(O.table_index, self, "c", 1))
  end)

  it("checks whole numbers and names from a map", function()
    assert.equal(3, O.whole(3, "rows", 1, 1))
    assert.equal("test collection: rows is 0; expected a whole number >= 1", message(O.whole, 0, "rows", 1, 1))
    assert.equal("test collection: seed is 1.5; expected a whole number >= 0", message(O.whole, 1.5, "seed", 1))
    assert.equal(2, O.pick({ sum = 1, mean = 2 }, "mean", "pooling", 1))
    assert.equal("test collection: pooling 'max' is not one of mean, sum",
                 message(O.pick, { sum = 1, mean = 2 }, "max", "pooling", 1))
  end)

  it("fills what tbe's and qtbe's configs share, and the engine's feature arguments", function()
    local ffi = require "ffi"
    local cfg = ffi.new("ur_qtbe_config")
    local tc = ffi.new("ur_qtbe_table_config")
    assert.equal("mean", O.table_config(tc, "a", { rows = 10, dim = 4 }, { pooling = "mean" }, 1))
    assert.same({ "a", 10, 4, table_options.POOLINGS.mean },
                { ffi.string(tc.name), tonumber(tc.rows), tonumber(tc.dim), tonumber(tc.pooling) })
    assert.equal("none", O.table_config(tc, "a", { rows = 10, dim = 4, pooling = "none" }, { pooling = "mean" }, 1))
    assert.equal("test collection: table 'a' dim is 0; expected a whole number from 1 to 2147483647",
                 message(O.table_config, tc, "a", { rows = 10, dim = 0 }, {}, 1))
    -- the engine's int32_t: it was refused as 'tbe: table 'a' has dim -2147483648'
    assert.equal("test collection: table 'a' dim is 1099511627776; expected a whole number from 1 to 2147483647",
                 message(O.table_config, tc, "a", { rows = 10, dim = 2 ^ 40 }, {}, 1))
    assert.equal("test collection: table 'a' pooling 'max' is not one of mean, none, sum",
                 message(O.table_config, tc, "a", { rows = 10, dim = 4, pooling = "max" }, {}, 1))
    local device, place = O.engine_config({ device = "cpu", bounds = "warn" }, cfg, 1)
    assert.same({ -1, "host" }, { device, place })
    assert.same({ -1, table_options.BOUNDS.warn, table_options.OUTPUT_DTYPES.f32 },
                { cfg.device, cfg.bounds, cfg.out_dtype })
    assert.equal("managed", select(2, O.engine_config({ device = "cpu", placement = "managed" }, cfg, 1)))
    assert.equal("test collection: output dtype 'f16' is not one of bf16, f32",
                 message(O.engine_config, { device = "cpu", output_dtype = "f16" }, cfg, 1))
    local self = { features = { "y", "x" }, feature_index = {}, table_index = { a = 0, b = 1 },
                   dims = { a = 4, b = 8 } }
    local nf, ft, fnames = O.feature_arrays(self, { x = "a", y = "b" })
    assert.equal(2, nf)
    assert.same({ 1, 0, "y", "x" }, { ft[0], ft[1], ffi.string(fnames[0]), ffi.string(fnames[1]) })
    assert.same({ y = 0, x = 1 }, self.feature_index)
    assert.same({ 8, 4 }, self.feature_dims)
  end)

  it("runs the tables' loop: each one's own fields between the shared ones and its features, then the key order",
     function()
    local ffi = require "ffi"
    local tc = ffi.new("ur_qtbe_table_config[2]")
    local self = { table_index = {}, table_names = {}, features = {}, feature_index = {}, dims = {} }
    local seen = {}
    local tables = { { name = "a", rows = 10, dim = 4, features = { "x", "y" } }, { name = "b", rows = 3, dim = 8 } }
    local function each(s, ctx, c, name, t, pooling)
      seen[#seen + 1] = { name, tonumber(c.rows), pooling, #s.features, ctx }
      s.dims[name] = t.dim
    end
    local nf, ft, fnames = O.tables(tables, tc, { name = true, rows = true, dim = true, features = true }, self,
                                    { pooling = "mean", features = { "b", "y", "x" } }, each, "ctx", 1)
    assert.same({ { "a", 10, "mean", 0, "ctx" }, { "b", 3, "mean", 2, "ctx" } }, seen)
    assert.same({ "a", "b" }, self.table_names)
    assert.same({ "b", "y", "x" }, self.features)
    assert.same({ 3, 1, 0, 0, "b", "y", "x" }, { nf, ft[0], ft[1], ft[2], ffi.string(fnames[0]),
                                                 ffi.string(fnames[1]), ffi.string(fnames[2]) })
    assert.same({ 8, 4, 4 }, self.feature_dims)
    -- each's errors, with the level it is given, point at the line that called tables
    local line
    local ok, err = pcall(function()
      line = debug.getinfo(1, "l").currentline + 1
      O.tables({ { name = "c", rows = 1, dim = 1 } }, tc, { name = true, rows = true, dim = true },
               { table_index = {}, table_names = {}, features = {}, feature_index = {}, dims = {} }, {},
               function(_, _, _, name, _, _, level) O.fail("table '" .. name .. "' refused", level) end, nil, 1)
    end)
    assert.is_false(ok)
    assert.matches("table_options_spec.lua:" .. line .. ": test collection: table 'c' refused", err, 1, true)
  end)

  it("points its errors at the caller's line", function()
    local line
    local ok, err = pcall(function()
      line = debug.getinfo(1, "l").currentline + 1
      O.whole(-1, "rows", 1)
    end)
    assert.is_false(ok)
    assert.matches("table_options_spec.lua:" .. line .. ": ", err, 1, true)
  end)

  it("gives a module's options: pooling fixed on a copy, or checked to be sum or mean", function()
    local opts = { tables = { { name = "a" } }, pooling = "mean" }
    assert.equal(opts, table_options.module_options("M", opts, nil, 1))
    local o = table_options.module_options("M", opts, "none", 1)
    assert.are_not.equal(opts, o)
    assert.same({ "none", "mean" }, { o.pooling, opts.pooling })
    assert.equal("M: expected a table of options", message(table_options.module_options, "M", 1, nil, 1))
    assert.equal("M: pooling none; this module takes pooling sum or mean",
                 message(table_options.module_options, "M", { tables = {}, pooling = "none" }, nil, 1))
    assert.equal("M: table 'a' pools by sum; this module takes pooling none",
                 message(table_options.module_options, "M", { tables = { { name = "a", pooling = "sum" } } },
                         "none", 1))
  end)

  it("gives a collection's placement and a new output of its shape and dtype where it runs", function()
    local coll = { device = -1, output_dtype = "bf16", placement = table_options.placement,
                   output_shape = function(_, input) return input end }
    assert.equal("host", coll:placement())
    local out = assert(table_options.new_output(coll, { 3, 5 }))
    assert.same({ { 3, 5 }, "bf16", "host" }, { { out:size(1), out:size(2) }, out:dtype(), out:placement() })
    out:free()
    assert.equal("device", table_options.placement({ device = 0 }))
  end)

  it("keeps a module's output while the shape holds and makes a new one (freeing the old) when not", function()
    local made, freed = 0, 0
    local shape = { 4, 8 }
    local coll = {
      output_shape = function(_, input) return input or shape end,
      new_output = function()
        made = made + 1
        return { n = made, free = function() freed = freed + 1 end }
      end,
    }
    local m = {}
    local a = table_options.module_output(m, coll)
    assert.equal(a, table_options.module_output(m, coll))
    assert.same({ 1, 0 }, { made, freed })
    local b = table_options.module_output(m, coll, { 2, 8 })
    assert.are_not.equal(a, b)
    assert.same({ 2, 1 }, { made, freed })
    m.output = nil -- a module that dropped its output (a new precision) gets a new one
    assert.equal(3, table_options.module_output(m, coll, { 2, 8 }).n)
  end)

  it("loads rows of the table's dtype and shape only, naming the table (a copy checks the count alone)", function()
    local ur = require "uvmrec"
    local qtbe = require "uvmrec.qtbe"
    local c = assert(require("uvmrec.tbe").new { device = "cpu", tables = { { name = "t", rows = 10, dim = 4 } } })
    local src = ur.tensor({ 10, 4 }):uniform(-1, 1, 3)
    assert.equal(c, c:load("t", src))
    assert.equal(src[13], c:table("t")[13])
    for _, shape in ipairs { { 4, 10 }, { 40 } } do
      assert.equal(("embedding collection: load of table 't': src is f32 [%s]; expected f32 [10, 4], the table's "
                    .. "dtype and shape"):format(table.concat(shape, ", ")),
                   message(function() c:load("t", ur.tensor(shape)) end))
    end
    assert.equal("embedding collection: load of table 't': src is f16 [10, 4]; expected f32 [10, 4], the table's "
                 .. "dtype and shape", message(function() c:load("t", ur.tensor({ 10, 4 }, { dtype = "f16" })) end))
    local q = assert(qtbe.new { device = "cpu", tables = { { name = "t", rows = 10, dim = 8, format = "int8" } } })
    local rows = qtbe.quantize(ur.tensor({ 10, 8 }):uniform(-1, 1, 3), "int4")
    assert.equal("quantized collection: load of table 't': src is u8 [10, 8]; expected u8 [10, 12], the table's "
                 .. "dtype and shape", message(function() q:load("t", rows) end))
    -- quantize's second result (its error) passed on as the stream: named, not "used after free()"
    assert.equal("stream: expected a handle, got a table",
                 message(function() q:load("t", qtbe.quantize(ur.tensor({ 10, 8 }):fill(0.5), "int8")) end))
  end)
end)
