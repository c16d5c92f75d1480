-- uvmrec.cache: the software HBM cache of an embedding collection's `cached` tables (the
-- engine's ur_cache, engine/src/embedding/cache.c).  A collection builds its cache itself when a table
-- is placed "cached"; this module is its Lua face:
--
--   local ebc = ur.nn.EmbeddingBagCollection{ tables = { { name = "t", rows = 1e7, dim = 128,
--     placement = "cached" } }, cache = { load_factor = 0.2, policy = "lru" } }
--   local c = ebc.tbe.cache
--   c:stats()          --> { lookups=, unique=, hits=, misses=, conflicts=, evictions=, ...,
--                           hit_rate=, tables = { t = {...} } }
--   c:reset_stats(); c:flush(); c:contains("t", {1, 2, 3}) --> { slot or false, ... }
--
-- Options (the collection's `cache` table): load_factor (fraction of each cached table's rows,
-- default 0.2), or slots (rows), or bytes (slot storage, "1GiB" or a number); shared = true
-- puts every cached table in one pool of sets (else each table has sets of its own size);
-- policy "lru" | "lfu"; decay_batches (LFU, default 0: no decay); staging_rows (conflict
-- misses per batch to start with; grows); backing "host" (pinned when a GPU runs the
-- collection) | "managed" (preferred on the host); min_slots (default 131072): with sets per
-- table, a table of at most min_slots / 2 rows gets 2 slots a row, so it is cached whole with
-- room for its rows' hashing into 32-way sets (else every batch would have conflict misses
-- there, and a conflict row the next batch needs makes it wait for this one's backward); the
-- larger tables share the rest of the total in proportion to their rows.  mover_warps (default
-- 256; 0: a warp a row): the GPU's warps that move a batch's rows, on few SMs so that the
-- prefetch pipeline's moves run beside the step's kernels (a batch moving more than 512 rows a
-- warp gets a warp a row, every SM).  tables = { [name] =
-- { load_factor = c } } gives a table a load factor of its own (the planner's per-table cache
-- sizes, a training config's embeddings.tables.<T>.cache.load_factor): ceil(c * rows) slots (or
-- its 2-slots-a-row floor, as above), and the load_factor, slots or bytes of the options go to the
-- other cached tables; not with shared = true (one pool has no per-table sizes).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local C, check, must = lib.C, lib.check, lib.must

local M = {}
local methods = {}
local mt = { __index = methods }

