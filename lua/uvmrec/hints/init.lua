-- uvmrec.hints: hint policies for `managed` embedding tables, and the manager that runs them.
--
-- A policy is a small Lua object (one file in this folder, or your own) with one method:
--   policy:plan(stats, allowance) -> actions
-- called by the manager every `every` steps for each managed table, with
--   stats:     {name, rows, row_bytes (weights and optimizer state of a row), total (accesses
--              counted), step, access (a ranked snapshot: topk, coverage, histogram; valid
--              until the manager ranks the table again, into its memory: used after, it raises), perm
--              (the layout, host i64 [rows] or nil), prefix_rows(bytes) (the most leading rows
--              whose pages fit), placed_bytes(k), prefix_accesses(k)}
--   allowance: the bytes of HBM the policy may place for this table (the manager splits the
--              embeddings' allowance over tables by their counts, which costs a ranking of
--              each table's counters; a class that sets P.ignores_allowance = true, as none and
--              host do, is given 0 and its tables are neither ranked nor counted in the split)
-- and returning a list of actions, each on a range of physical rows [first, first + rows),
-- with optionally actions.hot_rows: how many leading rows it now keeps on the GPU (its view):
--   hints.advise(first, rows, advice, location)   -- preferred_location, accessed_by, ...
--   hints.prefetch(first, rows, location)
--   hints.relayout("counts")                       -- hottest rows first
--   hints.relayout{swap = k, band = 0.1}           -- trade only rows that crossed rank k
-- The manager applies them to the table's weights and optimizer state (the engine rounds to
-- pages, checks the HBM budget and logs every hint: ur.hint_log()), and records per interval
-- the policy's view and the time spent; what the CUPTI monitor measured migrating goes in the
-- record at the summaries (or each interval: the manager's `monitor` option).
--
--   local hints = require "uvmrec.hints"
--   local m = hints.manager(ebc, { policy = "hot_prefix", every = 100, allowance = "20%" })
--   ... after each step: m:step(step)
--   print(m:summary())
local ffi = require "ffi"
local ur = require "uvmrec"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local tbe_stats = require "uvmrec.tbe_stats"

local M = {}
local C, must = ur.C, lib.must

M.EVERY = 100 -- steps between a manager's intervals unless told (a config gives embeddings.hints.every)
local int64p = ffi.typeof("int64_t *")

-- ---- actions ----

function M.advise(first, rows, advice, location)
  return { kind = "advise", first = first, rows = rows, advice = advice, location = location }
end

function M.prefetch(first, rows, location)
  return { kind = "prefetch", first = first, rows = rows, location = location }
end

function M.relayout(how) return { kind = "relayout", how = how } end

-- Appends the actions that put rows [0, k) on the GPU and [k, rows) on the host, read in place
-- (the hot range first: the page they share at the boundary ends up on the host side).
function M.split(actions, rows, k)
  actions.hot_rows = k
  if k > 0 then
    actions[#actions + 1] = M.advise(0, k, "preferred_location", "gpu")
    actions[#actions + 1] = M.advise(0, k, "accessed_by", "gpu")
    actions[#actions + 1] = M.prefetch(0, k, "gpu")
  end
  if k < rows then
    actions[#actions + 1] = M.advise(k, rows - k, "preferred_location", "cpu")
    actions[#actions + 1] = M.advise(k, rows - k, "accessed_by", "gpu")
    actions[#actions + 1] = M.prefetch(k, rows - k, "cpu")
  end
  return actions
end

-- ---- policies ----

-- A policy class: P = hints.policy("name", defaults, ranges); P.new(opts) or hints.new("name",
-- opts).  ranges (optional): {option = {lo, hi}}, a number option's values from lo to below hi
-- (adaptive's margin below 0 swapped rows at every interval, the two layouts' gap being >= 0).
function M.policy(name, defaults, ranges)
  local P = { name = name, defaults = defaults or {}, ranges = ranges or {} }
  P.__index = P
  local what, names = ("hints: policy '%s'"):format(name), {}
  for k in pairs(P.defaults) do names[k] = true end
  function P.new(opts)
    opts = opts or {}
    if next(P.defaults) == nil and next(opts) ~= nil then
      error(("%s takes no options; got '%s'"):format(what, tostring(next(opts))), 3)
    end
    lib.known_keys(opts, names, what, 3)
    local o = {}
    for k, v in pairs(P.defaults) do o[k] = v end
    for k, v in pairs(opts) do
      -- of its default's type: a string "0.1" failed at the first interval's comparison
      if type(v) ~= type(P.defaults[k]) then
        error(("%s: %s is %s (a %s); expected a %s like its default, %s"):format(what, tostring(k), tostring(v),
          type(v), type(P.defaults[k]), tostring(P.defaults[k])), 3)
      end
      local r = P.ranges[k]
      if r and not (v >= r[1] and v < r[2]) then
        error(("%s: %s is %s; expected a number in [%s, %s)"):format(what, k, tostring(v), tostring(r[1]),
          tostring(r[2])), 3)
      end
      o[k] = v
    end
    return setmetatable({ opts = o, state = {}, done = {} }, P)
  end
  return P
end

M.BUILTIN = { "none", "host", "hot_prefix", "adaptive" }

-- A policy object: a built-in name, a path to a Lua file returning a policy class, or an
-- object with plan() already.
function M.new(spec, opts)
  if type(spec) == "table" and type(spec.plan) == "function" then
    if spec.new and not spec.opts then return spec.new(opts) end
    if opts ~= nil then
      -- an object made already has its options: these would be dropped
      error(("hints: policy '%s' is an object, made with its options; give options with its class "
             .. "(hints.policy's) or a name, not with an object"):format(tostring(spec.name or "?")), 2)
    end
    return spec
  end
  if type(spec) ~= "string" then
    error("hints: a policy is a name (" .. table.concat(M.BUILTIN, ", ") .. "), a Lua file or an object with plan()", 2)
  end
  local P
  if spec:match("%.lua$") then
    local chunk, err = loadfile(spec)
    if not chunk then error("hints: policy file " .. err, 2) end
    P = chunk()
  else
    local ok, mod = pcall(require, "uvmrec.hints." .. spec)
    if not ok or type(mod) ~= "table" then
      error(("hints: no policy '%s'; built in: %s, or a path to a .lua file"):format(spec,
            table.concat(M.BUILTIN, ", ")), 2)
    end
    P = mod
  end
  if type(P) ~= "table" or type(P.plan) ~= "function" then
    error(("hints: policy '%s' has no plan(stats, allowance) method"):format(spec), 2)
  end
  if not P.new and opts ~= nil and next(opts) ~= nil then
    -- an object, not a class (hints.policy's): nothing would take them
    error(("hints: policy '%s' is an object, which takes no options; got '%s' (make it with hints.policy to "
      .. "give it options)"):format(spec, tostring(next(opts))), 2)
  end
  return P.new and P.new(opts) or P
end

-- ---- the statistics a policy sees ----

local Stats = {}
Stats.__index = function(s, k)
  if k == "access" then -- ranked on first use: it costs a sort of the counters (on the GPU for its tables)
    local t0 = C.ur_clock_seconds()
    -- device counters' counts by id come with the ranking: the prefix's accesses read none again
    local v = s:_counters()
    -- into the table's last ranking's host memory (_into, the manager's): not first touched again
    local a = tbe_stats.snapshot(v, s.name, v:placement() == "device", rawget(s, "_into"))
    rawset(s, "access", a)
    rawset(s, "rank_seconds", C.ur_clock_seconds() - t0)
    return a
  end
  if (k == "perm" or k == "_perm_p") and not rawget(s, "_perm_read") then
    -- read back on first use (8 bytes a row over the host link, not worth an interval that
    -- does not look at the layout) into the manager's copy of the table's (_keep), which is
    -- kept between intervals and read again only when the engine's layout changed since
    rawset(s, "_perm_read", true)
    local keep, gen = rawget(s, "_keep"), s._tbe:permutation_gen(s.name)
    local h = keep and keep.perm
    if not (h and keep.perm_gen == gen) then
      local p = s._tbe:permutation(s.name)
      if not p then return nil end
      if not h then
        h = assert(tensor.tensor({ s.rows }, { dtype = "i64" }))
        if keep then keep.perm = h else rawset(s, "_own_perm", h) end
      end
      local ok, err = lib.check(C.ur_tensor_read(p.p, 0, s.rows, C.ur_tensor_data(h.p)))
      p:free()
      if not ok then error(err, 2) end
      if keep then keep.perm_gen = gen end
    end
    rawset(s, "perm", h)
    rawset(s, "_perm_p", ffi.cast(int64p, C.ur_tensor_data(h.p)))
    return rawget(s, k)
  end
  if k == "total" then return s.access.total end
  return Stats[k]
end

-- Bytes of the pages that rows [0, k) touch, over the table's tensors (weights and state):
-- hints act on whole pages, and the budget counts them.
function Stats:placed_bytes(k)
  if k <= 0 then return 0 end
  local P, b = ur.hint_page_bytes(), 0
  for _, x in ipairs(self.layout) do
    b = b + (math.ceil((x.off + k * x.rb) / P) - math.floor(x.off / P)) * P
  end
  return b
end

-- The most leading rows whose pages fit in `bytes`.
function Stats:prefix_rows(bytes)
  local lo, hi = 0, self.rows
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if self:placed_bytes(mid) <= bytes then lo = mid else hi = mid - 1 end
  end
  return lo
end

-- Accesses counted for the rows that now sit at physical rows [0, k).  The last k asked is
-- remembered, and kept in step by the swaps (_swapped): asked again, it costs no pass.
function Stats:prefix_accesses(k)
  if k <= 0 then return 0 end
  if rawget(self, "_prefix_k") == k then return self._prefix_sum end
  self:_counts()
  local _ = self._perm_p -- the layout, read back on first use
  local sum = ffi.new("int64_t[1]")
  must(C.ur_counts_prefix(rawget(self, "_counts_t").p, rawget(self, "perm") and self.perm.p, k, sum))
  rawset(self, "_prefix_k", k)
  rawset(self, "_prefix_sum", tonumber(sum[0]))
  return self._prefix_sum
end

-- The table's counters, a view where they live (no forward runs while the stats are in use).
function Stats:_counters()
  local v = rawget(self, "_view")
  if not v then
    v = self._tbe:counts(self.name)
    rawset(self, "_view", v)
  end
  return v
end

-- The counters by id, in host memory, read once an interval: where they are for host
-- counters, else the ranking's where the table was ranked, else read back.
function Stats:_counts()
  if not rawget(self, "_c") then
    local v, a = self:_counters(), rawget(self, "access")
    local h = v
    if v:placement() == "device" then
      if a and a.by_id then
        h = a.by_id
      else
        h = assert(v:to("host"))
        rawset(self, "_host_counts", h) -- ours to free
      end
    end
    rawset(self, "_counts_t", h)
    rawset(self, "_c", ffi.cast("int32_t *", C.ur_tensor_data(h.p)))
  end
  return self._c
end

-- Lets go of the layout read back, if any (the manager's copy stays), and of the prefix's
-- accesses remembered.
function Stats:_drop_perm()
  if rawget(self, "_own_perm") then self._own_perm:free() end
  for _, f in ipairs { "perm", "_perm_p", "_perm_read", "_own_perm", "_prefix_k", "_prefix_sum" } do
    rawset(self, f, nil)
  end
end

-- The layout is in doubt (a move failed midway): the next use reads it again, into the
-- manager's memory.
function Stats:_forget_perm()
  self:_drop_perm()
  local keep = rawget(self, "_keep")
  if keep then keep.perm_gen = nil end
end

-- The table was laid out by perm (host i64 [rows], now the manager's or the stats' to free):
-- the layout known without reading it back.
function Stats:_set_perm(perm)
  self:_drop_perm()
  local keep = rawget(self, "_keep")
  if keep then
    if keep.perm then keep.perm:free() end
    keep.perm, keep.perm_gen = perm, self._tbe:permutation_gen(self.name)
  else
    rawset(self, "_own_perm", perm)
  end
  rawset(self, "_perm_read", true)
  rawset(self, "perm", perm)
  rawset(self, "_perm_p", ffi.cast(int64p, C.ur_tensor_data(perm.p)))
end

-- Ids a[i] and b[i] (int64_t arrays, n pairs) traded rows across the prefix [0, k), adding
-- gain to its accesses (ur_counts_swap_pairs'): the layout read back trades their entries as
-- the engine did, and the prefix's accesses remembered for k follow (for another k they are
-- counted again); one not read (or the identity's, none) is read on its next use.
function Stats:_swapped(a, b, n, k, gain)
  local p = rawget(self, "_perm_p")
  if not p then
    self:_forget_perm()
    return
  end
  for i = 0, n - 1 do
    local x, y = a[i], b[i]
    p[x], p[y] = p[y], p[x]
  end
  if rawget(self, "_prefix_k") == k then
    rawset(self, "_prefix_sum", self._prefix_sum + gain)
  else
    rawset(self, "_prefix_k", nil)
  end
  local keep = rawget(self, "_keep")
  if keep then keep.perm_gen = self._tbe:permutation_gen(self.name) end
end

function Stats:free()
  if rawget(self, "access") then self.access:free() end
  if rawget(self, "_into") then self._into:free() end -- spent already where a ranking took it
  if rawget(self, "_host_counts") then self._host_counts:free() end
  if rawget(self, "_view") then self._view:free() end
  self:_drop_perm()
end

-- ---- the manager ----

local Manager = {}
Manager.__index = Manager

-- An allowance in bytes of `total` (the tables' bytes): nil, all of it; a percentage from 0 to
-- 100 ('20%'); a number below 1, a fraction (0.2; "0.2" as a config gives it, once 0 bytes); else a
-- whole number of bytes or a size (lib.bytes: 123, '8GiB').  1 is 1 byte ('100%' is all): the
-- manager refuses an allowance below one row's pages.  Raises naming the value otherwise.
local shown = require("uvmrec.lib").shown

local function parse_allowance(v, total)
  if v == nil then return total end
  local what = shown(v)
  local x = v
  if type(v) == "string" then
    local pct = tonumber(v:match("^%s*([%d%.]+)%s*%%%s*$"))
    if pct and pct <= 100 then return math.floor(pct / 100 * total) end
    if pct then error(("hints: allowance %s; expected a percentage from 0%% to 100%%"):format(what), 3) end
    x = tonumber(v) or v
  end
  if type(x) == "number" and x >= 0 and x < 1 then return math.floor(x * total) end
  local b = lib.bytes(x)
  if not b then
    error(("hints: allowance %s is not bytes (123, '16GiB'), a fraction below 1 (0.2) nor a percentage ('20%%')")
      :format(what), 3)
  end
  return b
end
M.parse_allowance = parse_allowance

-- Refuses an allowance v (`bytes` as read) above 0 that not one row's pages fit in (least
-- bytes, a row of table t's): meant as a fraction (1 for all), it would place nothing.  what
-- names it ("table b: allowance"); shared: the least is over the tables sharing it.
local function refuse_below_row(what, v, bytes, least, t, shared, level)
  if bytes > 0 and bytes < least then
    error(("hints: %s %s is %d byte(s), less than one row%s takes in whole pages (table %s: %d bytes, rows of %d "
      .. "bytes, pages of %d); 0 places none, '100%%' all of it"):format(what, shown(v), bytes,
      shared and " of any table sharing it" or "", t.name, least, t.row_bytes, ur.hint_page_bytes()), level + 1)
  end
end

-- hints.manager(collection, opts): collection is a uvmrec.tbe object, a module holding one
-- (.tbe) or a sharded collection (uvmrec.dist.shard: this rank's managed shards, each counted
-- and placed as a table, "C3/r1" taking table C3's settings; the allowance is this rank's).
-- opts: policy (name, file or object; default "hot_prefix"), options (the policy's),
-- every (steps between intervals, 100), allowance (HBM for the managed tables: '20%', or 0.2 of
-- their bytes (a number below 1), or bytes, 123 or '8GiB' (1 is a byte; one row's pages at the
-- least); default all of it), decay (counts *= decay after each
-- interval, 1: none), tables ({name = {policy =, options =, allowance =}} per table: a table's own
-- allowance, bytes or a fraction of its own bytes, is its share; the others split `allowance`),
-- location ("gpu"),
-- monitor (on a GPU, what the CUPTI monitor measured migrating: "end", the default (true), reads
-- it at each summary, the migration since the last one; "interval" also reads it each interval
-- into the interval's record, a forced flush of CUPTI's buffers that cost 16 ms an interval on
-- the H200; false, "off": never), stream.
-- The uvmrec.tbe collections of a collection: itself, a module's (.tbe), or a sharded
-- collection's shard collections (uvmrec.dist.shard: .collections, this rank's shards).
local function tbes_of(collection)
  if collection.tbe then return { collection.tbe } end
  if collection.prepare_always and collection.collections then return collection.collections end
  return { collection }
end
M.tbes_of = tbes_of

-- The logical table of a shard ("C3/r1", "C3/c0": C3), or the name itself.
local function logical_name(name) return name:match("^(.-)/[rc]%d+$") or name end

local MANAGER_OPTS = { policy = true, options = true, every = true, allowance = true, decay = true, tables = true,
                       location = true, monitor = true, stream = true }

local TABLE_OPTS = { "policy", "options", "allowance" }

function M.manager(collection, opts)
  opts = opts or {}
  lib.known_keys(opts, MANAGER_OPTS, "hints", 2, "manager option")
  if opts.tables ~= nil then
    if type(opts.tables) ~= "table" then
      error(("hints: tables is %s; expected {[name] = {policy =, options =, allowance =}}"):format(
        tostring(opts.tables)), 2)
    end
    for name, per in pairs(opts.tables) do
      if type(per) ~= "table" then
        error(("hints: tables.%s is %s; expected {policy =, options =, allowance =}"):format(tostring(name),
              tostring(per)), 2)
      end
      lib.known_keys(per, TABLE_OPTS, "hints: tables." .. tostring(name), 2)
      -- a table's options go to its own policy: without one the default's would be used, theirs dropped
      if per.options ~= nil and per.policy == nil then
        error(("hints: tables.%s: options without a policy of its own (the default policy takes the "
          .. "manager's options); give tables.%s.policy"):format(tostring(name), tostring(name)), 2)
      end
    end
  end
  local tbes = tbes_of(collection)
  -- tbes: the collections with counted tables; collections: all of them (far rows' copies)
  local self = setmetatable({ tbe = tbes[1], tbes = {}, collections = tbes, every = opts.every or M.EVERY,
                              decay = opts.decay or 1, location = opts.location or "gpu", stream = opts.stream,
                              intervals = {}, tables = {}, policies = {}, hint_seconds = 0,
                              relayout_seconds = 0, relayout_bytes = 0, calls = 0 }, Manager)
  -- inf, 0, 1.5 or -2 passed a check of their own, inf as never (step's `step % inf` is NaN)
  lib.whole(self.every, "hints: every", 2, 1)
  if type(self.decay) ~= "number" or not (self.decay >= 0 and self.decay <= 1) then
    error(("hints: decay is %s; expected a number in [0, 1]"):format(tostring(self.decay)), 2)
  end
  lib.location(self.location, 2) -- a bad one failed at the first interval's advice, inside the manager
  local default = M.new(opts.policy or "hot_prefix", opts.options)
  local total, placed = 0, {}
  for _, tbe in ipairs(tbes) do
    local counting = false
    for _, name in ipairs(tbe.table_names) do
      local w = tbe:table(name)
      placed[name] = w:placement()
      if placed[name] == "managed" then
        counting = true
        local ts, row_bytes = { w }, 0
        for _, k in ipairs(tbe.state_names) do ts[#ts + 1] = tbe:state(name)[k] end
        for _, t in ipairs(ts) do row_bytes = row_bytes + t:nbytes() / tbe.rows[name] end
        -- a shard ("C3/r1", "C3/c0") takes its logical table's settings
        local per = opts.tables and (opts.tables[name] or opts.tables[logical_name(name)])
        local pol = per and per.policy and M.new(per.policy, per.options) or default
        local layout = {}
        for _, t in ipairs(ts) do
          local es = t:nbytes() / t:numel()
          layout[#layout + 1] = { off = tonumber(C.ur_tensor_offset(t.p)) * es, rb = t:nbytes() / tbe.rows[name] }
        end
        local own
        if per and per.allowance ~= nil then
          local ok, a = pcall(parse_allowance, per.allowance, row_bytes * tbe.rows[name])
          if not ok then
            error(("hints: table %s: %s"):format(name, tostring(a):gsub("^[^\n]-:%d+: hints: ", "")), 2)
          end
          own = a
          refuse_below_row("table " .. name .. ": allowance", per.allowance, own,
                           Stats.placed_bytes({ layout = layout }, 1), { name = name, row_bytes = row_bytes }, false, 2)
        end
        self.tables[#self.tables + 1] = { name = name, tensors = ts, rows = tbe.rows[name], layout = layout,
                                          row_bytes = row_bytes, policy = pol, on_gpu = 0, k = 0, allowance = own,
                                          tbe = tbe, gpu = {}, gpu_bytes = 0 }
        if not own then total = total + row_bytes * tbe.rows[name] end
      else
        w:free()
      end
    end
    if counting then self.tbes[#self.tbes + 1] = tbe end
  end
  if #self.tables == 0 and not (collection.plan and collection.plan.tables) then
    local list = {}
    for n, p in pairs(placed) do list[#list + 1] = n .. " " .. tostring(p) end
    table.sort(list)
    error(("hints: the collection has no managed table (%s); hints are for managed tables"):format(
      table.concat(list, ", ")), 2)
  end
  if opts.tables then
    -- the collection's tables: a sharded one's all (this rank may hold none of a table's shards)
    local sharded = collection.plan and collection.plan.tables
    -- the managed tables' names and their logical tables', once (each setting looked through
    -- every table: 1000 tables with settings took 10^6 matches)
    local managed = {}
    for _, t in ipairs(self.tables) do managed[t.name], managed[logical_name(t.name)] = true, true end
    for name in pairs(opts.tables) do
      local found = managed[name] ~= nil
      -- a misspelt or unmanaged table's settings would be dropped, its tables run the default
      if not found and not (sharded or placed)[name] then
        local names = {}
        for n in pairs(sharded or placed) do names[#names + 1] = n end
        table.sort(names)
        error(("hints: tables.%s: no table of that name (the collection's: %s)"):format(tostring(name),
          table.concat(names, ", ")), 2)
      end
      -- a sharded collection's rank may hold no managed shard of a table: its settings are other ranks'
      if not found and not sharded then
        error(("hints: tables.%s: table %s is placed %s; hints are for managed tables"):format(name, name,
          tostring(placed[name])), 2)
      end
    end
  end
  self.total_bytes = total
  self.allowance = parse_allowance(opts.allowance, total)
  -- bytes that no table's first row fits in place nothing: a byte count meant as a fraction (1)
  local least, by
  for _, t in ipairs(self.tables) do
    local b = not t.allowance and Stats.placed_bytes(t, 1)
    if b and (not least or b < least) then least, by = b, t end
  end
  if least then refuse_below_row("allowance", opts.allowance, self.allowance, least, by, true, 2) end
  -- every option is checked before a policy object is claimed below (a claim left by a refused
  -- manager could not be freed)
  local mon = opts.monitor
  if mon == nil or mon == true then mon = "end" elseif mon == false then mon = "off" end
  if mon ~= "end" and mon ~= "interval" and mon ~= "off" then
    error(("hints: monitor '%s'; expected \"end\", \"interval\" or \"off\" (or true, false)"):format(
      tostring(opts.monitor)), 2)
  end
  -- a policy object keeps its state by table name: one another manager plans with would take
  -- this one's tables for the ones it placed (a second manager's table 'a' was never laid out)
  for _, t in ipairs(self.tables) do
    local owner = rawget(t.policy, "_manager")
    if owner and owner ~= self and owner.tables[1] then
      error(("hints: policy '%s' (an object) plans for another manager already, keeping its state by table "
        .. "name; free that manager first, or give a name or a class (each manager makes its own)"):format(
        tostring(t.policy.name or "?")), 2)
    end
  end
  for _, tbe in ipairs(self.tbes) do assert(tbe:set_counting(true)) end
  for _, t in ipairs(self.tables) do rawset(t.policy, "_manager", self) end
  for _, t in ipairs(self.tables) do self.rerank = self.rerank or t.policy.rerank end
  if mon ~= "off" and ur.gpu() and ur.monitor.read(true) ~= nil then self.monitor = mon end
  return self
end

-- Each table's share of the allowance: the hottest rows over all tables (by count, per byte)
-- until the allowance is spent; by bytes while nothing is counted.
function Manager:_split(all)
  -- tables with an allowance of their own take it (whole pages of it); the others split the rest
  local stats, idx, shares_all = {}, {}, {}
  for i, s in ipairs(all) do
    local own, pol = self.tables[i].allowance, self.tables[i].policy
    if pol.ignores_allowance then
      shares_all[i] = 0 -- nothing to split for it: its counters are not ranked (none's and host's)
    elseif own then
      shares_all[i] = math.min(own, s:placed_bytes(s.rows))
    else
      stats[#stats + 1], idx[#stats + 1] = s, i
    end
  end
  local sh = self:_split_shared(stats)
  for j, i in ipairs(idx) do shares_all[i] = sh[j] end
  return shares_all
end

function Manager:_split_shared(stats)
  local A, shares = self.allowance, {}
  local counted, total = 0, 0 -- total: their bytes (the tables of policies that ignore it left out)
  for i, s in ipairs(stats) do
    shares[i] = 0
    counted = counted + s.total
    total = total + s.rows * s.row_bytes
  end
  if counted == 0 then
    for i, s in ipairs(stats) do shares[i] = math.floor(A * s.rows * s.row_bytes / total) end
    return shares
  end
  self.counted = true
  -- pages count: a table's rows of count >= v cost the pages they touch
  local function bytes_at(v)
    local b = 0
    for _, s in ipairs(stats) do b = b + s:placed_bytes(s.access:rows_at_least(v)) end
    return b
  end
  local hi = 1
  for _, s in ipairs(stats) do hi = math.max(hi, s.access:count_at(0) + 1) end
  local lo = 1 -- the least v >= 1 with bytes_at(v) <= A
  if bytes_at(lo) > A then
    while hi - lo > 1 do
      local mid = math.floor((lo + hi) / 2)
      if bytes_at(mid) <= A then hi = mid else lo = mid end
    end
    lo = hi
  end
  local left = A - bytes_at(lo)
  for i, s in ipairs(stats) do
    local n = s.access:rows_at_least(lo)
    local base = s:placed_bytes(n)
    -- rows of the next count down take what is left, table by table, as many as their pages fit
    local e = 0
    if lo > 1 then
      local elo, ehi = 0, s.access:rows_at_least(lo - 1) - n
      while elo < ehi do
        local mid = math.floor((elo + ehi + 1) / 2)
        if s:placed_bytes(n + mid) - base <= left then elo = mid else ehi = mid - 1 end
      end
      e = elo
    end
    local b = s:placed_bytes(n + e)
    left = left - (b - base)
    shares[i] = b
  end
  -- what nobody counted claims is shared by bytes (never-read rows of a table come last)
  if left > 0 then
    for i, s in ipairs(stats) do
      local room = s:placed_bytes(s.rows) - shares[i]
      local give = math.max(0, math.min(room, math.floor(left * s.rows * s.row_bytes / total)))
      shares[i] = shares[i] + give
    end
  end
  return shares
end

local function time_call(self, f, ...)
  local t0 = C.ur_clock_seconds()
  local a, b = f(...)
  self.hint_seconds = self.hint_seconds + (C.ur_clock_seconds() - t0)
  return a, b
end

local function record_move(self, rec, r)
  rec.relayout_seconds = rec.relayout_seconds + r.seconds
  rec.relayout_bytes = rec.relayout_bytes + r.bytes
  rec.rows_moved = rec.rows_moved + r.rows_moved
  self.relayout_seconds = self.relayout_seconds + r.seconds
  self.relayout_bytes = self.relayout_bytes + r.bytes
end

local KINDS = { advise = true, prefetch = true, relayout = true }

-- What a policy's plan returned, checked before anything is applied: nil, or a message naming
-- the policy, the table and the value.
local function check_actions(t, actions)
  local function bad(msg, ...)
    return ("hints: policy %s, table '%s': " .. msg):format(t.policy.name or "?", t.name, ...)
  end
  if type(actions) ~= "table" then
    return bad("plan returned %s; expected a list of actions", tostring(actions))
  end
  for i, a in ipairs(actions) do
    if type(a) ~= "table" then
      return bad("action %d is %s; expected a table from hints.advise, hints.prefetch or hints.relayout", i,
                 tostring(a))
    end
    if not KINDS[a.kind] then
      return bad("action %d has kind '%s'; expected advise, prefetch or relayout", i, tostring(a.kind))
    end
    if a.kind ~= "relayout" then
      for _, k in ipairs { "first", "rows" } do
        if not lib.whole_in(a[k], -2 ^ 63, 2 ^ 63) then
          return bad("action %d %s is %s; expected a whole number", i, k, tostring(a[k]))
        end
      end
      if a.first < 0 or a.rows < 0 or a.first + a.rows > t.rows then
        return bad("action %d rows [%d, %d) are outside 0..%d", i, a.first, a.first + a.rows, t.rows)
      end
    elseif type(a.how) == "table" and a.how.swap ~= nil then
      local k, band = a.how.swap, a.how.band
      if not lib.whole_in(k, 0, t.rows + 1) then
        return bad("action %d relayout swap is %s; expected a whole number from 0 to %d", i, tostring(k), t.rows)
      end
      if band ~= nil and not (type(band) == "number" and band >= 0 and band < math.huge) then
        return bad("action %d relayout band is %s; expected a number >= 0", i, tostring(band))
      end
    elseif a.how ~= "counts" then
      return bad("action %d relayout %s is not \"counts\" nor {swap = k}", i, tostring(a.how))
    end
  end
  local k = actions.hot_rows
  if k ~= nil and not lib.whole_in(k, 0, t.rows + 1) then
    return bad("hot_rows is %s; expected a whole number from 0 to %d", tostring(k), t.rows)
  end
  return nil
end

-- The rows a plan leaves on the GPU (t.gpu, sorted disjoint ranges {first, end}, after the
-- plans applied so far; preferred there or prefetched there), and the bytes of the pages they
-- touch over the table's tensors, each page once: what the table's allowance is checked against.
local function place_range(ranges, a, b, gpu)
  local out = {}
  for _, r in ipairs(ranges) do
    if r[2] < a or r[1] > b then -- apart (ranges that touch are joined)
      out[#out + 1] = r
    elseif gpu then
      a, b = math.min(a, r[1]), math.max(b, r[2])
    else
      if r[1] < a then out[#out + 1] = { r[1], a } end
      if r[2] > b then out[#out + 1] = { b, r[2] } end
    end
  end
  if gpu then out[#out + 1] = { a, b } end
  table.sort(out, function(x, y) return x[1] < y[1] end)
  return out
end

local function gpu_after(t, actions)
  local ranges = t.gpu
  for _, a in ipairs(actions) do
    if a.kind ~= "relayout" and a.rows > 0 and (a.kind == "prefetch" or a.advice == "preferred_location") then
      ranges = place_range(ranges, a.first, a.first + a.rows, a.location ~= "cpu")
    end
  end
  local P, bytes = ur.hint_page_bytes(), 0
  for _, x in ipairs(t.layout) do
    local seen = -1 -- pages before it are counted
    for _, r in ipairs(ranges) do
      local p0, p1 = math.floor((x.off + r[1] * x.rb) / P), math.ceil((x.off + r[2] * x.rb) / P)
      p0 = math.max(p0, seen)
      if p1 > p0 then bytes = bytes + (p1 - p0) * P end
      seen = math.max(seen, p1)
    end
  end
  return ranges, bytes
end

-- Applies one table's actions within its allowance; returns nil, message on the first failure.
function Manager:_apply(t, s, actions, rec, allowance)
  local bad = check_actions(t, actions)
  if bad then return nil, bad end
  -- a plan may not place more than its allowance in HBM (one that adds nothing there, while
  -- the split moved the allowance below what is placed, may stand: it is the policy's next move)
  local ranges, bytes = gpu_after(t, actions)
  if bytes > allowance and bytes > t.gpu_bytes then
    return nil, ("hints: policy %s, table '%s': plan places %d bytes in HBM (the pages of rows it keeps on the "
      .. "GPU, %d ranges); its allowance is %d bytes"):format(t.policy.name or "?", t.name, bytes, #ranges,
      allowance)
  end
  for _, a in ipairs(actions) do
    if a.kind == "relayout" then
      local r, err
      if a.how == "counts" then
        -- hottest first by the interval's ranking (relayout's "counts" would rank them again),
        -- and the layout kept: nothing reads it back
        local perm = assert(tensor.tensor({ t.rows }, { dtype = "i64" }))
        must(C.ur_perm_from_order(s.access.order.p, perm.p))
        r, err = t.tbe:relayout(t.name, perm, { stream = self.stream })
        if r then s:_set_perm(perm) else perm:free() end
      else -- {swap = k}: check_actions let nothing else through
        -- rows that crossed trade places where they are, on the stream (a kernel on a GPU)
        local A, B, n, gain = self:_swap_pairs(t, s, a.how.swap, a.how.band or 0)
        if n > 0 then
          local ids_a, ids_b = ffi.cast(int64p, C.ur_tensor_data(A.p)), ffi.cast(int64p, C.ur_tensor_data(B.p))
          r, err = t.tbe:swap_rows(t.name, ids_a, ids_b, n, { stream = self.stream })
          if r then s:_swapped(ids_a, ids_b, n, a.how.swap, gain) end
        end
        if A then A:free() B:free() end
      end
      -- a failed one may have moved rows or the map: read the layout again
      if err then s:_forget_perm() return nil, err end
      if r then record_move(self, rec, r) end
    elseif a.rows > 0 then
      local loc = a.location == "gpu" and self.location or a.location
      for _, x in ipairs(t.tensors) do
        local per = x:numel() / t.rows
        local r, err
        if a.kind == "prefetch" then
          r, err = time_call(self, x.prefetch, x, a.first * per, a.rows * per, loc, self.stream)
        else
          r, err = time_call(self, x.advise, x, a.first * per, a.rows * per, a.advice, loc)
        end
        if not r then return nil, err end
        rec.hints = rec.hints + 1
      end
      if a.kind == "prefetch" and a.location == "gpu" then rec.prefetched_rows = rec.prefetched_rows + a.rows end
    end
  end
  t.gpu, t.gpu_bytes = ranges, bytes
  return true
end

-- The pairs of ids that trade rows across the prefix [0, k): the hottest ids outside it with
-- the coldest inside it, pair by pair, while the one coming in was read more than (1 + band)
-- times as often as the one going out (hysteresis: near-ties stay).  Rows that stay on their
-- side keep their place (ur_counts_swap_pairs).  Returns i64 tensors a, b (the caller frees them),
-- how many pairs they hold (0: nothing crosses; nil tensors when k leaves no side) and what their
-- trades add to the prefix's accesses.
function Manager._swap_pairs(_, t, s, k, band)
  local rows, acc = t.rows, s.access
  if k <= 0 or k >= rows then return nil, nil, 0, 0 end
  local _ = s._perm_p -- the layout the counts were ranked under, read back on first use
  local room = math.min(k, rows - k)
  local A = assert(tensor.tensor({ room }, { dtype = "i64" }))
  local B = assert(tensor.tensor({ room }, { dtype = "i64" }))
  local n, gain = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  must(C.ur_counts_swap_pairs(acc.order.p, acc.cumsum.p, rawget(s, "perm") and s.perm.p, k, band, A.p, B.p, n,
                              gain))
  return A, B, tonumber(n[0]), tonumber(gain[0])
end

-- One interval: statistics, the split of the allowance, each policy's plan, applied; decay
-- (unless keep_counts).  Returns the interval's record, or nil, message.
function Manager:interval(step, keep_counts)
  local t0 = C.ur_clock_seconds()
  self.hint_seconds = 0
  local rec = { step = step, hints = 0, relayout_seconds = 0, relayout_bytes = 0, rows_moved = 0,
                prefetched_rows = 0, tables = {} }
  local stats = {}
  for i, t in ipairs(self.tables) do
    stats[i] = setmetatable({ name = t.name, rows = t.rows, row_bytes = t.row_bytes, step = step,
                              tensors = #t.tensors, layout = t.layout, _tbe = t.tbe, _into = t.ranked,
                              _keep = t }, Stats)
    t.ranked = nil
  end
  -- The split ranks every table's counters: it is redone only while counts are young (until
  -- the first interval after step 1 that saw counts) or when a policy re-ranks anyway.
  local shares = self.shares
  if not shares or self.rerank then
    shares = self:_split(stats)
    if step > 1 and self.counted then self.shares = shares end
  end
  local ok, err = true, nil
  for i, t in ipairs(self.tables) do
    local s = stats[i]
    local pok, actions = pcall(t.policy.plan, t.policy, s, shares[i])
    if pok then
      ok, err = self:_apply(t, s, actions, rec, shares[i])
    else
      ok, err = false, ("hints: policy %s, table '%s': plan raised: %s"):format(t.policy.name or "?", t.name,
                                                                              tostring(actions))
    end
    if not ok then break end
    t.k = actions.hot_rows or t.k -- the policy's view: the leading rows it keeps on the GPU
    local view = { rows = t.rows, share = shares[i], hot_rows = t.k,
                   hot_fraction = t.k / t.rows }
    -- coverage under the layout as it is now: _apply kept the one read back in step with its moves
    if rawget(s, "access") and s.total > 0 then
      t.covered, t.total = s:prefix_accesses(t.k), s.total
      view.best_coverage = s.access:accesses(t.k) / s.total
    end
    -- as last measured (policies that do not re-rank measure once)
    view.coverage = t.total and t.total > 0 and t.covered / t.total or nil
    rec.tables[t.name] = view
  end
  rec.rank_seconds = 0
  for i, s in ipairs(stats) do
    rec.rank_seconds = rec.rank_seconds + (rawget(s, "rank_seconds") or 0)
    -- where the counters were ranked: "device" or "host" (a GPU's fell back to the CPU where the
    -- HBM budget had no room for the sort), "mixed" when tables differ; nil, none ranked
    local a, view = rawget(s, "access"), rec.tables[self.tables[i].name]
    if a then
      if view then view.rank_on = a.rank_on end
      rec.rank_on = (rec.rank_on == nil or rec.rank_on == a.rank_on) and a.rank_on or "mixed"
      -- kept for the next interval's ranking of the table, which takes its memory (and spends it:
      -- a policy that kept stats.access gets an error naming it, not the new counts); a table
      -- not ranked in an interval lets its last ranking go (s:free() below)
      self.tables[i].ranked = a
      rawset(s, "access", nil)
    end
    s:free()
  end
  if not ok then return nil, err end
  if self.decay < 1 and not keep_counts then
    for _, tbe in ipairs(self.tbes) do assert(tbe:decay_counts(self.decay, nil, self.stream)) end
  end
  -- rows moved between GPU and host: the forwards copy the far ones from where they now begin
  for _, tbe in ipairs(self.collections) do
    if tbe:far_rows() > 0 then
      local fok, ferr = tbe:far_refresh()
      if not fok then return nil, ferr end
    end
  end
  local mem = ur.memory()
  rec.bytes_on_gpu = mem.managed_on_gpu
  rec.hbm_used, rec.hbm_budget = mem.hbm_used, mem.hbm_budget
  local covered, total = 0, 0
  for _, t in ipairs(self.tables) do
    covered, total = covered + (t.covered or 0), total + (t.total or 0)
  end
  rec.coverage = total > 0 and covered / total or nil
  local hot, rows = 0, 0
  for _, t in ipairs(self.tables) do
    hot, rows = hot + t.k, rows + t.rows
  end
  rec.hot_fraction = rows > 0 and hot / rows or 0
  if self.monitor == "interval" then
    local m = ur.monitor.read(true)
    if m then rec.migration = m end
  end
  rec.hint_seconds = self.hint_seconds
  rec.seconds = C.ur_clock_seconds() - t0
  self.intervals[#self.intervals + 1] = rec
  self.last = rec
  self.calls = self.calls + 1
  return rec
end

-- The share of the accesses counted so far that went to rows now in the GPU prefixes (all
-- managed tables), measured now from the counters; and per table.
function Manager:measure()
  local covered, total, per = 0, 0, {}
  for _, t in ipairs(self.tables) do
    -- the layout as the manager keeps it (read back only where another changed it)
    local s = setmetatable({ name = t.name, rows = t.rows, _tbe = t.tbe, _keep = t }, Stats)
    -- every row is in the prefix of all of them: the total, as the prefix counts it, in C
    local c, n = s:prefix_accesses(t.k), s:prefix_accesses(t.rows)
    per[t.name] = n > 0 and c / n or nil
    covered, total = covered + c, total + n
    s:free()
  end
  return total > 0 and covered / total or nil, per
end

-- Before training (step 0): the policies place the tables before anything is counted (by
-- their bytes), so no step runs on the driver's defaults unless the policy is `none`.  A
-- resumed run starts at its checkpoint's step with the counts saved there, which this
-- placement leaves undecayed: the intervals after decay them as the uninterrupted run's did.
function Manager:start(step)
  local rec, err = self:interval(step or 0, true)
  if not rec then error(err, 0) end -- the message names policy and table; no place of ours
  return rec
end

-- After each training step: an interval every `every` steps.
function Manager:step(step)
  if step % self.every ~= 0 then return nil end
  local rec, err = self:interval(step)
  if not rec then error(err, 0) end
  return rec
end

local function gb(b)
  if not b then return "-" end
  if b >= 1e9 then return ("%.2f GB"):format(b / 1e9) end
  if b >= 1e6 then return ("%.1f MB"):format(b / 1e6) end
  return ("%.1f kB"):format(b / 1e3)
end

-- With monitor "end" (on a GPU): what the CUPTI monitor measured migrating since its last read,
-- put in the last interval's record (where the run's log and result take it from); nil else.
function Manager:read_monitor()
  if self.monitor ~= "end" or not self.last then return nil end
  local m = ur.monitor.read(true)
  if m then self.last.migration = m end
  return m
end

-- One line: the last interval's view and the totals, with the migration in its record.
function Manager:summary()
  local r = self.last
  if not r then return "hints: no interval yet" end
  local names = {}
  for _, t in ipairs(self.tables) do names[t.policy.name or "custom"] = true end
  local pol = {}
  for n in pairs(names) do pol[#pol + 1] = n end
  table.sort(pol)
  local m = r.migration
  local allowed = self.allowance
  for _, t in ipairs(self.tables) do allowed = allowed + (t.allowance or 0) end
  return ("hints %s: %d tables, hot %.1f%% of rows, coverage %s, on GPU %s of %s allowed; "
    .. "migrated %s in / %s out, %s faults; hint calls %.3f s, relayout %.2f s (%s)"):format(
    table.concat(pol, "+"), #self.tables, 100 * r.hot_fraction,
    r.coverage and ("%.1f%%"):format(100 * r.coverage) or "-", gb(r.bytes_on_gpu), gb(allowed),
    m and gb(m.bytes_htod) or "-", m and gb(m.bytes_dtoh) or "-", m and tostring(m.gpu_page_faults) or "-",
    r.hint_seconds, self.relayout_seconds, gb(self.relayout_bytes))
end

function Manager:free()
  for _, t in ipairs(self.tables) do
    for _, x in ipairs(t.tensors) do x:free() end
    if t.ranked then t.ranked:free() end
    if t.perm then t.perm:free() end
    t.perm, t.perm_gen = nil, nil
    if rawget(t.policy, "_manager") == self then
      -- its state was this manager's tables': the next manager starts it afresh
      rawset(t.policy, "_manager", nil)
      t.policy.state, t.policy.done = {}, {}
    end
  end
  self.tables = {}
end

-- ---- checkpoints ----

-- Installs `counts` (i32 [rows], any placement) as table `name`'s access counters in tbe (a
-- uvmrec.tbe collection), making them if it never counted: checkpoints restore counters
-- through it (the layout component below, uvmrec.dist.checkpoint); a cached table's are left
-- out.  Counting stays on where it was on (a manager already counts); elsewhere it ends as
-- `counting` (the saved state).
-- Returns true, or nil, message (a shape or dtype that does not fit).
function M.set_counts(tbe, name, counts, counting)
  -- a cached table takes no counters: counts saved for one (its slots', before it was refused)
  -- are no row's
  if tbe.cached and tbe.cached[name] then return true end
  local was = tbe:counting(name)
  assert(tbe:set_counting(true, name))
  local mine = tbe:counts(name)
  local ok, err = mine:copy(counts)
  mine:free()
  if not was and not counting then assert(tbe:set_counting(false, name)) end
  if not ok then return nil, ("counts of table '%s': %s"):format(name, tostring(err)) end
  return true
end

-- Registers the collection's row layout and access counters in a checkpoint registry, as
-- component `layout` (optional: checkpoints without it still load).  Tensors are
-- <table>.perm (i64 [rows], tables laid out by a permutation) and <table>.counts (i32 [rows],
-- tables that count); the rows themselves are the embeddings component's, saved as laid out,
-- so loading installs the permutation without moving them.
function M.register(registry, collection, name)
  local tbe = collection.tbe or collection
  return registry:register { name = name or "layout", optional = true, views = true,
    state = function()
      local ts, counting = {}, {}
      for _, t in ipairs(tbe.table_names) do
        local p = tbe:permutation(t)
        if p then ts[t .. ".perm"] = p end
        local ok, c = pcall(tbe.counts, tbe, t)
        if ok then
          ts[t .. ".counts"] = c
          counting[t] = tbe:counting(t)
        end
      end
      return { tensors = ts, meta = { counting = counting } }
    end,
    -- before anything is loaded: each table takes what the file holds for it.  The rows are
    -- saved laid out by the permutation, so a table that cannot be laid out (cached: its
    -- kernels read the cache's slots) cannot take them as saved.
    check = function(tensors)
      for _, t in ipairs(tbe.table_names) do
        local rows = tbe.rows[t]
        for _, k in ipairs { { "perm", "i64" }, { "counts", "i32" } } do
          local v = tensors[t .. "." .. k[1]]
          if v and (v:dtype() ~= k[2] or v:numel() ~= rows) then
            return ("tensor %s.%s is %s [%d]; table %s has %d rows (%s [%d] expected)"):format(t, k[1], v:dtype(),
              v:numel(), t, rows, k[2], rows)
          end
        end
        if tensors[t .. ".perm"] and tbe.cached and tbe.cached[t] then
          return ("table %s was saved laid out by its hints' permutation, which a cached table cannot take "
            .. "(its kernels read the cache's slots); resume it with the table managed, on the device or in "
            .. "host memory (embeddings.placement)"):format(t)
        end
      end
    end,
    load = function(tensors, meta)
      for _, t in ipairs(tbe.table_names) do
        local ok, err = tbe:set_permutation(t, tensors[t .. ".perm"])
        if not ok then error("checkpoint: layout: " .. err, 0) end
        local c = tensors[t .. ".counts"]
        if c then
          local cok, cerr = M.set_counts(tbe, t, c, meta.counting and meta.counting[t])
          if not cok then error("checkpoint: layout: " .. cerr, 0) end
        end
      end
    end }
end

return M
