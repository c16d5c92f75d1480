-- Keyed jagged tensors: ur.KJT{keys=, values=, lengths=[, weights=][, stride=]
-- [, stride_per_key_per_rank=, inverse_indices=]}.  Key-major lengths; offsets (computed by the
-- engine) are the embedding kernels' bag offsets.  Keys are named by string or by 1-based
-- position.  A variable batch per key (VBE) has TorchRec's names: stride_per_key_per_rank (per
-- key, its bags on each rank: {{2}, {1}, ...} for one rank) and inverse_indices.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local streams = require "uvmrec.stream"
local C, check, must = lib.C, lib.check, lib.must

local M = {}
local methods = {}
local wrap, free_kjt, is_kjt

local function K(k, level)
  local p = lib.ptr(k, "kjt", (level or 2) + 1) -- not a tail call: lib.ptr
  return p
end

local out_tensor = ffi.new("ur_tensor *[1]")

-- A Lua handle of its own (a view) on a tensor the KJT lends.
local lend = tensor.lend

local ctypes = { i64 = "int64_t[?]", i32 = "int32_t[?]", f32 = "float[?]" }

-- A host tensor from a Lua list, or the tensor itself.
local function as_tensor(v, dtype, what, level)
  if v == nil then return nil end
  if type(v) == "table" then
    local n = #v
    local t = tensor.tensor({ n }, { dtype = dtype })
    if n > 0 then
      local buf = ffi.new(ctypes[dtype], n)
      for i = 1, n do buf[i - 1] = lib.element(v[i], dtype, "kjt: " .. what, i, level + 1) end
      must(C.ur_tensor_write(t.p, 0, n, buf), level + 1)
    end
    return t
  end
  if tensor.is_tensor(v) then return v end
  error(("kjt: %s must be a tensor or a list of numbers, got %s"):format(what, type(v)), level + 1)
end

