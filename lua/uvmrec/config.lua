-- Configs: YAML files (read by the engine through libyaml's event API) checked against a
-- schema that types every value, with errors as file:line:column.  Scalars are typed by the
-- schema alone: `yes` is a string unless the schema asks for a bool (then it is an error),
-- and `010` is no octal number.  `--set a.b=v` overrides go through the same schema, and so do
-- values read from JSON (check_value: a config a file holds).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local json = require "uvmrec.json"
local C, check = lib.C, lib.check

local M = {}

-- ---- schema constructors ----
local function kind(k) return function(opts) opts = opts or {}; opts.kind = k; return opts end end
M.int = kind("int")         -- {min=, max=, default=}
M.number = kind("number")   -- {min=, max=, default=}
M.bool = kind("bool")       -- {default=}
M.string = kind("string")   -- {default=, pattern=}
-- scalar: typed by its text, for values whose type another check decides (a hint policy's
-- options): true or false, a number as number reads one, else (or quoted) a string
M.scalar = kind("scalar")   -- {default=}
M.enum = function(values, opts) opts = opts or {}; opts.kind = "enum"; opts.values = values; return opts end
M.list = function(elem, opts) opts = opts or {}; opts.kind = "list"; opts.elem = elem; return opts end
-- map: fixed keys (unknown ones are errors); required = { "key", ... }
M.map = function(fields, opts) opts = opts or {}; opts.kind = "map"; opts.fields = fields; return opts end
-- dict: any keys (strings), each value checked against one schema
M.dict = function(elem, opts) opts = opts or {}; opts.kind = "dict"; opts.elem = elem; return opts end

local function describe(s)
  if s.kind == "enum" then return "one of " .. table.concat(s.values, ", ") end
  if s.kind == "int" then return "an integer" end
  if s.kind == "number" then return "a number" end
  if s.kind == "bool" then return "true or false" end
  if s.kind == "scalar" then return "a number, a string, true or false" end
  if s.kind == "list" then return "a list" end
  if s.kind == "map" or s.kind == "dict" then return "a mapping" end
  return "a string"
end

-- True when text is a number as YAML configs write one (decimal, with an exponent or not).
local function number_text(text)
  return text:match("^[-+]?%d+%.?%d*[eE][-+]?%d+$") or text:match("^[-+]?%d+%.?%d*$")
         or text:match("^[-+]?%.%d+$") or text:match("^[-+]?%.%d+[eE][-+]?%d+$")
end

-- nil, or the expectation number v of schema s (an int or a number) is outside of.
local function outside(s, v)
  if s.min and v < s.min then return ("%s >= %s"):format(describe(s), tostring(s.min)) end
  if s.max and v > s.max then return ("%s <= %s"):format(describe(s), tostring(s.max)) end
end

-- Types one scalar text by its schema; returns value or nil, expectation.
local function scalar(s, text, quoted)
  local k = s.kind
  if k == "scalar" then
    if quoted then return text end
    if text == "true" or text == "false" then return text == "true" end
    if not number_text(text) then return text end
    k = "number"
  end
  if k == "string" then
    if s.pattern and not text:match(s.pattern) then return nil, "a string matching " .. s.pattern end
    return text
  end
  if k == "enum" then
    for _, v in ipairs(s.values) do if v == text then return text end end
    return nil, describe(s)
  end
  if quoted then return nil, describe(s) .. " (not a quoted string)" end
  local v
  if k == "bool" then
    if text == "true" then v = true elseif text == "false" then v = false else return nil, describe(s) end
    return v
  elseif k == "int" then
    if not (text:match("^[-+]?[1-9]%d*$") or text:match("^[-+]?0$")) then return nil, "a decimal integer" end
    v = tonumber(text)
    if math.abs(v) >= 2 ^ 53 then return nil, "an integer below 2^53" end
  elseif k == "number" then
    if not number_text(text) then return nil, "a number" end
    v = tonumber(text)
    if v ~= v or math.abs(v) == math.huge then return nil, "a finite number" end
  else
    return nil, describe(s)
  end
  local want = outside(s, v)
  if want then return nil, want end
  return v
end

-- nil, or why a list of n items is too short or too long for its schema s.
function M.list_length(s, n)
  if s.min_len and n < s.min_len then return ("expected at least %d items, got %d"):format(s.min_len, n) end
  if s.max_len and n > s.max_len then return ("expected at most %d items, got %d"):format(s.max_len, n) end
end

-- ---- checking a YAML tree ----
local function checker(doc, positions)
  local nodes = C.ur_yaml_nodes(doc)
  local name = ffi.string(C.ur_yaml_name(doc))
  local function fail(i, path, msg)
    local n = nodes[i]
    error({ msg = ("%s:%d:%d: %s%s"):format(name, n.line, n.column, path ~= "" and (path .. ": ") or "", msg) })
  end
  local function text(i) return ffi.string(nodes[i].value, nodes[i].length) end

  local walk
  local function children(i)
    local out, c = {}, nodes[i].first_child
    while c >= 0 do out[#out + 1] = c; c = nodes[c].next_sibling end
    return out
  end

  walk = function(i, s, path)
    local n = nodes[i]
    positions[path] = ("%s:%d:%d"):format(name, n.line, n.column)
    if n.has_tag ~= 0 then fail(i, path, "tags (!!type) are not allowed; the schema gives each value its type") end
    if s.kind == "map" or s.kind == "dict" then
      if n.kind ~= C.UR_YAML_MAP then fail(i, path, "expected " .. describe(s)) end
      local out, seen, kids = {}, {}, children(i)
      for k = 1, #kids, 2 do
        local ki, vi = kids[k], kids[k + 1]
        if nodes[ki].kind ~= C.UR_YAML_SCALAR then fail(ki, path, "keys must be plain names") end
        local key = text(ki)
        local sub = path == "" and key or (path .. "." .. key)
        if seen[key] then
          fail(ki, path, ("duplicate key '%s' (first at line %d)"):format(key, nodes[seen[key]].line))
        end
        seen[key] = ki
        local fs = s.kind == "dict" and s.elem or s.fields[key]
        if not fs then
          local known = {}
          for f in pairs(s.fields) do known[#known + 1] = f end
          table.sort(known)
          fail(ki, path, ("unknown key '%s'; expected one of %s"):format(key, table.concat(known, ", ")))
        end
        out[key] = walk(vi, fs, sub)
      end
      if s.kind == "map" then
        for _, req in ipairs(s.required or {}) do
          if out[req] == nil then fail(i, path, ("missing key '%s'"):format(req)) end
        end
      end
      return out
    elseif s.kind == "list" then
      if n.kind ~= C.UR_YAML_SEQ then fail(i, path, "expected a list") end
      local out = {}
      for k, c in ipairs(children(i)) do out[k] = walk(c, s.elem, ("%s[%d]"):format(path, k)) end
      local lerr = M.list_length(s, #out)
      if lerr then fail(i, path, lerr) end
      return out
    end
    if n.kind ~= C.UR_YAML_SCALAR then fail(i, path, "expected " .. describe(s)) end
    local t = text(i)
    local v, want = scalar(s, t, n.style ~= C.UR_YAML_PLAIN)
    if v == nil then fail(i, path, ("'%s' is not %s"):format(t, want)) end
    return v
  end
  return walk
end

-- ---- checking a decoded value ----
-- A value read from JSON (a training config a file holds: train.config.stored) has its types
-- already; they are checked against the schema as the YAML tree's are: nil, or "path: what"
-- (`eval.batch_size: "x" is not an integer`).  An empty table is an empty list and an empty
-- mapping (JSON's [] and {} decode alike).  Keys the schema does not know are left alone: a
-- file written by another version of uvmrec may hold them, and nothing reads them.
local function is_list(v)
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  return n == #v
end

local function shown(v)
  if type(v) == "table" then return is_list(v) and "a list" or "a mapping" end
  if type(v) == "string" then return ("%q"):format(v) end
  return tostring(v)
end

-- nil, or what v, a value that is no table, is expected to be by its schema s.
local function leaf(s, v)
  local k, t = s.kind, type(v)
  if k == "scalar" then return (t ~= "boolean" and t ~= "number" and t ~= "string") and describe(s) or nil end
  if k == "string" then
    if t ~= "string" then return describe(s) end
    if s.pattern and not v:match(s.pattern) then return "a string matching " .. s.pattern end
    return nil
  end
  if k == "enum" then
    for _, x in ipairs(s.values) do if x == v then return nil end end
    return describe(s)
  end
  if k == "bool" then return t ~= "boolean" and describe(s) or nil end
  if t ~= "number" then -- JSON's integers past 2^53 are 64-bit cdata
    local wide = ffi.istype("int64_t", v) or ffi.istype("uint64_t", v)
    return wide and describe(s) .. " below 2^53" or describe(s)
  end
  if v ~= v or math.abs(v) == math.huge then return "a finite number" end
  if k == "int" and (v ~= math.floor(v) or math.abs(v) >= 2 ^ 53) then
    return v ~= math.floor(v) and describe(s) or "an integer below 2^53"
  end
  return outside(s, v)
end

-- nil, or "path: what" for the first value of v (by sorted keys) that schema s does not allow;
-- path: where v is (default "", the root).
function M.check_value(v, s, path)
  path = path or ""
  local function fail(msg) return (path ~= "" and (path .. ": ") or "") .. msg end
  local function under(key) return path == "" and key or (path .. "." .. key) end
  if s.kind == "map" or s.kind == "dict" or s.kind == "list" then
    local list = s.kind == "list"
    if type(v) ~= "table" or (next(v) ~= nil and is_list(v) ~= list) then
      return fail(("%s is not %s"):format(shown(v), describe(s)))
    end
    if list then
      for i = 1, #v do
        local err = M.check_value(v[i], s.elem, ("%s[%d]"):format(path, i))
        if err then return err end
      end
      local lerr = M.list_length(s, #v)
      return lerr and fail(lerr) or nil
    end
    local keys = {}
    for key in pairs(v) do
      if s.kind == "dict" or s.fields[key] then keys[#keys + 1] = key end
    end
    table.sort(keys)
    for _, key in ipairs(keys) do
      local err = M.check_value(v[key], s.kind == "dict" and s.elem or s.fields[key], under(key))
      if err then return err end
    end
    for _, req in ipairs(s.kind == "map" and s.required or {}) do
      if v[req] == nil then return fail(("missing key '%s'"):format(req)) end
    end
    return nil
  end
  local want = type(v) == "table" and describe(s) or leaf(s, v)
  return want and fail(("%s is not %s"):format(shown(v), want)) or nil
end

-- Fills defaults of absent keys, recursively through maps.  fresh (a config read from a file's
-- JSON, M.fill_defaults): each default a copy of the schema's, and an absent dict an empty one.
local function defaults(s, v, fresh)
  if s.kind ~= "map" or (v ~= nil and type(v) ~= "table") then return v end
  v = v or {}
  for key, fs in pairs(s.fields) do
    if v[key] == nil then
      if fs.default ~= nil then v[key] = fresh and json.decode(json.encode(fs.default)) or fs.default
      elseif fs.kind == "map" then v[key] = defaults(fs, nil, fresh)
      elseif fresh and fs.kind == "dict" then v[key] = {} end
    else
      defaults(fs, v[key], fresh)
    end
  end
  return v
end

-- Config v (decoded from JSON: a config a file holds) with the keys schema s has and v lacks
-- (added since it was written) filled with copies of their defaults, as a config loaded now would
-- have them.
function M.fill_defaults(v, s) return defaults(s, v, true) end

-- Where each value of a loaded config came from ("file:line:column", or "--set k=v"), by
-- dotted path, per config table: checks that span several values report a position too.
local positions = setmetatable({}, { __mode = "k" })

local function from_doc(doc, schema)
  local pos = {}
  local walk = checker(doc, pos)
  local ok, res = pcall(walk, 0, schema, "")
  C.ur_yaml_free(doc)
  if not ok then
    if type(res) == "table" then return nil, res.msg end
    error(res, 0)
  end
  local cfg = defaults(schema, res)
  positions[cfg] = pos
  return cfg
end

-- The position of the value at `path` ("model.bottom_mlp[2]") in a loaded config, or of the
-- nearest enclosing value that has one (a default has none of its own); nil if none does.
function M.where(cfg, path)
  local pos = positions[cfg]
  if not pos then return nil end
  while true do
    if pos[path] then return pos[path] end
    if path == "" then return nil end
    path = path:match("^(.*)%[%d+%]$") or path:match("^(.*)%.[^.]+$") or ""
  end
end

-- True when the value at `path` was given (in the file or by --set), not a default.
function M.given(cfg, path)
  local pos = positions[cfg]
  return pos ~= nil and pos[path] ~= nil
end

-- "where: path: msg", the form of every config error, for checks made after loading.
function M.message(cfg, path, msg)
  local w = M.where(cfg, path)
  return ("%s%s%s"):format(w and (w .. ": ") or "", path ~= "" and (path .. ": ") or "", msg)
end

-- Environmental failures (file, YAML) and schema errors return nil, "file:line:col: ...".
function M.load(path, schema)
  local out = ffi.new("ur_yaml_doc *[1]")
  local ok, err = check(C.ur_yaml_load(out, path))
  if not ok then return nil, err end
  return from_doc(out[0], schema)
end

function M.parse(text, schema, name)
  local out = ffi.new("ur_yaml_doc *[1]")
  local ok, err = check(C.ur_yaml_parse(out, text, #text, name or "<string>"))
  if not ok then return nil, err end
  return from_doc(out[0], schema)
end

-- Applies "a.b.c=value" to a loaded config, typed by the schema; returns cfg or nil, err.
-- flag: the command-line flag that gave it ("--steps 0"), named where --set would be (its
-- errors, and checks that blame the value).
function M.set(cfg, schema, assignment, flag)
  local path, text = assignment:match("^([%w_%.]+)=(.*)$")
  if not path then
    return nil, ("--set %s: expected key.path=value"):format(assignment)
  end
  local s, t, parent, last = schema, cfg, nil, nil
  local absent = false -- a section on the way that the config lacks (an entry of a dict)
  for key in path:gmatch("[^.]+") do
    if s.kind == "map" then s = s.fields[key]
    elseif s.kind == "dict" then s = s.elem
    else s = nil end
    if not s then return nil, ("--set %s: '%s' is not a setting"):format(assignment, path) end
    if t == nil then absent = true end
    parent, last = t, key
    t = type(t) == "table" and t[key] or nil
  end
  if s.kind == "map" or s.kind == "dict" then
    return nil, ("--set %s: '%s' is a section; set one of its keys"):format(assignment, path)
  end
  local v, want
  local bad = text
  if s.kind == "list" then
    -- a comma-separated list of scalars: --set model.bottom_mlp=512,256,128; a bad one is named
    v = {}
    for item in (text .. ","):gmatch("([^,]*),") do
      local x, w = scalar(s.elem, item, false)
      if x == nil then want, bad = w, item break end
      v[#v + 1] = x
    end
    if want then v = nil end
    local lerr = v and M.list_length(s, #v)
    if lerr then return nil, ("--set %s: %s"):format(assignment, lerr) end
  else
    v, want = scalar(s, text, false)
  end
  local from = flag or ("--set " .. assignment)
  if v == nil then return nil, ("%s: %s'%s' is not %s"):format(from, flag and (path .. ": ") or "", bad, want) end
  local pos = positions[cfg]
  if absent then
    local holder, at = cfg, nil
    for key in path:gmatch("([^.]+)%.") do
      at = at and (at .. "." .. key) or key
      if holder[key] == nil then
        holder[key] = {}
        if pos then pos[at] = from end
      end
      holder = holder[key]
    end
    parent = holder
  end
  if type(parent) ~= "table" then return nil, ("--set %s: no section to hold it"):format(assignment) end
  parent[last] = v
  if pos then
    for k in pairs(pos) do
      if k:sub(1, #path + 1) == path .. "." or k:sub(1, #path + 1) == path .. "[" then pos[k] = nil end
    end
    pos[path] = from
  end
  return cfg
end

return M
