-- uvmrec.nn.ManagedCollisionCollection: raw ids to rows, in front of an embedding collection.
-- The ids that rank best by each table's policy hold rows of their own; every other id reads
-- one of the table's last fallback_rows rows (uvmrec.mc; docs/collisions.md).  After a round,
-- the rows given to other ids are drawn again in the collection (weights as the collection
-- first drew them, optimizer state and access counters zeroed), so a new id never inherits
-- another's embedding.
--
--   local ebc = ur.nn.EmbeddingBagCollection{ tables = { { name = "t", rows = 1000, dim = 16 } } }
--   local mcc = ur.nn.ManagedCollisionCollection{ collection = ebc, policy = "lfu", evict_every = 100 }
--   local rows = mcc:forward(kjt)      -- a KJT of rows; training mode counts, evaluate() only looks up
--   ebc:backward(rows, ebc:forward(rows))
--
-- Options: collection (an EmbeddingBagCollection, EmbeddingCollection or uvmrec.tbe: the
-- features, the rows and the device come from it), tables (a map from table name to its own
-- settings; default: every table), and the settings as defaults for every table: policy,
-- evict_every, fallback_rows, max_candidates, decay, distance_power, fill (uvmrec.mc.settings),
-- seed.  Without a collection: tables is uvmrec.mc.new's list, and nothing is reset.
local ffi = require "ffi"
local Module = require "uvmrec.nn.Module"
local mc = require "uvmrec.mc"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local kjt = require "uvmrec.kjt"
local C = lib.C

local MCC = Module:extend("ManagedCollisionCollection")

local settings = {}
for _, k in ipairs(mc.TABLE_SETTINGS) do settings[k] = true end