-- The GPU's row mover: the warps that move a batch's rows, by default (docs/cache.md, the row
-- mover; B4 on the H200: 256 of them, 8 SMs, beside the step's kernels under the pipeline).
M.MOVER_WARPS = 256

local POLICIES = { lru = C.UR_CACHE_LRU, lfu = C.UR_CACHE_LFU }
local OPTS = { load_factor = true, slots = true, bytes = true, shared = true, policy = true,
               decay_batches = true, staging_rows = true, backing = true, min_slots = true, mover_warps = true,
               tables = true }
M.OPTS = OPTS

local wrap_cache, free_cache = lib.handle_type("ur_cache", C.ur_cache_free, {})

local function fail(msg, level) error("cache: " .. msg, level + 1) end

-- Sizes past 2^53 bytes are no size a double holds exactly (and no cache a host has).
local MAX_SIZE = 2 ^ 53

local function bytes_of(v, level)
  local n = type(v) == "number" and v or type(v) == "string" and lib.bytes(v) or nil
  if n == nil then fail(("bytes '%s' is not a number or a size like 512MiB"):format(tostring(v)), level + 1) end
  if not (n >= 1 and n <= MAX_SIZE) then
    fail(("bytes %s; expected a size from 1 byte to 2^53 bytes"):format(tostring(v)), level + 1)
  end
  return n
end

-- Checks the collection's cache options; returns them with defaults (used by uvmrec.tbe
-- before the collection exists, so a bad option fails early).
function M.options(o, level)
  level = (level or 1) + 1
  o = o or {}
  if type(o) ~= "table" then fail("options must be a table", level) end
  lib.known_keys(o, OPTS, "cache", level)
  local r = { policy = o.policy or "lru", shared = o.shared == true, backing = o.backing or "host",
              decay_batches = o.decay_batches or 0, staging_rows = o.staging_rows or 0,
              min_slots = o.min_slots or 131072, mover_warps = o.mover_warps or M.MOVER_WARPS }
  if not POLICIES[r.policy] then
    fail(("policy '%s' is not lru or lfu"):format(tostring(r.policy)), level)
  end
  if r.backing ~= "host" and r.backing ~= "managed" then
    fail(("backing '%s' is not host or managed"):format(tostring(r.backing)), level)
  end
  local n = (o.load_factor and 1 or 0) + (o.slots and 1 or 0) + (o.bytes and 1 or 0)
  if n > 1 then fail("give one of load_factor, slots and bytes", level) end
  if o.load_factor ~= nil then
    if type(o.load_factor) ~= "number" or not (o.load_factor > 0 and o.load_factor <= 1) then
      fail(("load_factor %s; expected a number in (0, 1]"):format(tostring(o.load_factor)), level)
    end
  end
  if o.slots ~= nil and not lib.whole_in(o.slots, 1, MAX_SIZE + 1) then
    fail(("slots %s; expected a whole number from 1 to 2^53"):format(tostring(o.slots)), level)
  end
  if o.shared ~= nil and type(o.shared) ~= "boolean" then
    fail(("shared %s; expected true or false"):format(tostring(o.shared)), level)
  end
  -- decay_batches and mover_warps are the engine's int32_t
  for _, k in ipairs({ "decay_batches", "staging_rows", "min_slots", "mover_warps" }) do
    lib.whole(r[k], "cache: " .. k, level, 0, (k == "decay_batches" or k == "mover_warps") and 2147483647 or nil)
  end
  if r.decay_batches > 0 and r.policy ~= "lfu" then
    fail(("decay_batches %s ages LFU's counts; policy %s keeps none (give policy lfu, or no decay_batches)")
         :format(tostring(r.decay_batches), r.policy), level)
  end
  local own = {}
  if o.tables ~= nil then
    if type(o.tables) ~= "table" then fail("tables must be a table {[name] = {load_factor = c}}", level) end
    for name, t in pairs(o.tables) do
      if type(name) ~= "string" or type(t) ~= "table" then
        fail(("tables: expected {[name] = {load_factor = c}}, got [%s] = %s"):format(tostring(name), tostring(t)),
             level)
      end
      lib.known_keys(t, { "load_factor" }, "cache: tables." .. name, level, nil, nil,
                     "a table sets its own load_factor")
      local c = t.load_factor
      if type(c) ~= "number" or not (c > 0 and c <= 1) then
        fail(("tables.%s.load_factor %s; expected a number in (0, 1]"):format(name, tostring(c)), level)
      end
      own[name] = { load_factor = c }
    end
    if next(own) and r.shared then
      fail("tables: per-table load factors need sets per table; shared = true puts every table in one pool", level)
    end
  end
  r.tables = own
  r.load_factor = o.load_factor or (not o.slots and not o.bytes) and 0.2 or nil
  r.slots = o.slots
  r.bytes = o.bytes and bytes_of(o.bytes, level)
  return r
end

-- Bytes one slot takes: the row and its optimizer state.
local function slot_bytes(dim, dtype, optimizer)
  local es = dtype == "f32" and 4 or 2
  return dim * es + 4 * require("uvmrec.optim").state_floats(optimizer, dim)
end

