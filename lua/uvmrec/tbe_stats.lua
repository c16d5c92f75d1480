-- Access statistics and row layout of an embedding collection's tables (engine/src/embedding/counters.c, layout.c),
-- as methods of uvmrec.tbe collections:
--
--   c:set_counting(true)                 -- every table (or c:set_counting(true, "t0"))
--   c:forward(kjt) ...                   -- each forward counts the rows it reads
--   local a = c:access("t0")             -- a ranked snapshot of the counters
--   a:topk(10)  a:coverage(0.2)  a:histogram(8)
--   c:decay_counts(0.5)                  -- every table's counts halved (floor)
--   c:relayout("t0", "counts")           -- hottest rows first; {seconds=, bytes=, rows_moved=}
--   c:swap_rows("t0", {3, 9}, {0, 1})    -- ids 3 and 0 trade rows, 9 and 1: in place, on the GPU
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local streams = require "uvmrec.stream"
local C, check, must = lib.C, lib.check, lib.must

local M = {}

local out_tensor = ffi.new("ur_tensor *[1]")
local int64p = ffi.typeof("int64_t *")

local function index_of(self, name, level)
  if name == nil then return -1 end
  local i = self.table_index[name]
  if i == nil then
    error(("embedding collection: no table named '%s' (tables: %s)")
          :format(tostring(name), table.concat(self.table_names, ", ")), level + 1)
  end
  return i
end

-- ---- a ranked snapshot of one table's counters ----

local Access = {}
Access.__index = Access

