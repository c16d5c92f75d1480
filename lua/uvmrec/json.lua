-- uvmrec.json: JSON for checkpoint metadata, run logs (metrics.jsonl) and benchmarks, on the
-- engine's JSON values (jansson; engine/src/io/json.c).
--
-- encode(v) gives canonical text, the same bytes for the same value: object keys sorted, no
-- spaces, whole numbers below 2^53 and 64-bit integer cdata (int64_t, or uint64_t up to
-- 2^63 - 1) in digits, other numbers as %.17g (they read back exactly).  A table with only the
-- keys 1..n is an array; any other table, the empty one too, an object with string keys.  It
-- raises, naming the place ("value.model.tables[2].rows"), for what JSON cannot hold: NaN,
-- infinities, functions, tables mixing a list and a map, nesting deeper than 64, strings that
-- are not UTF-8.
-- decode(text) gives Lua values (null is nil: absent from objects, a hole in arrays; integers
-- beyond 2^53 are int64_t cdata, exact), or nil, message naming the byte where the text fails
-- (an object holding a key twice fails too).
-- null is JSON's null, for a value known to be missing (an AUC that one class leaves undefined);
-- decode gives nil for it, or opts.null (decode(text, {null = json.null})) where a reader must
-- see every element of a list, nulls too.
-- read_lines(path) gives the values of a JSON-lines file; append_lines(path, v, ...) adds each
-- value as one line to the end of one (a benchmark's --out), raising io.open's message when
-- the file cannot be opened; lines(path) writes one made anew, a line at a time.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local C = lib.C

local M = {}

M.null = setmetatable({}, { __tostring = function() return "json.null" end,
                            __newindex = function() error("json.null is read-only", 2) end })

local MAX_DEPTH = 64
local INT64_MAX = 0x7fffffffffffffffULL
local EXACT = 2 ^ 53 -- integers up to here are exact Lua numbers

local box = ffi.new("ur_json *[1]")
local len = ffi.new("size_t[1]")

-- Errors found while encoding travel as {json = message} to encode, which raises them.
local function fail(msg) error({ json = msg }, 0) end

local function made(st, path)
  if st ~= 0 then fail(path .. ": " .. ffi.string(C.ur_last_error()):gsub("^json: ", "")) end
  return box[0]
end

local function is_array(v, path)
  local n, count = #v, 0
  for _ in pairs(v) do count = count + 1 end
  if n > 0 and count == n then return true end
  for k in pairs(v) do
    if type(k) ~= "string" then fail(path .. " mixes a list and a map (key " .. tostring(k) .. ")") end
  end
  return false
end

-- A new value for v: a scalar, or an empty array or object that fill() fills once its parent
-- holds it (so a failure leaves one tree to free, the root).
local function node(v, path, depth)
  local t = type(v)
  if depth > MAX_DEPTH then fail("nesting deeper than " .. MAX_DEPTH .. " at " .. path) end
  if t == "string" then return made(C.ur_json_new_string(box, v, #v), path) end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      fail(path .. " is " .. tostring(v) .. ", which JSON cannot hold")
    end
    if v == math.floor(v) and math.abs(v) < EXACT then return made(C.ur_json_new_integer(box, v),
                                                                                         path) end
    return made(C.ur_json_new_real(box, v), path)
  end
  if t == "boolean" then return made(C.ur_json_new(box, v and C.UR_JSON_TRUE or C.UR_JSON_FALSE),
                                                   path) end
  if v == M.null then return made(C.ur_json_new(box, C.UR_JSON_NULL), path) end
  if t == "table" then
    return made(C.ur_json_new(box, is_array(v, path) and C.UR_JSON_ARRAY or C.UR_JSON_OBJECT), path)
  end
  if t == "cdata" and ffi.istype("int64_t", v) then return made(C.ur_json_new_integer(box, v),
                                                                                      path) end
  if t == "cdata" and ffi.istype("uint64_t", v) then
    if v > INT64_MAX then
      fail(("%s is %s, above 2^63 - 1, the largest integer JSON holds here"):format(path,
        (tostring(v):gsub("ULL$", ""))))
    end
    return made(C.ur_json_new_integer(box, v), path)
  end
  fail(path .. " is a " .. t .. ", which JSON cannot hold")
end

local function fill(n, v, path, depth)
  if C.ur_json_typeof(n) == C.UR_JSON_ARRAY then
    for i = 1, #v do
      local sub = path .. "[" .. i .. "]"
      local child = node(v[i], sub, depth + 1)
      made(C.ur_json_append(n, child), sub)
      if type(v[i]) == "table" and v[i] ~= M.null then fill(child, v[i], sub, depth + 1) end
    end
  else
    for k, x in pairs(v) do
      local sub = path .. "." .. k
      local child = node(x, sub, depth + 1)
      made(C.ur_json_set(n, k, #k, child), sub)
      if type(x) == "table" and x ~= M.null then fill(child, x, sub, depth + 1) end
    end
  end
end

local buf_len = 4096
local buf = ffi.new("char[?]", buf_len)
local needed = ffi.new("uint64_t[1]")

local function dump(root)
  lib.must(C.ur_json_dump(root, buf, buf_len, needed), 3)
  if needed[0] > buf_len then
    buf_len = tonumber(needed[0])
    buf = ffi.new("char[?]", buf_len)
    lib.must(C.ur_json_dump(root, buf, buf_len, needed), 3)
  end
  return ffi.string(buf, tonumber(needed[0]) - 1)
end

-- Canonical text for v; raises for values JSON cannot hold (see the top of this file).
function M.encode(v)
  local root
  local ok, err = pcall(function()
    root = node(v, "value", 0)
    if type(v) == "table" and v ~= M.null then fill(root, v, "value", 0) end
  end)
  if not ok then
    if root ~= nil then C.ur_json_free(root) end
    if type(err) == "table" and err.json then error("json: " .. err.json, 2) end
    error(err, 0)
  end
  local text = dump(root)
  C.ur_json_free(root)
  return text
end

local T = { object = C.UR_JSON_OBJECT, array = C.UR_JSON_ARRAY, string = C.UR_JSON_STRING,
            integer = C.UR_JSON_INTEGER, real = C.UR_JSON_REAL, ["true"] = C.UR_JSON_TRUE,
            ["false"] = C.UR_JSON_FALSE }

local function value(n, null)
  local t = C.ur_json_typeof(n)
  if t == T.object then
    local out = {}
    local it = C.ur_json_iter(n)
    while it ~= nil do
      local k = ffi.string(C.ur_json_iter_key(it, len), len[0])
      out[k] = value(C.ur_json_iter_value(it), null)
      it = C.ur_json_iter_next(n, it)
    end
    return out
  elseif t == T.array then
    local out = {}
    for i = 0, tonumber(C.ur_json_size(n)) - 1 do out[i + 1] = value(C.ur_json_item(n, i), null) end
    return out
  elseif t == T.string then
    local p = C.ur_json_string(n, len)
    return ffi.string(p, len[0])
  elseif t == T.integer then
    local i = C.ur_json_integer(n)
    if i >= -EXACT and i <= EXACT then return tonumber(i) end
    return i
  elseif t == T.real then
    return C.ur_json_real(n)
  end
  if t == T["true"] then return true end
  if t == T["false"] then return false end
  return null
end

-- The value of JSON text, or nil, "json: <what> at byte N".  opts: null (what a null gives;
-- default nil).
function M.decode(text, opts)
  if type(text) ~= "string" then error("json decode: expected a string, got " .. type(text), 2) end
  if C.ur_json_parse(box, text, #text) ~= 0 then return nil, ffi.string(C.ur_last_error()) end
  local root = box[0]
  local ok, v = pcall(value, root, opts and opts.null)
  C.ur_json_free(root)
  if not ok then error(v, 0) end
  return v
end

-- The values of a JSON-lines file (metrics.jsonl, a benchmark's output), one a line, blank
-- lines skipped; nil, message naming the file and line when it cannot be read.
function M.read_lines(path)
  local f, err = io.open(path)
  if not f then return nil, "json: " .. err end
  local out, n = {}, 0
  for line in f:lines() do
    n = n + 1
    if line:find("%S") then
      local v, jerr = M.decode(line)
      if jerr then
        f:close()
        return nil, ("%s:%d: %s"):format(path, n, jerr)
      end
      out[#out + 1] = v
    end
  end
  f:close()
  return out
end

-- Appends each of the values to the JSON-lines file at path (made when missing), one line
-- each, encoded before the file is opened; raises io.open's message ("out/x.jsonl: No such
-- file or directory") when it cannot be opened, and encode's for a value JSON cannot hold.
function M.append_lines(path, ...)
  local lines = {}
  for i = 1, select("#", ...) do
    local ok, line = pcall(M.encode, (select(i, ...)))
    if not ok then error(line, 2) end -- at the caller's line, as encode's own errors are
    lines[i] = line .. "\n"
  end
  local f, err = io.open(path, "a")
  if not f then error(err, 0) end
  f:write(table.concat(lines))
  f:close()
end

-- A JSON-lines file made anew (a benchmark's --out), opened at its first line: w:write(v)
-- writes v as a line and flushes, w:close() closes it (a later write makes it anew).  Without a
-- path both do nothing.  write raises encode's message for a value JSON cannot hold (at the
-- caller's line, the file left as it was) and io.open's when the file cannot be made.
function M.lines(path)
  local f
  return {
    write = function(_, v)
      if not path then return end
      local ok, line = pcall(M.encode, v)
      if not ok then error(line, 2) end
      f = f or assert(io.open(path, "w"))
      f:write(line, "\n")
      f:flush()
    end,
    close = function()
      if f then f:close() end
      f = nil
    end,
  }
end

return M
