-- Streams (with priority) and events, as FFI objects with methods.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local C, check, ptr = lib.C, lib.check, lib.ptr

local M = {}

local stream_methods = {}
local wrap_stream, free_stream = lib.handle_type("ur_stream", C.ur_stream_free, {
  __index = stream_methods,
  __tostring = function(s)
    if s.p == nil then return "stream (freed)" end
    return ("stream (priority %d)"):format(C.ur_stream_priority(s.p))
  end,
})

function stream_methods:sync() return check(C.ur_stream_sync(ptr(self, "stream"))) end
function stream_methods:priority() return C.ur_stream_priority(ptr(self, "stream")) end
stream_methods.free = free_stream

-- The engine pointer of an optional stream argument (nil: the default stream).
function M.handle(s, level)
  if s == nil then return nil end
  local p = ptr(s, "stream", (level or 2) + 1) -- not a tail call: lib.ptr
  return p
end

-- ur.stream{priority = n}: lower numbers run first on CUDA (its convention), which clamps n to
-- the device's range.
function M.stream(opts)
  -- the FFI would truncate 1.5, wrap 2^40 and NaN to INT32_MIN, and a misspelt key was ignored
  opts = lib.options(opts, { "priority" }, "stream", "{priority = -1}", 2)
  local p = lib.element(opts.priority or 0, "i32", "stream: priority", nil, 2)
  local out = ffi.new("ur_stream *[1]")
  local ok, err = check(C.ur_stream_new(out, p))
  if not ok then return nil, err end
  return wrap_stream(out[0])
end

-- Work enqueued on stream (nil: the default stream) after this waits for event's last record
-- (none yet: no wait), on the device: the host does not wait.  level: where a misuse is
-- reported, as error() counts from here (2, the default: the caller).
function M.wait(stream, event, level)
  level = level or 2
  return check(C.ur_stream_wait_event(M.handle(stream, level), ptr(event, "event", level)), level)
end

local event_methods = {}
local wrap_event, free_event = lib.handle_type("ur_event", C.ur_event_free, { __index = event_methods })

function event_methods:record(stream)
  return check(C.ur_event_record(ptr(self, "event"), M.handle(stream)))
end
function event_methods:sync() return check(C.ur_event_sync(ptr(self, "event"))) end
local ms = ffi.new("double[1]")
-- Milliseconds from self to later.
function event_methods:elapsed(later)
  local ok, err = check(C.ur_event_elapsed(ptr(self, "event"), ptr(later, "event"), ms))
  if not ok then return nil, err end
  return ms[0]
end
event_methods.free = free_event

function M.event()
  local out = ffi.new("ur_event *[1]")
  local ok, err = check(C.ur_event_new(out))
  if not ok then return nil, err end
  return wrap_event(out[0])
end

-- A timed span from now on `stream` (nil: the default one), as the benchmarks time: between two
-- events where `events` (a GPU's work, timed where it runs), else by the host's clock.  The
-- function returned gives its seconds so far, each call ending it anew (waiting for the work
-- enqueued before it).
function M.span(stream, events)
  local t0 = C.ur_clock_seconds()
  if not events then return function() return C.ur_clock_seconds() - t0 end end
  local e0, e1 = assert(M.event()), assert(M.event())
  assert(e0:record(stream))
  return function()
    assert(e1:record(stream))
    assert(e1:sync())
    return e0:elapsed(e1) / 1e3
  end
end

-- fn(i) called `runs` times (i = 1, 2, ...), each call timed between two events on `stream`
-- (nil: the default one; the CPU backend's events read the host's clock), as the benchmarks
-- time a step: the median of the milliseconds (the mean of the middle two for an even count)
-- and the list of them in call order.  Warm-up and a sync before it are the caller's.
function M.median_ms(fn, runs, stream)
  lib.whole(runs, "median_ms: runs", 2, 1)
  local e0, e1 = assert(M.event()), assert(M.event())
  local times = {}
  for i = 1, runs do
    assert(e0:record(stream))
    fn(i)
    assert(e1:record(stream))
    assert(e1:sync())
    times[i] = assert(e0:elapsed(e1))
  end
  e0:free()
  e1:free()
  local s = {} -- a copy to sort (unpack fails past LuaJIT's ~8000 values)
  for i = 1, runs do s[i] = times[i] end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2, times
end

-- Graphs (uvmrec.h, ur_graph_*): the work of the calls between graph_begin(stream) and
-- graph_end(stream, g) captured once (g: an earlier graph to update, or nil) and run; g:launch
-- replays it.  Without a GPU the calls run as they are made and graph_end returns nil.
local graph_methods = {}
local wrap_graph, free_graph = lib.handle_type("ur_graph", C.ur_graph_free, { __index = graph_methods })

function graph_methods:launch(stream)
  return check(C.ur_graph_launch(ptr(self, "graph"), M.handle(stream)))
end
graph_methods.free = free_graph

function M.graph_begin(stream)
  return check(C.ur_graph_begin(M.handle(stream)))
end

local graph_out = ffi.new("ur_graph *[1]")
-- The graph (g itself when given), or nil without a GPU; nil, message when the capture broke
-- (g, if given, is kept).
function M.graph_end(stream, g)
  graph_out[0] = g and ptr(g, "graph") or nil
  local ok, err = check(C.ur_graph_end(M.handle(stream), graph_out))
  if not ok then return nil, err end
  if g or graph_out[0] == nil then return g end
  return wrap_graph(graph_out[0])
end

return M
