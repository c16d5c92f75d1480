-- The option checks that collections of named tables share (embedding collections uvmrec.tbe,
-- quantized ones uvmrec.qtbe, managed collisions uvmrec.mc): a table of known options with a
-- non-empty list of tables, each a table of known options and a name of its own, whole numbers,
-- names from a map, the features each table reads and an input's keys, and the loop over the
-- tables that tbe and qtbe both run (tables).  Every message opens with the collection's name
-- and points at the caller's line (`level` counts as error()'s does, from the function calling
-- these).  Also the output fields (set_output) and the methods the collections share
-- (placement, new_output, load), and what the nn modules over them share (module_options,
-- module_output).
--
--   local O = require("uvmrec.table_options").checks("embedding collection")
--   local tables = O.open(opts, OPTS, "collection ", level)
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local C = lib.C

local function keys_of(t)
  local k = {}
  for name in pairs(t) do k[#k + 1] = name end
  table.sort(k)
  return table.concat(k, ", ")
end

local M = {}

-- The engine's names for what embedding collections and quantized ones both take.
M.BOUNDS = { fatal = C.UR_TBE_BOUNDS_FATAL, warn = C.UR_TBE_BOUNDS_WARN, off = C.UR_TBE_BOUNDS_OFF }
M.POOLINGS = { sum = C.UR_POOLING_SUM, mean = C.UR_POOLING_MEAN, none = C.UR_POOLING_NONE }
M.OUTPUT_DTYPES = { f32 = C.UR_DTYPE_F32, bf16 = C.UR_DTYPE_BF16 }
M.FAR_DMA = { none = C.UR_FAR_DMA_NONE, home = C.UR_FAR_DMA_HOME, early = C.UR_FAR_DMA_EARLY,
              both = C.UR_FAR_DMA_BOTH }

-- The checks for the collection named who.
function M.checks(who)
  local O = {}

  function O.fail(msg, level) error(who .. ": " .. msg, level + 1) end

  -- map[v], else "<who>: <what> 'v' is not one of <map's names>".
  function O.pick(map, v, what, level)
    local r = map[v]
    if r == nil then
      O.fail(("%s '%s' is not one of %s"):format(what, tostring(v), keys_of(map)), level + 1)
    end
    return r
  end

  -- v, a whole number >= lo (default 0) and below 2^63, or from lo to hi (lib.whole; not a tail
  -- call, which would take this frame off the count of levels).
  function O.whole(v, what, level, lo, hi)
    local n = lib.whole(v, who .. ": " .. what, level + 1, lo, hi)
    return n
  end

  -- Every key of t in allowed (lib.known_keys); what names the kind ("unknown <what>option").
  function O.check_keys(t, allowed, what, level)
    lib.known_keys(t, allowed, who, level + 1, what .. "option")
  end

  -- opts: a table whose keys are all in allowed (an unknown one is an "unknown <what>option"),
  -- with a non-empty list `tables`, which it returns.
  function O.open(opts, allowed, what, level)
    if type(opts) ~= "table" then O.fail("expected a table of options", level + 1) end
    O.check_keys(opts, allowed, what, level + 1)
    local tables = opts.tables
    if type(tables) ~= "table" or #tables == 0 then O.fail("tables must be a non-empty list", level + 1) end
    return tables
  end

  -- Table i of the list: a table of allowed keys whose name is a non-empty string that no earlier
  -- table has.  Records it in the collection's self.table_index (0-based) and self.table_names
  -- and returns the name.
  function O.named(i, t, allowed, self, level)
    if type(t) ~= "table" then O.fail(("table %d is not a table"):format(i), level + 1) end
    O.check_keys(t, allowed, "table ", level + 1)
    local name = t.name
    if type(name) ~= "string" or name == "" then O.fail(("table %d needs a name"):format(i), level + 1) end
    if self.table_index[name] then O.fail(("two tables are named '%s'"):format(name), level + 1) end
    self.table_index[name], self.table_names[i] = i - 1, name
    return name
  end

  -- What tbe's and qtbe's table configs (c) share: table t's name, rows, dim and pooling (its
  -- own, else opts.pooling, else sum), checked.  Returns the pooling's name.
  function O.table_config(c, name, t, opts, level)
    c.name = name
    c.rows = O.whole(t.rows, "table '" .. name .. "' rows", level + 1, 1)
    -- the engine's int32_t (2^40 reached it as 'dim -2147483648'); it names its own bounds
    c.dim = O.whole(t.dim, "table '" .. name .. "' dim", level + 1, 1, 2147483647)
    local pooling = t.pooling or opts.pooling or "sum"
    c.pooling = O.pick(M.POOLINGS, pooling, "table '" .. name .. "' pooling", level + 1)
    return pooling
  end

  -- Table t's features (default {name}), each on no other table: recorded in on_table (feature ->
  -- table name) and appended to list.
  function O.features(name, t, on_table, list, level)
    local fs = t.features or { name }
    if type(fs) ~= "table" then O.fail(("table '%s' features must be a list"):format(name), level + 1) end
    for _, f in ipairs(fs) do
      if type(f) ~= "string" then
        O.fail(("table '%s' has a feature that is not a string"):format(name), level + 1)
      end
      if on_table[f] then
        O.fail(("feature '%s' is on tables '%s' and '%s'"):format(f, on_table[f], name), level + 1)
      end
      on_table[f] = name
      list[#list + 1] = f
    end
  end

  -- An input's keys equal the collection's key order (features), else an error naming both;
  -- whose: the owner of the features in the message (default "collection's").
  function O.same_keys(keys, features, level, whose)
    local same = #keys == #features
    for i = 1, #keys do same = same and keys[i] == features[i] end
    if not same then
      O.fail(("the input's keys {%s} are not the %s features {%s}"):format(table.concat(keys, ", "),
             whose or "collection's", table.concat(features, ", ")), level + 1)
    end
  end

  -- The 0-based index of the collection's table `name` (self.table_index), else an error
  -- listing the tables (self.table_names).
  function O.table_index(self, name, level)
    local i = self.table_index[name]
    if i == nil then
      O.fail(("no table named '%s' (tables: %s)"):format(tostring(name), table.concat(self.table_names, ", ")),
             level + 1)
    end
    return i
  end

  -- What tbe's and qtbe's configs (cfg) share: the device (lib.device_option), the bounds
  -- check (default fatal) and the output dtype (default f32).  Returns the device and the
  -- tables' default placement (opts.placement, else device on a GPU and host on the CPU).
  function O.engine_config(opts, cfg, level)
    local device = lib.device_option(opts.device, level + 1)
    cfg.device = device
    cfg.bounds = O.pick(M.BOUNDS, opts.bounds or "fatal", "bounds check", level + 1)
    cfg.out_dtype = O.pick(M.OUTPUT_DTYPES, opts.output_dtype or "f32", "output dtype", level + 1)
    return device, opts.placement or (device >= 0 and "device" or "host")
  end

  -- The input's key order: `order` (the collection's features option), which must name each of
  -- the tables' features once, or when nil the tables' features in table order (list).
  function O.key_order(order, on_table, list, level)
    if not order then return list end
    if type(order) ~= "table" or #order ~= #list then
      O.fail(("features lists %s names; the tables have %d features")
             :format(type(order) == "table" and #order or "no", #list), level + 1)
    end
    for _, f in ipairs(order) do
      if not on_table[f] then O.fail(("feature '%s' is on no table"):format(tostring(f)), level + 1) end
    end
    return { unpack(order) }
  end

  -- The engine's feature arguments for the key order self.features: their count, each one's
  -- table index (int32_t[]) and name (const char *[], pointing into self.features' strings);
  -- fills self.feature_index (0-based) and self.feature_dims.
  function O.feature_arrays(self, on_table)
    local nf = #self.features
    local ft, fnames = ffi.new("int32_t[?]", nf), ffi.new("const char *[?]", nf)
    self.feature_dims = {}
    for i, f in ipairs(self.features) do
      self.feature_index[f] = i - 1
      ft[i - 1] = self.table_index[on_table[f]]
      fnames[i - 1] = f
      self.feature_dims[i] = self.dims[on_table[f]]
    end
    return nf, ft, fnames
  end

  -- The list of tables as tbe.new and qtbe.new both take it, around what each collection adds:
  -- table i named and recorded (O.named), its shared fields in tc[i - 1] (O.table_config), then
  -- each(self, ctx, c, name, t, pooling, level) for the collection's own (level counted from
  -- each), then its features (O.features); then the input's key order in self.features
  -- (O.key_order of opts.features).  Returns the engine's feature arguments (O.feature_arrays):
  -- nf, ft, fnames.  each is a function of the module's, not a closure over the collection: a
  -- compiled trace keeps the functions it calls as constants, and one over `self` kept every
  -- collection made (its tables' memory) alive until the traces were flushed.
  function O.tables(tables, tc, allowed, self, opts, each, ctx, level)
    local on_table = {}
    for i, t in ipairs(tables) do
      local name = O.named(i, t, allowed, self, level + 1)
      local c = tc[i - 1]
      local pooling = O.table_config(c, name, t, opts, level + 1)
      each(self, ctx, c, name, t, pooling, level + 2)
      O.features(name, t, on_table, self.features, level + 1)
    end
    self.features = O.key_order(opts.features, on_table, self.features, level + 1)
    return O.feature_arrays(self, on_table)
  end

  return O
end

-- The options an nn module over a collection passes on (EmbeddingBagCollection and
-- EmbeddingCollection over uvmrec.tbe, their Quant twins over uvmrec.qtbe): a copy of opts
-- with pooling set when the module fixes it ("none": an EmbeddingCollection), else opts, whose
-- pooling, and every table's, must be one the module takes (sum or mean).  who: the module.
function M.module_options(who, opts, pooling, level)
  if type(opts) ~= "table" then error(who .. ": expected a table of options", level + 1) end
  local allowed = pooling and { [pooling] = true } or { sum = true, mean = true }
  local takes = pooling or "sum or mean"
  for _, t in ipairs(type(opts.tables) == "table" and opts.tables or {}) do
    if type(t) == "table" and t.pooling and not allowed[t.pooling] then
      error(("%s: table '%s' pools by %s; this module takes pooling %s")
            :format(who, tostring(t.name), tostring(t.pooling), takes), level + 1)
    end
  end
  if not pooling then
    if opts.pooling and not allowed[opts.pooling] then
      error(("%s: pooling %s; this module takes pooling %s"):format(who, tostring(opts.pooling), takes), level + 1)
    end
    return opts
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.pooling = pooling
  return o
end

-- What the methods below and the collections' output_shape read, set once the engine has made
-- the collection: where it runs (device), whether it pools (pooled: its first table says for
-- all, as the engine takes tables that all pool or none), its output's width (the engine's
-- out_dim) and dtype.
function M.set_output(self, device, out_dim, tables, opts)
  self.device = device
  self.pooled = (tables[1].pooling or opts.pooling or "sum") ~= "none"
  self.out_dim = out_dim
  self.output_dtype = opts.output_dtype or "f32"
end

-- The methods collections share.  Where the collection runs (self.device: a GPU ordinal, or
-- -1 for the CPU): "device" or "host".
function M.placement(self) return self.device >= 0 and "device" or "host" end

-- A new output tensor for this input (self:output_shape), where the collection runs.
function M.new_output(self, input)
  local opts = { dtype = self.output_dtype, placement = self:placement() }
  if self.device >= 0 then opts.device = self.device end
  return tensor.tensor(self:output_shape(input), opts)
end

-- Copies src (rows as the table stores them: its dtype, or its format's bytes) into table
-- `name` through its view (self:table); self, or nil and the copy's error.  A src of another
-- dtype or shape raises (who: the collection; level as error()'s, from the caller of this):
-- a copy checks only the element count, so a [dim, rows] tensor went in as rows.
function M.load(self, name, src, stream, who, level)
  local dst = self:table(name)
  if tensor.is_tensor(src) then
    local ds, ss = dst:size(), src:size()
    if dst:dtype() ~= src:dtype() or table.concat(ds, ", ") ~= table.concat(ss, ", ") then
      local msg = ("%s: load of table '%s': src is %s [%s]; expected %s [%s], the table's dtype and shape")
                  :format(who, name, src:dtype(), table.concat(ss, ", "), dst:dtype(), table.concat(ds, ", "))
      dst:free()
      error(msg, level + 1)
    end
  end
  local ok, err = dst:copy(src, stream)
  dst:free()
  if not ok then return nil, err end
  return self
end

-- Such a module's output precision, through its collection coll (set_output_dtype: bf16 under
-- bf16, f32 otherwise); a refusal is raised naming the module (module:op) at `level`, as
-- error's, the precision as it was.  The last call's output is let go.
function M.module_precision(module, coll, precision, level)
  module:op(level + 1, coll.set_output_dtype, coll, precision == "bf16" and "bf16" or "f32")
  module.precision = precision
  if module.output then module.output:free() end
  module.output, module._out_shape = nil, nil
end

-- Such a module's output for input, from its collection coll: the one of the last call while
-- the shape holds (the module's output and _out_shape), else a new one (the old one freed).
function M.module_output(module, coll, input)
  local key = table.concat(coll:output_shape(input), "x")
  if module._out_shape ~= key or not module.output then
    if module.output then module.output:free() end
    module.output = assert(coll:new_output(input))
    module._out_shape = key
  end
  return module.output
end

return M
