-- uvmrec.pipeline.Prefetch: the prefetch pipeline, a source of batches for
-- uvmrec.train.loop.run whose stages overlap on their own streams.  While the GPU computes batch
-- i (the compute stream), batch i+1's rows are brought near the GPU on the prefetch stream, and
-- batch i+2 is copied to the GPU (a high-priority copy stream).  For the collection's `cached`
-- tables the missing rows come into the cache (the collection's prepare: the batch's ticket,
-- which goes with the batch to its forward and backward, its host work overlapping the GPU's);
-- for its `managed` tables the pages of the rows that the hint policy left on the host are
-- prefetched to the GPU (ur_tbe_prefetch_pages), so one pipeline serves both offload paths; and
-- where the collection has room for far rows' copies (set_far_rows), batch i+1's far rows are
-- copied early into HBM (ur_tbe_far_prefetch, docs/uvm.md "Early copies").
-- Events join the stages: compute waits for its batch's copy and prefetch; a copy into a
-- buffer waits until the batch that last used it is done; the cache makes its own copies wait
-- for the retire (backward and staged write-backs) of earlier batches wherever they touch the
-- same rows, and locks the rows of batches in flight, so no interleaving reads a stale row.
-- A sharded collection (uvmrec.dist.shard) takes a ticket for every batch: its prepare runs the
-- input exchange of batch i+1 (ids to the ranks that own their rows) while batch i computes,
-- then brings those ids' rows into its cached shards' caches, and its managed shards' pages
-- are prefetched from the exchanged ids; every rank prepares its batches in the same order, so
-- the ranks' collectives pair up.
--
--   local P = require "uvmrec.pipeline.Prefetch"
--   local p = P.new{ collection = model.embeddings,  -- an EmbeddingBagCollection or uvmrec.tbe
--                    source = loader,                -- host batches (uvmrec.data.Batch): next()
--                    steps = n,                      -- at most n batches (nil: until the data ends)
--                    drain = true,                   -- false: at the end, drop the batches in flight
--                    stream = s,                     -- the compute stream (nil: the default one)
--                    pages = false } -- managed tables: prefetch the pages of each batch's rows
--                                    -- (off by default: on the H200 it made B4 60x slower)
--   train.loop.run(model, optimizer, p, hooks)  -- or: while p:next() ... end
--   p:free()
--
-- next() hands out batch i once batch i-1 has been trained (its forward and backward
-- enqueued): it takes the batches one after the other, as the loop does.  Batches are copied
-- into buffers of the pipeline's own (three sets, grown to the largest batch); the source's
-- stay the source's (a loader gives its buffers to the batch after next).  Without a GPU the
-- stages run one after the other in the same order, on the source's batches, and the cache
-- makes the same decisions (the reference of the GPU's).
local lib = require "uvmrec.lib"
local streams = require "uvmrec.stream"
local Batch = require "uvmrec.data.batch"
local C = lib.C

local Prefetch = {}
Prefetch.__index = Prefetch

local DEPTH = 3 -- batches in flight: computing, prefetched, copied

local function fail(msg, level) error("Prefetch: " .. msg, level + 1) end

local OPTS = { collection = true, source = true, steps = true, drain = true, stream = true, pages = true }

function Prefetch.new(o)
  if type(o) ~= "table" then fail("expected a table of options", 2) end
  lib.known_keys(o, OPTS, "Prefetch", 2)
  if (type(o.source) ~= "table" and type(o.source) ~= "cdata") or type(o.source.next) ~= "function" then
    fail("source must give host batches through next() (a loader)", 2)
  end
  local tbe = o.collection and (o.collection.tbe or o.collection)
  if tbe ~= nil and type(tbe.prepare) ~= "function" then
    fail("collection must be an EmbeddingBagCollection, a uvmrec.tbe collection or a sharded one "
      .. "(uvmrec.dist.shard)", 2)
  end
  local managed = tbe ~= nil and tbe.managed ~= nil and #tbe.managed > 0
  for _, k in ipairs { "pages", "drain" } do
    if o[k] ~= nil and type(o[k]) ~= "boolean" then
      fail(("%s is %s; expected true or false"):format(k, tostring(o[k])), 2)
    end
  end
  local n = o.steps
  if n ~= nil and not lib.whole_in(n, 0, 2 ^ 63) then
    fail(("steps is %s; expected a whole number >= 0"):format(tostring(n)), 2)
  end
  if o.pages and not managed then
    fail("pages = true needs a collection with managed tables", 2)
  end
  local self = setmetatable({
    -- a sharded collection's prepare is its input exchange: every batch takes a ticket
    tbe = tbe, cached = tbe ~= nil and (tbe.cached ~= nil or tbe.prepare_always == true), source = o.source,
    exchanges = tbe ~= nil and tbe.prepare_always == true, steps = o.steps,
    drain = o.drain ~= false, compute = o.stream,
    device = tbe and tbe.device or (C.ur_device_count() > 0 and 0 or -1),
    pages = managed and o.pages == true, slots = {}, have = {}, i = nil, ended = false, err = nil,
    counts = { batches = 0, prefetched = 0, copied = 0, pages = 0, page_bytes = 0, page_runs = 0,
               pages_skipped_bytes = 0, far_early = 0 },
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
    self.slots[k] = { bufs = self.gpu and Batch.buffers("device", self.device), copied = assert(streams.event()),
                      prepared = assert(streams.event()), done = assert(streams.event()), used = false }
  end
  return self
end

local function wait(stream, ev) assert(streams.wait(stream, ev)) end

function Prefetch:_slot(k) return self.slots[k % DEPTH + 1] end

-- Stage 1: the source's batch k into its slot, on the copy stream after the batch that used
-- the slot is done.  False when the source has ended (or failed: self.err).
function Prefetch:_take(k)
  if self.steps and k >= self.steps then return false end
  local b, err = self.source:next()
  if b == nil then
    self.ended, self.err = true, err
    return false
  end
  local s = self:_slot(k)
  s.host = b
  if not self.gpu then
    s.dev = b
    return true
  end
  if s.used then wait(self.copy_stream, s.done) end
  s.dev = b:to("device", self.copy_stream, s.bufs)
  assert(s.copied:record(self.copy_stream))
  self.counts.copied = self.counts.copied + 1
  return true
end

-- Stage 2: the rows of the batch in slot s brought in: its ticket from the cache (on a GPU the
-- cache decides there, from the batch's device copy, after its copy); the pages of its rows in
-- managed tables prefetched (their ids read from the host batch); its far rows copied early.
function Prefetch:_prefetch(s)
  -- early copies where the collection has room for far rows' copies and none of its forwards was
  -- captured into a graph (asked now: a run sets the room after making the pipeline)
  local far = self.gpu and self.tbe ~= nil and self.tbe.far_early_usable ~= nil and self.tbe:far_early_usable()
  if not self.cached and not self.pages and not far then return end
  -- both read the batch's device copy
  if self.gpu and (far or self.cached) then wait(self.prefetch_stream, s.copied) end
  if far then
    assert(self.tbe:far_prefetch(s.dev.sparse, self.prefetch_stream))
    self.counts.far_early = self.counts.far_early + 1
  end
  if self.cached then
    -- a sharded collection's input exchange runs KJT operations that take no stream (the
    -- legacy one, which does not wait for the copy stream): the batch must be there first
    if self.gpu and self.exchanges then assert(s.copied:sync()) end
    s.dev.ticket = assert(self.tbe:prepare(s.dev.sparse, self.prefetch_stream))
  end
  if self.pages then
    -- a sharded collection's shards read the ids the exchange brought (in the ticket)
    local ids = self.exchanges and s.dev.ticket or s.host.sparse
    local ps = assert(self.tbe:prefetch_pages(ids, self.prefetch_stream))
    local c = self.counts
    c.pages = c.pages + ps.pages
    c.page_bytes = c.page_bytes + ps.bytes
    c.page_runs = c.page_runs + ps.runs - ps.runs_skipped
    c.pages_skipped_bytes = c.pages_skipped_bytes + ps.bytes_skipped
  end
  if self.gpu then assert(s.prepared:record(self.prefetch_stream)) end
  self.counts.prefetched = self.counts.prefetched + 1
end

-- Batch k's compute enqueued: its slot is free for a copy once that is done.
function Prefetch:_computed(k)
  local s = self:_slot(k)
  if self.gpu then assert(s.done:record(self.compute)) end
  s.used = true
end

-- Batch k let go once its copy is done (a loader reuses the buffers of the batch before last
-- when the source is asked again); its ticket, if never trained, dropped.
function Prefetch:_release(k)
  local s = self:_slot(k)
  if self.gpu then assert(s.copied:sync()) end
  local t = s.dev and s.dev.ticket
  if t and not t.retired then assert(self.tbe:retire(t, false, self.compute)) end
  if s.dev then s.dev.ticket = nil end
  s.host, s.dev = nil, nil
end

-- The next batch, ready on the compute stream (copied; its rows prepared, its ticket in
-- batch.ticket), once the one before was trained; nil at the end, or nil, message when the
-- source failed.
function Prefetch:next()
  local have = self.have
  local i = self.i
  if i == nil then
    i = 0
    have[0] = self:_take(0)
    have[1] = have[0] and self:_take(1)
    if have[0] then self:_prefetch(self:_slot(0)) end
  elseif have[i] then
    -- batch i was trained: prefetch i+1 while it computes, then copy i+2
    self:_computed(i)
    if have[i + 1] then self:_prefetch(self:_slot(i + 1)) end
    self:_release(i)
    have[i + 2] = have[i + 1] and self:_take(i + 2)
    if self.ended and not self.drain and have[i + 1] then
      -- stop at once: what was copied or prefetched ahead is dropped unread
      self:_release(i + 1)
      have[i + 1] = false
    end
    i = i + 1
  end
  self.i = i
  if not have[i] then return nil, self.err end
  local s = self:_slot(i)
  if self.gpu then
    wait(self.compute, s.copied)
    -- (the next forward waits for its early copies itself)
    if self.cached or self.pages then wait(self.compute, s.prepared) end
  end
  self.counts.batches = self.counts.batches + 1
  return s.dev
end

-- Ends early (a stop, a step limit, an error): the batch handed out last is done with, and the
-- ones in flight are dropped unread.
function Prefetch:close()
  local i = self.i
  if i == nil then return end
  if self.have[i] then
    self:_computed(i)
    self:_release(i)
  end
  for k = i + 1, i + 2 do
    if self.have[k] then self:_release(k) end
    self.have[k] = false
  end
  self.have[i] = false
end

-- Batches handed out, prefetched and copied so far; with pages on, the managed tables' pages
-- the batches touched (pages), the bytes of the runs asked for (page_bytes) and their number
-- (page_runs), and the bytes left alone because the hint policy keeps them on the GPU
-- (pages_skipped_bytes).
function Prefetch:stats()
  local c = self.counts
  local r = { batches = c.batches, prefetched = c.prefetched, copied = c.copied, far_early = c.far_early }
  if self.pages then
    r.pages, r.page_bytes, r.page_runs, r.pages_skipped_bytes = c.pages, c.page_bytes, c.page_runs,
                                                              c.pages_skipped_bytes
  end
  return r
end

function Prefetch:free()
  self:close()
  if self.gpu then C.ur_device_sync() end
  for _, s in ipairs(self.slots) do
    if s.bufs then s.bufs:free() end
  end
  self.copy_stream:free()
  self.prefetch_stream:free()
end

return Prefetch
