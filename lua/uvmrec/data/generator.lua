-- Batches the synthetic generator makes where they are used: ur.data.loader{data = "synthetic:...",
-- placement = "device", ...} draws each batch on the GPU into device buffers and lays its ids
-- out there as a KJT (ur_kjt_from_rows): no host round trip, no copy.  "managed" runs the same
-- path (on the CPU, in the specs).  The batches are the loader's with shuffle_window 0: a
-- rank's rows of each epoch in order, never crossing an epoch, the last one dropped on request,
-- resumed from a position.  The work is ordered on opts.stream (the model's), so a buffer is
-- drawn again only after the work queued on its previous batch; a batch stays valid until the
-- next() after the one that returned it, as the loader's.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local kjt = require "uvmrec.kjt"
local streams = require "uvmrec.stream"
local C, check = lib.C, lib.check

local M = {}
local G = {}
G.__index = G

local Batch = require "uvmrec.data.batch"

local SLOTS = 3 -- two batches the consumer may hold, one in the making

-- o: the loader's options (batch_size, samples, drop_last, epochs, rank, world, slice_rank,
-- slice_world, even_slices, position, keys, placement, stream); spec: the synthetic spec
-- (uvmrec.data.synthetic.spec's); co: the same as the engine's ur_loader_opts (uvmrec.data.loader
-- fills it), checked as the loader checks them.  With slice_world > 1 each batch is this rank's
-- slice of a global batch, as the loader cuts it.
function M.open(o, spec, co, level)
  level = (level or 1) + 1
  if (o.shuffle_window or 0) > 0 then
    error(("loader: the generator (placement '%s') makes batches in sample order; shuffle_window must be 0 "
      .. "(its samples are independent draws already), not %d"):format(o.placement, o.shuffle_window), level)
  end
  local c = spec.cspec
  local B, T, D = o.batch_size, c.num_tables, c.num_dense
  local ok, cerr = check(C.ur_loader_check(co, T))
  if not ok then error(cerr, level) end
  -- ids are laid out as drawn: reducing them modulo rows is the threaded loader's work
  local rows = type(o.rows) == "table" and o.rows or { o.rows }
  for i = 1, T do
    local r = rows[#rows == 1 and 1 or i]
    -- the space ids are drawn from: id_space, or (0) the table's rows
    local space = tonumber(c.tables[i - 1].id_space)
    if space <= 0 then space = tonumber(c.tables[i - 1].rows) end
    if r and r > 0 and space > r then
      error(("loader: the generator (placement '%s') keeps the ids it draws; table %d draws from an id space of %d "
        .. "and rows = %d would take them modulo: use placement 'pinned' (the threaded loader reduces them)")
        :format(o.placement, i, space, r), level)
    end
  end
  local hot, fixed, weighted, H = ffi.new("int32_t[?]", math.max(T, 1)), true, false, 0
  for t = 0, T - 1 do
    hot[t] = c.tables[t].hot_max
    H = H + hot[t]
    fixed = fixed and c.tables[t].hot_min == c.tables[t].hot_max
    weighted = weighted or c.tables[t].weighted ~= 0
  end
  local world, rank = o.world or 1, o.rank or 0
  local sw, sr = o.slice_world or 0, o.slice_rank or 0
  local total = o.samples
  local self = setmetatable({
    spec = spec, c = c, B = B, T = T, D = D, H = H, hot = hot, fixed = fixed, weighted = weighted,
    lo = math.floor(total * rank / world), hi = math.floor(total * (rank + 1) / world),
    epochs = o.epochs or 1, drop_last = o.drop_last, even = o.even_slices and sw > 1, stream = o.stream, keys = {},
    slice_world = sw > 1 and sw or 1, slice_rank = sw > 1 and sr or 0,
    epoch = o.position and o.position.epoch or 0, k = o.position and o.position.sample or 0,
    held = {}, slots = {}, n = 0, done = false,
    st = { batches = 0, samples = 0, bytes = 0, wait_seconds = 0, produce_seconds = 0, produce_cpu_seconds = 0,
           threads = 0 },
  }, G)
  self.st.epoch, self.st.sample = self.epoch, self.k
  self.st.samples_per_epoch = self.hi - self.lo
  local names = o.keys or {}
  self.key_arr = ffi.new("const char *[?]", math.max(T, 1))
  for t = 1, T do
    self.keys[t] = names[t] or spec.tables[t].name or ("C" .. t)
    self.key_arr[t - 1] = self.keys[t]
  end
  local place = o.placement
  local function new(shape, dtype)
    local x, err = tensor.tensor(shape, { placement = place, dtype = dtype })
    if not x then error(err, level + 1) end
    return x
  end
  for i = 1, SLOTS do
    self.slots[i] = {
      dense = new({ B, D }, "f32"), labels = new({ B }, "f32"), ids = new({ B, H }, "i64"),
      lengths = new({ B, T }, "i32"), weights = weighted and new({ B, H }, "f32") or nil,
      groups = c.groups > 0 and new({ B }, "i64") or nil,
      values = new({ B * H }, "i64"), lens = new({ B * T }, "i32"), offsets = new({ B * T + 1 }, "i64"),
      wout = weighted and new({ B * H }, "f32") or nil,
      ready = assert(streams.event()), -- recorded once the batch is made (Batch:to waits on it)
    }
  end
  return self
end

-- The size of the batch at (epoch, k), moving to the next epoch where this one has no more; nil
-- at the end; nil, message for a batch even_slices refuses (the loader's rule, loader.c's dispatch).
function G:_size()
  local N = self.hi - self.lo
  while self.epochs <= 0 or self.epoch < self.epochs do
    local n = math.min(self.B, N - self.k)
    if n > 0 and not (n < self.B and self.drop_last) then
      if self.even and n % self.slice_world ~= 0 then
        return nil, ("loader: the batch at sample %d of epoch %d (the epoch's last) has %s (batch_size %d), "
          .. "which the %d ranks (slice_world) cannot share equally: each takes an equal slice of every global batch "
          .. "(drop_last drops an epoch's short last batch)"):format(self.k, self.epoch, lib.things(n, "sample"),
          self.B, self.slice_world)
      end
      return n
    end
    if self.k == 0 then return nil end -- an epoch without a batch: so are the next ones
    self.epoch, self.k = self.epoch + 1, 0
  end
  return nil
end

local out_kjt = ffi.new("ur_kjt *[1]")

-- The next batch (nil at the end), or nil, message.
function G:next()
  local t0 = C.ur_clock_seconds()
  while #self.held > 1 do table.remove(self.held, 1):release() end
  if self.failed then return nil, self.failed end -- raised again if asked, as the loader's
  local n, uneven
  if not self.done then n, uneven = self:_size() end
  if not n then
    self.done, self.failed = true, uneven
    return nil, uneven
  end
  self.n = self.n + 1
  -- this rank's slice [a, a + m) of the n samples (all of them without slices)
  local a = math.floor(n * self.slice_rank / self.slice_world)
  local m = math.floor(n * (self.slice_rank + 1) / self.slice_world) - a
  local s = self.slots[(self.n - 1) % SLOTS + 1]
  local v = {}
  for _, k in ipairs { "dense", "labels", "ids", "lengths", "weights", "groups" } do
    if s[k] then v[k] = s[k]:view(0, m) end
  end
  local function p(x) return x and x.p or nil end
  local h = streams.handle(self.stream, 2)
  local ok, err = check(C.ur_synth_generate(h, self.c, self.lo + self.k + a, m, v.dense.p, v.labels.p, v.ids.p,
                                            p(v.weights), v.lengths.p, p(v.groups), nil), 2)
  if ok then
    ok, err = check(C.ur_kjt_from_rows(h, out_kjt, self.T, self.key_arr, self.hot, v.ids.p, p(v.weights),
                                       not self.fixed and v.lengths.p or nil, s.values.p, s.lens.p, s.offsets.p,
                                       p(s.wout)), 2)
  end
  for _, k in ipairs { "ids", "lengths", "weights" } do
    if v[k] then v[k]:free() end
  end
  if not ok then
    for _, k in ipairs { "dense", "labels", "groups" } do
      if v[k] then v[k]:free() end
    end
    return nil, err
  end
  local nv = tonumber(C.ur_tensor_numel(C.ur_kjt_values(out_kjt[0])))
  -- its views are freed by release(), when the consumer is done or two batches later; a rank's
  -- slice of the global batch resumes past the whole of it (next)
  assert(s.ready:record(self.stream))
  local b = Batch.new { dense = v.dense, labels = v.labels, groups = v.groups, sparse = kjt.wrap(out_kjt[0]),
                        size = m, epoch = self.epoch, first = self.k + a, next = self.k + n, ready = s.ready }
  self.held[#self.held + 1] = b
  self.k = self.k + n
  local st = self.st
  st.batches, st.samples = st.batches + 1, st.samples + m
  st.bytes = st.bytes + m * (self.D * 4 + 4 + self.T * 4) + nv * (self.weighted and 12 or 8)
  st.epoch, st.sample = b.epoch, self.k
  local dt = C.ur_clock_seconds() - t0
  st.produce_seconds, st.produce_cpu_seconds = st.produce_seconds + dt, st.produce_cpu_seconds + dt
  return b
end

-- for batch in loader:batches() do ... end
function G:batches() return Batch.each(self) end

function G:stats()
  local o = {}
  for k, x in pairs(self.st) do o[k] = x end
  return o
end

-- Where the next batch starts: give it back as opts.position to resume there.
function G:position() return { epoch = self.st.epoch, sample = self.st.sample } end

-- Frees the buffers (the batches handed out become unusable); twice is harmless.
function G:close()
  for _, b in ipairs(self.held) do b:release() end
  self.held = {}
  for _, s in ipairs(self.slots) do
    for _, x in pairs(s) do x:free() end
  end
  self.slots = {}
  self.done = true
end
G.free = G.close

return M
