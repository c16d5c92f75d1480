-- Managed collisions: the engine's ur_mc as a Lua object.  Raw 64-bit ids go to the rows of
-- embedding tables: the ids that rank best by the table's policy hold rows of their own, every
-- other id reads one of the table's last fallback_rows rows; rounds between batches admit and
-- evict (see uvmrec.h, "managed collisions", and docs/collisions.md).  The nn module
-- ur.nn.ManagedCollisionCollection puts it in front of an embedding collection.
--
--   local mc = require "uvmrec.mc"
--   local m = mc.new{ tables = { { name = "t", rows = 1000, features = { "a", "b" } } },
--                     policy = "lfu", evict_every = 100 }
--   local rows = m:remap(kjt)            -- a KJT of rows: the same keys, lengths and weights
--   m:reassigned("t")                    -- rows the last batch's round gave to other ids
--   m:stats()                            -- {resident=, lookups=, fallback_lookups=, rounds=, ...}
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local C, check, must = lib.C, lib.check, lib.must

local M = {}
local methods = {}
local mt = { __index = methods }

M.POLICIES = { lfu = C.UR_MC_LFU, lru = C.UR_MC_LRU, distance_lfu = C.UR_MC_DISTANCE_LFU }
-- The per-table settings, each also a collection-wide default.
M.TABLE_SETTINGS = { "policy", "evict_every", "fallback_rows", "max_candidates", "decay",
                     "distance_power", "fill" }

local OPTS = { tables = true, features = true, device = true, seed = true }
local TABLE_OPTS = { name = true, rows = true, features = true }
for _, k in ipairs(M.TABLE_SETTINGS) do
  OPTS[k] = true
  TABLE_OPTS[k] = true
end

local table_options = require "uvmrec.table_options"
local O = table_options.checks("managed collisions")
local fail, whole = O.fail, O.whole

-- A table's settings with the defaults filled in: its own, else the collection's, else these.
--   policy lfu; evict_every 1000; fallback_rows max(1, rows / 100); max_candidates
--   max(1024, capacity / 4); decay 0.5 (lfu), 1 (distance_lfu, lru); distance_power 1; fill true.
function M.settings(t, defaults, rows, level)
  level = (level or 1) + 1
  defaults = defaults or {}
  local function get(k)
    if t[k] ~= nil then return t[k] end
    return defaults[k]
  end
  local policy = get("policy") or "lfu"
  if M.POLICIES[policy] == nil then
    fail(("table '%s' policy '%s' is not lfu, lru or distance_lfu"):format(tostring(t.name), tostring(policy)),
         level)
  end
  local fb = get("fallback_rows") or math.max(1, math.floor(rows / 100))
  local cap = rows - fb
  local fill = get("fill")
  if fill ~= nil and type(fill) ~= "boolean" then
    fail(("table '%s' fill is %s; expected true or false"):format(tostring(t.name), tostring(fill)), level)
  end
  return { policy = policy, evict_every = get("evict_every") or 1000, fallback_rows = fb,
           max_candidates = get("max_candidates") or math.max(1024, math.floor(cap / 4)),
           decay = get("decay") or (policy == "lfu" and 0.5 or 1),
           distance_power = get("distance_power") or 1, fill = fill ~= false }
end

local wrap_mc, free_mc = lib.handle_type("ur_mc", C.ur_mc_free, {})

