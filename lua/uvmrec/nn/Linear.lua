-- uvmrec.nn.Linear: y = x W^T + b, optionally followed by a ReLU fused into the matrix
-- product's epilogue (cuBLASLt on the GPU).  W is [out, in] and b [out], initialised as the
-- public DLRM code does: W ~ N(0, sqrt(2 / (in + out))), b ~ N(0, sqrt(1 / out)).
local Module = require "uvmrec.nn.Module"
local dense = require "uvmrec.dense"

local Linear = Module:extend("Linear")
Linear.fuses_relu = true -- a ReLU after it runs in its epilogue (Sequential:add)

local function count(v, what)
  if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
    error("Linear: " .. what .. " must be a whole number >= 1, got " .. tostring(v), 4)
  end
end

-- Linear(in, out, {bias = true, act = "none" | "relu", input_grad = true, seed = n}).
-- input_grad = false skips the input's gradient (a first layer fed by data).
function Linear:__init(inf, outf, opts)
  Module.__init(self)
  count(inf, "in")
  count(outf, "out")
  opts = opts or {}
  if opts.act ~= nil and opts.act ~= "none" and opts.act ~= "relu" then
    error("Linear: act must be none or relu, got " .. tostring(opts.act), 3)
  end
  self.in_features, self.out_features = inf, outf
  self.act = opts.act or "none"
  self.input_grad = opts.input_grad ~= false
  local seed = opts.seed or Module.next_seed()
  self:register_parameter("weight", { outf, inf }):normal(0, math.sqrt(2 / (inf + outf)), seed)
  if opts.bias ~= false then
    self:register_parameter("bias", { outf }):normal(0, math.sqrt(1 / outf), seed + 1)
  end
end

-- row0: this batch's first row in a larger batch (set by uvmrec.dist.ddp on data-parallel ranks).
function Linear:flags()
  return (self.precision == "tf32" and dense.TF32 or 0) + ((self.row0 or 0) % 256) * dense.ROW0
end

function Linear:updateOutput(input)
  local rows, cols = Module.rows_cols(input)
  if cols ~= self.in_features then
    error(("Linear(%d -> %d): input is [%d, %d]; expected [rows, %d]"):format(
      self.in_features, self.out_features, rows, cols, self.in_features), 3)
  end
  local x = self:as_act(input, "input")
  self._x = x
  self.output = self:buffer("output", self:act_dtype(), rows, self.out_features)
  dense.linear_forward(x, self:param("weight"), self:param("bias"), self.output, self.act,
                       self:flags(), self.stream)
  return self.output
end

-- The one backward call; want_input / want_params select what it computes.
function Linear:_backward(input, gradOutput, want_input, want_params)
  local x = self._x
  local rows = Module.rows_cols(x)
  local dt = self:act_dtype()
  local gx
  if want_input and self.input_grad then gx = self:buffer("gx", dt, rows, self.in_features) end
  local work = self.act == "relu" and self:buffer("work", dt, rows, self.out_features) or nil
  dense.linear_backward(x, self:param("weight"), self.output, gradOutput, gx,
                        want_params and self.grad_weight or nil,
                        want_params and self.grad_bias or nil, work, self.act, self:flags(),
                        self.stream)
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

function Linear:accGradParameters(input, gradOutput)
  self:_backward(input, gradOutput, false, true)
end

function Linear:backward(input, gradOutput)
  return self:_backward(input, gradOutput, true, true)
end

function Linear:extra_repr()
  local s = ("(%d -> %d"):format(self.in_features, self.out_features)
  if not self.grad_bias then s = s .. ", no bias" end
  if self.act ~= "none" then s = s .. ", +" .. self.act end
  if self.precision ~= "f32" then s = s .. ", " .. self.precision end
  return s .. ")"
end

return Linear
