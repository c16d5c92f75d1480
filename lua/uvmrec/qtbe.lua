-- Quantized embedding collections: rows in a serving format (f32, fp16, int8, int4, int2; the
-- formats are uvmrec.h's section 10), converted by the engine, and the engine's ur_qtbe as a
-- Lua object: an inference-only embedding collection.  The nn modules
-- QuantEmbeddingBagCollection and QuantEmbeddingCollection are built on it.
--
--   local qtbe = require "uvmrec.qtbe"
--   local rows, err = qtbe.quantize(ebc:table("C1"), "int4")   -- u8 [rows, row bytes]; err.max_abs
--   local q = qtbe.new{ tables = { { name = "C1", rows = 1000, dim = 16, format = "int4" } } }
--   q:load("C1", rows)
--   local out = q:forward(kjt)                 -- [batch, 16]
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local kjt = require "uvmrec.kjt"
local C, check, must = lib.C, lib.check, lib.must

local M = {}
local methods = {}
local mt = { __index = methods }

M.FORMATS = { "f32", "fp16", "int8", "int4", "int2" }

local PLACES = { device = C.UR_PLACE_DEVICE, managed = C.UR_PLACE_MANAGED, host = C.UR_PLACE_HOST }
local OPTS = { tables = true, features = true, bounds = true, device = true, output_dtype = true,
               pooling = true, placement = true, format = true }
local TABLE_OPTS = { name = true, rows = true, dim = true, format = true, pooling = true,
                     placement = true, modulo = true, features = true }

local table_options = require "uvmrec.table_options"
local O = table_options.checks("quantized collection")
local pick, whole = O.pick, O.whole

-- The format's enum, from its name ("f16" is fp16 too).
function M.format_of(name, level)
  return lib.enum(C.ur_qformat_parse, "ur_qformat", name, "table format", (level or 1) + 1)
end

-- Bytes of one stored row of dim elements.
function M.row_bytes(format, dim)
  local n = tonumber(C.ur_qformat_row_bytes(M.format_of(format, 2), dim))
  if n < 0 then error(("quantized rows: dim %s is not a multiple of 4 from 4 to 1024"):format(tostring(dim)), 2) end
  return n
end

-- The tensor shape and dtype rows of a format take: {rows, cols}, dtype.
function M.shape(format, rows, dim)
  local f = M.format_of(format, 2)
  if f == C.UR_QFORMAT_F32 then return { rows, dim }, "f32" end
  if f == C.UR_QFORMAT_F16 then return { rows, dim }, "f16" end
  return { rows, M.row_bytes(format, dim) }, "u8"
end

local qerr = ffi.new("ur_qerror")

-- The error of quantized rows from the engine's sums: {max_abs, rms, rel_rms (of the rows' rms),
-- max_ratio (to the format's bound), count, sum_sq, ref_sum_sq}.
local function error_of(max_abs, sum_sq, ref_sum_sq, max_ratio, count)
  local n = math.max(count, 1)
  return { max_abs = max_abs, rms = math.sqrt(sum_sq / n),
           rel_rms = ref_sum_sq > 0 and math.sqrt(sum_sq / ref_sum_sq) or 0, max_ratio = max_ratio,
           count = count, sum_sq = sum_sq, ref_sum_sq = ref_sum_sq }
end

-- Rows [rows, dim] (f32, f16 or bf16; host, pinned or managed) in a format: into `into` (a host
-- tensor of the format's shape, reused from block to block) or a new host tensor, and the error
-- (error_of's).  A value the format cannot hold raises, naming the row: rows row0.. of a table
-- when the rows are a block of it starting at row0 (default 0).
function M.quantize(src, format, row0, into)
  local f = M.format_of(format, 2)
  lib.ptr(src, "src", 2)
  if src:dim() ~= 2 then
    error(("quantize: src must be rows [rows, dim], got [%s]"):format(table.concat(src:size(), ", ")), 2)
  end
  local shape, dtype = M.shape(format, src:size(1), src:size(2))
  local dst = into or assert(tensor.tensor(shape, { dtype = dtype }))
  if C.ur_rows_quantize(lib.ptr(src, "src", 2), lib.ptr(dst, "dst", 2), qerr, f) ~= 0 then
    local err = ffi.string(C.ur_last_error())
    if dst ~= into then dst:free() end
    -- the engine counts rows from the block's first
    if row0 and row0 > 0 then
      err = err:gsub("^(rows quantize: row )(%d+)", function(p, r) return p .. (tonumber(r) + row0) end, 1)
    end
    error(err, 2)
  end
  return dst, error_of(qerr.max_abs, qerr.sum_sq, qerr.ref_sum_sq, qerr.max_ratio, tonumber(qerr.count))
end

-- The error of a table quantized a block of rows at a time: a's (nil: none yet) and block b's
-- (nil: none) as one.
function M.merge_error(a, b)
  a = a or error_of(0, 0, 0, 0, 0)
  if not b then return a end
  return error_of(math.max(a.max_abs, b.max_abs), a.sum_sq + b.sum_sq, a.ref_sum_sq + b.ref_sum_sq,
                  math.max(a.max_ratio, b.max_ratio), a.count + b.count)
end

-- Rows of a format back to f32 [rows, dim] (a new host tensor).
function M.dequantize(src, format, dim)
  local f = M.format_of(format, 2)
  local dst = assert(tensor.tensor({ src:size(1), dim }))
  must(C.ur_rows_dequantize(lib.ptr(src, "src", 2), lib.ptr(dst, "dst", 2), f))
  return dst
end

local wrap_qtbe, free_qtbe = lib.handle_type("ur_qtbe", C.ur_qtbe_free, {})

-- A table's own fields in its engine config c (O.tables' each; x: qtbe.new's opts and the
-- default placement).
local function configure_table(self, x, c, name, t, _, lvl)
  local format = t.format or x.opts.format or "f32"
  c.format = M.format_of(format, lvl)
  c.place = pick(PLACES, t.placement or x.default_place, "table '" .. name .. "' placement", lvl)
  c.modulo = whole(t.modulo or 0, "table '" .. name .. "' modulo", lvl)
  self.dims[name], self.rows[name], self.formats[name] = t.dim, t.rows, format
end

-- qtbe.new(opts), opts:
--   tables = { { name=, rows=, dim=, format="f32", pooling="sum", placement=, modulo=0,
--                features={...} (default {name}) }, ... }
--   features = { ... } the input's key order (default: each table's features in table order)
--   bounds = "fatal" | "warn" | "off";  device = a GPU ordinal or "cpu" (default: the current GPU)
--   output_dtype = "f32" | "bf16";  pooling, placement, format: table defaults
-- Rows start as zeros: load() them.  Environmental failures return nil, message.
function M.new(opts, level)
  level = (level or 1) + 1
  local tables = O.open(opts, OPTS, "", level)
  local cfg = ffi.new("ur_qtbe_config")
  local device, default_place = O.engine_config(opts, cfg, level)
  local n = #tables
  local tc = ffi.new("ur_qtbe_table_config[?]", n)
  local self = { table_index = {}, table_names = {}, features = {}, feature_index = {}, dims = {},
                 rows = {}, formats = {} }
  local nf, ft, fnames = O.tables(tables, tc, TABLE_OPTS, self, opts, configure_table,
                                  { opts = opts, default_place = default_place }, level)
  local out = ffi.new("ur_qtbe *[1]")
  local ok, err = check(C.ur_qtbe_new(out, cfg, n, tc, nf, ft, fnames), level)
  if not ok then return nil, err end
  self.h = wrap_qtbe(out[0])
  table_options.set_output(self, device, tonumber(C.ur_qtbe_out_dim(out[0])), tables, opts)
  return setmetatable(self, mt)
end

local H, S, T = lib.method_ptrs("quantized collection")

function methods:free() free_qtbe(self.h) end

local table_index = O.table_index

local out_tensor = ffi.new("ur_tensor *[1]")

-- Table `name`'s stored rows as a view (u8 [rows, row bytes], or [rows, dim] of f16 / f32).
function methods:table(name)
  must(C.ur_qtbe_table(H(self), table_index(self, name, 2), out_tensor))
  return tensor.wrap(out_tensor[0])
end

-- load(name, src[, stream]): copies rows in the table's format (as quantize() gives them) into
-- table `name`.
function methods:load(name, src, stream)
  return table_options.load(self, name, src, stream, "quantized collection", 2)
end

-- Row id r of table `name` is stored at row perm[r] (i64 [rows]); nil: the identity.
function methods:set_permutation(name, perm)
  local ok, err = check(C.ur_qtbe_set_permutation(H(self), table_index(self, name, 2),
                                                  perm ~= nil and T(perm, "perm", 2) or nil), 2)
  if not ok then return nil, err end
  return self
end

-- The output's dtype from now on, "f32" or "bf16" (not while a forward runs).
function methods:set_output_dtype(dtype)
  must(C.ur_qtbe_set_out_dtype(H(self), pick(table_options.OUTPUT_DTYPES, dtype, "output dtype", 2)))
  self.output_dtype = dtype
  return self
end

function methods:skipped() return tonumber(C.ur_qtbe_skipped(H(self))) end
function methods:bytes() return tonumber(C.ur_qtbe_bytes(H(self))) end

-- values, offsets, weights of a KJT (keys in the collection's order) or {values=, offsets=}.
-- A KJT not known checked is checked first (kjt.need_checked: on a GPU the kernels read its
-- offsets as given), unless `sizes` (the caller reads only sizes); nil, message where the check
-- itself failed.
function methods:_input(input, level, sizes)
  level = level + 1
  if type(input) ~= "table" and type(input) ~= "cdata" then
    error("quantized collection: input must be a KJT or a table {values=, offsets=[, weights=]}", level)
  end
  local values, offsets, weights
  if type(input.values) == "function" then
    O.same_keys(input:keys(), self.features, level)
    if input:variable_stride() then
      error("quantized collection: a variable batch per feature is not served; expand() it first", level)
    end
    if not sizes and kjt.is(input) then
      local ok, err = kjt.need_checked(input, "quantized collection", level)
      if not ok then return nil, err end
    end
    values, offsets, weights = input:values(), input:offsets(), input:weights()
  else
    values, offsets, weights = input.values, input.offsets, input.weights
  end
  if values == nil or offsets == nil then error("quantized collection: the input has no values or offsets", level) end
  return values, offsets, weights
end

function methods:output_shape(input)
  local values, offsets = self:_input(input, 2, true)
  if not self.pooled then return { values:numel(), self.out_dim } end
  -- no offsets: 0 rows (the forward then names the empty offsets)
  return { math.max(0, math.floor((offsets:numel() - 1) / #self.features)), self.out_dim }
end

methods.placement, methods.new_output = table_options.placement, table_options.new_output

-- forward(input[, out][, stream]): pooled embeddings [batch, out_dim], or one row per value.
function methods:forward(input, out, stream)
  local values, offsets, weights = self:_input(input, 2)
  if not values then return nil, offsets end
  if out == nil then
    local err
    out, err = self:new_output(input)
    if not out then return nil, err end
  end
  local ok, err = check(C.ur_qtbe_forward(S(stream), H(self), T(values, "values", 2), T(offsets, "offsets", 2),
                                          weights ~= nil and T(weights, "weights", 2) or nil, T(out, "out", 2)), 2)
  if not ok then return nil, err end
  return out
end

-- A quantized copy of a trained collection (uvmrec.tbe, or the nn module holding one):
-- opts.format (default "int8") for every table, opts.formats = {name = format} per table,
-- opts.placement, device, bounds, output_dtype as new().  Rows keep the collection's layout
-- (its permutation comes along).  Returns the collection and {name = error} per table.
local FROM_OPTS = { format = true, formats = true, placement = true, device = true, bounds = true,
                    output_dtype = true }

function M.from(c, opts, level)
  level = (level or 1) + 1
  opts = opts or {}
  local src = c.tbe or c
  -- a misspelt option or table name was ignored: every table took the default format
  O.check_keys(opts, FROM_OPTS, "", level)
  if opts.formats ~= nil and type(opts.formats) ~= "table" then
    O.fail("formats must map table names to formats", level)
  end
  for name in pairs(opts.formats or {}) do
    if src.rows[name] == nil then
      O.fail(("formats names table '%s', which the collection does not have (tables: %s)"):format(tostring(name),
        table.concat(src.table_names, ", ")), level)
    end
  end
  local tables, errs = {}, {}
  for i, name in ipairs(src.table_names) do
    tables[i] = { name = name, rows = src.rows[name], dim = src.dims[name],
                  format = (opts.formats or {})[name] or opts.format or "int8",
                  pooling = src.poolings[name], placement = opts.placement, features = {} }
  end
  for i, f in ipairs(src.features) do
    local t = tables[C.ur_tbe_feature_table(lib.ptr(src.h, "embedding collection", level), i - 1) + 1]
    t.features[#t.features + 1] = f
  end
  local q, err = M.new({ tables = tables, features = src.features, device = opts.device, bounds = opts.bounds,
                         output_dtype = opts.output_dtype }, level)
  if not q then return nil, err end
  for _, t in ipairs(tables) do
    local w = src:table(t.name)
    if w:placement() == "device" then
      local host = assert(w:to("host"))
      w:free()
      w = host
    end
    local ok, rows, e = pcall(M.quantize, w, t.format)
    w:free()
    -- the engine names the row: say whose
    if not ok then O.fail(("table '%s': %s"):format(t.name, tostring(rows):gsub("^[^\n]-:%d+: ", "")), level) end
    errs[t.name] = e
    assert(q:load(t.name, rows))
    rows:free()
    local perm = src:permutation(t.name)
    if perm then
      assert(q:set_permutation(t.name, perm))
      perm:free()
    end
  end
  return q, errs
end

return M
