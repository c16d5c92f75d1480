-- uvmrec.nn: modules in torch7's nn style (`ur.nn.Linear(13, 512)`).  Each class lives in
-- lua/uvmrec/nn/<Name>.lua and is loaded on first use, so adding a module needs no edit here.
-- Classes are looked up in package.loaded on every access rather than kept here, so this table
-- and the modules' own requires agree even where package.loaded is reset (busted does so
-- between spec files).
return setmetatable({}, {
  __index = function(_, name)
    if type(name) ~= "string" or not name:match("^%u[%w_]*$") then return nil end
    local key = "uvmrec.nn." .. name
    local cls = package.loaded[key]
    if cls then return cls end
    if not package.searchpath(key, package.path) then return nil end
    return require(key)
  end,
})