-- mc.new(opts), opts:
--   tables = { { name=, rows=, features={...} (default {name}), policy=, evict_every=,
--                fallback_rows=, max_candidates=, decay=, distance_power=, fill= }, ... }
--   features = the input's key order (default: each table's features in table order); a key
--              on no table passes through unchanged
--   policy, evict_every, ...: defaults for every table
--   device = a GPU ordinal or "cpu" (default: the current GPU when there is one); seed = 0
-- Environmental failures (memory, budget, no GPU) return nil, message.
function M.new(opts, level)
  level = (level or 1) + 1
  local tables = O.open(opts, OPTS, "", level)
  local device = lib.device_option(opts.device, level)
  local n = #tables
  local tc = ffi.new("ur_mc_table_config[?]", n)
  local self = { table_index = {}, table_names = {}, features = {}, settings = {}, rows = {},
                 device = device, _keep = {} }
  local on_table = {}
  for i, t in ipairs(tables) do
    local name = O.named(i, t, TABLE_OPTS, self, level)
    local rows = whole(t.rows, "table '" .. name .. "' rows", level, 2)
    local s = M.settings(t, opts, rows, level)
    self.settings[name], self.rows[name] = s, rows
    self._keep[#self._keep + 1] = name
    local c = tc[i - 1]
    c.name = name
    c.rows = rows
    c.fallback_rows = whole(s.fallback_rows, "table '" .. name .. "' fallback_rows", level, 1)
    c.policy = M.POLICIES[s.policy]
    c.evict_every = whole(s.evict_every, "table '" .. name .. "' evict_every", level, 1)
    c.max_candidates = whole(s.max_candidates, "table '" .. name .. "' max_candidates", level, 1)
    if type(s.decay) ~= "number" then fail(("table '%s' decay must be a number"):format(name), level) end
    if type(s.distance_power) ~= "number" then
      fail(("table '%s' distance_power must be a number"):format(name), level)
    end
    c.decay, c.distance_power, c.fill = s.decay, s.distance_power, s.fill and 1 or 0
    O.features(name, t, on_table, self.features, level)
  end
  if opts.features then
    if type(opts.features) ~= "table" then fail("features must be a list of names", level) end
    local listed = {}
    for _, f in ipairs(opts.features) do listed[f] = true end
    for f, tname in pairs(on_table) do
      if not listed[f] then fail(("feature '%s' of table '%s' is not in features"):format(f, tname), level) end
    end
    self.features = { unpack(opts.features) }
  end
  local nf = #self.features
  local ft = ffi.new("int32_t[?]", nf)
  self.feature_table = {}
  for i, f in ipairs(self.features) do
    local tname = on_table[f]
    ft[i - 1] = tname and self.table_index[tname] or -1
    self.feature_table[i] = tname
  end
  local cfg = ffi.new("ur_mc_config")
  cfg.device = device
  cfg.seed = whole(opts.seed or 0, "seed", level, 0)
  self.seed = opts.seed or 0 -- of the hashes: which fallback row each id reads
  local out = ffi.new("ur_mc *[1]")
  local ok, err = check(C.ur_mc_new(out, cfg, n, tc, nf, ft), level)
  if not ok then return nil, err end
  self._keep = nil
  self.h = wrap_mc(out[0])
  self._bpf = ffi.new("int64_t[?]", nf)
  self._count = ffi.new("int64_t[1]")
  return setmetatable(self, mt)
end

local H, S, T = lib.method_ptrs("managed collisions")

function methods:free() free_mc(self.h) end

local table_index = O.table_index

methods.placement = table_options.placement

-- The pieces of an input: a KJT (keys in the map's feature order) or a table {values=,
-- offsets=, batch_per_feature=, inverse=}.  A KJT not known checked is checked first
-- (kjt.need_checked: on a GPU the map reads its offsets and inverse indices as given); nil,
-- message where the check itself failed.
function methods:_input(input, level)
  level = level + 1
  if type(input) ~= "table" and type(input) ~= "cdata" then
    fail("input must be a KJT or a table {values=, offsets=}", level)
  end
  local values, offsets, bpf, inverse
  if type(input.values) == "function" then
    O.same_keys(input:keys(), self.features, level, "map's")
    local kjt = require "uvmrec.kjt"
    if kjt.is(input) then
      local ok, err = kjt.need_checked(input, "managed collisions", level)
      if not ok then return nil, err end
    end
    values, offsets = input:values(), input:offsets()
    if input:variable_stride() then
      bpf, inverse = {}, input:inverse_indices()
      for i, per_rank in ipairs(input:stride_per_key_per_rank()) do bpf[i] = per_rank[1] end
    end
  else
    values, offsets = input.values, input.offsets
    bpf, inverse = input.batch_per_feature, input.inverse
  end
  if values == nil or offsets == nil then fail("the input has no values or offsets", level) end
  local bp
  if bpf then
    if type(bpf) ~= "table" or #bpf ~= #self.features then
      fail(("batch_per_feature must list %d batches"):format(#self.features), level)
    end
    for i, b in ipairs(bpf) do self._bpf[i - 1] = whole(b, "batch_per_feature[" .. i .. "]", level, 0) end
    bp = self._bpf
  end
  return values, offsets, bp, inverse
end

-- The handles remap made: a KJT input's values, offsets and inverse indices (the KJT's own
-- lent to it), and out where it made one.
local function let_go(input, values, offsets, inverse, out)
  if type(input.values) == "function" then
    values:free()
    offsets:free()
    if inverse then inverse:free() end
  end
  if out then out:free() end
end

-- remap(input[, opts][, stream]): each raw id's row.  opts: update (default true: the rounds
-- due run first and the batch is counted; false: a read-only lookup), out (an i64 tensor of
-- the values' size where the map lives; by default a new one, in the values' placement on the
-- CPU).  A KJT input gives a KJT of rows (its keys, lengths, weights and variable batch; known
-- checked when the input is), checked first unless known checked; a table input gives the rows
-- tensor (on a GPU its offsets and inverse indices are read as given).  A refused input leaves
-- nothing behind: the handles made for the call are freed before the error.
function methods:remap(input, opts, stream)
  opts = opts or {}
  if opts.out ~= nil then T(opts.out, "out", 2) end -- before the input's handles are made
  local values, offsets, bp, inverse = self:_input(input, 2)
  if not values then return nil, offsets end
  local out = opts.out
  if out == nil then
    local o = { dtype = "i64", placement = self.device >= 0 and "device" or values:placement() }
    if self.device >= 0 then o.device = self.device end
    local err
    out, err = tensor.tensor({ values:numel() }, o)
    if not out then
      let_go(input, values, offsets, inverse)
      return nil, err
    end
  end
  local st = C.ur_mc_remap(S(stream), H(self), T(values, "values", 2), T(offsets, "offsets", 2), bp,
                           inverse ~= nil and T(inverse, "inverse", 2) or nil, T(out, "out", 2),
                           opts.update == false and 0 or 1)
  if st ~= 0 then
    -- the message is read before the frees (a device tensor's free enters its GPU)
    local msg = ffi.string(C.ur_last_error())
    let_go(input, values, offsets, inverse, opts.out == nil and out or nil)
    if st == C.UR_STATUS_INVALID then error(msg, 2) end
    return nil, msg
  end
  if type(input.values) ~= "function" then return out end
  local lengths, weights = input:lengths(), input:weights()
  local k, kerr = require("uvmrec.kjt").new({ keys = input:keys(), values = out, lengths = lengths,
    weights = weights, stride = input:stride(), stride_per_key_per_rank = bp and input:stride_per_key_per_rank() or nil,
    inverse_indices = inverse, check = false }, 2)
  -- the KJT holds its own views; these handles (and a made-up out) go now
  lengths:free()
  if weights then weights:free() end
  let_go(input, values, offsets, inverse, opts.out == nil and out or nil)
  if not k then return nil, kerr end
  return k
end

-- An eviction round of table `name` now.
function methods:round(name, stream)
  local ok, err = check(C.ur_mc_round(S(stream), H(self), table_index(self, name, 2)), 2)
  if not ok then return nil, err end
  return self
end

-- The rows of table `name` whose id changed in the last remap's (or round's) round, as a
-- pointer and a count (lent until the next remap or round).
function methods:reassigned_ptr(name)
  local p = C.ur_mc_reassigned(H(self), table_index(self, name, 2), self._count)
  return p, tonumber(self._count[0])
end

-- The same as a Lua list, ascending.
function methods:reassigned(name)
  local p, n = self:reassigned_ptr(name)
  local out = {}
  for i = 0, n - 1 do out[i + 1] = tonumber(p[i]) end
  return out
end

-- lookup(name, ids): the row each id reads (without counting), and whether it is resident.
function methods:lookup(name, ids)
  local i = table_index(self, name, 2)
  if type(ids) ~= "table" then fail("lookup takes a list of ids", 2) end
  local a, n = lib.id_array(ids, "mc: lookup ids", 2)
  local rows, res = ffi.new("int64_t[?]", math.max(n, 1)), ffi.new("int32_t[?]", math.max(n, 1))
  local ok, err = check(C.ur_mc_lookup(H(self), i, a, n, rows, res), 2)
  if not ok then return nil, err end
  local r, s = {}, {}
  for k = 1, n do
    r[k] = tonumber(rows[k - 1])
    s[k] = res[k - 1] ~= 0
  end
  return r, s
end

function methods:step() return tonumber(C.ur_mc_step(H(self))) end
function methods:set_step(n) must(C.ur_mc_set_step(H(self), whole(n, "step", 2))) return self end

local st = ffi.new("ur_mc_stats")
local FIELDS = { "capacity", "resident", "candidates", "lookups", "resident_lookups", "fallback_lookups",
                 "rounds", "fills", "admissions", "evictions", "skipped" }

local function stats_of(h, i)
  local ok, err = check(C.ur_mc_stats_get(h, i, st), 3)
  if not ok then return nil, err end
  local r = {}
  for _, f in ipairs(FIELDS) do r[f] = tonumber(st[f]) end
  r.seconds, r.round_seconds = st.seconds, st.round_seconds
  r.occupancy = r.capacity > 0 and r.resident / r.capacity or 0
  r.resident_share = r.lookups > 0 and r.resident_lookups / r.lookups or 0
  r.fallback_share = r.lookups > 0 and r.fallback_lookups / r.lookups or 0
  return r
end

-- Totals, with .tables[name] per table (waits for the GPU).  occupancy: resident ids over
-- capacity; resident_share and fallback_share: of the lookups counted.
function methods:stats()
  local h = H(self)
  local r, err = stats_of(h, -1)
  if not r then return nil, err end
  r.tables = {}
  for i, name in ipairs(self.table_names) do r.tables[name] = assert(stats_of(h, i - 1)) end
  return r
end

function methods:reset_stats() C.ur_mc_reset_stats(H(self)) return self end

local STATE_TENSORS = { "ids", "counts", "window", "last", "cand_ids", "cand_counts", "cand_last" }
-- The state's numbers: its counts, then what sizes the candidates' map (batch_max, slots), so
-- that a restored map counts and skips the batches the saved one would.  A state without one
-- (a checkpoint written before it was kept) restores it as STATE_DEFAULTS says.
local STATE_COUNTS = { "lookups", "resident_lookups", "fallback_lookups", "rounds", "fills", "admissions",
                       "evictions", "skipped", "batch_max", "slots" }
local STATE_DEFAULTS = { batch_max = -1 }
M.STATE_TENSORS, M.STATE_COUNTS = STATE_TENSORS, STATE_COUNTS

-- Table `name`'s map as host tensors {ids, counts, window, last, cand_ids, cand_counts,
-- cand_last} and numbers {lookups, ..., skipped, batch_max, slots}: what a checkpoint saves.
function methods:state(name)
  local s = ffi.new("ur_mc_state")
  local ok, err = check(C.ur_mc_state_get(H(self), table_index(self, name, 2), s), 2)
  if not ok then return nil, err end
  local out = {}
  for _, k in ipairs(STATE_TENSORS) do out[k] = tensor.wrap(s[k]) end
  for _, k in ipairs(STATE_COUNTS) do out[k] = tonumber(s[k]) end
  return out
