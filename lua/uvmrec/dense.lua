-- uvmrec.dense: the dense ops of the engine on tensors (linear, activations, interaction,
-- cross layers, concat/split, BCE loss, mean, cast, optimizer step).  The nn modules are
-- built on these; they are exposed for scripts and specs.  Every failure raises (a bad shape
-- or dtype at the caller's line; a device failure with CUDA's message).  The stream is the
-- last argument, optional.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local streams = require "uvmrec.stream"
local C, must = lib.C, lib.must

local M = {}

M.ACT = { none = 0, relu = 1, sigmoid = 2 }
M.REDUCTION = { mean = 0, sum = 1, none = 2 }
M.TF32, M.ACCUMULATE, M.GY_MASKED, M.WGRAD_ASYNC = C.UR_DENSE_TF32, C.UR_DENSE_ACCUMULATE,
  C.UR_DENSE_GY_MASKED, C.UR_DENSE_WGRAD_ASYNC
-- linear_backward: x is the layer below's ReLU output; gx is masked by it (x > 0 or NaN)
M.X_RELU = C.UR_DENSE_X_RELU
-- flags + M.pad(n): the last n (0 to UR_DENSE_PAD_MAX, 255) columns of x and w are zero padding.
local PAD_MAX = C.UR_DENSE_PAD_MAX
function M.pad(n)
  lib.whole(n, "dense.pad: n", 2, 0, PAD_MAX) -- a larger n ran into the flags' other bits
  return n * 2 ^ C.UR_DENSE_PAD_SHIFT
end
-- flags + row0 % 256 * M.ROW0: the rows' first one is row row0 of a larger batch (data-parallel
-- ranks), so the CPU computes each as it computes that row of the whole batch
M.ROW0 = 2 ^ C.UR_DENSE_ROW0_SHIFT

local function act_of(a)
  local v = M.ACT[a or "none"]
  if not v then error("dense: activation '" .. tostring(a) .. "' is not none, relu or sigmoid", 3) end
  return v
end

local function P(t) return t and t.p or nil end
local function S(s)
  local p = streams.handle(s, 3) -- not a tail call: lib.ptr
  return p
end

-- y = act(x w^T + b); act "none" or "relu"; flags: dense.TF32, dense.pad(n), or a table
-- {flags = n, mask = u8 tensor} whose mask receives y > 0 (relu; ur_linear_mask_cols bytes a row).
function M.linear_forward(x, w, b, y, act, flags, stream)
  local mask
  if type(flags) == "table" then flags, mask = flags.flags, flags.mask end
  must(C.ur_linear_forward(S(stream), P(x), P(w), P(b), P(y), P(mask), act_of(act), flags or 0))
  return y
end

-- gx = g w (+= with dense.ACCUMULATE), gw += g^T x, gb += sum(g); g = gy masked by y > 0 under
-- relu (work receives it), or gy itself with dense.GY_MASKED.  gx, gw, gb may be nil.  flags
-- may be a table {flags = n, x_mask =, gb_x =}: gx is then masked by x_mask (the layer below's
-- forward mask), or by x itself with dense.X_RELU in flags (no mask), and gb_x += its column
-- sums (uvmrec.h, ur_linear_backward).
function M.linear_backward(x, w, y, gy, gx, gw, gb, work, act, flags, stream)
  local x_mask, gb_x
  if type(flags) == "table" then flags, x_mask, gb_x = flags.flags, flags.x_mask, flags.gb_x end
  must(C.ur_linear_backward(S(stream), P(x), P(w), P(y), P(gy), P(x_mask), P(gx), P(gw), P(gb),
                            P(gb_x), P(work), act_of(act), flags or 0))
  return gx
end

function M.mask_cols(out) return tonumber(C.ur_linear_mask_cols(out)) end

-- The GPU workspace bytes a linear_backward call needs (uvmrec.h, ur_linear_backward_workspace)
-- on its stream and on its weight gradients' side stream (0 where it runs nothing), for x [rows,
-- inw] and gy [rows, out], given = {gx =, gw =, gb =, x_mask =} (true where the call passes
-- one), act and flags as linear_backward takes them, on a GPU of sms multiprocessors.
local ws_out = ffi.new("uint64_t[2]")
function M.linear_backward_workspace(rows, inw, out, given, act, flags, sms)
  local function bit(v) return v and 1 or 0 end
  must(C.ur_linear_backward_workspace(rows, inw, out, bit(given.gx), bit(given.gw), bit(given.gb),
                                      bit(given.x_mask), ws_out, ws_out + 1, act_of(act),
                                      flags or 0, sms))
  return tonumber(ws_out[0]), tonumber(ws_out[1])
