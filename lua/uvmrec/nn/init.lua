-- uvmrec.nn: modules in torch7's nn style (`ur.nn.Linear(13, 512)`).  Each class lives in
-- lua/uvmrec/nn/<Name>.lua and is loaded on first use, so adding a module needs no edit here.
-- __names lists them without loading any (the REPL completes and prints `ur.nn` with it).
return setmetatable({}, {
  __index = function(nn, name)
    if type(name) ~= "string" or not name:match("^%u[%w_]*$") then return nil end
    local key = "uvmrec.nn." .. name
    if not package.searchpath(key, package.path) then return nil end
    local cls = require(key)
    rawset(nn, name, cls)
    return cls
  end,
  __names = function()
    local here = package.searchpath("uvmrec.nn.Module", package.path)
    local files = here and require("uvmrec.lib").dir_list(here:match("^(.*)/[^/]*$"), "", ".lua") or {}
    local out = {}
    for _, f in ipairs(files) do out[#out + 1] = f:match("^(%u[%w_]*)%.lua$") end
    return out
  end,
})