local function key_list(keys, level)
  if type(keys) ~= "table" then error("kjt: keys must be a list of strings", level + 1) end
  local arr = ffi.new("const char *[?]", math.max(#keys, 1))
  for i, k in ipairs(keys) do
    if type(k) ~= "string" then
      error(("kjt: key %d is %s; expected a string"):format(i, type(k)), level + 1)
    end
    arr[i - 1] = k
  end
  return arr, #keys
end

-- The options of a new KJT and of from_rows: another (weight = for weights) was dropped.
local NEW_OPTS = { "check", "inverse_indices", "keys", "lengths", "stride", "stride_per_key_per_rank", "values",
                   "weights" }
local ROWS_OPTS = { "hot", "ids", "keys", "lengths", "stream", "weights" }

local function new_kjt(o, level)
  level = level or 2
  if type(o) ~= "table" then error("KJT: expected a table {keys=, values=, lengths=}", level + 1) end
  lib.known_keys(o, NEW_OPTS, "KJT", level + 1)
  local keys, nk = key_list(o.keys, level + 1)
  local values = as_tensor(o.values or {}, "i64", "values", level + 1)
  local lengths = as_tensor(o.lengths or {}, "i32", "lengths", level + 1)
  local weights = as_tensor(o.weights, "f32", "weights", level + 1)
  local inverse = as_tensor(o.inverse_indices, "i64", "inverse_indices", level + 1)
  local stride = o.stride
  if stride ~= nil then lib.element(stride, "i64", "kjt: stride", nil, level + 1) end
  local spk
  local per = o.stride_per_key_per_rank
  if per then
    if type(per) ~= "table" or #per ~= nk then
      error(("kjt: stride_per_key_per_rank has %s for %s"):format(
        type(per) == "table" and lib.things(#per, "entry", "entries") or "no entries", lib.things(nk, "key")),
        level + 1)
    end
    spk = ffi.new("int64_t[?]", math.max(nk, 1))
    for i, ranks in ipairs(per) do
      if type(ranks) ~= "table" or #ranks ~= 1 or type(ranks[1]) ~= "number" then
        error(("kjt: stride_per_key_per_rank[%d] must be a list of one stride (one rank), such as {2}")
          :format(i), level + 1)
      end
      spk[i - 1] = lib.element(ranks[1], "i64", ("kjt: stride_per_key_per_rank[%d]"):format(i), 1, level + 1)
    end
    if not stride then
      stride = (nk > 0 and inverse) and math.floor(tonumber(C.ur_tensor_numel(inverse.p)) / nk) or 0
    end
  end
  if not stride then
    local nl = tonumber(C.ur_tensor_numel(lengths.p))
    if nk == 0 then
      stride = 0
    elseif nl % nk ~= 0 then
      error(("kjt: %d lengths do not divide among %d keys; give stride= or %d lengths per key")
        :format(nl, nk, math.ceil(nl / nk)), level + 1)
    else
      stride = nl / nk
    end
  end
  local out = ffi.new("ur_kjt *[1]")
  local ok, err = check(C.ur_kjt_new(out, nk, keys, stride, spk, values.p, lengths.p,
    weights and weights.p or nil, inverse and inverse.p or nil, o.check == false and 0 or 1), level + 1)
  if not ok then return nil, err end
  return wrap(out[0])
end

M.new = new_kjt

-- ---- accessors ----
function methods:num_keys() return C.ur_kjt_num_keys(K(self)) end
function methods:keys()
  local p, out = K(self), {}
  for i = 0, C.ur_kjt_num_keys(p) - 1 do out[i + 1] = ffi.string(C.ur_kjt_key(p, i)) end
  return out
end
function methods:stride() return tonumber(C.ur_kjt_stride(K(self))) end
function methods:variable_stride() return C.ur_kjt_variable_stride(K(self)) ~= 0 end
-- True when the KJT is known sound (made with its checks, validated, or made by an op from KJTs
-- known sound): dedup, expand and bucketize then check nothing; false: they check it first.
function methods:checked() return C.ur_kjt_checked(K(self)) ~= 0 end
-- Per key, its bags on each rank (TorchRec's shape; one rank): {{s1}, {s2}, ...}.
function methods:stride_per_key_per_rank()
  local p, out = K(self), {}
  for i = 0, C.ur_kjt_num_keys(p) - 1 do out[i + 1] = { tonumber(C.ur_kjt_stride_of(p, i)) } end
  return out
end
function methods:values() return lend(C.ur_kjt_values(K(self))) end
function methods:lengths() return lend(C.ur_kjt_lengths(K(self))) end
function methods:offsets() return lend(C.ur_kjt_offsets(K(self))) end
function methods:weights() return lend(C.ur_kjt_weights(K(self))) end
function methods:inverse_indices() return lend(C.ur_kjt_inverse_indices(K(self))) end
function methods:placement() return ffi.string(C.ur_place_name(C.ur_tensor_place(C.ur_kjt_values(K(self))))) end
function methods:device() return C.ur_tensor_device(C.ur_kjt_values(K(self))) end

-- 0-based key index from a name or a 1-based position.
local function key_index(p, key, level)
  if type(key) == "string" then
    local i = C.ur_kjt_key_index(p, key)
    if i < 0 then error(("kjt: no key '%s'"):format(key), level + 1) end
    return i
  end
  if lib.whole_in(key, 1, C.ur_kjt_num_keys(p) + 1) then
    return key - 1
  end
  error(("kjt: key %s is neither a key name nor a position 1..%d"):format(tostring(key),
    C.ur_kjt_num_keys(p)), level + 1)
end

local span = ffi.new("int64_t[4]")
-- {bags = {first, last+1}, values = {first, last+1}} of a key, 0-based.
function methods:key_span(key)
  local p = K(self)
  must(C.ur_kjt_key_span(p, key_index(p, key, 2), span, span + 1, span + 2, span + 3))
  return { bags = { tonumber(span[0]), tonumber(span[1]) },
           values = { tonumber(span[2]), tonumber(span[3]) } }
end

-- Checks lengths and offsets and, with rows (a list per key, a map key -> rows, or one
-- number for every key), the ids' range.  Returns true, or nil and a message naming the key and the position.
function methods:validate(rows)
  local p = K(self)
  local r
  if rows then
    local n = C.ur_kjt_num_keys(p)
    if type(rows) == "table" then -- a misspelt key's rows were never checked
      local unknown = {}
      for k in pairs(rows) do
        if type(k) == "string" and C.ur_kjt_key_index(p, k) < 0 then unknown[#unknown + 1] = "'" .. k .. "'"
        elseif type(k) ~= "string" and not lib.whole_in(k, 1, n + 1) then unknown[#unknown + 1] = tostring(k) end
      end
      if #unknown > 0 then
        table.sort(unknown)
        error(("kjt validate: rows names %s, which is neither a key of the KJT nor a position 1..%d"):format(
          unknown[1], n), 2)
      end
    end
    r = ffi.new("int64_t[?]", math.max(n, 1))
    for i = 0, n - 1 do
      local key = ffi.string(C.ur_kjt_key(p, i))
      r[i] = lib.element(type(rows) == "number" and rows or rows[key] or rows[i + 1] or 0, "i64",
                         "kjt validate: rows of key '" .. key .. "'", nil, 2)
    end
  end
  local st = C.ur_kjt_validate(p, r)
  if st == 0 then return true end
  return nil, ffi.string(C.ur_last_error())
end

-- For an entry that hands a KJT's offsets (or inverse indices) to C or kernels, which read
-- through them (on a GPU without a look): nothing for a KJT known checked (one read of its
-- mark, no wait), else validate()'s check, once (found sound, it is known checked after).  A bad
-- one raises "who: kjt: key 'b' sample 0: ..." at `level` as error() counts it in the caller; a
-- device's failure returns nil, message.
function M.need_checked(k, who, level)
  local p = lib.ptr(k, "kjt", level + 1)
  if C.ur_kjt_checked(p) ~= 0 then return true end
  local st = C.ur_kjt_validate(p, nil)
  if st == 0 then return true end
  local msg = who .. ": " .. ffi.string(C.ur_last_error())
  if st == C.UR_STATUS_INVALID then error(msg, level + 1) end
  return nil, msg
end

local function result(st, out, level)
  local ok, err = check(st, level + 1)
  if not ok then return nil, err end
  return wrap(out[0])
end

local out_kjt = ffi.new("ur_kjt *[1]")

-- A KJT of the given keys (names or 1-based positions), in that order; repeats allowed.
function methods:permute(order)
  local p = K(self)
  if type(order) ~= "table" then error("kjt permute: expected a list of keys", 2) end
  local idx = ffi.new("int32_t[?]", math.max(#order, 1))
  for j, key in ipairs(order) do idx[j - 1] = key_index(p, key, 2) end
  return result(C.ur_kjt_permute(p, idx, #order, out_kjt), out_kjt, 2)
end

-- Consecutive groups of keys (sizes summing to the key count), sharing storage with self.
function methods:split(sizes)
  local p = K(self)
  if type(sizes) ~= "table" then error("kjt split: expected a list of segment sizes", 2) end
  local n = #sizes
  local sz = ffi.new("int32_t[?]", math.max(n, 1))
  for i, s in ipairs(sizes) do sz[i - 1] = lib.element(s, "i32", "kjt split: sizes", i, 2) end
  local outs = ffi.new("ur_kjt *[?]", math.max(n, 1))
  local ok, err = check(C.ur_kjt_split(p, sz, n, outs), 2)
  if not ok then return nil, err end
  local res = {}
  for i = 1, n do res[i] = wrap(outs[i - 1]) end
  return res
end

-- Key -> jagged tensor {values, lengths, offsets (from 0), weights}; values, lengths and
-- weights are views of the KJT's storage.
function methods:to_dict()
  local p = K(self)
  local parts = {}
  local nk = C.ur_kjt_num_keys(p)
  local sizes = {}
  for i = 1, nk do sizes[i] = 1 end
  local singles = assert(self:split(sizes))
  for i = 0, nk - 1 do
    local key = ffi.string(C.ur_kjt_key(p, i))
    if parts[key] then error(("kjt to_dict: key '%s' appears twice"):format(key), 2) end
    local s = singles[i + 1]
    parts[key] = { values = s:values(), lengths = s:lengths(), offsets = s:offsets(),
                   weights = s:weights() }
  end
  return parts
end

-- Row-wise sharding's split: bucketize(buckets, {[key] = {block = rows per bucket, rows =
-- the table's rows}, ...}) turns each named key into keys "<key>@0".."<key>@<buckets-1>" in its
-- place, bucket b holding the ids in [b * block, (b + 1) * block) less b * block, bag by bag and
-- in order (weights too); other keys stay.  An id outside [0, rows) is an error naming it.
function methods:bucketize(buckets, blocks)
  local p = K(self)
  if type(blocks) ~= "table" then error("kjt bucketize: expected {[key] = {block =, rows =}}", 2) end
  local n = C.ur_kjt_num_keys(p)
  local blk, rows = ffi.new("int64_t[?]", math.max(n, 1)), ffi.new("int64_t[?]", math.max(n, 1))
  for i = 0, n - 1 do
    local b = blocks[ffi.string(C.ur_kjt_key(p, i))]
    if b then
      local what = "kjt bucketize: key '" .. ffi.string(C.ur_kjt_key(p, i)) .. "' "
      blk[i] = lib.element(b.block, "i64", what .. "block", nil, 2)
      rows[i] = lib.element(b.rows, "i64", what .. "rows", nil, 2)
    end
  end
  for key in pairs(blocks) do
    if type(key) ~= "string" or C.ur_kjt_key_index(p, key) < 0 then
      error(("kjt bucketize: no key '%s'"):format(tostring(key)), 2)
    end
  end
  return result(C.ur_kjt_bucketize(p, out_kjt, blk, rows, buckets), out_kjt, 2)
end

-- Per key, distinct bags and every sample's bag: a variable batch per key (VBE).
function methods:dedup() return result(C.ur_kjt_dedup(K(self), out_kjt), out_kjt, 2) end

-- expand(): the full batch back from a VBE batch.  expand(t): rows of a per-bag output
-- [bags, ...] to the full batch's bag order [num_keys * stride, ...].
function methods:expand(t, stream)
  local p = K(self)
  if t == nil then return result(C.ur_kjt_expand(p, out_kjt), out_kjt, 2) end
  local ok, err = check(C.ur_kjt_expand_rows(streams.handle(stream, 2), p,
    lib.ptr(t, "kjt expand input", 2), out_tensor), 2)
  if not ok then return nil, err end
  return tensor.wrap(out_tensor[0])
end

-- A copy in another placement: to(placement[, stream]) or to(placement, device[, stream]).
function methods:to(placement, a, b)
  local device, stream = nil, a
  if type(a) == "number" or type(a) == "string" then device, stream = a, b end
  local place = lib.enum(C.ur_place_parse, "ur_place", placement, "placement", 2)
  if device ~= nil then
    device = lib.location(device, 2)
  elseif place == C.UR_PLACE_DEVICE or place == C.UR_PLACE_MANAGED then
    device = lib.current_device(0)
  else
    device = -1
  end
  return result(C.ur_kjt_to(streams.handle(stream, 2), K(self), out_kjt, place, device), out_kjt, 2)
end

-- The same as to(), into buffers kept by the caller: into = {values =, lengths =, offsets =,
-- weights =, inverse_indices =} (1-D tensors at least as long as this KJT's, one placement;
-- those it has none of may be absent).  The copy's tensors are views of the buffers.
local into_arr = ffi.new("ur_tensor *[5]")
local PARTS = { "values", "lengths", "offsets", "weights", "inverse_indices" }
function methods:copy(into, stream)
  if type(into) ~= "table" then error("kjt copy: expected a table of buffers {values =, lengths =, ...}", 2) end
  for i, name in ipairs(PARTS) do
    into_arr[i - 1] = into[name] ~= nil and lib.ptr(into[name], "kjt copy " .. name .. " buffer", 2) or nil
  end
  return result(C.ur_kjt_copy(streams.handle(stream, 2), K(self), into_arr, out_kjt), out_kjt, 2)
end

-- Keys of all parts in order: KJT.concat{a, b, ...} or a:concat(b, ...).
local function concat(parts, level)
  local n = #parts
  local arr = ffi.new("const ur_kjt *[?]", math.max(n, 1))
  for i, k in ipairs(parts) do arr[i - 1] = K(k, level + 1) end
  return result(C.ur_kjt_concat(arr, n, out_kjt), out_kjt, level + 1)
end
M.concat = function(parts) return concat(parts, 2) end
function methods:concat(...) return concat({ self, ... }, 2) end

-- A KJT from sample-major rows, as the synthetic generator makes them: KJT.from_rows{keys =,
-- hot = {ids a sample, per key}, ids = i64 [n, sum of hot], lengths = i32 [n, #keys] or nil
-- (every bag full), weights = f32 like ids or nil, stream =}, in the ids' placement (a loader
-- reuses its buffers through ur_kjt_from_rows; this makes new ones).
local function from_rows(o, level)
  if type(o) ~= "table" then error("KJT.from_rows: expected a table {keys=, hot=, ids=}", level + 1) end
  lib.known_keys(o, ROWS_OPTS, "KJT.from_rows", level + 1)
  local keys, nk = key_list(o.keys, level + 1)
  if type(o.hot) ~= "table" or #o.hot ~= nk then
    error(("KJT.from_rows: hot must list ids a sample for each of the %d keys"):format(nk), level + 1)
  end
  local hot, H = ffi.new("int32_t[?]", math.max(nk, 1)), 0
  for i, v in ipairs(o.hot) do
    hot[i - 1] = lib.element(v, "i32", "KJT.from_rows: hot", i, level + 1)
    H = H + v
  end
  local ids = o.ids
  if not tensor.is_tensor(ids) then error("KJT.from_rows: ids must be an i64 [n, sum of hot] tensor", level + 1) end
  local n = ids:size(1)
  local place, dev = ids:placement(), ids:device()
  local function new(m, dtype)
    return assert(tensor.tensor({ m }, { placement = place, dtype = dtype, device = dev >= 0 and dev or nil }))
  end
  local values, lens, offsets = new(math.max(n * H, 1), "i64"), new(math.max(n * nk, 1), "i32"), new(n * nk + 1, "i64")
  local wout = o.weights and new(math.max(n * H, 1), "f32") or nil
  local ok, err = check(C.ur_kjt_from_rows(streams.handle(o.stream, level + 1), out_kjt, nk, keys, hot,
    lib.ptr(ids, "ids", level + 1), o.weights and lib.ptr(o.weights, "weights", level + 1) or nil,
    o.lengths and lib.ptr(o.lengths, "lengths", level + 1) or nil, values.p, lens.p, offsets.p,
    wout and wout.p or nil), level + 1)
  values:free()
  lens:free()
  offsets:free()
  if wout then wout:free() end
  if not ok then return nil, err end
  return wrap(out_kjt[0])
end
M.from_rows = function(o) return from_rows(o, 2) end

-- Plain Lua lists of everything, for tests and printing.
function methods:totable()
  local w = self:weights()
  local inv = self:inverse_indices()
  return {
    keys = self:keys(), stride = self:stride(), values = self:values():totable(),
    lengths = self:lengths():totable(), offsets = self:offsets():totable(),
    weights = w and w:totable() or nil,
    stride_per_key_per_rank = self:variable_stride() and self:stride_per_key_per_rank() or nil,
    inverse_indices = inv and inv:totable() or nil,
  }
end

local function show(k)
  if k.p == nil then return "kjt (freed)" end
  local p = k.p
  local s = ("kjt %d keys, stride %d, %d values%s%s, %s"):format(C.ur_kjt_num_keys(p),
    tonumber(C.ur_kjt_stride(p)), tonumber(C.ur_tensor_numel(C.ur_kjt_values(p))),
    C.ur_kjt_weights(p) ~= nil and ", weighted" or "",
    C.ur_kjt_variable_stride(p) ~= 0 and ", variable batch per key" or "", k:placement())
  local keys = k:keys()
  if #keys > 8 then keys = { keys[1], keys[2], keys[3], "...", keys[#keys] } end
  return s .. " {" .. table.concat(keys, ", ") .. "}"
end

wrap, free_kjt, is_kjt = lib.handle_type("ur_kjt", C.ur_kjt_free, {
  __index = methods,
  __tostring = show,
})
methods.free = free_kjt
M.wrap = wrap
M.is = is_kjt -- true for a KJT handle
M.methods = methods

-- ur.KJT{...} constructs; ur.KJT.concat{...} concatenates; ur.KJT.from_rows{...} lays rows out.
M.KJT = setmetatable({ new = function(o) return new_kjt(o, 2) end, concat = M.concat, from_rows = M.from_rows,
                       methods = methods },
  { __call = function(_, o) return new_kjt(o, 2) end })

return M
