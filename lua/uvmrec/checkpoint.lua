-- Checkpoints: safetensors files (written atomically, streamed, read through a validated map),
-- the registry through which every component puts its state into one file and takes it back,
-- and the run-directory helpers behind --checkpoint-every / --keep / --resume.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local streams = require "uvmrec.stream"
local json = require "uvmrec.json"
local C, check = lib.C, lib.check

local M = {
  FORMAT = 1,                                  -- the uvmrec.format this code writes and reads
  FILE_PATTERN = "^ckpt%-(%d+)%.safetensors$", -- checkpoint files of a run directory
}

local is_tensor = tensor.is_tensor

-- ---- files ----

local file_methods = {}
local wrap_file, free_file = lib.handle_type("ur_safetensors", C.ur_safetensors_close, {
  __index = file_methods,
  __tostring = function(f)
    if f.p == nil then return "safetensors file (closed)" end
    return ("safetensors %s: %d tensors, %d bytes"):format(ffi.string(C.ur_safetensors_path(f.p)),
      C.ur_safetensors_count(f.p), tonumber(C.ur_safetensors_bytes(f.p)))
  end,
})
file_methods.close = free_file

local function F(f)
  local p = lib.ptr(f, "safetensors file", 3) -- not a tail call: lib.ptr
  return p
end

local entry = ffi.new("ur_safetensors_entry")
local function entry_table(p, i)
  lib.must(C.ur_safetensors_entry_get(p, i, entry), 3)
  local shape = {}
  for d = 0, entry.ndim - 1 do shape[d + 1] = tonumber(entry.shape[d]) end
  return { name = ffi.string(entry.name), dtype = ffi.string(C.ur_dtype_name(entry.dtype)),
           shape = shape, nbytes = tonumber(entry["end"] - entry.begin),
           offset = tonumber(entry.file_offset) }
end

-- A file, opened, mapped and validated; nil, message when it cannot be (missing, malformed).
function M.open(path)
  if type(path) ~= "string" then error("checkpoint open: path must be a string", 2) end
  local out = ffi.new("ur_safetensors *[1]")
  local ok, err = check(C.ur_safetensors_open(out, path))
  if not ok then return nil, err end
  return wrap_file(out[0])
end

function file_methods:path() return ffi.string(C.ur_safetensors_path(F(self))) end
function file_methods:bytes() return tonumber(C.ur_safetensors_bytes(F(self))) end

-- Tensor names in the order of their data.
function file_methods:names()
  local p, out = F(self), {}
  for i = 0, C.ur_safetensors_count(p) - 1 do out[i + 1] = entry_table(p, i).name end
  return out
end

-- {name, dtype ("f32"...), shape, nbytes, offset (in the file)}, or nil when absent.
function file_methods:info(name)
  local p = F(self)
  local i = C.ur_safetensors_find(p, name)
  if i < 0 then return nil end
  return entry_table(p, i)
end

-- One metadata value (nil when absent), or all of them as a table.
function file_methods:meta(key)
  local p = F(self)
  if key ~= nil then
    local v = C.ur_safetensors_meta_get(p, key)
    return v ~= nil and ffi.string(v) or nil
  end
  local out = {}
  for i = 0, C.ur_safetensors_meta_count(p) - 1 do
    local k = ffi.string(C.ur_safetensors_meta_key(p, i))
    out[k] = ffi.string(C.ur_safetensors_meta_get(p, k))
  end
  return out
end

