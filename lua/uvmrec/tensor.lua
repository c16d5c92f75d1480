-- Tensors as FFI objects: constructors, methods, memory hints and printing.
-- Element indices (t[i], offsets of hints) are 0-based and count elements, as in the C API.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local streams = require "uvmrec.stream"
local C, check, must = lib.C, lib.check, lib.must

local M = {}
local methods = {}

local function T(t)
  local p = lib.ptr(t, "tensor", 3) -- not a tail call: lib.ptr
  return p
end
local function S(s)
  local p = streams.handle(s, 3) -- not a tail call: lib.ptr
  return p
end

local int64s = ffi.typeof("int64_t[?]")

-- An element index, offset or count the engine takes as an int64_t: a whole number or a 64-bit
-- integer, else an error at level (as error's, from the caller) naming it; the engine checks its
-- range.  The FFI's cast made 0.5 element 0, a count of 2.5 two, and inf -2^63 in the messages.
local function int64_arg(v, what, level)
  local i = lib.whole(v, what, level + 1, -2 ^ 63, nil, true)
  return i
end

-- Misuse raises at the user's line: `level` counts frames from the caller of the helper (1 its
-- caller, 2 that one's caller, ...), as lib.check's does.  The public functions below make no
-- tail calls into these helpers, which would remove a frame.
-- who (default "tensor") begins the messages: the arena's tensors are checked here too.
local function parse_shape(shape, level, who)
  who = who or "tensor"
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or #shape < 1 or #shape > 4 then
    error(("%s: shape must be a list of 1 to 4 sizes, got %s"):format(who, type(shape) == "table" and #shape
          or tostring(shape)), level + 1)
  end
  local dims = int64s(#shape)
  for i, n in ipairs(shape) do
    -- inf passed a check of its own and was cast to -2^63: "dimension 1 is -9223372036854775808"
    local size = lib.whole_in(n, 0, 2 ^ 63, true)
    if not size then lib.whole(n, ("%s: size %d of the shape"):format(who, i), level + 1, 0, nil, true) end
    dims[i - 1] = size
  end
  return dims, #shape
end
M.parse_shape = parse_shape -- (shape, level, who) -> int64_t dims, their count

-- Called by the public functions themselves: the user is their caller's caller.
local function place_of(name)
  local p = lib.enum(C.ur_place_parse, "ur_place", name, "placement", 3)
  return p
end
local function dtype_of(name)
  local d = lib.enum(C.ur_dtype_parse, "ur_dtype", name, "dtype", 3)
  return d
end

local wrap, free_tensor, is_tensor -- set below, once the metatable is complete

-- Called by ur.tensor and ur.uvm_tensor: the user is its caller's caller.
local function new(shape, dtype, place, device)
  local dims, nd = parse_shape(shape, 3)
  local out = ffi.new("ur_tensor *[1]")
  local ok, err = check(C.ur_tensor_new(out, dtype, nd, dims, place, device), 3)
  if not ok then return nil, err end
  return wrap(out[0])
end

local function device_for(place, device)
  if device ~= nil then
    local loc = lib.location(device, 3)
    return loc
  end
  if place == C.UR_PLACE_DEVICE or place == C.UR_PLACE_MANAGED then return lib.current_device(0) end
  return -1
end

-- The options of ur.tensor and ur.uvm_tensor are checked for their caller: ({2}, "i32") or a
-- misspelt key made an f32 tensor where the defaults put it.
local EXAMPLE = '{dtype = "i32"}'

-- ur.tensor(shape, {placement = "host", dtype = "f32", device = n}): the tensor (one value, so
-- the REPL shows no nil after it), or nil, message.
local TENSOR_OPTS = { "dtype", "placement", "device" }

function M.tensor(shape, opts)
  opts = lib.options(opts, TENSOR_OPTS, "tensor", EXAMPLE, 2)
  local place = place_of(opts.placement or "host")
  local t, err = new(shape, dtype_of(opts.dtype or "f32"), place, device_for(place, opts.device))
  if not t then return nil, err end
  return t
end

-- ur.uvm_tensor(shape, {device = 0, dtype = "f32"}) or the seed's ur.uvm_tensor(shape, gpu_id).
local UVM_OPTS = { "dtype", "device" }

function M.uvm_tensor(shape, opts)
  if type(opts) == "number" then opts = { device = opts } end
  opts = lib.options(opts, UVM_OPTS, "tensor", EXAMPLE, 2, "a managed tensor's placement is managed")
  local place = C.UR_PLACE_MANAGED
  local t, err = new(shape, dtype_of(opts.dtype or "f32"), place, device_for(place, opts.device))
  if not t then return nil, err end
  return t
end

function methods:dtype() return ffi.string(C.ur_dtype_name(C.ur_tensor_dtype(T(self)))) end
function methods:placement() return ffi.string(C.ur_place_name(C.ur_tensor_place(T(self)))) end
function methods:device() return C.ur_tensor_device(T(self)) end
function methods:dim() return C.ur_tensor_ndim(T(self)) end
function methods:numel() return tonumber(C.ur_tensor_numel(T(self))) end
function methods:nbytes() return tonumber(C.ur_tensor_nbytes(T(self))) end
function methods:id() return tonumber(C.ur_tensor_id(T(self))) end
function methods:refs() return C.ur_tensor_refs(T(self)) end
function methods:size(i)
  local p = T(self)
  -- dimension 0 or 5 of a 1-d tensor was -1, and 1.5 the first
  if i then
    return tonumber(C.ur_tensor_dim(p, lib.whole(i, "tensor size: dimension", 2, 1, C.ur_tensor_ndim(p)) - 1))
  end
  local s = {}
  for k = 0, C.ur_tensor_ndim(p) - 1 do s[k + 1] = tonumber(C.ur_tensor_dim(p, k)) end
  return s
end
methods.shape = methods.size

local desc_buf = ffi.new("char[512]")
function methods:describe()
  C.ur_tensor_describe(T(self), desc_buf, 512)
  return ffi.string(desc_buf)
end

-- A view of rows row0 .. row0 + nrows - 1 (0-based), sharing the storage.
function methods:view(row0, nrows)
  local out = ffi.new("ur_tensor *[1]")
  must(C.ur_tensor_view(T(self), out, int64_arg(row0, "tensor view: row0", 2),
                        int64_arg(nrows, "tensor view: nrows", 2)))
  return wrap(out[0])
end

-- A view of any shape starting `offset` elements after this tensor's first, sharing the
-- storage; it may reach past this tensor's elements but not past the storage.
function methods:view_as(offset, shape)
  local dims, nd = parse_shape(shape, 2)
  local out = ffi.new("ur_tensor *[1]")
  must(C.ur_tensor_view_as(T(self), out, int64_arg(offset, "tensor view_as: offset", 2), nd, dims))
  return wrap(out[0])
end

function methods:to(placement, device, stream)
  local place = place_of(placement)
  local out = ffi.new("ur_tensor *[1]")
  local ok, err = check(C.ur_tensor_to(S(stream), T(self), out, place, device_for(place, device)))
  if not ok then return nil, err end
  return wrap(out[0])
end

function methods:copy(src, stream)
  local ok, err = check(C.ur_tensor_copy(S(stream), lib.ptr(src, "tensor copy source", 2), T(self)))
  if not ok then return nil, err end
  return self
end

function methods:fill(v, stream)
  if type(v) ~= "number" then error("tensor fill: expected a number, got " .. type(v), 2) end
  local ok, err = check(C.ur_tensor_fill(S(stream), T(self), v))
  if not ok then return nil, err end
  return self
end

-- Counter-based: the same seed gives the same numbers on the CPU and the GPU.  A seed is a whole
-- number from 0 to below 2^63, an int64_t from 0 or any uint64_t (the engine's seed: the tables
-- draw theirs as one, 0xD1B54A32D192ED03ULL * i) (the cast drew seed 1's numbers for 1.5, seed
-- 0's for 2^64, and one set for -1, inf and NaN alike).
local uint64 = ffi.typeof("uint64_t")
local function seed_of(seed)
  if seed == nil then return 0 end
  if ffi.istype(uint64, seed) then return seed end
  local s = lib.whole(seed, "tensor rand: seed", 3, 0, nil, true) -- at the caller of uniform, normal
  return s
end

-- A distribution's parameter: v, or `default` for nil (a string or table failed in the FFI's
-- words: "bad argument #4 to 'ur_tensor_rand' (cannot convert 'string' to 'double')").
local function param_of(v, default, what)
  if v == nil then return default end
  if type(v) ~= "number" then
    error(("tensor rand: %s is %s %s; expected a number"):format(what, type(v), tostring(v)), 3)
  end
  return v
end

function methods:uniform(lo, hi, seed, stream)
  local ok, err = check(C.ur_tensor_rand(S(stream), T(self), C.UR_DIST_UNIFORM, param_of(lo, 0, "uniform low"),
                                         param_of(hi, 1, "uniform high"), seed_of(seed)))
  if not ok then return nil, err end
  return self
end

function methods:normal(mean, std, seed, stream)
  local ok, err = check(C.ur_tensor_rand(S(stream), T(self), C.UR_DIST_NORMAL, param_of(mean, 0, "normal mean"),
                                         param_of(std, 1, "normal std"), seed_of(seed)))
  if not ok then return nil, err end
  return self
end

-- t:get(i), t[i]: level as the helpers' (t[i] is one frame further, in the metamethod).
local value = ffi.new("double[1]")
-- An index is a number or a 64-bit integer (t[1LL] was nil: looked up among the methods).
local function get(t, i, level)
  if type(i) ~= "number" and type(i) ~= "cdata" then
    error("tensor get: expected an element index, got " .. type(i), level + 1)
  end
  i = int64_arg(i, "tensor get: element index", level + 1)
  local ok, err = check(C.ur_tensor_get(lib.ptr(t, "tensor", level + 1), i, value), level + 1)
  if not ok then error(err, level + 1) end
  return value[0]
end
function methods:get(i) return (get(self, i, 2)) end

local function set(t, i, v, level)
  if (type(i) ~= "number" and type(i) ~= "cdata") or type(v) ~= "number" then
    error(("tensor set: expected an element index and a number, got %s and %s"):format(type(i), type(v)), level + 1)
  end
  i = int64_arg(i, "tensor set: element index", level + 1)
  local ok, err = check(C.ur_tensor_set(lib.ptr(t, "tensor", level + 1), i, v), level + 1)
  if not ok then error(err, level + 1) end
end
function methods:set(i, v) set(self, i, v, 2) end

-- Elements first .. first + count - 1 as a Lua list of numbers (one bulk read).
function methods:totable(first, count)
  local n = self:numel()
  first = first and int64_arg(first, "tensor totable: first", 2) or 0
  count = count and int64_arg(count, "tensor totable: count", 2) or (n - first)
  -- the engine refuses a count past the tensor before it writes: a buffer of more is never used
  -- (totable(0, math.huge) failed in ffi.new, "size of C type is unknown or too large")
  local buf = ffi.new("double[?]", math.max(math.min(tonumber(count), n), 1))
  local ok, err = check(C.ur_tensor_read_f64(T(self), first, count, buf))
  if not ok then return nil, err end
  local out = {}
  for i = 0, tonumber(count) - 1 do out[i + 1] = buf[i] end
  return out
end

-- The index (from 0) of the first NaN or infinity of a float tensor in memory the CPU reads
-- (host, pinned, managed), or nil when every element is finite.
local nonfinite_at = ffi.new("int64_t[1]")
function methods:find_nonfinite()
  local ok, err = check(C.ur_tensor_find_nonfinite(T(self), nonfinite_at))
  if not ok then error(err, 2) end
  local i = tonumber(nonfinite_at[0])
  return i >= 0 and i or nil
end

-- Memory hints: offset and numel count elements of this tensor; the engine rounds the range
-- out to whole pages and returns what it used.
local function range_table(r)
  return { offset = tonumber(r.offset), numel = tonumber(r.numel),
           byte_begin = tonumber(r.byte_begin), byte_end = tonumber(r.byte_end),
           page_bytes = tonumber(r.page_bytes), rounded = r.rounded ~= 0 }
end
M.range_table = range_table

-- The bytes an element of the dtype named takes ("f32" 4, "bf16" 2, "i8" 1; the engine's
-- ur_dtype_size); an unknown name is an error at the caller.
function M.dtype_bytes(name)
  return tonumber(C.ur_dtype_size(lib.enum(C.ur_dtype_parse, "ur_dtype", name, "dtype", 2)))
end

local range = ffi.new("ur_range")
function methods:advise(offset, numel, advice, location)
  local a = lib.enum(C.ur_advice_parse, "ur_advice", advice, "advise", 2)
  local loc = location == nil and C.UR_LOC_CURRENT_GPU or lib.location(location, 2)
  local ok, err = check(C.ur_tensor_advise(T(self), int64_arg(offset, "advise: offset", 2),
                                           int64_arg(numel, "advise: numel", 2), range, a, loc))
  if not ok then return nil, err end
  return range_table(range)
end

function methods:prefetch(offset, numel, location, stream)
  local loc = location == nil and C.UR_LOC_CURRENT_GPU or lib.location(location, 2)
  local ok, err = check(C.ur_tensor_prefetch(S(stream), T(self), int64_arg(offset, "prefetch: offset", 2),
                                             int64_arg(numel, "prefetch: numel", 2), range, loc))
  if not ok then return nil, err end
  return range_table(range)
end

local function tri(v) if v == -1 then return "mixed" end return v == 1 end

-- What the driver's range attributes say (or the engine's record, without a GPU): advice,
-- not a measurement.  Use residency() for where the pages are.
local advised = ffi.new("ur_advised")
function methods:advised(offset, numel)
  offset = offset and int64_arg(offset, "advised: offset", 2) or 0
  numel = numel and int64_arg(numel, "advised: numel", 2) or (self:numel() - offset)
  local ok, err = check(C.ur_tensor_advised(T(self), offset, numel, advised))
  if not ok then return nil, err end
  local by = {}
  if advised.accessed_by_cpu == 1 then by[#by + 1] = "cpu" end
  for g = 0, 62 do
    if bit.band(bit.rshift(advised.accessed_by_gpus, g), 1ULL) ~= 0ULL then by[#by + 1] = "cuda:" .. g end
  end
  return {
    preferred_location = lib.location_name(advised.preferred_location),
    last_prefetch_location = lib.location_name(advised.last_prefetch_location),
    accessed_by = by,
    accessed_by_cpu = tri(advised.accessed_by_cpu),
    read_mostly = tri(advised.read_mostly),
    from_driver = advised.from_driver ~= 0,
    range = range_table(advised.range),
  }
end

local res = ffi.new("ur_residency")
-- Measured: a timed read of the range on the GPU (which can itself migrate pages that are not
-- mapped for the GPU), against reads of the same size from device memory and pinned host memory
-- (device_gbps, host_gbps): fast is true or false, or nil (where = "unknown") for a read too
-- small to tell.  Needs a GPU: returns nil, message otherwise.
function methods:residency(offset, numel, stream)
  offset = offset and int64_arg(offset, "residency: offset", 2) or 0
  numel = numel and int64_arg(numel, "residency: numel", 2) or (self:numel() - offset)
  local ok, err = check(C.ur_tensor_residency(S(stream), T(self), offset, numel, res))
  if not ok then return nil, err end
  local fast -- nil: too small a read to tell
  if res.fast >= 0 then fast = res.fast == 1 end
  return { fast = fast, gbps = res.gbps, seconds = res.seconds, device_gbps = res.device_gbps,
           host_gbps = res.host_gbps, where = fast == nil and "unknown" or fast and "gpu" or "host",
           range = range_table(res.range) }
end


local function fmt(v)
  if v == math.floor(v) and math.abs(v) < 1e15 then return ("%d"):format(v) end
  return ("%.4g"):format(v)
end

local function show(t)
  if t.p == nil then return "tensor (freed)" end
  local s = t:describe()
  local n = t:numel()
  if n == 0 then return s end
  local k = math.min(n, 6)
  local vals = t:totable(0, k)
  if not vals then return s end
  for i = 1, #vals do vals[i] = fmt(vals[i]) end
  return s .. " {" .. table.concat(vals, ", ") .. (n > k and ", ...}" or "}")
end

wrap, free_tensor, is_tensor = lib.handle_type("ur_tensor", C.ur_tensor_free, {
  __index = function(t, k)
    if type(k) == "number" or type(k) == "cdata" then return (get(t, k, 2)) end
    return methods[k]
  end,
  __newindex = function(t, k, v)
    if type(k) ~= "number" and type(k) ~= "cdata" then error("tensor: cannot set field '" .. tostring(k) .. "'", 2) end
    set(t, k, v, 2)
  end,
  __len = function(t) return methods.numel(t) end,
  __tostring = show,
})

methods.free = free_tensor
M.methods = methods
M.wrap = wrap
M.is_tensor = is_tensor -- true for a tensor handle

-- A Lua handle of its own (a view) on a tensor an engine object lends (a KJT's, a batch's);
-- nil for none.  Misuse raises at the line that called the lender's method.
local lent = ffi.new("ur_tensor *[1]")
function M.lend(p)
  if p == nil then return nil end
  must(C.ur_tensor_view(p, lent, 0, C.ur_tensor_dim(p, 0)), 3)
  return wrap(lent[0])
end
return M
