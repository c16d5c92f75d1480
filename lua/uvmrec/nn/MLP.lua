-- uvmrec.nn.MLP(sizes, opts): a Sequential of Linear layers with fused ReLUs, as DLRM's bottom
-- and top MLPs: MLP({13, 512, 256, 128}) is 13 -> 512 -> 256 -> 128 with a ReLU after each
-- layer.  opts.last = "relu" (default), "none" or "sigmoid" says what follows the last layer;
-- opts.input_grad = false skips the gradient of the MLP's input (fed by data); opts.pad_to = 8
-- makes the first layer read an input padded to a multiple of 8 columns (nn.Linear).
local lib = require "uvmrec.lib"
local Linear = require "uvmrec.nn.Linear"
local Module = require "uvmrec.nn.Module"
local ReLU = require "uvmrec.nn.ReLU"
local Sequential = require "uvmrec.nn.Sequential"
local Sigmoid = require "uvmrec.nn.Sigmoid"

return function(sizes, opts)
  opts = Module.options("MLP", opts, { last = "string", input_grad = "boolean", pad_to = "number" }, 2)
  if type(sizes) ~= "table" or #sizes < 2 then
    error("MLP: sizes must list at least an input and an output width", 2)
  end
  -- here, not in the Linear that takes it: its message named neither the MLP nor the size
  for i = 1, #sizes do lib.whole(sizes[i], ("MLP: sizes[%d]"):format(i), 2, 1) end
  local last = opts.last or "relu"
  if last ~= "relu" and last ~= "none" and last ~= "sigmoid" then
    error("MLP: last must be relu, none or sigmoid, got " .. tostring(last), 2)
  end
  local m = Sequential()
  for i = 1, #sizes - 1 do
    m:add(Linear(sizes[i], sizes[i + 1], { input_grad = i > 1 or opts.input_grad ~= false,
                                            pad_to = i == 1 and opts.pad_to or nil }))
    if i < #sizes - 1 or last == "relu" then m:add(ReLU())
    elseif last == "sigmoid" then m:add(Sigmoid()) end
  end
  return m
end
