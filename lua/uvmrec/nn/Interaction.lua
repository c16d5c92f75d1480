-- uvmrec.nn.Interaction: DLRM's dot interaction.  Input {dense, emb}: the bottom MLP's output
-- [rows, d] and the pooled embeddings [rows, T*d] (f32 or bf16 each); output [rows, d + P],
-- dense followed by the P = (T+1)T/2 dot products of distinct vectors, lower triangle, i-major
-- (with self_interaction also each vector with itself: P = (T+1)(T+2)/2); with pad, zero
-- columns up to a multiple of 8 follow (a next Linear built with pad_to = 8 reads aligned rows;
-- the padding's gradient is ignored).  One fused kernel each way on the GPU (tensor cores for
-- bf16, and for f32 under tf32 precision).  gradInput is {gdense, gemb}, each in its input's
-- dtype.
local Module = require "uvmrec.nn.Module"
local dense = require "uvmrec.dense"

local Interaction = Module:extend("Interaction")

-- Interaction({self_interaction = false, pad = false})
function Interaction:__init(opts)
  Module.__init(self)
  opts = Module.options("Interaction", opts, { self_interaction = "boolean", pad = "boolean" }, 3)
  self.self_interaction = opts.self_interaction and true or false
  self.pad = opts.pad and true or false
end

function Interaction:flags()
  return self.precision == "tf32" and dense.TF32 or 0
end

local is_tensor = require("uvmrec.tensor").is_tensor
-- level: as error's from the caller of parts
local function parts(input, level)
  if type(input) ~= "table" or not is_tensor(input[1]) or not is_tensor(input[2]) then
    error("Interaction: input must be {dense [rows, d], emb [rows, T*d]}, two tensors", level + 1)
  end
  return input[1], input[2]
end

function Interaction:updateOutput(input)
  local d, e = parts(input, 2) -- forward's tail call left no frame: 2 is its caller
  self:follow(d)
  local rows, width = Module.rows_cols(d)
  local _, ecols = Module.rows_cols(e)
  local T = math.floor(ecols / math.max(width, 1))
  self.output = self:buffer("output", self:act_dtype(), rows,
                            dense.interaction_width(T, width, self.self_interaction, self.pad))
  self:op(2, dense.interaction_forward, d, e, self.output, self.self_interaction, self:flags(), self.stream)
  return self.output
end

function Interaction:updateGradInput(input, gradOutput)
  local d, e = parts(input, 3) -- called by Module.backward
  self:tensor_arg(gradOutput, "gradOutput", 3)
  local rows, width = Module.rows_cols(d)
  local _, ecols = Module.rows_cols(e)
  local gd = self:buffer("gdense", Module.dtype_of(d), rows, width)
  local ge = self:buffer("gemb", Module.dtype_of(e), rows, ecols)
  self:op(3, dense.interaction_backward, d, e, gradOutput, gd, ge, self.self_interaction, self:flags(),
          self.stream)
  self.gradInput = self.gradInput or {}
  self.gradInput[1], self.gradInput[2] = gd, ge
  return self.gradInput
end

function Interaction:extra_repr()
  local t = {}
  if self.self_interaction then t[#t + 1] = "self-interaction" end
  if self.pad then t[#t + 1] = "padded to 8" end
  return #t > 0 and "(" .. table.concat(t, ", ") .. ")" or ""
end

return Interaction
