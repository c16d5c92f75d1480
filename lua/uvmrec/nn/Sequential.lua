-- uvmrec.nn.Sequential: children applied one after another.  A ReLU added right after a Linear
-- is fused into it (the Linear applies it in its epilogue; the ReLU passes through), and a
-- Linear reading such a pair masks the gradient it passes down by that ReLU's output, the
-- Linear's input (nn.Linear: below).  An error in a child is raised with the child's index
-- and type in front.
local Module = require "uvmrec.nn.Module"

local Sequential = Module:extend("Sequential")

function Sequential:__init(...)
  Module.__init(self)
  self.modules = {}
  for i = 1, select("#", ...) do self:add((select(i, ...))) end
end

function Sequential:add(m)
  if not Module.is(m, Module) then error("Sequential:add: expected a module, got " .. tostring(m), 2) end
  local prev = self.modules[#self.modules]
  if m.is_relu and prev and prev.fuses_relu and prev.act == "none" then
    prev.act = "relu"
    m.fused = true
  end
  if m.fuses_relu and prev and prev.is_relu and prev.fused then
    m.below = self.modules[#self.modules - 1]
  end
  self.modules[#self.modules + 1] = m
  -- One arena per model; a child placed elsewhere keeps its own until the model's to().
  if m.placement == self.placement and m.device == self.device then m:share_arena(self) end
  return self
end

function Sequential:get(i) return self.modules[i] end
function Sequential:size() return #self.modules end

-- m[fn](m, ...) for child i; its error is raised again with the child's index and type in
-- front, stripped of the "file:line: " that error() put there, so one location is shown: the
-- caller's.
local function child_call(i, m, fn, ...)
  local ok, out = pcall(m[fn], m, ...)
  if not ok then
    local msg = tostring(out):gsub("^[^\n]-:%d+: ", "")
    error(("Sequential: (%d) %s: %s"):format(i, m:type_name(), msg), 3)
  end
  return out
end

function Sequential:updateOutput(input)
  local x = input
  local mods = self.modules
  for i = 1, #mods do x = child_call(i, mods[i], "forward", x) end
  self.output = x
  return x
end

function Sequential:_backward(input, gradOutput, fn)
  local mods = self.modules
  local g = gradOutput
  for i = #mods, 1, -1 do
    local x = i > 1 and mods[i - 1].output or input
    g = child_call(i, mods[i], fn, x, g)
  end
  self.gradInput = g
  return g
end

function Sequential:backward(input, gradOutput)
  return self:_backward(input, gradOutput, "backward")
end

function Sequential:updateGradInput(input, gradOutput)
  return self:_backward(input, gradOutput, "updateGradInput")
end

-- Runs after updateGradInput: each child's input and gradOutput are where they were left.
function Sequential:accGradParameters(input, gradOutput)
  local mods = self.modules
  for i = #mods, 1, -1 do
    local x = i > 1 and mods[i - 1].output or input
    local g = i < #mods and mods[i + 1].gradInput or gradOutput
    child_call(i, mods[i], "accGradParameters", x, g)
  end
end

function Sequential:tostring()
  local lines = { self:type_name() .. " {" }
  for i, m in ipairs(self.modules) do
    local s = tostring(m):gsub("\n", "\n  ")
    lines[#lines + 1] = ("  (%d): %s"):format(i, s)
  end
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n")
end

return Sequential
