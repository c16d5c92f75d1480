-- uvmrec.nn: modules in torch7's nn style (`ur.nn.Linear(13, 512)`).  Each class lives in
-- lua/uvmrec/nn/<Name>.lua and is loaded on first use, so adding a module needs no edit here.
local nn = { Module = require "uvmrec.nn.Module" }

return setmetatable(nn, {
  __index = function(t, name)
    if type(name) ~= "string" or not name:match("^%u[%w_]*$") then return nil end
    if not package.searchpath("uvmrec.nn." .. name, package.path) then return nil end
    local cls = require("uvmrec.nn." .. name)
    rawset(t, name, cls)
    return cls
  end,
})
