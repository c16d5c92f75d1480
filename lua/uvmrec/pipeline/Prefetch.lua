-- uvmrec.pipeline.Prefetch: a training loop whose stages overlap on their own streams.  While
-- the GPU computes batch i (the compute stream), batch i+1's rows are brought near the GPU on
-- the prefetch stream, and batch i+2 is copied to the GPU (a high-priority copy stream).  For
-- the collection's `cached` tables the missing rows come into the cache (ur_cache_prepare, its
-- host work overlapping the GPU's); for its `managed` tables the pages of the rows that the
-- hint policy left on the host are prefetched to the GPU (ur_tbe_prefetch_pages), so one loop
-- serves both offload paths.
-- Events join the stages: compute waits for its batch's copy and prefetch; a copy into a
-- buffer waits until the batch that last used it is done; the cache makes its own copies wait
-- for the retire (backward and staged write-backs) of earlier batches wherever they touch the
-- same rows, and locks the rows of batches in flight, so no interleaving reads a stale row.
--
--   local P = require "uvmrec.pipeline.Prefetch"
--   local p = P.new{ collection = model.embeddings,        -- an EmbeddingBagCollection or uvmrec.tbe
--                    source = function() return host_batch end, -- nil at the end
--                    sparse = function(b) return b.sparse end,  -- the collection's input in a batch
--                    step = function(dev_batch, i) ... end,      -- forward + backward of one batch;
--                                                                -- false: stop at once
--                    release = function(host_batch) end,         -- optional: the source's batch is free
--                    drain = true,                               -- false: stop at once at the end
--                    pages = false } -- managed tables: prefetch the pages of each batch's rows
--                                    -- (off by default: on the H200 it made B4 60x slower)
--   local steps = p:run(max_steps)
--
-- Batches are tables whose tensor fields (at any depth; not those named _x) are copied to the collection's device
-- into buffers of the pipeline's own (three sets, grown to the largest batch); other fields are
-- kept.  Without a GPU the stages run one after the other in the same order, and the cache
-- makes the same decisions (the reference of the GPU's).
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local streams = require "uvmrec.stream"
local C, check = lib.C, lib.check

local Prefetch = {}
Prefetch.__index = Prefetch

local DEPTH = 3 -- batches in flight: computing, prefetched, copied

local function fail(msg, level) error("Prefetch: " .. msg, level + 1) end

local is_tensor = tensor.is_tensor

function Prefetch.new(o)
  if type(o) ~= "table" then fail("expected a table of options", 2) end
  for k in pairs(o) do
    if not ({ collection = true, source = true, sparse = true, step = true, release = true,
              drain = true, compute = true, pages = true })[k] then
      fail(("unknown option '%s'"):format(tostring(k)), 2)
    end
  end
  if type(o.source) ~= "function" then fail("source must be a function returning batches", 2) end
  if type(o.step) ~= "function" then fail("step must be a function(batch, i)", 2) end
  local tbe = o.collection and (o.collection.tbe or o.collection)
  if tbe ~= nil and type(tbe.forward) ~= "function" then
    fail("collection must be an EmbeddingBagCollection or a uvmrec.tbe collection", 2)
  end
  local managed = tbe ~= nil and tbe.managed ~= nil and #tbe.managed > 0
  if o.pages ~= nil and type(o.pages) ~= "boolean" then
    fail(("pages is %s; expected true or false"):format(tostring(o.pages)), 2)
  end
  if o.pages and not managed then
    fail("pages = true needs a collection with managed tables", 2)
  end
  local self = setmetatable({
    tbe = tbe, cache = tbe and tbe.cache, source = o.source, step = o.step, release = o.release,
    sparse = o.sparse or function(b) return b.sparse end,
    drain = o.drain ~= false, compute = o.compute,
    device = tbe and tbe.device or (C.ur_device_count() > 0 and 0 or -1),
    pages = managed and o.pages == true,
    slots = {}, counts = { batches = 0, prefetched = 0, copied = 0, pages = 0, page_bytes = 0,
                           page_runs = 0, pages_skipped_bytes = 0 },
  }, Prefetch)
  self.gpu = self.device >= 0
  -- Streams on the CPU too: they order nothing there, but the cache's locks follow the
  -- streams, so the CPU makes the GPU's decisions.
  -- The prefetch stream's kernels (the cache's decisions and row moves) take SMs ahead of the
  -- compute stream's blocks as these finish: its work must be done before the next batch
  -- computes, and the host waits for its decisions.  CUDA clamps -100 to its highest priority.
  self.copy_stream = assert(streams.stream { priority = -1 })
  self.prefetch_stream = assert(streams.stream { priority = -100 })
  for k = 1, DEPTH do
    self.slots[k] = { bufs = {}, copied = assert(streams.event()), prepared = assert(streams.event()),
                      done = assert(streams.event()), used = false }
  end
  return self
end

