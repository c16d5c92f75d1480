-- The loader: a thread of the engine fills pinned batches ahead of use.
--   local loader = ur.data.loader{ data = "synthetic:tiny", samples = 1e6, batch_size = 4096,
--                                  depth = 4, shuffle_window = 65536, seed = 1, epochs = 1 }
--   for batch in loader:batches() do  -- a uvmrec.data.Batch: dense f32 [B,13], sparse KJT, labels
--     ...
--   end
-- A batch stays valid until the call to next() after the one that returned it (so batch i+1
-- can be fetched while batch i is in use), or its release(); batch:to(placement) keeps a copy.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local kjt = require "uvmrec.kjt"
local Batch = require "uvmrec.data.batch"
local C, check, must = lib.C, lib.check, lib.must

local M = {}

-- A data spec string: "synthetic:NAME" (a preset, .lua or .yaml), "criteo-tsv:PATH[,PATH...]"
-- or "criteo-bin:DIR".  Returns {kind, paths | name}, or nil and what is wrong (M.source raises it;
-- a training config's check gives it at its key before anything is built).
function M.parse_source(spec)
  if type(spec) == "table" then return spec end
  if type(spec) ~= "string" then return nil, "data: expected a spec such as synthetic:tiny" end
  local kind, rest = spec:match("^([%w-]+):(.+)$")
  if kind == "synthetic" then return { kind = kind, name = rest } end
  if kind == "criteo-tsv" or kind == "criteo-bin" then
    local paths = {}
    for p in rest:gmatch("[^,]+") do paths[#paths + 1] = p end
    return { kind = kind, paths = paths }
  end
  return nil, ("data: '%s' is not a data spec; expected synthetic:NAME, criteo-tsv:PATH[,PATH...] or "
    .. "criteo-bin:DIR"):format(spec)
end

function M.source(spec, level)
  local src, err = M.parse_source(spec)
  if not src then error(err, (level or 2) + 1) end
  return src
end

local lend = tensor.lend

-- Gives a batch's slot back; its tensors are freed, so a later use is an error, not data
-- silently overwritten by a later batch.
local function give_back(self)
  for _, k in ipairs { "dense", "labels", "groups", "sparse" } do
    if self[k] then self[k]:free() end
  end
  if self._state.open then C.ur_loader_release(self._state.p, self._b) end
end

local function make_batch(state, b)
  local kp = C.ur_batch_sparse(b)
  local outs = ffi.new("ur_kjt *[1]")
  local n = ffi.new("int32_t[1]", C.ur_kjt_num_keys(kp))
  must(C.ur_kjt_split(kp, n, 1, outs)) -- a KJT of Lua's own over the slot's storage
  local batch = Batch.new {
    dense = lend(C.ur_batch_dense(b)), labels = lend(C.ur_batch_labels(b)),
    groups = lend(C.ur_batch_groups(b)), sparse = kjt.wrap(outs[0]),
    size = tonumber(C.ur_batch_size(b)), epoch = tonumber(C.ur_batch_epoch(b)),
    first = tonumber(C.ur_batch_first_sample(b)), next = tonumber(C.ur_batch_next_sample(b)), release = give_back,
  }
  batch._b, batch._state = b, state
  return batch
end

-- Per open loader, by the engine's pointer: the batches handed out (oldest first), and
-- whether it is still open (a batch outliving its loader must not touch it).  Batches refer
-- to this state, not to the loader, so an unreferenced loader is still collected.
local states = {}
local function key(p) return tostring(ffi.cast("uintptr_t", p)) end

local function close_c(p)
  local s = states[key(p)]
  if s then
    for _, b in ipairs(s.held) do b:release() end
    s.open = false
    states[key(p)] = nil
  end
  C.ur_loader_close(p)
end

local methods = {}
local wrap, free_loader = lib.handle_type("ur_loader", close_c, { __index = methods })

local function L(l)
  local p = lib.ptr(l, "loader", 3) -- not a tail call: lib.ptr
  return p
end

-- The loader's rows as the engine takes them: int64_t[n], n (the engine checks n against the
-- source's tables: one a table, or one for all).
local function rows_array(rows, level)
  if type(rows) == "number" then rows = { rows } end
  if type(rows) ~= "table" or #rows == 0 then
    error(("loader: rows is %s; expected a table size for every table, or a list of them, one a table")
      :format(tostring(rows)), level + 1)
  end
  local arr = ffi.new("int64_t[?]", #rows)
  for i, r in ipairs(rows) do arr[i - 1] = lib.whole(r, ("loader: rows of table %d"):format(i), level + 1) end
  return arr, #rows
end

-- The next batch; nil at the end; nil, message when the reading failed (file and line named).
function methods:next()
  local p = L(self)
  local state = states[key(p)]
  local held = state.held
  while #held > 1 do table.remove(held, 1):release() end
  local out = ffi.new("ur_batch *[1]")
  local ok, err = check(C.ur_loader_next(p, out), 2)
  if not ok then return nil, err end
  if out[0] == nil then return nil end
  local b = make_batch(state, out[0])
  held[#held + 1] = b
  return b
end

-- for batch in loader:batches() do ... end (a reading error is raised).
function methods:batches() return Batch.each(self) end

local st = ffi.new("ur_loader_stats")
function methods:stats()
  C.ur_loader_stats_get(L(self), st)
  return { batches = tonumber(st.batches), samples = tonumber(st.samples), bytes = tonumber(st.bytes),
           wait_seconds = st.wait_seconds, produce_seconds = st.produce_seconds,
           produce_cpu_seconds = st.produce_cpu_seconds,
           epoch = tonumber(st.epoch), sample = tonumber(st.sample), threads = st.threads,
           samples_per_epoch = st.samples_per_epoch >= 0 and tonumber(st.samples_per_epoch) or nil }
end

-- Where the next batch starts: give it back as opts.position to resume exactly there.
function methods:position()
  local s = self:stats()
  return { epoch = s.epoch, sample = s.sample }
end

-- Stops the thread and frees the buffers (batches handed out become unusable).
function methods:close() free_loader(self) end
methods.free = methods.close

-- ur.data.loader{data = spec, batch_size =, samples = (synthetic), rows = (one size a table of the
-- source, whatever their count, or one for all: ids mod rows, of files and synthetic data; 0: raw
-- ids; given, even all 0, day files convert reduced are read only where rows divide their sizes;
-- nil: only read), depth = 4,
-- threads = 0 (UR_NUM_THREADS, else every core), drop_last = false,
-- shuffle_window = 0, seed = 0, epochs = 1, rank = 0, world = 1 (each rank reads its share of
-- the rows), slice_rank = 0, slice_world = 0 (> 1: batch_size is a global batch and each batch
-- is this rank's slice of it: samples [n * slice_rank / slice_world, n * (slice_rank + 1) /
-- slice_world) of its n, as data-parallel training reads them), even_slices = false (true: a
-- global batch the slices cannot share equally fails where it comes, unless drop_last drops it;
-- a batch_size that is not a multiple of slice_world is refused), count_samples = false (true:
-- TSV files are counted when the loader opens, one parsing pass, so stats().samples_per_epoch is
-- known before the first batch; day files and synthetic data know it anyway), position = {epoch, sample},
-- placement = "pinned" (synthetic data: "device" draws on the GPU, uvmrec.data.generator, which
-- keeps ids as drawn), stream (that placement's), keys = {...}, on_bad_line = "fail",
-- pad_missing_fields = false}
local OPTIONS = { "data", "batch_size", "samples", "rows", "depth", "threads", "drop_last", "shuffle_window", "seed",
                  "epochs", "rank", "world", "slice_rank", "slice_world", "even_slices", "count_samples", "position",
                  "placement", "stream", "keys", "on_bad_line", "pad_missing_fields", "chunk_bytes", "synthetic" }
-- Counts the engine takes as integers: a cast would read 1.5 as 1 and a string not at all.
local WHOLE = { "batch_size", "samples", "depth", "threads", "shuffle_window", "seed", "epochs", "rank", "world",
                "slice_rank", "slice_world" }

function M.loader(o)
  if type(o) ~= "table" then error("loader: expected a table of options", 2) end
  lib.known_keys(o, OPTIONS, "loader", 2)
  for _, k in ipairs(WHOLE) do
    if o[k] ~= nil then lib.element(o[k], "i64", "loader: " .. k, nil, 2) end
  end
  if o.position ~= nil then
    if type(o.position) ~= "table" then error("loader: position must be a table {epoch =, sample =}", 2) end
    for _, k in ipairs { "epoch", "sample" } do
      if o.position[k] ~= nil then lib.element(o.position[k], "i64", "loader: position." .. k, nil, 2) end
    end
  end
  local src = M.source(o.data, 2)
  local co, drawn = ffi.new("ur_loader_opts"), false
  local keep = {} -- luacheck: ignore 241 (what the C struct points at, alive until open returns)
  co.criteo = require("uvmrec.data").criteo_opts(o, 2, true)
  -- sizes given, 0 (raw ids) included: day files convert reduced are checked against them
  co.rows_given = o.rows ~= nil and 1 or 0
  if o.rows ~= nil then
    keep.rows, co.num_rows = rows_array(o.rows, 2)
    co.rows = keep.rows
  end
  if src.kind == "synthetic" then
    local synthetic = require "uvmrec.data.synthetic"
    local spec = src.spec
    if not spec then
      local base, samples = synthetic.resolve(src.name)
      if not base then error("loader: " .. tostring(samples), 2) end
      spec = synthetic.spec(base, o.synthetic, 2)
      o.samples = o.samples or samples
    elseif not spec.cspec then
      spec = synthetic.spec(spec, nil, 2)
    end
    drawn = o.placement == "device" or o.placement == "managed" -- where it is used
    co.source = C.UR_SOURCE_SYNTHETIC
    co.synth = spec.cspec
    keep.spec = spec
    if not o.samples then error("loader: synthetic data needs samples = N", 2) end
    co.samples = o.samples
    local names = {}
    for i, t in ipairs(spec.tables) do names[i] = t.name or ("C" .. i) end
    o.keys = o.keys or names
  else
    co.source = src.kind == "criteo-tsv" and C.UR_SOURCE_CRITEO_TSV or C.UR_SOURCE_CRITEO_BIN
    local paths = ffi.new("const char *[?]", #src.paths)
    for i, p in ipairs(src.paths) do paths[i - 1] = p end
    keep.paths, keep.list = paths, src.paths
    co.paths, co.npaths = paths, #src.paths
  end
  if o.keys then
    local keys = ffi.new("const char *[?]", #o.keys + 1)
    for i, k in ipairs(o.keys) do keys[i - 1] = k end
    keep.keys, keep.klist = keys, o.keys
    co.keys, co.num_keys = keys, #o.keys
  end
  co.batch_size = o.batch_size or error("loader: batch_size is required", 2)
  co.depth = o.depth or 4
  co.threads = o.threads or 0
  co.drop_last = o.drop_last and 1 or 0
  co.shuffle_window = o.shuffle_window or 0
  co.seed = o.seed or 0
  co.epochs = o.epochs or 1
  co.rank, co.world = o.rank or 0, o.world or 1
  co.slice_rank, co.slice_world = o.slice_rank or 0, o.slice_world or 0
  co.even_slices = o.even_slices and 1 or 0
  co.count_samples = o.count_samples and 1 or 0
  if o.position then
    co.start_epoch, co.start_sample = o.position.epoch or 0, o.position.sample or 0
  end
  co.placement = (o.placement or "pinned") == "host" and C.UR_PLACE_HOST or C.UR_PLACE_PINNED
  -- the generator's batches, checked as the loader's (ur_loader_check: one set of checks)
  if drawn then return require("uvmrec.data.generator").open(o, keep.spec, co, 2) end
  local out = ffi.new("ur_loader *[1]")
  local ok, err = check(C.ur_loader_open(out, co), 2)
  if not ok then return nil, err end
  states[key(out[0])] = { held = {}, open = true, p = out[0] }
  return wrap(out[0])
end

-- ur.data.open(spec, opts): the same as loader(opts) with data = spec.
function M.open(spec, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.data = spec
  return M.loader(o)
end

return M
