-- uvmrec.nn.CrossNet: DCNv2's cross network, x_{l+1} = x0 * (W_l x_l + b_l) + x_l for
-- l = 1..L with x_1 = x0, on [rows, d].  Full rank: W_l [d, d] (parameters weight_l, bias_l);
-- low rank r: W_l = U_l V_l with U_l [d, r] and V_l [r, d] (U_l, V_l, bias_l), as in the
-- DCNv2 paper's mixture-free form.  The products are Linear's (cuBLASLt on the GPU), the
-- elementwise rest one fused kernel each way.
local lib = require "uvmrec.lib"
local Module = require "uvmrec.nn.Module"
local dense = require "uvmrec.dense"

local CrossNet = Module:extend("CrossNet")

-- The most layers a CrossNet takes: each is parameters, buffers and kernels of its own, built in
-- a loop (DCNv2 stacks a few; 2^40 layers looped, allocating, without an end).
CrossNet.MAX_LAYERS = 65536

-- CrossNet(d, layers, {rank = r (low rank; default full), seed = n})
function CrossNet:__init(d, layers, opts)
  Module.__init(self)
  opts = Module.options("CrossNet", opts, { rank = "number", seed = "number" }, 3)
  lib.whole(d, "CrossNet: d", 3, 1)
  lib.whole(layers, "CrossNet: layers", 3, 1, CrossNet.MAX_LAYERS)
  if opts.rank then
    lib.whole(opts.rank, "CrossNet: rank", 3, 1)
    Module.check_elements("CrossNet", d * opts.rank, "U [d, rank]", 3, "d %.0f and rank %.0f", d, opts.rank)
  else
    Module.check_elements("CrossNet", d * d, "weight [d, d]", 3, "d %.0f", d)
  end
  self.d, self.layers, self.rank = d, layers, opts.rank
  local seed = Module.seed_option("CrossNet", opts.seed, 3)
  for l = 1, layers do
    local s = seed + 10 * l
    if self.rank then
      local r = self.rank
      self:register_parameter("V_" .. l, { r, d }):normal(0, math.sqrt(2 / (r + d)), s)
      self:register_parameter("U_" .. l, { d, r }):normal(0, math.sqrt(2 / (r + d)), s + 1)
    else
      self:register_parameter("weight_" .. l, { d, d }):normal(0, math.sqrt(1 / d), s)
    end
    -- biases start at 0, as TorchRec's CrossNet and LowRankCrossNet (the DLRMv2 reference's) do:
    -- a random b_l would add x0 * b_l, noise as large as the input, to every layer's first output
    self:register_parameter("bias_" .. l, { d }):fill(0)
  end
end

local function flags(self)
  return (self.precision == "tf32" and dense.TF32 or 0) + ((self.row0 or 0) % 256) * dense.ROW0
end

function CrossNet:updateOutput(input)
  self:tensor_arg(input, "input", 2)
  local _, cols = Module.rows_cols(input)
  if cols ~= self.d or input:dim() ~= 2 then
    error(("%s: input is [%s]; expected [rows, %d]"):format(tostring(self), table.concat(input:size(), ", "),
                                                           self.d), 2)
  end
  local x0 = self:as_act(input, "input")
  local rows = Module.rows_cols(x0)
  local dt, d, st, f = self:act_dtype(), self.d, self.stream, flags(self)
  self._x0 = x0
  local xl = x0
  for l = 1, self.layers do
    local z = self:buffer("z" .. l, dt, rows, d)
    if self.rank then
      local t = self:buffer("t" .. l, dt, rows, self.rank)
      dense.linear_forward(xl, self:param("V_" .. l), nil, t, "none", f, st)
      dense.linear_forward(t, self:param("U_" .. l), self:param("bias_" .. l), z, "none", f, st)
    else
      dense.linear_forward(xl, self:param("weight_" .. l), self:param("bias_" .. l), z, "none", f, st)
    end
    local y = self:buffer("x" .. (l + 1), dt, rows, d)
    dense.cross_forward(x0, z, xl, y, st)
    xl = y
  end
  self.output = xl
  return xl
end

-- Walks the layers back; the gradient of x_l lands in ping-pong buffers, and that of x0
-- (through every layer's x0 * z term and the first layer's x_l) accumulates in gx0.  Only the
-- parameters' (params_only) leaves gradInput as it was.  Always a tail call: errors name the
-- line that called backward, updateGradInput or accGradParameters.
function CrossNet:_backward(input, gradOutput, want_params, params_only)
  local x0 = self._x0
  if not x0 then error(tostring(self) .. ": backward before forward", 2) end
  local rows = Module.rows_cols(x0)
  local dt, d, st, f, L = self:act_dtype(), self.d, self.stream, flags(self), self.layers
  local gx0 = self:buffer("gx0", dt, rows, d)
  local gz = self:buffer("gz", dt, rows, d)
  local g = self:as_act(self:tensor_arg(gradOutput, "gradOutput", 2), "gy")
  for l = L, 1, -1 do
    local xl = l > 1 and self:buffer("x" .. l, dt, rows, d) or x0
    local z = self:buffer("z" .. l, dt, rows, d)
    local gxl = l > 1 and self:buffer(l % 2 == 0 and "gA" or "gB", dt, rows, d) or nil
    self:op(2, dense.cross_backward, x0, z, g, gz, gx0, gxl, l < L and dense.ACCUMULATE or 0, st)
    local gin = gxl or gx0
    local acc = f + dense.ACCUMULATE
    local gb = want_params and self["grad_bias_" .. l] or nil
    if self.rank then
      local t = self:buffer("t" .. l, dt, rows, self.rank)
      local gt = self:buffer("gt", dt, rows, self.rank)
      dense.linear_backward(t, self:param("U_" .. l), nil, gz, gt,
                            want_params and self["grad_U_" .. l] or nil, gb, nil, "none", f, st)
      dense.linear_backward(xl, self:param("V_" .. l), nil, gt, gin,
                            want_params and self["grad_V_" .. l] or nil, nil, nil, "none", acc, st)
    else
      dense.linear_backward(xl, self:param("weight_" .. l), nil, gz, gin,
                            want_params and self["grad_weight_" .. l] or nil, gb, nil, "none", acc, st)
    end
    g = gxl
  end
  if params_only then return self.gradInput end
  self.gradInput = gx0
  if Module.dtype_of(input) ~= dt then
    local r, c = Module.rows_cols(input)
    self.gradInput = dense.cast(gx0, self:buffer("gradInput", Module.dtype_of(input), r, c), st)
  end
  return self.gradInput
end

function CrossNet:backward(input, gradOutput)
  return self:_backward(input, gradOutput, true)
end

function CrossNet:updateGradInput(input, gradOutput)
  return self:_backward(input, gradOutput, false)
end

-- The parameters' gradients need the same walk: it is done again (backward does both at once).
function CrossNet:accGradParameters(input, gradOutput)
  return self:_backward(input, gradOutput, true, true)
end

function CrossNet:extra_repr()
  return ("(%d, %d layers%s)"):format(self.d, self.layers,
                                      self.rank and (", rank " .. self.rank) or "")
end

return CrossNet
