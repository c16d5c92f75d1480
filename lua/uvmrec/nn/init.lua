-- uvmrec.nn: modules in torch7's nn style (`ur.nn.Linear(13, 512)`).  Each class lives in
-- lua/uvmrec/nn/<Name>.lua and is loaded on first use, so adding a module needs no edit here.
return setmetatable({}, {
  __index = function(nn, name)
    if type(name) ~= "string" or not name:match("^%u[%w_]*$") then return nil end
    local key = "uvmrec.nn." .. name
    if not package.searchpath(key, package.path) then return nil end
    local cls = require(key)
    rawset(nn, name, cls)
    return cls
  end,
})
