-- The REPL's Lua half: compiling what was typed (the `return <line>` trick, incomplete chunks),
-- printing results, and completion candidates.  The terminal, line editing, history and Ctrl-C
-- are in engine/host/repl.c, which calls compile, show and complete.
local M = {}

M.prompt = "ur> "
M.prompt2 = "..> "
M.depth = 2       -- levels of nested tables printed before `{...}`
M.max_items = 40  -- entries printed per table before `...`
M.width = 100     -- a table that fits in this many columns prints on one line

-- Method tables of FFI types: Lua cannot read a cdata's metatable, so completion probes a value
-- against each of these (the table applies when v[k] is the table's own k).
local cdata_methods = { require("uvmrec.tensor").methods }

function M.add_methods(methods)
  if type(methods) ~= "table" then error("add_methods: expected a table of methods", 2) end
  cdata_methods[#cdata_methods + 1] = methods
end

function M.banner()
  local ur = require "uvmrec"
  local gpu = ur.gpu() and ("GPU: " .. ur.device_props(0).name) or ("no GPU (" .. ur.cuda_error() .. ")")
  return ("uvmrec %s on %s, %s.\n`ur` is require \"uvmrec\"; Tab completes; Ctrl-C stops a chunk; " ..
    "Ctrl-D exits."):format(ur.version(), jit.version, gpu)
end

-- ---- compiling ----

-- A function for what was typed; false when the chunk is incomplete (more lines will follow);
-- nil and the message when it cannot compile.  An expression is compiled to return its values,
-- so they print; `=expr` is Lua 5.1's spelling of the same.  The values pass through select
-- because a plain `return f()` is a tail call, which would drop the chunk's line from errors
-- and tracebacks.
function M.compile(src)
  src = src:gsub("^%s*=", "", 1)
  local fn = loadstring("return select(1, " .. src .. "\n)", "=stdin")
  if fn then return fn end
  local err
  fn, err = loadstring(src, "=stdin")
  if fn then return fn end
  if err:sub(-7) == "'<eof>'" then return false end
  return nil, err
end

-- ---- printing ----

local keywords = {}
for w in ([[and break do else elseif end false for function goto if in local nil not or repeat
  return then true until while]]):gmatch("%a+") do keywords[w] = true end

local function is_name(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil and not keywords[k]
end

local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

local function key_order(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  if ta == "number" or ta == "string" then return a < b end
  return tostring(a) < tostring(b)
end

local format

-- Names a table makes on use (uvmrec.nn's classes) and lists through its metatable's __names.
local function lazy_names(t)
  local mt = getmetatable(t)
  local f = type(mt) == "table" and rawget(mt, "__names")
  if type(f) ~= "function" then return nil end
  local ok, list = pcall(f, t)
  return ok and type(list) == "table" and list or nil
end

local function format_table(t, depth, seen, indent)
  if seen[t] then return "{<cycle>}" end
  local lazy = lazy_names(t)
  if lazy then return "{" .. table.concat(lazy, ", ") .. "} (loaded on first use)" end
  if depth > M.depth then return "{...}" end
  seen[t] = true
  local parts, n = {}, #t
  for i = 1, math.min(n, M.max_items) do parts[#parts + 1] = format(t[i], depth + 1, seen, indent .. "  ") end
  local keys = {}
  for k in pairs(t) do
    if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_order)
  for _, k in ipairs(keys) do
    if #parts >= M.max_items then break end
    local ks = is_name(k) and k or ("[" .. format(k, M.depth + 1, seen, "") .. "]")
    parts[#parts + 1] = ks .. " = " .. format(t[k], depth + 1, seen, indent .. "  ")
  end
  seen[t] = nil
  local more = n + #keys - #parts
  if more > 0 then parts[#parts + 1] = ("... (%d more)"):format(more) end
  if #parts == 0 then return "{}" end
  local line = "{" .. table.concat(parts, ", ") .. "}"
  if #line + #indent <= M.width and not line:find("\n", 1, true) then return line end
  local inner = indent .. "  "
  return "{\n" .. inner .. table.concat(parts, ",\n" .. inner) .. "\n" .. indent .. "}"
end

-- How a value prints: strings quoted inside tables, tables nested to M.depth, anything with a
-- __tostring (tensors among them) through it.
function format(v, depth, seen, indent)
  local tv = type(v)
  if tv == "string" then return depth > 0 and ("%q"):format(v):gsub("\\\n", "\\n") or v end
  if tv == "table" and not has_tostring(v) then return format_table(v, depth, seen, indent) end
  return tostring(v)
end

function M.format(v) return format(v, 0, {}, "") end

-- Prints the results of a chunk, one per line, and keeps the first in `_`.
function M.show(n, ...)
  if n == 0 then return end
  local out = {}
  for i = 1, n do out[i] = M.format((select(i, ...))) end
  io.write(table.concat(out, "\n"), "\n")
  rawset(_G, "_", (...))
end

-- ---- completion ----

-- Indexes without letting a metamethod's error escape.
local function get(v, k)
  if type(v) == "table" then
    local r = rawget(v, k)
    if r ~= nil then return r end
  end
  local ok, r = pcall(function() return v[k] end)
  if ok then return r end
end

local function callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__call") ~= nil
end

-- Names reachable with v.name: own keys, tables behind __index, and for cdata the method table
-- that answers for it.
local function names(v, out, level)
  if level > 8 then return end
  if type(v) == "table" then
    for k in pairs(v) do if is_name(k) then out[k] = true end end
  elseif type(v) == "cdata" then
    for _, methods in ipairs(cdata_methods) do
      local k = next(methods)
      while k ~= nil and type(methods[k]) ~= "function" do k = next(methods, k) end
      if k ~= nil and get(v, k) == methods[k] then names(methods, out, level + 1) end
    end
  end
  local mt = getmetatable(v)
  if type(mt) == "table" and type(rawget(mt, "__index")) == "table" then
    names(rawget(mt, "__index"), out, level + 1)
  end
  if type(v) == "table" then
    for _, k in ipairs(lazy_names(v) or {}) do if is_name(k) then out[k] = true end end
  end
end

-- What can complete the end of `line` (the text before the cursor): returns the partial word
-- and the sorted candidates, each a whole name; functions get "(" after them.
function M.complete(line)
  local expr = line:match("[%w_%.:]*$")
  local path, sep, word = expr:match("^(.*)([%.:])([%w_]*)$")
  local pool = {}
  if not path then
    word = expr
    if word:match("^%d") then return word, {} end
    names(_G, pool, 0)
    for k in pairs(keywords) do pool[k] = true end
  else
    if path == "" or path:find(":", 1, true) or path:match("%.%.") or not path:match("^[%a_]") then
      return word, {}
    end
    local v = _G
    for part in path:gmatch("[^%.]+") do
      v = get(v, part)
      if v == nil then return word, {} end
    end
    names(v, pool, 0)
    if sep == ":" then
      for k in pairs(pool) do if not callable(get(v, k)) then pool[k] = nil end end
    end
    local list = {}
    for k in pairs(pool) do
      if k:sub(1, #word) == word then list[#list + 1] = k .. (callable(get(v, k)) and "(" or "") end
    end
    table.sort(list)
    return word, list
  end
  local list = {}
  for k in pairs(pool) do
    if k:sub(1, #word) == word then
      list[#list + 1] = k .. (not keywords[k] and callable(rawget(_G, k)) and "(" or "")
    end
  end
  table.sort(list)
  return word, list
end

return M