-- Builds the cache of collection `t` (a uvmrec.tbe object) over its tables listed in names.
-- Returns the cache, or nil, message (memory, the HBM budget).
function M.new(t, names, o, level)
  level = (level or 1) + 1
  o = M.options(o, level)
  local n = #names
  local idx = ffi.new("int32_t[?]", n)
  local per = ffi.new("int64_t[?]", n)
  local total_rows, dim, dtype = 0, nil, nil
  local cached = {}
  for i, name in ipairs(names) do
    idx[i - 1] = t.table_index[name]
    cached[name] = true
    if not o.tables[name] then total_rows = total_rows + t.rows[name] end
    dim, dtype = t.dims[name], t.dtypes[name]
  end
  for name in pairs(o.tables) do
    if not cached[name] then
      local list = { unpack(names) }
      table.sort(list)
      fail(("tables.%s: no cached table of that name (cached: %s)"):format(name, table.concat(list, ", ")), level)
    end
  end
  local cfg = ffi.new("ur_cache_config")
  cfg.policy = POLICIES[o.policy]
  cfg.decay_batches = o.decay_batches
  cfg.staging_rows = o.staging_rows
  cfg.mover_warps = o.mover_warps
  local total_slots
  if total_rows == 0 then
    total_slots = 0 -- every cached table has a load factor of its own
  elseif o.load_factor then
    total_slots = math.ceil(o.load_factor * total_rows)
  elseif o.slots then
    total_slots = o.slots
  else
    total_slots = math.max(1, math.floor(o.bytes / slot_bytes(dim, dtype, t.optimizer)))
  end
  if o.shared then
    cfg.slots = total_slots
  else
    -- tables with a load factor of their own take ceil(c * rows) (or their floor); then small
    -- tables (their floor where it beats their share), then the others' shares of what is
    -- left, in proportion to their rows
    local floor, left, rest_rows = {}, total_slots, 0
    for _, name in ipairs(names) do
      local rows, c = t.rows[name], o.tables[name] and o.tables[name].load_factor
      local f = 2 * rows
      if c then
        local share = math.ceil(c * rows)
        floor[name] = (f <= o.min_slots and f > share) and f or share
      elseif f <= o.min_slots and f > total_slots * rows / total_rows then
        floor[name] = f
        left = left - f
      else
        rest_rows = rest_rows + rows
      end
    end
    for i, name in ipairs(names) do
      per[i - 1] = floor[name] or math.max(1, math.ceil(math.max(left, 0) * t.rows[name] / rest_rows))
    end
    cfg.table_slots = per
  end
  local out = ffi.new("ur_cache *[1]")
  local ok, err = check(C.ur_cache_new(out, lib.ptr(t.h, "embedding collection", level), n, idx, cfg),
                        level)
  if not ok then return nil, err end
  local self = setmetatable({ h = wrap_cache(out[0]), names = { unpack(names) }, index = {},
                              options = o, tbe = t, _order = {},
                              _pool = {}, _next_ticket = 1 }, mt)
  for i, name in ipairs(names) do self.index[name] = i - 1 end
  if not o.shared then
    -- each table's slots as asked (the engine rounds each up to whole sets of 32)
    self.table_slots = {}
    for i, name in ipairs(names) do self.table_slots[name] = tonumber(per[i - 1]) end
  end
  return self
end

local H, S = lib.method_ptrs("cache")

