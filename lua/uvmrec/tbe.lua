-- Embedding collections (table-batched embeddings): the engine's ur_tbe as a Lua object.
-- The nn modules EmbeddingBagCollection and EmbeddingCollection are built on it.
--
--   local tbe = require "uvmrec.tbe"
--   local c = tbe.new{ tables = { { name = "t0", rows = 1000, dim = 64, features = { "f0" } } },
--                      optimizer = { "rowwise_adagrad", lr = 0.01 } }
--   local out = c:forward(kjt)              -- [batch, sum of dims]
--   c:backward(kjt, grad_out)               -- steps the optimizer on the rows it read
-- With cached tables a batch may bring a ticket (prepare(kjt, stream): its rows brought into
-- the cache ahead, as the prefetch pipeline does) to its forward and backward.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local kjt = require "uvmrec.kjt"
local C, check, must = lib.C, lib.check, lib.must

local M = {}
local methods = {}
local mt = { __index = methods }

local PLACES = { device = C.UR_PLACE_DEVICE, managed = C.UR_PLACE_MANAGED, host = C.UR_PLACE_HOST,
                 pinned = C.UR_PLACE_PINNED }
local DTYPES = { f32 = C.UR_DTYPE_F32, f16 = C.UR_DTYPE_F16, bf16 = C.UR_DTYPE_BF16 }

local OPTS = { tables = true, features = true, optimizer = true, bounds = true, seed = true,
               device = true, stochastic_rounding = true, output_dtype = true, pooling = true,
               placement = true, dtype = true, state_placement = true, cache = true }
local TABLE_OPTS = { name = true, rows = true, dim = true, dtype = true, pooling = true,
                     placement = true, state_placement = true, features = true, shard = true }
-- the sharded collection (uvmrec.dist.sharded) checks its options against these
M.OPTS, M.TABLE_OPTS = OPTS, TABLE_OPTS

local table_options = require "uvmrec.table_options"
local O = table_options.checks("embedding collection")
local pick, whole = O.pick, O.whole

-- optimizer = "sgd" | { "adam", lr = ..., ... } | { name = "adam", ... }: uvmrec.optim's
-- settings and defaults for tables, and the collection's own deterministic (default true).
-- Returns the name, the engine's settings and deterministic.
local function optimizer_of(o, level)
  if o == nil then o = "sgd" end
  if type(o) == "string" then o = { o } end
  if type(o) ~= "table" then error("embedding collection: optimizer must be a name or a table", level + 1) end
  if o.deterministic ~= nil and type(o.deterministic) ~= "boolean" then
    error("embedding collection: optimizer deterministic must be true or false, got " .. tostring(o.deterministic),
          level + 1)
  end
  local name, settings = o.name or o[1] or "sgd", {}
  for k, v in pairs(o) do
    if k ~= 1 and k ~= "name" and k ~= "deterministic" then settings[k] = v end
  end
  return name, require("uvmrec.optim").config(name, "tables", settings, "embedding collection", level + 1),
         o.deterministic ~= false
end

local wrap_tbe, free_tbe = lib.handle_type("ur_tbe", C.ur_tbe_free, {})