end

local function state_struct(self, name, from, level)
  level = level + 1
  local i = table_index(self, name, level)
  if type(from) ~= "table" then fail("a state must be a table", level) end
  local s = ffi.new("ur_mc_state")
  for _, k in ipairs(STATE_TENSORS) do
    if not tensor.is_tensor(from[k]) then fail(("state of table '%s' has no tensor %s"):format(name, k), level) end
    s[k] = T(from[k], k, level)
  end
  for _, k in ipairs(STATE_COUNTS) do
    local v = from[k]
    if v == nil then v = STATE_DEFAULTS[k] or 0 end
    if not lib.whole_in(v, -2 ^ 63, 2 ^ 63) then
      return nil, ("mc: state of table '%s': %s is %s; expected a whole number"):format(name, k, tostring(v))
    end
    s[k] = v
  end
  return i, s
end

-- nil, or why a state (as state() gives it) would not restore table `name`: checked as
-- load_state checks it, nothing written.
function methods:check_state(name, from)
  local i, s = state_struct(self, name, from, 2)
  if not i then return s end
  if C.ur_mc_state_check(H(self), i, s) ~= 0 then return ffi.string(C.ur_last_error()) end
  return nil
end

-- Restores table `name` from a state as state() gives it (tensors of any placement).
function methods:load_state(name, from)
  local i, s = state_struct(self, name, from, 2)
  if not i then error(s, 2) end
  local ok, err = check(C.ur_mc_state_set(H(self), i, s), 2)
  if not ok then return nil, err end
  return self
end

return M