-- Frees the cache: its dirty rows go home first (where they cannot, the engine marks its tables'
-- rows lost: uvmrec.h's ur_cache_free), and its collection goes on without it, its tables read
-- from their own storage.  The batches in flight go with it.
function methods:free()
  free_cache(self.h)
  -- (nothing allocated: a free may come when memory is short)
  for i = #self._pool, 1, -1 do
    self._pool[i].buf:free()
    self._pool[i] = nil
  end
  for i = #self._order, 1, -1 do
    self._order[i].ids:free()
    self._order[i].buf:free()
    self._order[i] = nil
  end
  if self.tbe.cache == self then self.tbe.cache, self.tbe.cached = nil, nil end
end
function methods:slots() return tonumber(C.ur_cache_slots(H(self))) end
function methods:staging_rows() return tonumber(C.ur_cache_staging_rows(H(self))) end
function methods:bytes() return tonumber(C.ur_cache_bytes(H(self))) end
function methods:in_flight() return C.ur_cache_in_flight(H(self)) end

-- ---- batches: used by uvmrec.tbe's prepare, forward and backward ----

-- The buffers of slot ids are reused oldest first.  A buffer comes back at its batch's retire
-- (ticket t), while the GPU may still run that batch's backward on another stream; it is taken
-- again only by the prepare of ticket t + 2 or later, which the engine makes wait for t's
-- retire (or runs on t's own stream) before it copies anything.
function methods:_buffer(n)
  for i, e in ipairs(self._pool) do
    if e.free_at <= self._next_ticket and e.buf:numel() >= n then
      table.remove(self._pool, i)
      return e.buf
    end
  end
  local opts = { dtype = "i64", placement = self.tbe.device >= 0 and "device" or "host" }
  if self.tbe.device >= 0 then opts.device = self.tbe.device end
  return tensor.tensor({ math.max(1, math.ceil(n * 1.25)) }, opts)
end

-- prepare(v, o, spk[, stream]): looks up a batch (the pointers of its values and offsets and
-- its strides per key, as uvmrec.tbe hands them) and brings its rows in, ordered on stream.
-- Returns the batch's ticket, which travels with the batch to its forward and backward:
-- { id = the engine's ticket, ids = the slot ids tensor the kernels read }.
function methods:prepare(v, o, spk, stream, level)
  level = (level or 1) + 1
  local n = tonumber(C.ur_tensor_numel(v))
  local buf, err = self:_buffer(n)
  if not buf then return nil, err end
  local ids = buf:view(0, n)
  local id = ffi.new("int64_t[1]")
  local ok
  ok, err = check(C.ur_cache_prepare(S(stream, level), H(self, level), v, o, spk,
                                     lib.ptr(ids, "ids", level), id), level)
  if not ok then
    ids:free()
    self._pool[#self._pool + 1] = { buf = buf, free_at = 0 }
    return nil, err
  end
  local ticket = { id = id[0], ids = ids, buf = buf, retired = false }
  self._next_ticket = tonumber(id[0]) + 1
  self._order[#self._order + 1] = ticket
  return ticket
end

-- Retires a batch's ticket: trained (its backward is enqueued on stream) or only read.  A
-- ticket retired already is left alone; one the engine refused to retire stays in flight (its
-- ids and buffer kept), so that every later retire of it says why again.
function methods:retire(ticket, trained, stream, level)
  level = (level or 1) + 1
  if ticket.retired then return true end
  local ok, err = check(C.ur_cache_retire(S(stream, level), H(self, level), ticket.id, trained and 1 or 0), level)
  if not ok then return nil, err end
  ticket.retired = true
  for i, t in ipairs(self._order) do
    if t == ticket then
      table.remove(self._order, i)
      break
    end
  end
  ticket.ids:free()
  self._pool[#self._pool + 1] = { buf = ticket.buf, free_at = tonumber(ticket.id) + 2 }
  return true
end

-- Retires, only read, every ticket in flight older than `ticket` (nil: all of them): a forward
-- without a backward leaves its batch in flight until the next one comes.
function methods:retire_before(ticket, stream, level)
  level = (level or 1) + 1
  while self._order[1] and self._order[1] ~= ticket do
    local ok, err = self:retire(self._order[1], false, stream, level)
    if not ok then return nil, err end
  end
  return true
end

-- Retires every batch in flight (only read): before a flush, an invalidation, the end.
function methods:retire_all(stream)
  return self:retire_before(nil, stream, 2)
end

-- ---- state ----

-- Writes every dirty row back to host memory (the collection's own tables then hold the truth).
function methods:flush()
  local ok, err = check(C.ur_cache_flush(H(self)))
  if not ok then return nil, err end
  return true
end

-- Flushes and empties the cache: after the tables' host rows were changed behind it.
function methods:invalidate()
  local ok, err = self:retire_all()
  if ok then ok, err = check(C.ur_cache_invalidate(H(self))) end
  if not ok then return nil, err end
  return true
end

-- The index of cached table `name`; an unknown name raises at the method's caller, naming the
-- cached ones.
local function cached_index(self, name)
  local i = self.index[name]
  if i == nil then
    error(("cache: no cached table named '%s' (cached: %s)"):format(tostring(name),
          table.concat(self.names, ", ")), 3)
  end
  return i
end

-- drop(name, ids, n): rows ids (a Lua list, or an int64_t array of n) leave the cache without a
-- write-back, after their host rows were re-initialised (tbe:reset_rows).  Returns how many
-- were cached.
local dropped = ffi.new("int64_t[1]")
function methods:drop(name, ids, n)
  local i = cached_index(self, name)
  local ok, err = self:retire_all()
  if not ok then return nil, err end
  if type(ids) == "table" then ids, n = lib.id_array(ids, "cache: drop ids", 2) end
  ok, err = check(C.ur_cache_drop(H(self), i, ids, n, dropped), 2)
  if not ok then return nil, err end
  return tonumber(dropped[0])
end

local st = ffi.new("ur_cache_stats")
local FIELDS = { "batches", "lookups", "unique", "hits", "misses", "conflicts", "evictions",
                 "writebacks", "waits", "staging_grows", "staging_grows_via_host", "bytes_in",
                 "bytes_out", "bytes_ids" }

local function stats_of(h, i)
  must(C.ur_cache_stats_get(h, i, st), 3)
  local r = {}
  for _, f in ipairs(FIELDS) do r[f] = tonumber(st[f]) end
  r.seconds, r.gpu_seconds = st.seconds, st.gpu_seconds
  local ph = st.gpu_phase_seconds
  r.gpu_phases = { lookup = ph[0], decide = ph[1], place = ph[2], retire = ph[3] }
  r.hit_rate = r.unique > 0 and r.hits / r.unique or 0
  return r
end

-- Totals, with .tables[name] per table.  hit_rate: hits over distinct rows looked up.
function methods:stats()
  local h = H(self)
  local r = stats_of(h, -1)
  r.tables = {}
  for i, name in ipairs(self.names) do r.tables[name] = stats_of(h, i - 1) end
  return r
end

function methods:reset_stats() C.ur_cache_reset_stats(H(self)) return self end

-- contains(table, ids): for each id, its slot (0-based) or false.
function methods:contains(name, ids)
  local i = cached_index(self, name)
  if type(ids) ~= "table" then error("cache: contains takes a list of ids", 2) end
  local a, n = lib.id_array(ids, "cache: contains ids", 2)
  local out = ffi.new("int64_t[?]", math.max(n, 1))
  must(C.ur_cache_contains(H(self), i, a, n, out))
  local r = {}
  for k = 1, n do
    local s = tonumber(out[k - 1])
    r[k] = s >= 0 and s or false
  end
  return r
end

-- A run's cache figures a step, from stats (methods:stats()) over `steps` steps: hit_rate, the
-- bytes over the host link, the GPU seconds of the cache's work and of its phases.
function M.per_step(s, steps)
  local ph = s.gpu_phases
  return { hit_rate = s.hit_rate, link_bytes = (s.bytes_in + s.bytes_out + s.bytes_ids) / steps,
           gpu_seconds = s.gpu_seconds / steps, lookup_seconds = ph.lookup / steps,
           decide_seconds = ph.decide / steps, place_seconds = ph.place / steps, retire_seconds = ph.retire / steps }
end

-- M.per_step's figures in a line.
function M.step_line(p)
  return ("%.1f%% of distinct rows hit, %.1f MB a step over the host link, GPU %.3f ms a step (lookup %.3f, "
          .. "decisions %.3f, placement and moves %.3f, retire %.3f)"):format(100 * p.hit_rate, p.link_bytes / 1e6,
    p.gpu_seconds * 1e3, p.lookup_seconds * 1e3, p.decide_seconds * 1e3, p.place_seconds * 1e3,
    p.retire_seconds * 1e3)
end

return M