function MCC:__init(opts)
  Module.__init(self)
  if type(opts) ~= "table" then error("ManagedCollisionCollection: expected a table of options", 3) end
  local o = {}
  for k, v in pairs(opts) do
    if k ~= "collection" then o[k] = v end
  end
  local coll = opts.collection
  if coll ~= nil then
    local tbe = type(coll) == "table" and (coll.tbe or (coll.table_names and coll)) or nil
    if not tbe then
      error("ManagedCollisionCollection: collection must be an embedding collection (EmbeddingBagCollection, "
            .. "EmbeddingCollection or uvmrec.tbe)", 3)
    end
    local per = opts.tables
    if per ~= nil and type(per) ~= "table" then
      error("ManagedCollisionCollection: tables must map table names to their settings", 3)
    end
    for name in pairs(per or {}) do
      if not tbe.table_index[name] then
        error(("ManagedCollisionCollection: no table named '%s' in the collection (tables: %s)")
              :format(tostring(name), table.concat(tbe.table_names, ", ")), 3)
      end
    end
    local h = lib.ptr(tbe.h, "embedding collection", 3)
    local feats = {}
    for i = 1, #tbe.features do
      local tname = ffi.string(C.ur_tbe_table_name(h, C.ur_tbe_feature_table(h, i - 1)))
      feats[tname] = feats[tname] or {}
      feats[tname][#feats[tname] + 1] = tbe.features[i]
    end
    local list = {}
    for _, name in ipairs(tbe.table_names) do
      local own = per == nil and {} or per[name]
      if own then
        if type(own) ~= "table" then
          error(("ManagedCollisionCollection: tables.%s must be a table of settings"):format(name), 3)
        end
        local t = { name = name, rows = tbe.rows[name], features = feats[name] or {} }
        for k, v in pairs(own) do
          -- the collection's name, rows and features stand (rows = 500 over a table of 100 sent
          -- ids to rows the collection does not have)
          if not settings[k] then
            error(("ManagedCollisionCollection: tables.%s.%s: a table's settings are %s (the collection gives "
                   .. "its name, rows and features)"):format(name, tostring(k), table.concat(mc.TABLE_SETTINGS, ", ")),
                  3)
          end
          t[k] = v
        end
        list[#list + 1] = t
      end
    end
    o.tables, o.features = list, { unpack(tbe.features) }
    o.device = tbe.device >= 0 and tbe.device or "cpu"
    self.tbe = tbe
  end
  self.map = assert(mc.new(o, 3))
  self.device = self.map.device
  self.placement = self.map:placement()
  self.table_names = self.map.table_names
end

-- map:remap into out, a view of the module's buffer (or the buffer itself: view nil), the view
-- freed whether the remap took the input or refused it.
local function remap_into(map, input, opts, stream, view)
  local ok, rows, err = pcall(map.remap, map, input, opts, stream)
  if view then view:free() end
  if not ok then error(rows, 0) end
  return rows, err
end

-- The rows the last round gave to other ids and not reset yet, in the collection: self._resets,
-- a list of {name, ids, n} (copies: the map lends its lists only until its next remap), the
-- first removed once reset.  One that fails raises as op does, at `level` (from this
-- function's caller) and stays with those after it, for the next forward (before it maps its
-- batch) or checkpoint save to reset.
local function run_resets(self, level)
  local lists = self._resets
  while lists and lists[1] do
    local r = lists[1]
    self:op(level + 1, self.tbe.reset_rows, self.tbe, r.name, r.ids, r.n, self.stream)
    table.remove(lists, 1)
  end
end

-- The map's reassigned rows of every table, copied into self._resets.
local function take_resets(self)
  local lists = {}
  for _, name in ipairs(self.table_names) do
    local p, k = self.map:reassigned_ptr(name)
    if k > 0 then
      local ids = ffi.new("int64_t[?]", k)
      ffi.copy(ids, p, 8 * k)
      lists[#lists + 1] = { name = name, ids = ids, n = k }
    end
  end
  self._resets = lists
end

-- A KJT of rows for a KJT of raw ids (a batch's sparse part), valid until the next forward (its
-- values are the module's buffer; the next forward frees it).  In training mode the rounds due
-- run first and the batch is counted, and the rows a round gave to other ids are reset in the
-- collection.  A forward that fails (an input the map refuses, no memory for the rows) raises
-- naming the module, at the caller's line, and leaves no output and no handle behind: the
-- module works on as before.  One whose resets fail (the batch was counted) keeps the rows left
-- to reset, and the next forward resets them before it maps its batch.
function MCC:updateOutput(input)
  if not kjt.is(input) then
    error("ManagedCollisionCollection: forward takes a KJT (ur.KJT, a batch's sparse part), not a "
          .. type(input), 2)
  end
  if self.output then self.output:free() end
  self.output = nil
  run_resets(self, 2)
  local update = self.train ~= false
  local values = input:values()
  local n, vplace = values:numel(), values:placement()
  values:free()
  -- rows where the ids are (a KJT keeps one placement): device memory for a map on a GPU, the
  -- ids' own host, pinned or managed memory for one on the CPU
  local place = self.device >= 0 and "device" or vplace
  if not self._out or self._out:numel() < n or self._out:placement() ~= place then
    if self._out then self._out:free() end
    self._out = nil
    local o = { dtype = "i64", placement = place }
    if self.device >= 0 then o.device = self.device end
    self._out = self:op(2, tensor.tensor, { math.max(n, 1) }, o)
  end
  local view = n ~= self._out:numel() and self._out:view(0, n) or nil
  local map = self.map
  local rows = self:op(2, remap_into, map, input, { update = update, out = view or self._out }, self.stream, view)
  -- held before the resets, so that one failing leaves it to the next forward to free
  self.output = rows
  if update and self.tbe then
    take_resets(self)
    run_resets(self, 2)
  end
  return rows
end

-- Ids have no gradient, and the map has no parameters.
MCC.updateGradInput = Module.no_grad_input

-- The map lives where the collection runs: to() moves nothing.
function MCC:to() return self end

function MCC:stats() return self.map:stats() end
function MCC:reset_stats() self.map:reset_stats() return self end

-- One line for people: occupancy, where lookups landed, rounds.
function MCC:summary()
  local s = assert(self.map:stats())
  return ("collisions: %s, %d of %d rows held by ids (%.1f%%); of %d lookups %.1f%% on resident ids, "
          .. "%.1f%% on fallback rows; %d rounds (%d fills), %d admissions, %d evictions")
         :format(lib.things(#self.table_names, "table"), s.resident, s.capacity, 100 * s.occupancy, s.lookups,
                 100 * s.resident_share, 100 * s.fallback_share, s.rounds, s.fills, s.admissions, s.evictions)
end

-- A checkpoint registry component (uvmrec.checkpoint) holding every table's map and counts:
-- tensors "<table>.<ids|counts|window|last|cand_ids|cand_counts|cand_last>", meta {step, seed,
-- counts = {table = {lookups, ...}}, settings = {table = {policy, ...}}}.  Its tensors' sizes
-- vary with the candidates, so the registry hands load() views of the file's; a load into
-- tables with other settings (or other tables), a map of another hash seed (its ids would read
-- other fallback rows), or of a map the engine would not restore (a corrupted file), is refused
-- naming the first difference, before any component is loaded.
function MCC:checkpoint_component(name)
  local map = self.map
  -- table t's state from a checkpoint's tensors and meta, or nil, what is missing
  local function saved_state(t, tensors, meta)
    local st = {}
    for _, k in ipairs(mc.STATE_TENSORS) do
      st[k] = tensors[t .. "." .. k]
      if not st[k] then return nil, ("the checkpoint has no tensor %s.%s"):format(t, k) end
    end
    for k, v in pairs((meta.counts or {})[t] or {}) do st[k] = v end
    return st
  end
  return {
    name = name or "collisions", views = true, whole = { "step" },
    state = function()
      -- the maps saved name rows that must hold their new ids' weights: a reset that fails again
      -- refuses the save (nil, why), the rows kept for the next forward or save
      local rok, rerr = pcall(run_resets, self, 1)
      if not rok then return nil, (tostring(rerr):gsub("^[^\n]-:%d+: ", "")) end
      local ts, counts = {}, {}
      for _, t in ipairs(map.table_names) do
        local st = assert(map:state(t))
        counts[t] = {}
        for _, k in ipairs(mc.STATE_TENSORS) do ts[t .. "." .. k] = st[k] end
        for _, k in ipairs(mc.STATE_COUNTS) do counts[t][k] = st[k] end
      end
      -- owned: host copies of the maps, freed by the registry once written
      return { tensors = ts, owned = true,
               meta = { step = map:step(), seed = map.seed, counts = counts, settings = map.settings } }
    end,
    -- before anything is loaded: the settings, and each map as the engine would restore it
    check = function(tensors, meta)
      -- a non-resident id's fallback row is a hash of the id and the seed (a checkpoint written
      -- before the seed was saved is taken as it is: the trainer's config comparison covers it)
      if meta.seed ~= nil and meta.seed ~= map.seed then
        return ("the map's hash seed differs from the checkpoint's (the checkpoint has %s, this run has %s)")
               :format(tostring(meta.seed), tostring(map.seed))
      end
      -- the maps hold ids ranked by these settings: other settings would not resume them
      for _, t in ipairs(map.table_names) do
        local theirs = (meta.settings or {})[t]
        if not theirs then return ("the checkpoint has no managed collisions for table %s"):format(t) end
        for _, k in ipairs(mc.TABLE_SETTINGS) do
          if theirs[k] ~= map.settings[t][k] then
            return ("table %s's %s differs from the checkpoint's (the checkpoint has %s, this run has %s)")
                   :format(t, k, tostring(theirs[k]), tostring(map.settings[t][k]))
          end
        end
        local st, why = saved_state(t, tensors, meta)
        if st then why = map:check_state(t, st) end
        if why then return why end
      end
    end,
    load = function(tensors, meta)
      for _, t in ipairs(map.table_names) do assert(map:load_state(t, assert(saved_state(t, tensors, meta)))) end
      map:set_step(meta.step or 0)
      self._resets = nil -- the checkpoint's maps and tables agree
    end,
  }
end

function MCC:extra_repr()
  local s = self.map.settings[self.table_names[1]]
  return ("(%s, %s, evict_every %d)"):format(lib.things(#self.table_names, "table"), s.policy, s.evict_every)
end

return MCC