-- A table's own fields in its engine config c (O.tables' each; x: tbe.new's opts, the default
-- placement, the cached tables' names and the cache's options).
local function configure_table(self, x, c, name, t, pooling, lvl)
  local opts, default_place = x.opts, x.default_place
  self._keep[#self._keep + 1] = name
  c.dtype = pick(DTYPES, t.dtype or opts.dtype or "f32", "table '" .. name .. "' dtype", lvl)
  if (t.placement or default_place) == "cached" then
    x.cached[#x.cached + 1] = name
    c.place = x.cache_opts.backing == "managed" and C.UR_PLACE_MANAGED or C.UR_PLACE_HOST
  else
    c.place = pick(PLACES, t.placement or default_place, "table '" .. name .. "' placement", lvl)
  end
  if t.shard ~= nil then
    local sh = t.shard
    if type(sh) ~= "table" then
      error(("embedding collection: table '%s' shard must be a table {logical=, rows=, dim=, row0=, col0=}")
            :format(name), lvl)
    end
    c.logical = whole(sh.logical, "table '" .. name .. "' shard.logical", lvl)
    c.logical_rows = whole(sh.rows, "table '" .. name .. "' shard.rows", lvl, 1)
    c.logical_dim = whole(sh.dim, "table '" .. name .. "' shard.dim", lvl, 1)
    c.row0 = whole(sh.row0 or 0, "table '" .. name .. "' shard.row0", lvl)
    c.col0 = whole(sh.col0 or 0, "table '" .. name .. "' shard.col0", lvl)
  end
  local sp = t.state_placement or opts.state_placement
  c.state_place = sp and sp ~= "table" and pick(PLACES, sp, "table '" .. name .. "' state placement", lvl)
                  or -1
  self.dims[name], self.rows[name] = t.dim, t.rows
  self.poolings[name] = pooling
  -- managed tables not behind a cache: the ones whose pages the prefetch pipeline moves
  if (t.placement or default_place) == "managed" then
    self.managed = self.managed or {}
    self.managed[#self.managed + 1] = name
  end
  self.dtypes = self.dtypes or {}
  self.dtypes[name] = t.dtype or opts.dtype or "f32"
end

-- tbe.new(opts), opts:
--   tables = { { name=, rows=, dim=, dtype="f32", pooling="sum", placement=,
--                state_placement=, features={...} (default {name}), shard = { logical = the
--                unsharded collection's table index (0-based), rows =, dim = (the logical
--                table's), row0 = 0, col0 = 0 }: this table is that block of it and starts as
--                its elements }, ... }
--   features = { ... } the input's key order (default: each table's features in table order)
--   optimizer = "sgd" | { "rowwise_adagrad" | "adagrad" | "adam", lr=, eps=, weight_decay=,
--                         beta1=, beta2=, max_grad=, deterministic = true }
--     (deterministic = false: on the GPU, SGD without weight decay or clipping on f32 tables adds
--     each value's update to its row by atomics, without sorting: faster, not bit-reproducible;
--     the CPU, and every other case, stays deterministic)
--   bounds = "fatal" | "warn" | "off";  seed = 0;  stochastic_rounding = true
--   device = a GPU ordinal or "cpu" (default: the current GPU when there is one)
--   output_dtype = "f32" | "bf16";  pooling, placement, dtype, state_placement: table defaults
--   placement "cached": rows in host memory with a software cache in HBM (uvmrec.cache), whose
--   options are cache = { load_factor=, slots=, bytes=, shared=, policy=, ... }
-- Environmental failures (memory, budget, no GPU) return nil, message.
function M.new(opts, level)
  level = (level or 1) + 1
  local tables = O.open(opts, OPTS, "collection ", level)
  local cfg = ffi.new("ur_tbe_config")
  local device, default_place = O.engine_config(opts, cfg, level)
  local cached, cache_opts = {}, nil
  for _, t in ipairs(type(opts.tables) == "table" and opts.tables or {}) do
    if type(t) == "table" and (t.placement or default_place) == "cached" then
      cache_opts = cache_opts or require("uvmrec.cache").options(opts.cache, level)
    end
  end
  local optim_name, optim_cfg, deterministic = optimizer_of(opts.optimizer, level)
  cfg.optim = optim_cfg
  if opts.stochastic_rounding ~= nil and type(opts.stochastic_rounding) ~= "boolean" then
    O.fail(("stochastic_rounding is %s; expected true or false"):format(tostring(opts.stochastic_rounding)), level)
  end
  cfg.stochastic_rounding = opts.stochastic_rounding == false and 0 or 1
  cfg.nondeterministic = deterministic and 0 or 1
  cfg.seed = whole(opts.seed or 0, "seed", level)

  local n = #tables
  local tc = ffi.new("ur_tbe_table_config[?]", n)
  local self = { table_index = {}, table_names = {}, features = {}, feature_index = {},
                 dims = {}, rows = {}, poolings = {}, optimizer = optim_name, deterministic = deterministic,
                 bounds = opts.bounds or "fatal", stochastic_rounding = opts.stochastic_rounding ~= false,
                 _keep = {} }
  local ctx = { opts = opts, default_place = default_place, cached = cached, cache_opts = cache_opts }
  local nf, ft, fnames = O.tables(tables, tc, TABLE_OPTS, self, opts, configure_table, ctx, level)
  local out = ffi.new("ur_tbe *[1]")
  local ok, err = check(C.ur_tbe_new(out, cfg, n, tc, nf, ft, fnames), level)
  if not ok then return nil, err end
  self._keep = nil
  self.h = wrap_tbe(out[0])
  table_options.set_output(self, device, tonumber(C.ur_tbe_out_dim(out[0])), tables, opts)
  self.state_names = {}
  for k = 0, C.ur_tbe_state_count(out[0]) - 1 do
    self.state_names[k + 1] = ffi.string(C.ur_tbe_state_name(out[0], k))
  end
  self._spk = ffi.new("int64_t[?]", nf)
  self._keys_ok = setmetatable({}, { __mode = "k" }) -- KJTs whose keys were checked
  setmetatable(self, mt)
  if #cached > 0 then
    local cache
    cache, err = require("uvmrec.cache").new(self, cached, cache_opts, level)
    if not cache then
      self:free()
      return nil, err
    end
    self.cache, self.cached = cache, {}
    for _, name in ipairs(cached) do self.cached[name] = true end
    if cache_opts.backing == "managed" and device >= 0 then
      for _, name in ipairs(cached) do
        local v = self:table(name)
        v:advise(0, v:numel(), "preferred_location", "cpu")
        v:advise(0, v:numel(), "accessed_by", device)
        v:free()
      end
    end
  end
  return self
end

local H, S, T = lib.method_ptrs("embedding collection")

function methods:free()
  if self.cache then self.cache:free() end
  free_tbe(self.h)
end

-- ---- inputs ----

-- The input as the C calls take it: a KJT whose keys are the collection's features (a variable
-- batch per key: its stride_per_key_per_rank and inverse_indices), or a table {values=,
-- offsets=[, weights=][, stride_per_key_per_rank=, inverse_indices=]} of tensors and, for
-- the strides, {{s1}, {s2}, ...} as a KJT gives them.  Returns the pointers of values,
-- offsets, weights and inverse indices and the strides per key (a host array), or nil.  A KJT
-- not known checked is checked first (kjt.need_checked: a bad one raises naming its key and
-- sample; on a GPU the kernels read its offsets as given), unless `sizes` (the caller reads
-- only sizes); nil, message where the check itself failed.  Tensors given in a table are read
-- as given: the caller's to check (on the CPU the engine checks the offsets).
function methods:_input(input, level, sizes)
  level = level + 1
  local v, o, w, spk, inv
  local nf = #self.features
  if kjt.is(input) then
    local p = lib.ptr(input, "kjt", level)
    if not self._keys_ok[input] then
      O.same_keys(input:keys(), self.features, level)
      self._keys_ok[input] = true
    end
    if not sizes then
      local ok, err = kjt.need_checked(input, "embedding collection", level)
      if not ok then return nil, err end
    end
    v, o, w = C.ur_kjt_values(p), C.ur_kjt_offsets(p), C.ur_kjt_weights(p)
    if C.ur_kjt_variable_stride(p) ~= 0 then
      for i = 0, nf - 1 do self._spk[i] = C.ur_kjt_stride_of(p, i) end
      spk, inv = self._spk, C.ur_kjt_inverse_indices(p)
    end
  elseif type(input) == "table" then
    if input.values == nil or input.offsets == nil then
      error("embedding collection: the input has no values or offsets", level)
    end
    v, o = T(input.values, "values", level), T(input.offsets, "offsets", level)
    w = input.weights ~= nil and T(input.weights, "weights", level) or nil
    inv = input.inverse_indices ~= nil and T(input.inverse_indices, "inverse_indices", level) or nil
    local per = input.stride_per_key_per_rank
    if per ~= nil then
      if type(per) ~= "table" or #per ~= nf then
        error(("embedding collection: stride_per_key_per_rank must list %d keys"):format(nf), level)
      end
      for i, ranks in ipairs(per) do
        local what = "stride_per_key_per_rank[" .. i .. "]"
        if type(ranks) ~= "table" or #ranks ~= 1 then
          error(("embedding collection: %s must be a list of one stride (one rank), such as {2}"):format(what),
                level)
        end
        self._spk[i - 1] = whole(ranks[1], what .. "[1]", level)
      end
      spk = self._spk
    end
  else
    error("embedding collection: input must be a KJT or a table {values=, offsets=[, weights=]}", level)
  end
  return v, o, w, spk, inv
end

-- The shape of the output for this input.
function methods:output_shape(input)
  local v, o, _, spk, inv = self:_input(input, 2, true)
  if not self.pooled then return { tonumber(C.ur_tensor_numel(v)), self.out_dim } end
  local nf = #self.features
  -- Shapes that do not divide are left for the engine to report.
  if inv ~= nil then return { math.floor(tonumber(C.ur_tensor_numel(inv)) / nf), self.out_dim } end
  if spk then
    local total = 0
    for i = 1, nf do total = total + tonumber(spk[i - 1]) * self.feature_dims[i] end
    return { total }
  end
  -- no offsets: 0 rows (the forward then names the empty offsets)
  return { math.max(0, math.floor((tonumber(C.ur_tensor_numel(o)) - 1) / nf)), self.out_dim }
end

methods.placement, methods.new_output = table_options.placement, table_options.new_output

-- ---- batches through the cache ----

-- prepare(input[, stream]): brings the rows of a batch's input into the cache of the cached
-- tables ahead of its forward (the prefetch pipeline does, on its own stream) and returns the
-- batch's ticket, which goes with the batch to forward and backward; nil without cached tables
-- (nil, message when the cache failed: memory, the HBM budget).
function methods:prepare(input, stream)
  if not self.cache then return nil end
  local v, o, _, spk = self:_input(input, 2)
  if not v then return nil, o end
  return self.cache:prepare(v, o, spk, stream, 2)
end

-- retire(ticket[, trained][, stream]): a batch's ticket done with: trained (its backward is
-- enqueued on stream) or only read (a batch dropped, a forward without backward).  Without a
-- ticket: the one the last forward prepared itself.
function methods:retire(ticket, trained, stream)
  if not self.cache then return true end
  if ticket == nil then
    ticket = self._own and self._own.ticket
    self._own = nil
    if not ticket then return true end
  end
  return self.cache:retire(ticket, trained, stream, 2)
end

-- The ticket of a batch for its forward or backward: the one it brings (the batches in flight
-- before it, forwards without a backward, are retired first), or one prepared now and kept for
-- the backward of the same input.
function methods:_ticket(input, v, o, spk, stream, ticket, level)
  level = level + 1
  local c = self.cache
  if ticket then
    if ticket.retired then
      error(("embedding collection: the batch's ticket %d was retired already (trained or dropped)")
            :format(tonumber(ticket.id)), level)
    end
    assert(c:retire_before(ticket, stream, level))
    return ticket
  end
  local own = self._own
  if own and own.input == input and not own.ticket.retired then return own.ticket end
  assert(c:retire_before(nil, stream, level))
  local t, err = c:prepare(v, o, spk, stream, level)
  if not t then return nil, err end
  self._own = { input = input, ticket = t }
  return t
end

-- A batch's arguments for the C calls (values, offsets, weights, per-key offsets, inverse:
-- _input's), its values as cache slots through its ticket (returned last) where the tables are
-- cached; nil, message when there is no ticket to be had.
function methods:_args(input, stream, ticket, level)
  level = level + 1
  local v, o, w, spk, inv = self:_input(input, level)
  if not v or not self.cache then return v, o, w, spk, inv end
  local t, err = self:_ticket(input, v, o, spk, stream, ticket, level)
  if not t then return nil, err end
  return T(t.ids, "cache ids", level), o, w, spk, inv, t
end

-- forward(input[, out][, stream][, ticket]): the pooled embeddings (into out when given).
function methods:forward(input, out, stream, ticket)
  local v, o, w, spk, inv = self:_args(input, stream, ticket, 2)
  if not v then return nil, o end
  if out == nil then
    local err
    out, err = self:new_output(input)
    if not out then return nil, err end
  end
  local ok, err = check(C.ur_tbe_forward(S(stream), H(self), v, o, w, spk, inv, T(out, "out", 2)), 2)
  if not ok then return nil, err end
  return out
end

-- backward(input, grad_out[, stream][, ticket]): steps the optimizer on every row the input
-- read; the batch's ticket is retired (trained).
function methods:backward(input, grad, stream, ticket)
  local v, o, w, spk, inv, t = self:_args(input, stream, ticket, 2)
  if not v then return nil, o end
  local ok, err = check(C.ur_tbe_backward(S(stream), H(self), T(grad, "grad_out", 2), v, o, w, spk, inv), 2)
  if not ok then return nil, err end
  if t then
    if self._own and self._own.ticket == t then self._own = nil end
    return self.cache:retire(t, true, stream, 2)
  end
  return true
end

-- Rowwise Adagrad over column shards (uvmrec.dist.sharded): a table split by columns steps
-- each row by the mean squared gradient of the whole row.  set_row_sums(name, sums or nil):
-- sums f32 [the table's rows] at the collection's side, kept alive while set (one per table).
-- row_sums(input, grad_out[, stream][, ticket]): backward's first half: for every row the input
-- reads, the sum over the table's own columns of its squared gradient, into its sums (0 for
-- the other rows); nothing steps.  The caller sums the shards' sums (an all-reduce), then
-- backward(input, grad_out) steps every row by its sums over the whole row's columns.
function methods:set_row_sums(name, sums)
  local i = O.table_index(self, name, 2)
  local ok, err = check(C.ur_tbe_set_row_sums(H(self), i, sums and T(sums, "sums", 2) or nil), 2)
  if not ok then error(err, 2) end
  self._row_sums = self._row_sums or {}
  self._row_sums[name] = sums
  return self
end

function methods:row_sums(input, grad, stream, ticket)
  local v, o, w, spk, inv = self:_args(input, stream, ticket, 2)
  if not v then return nil, o end
  return check(C.ur_tbe_row_sums(S(stream), H(self), T(grad, "grad_out", 2), v, o, w, spk, inv), 2)
end

-- sparse_grad(input, grad_out[, stream]): the deduplicated gradient, without a step:
-- { [table name] = { rows = i64 [U], grad = f32 [U, dim] } } for tables the input touched.
function methods:sparse_grad(input, grad, stream)
  if self.cache then
    error("embedding collection: sparse_grad is not available with cached tables (their rows "
          .. "are stepped in the cache)", 2)
  end
  local v, o, w, spk, inv = self:_input(input, 2)
  if not v then return nil, o end
  local rows, grads = ffi.new("ur_tensor *[1]"), ffi.new("ur_tensor *[1]")
  local counts = ffi.new("int64_t[?]", #self.table_names)
  local ok, err = check(C.ur_tbe_sparse_grad(S(stream), H(self), T(grad, "grad_out", 2), v, o, w, spk, inv,
                                             rows, grads, counts), 2)
  if not ok then return nil, err end
  local r, g = tensor.wrap(rows[0]), tensor.wrap(grads[0])
  local res, u, e = {}, 0, 0
  for i, name in ipairs(self.table_names) do
    local cnt, dim = tonumber(counts[i - 1]), self.dims[name]
    if cnt > 0 then
      res[name] = { rows = r:view(u, cnt), grad = g:view_as(e, { cnt, dim }) }
    end
    u, e = u + cnt, e + cnt * dim
  end
  r:free()
  g:free()
  return res
end

-- ---- tables and state ----

local table_index = O.table_index

local out_tensor = ffi.new("ur_tensor *[1]")

-- Table `name` as a [rows, dim] view of the batched storage.
function methods:table(name)
  if self.cache and self.cached[name] then assert(self.cache:retire_all()) assert(self.cache:flush()) end
  must(C.ur_tbe_table(H(self), table_index(self, name, 2), out_tensor))
  return tensor.wrap(out_tensor[0])
end

-- { name = view } for every table, in table order as a list of {name=, tensor=} too.
function methods:tables()
  local list = {}
  for i, name in ipairs(self.table_names) do list[i] = { name = name, tensor = self:table(name) } end
  return list
end

-- Table `name`'s optimizer state: { sum = ... } or { exp_avg = ..., exp_avg_sq = ... }.
function methods:state(name)
  local i, out = table_index(self, name, 2), {}
  if self.cache and self.cached[name] then assert(self.cache:retire_all()) assert(self.cache:flush()) end
  for k, sname in ipairs(self.state_names) do
    must(C.ur_tbe_state(H(self), i, k - 1, out_tensor))
    out[sname] = tensor.wrap(out_tensor[0])
  end
  return out
end

-- Draws table `name` again, uniform in [lo, hi): the same on every backend and placement.
function methods:init_table(name, lo, hi, seed, stream)
  if self.cache and self.cached[name] then assert(self.cache:invalidate()) end
  local ok, err = check(C.ur_tbe_init_table(S(stream), H(self), table_index(self, name, 2), lo, hi,
                                            whole(seed or 0, "init_table seed", 2)))
  if not ok then return nil, err end
  return self
end

-- Copies a tensor of the table's dtype and shape into table `name`.
function methods:load(name, src, stream)
  if self.cache and self.cached[name] then assert(self.cache:invalidate()) end
  local r, err = table_options.load(self, name, src, stream, "embedding collection", 2)
  if r == nil then return nil, err end
  local ok, ferr = check(C.ur_tbe_far_refresh(H(self)), 2) -- the far rows' copies are older
  if not ok then return nil, ferr end
  return r
end

-- reset_rows(name, ids[, n][, stream]): rows ids (a Lua list of row ids, or an int64_t array
-- of n) drawn again as the collection first drew them, their optimizer state and access
-- counters zeroed (through the row layout in force; a cached table's copies are dropped
-- from the cache first).  Managed collisions reset the rows they give to new ids this way.
function methods:reset_rows(name, ids, n, stream)
  local i = table_index(self, name, 2)
  if type(ids) == "table" then
    stream = n
    ids, n = lib.id_array(ids, "embedding collection: reset_rows ids", 2)
  elseif type(n) ~= "number" then
    error("embedding collection: reset_rows takes a list of ids, or an int64_t array and its length", 2)
  end
  if self.cache and self.cached[name] then
    local ok, err = self.cache:drop(name, ids, n)
    if not ok then return nil, err end
  end
  local ok, err = check(C.ur_tbe_reset_rows(S(stream), H(self), i, ids, n), 2)
  if not ok then return nil, err end
  return self
end

function methods:set_lr(lr) must(C.ur_tbe_set_lr(H(self), lr)) return self end
function methods:set_output_dtype(dtype)
  must(C.ur_tbe_set_out_dtype(H(self), pick(table_options.OUTPUT_DTYPES, dtype,
                                            "output dtype", 2)))
  self.output_dtype = dtype
  return self
end
function methods:lr() return C.ur_tbe_lr(H(self)) end
function methods:step() return tonumber(C.ur_tbe_step(H(self))) end
function methods:set_step(n) must(C.ur_tbe_set_step(H(self), whole(n, "step", 2))) return self end

-- Far rows' copies (uvmrec.h, ur_tbe_set_far_rows; docs/uvm.md): room for n copies of the far
-- rows (read over the host link) a forward reads, which the next backward steps from; 0: none.
function methods:set_far_rows(n)
  -- 2^63 passed a check of its own, cast to -2^63: "tbe set_far_rows: -9223372036854775808 copies"
  lib.whole(n, "embedding collection: far_rows", 2)
  local ok, err = check(C.ur_tbe_set_far_rows(H(self), n), 2)
  if not ok then return nil, err end
  return self
end
function methods:far_rows() return tonumber(C.ur_tbe_far_rows(H(self))) end
-- After rows moved between GPU and host (a hint policy's interval does it), or were written
-- through a view: the copies are forgotten and where far rows begin is read again.
function methods:far_refresh()
  local ok, err = check(C.ur_tbe_far_refresh(H(self)), 2)
  if not ok then return nil, err end
  return self
end

local i64 = ffi.new("int64_t[1]")
-- Table `name`'s first far physical row (its rows when none is far).
function methods:far_from(name)
  must(C.ur_tbe_far_from(H(self), table_index(self, name, 2), i64))
  return tonumber(i64[0])
end
-- The distinct far rows the last forward read (min of it and far_rows() were copied), and how
-- many of its lookups found no free slot in the copies' map (0: the count is exact; more: a lower bound).
local unplaced = ffi.new("int64_t[1]")
function methods:far_taken(stream)
  local ok, err = check(C.ur_tbe_far_taken(S(stream), H(self), i64, unplaced), 2)
  if not ok then return nil, err end
  return tonumber(i64[0]), tonumber(unplaced[0])
end

-- far_prefetch(input[, stream]): early copies (uvmrec.h, ur_tbe_far_prefetch; docs/uvm.md):
-- the far rows of the batch the next forward will read (a KJT or {values=, offsets=}), copied
-- into HBM on `stream` while the current step computes; after this step's forward, before the
-- next.  Nothing is copied on the CPU or without room (set_far_rows).
-- Whether far_prefetch would copy early now (a GPU collection with room, none of its forwards
-- captured into a graph).
function methods:far_early_usable() return C.ur_tbe_far_early_usable(H(self)) == 1 end
function methods:far_prefetch(input, stream)
  local v, o, _, spk = self:_input(input, 2)
  if not v then return nil, o end
  local ok, err = check(C.ur_tbe_far_prefetch(S(stream), H(self), v, o, spk), 2)
  if not ok then return nil, err end
  return self
end

-- set_far_behind(on): write-behind (uvmrec.h, ur_tbe_set_far_behind; docs/uvm.md): a backward
-- steps far rows in their copies only, and the copies go home over the link behind the step.
function methods:set_far_behind(on)
  if type(on) ~= "boolean" then
    error(("embedding collection: set_far_behind(%s); expected true or false"):format(tostring(on)), 2)
  end
  must(C.ur_tbe_set_far_behind(H(self), on and 1 or 0))
  return self
end
function methods:far_behind() return C.ur_tbe_far_behind(H(self)) == 1 end

-- set_far_dma(ways): which of the far rows' moves cross the link through the copy engines and
-- host threads instead of copy kernels (uvmrec.h, ur_tbe_set_far_dma; docs/uvm.md): "home" (the
-- copies written behind), "early" (the early copies), "both" or "none".  nil, message where the
-- GPU or the pinned memory for it cannot have it.  far_dma(): the name; far_dma_stats(): what
-- the host threads did each way, { home = { rows, calls, seconds }, early = { ... } }: rows
-- written home and gathered early, their host calls and those calls' seconds (exact after
-- ur.sync()).
function methods:set_far_dma(ways)
  local ok, err = check(C.ur_tbe_set_far_dma(H(self), pick(table_options.FAR_DMA, ways, "set_far_dma way", 2)), 2)
  if not ok then return nil, err end
  return self
end
function methods:far_dma()
  local w = C.ur_tbe_far_dma(H(self))
  for name, v in pairs(table_options.FAR_DMA) do
    if v == w then return name end
  end
end
function methods:far_dma_stats()
  local v, out = ffi.new("ur_far_dma_stats"), {}
  must(C.ur_tbe_far_dma_stats(H(self), v))
  for _, w in ipairs { "home", "early" } do
    out[w] = { rows = tonumber(v[w .. "_rows"]), calls = tonumber(v[w .. "_calls"]), seconds = v[w .. "_seconds"] }
  end
  return out
end

-- Ids skipped by the "warn" bounds check so far.
-- set_gate(flags or nil): a guard's flags (uvmrec.train.guard, i32 at the collection's side):
-- while their element 0 is set when a backward runs, the backward leaves rows and state as
-- they are, decided where it runs.  The collection keeps the tensor alive while it is set.
function methods:set_gate(flags)
  local ok, err = check(C.ur_tbe_set_gate(H(self), flags and T(flags, "gate", 2) or nil), 2)
  if not ok then error(err, 2) end
  self._gate = flags
  return self
end

function methods:skipped()
  local ok, err = check(C.ur_tbe_skipped(H(self), i64))
  if not ok then return nil, err end
  return tonumber(i64[0])
end

-- The first output column of feature `name` (0-based), pooled collections.
function methods:feature_col(name)
  local f = self.feature_index[name]
  if f == nil then error(("embedding collection: no feature named '%s'"):format(tostring(name)), 2) end
  return tonumber(C.ur_tbe_feature_col(H(self), f))
end

-- ---- pages of managed tables ----

local page_stats = ffi.new("ur_page_stats")
local run_count = ffi.new("int64_t[1]")

local function stats_table(ps)
  return { ids = tonumber(ps.ids), skipped_ids = tonumber(ps.skipped_ids), rows = tonumber(ps.rows),
           pages = tonumber(ps.pages), runs = tonumber(ps.runs), runs_skipped = tonumber(ps.runs_skipped),
           bytes = tonumber(ps.bytes), bytes_skipped = tonumber(ps.bytes_skipped),
           location = lib.location_name(ps.location), issued = ps.issued ~= 0 }
end

local function page_location(location, level)
  if location == nil then return C.UR_LOC_CURRENT_GPU end
  return lib.location(location, level + 1)
end

-- prefetch_pages(input[, stream][, location]): prefetches to the GPU (location: the
-- collection's by default) the pages of the managed tables' rows this input reads, but for
-- runs the hint policy already keeps there; returns {ids, skipped_ids, rows, pages, runs,
-- runs_skipped, bytes (asked for), bytes_skipped, location, issued}.  Without a GPU it
-- computes the same runs and issues nothing (issued = false).
function methods:prefetch_pages(input, stream, location)
  local v, o, _, spk = self:_input(input, 2)
  if not v then return nil, o end
  local loc = page_location(location, 2)
  local ok, err = check(C.ur_tbe_prefetch_pages(S(stream), H(self), v, o, spk, page_stats, loc), 2)
  if not ok then return nil, err end
  return stats_table(page_stats)
end

-- page_runs(input[, location]): what prefetch_pages would ask for, issuing nothing: a list of
-- runs {table = name, tensor = "weights" or a state name, first = byte, bytes =, skipped =
-- bool} (bytes from the start of the tensor's storage, whole pages), and the stats.
function methods:page_runs(input, location)
  local v, o, _, spk = self:_input(input, 2)
  if not v then return nil, o end
  local loc = page_location(location, 2)
  local ok, err = check(C.ur_tbe_page_runs(H(self), v, o, spk, page_stats, loc), 2)
  if not ok then return nil, err end
  local r = C.ur_tbe_last_page_runs(H(self), run_count)
  local list = {}
  for k = 0, tonumber(run_count[0]) - 1 do
    local x = r[k]
    list[k + 1] = { table = self.table_names[x.table + 1],
                    tensor = x.tensor == 0 and "weights" or self.state_names[x.tensor],
                    first = tonumber(x.byte_begin), bytes = tonumber(x.byte_end - x.byte_begin),
                    skipped = x.skipped ~= 0 }
  end
  return list, stats_table(page_stats)
end

-- Access counters, ranking and row layout (uvmrec.tbe_stats).
require("uvmrec.tbe_stats").install(methods)

return M
