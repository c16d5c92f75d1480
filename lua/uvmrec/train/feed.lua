-- Batches from a loader, where the model runs.  On the CPU they are the loader's own.  On a GPU
-- each is copied from the loader's pinned buffers into device buffers kept for the whole run
-- (grown once to the largest batch), asynchronously on the model's stream: no allocation and
-- no wait per step.  The only wait: the loader reuses a batch's pinned buffers when the batch
-- after next is asked for, so that copy, made two steps before, must be done (it always is
-- unless the host runs two steps ahead of the GPU).
--
--   local feed = Feed.new(loader, {gpu = ur.gpu()})
--   local batch = feed:next()  -- {dense = [B, D], labels = [B], sparse = {values=, offsets=,
--                              --  weights=} (a KJT on the CPU), size = B}, nil at the end
local ur = require "uvmrec"

local M = {}
local Feed = {}
Feed.__index = Feed

-- opts: gpu (copy to the current GPU), placement of the copies ("device"; "managed" runs the
-- same path without a GPU, for the specs), stream (nil: the default one).
function M.new(loader, opts)
  opts = opts or {}
  local self = setmetatable({ loader = loader, gpu = opts.gpu and true or false, stream = opts.stream,
                              placement = opts.placement or "device", bufs = {}, n = 0,
                              batch = { sparse = {} } }, Feed)
  if self.gpu then self.events, self.recorded = { assert(ur.event()), assert(ur.event()) }, {} end
  return self
end

-- Feeds from another loader (an evaluation set), keeping the device buffers.
function Feed:attach(loader)
  self:drain()
  self.loader, self.n = loader, 0
  return self
end

-- A device tensor of `n` rows of `cols` (0: 1-D) for `key`, a view of a buffer grown as needed.
function Feed:buf(key, dtype, n, cols)
  local b = self.bufs[key]
  if not b or b.cap < n then
    local cap = math.max(n, b and 2 * b.cap or 0)
    local t = assert(ur.tensor(cols > 0 and { cap, cols } or { cap }, { placement = self.placement, dtype = dtype }))
    if b then b.t:free() end
    b = { t = t, cap = cap, views = {} }
    self.bufs[key] = b
  end
  local v = b.views[n]
  if not v then
    v = b.t:view(0, n)
    b.views[n] = v
  end
  return v
end

local function copy_into(self, key, src, cols)
  if src == nil then return nil end
  local dst = self:buf(key, src:dtype(), cols > 0 and src:size(1) or src:numel(), cols)
  assert(dst:copy(src, self.stream))
  return dst
end

-- The next batch, nil at the end, or nil, message when reading failed.
function Feed:next()
  if not self.gpu then return self.loader:next() end
  self.n = self.n + 1
  local i = self.n % 2 + 1
  local ev = self.events[i]
  -- the copies into this buffer two batches ago are done (an event is synced only once recorded)
  if self.recorded[i] then assert(ev:sync()) end
  local b, err = self.loader:next()
  if not b then return nil, err end
  local out, kjt = self.batch, b.sparse
  out.size = b.size
  out.dense = copy_into(self, "dense", b.dense, b.dense:size(2))
  out.labels = copy_into(self, "labels", b.labels, 0)
  local values, offsets, weights = kjt:values(), kjt:offsets(), kjt:weights()
  out.sparse.values = copy_into(self, "values", values, 0)
  out.sparse.offsets = copy_into(self, "offsets", offsets, 0)
  out.sparse.weights = copy_into(self, "weights", weights, 0)
  values:free()
  offsets:free()
  if weights then weights:free() end
  assert(ev:record(self.stream))
  self.recorded[i] = true
  return out
end

-- Waits for the copies in flight (before the loader is closed or swapped).
function Feed:drain()
  if self.gpu then
    for i, ev in ipairs(self.events) do
      if self.recorded[i] then assert(ev:sync()) end
    end
  end
end

function Feed:free()
  self:drain()
  for _, b in pairs(self.bufs) do b.t:free() end
  self.bufs = {}
end

-- A loader batch as the plain tensors a collection takes: {dense, labels, size, sparse =
-- {values, offsets, weights}} (the KJT's parts are new handles, to free with the batch).
function M.plain(b)
  local k = b.sparse
  return { dense = b.dense, labels = b.labels, size = b.size,
           sparse = { values = k:values(), offsets = k:offsets(), weights = k:weights() } }
end

-- n batches of a loader, held for a benchmark to rotate over: plain device tensors on the GPU,
-- else host copies of their own (the loader reuses its buffers).  Closes the loader.
function M.hold(loader, n, gpu)
  local out = {}
  for i = 1, n do
    local b = assert(loader:next())
    if gpu then
      local d = b:to("device")
      assert(ur.sync()) -- the copies must be done before the loader reuses the batch's buffers
      out[i] = M.plain(d)
      out[i].size = b.size
    else
      out[i] = { dense = assert(b.dense:to("host")), labels = assert(b.labels:to("host")), size = b.size,
                 sparse = assert(b.sparse:to("host")) }
    end
  end
  loader:close()
  return out
end

return M