-- The kinds of JSON value meta_json checks for: what each says in a message and its test of a
-- value decoded with its nulls as json.null (JSON's [] and {} decode alike: empty is either).
local function is_list(v) return type(v) == "table" and v ~= json.null and (next(v) == nil or #v > 0) end
local function is_object(v) return type(v) == "table" and v ~= json.null and #v == 0 end
local META_KINDS = {
  object = { "a JSON object", is_object },
  list = { "a JSON list", is_list, function(v) return v ~= json.null end },
  ["list of strings"] = { "a JSON list of strings", is_list, function(v) return type(v) == "string" end },
  ["list of objects"] = { "a JSON list of objects", is_list, is_object },
}

-- JSON text as a message shows it: at most 60 characters.
local function excerpt(v)
  local ok, text = pcall(json.encode, v)
  text = ok and text or tostring(v)
  return #text > 60 and text:sub(1, 57) .. "..." or text
end

-- The value of metadata `key` of f (a checkpoint file, a model file: anything with meta(key)),
-- which its writer stored as JSON, checked to be of `kind` (a key of META_KINDS; nil: any JSON),
-- or nil and a message naming the file, the key and what was expected.  opts: where (the file as
-- the message names it; default "checkpoint PATH"), what (what the key holds, for the message:
-- "the names of its components"), default (the value when the key is absent; without it an
-- absent key is refused too).  A key that is there but not JSON, or JSON of another kind (a null
-- for the value itself or a list's element, too), is never read as absent or
-- empty: a file whose metadata was damaged or written by another program would be read as
-- holding nothing.  The value is decode's (nulls nil).  Also f:meta_json(key, kind, opts).
function M.meta_json(f, key, kind, opts)
  opts = opts or {}
  local k = kind and (META_KINDS[kind] or error("meta_json: kind " .. tostring(kind) .. " is not one of object, list, "
    .. "list of strings, list of objects", 2))
  local where = opts.where or ("checkpoint " .. f:path())
  local want = (k and k[1] or "JSON") .. (opts.what and " (" .. opts.what .. ")" or "")
  local text = f:meta(key)
  if text == nil then
    if opts.default ~= nil then return opts.default end
    return nil, ("%s: its metadata has no %s; expected %s"):format(where, key, want)
  end
  -- checked with its nulls seen (decode's nil would leave a hole, [null] an empty list)
  local seen, jerr = json.decode(text, { null = json.null })
  if jerr then return nil, ("%s: %s is not JSON (%s); expected %s"):format(where, key, jerr, want) end
  if seen == json.null or k and not k[2](seen) then
    return nil, ("%s: %s is %s; expected %s"):format(where, key, excerpt(seen), want)
  end
  for i = 1, k and k[3] and #seen or 0 do
    if not k[3](seen[i]) then
      return nil, ("%s: %s[%d] is %s; expected %s"):format(where, key, i, excerpt(seen[i]), want)
    end
  end
  return (json.decode(text))
end
file_methods.meta_json = M.meta_json

-- A zero-copy host tensor over the file's bytes; it outlives close().  Writes to it stay in
-- memory.  nil, message when the file has no such tensor.
function file_methods:view(name)
  local p = F(self)
  local i = C.ur_safetensors_find(p, name)
  if i < 0 then return nil, ("checkpoint: %s has no tensor '%s'"):format(self:path(), name) end
  local out = ffi.new("ur_tensor *[1]")
  local ok, err = check(C.ur_safetensors_view(p, i, out))
  if not ok then return nil, err end
  return tensor.wrap(out[0])
end

-- nil, or why the file's tensors `names` may not be loaded: the first whose bytes do not match
-- the checksum written with them (a corrupted file), or, unless opts.allow_nonfinite, that
-- holds a NaN or an infinity, named with its first bad element (row and column of a 2-D
-- tensor) and opts.refusal (default: that it is refused, and how a load takes it anyway).
-- Each is read from the file once, a chunk at a time, before anything is written.
local bad_at = ffi.new("int64_t[1]")
function file_methods:verify(names, opts)
  local p = F(self)
  local floats_too = not (opts and opts.allow_nonfinite)
  for _, name in ipairs(names) do
    local i = C.ur_safetensors_find(p, name)
    if i < 0 then return nil end -- the load names it
    local ok, err = check(C.ur_safetensors_verify(p, i, floats_too and bad_at or nil), 2)
    if not ok then return err end
    local bad = floats_too and bad_at[0] >= 0 and tonumber(bad_at[0]) or nil
    if bad then
      local info = self:info(name)
      local where = ("element %d"):format(bad)
      if #info.shape == 2 then
        where = ("element %d (row %d, column %d)"):format(bad, math.floor(bad / info.shape[2]), bad % info.shape[2])
      end
      return ("checkpoint %s: tensor '%s' holds NaN or infinity at %s; %s"):format(self:path(), name, where,
        opts and opts.refusal or "refused (load with allow_nonfinite, --allow-nonfinite, to take it as it is)")
    end
  end
  return nil
end

-- Copies tensors into existing ones of any placement: map is {name = tensor}.  Every name,
-- dtype and shape is checked before anything is written (a mismatch raises), and so is every
-- tensor's checksum (a corrupted file: nil, message naming the file and the tensor); a tensor
-- holding NaN or infinity is refused (nil, message naming it and its first bad element) unless
-- opts.allow_nonfinite.  opts: staging (bytes of the pinned staging buffer), stream,
-- allow_nonfinite, verified ({name = true}: tensors this file's verify passed already).
function file_methods:load(map, opts)
  opts = opts or {}
  local p = F(self)
  local names, unverified = {}, {}
  for name, t in pairs(map) do
    if type(name) ~= "string" or not is_tensor(t) then
      error("checkpoint load: expected {name = tensor}, got " .. tostring(name) .. " = " .. tostring(t), 2)
    end
    names[#names + 1] = name
    if not (opts.verified and opts.verified[name]) then unverified[#unverified + 1] = name end
  end
  table.sort(names)
  table.sort(unverified)
  local bad = self:verify(unverified, opts)
  if bad then return nil, bad end
  local cnames = ffi.new("const char *[?]", #names + 1)
  local cdsts = ffi.new("ur_tensor *[?]", #names + 1)
  for i, name in ipairs(names) do
    cnames[i - 1] = name
    cdsts[i - 1] = lib.ptr(map[name], "checkpoint load destination", 2)
  end
  local ok, err = check(C.ur_safetensors_load(streams.handle(opts.stream, 2), p, #names, cnames,
                                              cdsts, opts.staging or 0))
  if not ok then return nil, err end
  return true
end

-- Bytes of tensor `name` from byte `offset` into dst (a host tensor, its size read), from the
-- file rather than its mapping, so that reading a table a part at a time holds one part in
-- memory.  Checked as uvmrec.h's ur_safetensors_read_part says: parts in order from byte 0 at
-- the tensor's end, any other read by the whole tensor first.  true, or nil, message.
function file_methods:read_part(name, dst, offset)
  local p = F(self)
  local i = C.ur_safetensors_find(p, name)
  if i < 0 then return nil, ("checkpoint: %s has no tensor '%s'"):format(self:path(), name) end
  return check(C.ur_safetensors_read_part(p, i, lib.ptr(dst, "read_part destination", 2), offset or 0))
end

function file_methods:read(name, dst, opts)
  if type(name) ~= "string" then error("checkpoint read: name must be a string", 2) end
  return self:load({ [name] = dst }, opts)
end

local function meta_text(k, v, level)
  if type(v) == "string" then return v end
  if type(v) == "number" then return json.encode(v) end
  error(("checkpoint save: metadata '%s' is a %s; expected a string or a number"):format(k, type(v)), level + 1)
end

-- Writes {tensors = {name = tensor}, meta = {key = string or number}} to path atomically.
-- opts: staging (bytes), stream.  true, or nil, message (the previous file is then untouched).
function M.save(path, state, opts)
  opts = opts or {}
  if type(path) ~= "string" then error("checkpoint save: path must be a string", 2) end
  if type(state) ~= "table" then error("checkpoint save: state must be {tensors = ..., meta = ...}", 2) end
  local names, keys = {}, {}
  for name, t in pairs(state.tensors or {}) do
    if type(name) ~= "string" or not is_tensor(t) then
      error("checkpoint save: tensors must be {name = tensor}, got " .. tostring(name) .. " = " .. tostring(t), 2)
    end
    names[#names + 1] = name
  end
  for k in pairs(state.meta or {}) do
    if type(k) ~= "string" then error("checkpoint save: metadata keys must be strings", 2) end
    keys[#keys + 1] = k
  end
  table.sort(names)
  table.sort(keys)
  local cnames = ffi.new("const char *[?]", #names + 1)
  local ctensors = ffi.new("const ur_tensor *[?]", #names + 1)
  local ckeys = ffi.new("const char *[?]", #keys + 1)
  local cvalues = ffi.new("const char *[?]", #keys + 1)
  local values = {} -- held in this frame: the C strings point into them during the call
  for i, name in ipairs(names) do
    cnames[i - 1] = name
    ctensors[i - 1] = lib.ptr(state.tensors[name], "checkpoint save tensor", 2)
  end
  for i, k in ipairs(keys) do values[i] = meta_text(k, state.meta[k], 2) end
  for i, k in ipairs(keys) do
    ckeys[i - 1] = k
    cvalues[i - 1] = values[i]
  end
  local ok, err = check(C.ur_safetensors_save(streams.handle(opts.stream, 2), path, #names, cnames,
                                              ctensors, #keys, ckeys, cvalues, opts.staging or 0))
  if not ok then return nil, err end
  return true
end

-- ---- a file written a part at a time ----

local writer_methods = {}
local Writer = { __index = writer_methods }

-- A file whose tensors are given a part at a time (uvmrec.h's ur_safetensors_writer), so that
-- none need be whole in memory: specs = {{name =, dtype =, shape = {...}}, ...} (any order),
-- meta as save's.  w:put(name, part) appends part's bytes to that tensor; w:close() checks that
-- every byte was given and publishes the file atomically, the file save writes of the same
-- tensors; w:abandon() leaves path as it was.  opts: staging, stream.  nil, message when the
-- temporary file cannot be made.
function M.writer(path, specs, meta, opts)
  opts = opts or {}
  if type(path) ~= "string" then error("checkpoint writer: path must be a string", 2) end
  if type(specs) ~= "table" then error("checkpoint writer: specs must be a list of {name, dtype, shape}", 2) end
  local n = #specs
  local entries = ffi.new("ur_safetensors_entry[?]", n + 1)
  local index = {}
  for i, sp in ipairs(specs) do
    if type(sp) ~= "table" or type(sp.name) ~= "string" or type(sp.shape) ~= "table" or #sp.shape > 4 then
      error(("checkpoint writer: specs[%d] is not {name = string, dtype =, shape = {up to 4 sizes}}"):format(i), 2)
    end
    local e = entries[i - 1]
    e.name = sp.name -- copied by the engine
    e.dtype = lib.enum(C.ur_dtype_parse, "ur_dtype", sp.dtype or "f32", "dtype", 2)
    e.ndim = #sp.shape
    for d, v in ipairs(sp.shape) do e.shape[d - 1] = v end
    index[sp.name] = i - 1
  end
  local keys, values = {}, {}
  for k in pairs(meta or {}) do
    if type(k) ~= "string" then error("checkpoint writer: metadata keys must be strings", 2) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  local ckeys = ffi.new("const char *[?]", #keys + 1)
  local cvalues = ffi.new("const char *[?]", #keys + 1)
  for i, k in ipairs(keys) do
    values[i] = meta_text(k, meta[k], 2)
    ckeys[i - 1], cvalues[i - 1] = k, values[i]
  end
  local out = ffi.new("ur_safetensors_writer *[1]")
  local ok, err = check(C.ur_safetensors_writer_open(out, streams.handle(opts.stream, 2), path, n, entries, #keys,
                                                     ckeys, cvalues, opts.staging or 0))
  if not ok then return nil, err end
  local h = ffi.gc(out[0], C.ur_safetensors_writer_free)
  return setmetatable({ h = h, index = index, path = path, stream = opts.stream }, Writer)
end

local function W(w, level)
  if w.h == nil then error("checkpoint writer: " .. w.path .. " was closed or abandoned", level + 1) end
  return w.h
end

-- Appends part's bytes to tensor `name`.  true, or nil, message (a part of another dtype, or
-- one that would pass the tensor's end, is refused naming both).
function writer_methods:put(name, part)
  local h = W(self, 2)
  local i = self.index[name]
  if not i then error(("checkpoint writer: %s has no tensor '%s'"):format(self.path, tostring(name)), 2) end
  return check(C.ur_safetensors_writer_put(streams.handle(self.stream, 2), h, i,
                                           lib.ptr(part, "checkpoint writer part", 2)))
end

function writer_methods:close()
  local h = W(self, 2)
  ffi.gc(h, nil)
  self.h = nil
  return check(C.ur_safetensors_writer_close(h))
end

-- Leaves path as it was (the temporary file removed); harmless twice.
function writer_methods:abandon()
  if self.h == nil then return end
  local h = self.h
  ffi.gc(h, nil)
  self.h = nil
  C.ur_safetensors_writer_free(h)
end

-- {tensors = {name = tensor}, meta = {key = string}, path = path}: zero-copy host views of
-- every tensor by default, or copies in opts.placement (and opts.device) through the staging
-- buffer.  nil, message when the file cannot be read or a tensor's bytes do not match their
-- checksum (views: read once to check them).
function M.load(path, opts)
  opts = opts or {}
  local f, err = M.open(path)
  if not f then return nil, err end
  local out = { tensors = {}, meta = f:meta(), path = path }
  if opts.placement then
    -- the copies are freed when the load fails (a device copy of a whole checkpoint was left to
    -- the garbage collector)
    local map = {}
    local function fail(msg)
      f:close()
      for _, t in pairs(map) do t:free() end
      return nil, msg
    end
    for _, name in ipairs(f:names()) do
      local info = f:info(name)
      local shape = #info.shape > 0 and info.shape or { 1 }
      local t, terr = tensor.tensor(shape, { dtype = info.dtype, placement = opts.placement,
                                             device = opts.device })
      if not t then return fail(terr) end
      map[name] = t
    end
    local ok, lerr = f:load(map, opts)
    if not ok then return fail(lerr) end
    f:close()
    out.tensors = map
    return out
  end
  local names = f:names()
  local bad = f:verify(names, { allow_nonfinite = true })
  if bad then f:close(); return nil, bad end
  for _, name in ipairs(names) do out.tensors[name] = assert(f:view(name)) end
  f:close()
  return out
end

-- ---- the registry ----

local Registry = {}
Registry.__index = Registry

function M.registry() return setmetatable({ list = {}, by_name = {} }, Registry) end

-- c = {name = "model", state = function() return {tensors = {...}, meta = {...}} end (owned =
--      true in what it returns: the tensors are copies made for this save, freed once written
--      or when the save fails),
--      load = function(tensors, meta) end (optional), views = true (optional: load receives
--      zero-copy views of the file's tensors instead of having state()'s tensors filled),
--      optional = true (a checkpoint without this component still loads), whole = {"step", ...}
--      (optional: meta keys that must be whole numbers >= 0, checked before anything is loaded),
--      check = function(views, meta, step) -> nil or why the file's state cannot be loaded
--      (optional: called with views of the component's tensors in the file and the file's
--      uvmrec.step before anything is written, so that load() does not fail with the other
--      components loaded; the views are freed when it returns, unless views = true gives them
--      to load)}.
function Registry:register(c)
  if type(c) ~= "table" then error("checkpoint register: expected a component table", 2) end
  if type(c.name) ~= "string" or not c.name:match("^[%w_%-]+$") then
    error("checkpoint register: name must be letters, digits, _ or -, got " .. tostring(c.name), 2)
  end
  if self.by_name[c.name] then error("checkpoint register: component '" .. c.name .. "' is already registered", 2) end
  if type(c.state) ~= "function" then error("checkpoint register: component '" .. c.name .. "' needs state()", 2) end
  if c.load ~= nil and type(c.load) ~= "function" then
    error("checkpoint register: component '" .. c.name .. "': load must be a function", 2)
  end
  if c.whole ~= nil and type(c.whole) ~= "table" then
    error("checkpoint register: component '" .. c.name .. "': whole must be a list of meta keys", 2)
  end
  if c.check ~= nil and type(c.check) ~= "function" then
    error("checkpoint register: component '" .. c.name .. "': check must be a function", 2)
  end
  self.list[#self.list + 1] = c
  self.by_name[c.name] = c
  return c
end

function Registry:unregister(name)
  local c = self.by_name[name]
  if not c then return false end
  self.by_name[name] = nil
  for i, x in ipairs(self.list) do if x == c then table.remove(self.list, i) break end end
  return true
end

function Registry:components()
  local out = {}
  for i, c in ipairs(self.list) do out[i] = c.name end
  return out
end

-- A component's tensors, meta and whether it owns them; false, why where its state() returned
-- nil, why (a state it cannot give now: the save or load is refused with why).
local function component_state(c, level)
  local st, why = c.state()
  if st == nil and why ~= nil then return false, tostring(why) end
  if type(st) ~= "table" then
    error(("checkpoint: component '%s': state() returned %s; expected {tensors = ..., meta = ...}"):format(
      c.name, type(st)), level + 1)
  end
  for k, t in pairs(st.tensors or {}) do
    if type(k) ~= "string" or k == "" or not is_tensor(t) then
      error(("checkpoint: component '%s': state().tensors must be {name = tensor}, got %s = %s"):format(
        c.name, tostring(k), tostring(t)), level + 1)
    end
  end
  return st.tensors or {}, st.meta or {}, st.owned == true
end

-- Saves every registered component's state into one file.  info: step (integer), rng
-- (a table), config (a table), staging, stream.  true, or nil, message.
function Registry:save(path, info)
  info = info or {}
  -- inf passed a check of its own and was written as uvmrec.step -9223372036854775808; a step
  -- from 2^53 was written, and load refused it (a Lua number holds whole numbers below 2^53)
  if info.step ~= nil and not lib.whole_in(info.step, 0, 2 ^ 53) then
    error("checkpoint save: step must be a whole number from 0 to below 2^53, got " .. tostring(info.step), 2)
  end
  local tensors, names = {}, {}
  local meta = { ["uvmrec.format"] = tostring(M.FORMAT), ["uvmrec.step"] = ("%d"):format(info.step or 0) }
  local version = ffi.string(C.ur_version())
  meta["uvmrec.version"] = version
  -- the copies components made for this save (owned), freed once written or refused
  local owned = {}
  local function fail(msg, level) -- level 0: msg names its place; else 3: save's caller's line
    for _, t in ipairs(owned) do t:free() end
    error(msg, level)
  end
  for _, c in ipairs(self.list) do
    local pok, ts, cm, own = pcall(component_state, c, 3) -- raises at save's caller (pcall a level)
    if not pok then fail(ts, 0) end
    if ts == false then
      for _, t in ipairs(owned) do t:free() end
      return nil, ("checkpoint save: component '%s': %s"):format(c.name, cm)
    end
    for k, t in pairs(ts) do
      tensors[c.name .. "." .. k] = t
      if own then owned[#owned + 1] = t end
    end
    local ok, text = pcall(json.encode, cm)
    if not ok then fail("checkpoint save: component '" .. c.name .. "' meta: " .. text, 3) end
    meta["uvmrec.meta." .. c.name] = text
    names[#names + 1] = c.name
  end
  meta["uvmrec.components"] = json.encode(names)
  for _, k in ipairs { "rng", "config" } do
    if info[k] ~= nil then
      local ok, text = pcall(json.encode, info[k])
      if not ok then fail("checkpoint save: " .. k .. ": " .. text, 3) end
      meta["uvmrec." .. k] = text
    end
  end
  -- (M.save raises only for input this function builds valid)
  local ok, err = M.save(path, { tensors = tensors, meta = meta }, info)
  for _, t in ipairs(owned) do t:free() end
  return ok, err
end

-- An ignored path covers what lies under it; a "*" in one stands for any one key
-- ("embeddings.tables.*.placement": every table's).
local function ignored(path, ignore)
  for _, p in ipairs(ignore or {}) do
    local pat = "^" .. (p:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", "[^.%%[]+")) .. "(.*)$"
    local rest = path:match(pat)
    if rest == "" or rest and (rest:sub(1, 1) == "." or rest:sub(1, 1) == "[") then return true end
  end
  return false
end

local function show(v)
  if v == nil then return "nothing" end
  return json.encode(v)
end

local function whole(v) return type(v) == "number" and v >= 0 and v == math.floor(v) and v < 2 ^ 53 end

-- The differences of two decoded JSON values (keys in order), skipping ignored paths: a list
-- of {path, a's value, b's value}, added to out.
local function diff(a, b, path, ignore, out)
  if ignored(path, ignore) then return out end
  -- a table on one side only is compared key by key with an empty one, so that keys ignored in
  -- it stay ignored (a table's own settings given in one config only)
  if type(a) == "table" and b == nil then b = {} end
  if type(b) == "table" and a == nil then a = {} end
  if type(a) == "table" and type(b) == "table" then
    local keys, seen = {}, {}
    for k in pairs(a) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
    for k in pairs(b) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
    table.sort(keys, function(x, y)
      if type(x) == type(y) then return x < y end
      return type(x) == "number"
    end)
    for _, k in ipairs(keys) do
      local sub = type(k) == "number" and ("%s[%d]"):format(path, k) or (path == "" and k or path .. "." .. k)
      diff(a[k], b[k], sub, ignore, out)
    end
    return out
  end
  if a ~= b then out[#out + 1] = { path == "" and "(the whole config)" or path, a, b } end
  return out
end
M.config_diff = function(a, b, ignore) return diff(a, b, "", ignore, {}) end

-- "config differs at k1 (the checkpoint has x, this run has y), k2 (...)", at most 8 named.
-- config_diff's differences as one message, the sides named (a: "the checkpoint", b: "this
-- run" by default): "config differs at 2 keys: train.lr (the checkpoint has 0.1, this run has
-- 0.2), ...".
local function diff_message(diffs, a, b)
  a, b = a or "the checkpoint", b or "this run"
  local parts = {}
  for i = 1, math.min(#diffs, 8) do
    local d = diffs[i]
    parts[i] = ("%s (%s has %s, %s has %s)"):format(d[1], a, show(d[2]), b, show(d[3]))
  end
  if #diffs > 8 then parts[#parts + 1] = ("and %d more"):format(#diffs - 8) end
  return ("config differs at %s: %s"):format(lib.things(#diffs, "key"), table.concat(parts, ", "))
end

M.diff_message = diff_message

local function shape_str(dtype, shape)
  return ("%s [%s]"):format(dtype, table.concat(shape, ", "))
end

-- Loads every registered component from path, after checking the format, the config (against
-- opts.config, skipping the dotted paths in opts.config_ignore), and that every component and
-- tensor is there with the same dtype and shape; nothing is written until all of that holds.
-- opts: config, config_ignore, config_fill (function(a copy of the checkpoint's config) -> the
-- config to compare: fills keys added to the schema since, with their defaults), staging, stream,
-- allow_nonfinite (take tensors holding NaN or infinity; by default such a file is refused,
-- naming the tensor and its first bad element, before anything is loaded).
-- Returns {step, rng, config, path, unused} (unused: components in the file that nobody
-- registered), or nil, message.
function Registry:load(path, opts)
  opts = opts or {}
  local f, err = M.open(path)
  if not f then return nil, err end
  -- views of the file made for components: those a check took are freed after it, the rest when
  -- the load fails (else a component's load takes them); each keeps the whole file mapped, with
  -- the pages a check read, until it is freed, which the garbage collector did at its own time
  local given = {}
  local function free_views()
    for _, views in ipairs(given) do
      for _, v in pairs(views) do v:free() end
    end
  end
  local function refuse(why)
    free_views()
    f:close()
    return nil, why
  end
  local function fail(msg) return refuse("checkpoint " .. path .. ": " .. msg) end
  local format = f:meta("uvmrec.format")
  if not format then return fail("not a uvmrec checkpoint (no uvmrec.format in its metadata)") end
  if tonumber(format) ~= M.FORMAT then
    return fail(("format %s, but this uvmrec reads format %d"):format(format, M.FORMAT))
  end
  -- absent: 0, as save writes a step it was not given
  local step = tonumber(f:meta("uvmrec.step") or 0)
  if not whole(step) then
    return fail(("uvmrec.step is %s; expected a whole number from 0 to below 2^53"):format(show(f:meta("uvmrec.step"))))
  end
  local decoded = {}
  for _, k in ipairs { { "components", "list of strings", "the names of its components" },
                       { "rng", nil, "the run's random state" }, { "config", "object", "the run's config" } } do
    local v, jerr = f:meta_json("uvmrec." .. k[1], k[2], { default = decoded, what = k[3] }) -- absent: decoded
    if jerr then return refuse(jerr) end
    if v ~= decoded then decoded[k[1]] = v end
  end
  if opts.config ~= nil then
    if decoded.config == nil then return fail("holds no config to check against this run's") end
    local mine = json.decode(json.encode(opts.config))
    local theirs = decoded.config
    if opts.config_fill then theirs = opts.config_fill(json.decode(json.encode(theirs))) end
    local diffs = diff(theirs, mine, "", opts.config_ignore, {})
    if #diffs > 0 then return fail(diff_message(diffs)) end
  end
  local in_file = {}
  for _, name in ipairs(decoded.components or {}) do in_file[name] = true end
  local by_comp = {}
  for _, name in ipairs(f:names()) do
    local comp, rest = name:match("^([^.]+)%.(.+)$")
    if comp then
      by_comp[comp] = by_comp[comp] or {}
      by_comp[comp][rest] = name
    end
  end
  local plan, map, verified = {}, {}, {}
  -- views of a component's tensors (file_names: rest -> full name) put in `into`, once their
  -- bytes matched their checksums (f:load below leaves those); nil, why where one did not
  local function verified_views(file_names, into)
    local list = {}
    for _, full in pairs(file_names) do list[#list + 1] = full end
    table.sort(list)
    local bad = f:verify(list, opts)
    if bad then return nil, bad end
    for _, full in ipairs(list) do verified[full] = true end
    given[#given + 1] = into
    for rest, full in pairs(file_names) do into[rest] = assert(f:view(full)) end
    return into
  end
  for _, c in ipairs(self.list) do
    if not in_file[c.name] then
      if not c.optional then
        local have = decoded.components and #decoded.components > 0 and table.concat(decoded.components, ", ") or "none"
        return fail(("has no component '%s' (it has: %s)"):format(c.name, have))
      end
    else
      local cm, jerr = f:meta_json("uvmrec.meta." .. c.name, "object",
        { default = {}, what = ("component '%s''s meta"):format(c.name) })
      if jerr then return refuse(jerr) end
      for _, k in ipairs(c.whole or {}) do
        if not whole(cm[k]) then
          return fail(("the meta of component '%s' has %s; expected a whole number >= 0"):format(c.name,
            cm[k] == nil and "no " .. k or k .. " " .. show(cm[k])))
        end
      end
      local tensors = {}
      local file_names = by_comp[c.name] or {}
      if c.views then
        local _, bad = verified_views(file_names, tensors)
        if bad then return refuse(bad) end
      else
        local ts, why = component_state(c, 2)
        if ts == false then return fail(("component '%s': %s"):format(c.name, why)) end
        for k, t in pairs(ts) do
          local full = c.name .. "." .. k
          local info = f:info(full)
          if not info then return fail(("has no tensor '%s' (component '%s')"):format(full, c.name)) end
          local want = t:size()
          local same = info.dtype == t:dtype() and #info.shape == #want
          for d = 1, #want do same = same and info.shape[d] == want[d] end
          if not same then
            return fail(("tensor '%s' is %s in the file but %s in this run"):format(
              full, shape_str(info.dtype, info.shape), shape_str(t:dtype(), want)))
          end
          map[full] = t
          tensors[k] = t
        end
        for rest, full in pairs(file_names) do
          if not ts[rest] then
            return fail(("holds tensor '%s', which component '%s' does not have"):format(full, c.name))
          end
        end
      end
      if c.check then
        local views = {}
        if c.views then views = tensors else
          -- what a check reads matched its checksum first
          local _, bad = verified_views(file_names, views)
          if bad then return refuse(bad) end
        end
        local why = c.check(views, cm, step)
        if why then return fail(("component '%s': %s"):format(c.name, why)) end
        if not c.views then
          for _, v in pairs(views) do v:free() end
          given[#given] = nil
        end
      end
      plan[#plan + 1] = { c = c, tensors = tensors, meta = cm }
    end
  end
  local ok, lerr = f:load(map, { staging = opts.staging, stream = opts.stream, allow_nonfinite = opts.allow_nonfinite,
                                 verified = verified })
  f:close()
  if not ok then
    free_views()
    return nil, lerr
  end
  for _, p in ipairs(plan) do
    if p.c.load then p.c.load(p.tensors, p.meta) end
  end
  local unused = {}
  for _, name in ipairs(decoded.components or {}) do
    if not self.by_name[name] then unused[#unused + 1] = name end
  end
  return { step = step, rng = decoded.rng, config = decoded.config, path = path, unused = unused }
end

-- ---- run directories ----

function M.path_for(rundir, step)
  return ("%s/ckpt-%012d.safetensors"):format(rundir, step)
end

-- The checkpoints of a run directory, oldest step first: {{path =, step =}, ...}.
function M.list(rundir)
  local names, err = lib.dir_list(rundir, "ckpt-", ".safetensors")
  if not names then return nil, err end
  local out = {}
  for _, name in ipairs(names) do
    local step = name:match(M.FILE_PATTERN)
    if step then out[#out + 1] = { path = rundir .. "/" .. name, step = tonumber(step) } end
  end
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

-- --resume RUNDIR|FILE: a file is itself; a run directory gives its newest checkpoint.
function M.latest(path)
  local kind = C.ur_path_kind(path)
  if kind == 1 then return path end
  if kind ~= 2 then return nil, "checkpoint: " .. path .. " is neither a run directory nor a checkpoint file" end
  local all, err = M.list(path)
  if not all then return nil, err end
  if #all == 0 then
    return nil, "checkpoint: the run directory " .. path .. " holds no checkpoint (ckpt-N.safetensors)"
  end
  return all[#all].path
end

-- The folder of a checkpoint's sharded tables (a run over ranks, uvmrec.dist.checkpoint):
-- ckpt-<step>.shards beside ckpt-<step>.safetensors, which is written after it.
function M.shards_path(path) return (path:gsub("%.safetensors$", "")) .. ".shards" end

-- Removes a folder of files (a checkpoint's .shards): its files, then itself.
local function remove_folder(dir)
  for _, name in ipairs(lib.dir_list(dir, "", "") or {}) do
    local ok, err = os.remove(dir .. "/" .. name)
    if not ok then return nil, "checkpoint rotate: " .. err end
  end
  local ok, err = os.remove(dir)
  if not ok then return nil, "checkpoint rotate: " .. err end
  return true
end

-- --keep K: removes all but the newest keep checkpoints (with their .shards folders), the
-- temporary files of saves that were killed, and the .shards folders older than the newest
-- checkpoint that no checkpoint file published (call it between saves, never during one).
-- Returns the removed paths.
function M.rotate(rundir, keep)
  -- inf (math.huge) kept everything, silently
  lib.whole(keep, "checkpoint rotate: keep", 2, 1)
  local all, err = M.list(rundir)
  if not all then return nil, err end
  local removed = {}
  for i = 1, #all - keep do
    local ok, rerr = os.remove(all[i].path)
    if not ok then return nil, "checkpoint rotate: " .. rerr end
    removed[#removed + 1] = all[i].path
  end
  local kept, newest = {}, all[#all] and all[#all].step or -1
  for i = math.max(1, #all - keep + 1), #all do kept[all[i].step] = true end
  local stale = lib.dir_list(rundir, "ckpt-", "") or {}
  for _, name in ipairs(stale) do
    local p = rundir .. "/" .. name
    local step = tonumber(name:match("^ckpt%-(%d+)%.shards$"))
    if name:match("^ckpt%-%d+%.safetensors%.tmp%-") then
      if os.remove(p) then removed[#removed + 1] = p end
    elseif step and not kept[step] and step <= newest and C.ur_path_kind(p) == 2 then
      local ok, rerr = remove_folder(p)
      if not ok then return nil, rerr end
      removed[#removed + 1] = p
    end
  end
  return removed
end

-- One call for --checkpoint-every: saves rundir/ckpt-<step>.safetensors (making rundir if
-- needed), then keeps the newest info.keep.  Returns the path, or nil, message.
function Registry:save_step(rundir, info)
  if type(info) ~= "table" or type(info.step) ~= "number" then
    error("checkpoint save_step: info.step is required", 2)
  end
  -- before the save: a bad keep failed rotate after it
  if info.keep ~= nil then lib.whole(info.keep, "checkpoint save_step: info.keep", 2, 1) end
  local ok, err = check(C.ur_dir_create(rundir))
  if not ok then return nil, err end
  local path = M.path_for(rundir, info.step)
  ok, err = self:save(path, info)
  if not ok then return nil, err end
  if info.keep then
    local _, rerr = M.rotate(rundir, info.keep)
    if rerr then return nil, rerr end
  end
  return path
end

return M
