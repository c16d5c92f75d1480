-- uvmrec.nn.Linear: y = x W^T + b, optionally followed by a ReLU fused into the matrix
-- product's epilogue (cuBLASLt on the GPU).  W is [out, in] and b [out], initialised as the
-- public DLRM code does: W ~ N(0, sqrt(2 / (in + out))), b ~ N(0, sqrt(1 / out)).
local lib = require "uvmrec.lib"
local Module = require "uvmrec.nn.Module"
local dense = require "uvmrec.dense"

local Linear = Module:extend("Linear")
Linear.fuses_relu = true -- a ReLU after it runs in its epilogue (Sequential:add)

local OPTS = { bias = "boolean", act = "string", input_grad = "boolean", seed = "number", pad_to = "number" }

-- Linear(in, out, {bias = true, act = "none" | "relu", input_grad = true, seed = n, pad_to = 1}).
-- input_grad = false skips the input's gradient (a first layer fed by data).  pad_to = 8 makes
-- the layer read inputs padded with zero columns to a multiple of 8 (a padded interaction's
-- output; pad_to is at most 256): W is then [out, in_width] with zero columns past in, drawn as the unpadded layer's,
-- so the layer computes the same numbers on aligned rows (its gradient there stays zero).
function Linear:__init(inf, outf, opts)
  Module.__init(self)
  lib.whole(inf, "Linear: in", 3, 1)
  lib.whole(outf, "Linear: out", 3, 1)
  opts = Module.options("Linear", opts, OPTS, 3)
  if opts.act ~= nil and opts.act ~= "none" and opts.act ~= "relu" then
    error("Linear: act must be none or relu, got " .. tostring(opts.act), 3)
  end
  local pad = opts.pad_to or 1
  -- the padding, below pad_to, is at most the engine's UR_DENSE_PAD_MAX columns (pad_to = 300 made
  -- flags the linear ops refused at the first forward, and 2^16 + 8 wrapped into other bits)
  lib.whole(pad, "Linear: pad_to", 3, 1, lib.C.UR_DENSE_PAD_MAX + 1)
  self.in_features, self.out_features = inf, outf
  self.in_width = math.ceil(inf / pad) * pad
  Module.check_elements("Linear", outf * self.in_width, "weight [out, in]", 3,
                        self.in_width == inf and "in %.0f and out %.0f" or "in %.0f (padded to %.0f) and out %.0f",
                        inf, self.in_width == inf and outf or self.in_width, outf)
  self.act = opts.act or "none"
  self.input_grad = opts.input_grad ~= false
  local seed = Module.seed_option("Linear", opts.seed, 3)
  local w = self:register_parameter("weight", { outf, self.in_width })
  if self.in_width == inf then
    w:normal(0, math.sqrt(2 / (inf + outf)), seed)
  else
    local ur_tensor = require "uvmrec.tensor"
    local drawn = assert(ur_tensor.tensor({ outf, inf })):normal(0, math.sqrt(2 / (inf + outf)), seed)
    local zeros = assert(ur_tensor.tensor({ outf, self.in_width - inf })):fill(0)
    dense.concat({ drawn, zeros }, w)
    drawn:free()
    zeros:free()
  end
  if opts.bias ~= false then
    self:register_parameter("bias", { outf }):normal(0, math.sqrt(1 / outf), seed + 1)
  end
end

-- row0: this batch's first row in a larger batch (set by uvmrec.dist.ddp on data-parallel ranks).
function Linear:flags()
  return (self.precision == "tf32" and dense.TF32 or 0) + dense.pad(self.in_width - self.in_features)
         + ((self.row0 or 0) % 256) * dense.ROW0
end

function Linear:updateOutput(input)
  self:tensor_arg(input, "input", 2)
  local rows, cols = Module.rows_cols(input)
  if cols ~= self.in_width or input:dim() ~= 2 then
    error(("Linear(%d -> %d): input is [%s]; expected [rows, %d]"):format(
      self.in_features, self.out_features, table.concat(input:size(), ", "), self.in_width), 2)
  end
  local x = self:as_act(input, "input")
  self._x = x
  self.output = self:buffer("output", self:act_dtype(), rows, self.out_features)
  dense.linear_forward(x, self:param("weight"), self:param("bias"), self.output, self.act,
                       self:flags(), self.stream)
  return self.output
end

-- The one backward call; want_input / want_params select what it computes.  In a full
-- backward (both), a Linear reading a fused Linear + ReLU (self.below, linked by Sequential)
-- masks its input's gradient by its input, that ReLU's output (X_RELU), and adds that layer's
-- bias gradient in the same pass; that layer then takes the gradient as already masked
-- (GY_MASKED).  No mask's bits are kept: the input says which units passed.
-- With async_wgrad (set by the model), the weight gradient goes to a side stream on the GPU,
-- which the model joins (dense.join) before the optimizer reads it.
function Linear:_backward(input, gradOutput, want_input, want_params)
  local x = self._x
  if not x then error(tostring(self) .. ": backward before forward", 2) end
  local rows = Module.rows_cols(x)
  local dt = self:act_dtype()
  gradOutput = self:as_act(self:tensor_arg(gradOutput, "gradOutput", 2), "gy")
  local gx
  if want_input and self.input_grad then gx = self:buffer("gx", dt, rows, self.in_width) end
  local flags = self:flags()
  local masked = self._gy_masked
  local work, y, gb = nil, self.output, want_params and self.grad_bias or nil
  if masked then
    flags, y, gb = flags + dense.GY_MASKED, nil, nil
  elseif self.act == "relu" then
    work = self:buffer("work", dt, rows, self.out_features)
  end
  if want_params and self.async_wgrad then flags = flags + dense.WGRAD_ASYNC end
  local below = self.below
  local masks = below and gx and want_params and below.act == "relu"
  if masks then
    self._bopts = self._bopts or {}
    self._bopts.flags, self._bopts.gb_x = flags + dense.X_RELU, below.grad_bias
    flags = self._bopts
  end
  self:op(2, dense.linear_backward, x, self:param("weight"), y, gradOutput, gx,
          want_params and self.grad_weight or nil, gb, work, self.act, flags, self.stream)
  -- only once the call succeeded: a failed one leaves both layers as they were
  self._gy_masked = false
  if masks then below._gy_masked = true end
  if want_input then
    if gx and Module.dtype_of(input) ~= dt then
      local r, c = Module.rows_cols(input)
      gx = dense.cast(gx, self:buffer("gradInput", Module.dtype_of(input), r, c), self.stream)
    end
    self.gradInput = gx
  end
  return self.gradInput
end

function Linear:updateGradInput(input, gradOutput)
  return self:_backward(input, gradOutput, true, false)
end

-- a tail call, so that _backward's errors point at the line that called this (it returns the
-- gradInput it leaves as it was)
function Linear:accGradParameters(input, gradOutput)
  return self:_backward(input, gradOutput, false, true)
end

function Linear:backward(input, gradOutput)
  return self:_backward(input, gradOutput, true, true)
end

function Linear:extra_repr()
  local s = ("(%d -> %d"):format(self.in_features, self.out_features)
  if self.in_width ~= self.in_features then s = s .. (", input padded to %d"):format(self.in_width) end
  if not self.grad_bias then s = s .. ", no bias" end
  if self.act ~= "none" then s = s .. ", +" .. self.act end
  if self.precision ~= "f32" then s = s .. ", " .. self.precision end
  return s .. ")"
end

return Linear