end

-- Work on stream after this waits for the weight gradients of dense.WGRAD_ASYNC backward calls.
function M.join(stream)
  must(C.ur_dense_join(S(stream)))
end

function M.act_forward(x, y, act, stream)
  must(C.ur_act_forward(S(stream), P(x), P(y), act_of(act)))
  return y
end

function M.act_backward(y, gy, gx, act, stream)
  must(C.ur_act_backward(S(stream), P(y), P(gy), P(gx), act_of(act)))
  return gx
end

-- Output columns of an interaction of T tables of width d: d + P, or with padded that rounded
-- up to a multiple of 8 (the padding zero, its gradient ignored); 0 when T or d is 0.
function M.interaction_width(T, d, self_interaction, padded)
  -- counts the engine takes as int32s (the FFI would truncate 2.5 to 2 and wrap 2^32 + 3 to 3)
  lib.whole(T, "interaction_width: T", 2, 0, 2147483647)
  lib.whole(d, "interaction_width: d", 2, 0, 2147483647)
  return tonumber(C.ur_interaction_cols(T, d, self_interaction and 1 or 0, padded and 1 or 0))
end

-- out [rows, interaction_width(T, d, self, padded?)]; flags: dense.TF32.
function M.interaction_forward(dense, emb, out, self_interaction, flags, stream)
  must(C.ur_interaction_forward(S(stream), P(dense), P(emb), P(out), self_interaction and 1 or 0,
                                flags or 0))
  return out
end

function M.interaction_backward(dense, emb, gout, gdense, gemb, self_interaction, flags, stream)
  must(C.ur_interaction_backward(S(stream), P(dense), P(emb), P(gout), P(gdense), P(gemb),
                                 self_interaction and 1 or 0, flags or 0))
end

function M.cross_forward(x0, z, xl, y, stream)
  must(C.ur_cross_forward(S(stream), P(x0), P(z), P(xl), P(y)))
  return y
end

function M.cross_backward(x0, z, gy, gz, gx0, gxl, flags, stream)
  must(C.ur_cross_backward(S(stream), P(x0), P(z), P(gy), P(gz), P(gx0), P(gxl), flags or 0))
end

-- The FFI does not add const below the first level by itself: the casts are made once.
local parts_buf, parts_in, parts_out, parts_cap = nil, nil, nil, 0
local function parts_of(parts)
  local n = #parts
  if n > parts_cap then
    parts_cap = math.max(n, 2 * parts_cap, 16)
    parts_buf = ffi.new("ur_tensor *[?]", parts_cap)
    parts_in = ffi.cast("const ur_tensor *const *", parts_buf)
    parts_out = ffi.cast("ur_tensor *const *", parts_buf)
  end
  for i = 1, n do parts_buf[i - 1] = P(parts[i]) end
  return n
end

-- out = the parts (a list of [rows, w_i] tensors) side by side; split undoes it.
function M.concat(parts, out, stream)
  local n = parts_of(parts)
  must(C.ur_features_concat(S(stream), parts_in, n, P(out)))
  return out
end

function M.split(input, parts, stream)
  local n = parts_of(parts)
  must(C.ur_features_split(S(stream), P(input), parts_out, n))
  return parts
end

local function reduction_of(r)
  local v = M.REDUCTION[r or "mean"]
  if not v then error("bce: reduction '" .. tostring(r) .. "' is not mean, sum or none", 3) end
  return v
end

function M.bce_forward(logits, targets, weights, loss, reduction, stream)
  must(C.ur_bce_forward(S(stream), P(logits), P(targets), P(weights), P(loss), reduction_of(reduction)))
  return loss
end

function M.bce_backward(logits, targets, weights, glogits, reduction, scale, stream)
  must(C.ur_bce_backward(S(stream), P(logits), P(targets), P(weights), P(glogits),
                         reduction_of(reduction), scale or 1))
  return glogits
end

function M.mean(x, out, stream)
  must(C.ur_dense_mean(S(stream), P(x), P(out)))
  return out
end

-- dst = src converted between f32 and bf16 (or copied).
function M.cast(src, dst, stream)
  must(C.ur_dense_cast(S(stream), P(src), P(dst)))
  return dst
end

return M
