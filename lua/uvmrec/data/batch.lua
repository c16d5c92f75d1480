-- uvmrec.data.Batch: one batch of samples, the one shape data has from the loader to the model,
-- on any placement: dense f32 [B, D], sparse a KJT (keys in feature order; a variable batch per
-- key with its stride_per_key_per_rank and inverse_indices), labels f32 [B], groups i64 [B]
-- (or nil), size B, epoch and first (its first sample within the epoch: where it came from),
-- and ticket: the record of its rows that an embedding collection's cache brought in ahead
-- (the prefetch pipeline's), which the model hands to the collection's forward and backward.
--
--   local b = loader:next()                 -- pinned: the loader's own buffers
--   local d = b:to("device", stream)        -- a copy where the model runs, ordered on stream
--   local bufs = Batch.buffers("device")    -- kept for a run:
--   local e = b:to("device", stream, bufs)  -- the same, into bufs: no allocation, no wait
--   d:release()                             -- frees a copy; gives a loader's batch back
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local C = lib.C

local Batch = {}
Batch.__index = Batch

local FIELDS = { dense = true, sparse = true, labels = true, groups = true, size = true, epoch = true,
                 first = true, next = true, release = true, ready = true }

-- Batch.new{dense =, sparse =, labels =[, groups =], size =[, epoch =, first =, next =][, release =]}:
-- next: where the data stands after the batch when it is not first + size (a data-parallel
-- rank's slice of a global batch resumes past the whole of it);
-- the batch owns the tensors and the KJT given, and its release() frees them, or calls
-- release(batch) when given (a loader's batch goes back to the loader).  ready: an event recorded
-- on the stream that made the batch's tensors (a source on the GPU): copies on other streams
-- (Batch:to) wait for it.
function Batch.new(t)
  if type(t) ~= "table" then error("Batch: expected a table {dense =, sparse =, labels =, size =}", 2) end
  lib.known_keys(t, FIELDS, "Batch", 2, "field")
  if not require("uvmrec.kjt").is(t.sparse) then
    error("Batch: sparse must be a KJT, got " .. type(t.sparse), 2)
  end
  if type(t.size) ~= "number" then error("Batch: size must be the number of samples", 2) end
  if t.release ~= nil and type(t.release) ~= "function" then error("Batch: release must be a function(batch)", 2) end
  return setmetatable({ dense = t.dense, sparse = t.sparse, labels = t.labels, groups = t.groups, size = t.size,
                        epoch = t.epoch, first = t.first, next = t.next, _release = t.release,
                        ready = t.ready }, Batch)
end

function Batch.is(v) return getmetatable(v) == Batch end

-- for batch in Batch.each(source) do ... end: a source's batches (source:next() returns a batch,
-- nil at the end, or nil, message), a reading error raised at the loop.  The loader's and the
-- generator's batches().
function Batch.each(source)
  return function()
    local b, err = source:next()
    if err then error(err, 2) end
    return b
  end
end

-- Where the data stands after this batch ({epoch, sample}), to resume exactly after it; nil for
-- a batch that does not know where it came from.
function Batch:position()
  if not (self.epoch and self.first) then return nil end
  return { epoch = self.epoch, sample = self.next or self.first + self.size }
end

-- Buffers a run keeps in one placement (device, managed, host), grown to the largest batch:
-- Batch:to copies into them.  Each keeps its view of the last size asked (batches of one size
-- make none after the first).
local Buffers = {}
Buffers.__index = Buffers

function Batch.buffers(placement, device)
  return setmetatable({ placement = placement, device = device, bufs = {} }, Buffers)
end

-- A 1-D tensor of n elements (cols > 0: [n, cols]) of `key`'s buffer, grown as needed.
function Buffers:get(key, dtype, n, cols)
  local numel = cols > 0 and n * cols or n
  local b = self.bufs[key]
  if not b or b.cap < numel or b.dtype ~= dtype or b.cols ~= cols then
    local cap = math.max(numel, b and 2 * b.cap or 0, 1)
    local t = assert(tensor.tensor({ cap }, { placement = self.placement, device = self.device, dtype = dtype }))
    if b then
      b.t:free()
      b.view:free()
    end
    b = { t = t, cap = cap, dtype = dtype, cols = cols }
    self.bufs[key] = b
  end
  if b.n ~= n then
    if b.view then b.view:free() end
    b.view, b.n = cols > 0 and b.t:view_as(0, { n, cols }) or b.t:view(0, n), n
  end
  return b.view
end

function Buffers:free()
  for _, b in pairs(self.bufs) do
    if b.view then b.view:free() end
    b.t:free()
  end
  self.bufs = {}
  if self.last then self.last.sparse:free() end
  self.last = nil
end

-- The KJT's parts: their buffers' names, the engine's accessors and their dtypes.
local PARTS = { { "values", C.ur_kjt_values, "i64" }, { "lengths", C.ur_kjt_lengths, "i32" },
                { "offsets", C.ur_kjt_offsets, "i64" }, { "weights", C.ur_kjt_weights, "f32" },
                { "inverse_indices", C.ur_kjt_inverse_indices, "i64" } }

-- Tensor t copied into `key`'s buffer of into (cols > 0: as [rows, cols]), ordered on stream.
local function copy_into(into, key, t, cols, stream)
  if t == nil then return nil end
  local dst = into:get(key, t:dtype(), cols > 0 and t:size(1) or t:numel(), cols)
  assert(dst:copy(t, stream))
  return dst
end

-- A copy of this batch in another placement (device, managed, pinned, host), ordered on stream.
-- With into (Batch.buffers of that placement), the copy is made in its buffers, and lives until
-- the next copy into them.
function Batch:to(placement, stream, into)
  if self.ready then -- made on another stream: the copy waits for it
    local ok, err = require("uvmrec.stream").wait(stream, self.ready, 3)
    if not ok then error(err, 2) end
  end
  if not into then
    local function mv(t) return t and assert(t:to(placement, nil, stream)) end
    return setmetatable({ dense = mv(self.dense), labels = mv(self.labels), groups = mv(self.groups),
                          sparse = assert(self.sparse:to(placement, stream)), size = self.size,
                          epoch = self.epoch, first = self.first, next = self.next }, Batch)
  end
  if into.placement ~= placement then
    error(("Batch:to: buffers in %s, not %s"):format(into.placement, placement), 2)
  end
  local k = self.sparse
  local kp = lib.ptr(k, "kjt", 2)
  local parts = into.parts or {}
  into.parts = parts
  for _, p in ipairs(PARTS) do
    local src = p[2](kp)
    parts[p[1]] = src ~= nil and into:get(p[1], p[3], tonumber(C.ur_tensor_numel(src)), 0) or nil
  end
  if into.last then into.last.sparse:free() end
  local out = setmetatable({ dense = copy_into(into, "dense", self.dense, self.dense and self.dense:size(2), stream),
                             labels = copy_into(into, "labels", self.labels, 0, stream),
                             groups = copy_into(into, "groups", self.groups, 0, stream),
                             sparse = assert(k:copy(parts, stream)), size = self.size, epoch = self.epoch,
                             first = self.first, next = self.next, _into = into }, Batch)
  into.last = out
  return out
end

-- Done with the batch: a loader's goes back to it (its tensors become unusable), a copy's
-- tensors are freed (one in buffers leaves them to the buffers).  Twice is harmless.
function Batch:release()
  if self._released then return end
  self._released = true
  self.ticket = nil
  if self._release then return self:_release() end
  if self._into then return end
  for _, k in ipairs { "dense", "labels", "groups", "sparse" } do
    if self[k] then self[k]:free() end
  end
end
Batch.free = Batch.release

function Batch:__tostring()
  return ("Batch(%s, %s%s)"):format(lib.things(self.size, "sample"),
                                    self.sparse.p ~= nil and self.sparse:placement() or "freed",
                                    self.ticket and ", ticket " .. tostring(tonumber(self.ticket.id)) or "")
end

return Batch