-- An Access freed, or whose outputs a later snapshot took (snapshot's `into`): every use
-- raises, naming it and why, rather than reading freed memory or the later ranking's values as
-- its own; free() is harmless.
local Spent = {}
local function nothing() end
Spent.__index = function(self, k)
  if k == "free" then return nothing end
  error(("access snapshot of table '%s' used after %s"):format(tostring(rawget(self, "name")),
    rawget(self, "_why")), 2)
end

local TAKEN = "a later snapshot took its order, sums and counts (snapshot's `into`: it is valid until then)"

local function spend(a, why)
  local name = a.name
  for k in pairs(a) do rawset(a, k, nil) end
  rawset(a, "name", name)
  rawset(a, "_why", why)
  setmetatable(a, Spent)
end

-- A host tensor of n elements of dtype dt: `old`'s (of those, from a spent snapshot), else new.
local function output(old, n, dt)
  if old then return old end
  return assert(tensor.tensor({ n }, { dtype = dt }))
end

-- rows ranked by count: order[r] the id of rank r, cumsum[r] the accesses of ranks 0..r;
-- rank_on, where the ranking ran: "device" (the GPU sorted the counters where they live) or
-- "host" (the CPU, for host counters or where the HBM budget had no room for the sort).  With
-- by_id, also by_id[id], the count ranked for id (below 0 as 0): the counters as the ranking
-- read them, so that nothing reads them again (ur_counts_prefix takes it).
-- into (optional): an earlier snapshot of as many rows, whose outputs this one ranks into
-- rather than making new ones (20 bytes a row of host memory, first touched by the ranking
-- otherwise); `into` is spent: any use of it after raises.
local on_device = ffi.new("int32_t[1]")
local function snapshot(counts, name, by_id, into)
  local n = counts:numel()
  local old = {}
  if into ~= nil then
    if getmetatable(into) ~= Access then
      error(("snapshot of table '%s': into is %s; expected an access snapshot (not freed nor taken by another)")
        :format(tostring(name), getmetatable(into) == Spent and "a spent snapshot" or tostring(into)), 2)
    end
    if into.rows ~= n then
      error(("snapshot of table '%s': into has %d rows, the counters %d; expected a snapshot of as many rows")
        :format(tostring(name), into.rows, n), 2)
    end
    old = { order = into.order, cumsum = into.cumsum, by_id = into.by_id }
    if not by_id and old.by_id then old.by_id:free() end
    spend(into, TAKEN)
  end
  local order = output(old.order, n, "i64")
  local cumsum = output(old.cumsum, n, "i64")
  local by = by_id and output(old.by_id, n, "i32") or nil
  must(C.ur_counts_rank(lib.ptr(counts, "counts", 3), lib.ptr(order, "order", 3), lib.ptr(cumsum, "cumsum", 3),
                        by and by.p, on_device))
  local self = setmetatable({ name = name, rows = n, order = order, cumsum = cumsum, by_id = by,
                              rank_on = on_device[0] ~= 0 and "device" or "host",
                              _o = ffi.cast(int64p, C.ur_tensor_data(order.p)),
                              _c = ffi.cast(int64p, C.ur_tensor_data(cumsum.p)) }, Access)
  self.total = n > 0 and tonumber(self._c[n - 1]) or 0
  return self
end
M.snapshot = snapshot

-- The count of the row of rank r (0-based).
function Access:count_at(r)
  local c = self._c
  return tonumber(c[r] - (r > 0 and c[r - 1] or 0))
end

-- Accesses taken by the k most counted rows.
function Access:accesses(k)
  if k <= 0 then return 0 end
  if k > self.rows then k = self.rows end
  return tonumber(self._c[k - 1])
end

-- The k most counted rows: ids and counts, as two lists.
function Access:topk(k)
  k = math.min(k, self.rows)
  local ids, counts = {}, {}
  for r = 0, k - 1 do
    ids[r + 1] = tonumber(self._o[r])
    counts[r + 1] = self:count_at(r)
  end
  return ids, counts
end

-- The fraction of accesses taken by the hottest fraction x of rows (0 when nothing counted).
function Access:coverage(x)
  if type(x) ~= "number" or not (x >= 0 and x <= 1) then
    error(("coverage: x is %s; expected a fraction of the rows from 0 to 1"):format(tostring(x)), 2)
  end
  if self.total == 0 then return 0 end
  return self:accesses(math.floor(x * self.rows + 0.5)) / self.total
end

-- Rows of count >= v (counts are ranked descending: a binary search).
function Access:rows_at_least(v)
  local lo, hi = 0, self.rows -- the first rank whose count is below v
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if self:count_at(mid) >= v then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- Rows by count in power-of-two bins: {lo=, hi=, rows=, accesses=} for counts 0, 1, 2..3,
-- 4..7, ... (bins of them, at least 1, the last open-ended: one bin holds every row).
function Access:histogram(bins)
  bins = bins or 16
  if not lib.whole_in(bins, 1, 65) then
    error(("histogram: bins is %s; expected a whole number from 1 to 64"):format(tostring(bins)), 2)
  end
  local out = {}
  for b = 0, bins - 1 do
    local lo = b == 0 and 0 or 2 ^ (b - 1)
    local hi = b == bins - 1 and math.huge or b == 0 and 0 or 2 ^ b - 1
    -- ranks with count >= lo are [0, n_lo); those of this bin are [n_above, n_lo)
    local n_lo = self:rows_at_least(lo)
    local n_above = hi == math.huge and 0 or self:rows_at_least(hi + 1)
    out[#out + 1] = { lo = lo, hi = hi, rows = n_lo - n_above,
                      accesses = self:accesses(n_lo) - self:accesses(n_above) }
  end
  return out
end

function Access:free()
  self.order:free()
  self.cumsum:free()
  if self.by_id then self.by_id:free() end
  spend(self, "its free()")
end

-- ---- methods of collections ----

function M.install(methods)
  -- Counting on or off, for table `name` or every table (name nil).  The first time on makes
  -- zeroed counters; off keeps them.
  function methods:set_counting(on, name)
    local ok, err = check(C.ur_tbe_set_counting(self.h.p, index_of(self, name, 2), on and 1 or 0), 2)
    if not ok then return nil, err end
    return self
  end

  function methods:counting(name) return C.ur_tbe_counting(self.h.p, index_of(self, name, 2)) ~= 0 end

  -- The counters of table `name`: an i32 [rows] view, indexed by row id.
  function methods:counts(name)
    must(C.ur_tbe_counts(self.h.p, index_of(self, name, 2), out_tensor))
    return tensor.wrap(out_tensor[0])
  end

  -- c = floor(c * factor) for table `name`'s counters (every table's with name nil).
  function methods:decay_counts(factor, name, stream)
    if type(factor) ~= "number" then
      error(("tbe: decay factor %s (a %s); expected a number in [0, 1]"):format(tostring(factor), type(factor)), 2)
    end
    local ok, err = check(C.ur_tbe_decay_counts(streams.handle(stream, 3), self.h.p,
                                                index_of(self, name, 2), factor), 2)
    if not ok then return nil, err end
    return self
  end

  -- A ranked snapshot of table `name`'s counters (topk, coverage, histogram; by_id: the
  -- counts by id too, as snapshot's).
  function methods:access(name, by_id)
    local c = self:counts(name)
    local a = snapshot(c, name, by_id)
    c:free()
    return a
  end

  -- The permutation in force (i64 [rows] view, perm[id] = physical row), or nil: identity.
  function methods:permutation(name)
    must(C.ur_tbe_permutation(self.h.p, index_of(self, name, 2), out_tensor))
    if out_tensor[0] == nil then return nil end
    return tensor.wrap(out_tensor[0])
  end

  -- A number that changes whenever table `name`'s permutation does (relayout, swap_rows,
  -- set_permutation): a copy of it read at one number is current while the number stays.
  function methods:permutation_gen(name)
    local g = ffi.new("uint64_t[1]")
    must(C.ur_tbe_permutation_gen(self.h.p, index_of(self, name, 2), g))
    return tonumber(g[0])
  end

  -- Installs perm (i64 [rows], or nil: identity) without moving rows: for rows already laid
  -- out by it (a checkpoint's).
  function methods:set_permutation(name, perm)
    local ok, err = check(C.ur_tbe_set_permutation(self.h.p, index_of(self, name, 2),
                                                   perm and lib.ptr(perm, "perm", 2) or nil), 2)
    if not ok then return nil, err end
    return self
  end

  -- The permutation that puts rows in order of their counts, hottest first (host i64 [rows]).
  function methods:perm_from_counts(name)
    local a = self:access(name)
    local perm = assert(tensor.tensor({ a.rows }, { dtype = "i64" }))
    must(C.ur_perm_from_order(a.order.p, perm.p))
    a:free()
    return perm
  end

  -- Trades the physical rows of ids a[k] and b[k] of table `name` (Lua lists, or int64_t
  -- arrays with n), rows and optimizer state, in place and on the stream (on a GPU, a kernel:
  -- nothing waits); no id may be in two pairs.  Returns {seconds, bytes, rows_moved, on_gpu}, or
  -- nil, message.
  function methods:swap_rows(name, a, b, n, opts)
    opts = opts or {}
    local i = index_of(self, name, 2)
    if type(a) == "table" then
      if type(b) ~= "table" or #a ~= #b then error("swap_rows: a and b must be lists of one length", 2) end
      n = #a
      a, b = lib.id_array(a, "swap_rows: a", 2), lib.id_array(b, "swap_rows: b", 2)
    elseif type(n) ~= "number" then
      error("swap_rows: give lists, or int64_t arrays and their length", 2)
    end
    local st = ffi.new("ur_tbe_relayout_stats")
    local ok, err = check(C.ur_tbe_swap_rows(streams.handle(opts.stream, 3), self.h.p, i, a, b, n, st), 2)
    if not ok then return nil, err end
    return { seconds = st.seconds, bytes = tonumber(st.bytes), rows_moved = tonumber(st.rows_moved),
             on_gpu = st.on_gpu ~= 0 }
  end

  -- Lays table `name` out by perm: an i64 [rows] tensor (perm[id] = physical row), "counts"
  -- (hottest first) or nil (the identity).  Rows and optimizer state move together.  Returns
  -- {seconds, bytes, rows_moved, chunks, on_gpu}, or nil, message.
  function methods:relayout(name, perm, opts)
    opts = opts or {}
    local i = index_of(self, name, 2)
    local own
    if perm == "counts" then
      perm = self:perm_from_counts(name)
      own = perm
    elseif perm ~= nil and type(perm) ~= "cdata" and type(perm) ~= "table" then
      error("relayout: perm must be an i64 tensor, \"counts\" or nil", 2)
    end
    local st = ffi.new("ur_tbe_relayout_stats")
    local ok, err = check(C.ur_tbe_relayout(streams.handle(opts.stream, 3), self.h.p, i,
                                            perm and lib.ptr(perm, "perm", 2) or nil, st,
                                            opts.chunk_rows or 0), 2)
    if own then own:free() end
    if not ok then return nil, err end
    return { seconds = st.seconds, bytes = tonumber(st.bytes), rows_moved = tonumber(st.rows_moved),
             chunks = st.chunks, on_gpu = st.on_gpu ~= 0 }
  end
end

return M
