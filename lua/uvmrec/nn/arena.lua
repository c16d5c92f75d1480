-- uvmrec.nn.arena: a model's arena, tensors carved from a few large blocks of one placement
-- (engine/src/dense/arena.c).  Modules take their activations and workspaces from it through
-- Module:buffer, so that a training step allocates nothing once the largest batch was seen.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local C = lib.C

local M = {}
local methods = {}

-- Blocks are this large unless one tensor needs more: few enough to be cheap, small enough
-- that the unused tail of the last block does not matter.
-- (The planner reads them: a model's arena on a GPU is at least one device block.)
local BLOCK = { host = 4 * 2 ^ 20, pinned = 4 * 2 ^ 20, device = 64 * 2 ^ 20, managed = 64 * 2 ^ 20 }
M.BLOCK = BLOCK

local wrap, free = lib.handle_type("ur_arena", C.ur_arena_free, {
  __index = methods,
  __tostring = function(a)
    if a.p == nil then return "arena (freed)" end
    local s = a:stats()
    return ("arena %d tensors in %d blocks, %.1f of %.1f MiB used"):format(
      s.tensors, s.blocks, s.used / 2 ^ 20, s.reserved / 2 ^ 20)
  end,
})

local out_buf = ffi.new("ur_tensor *[1]")

-- A tensor of shape (a list) and dtype (default f32) from the arena.  Environmental
-- failures (device memory, the HBM budget) raise too: a module cannot go on without it.  who
-- and key, if given, name the module and its buffer in that error ("Linear(13 -> 512): buffer
-- output [65536, 512] of bf16: hbm budget: ...").
function methods:tensor(shape, dtype, who, key)
  local d = lib.enum(C.ur_dtype_parse, "ur_dtype", dtype or "f32", "dtype", 2)
  -- ur.tensor's check: five sizes were written past a buffer of four, 2.5 cast to 2
  local dims, nd = tensor.parse_shape(shape, 2, "arena")
  local st = C.ur_arena_tensor(lib.ptr(self, "arena", 2), out_buf, d, nd, dims)
  if st ~= 0 then
    local msg = ffi.string(C.ur_last_error())
    if who then
      msg = ("%s: buffer %s [%s] of %s: %s"):format(tostring(who):match("^[^\n]*"), tostring(key),
                                                     table.concat(shape, ", "), dtype or "f32", msg)
    end
    error(msg, 2)
  end
  return tensor.wrap(out_buf[0])
end

local stats_buf = ffi.new("ur_arena_stats")
function methods:stats()
  C.ur_arena_stats_get(lib.ptr(self, "arena", 2), stats_buf)
  return { used = tonumber(stats_buf.used), reserved = tonumber(stats_buf.reserved),
           blocks = tonumber(stats_buf.blocks), tensors = tonumber(stats_buf.tensors) }
end

function methods:reset() C.ur_arena_reset(lib.ptr(self, "arena", 2)) end
methods.free = free

-- An arena of placement ("host", "pinned", "device", "managed") on device (a GPU ordinal;
-- -1 or nil for host memory).
function M.new(placement, device, block_bytes)
  local place = lib.enum(C.ur_place_parse, "ur_place", placement or "host", "placement", 2)
  if placement == "host" or placement == "pinned" or placement == nil then device = -1 end
  local out = ffi.new("ur_arena *[1]")
  lib.must(C.ur_arena_new(out, place, device or 0, block_bytes or BLOCK[placement or "host"]))
  return wrap(out[0])
end

return M