-- The device copy of a batch into slot s's buffers (tensors at any depth; others as they are).
local function upload(self, s, b, path, stream)
  if is_tensor(b) then
    local n = b:numel()
    local buf = s.bufs[path]
    if not buf or buf:numel() < n or buf:dtype() ~= b:dtype() then
      if buf then buf:free() end
      local opts = { dtype = b:dtype(), placement = "device", device = self.device }
      buf = assert(tensor.tensor({ math.max(1, math.ceil(n * 1.25)) }, opts))
      s.bufs[path] = buf
    end
    local v = buf:view_as(0, b:size())
    assert(v:copy(b, stream))
    return v
  end
  if type(b) ~= "table" then return b end
  local out = {}
  for k, v in pairs(b) do
    -- fields named _x are the caller's bookkeeping, kept as they are
    local own = type(k) == "string" and k:sub(1, 1) == "_"
    out[k] = own and v or upload(self, s, v, path .. "." .. tostring(k), stream)
  end
  return out
end

local function wait(stream, ev)
  assert(check(C.ur_stream_wait_event(streams.handle(stream), lib.ptr(ev, "event"))))
end

-- Stage 1: batch `b` into slot s on the copy stream, after the batch that used s is done.
function Prefetch:_copy(s, b)
  if not self.gpu then
    s.dev = b
    return
  end
  if s.used then wait(self.copy_stream, s.done) end
  s.dev = upload(self, s, b, "", self.copy_stream)
  assert(s.copied:record(self.copy_stream))
  self.counts.copied = self.counts.copied + 1
end

-- Stage 2: the cache brings in the rows of the batch in slot s (prepared under the key of its
-- device input, which is what the step's forward will be given); the pages of its rows in
-- managed tables are prefetched (their ids read from the host batch).
function Prefetch:_prefetch(s)
  if not self.cache and not self.pages then return end
  local host = self.sparse(s.host)
  if self.cache then
    -- on a GPU the cache decides there, from the batch's device copy (after its copy)
    local key = self.sparse(s.dev)
    if self.gpu then wait(self.prefetch_stream, s.copied) end
    local v, o, _, bp = self.tbe:_input(self.gpu and key or host, 2)
    assert(self.cache:prepare(key, v, o, bp, self.prefetch_stream, 2, true))
  end
  if self.pages then
    local ps = assert(self.tbe:prefetch_pages(host, self.prefetch_stream))
    local c = self.counts
    c.pages = c.pages + ps.pages
    c.page_bytes = c.page_bytes + ps.bytes
    c.page_runs = c.page_runs + ps.runs - ps.runs_skipped
    c.pages_skipped_bytes = c.pages_skipped_bytes + ps.bytes_skipped
  end
  if self.gpu then assert(s.prepared:record(self.prefetch_stream)) end
  self.counts.prefetched = self.counts.prefetched + 1
end

-- Runs until the source ends or max_steps batches were trained; returns the number trained.
function Prefetch:run(max_steps)
  local ring, n, i, ended = self.slots, 0, 0, false
  local function take(k)
    local b = self.source()
    if b == nil then
      ended = true
      return false
    end
    local s = ring[k % DEPTH + 1]
    s.host = b
    self:_copy(s, b)
    return true
  end
  local function limit(k) return not max_steps or k < max_steps end
  local have = { [0] = limit(0) and take(0) }
  have[1] = have[0] and limit(1) and take(1)
  if have[0] then self:_prefetch(ring[1]) end
  while have[i] do
    local s = ring[i % DEPTH + 1]
    if self.gpu then
      wait(self.compute, s.copied)
      if self.cache or self.pages then wait(self.compute, s.prepared) end
    end
    local go = self.step(s.dev, i + 1) ~= false
    if self.gpu then assert(s.done:record(self.compute)) end
    s.used = true
    if go then
      n = n + 1
      self.counts.batches = n
    end
    if go and have[i + 1] then self:_prefetch(ring[(i + 1) % DEPTH + 1]) end
    -- batch i's host copy is done with (its copy, its prefetch's reads) before the source is
    -- asked again: a loader reuses the buffers of the batch before last
    if self.gpu then assert(s.copied:sync()) end
    if self.release then self.release(s.host) end
    s.host = nil
    have[i + 2] = go and have[i + 1] and limit(i + 2) and take(i + 2)
    if not go or (ended and not self.drain) then
      -- stop at once: what was copied or prefetched ahead is dropped unread
      if not go and self.cache then assert(self.cache:retire(self.sparse(s.dev), false, self.compute)) end
      if have[i + 1] then
        local nxt = ring[(i + 1) % DEPTH + 1]
        if self.cache and go then assert(self.cache:retire(self.sparse(nxt.dev), false, self.compute)) end
        if self.release and nxt.host then self.release(nxt.host) end
        nxt.host = nil
      end
      break
    end
    i = i + 1
  end
  return n
end

-- Batches trained, prefetched and copied so far; with pages on, the managed tables' pages the
-- batches touched (pages), the bytes of the runs asked for (page_bytes) and their number
-- (page_runs), and the bytes left alone because the hint policy keeps them on the GPU
-- (pages_skipped_bytes).
function Prefetch:stats()
  local c = self.counts
  local r = { batches = c.batches, prefetched = c.prefetched, copied = c.copied }
  if self.pages then
    r.pages, r.page_bytes, r.page_runs, r.pages_skipped_bytes = c.pages, c.page_bytes, c.page_runs,
                                                              c.pages_skipped_bytes
  end
  return r
end

function Prefetch:free()
  if self.gpu then C.ur_device_sync() end
  for _, s in ipairs(self.slots) do
    for _, b in pairs(s.bufs) do b:free() end
    s.bufs = {}
  end
  self.copy_stream:free()
  self.prefetch_stream:free()
end

return Prefetch
