-- uvmrec.train.source: where uvmrec.train.loop.run takes its batches from.  A source has
-- next() -> a uvmrec.data.Batch where the model runs (nil at the end; nil, message when reading
-- failed) and close() (batches in flight are dropped, what it holds let go).  Three kinds:
--
--   source.loader(loader, {placement =, steps =})  the loader's batches; with a placement
--       ("device" on a GPU) each is copied into buffers kept for the run, asynchronously on
--       the stream given: no allocation and no wait per step
--   source.ring(batches, steps, offset)  batches held where the model runs (source.hold, or
--       source.hold_data for a config's data), taken in turn: a benchmark's steps without the
--       data path
--   uvmrec.pipeline.Prefetch     the prefetch pipeline: batch i+1 copied and its rows brought
--       near the GPU while batch i trains
local streams = require "uvmrec.stream"
local Batch = require "uvmrec.data.batch"

local M = {}

-- ---- the loader ----

local Loader = {}
Loader.__index = Loader

-- opts: placement (nil: the loader's own batches, for a model on the CPU; "device": copies on
-- the current GPU; "managed" runs the same path without a GPU, for the specs), device, stream
-- (the model's; nil: the default one), steps (at most this many batches; nil: until the data
-- ends).  Without a placement the loader's batches are handed out as they are.
function M.loader(loader, opts)
  opts = opts or {}
  local self = setmetatable({ loader = loader, placement = opts.placement, stream = opts.stream,
                              steps = opts.steps, taken = 0, n = 0 }, Loader)
  if self.placement then
    -- Two sets of buffers: the loader reuses a batch's pinned buffers when the batch after
    -- next is asked for, so the copy out of them, made two steps before, must be done by then
    -- (it always is, unless the host runs two steps ahead of the GPU).
    self.bufs = { Batch.buffers(self.placement, opts.device), Batch.buffers(self.placement, opts.device) }
    self.events, self.recorded = { assert(streams.event()), assert(streams.event()) }, {}
  end
  return self
end

-- The next batch, nil at the end, or nil, message when reading failed.
function Loader:next()
  if self.steps and self.taken >= self.steps then return nil end
  if not self.placement then
    local b, err = self.loader:next()
    if b then self.taken = self.taken + 1 end
    return b, err
  end
  self.n = self.n + 1
  local i = self.n % 2 + 1
  -- the copies into these buffers two batches ago are done (an event is synced only once recorded)
  if self.recorded[i] then assert(self.events[i]:sync()) end
  local b, err = self.loader:next()
  if not b then return nil, err end
  self.taken = self.taken + 1
  local out = b:to(self.placement, self.stream, self.bufs[i])
  assert(self.events[i]:record(self.stream))
  self.recorded[i] = true
  return out
end

-- Waits for the copies in flight (before the loader is closed or swapped).
function Loader:drain()
  for i, ev in ipairs(self.events or {}) do
    if self.recorded[i] then assert(ev:sync()) end
  end
end

-- Takes from another loader (an evaluation set), keeping the buffers.
function Loader:attach(loader, steps)
  self:drain()
  self.loader, self.steps, self.taken = loader, steps, 0
  return self
end

function Loader:close()
  self:drain()
  for _, b in ipairs(self.bufs or {}) do b:free() end
end
Loader.free = Loader.close

-- ---- a ring of batches held in place ----

-- n batches of a loader (fewer when its data ends first), held where the model runs (placement
-- "device"; nil: copies of their own in host memory, as the loader reuses its buffers).
-- Closes the loader.
function M.hold(loader, n, placement)
  local out = {}
  for i = 1, n do
    local b, err = loader:next()
    if err then error(err, 2) end
    if not b then break end
    out[i] = b:to(placement or "host")
  end
  if placement then assert(require("uvmrec").sync()) end -- the copies are done before the buffers go
  loader:close()
  return out
end

-- n batches of a config's training data (uvmrec.train.data's, cut to one epoch of n batches),
-- held as hold holds them; and the loader options that made them, for another loader of the
-- same data.  nil, message when the config has no data that can be read.
function M.hold_data(cfg, n, placement)
  local train = require "uvmrec.train"
  local data, err = train.data(cfg, train.config.table_rows(cfg))
  if not data then return nil, err end
  local opts = {}
  for k, v in pairs(data.train) do opts[k] = v end
  opts.samples, opts.epochs = n * cfg.train.batch_size, 1
  local loader, lerr = require("uvmrec").data.loader(opts)
  if not loader then return nil, lerr end
  return M.hold(loader, n, placement), opts
end

local Ring = {}
Ring.__index = Ring

-- steps batches (nil: without end) from the list, in turn, from the one after the first
-- `offset` (default 0: a run going on where another ended).
function M.ring(batches, steps, offset)
  if type(batches) ~= "table" or #batches == 0 then error("source.ring: expected a list of batches", 2) end
  return setmetatable({ batches = batches, steps = steps, offset = offset or 0, taken = 0 }, Ring)
end

function Ring:next()
  if self.steps and self.taken >= self.steps then return nil end
  self.taken = self.taken + 1
  local b = self.batches
  return b[(self.offset + self.taken - 1) % #b + 1]
end

-- The batch next() gives next, not taken (nil at the end): early work on it (far rows' early
-- copies, uvmrec.train.hooks.far_early).
function Ring:peek()
  if self.steps and self.taken >= self.steps then return nil end
  local b = self.batches
  return b[(self.offset + self.taken) % #b + 1]
end

-- The ring lets go of nothing: its batches are the caller's.
function Ring.close() end

return M
