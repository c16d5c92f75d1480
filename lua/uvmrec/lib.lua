-- The engine's shared library, loaded once: the namespace every module uses, and the one
-- helper that turns a ur_status into Lua's error conventions.  Also the small host helpers
-- every module, script and spec shares:
--   lib.read_file(path)    -- a whole file's bytes; nil, the system's message when it cannot be read
--   lib.shell_quote(s)     -- s (tostring'd) as one single-quoted word for sh: 'it'\''s'
--   lib.dir_list(dir, prefix, suffix) -- the names in a folder, sorted
local ffi = require "ffi"

ffi.cdef(require "uvmrec.cdef")

local function find()
  local env = os.getenv("UVMREC_LIB")
  if env and env ~= "" then return env end
  local path = package.searchpath("libuvmrec", package.cpath)
  if path then return path end
  error("uvmrec: libuvmrec.so not found on package.cpath (" .. package.cpath ..
        "); run `make` and `eval $(make -s env)`, or set UVMREC_LIB", 0)
end

-- A host program that links the engine statically exports its symbols: use them.
local C
do
  local ok = pcall(function() return ffi.C.ur_version end)
  C = ok and ffi.C or ffi.load(find())
end

local M = { C = C }

-- Misuse (UR_STATUS_INVALID) raises at the caller's caller; environmental failures (memory,
-- device, missing GPU) return nil, message.
function M.check(st, level)
  if st == 0 then return true end
  local msg = ffi.string(C.ur_last_error())
  if st == C.UR_STATUS_INVALID then error(msg, (level or 2) + 1) end
  return nil, msg
end

-- Like check, but raises for every failure: for calls whose only failures are misuse.
function M.must(st, level)
  if st == 0 then return true end
  error(ffi.string(C.ur_last_error()), (level or 2) + 1)
end

local loc_buf = ffi.new("char[32]")
local loc_out = ffi.new("int32_t[1]")

-- Locations: "cpu", "gpu", "cuda:N", or an integer (-1 the CPU, N >= 0 a GPU).
function M.location(v, level)
  if type(v) ~= "string" and type(v) ~= "number" then
    error("location: expected cpu, gpu, cuda:N or a device number, got " .. type(v), (level or 2) + 1)
  end
  M.must(C.ur_location_parse(tostring(v), loc_out), (level or 2) + 1)
  return loc_out[0]
end

-- The current GPU where there is one, else `none` (-1, the CPU, for an object's own default;
-- 0 for a placement on a device, whose calls then say that there is no GPU).
local dev_out = ffi.new("int32_t[1]")
function M.current_device(none)
  if C.ur_device_count() == 0 then return none end
  C.ur_device_get(dev_out)
  return dev_out[0]
end

-- An object's `device` option: a location, or nil for the current GPU (the CPU without one).
-- "gpu" is the current GPU (0 without one: the object then says there is none).
function M.device_option(device, level)
  if device == nil then return M.current_device(-1) end
  local loc = M.location(device, (level or 2) + 1) -- not a tail call: the level counts this frame
  if loc == C.UR_LOC_CURRENT_GPU then return M.current_device(0) end
  return loc
end

function M.location_name(loc)
  if C.ur_location_format(loc, loc_buf, 32) ~= 0 then return tostring(loc) end
  return ffi.string(loc_buf)
end

-- An enum from its name, through the engine's parser (one spelling everywhere).
function M.enum(parse, ctype, v, what, level)
  local out = ffi.new(ctype .. "[1]")
  if type(v) ~= "string" then
    error(what .. ": expected a name, got " .. type(v), (level or 2) + 1)
  end
  M.must(parse(v, out), (level or 2) + 1)
  return out[0]
end

-- Handles: a small struct boxing the engine's pointer, so that t[i] reaches the metatable
-- (a bare pointer would be indexed as an array) and free() can clear it.  The finalizer frees
-- what free() has not; free() twice is harmless, any other use after it an error.  Returns
-- wrap(p), free(h) and is(v), true for a handle of this type (freed or not).
function M.handle_type(ctype, cfree, mt)
  local box = ffi.metatype(ffi.typeof("struct { " .. ctype .. " *p; }"), mt)
  local function finalize(b)
    if b.p ~= nil then
      cfree(b.p)
      b.p = nil
    end
  end
  local function wrap(p) return ffi.gc(box(p), finalize) end
  local function free(b)
    ffi.gc(b, nil)
    finalize(b)
  end
  local function is(v) return ffi.istype(box, v) end
  return wrap, free, is
end

-- The names in dir that start with prefix and end with suffix, sorted; nil, message when dir
-- cannot be listed.
function M.dir_list(dir, prefix, suffix)
  local size = 4096
  while true do
    local buf, needed = ffi.new("char[?]", size), ffi.new("uint64_t[1]")
    local ok, err = M.check(C.ur_dir_list(dir, prefix, suffix, buf, size, needed))
    if not ok then return nil, err end
    if tonumber(needed[0]) <= size then
      local out = {}
      for name in ffi.string(buf):gmatch("([^\n]+)\n") do out[#out + 1] = name end
      return out
    end
    size = tonumber(needed[0])
  end
end

-- The bytes of the file at path, whole; nil, the system's message naming the path ("path: No
-- such file or directory", "path: Is a directory") when it cannot be read.
function M.read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text, rerr = f:read("*a")
  f:close()
  if not text then return nil, path .. ": " .. tostring(rerr) end
  return text
end

-- A new empty file beside path for what is to replace it (ur_file_temp: path.tmp-XXXXXX, a name
-- no other file has): its name, or nil and why.  Renamed onto path once whole, else removed.
function M.temp_file(path)
  local buf = ffi.new("char[?]", #path + 12)
  local ok, err = M.check(C.ur_file_temp(path, buf, #path + 12))
  if not ok then return nil, err end
  return ffi.string(buf)
end

-- A signal the engine catches (ur_signals_catch: SIGINT 2, SIGTERM 15) as messages name it.
function M.signal_name(sig)
  return ({ [2] = "SIGINT", [15] = "SIGTERM" })[sig] or ("signal " .. tostring(sig))
end

-- The CRC32C of string s as 8 hex digits, as the safetensors files keep theirs (ur_crc32c).
function M.crc32c(s) return ("%08x"):format(C.ur_crc32c(0, s, #s)) end

-- Whether a file can be made at path, asked before the work that fills it: true, or nil and what
-- stands in the way ("Is a directory" where path is a folder, "DIR: No such file or directory"
-- where its folder is missing); permissions are left to the write itself.
function M.file_target(path)
  local f = io.open(path, "rb")
  if f then
    local _, err = f:read(0)
    f:close()
    if err then return nil, tostring(err) end
    return true
  end
  local dir = path:match("^(.*)/[^/]*$") or "."
  if dir == "" then dir = "/" end
  local d, derr = io.open(dir, "rb")
  if not d then return nil, derr end
  local _, isdir = d:read(0) -- a folder reads as "Is a directory"
  d:close()
  if not isdir then return nil, dir .. ": Not a directory" end
  return true
end

pcall(ffi.cdef, "char *realpath(const char *path, char *resolved_path);") -- a host may have declared it
local resolved = ffi.new("char[4096]") -- PATH_MAX

-- Whether paths a and b name one existing file (through links and ../): a command's --out that
-- is its own input would replace what it reads.
function M.same_file(a, b)
  if ffi.C.realpath(a, resolved) == nil then return false end
  local ra = ffi.string(resolved)
  return ffi.C.realpath(b, resolved) ~= nil and ffi.string(resolved) == ra
end

-- "1 step", "2 steps", "0 samples": a whole count and its noun, plural but for 1 (every message's
-- plural: uvmrec.train.progress gives it as progress.things); plural: a noun's that is not
-- noun .. "s" (things(2, "batch", "batches")).
function M.things(n, noun, plural)
  return ("%d %s"):format(n, n == 1 and noun or plural or noun .. "s")
end

-- The config value a command's flag gives, as uvmrec.train.config.load takes it:
-- flag_set("--steps", "train.steps", 5) is {"train.steps=5", flag = "--steps 5"}, whose messages
-- name the flag given, not a --set that was not.  Whole numbers as written ('..' wrote 1e30 as
-- 1e+30, and %d wrapped it to -2^63).
-- A value as a message shows what was given: a string quoted ('hbm'), anything else as tostring.
function M.shown(v) return type(v) == "string" and ("'%s'"):format(v) or tostring(v) end

function M.flag_set(flag, path, v)
  local text = type(v) == "number" and v == math.floor(v) and ("%.0f"):format(v) or tostring(v)
  return { path .. "=" .. text, flag = flag .. " " .. text }
end

-- s as one word for the shell: single-quoted, each ' written '\''.
function M.shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local UNITS = { B = 1, KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12, KIB = 2 ^ 10, MIB = 2 ^ 20, GIB = 2 ^ 30,
                TIB = 2 ^ 40 }

-- Bytes from a whole number >= 0 or a string such as "512MiB" or "16 GB" (B, KB .. TB, KiB ..
-- TiB, in any case; a fraction of a unit rounds down), below 2^63 (M.whole_in: the engine's
-- uint64_t took 2^64 as 0, so set_hbm_budget(2^64) removed the budget), or nil and what is wrong.
function M.bytes(v)
  local b
  if type(v) == "number" then
    b = v
  elseif type(v) == "string" then
    local n, u = v:match("^%s*([%d%.]+)%s*(%a*)%s*$")
    local scale = n and UNITS[u ~= "" and u:upper() or "B"]
    b = scale and tonumber(n) and math.floor(tonumber(n) * scale)
  end
  if b and M.whole_in(b, 0, 2 ^ 63) then return b end
  if b and b >= 2 ^ 63 and b < math.huge then
    return nil, ("'%s' is 2^63 bytes or more; expected a size below 2^63 bytes"):format(tostring(v))
  end
  return nil, ("'%s' is not a size; expected a number of bytes or e.g. '16GiB'"):format(tostring(v))
end

local I64, U64 = ffi.typeof("int64_t"), ffi.typeof("uint64_t")
local function is_int64(x) return type(x) == "cdata" and (ffi.istype(I64, x) or ffi.istype(U64, x)) end

-- The one rule for "a whole number in range", under element and whole: x when it is a whole
-- number from lo to below hi (Lua numbers, -2^63 <= lo, hi <= 2^63), else nil.  A cast would
-- have truncated 1.5 to 1 and turned NaN, inf or 2^63 into INT64_MIN.  With ints, a 64-bit
-- integer (9007199254740993LL: ids past 2^53, which no Lua number holds) is one too, returned
-- as an int64_t.
function M.whole_in(x, lo, hi, ints)
  if type(x) == "number" then
    if x == math.floor(x) and x >= lo and x < hi then return x end
    return nil
  end
  if not (ints and is_int64(x)) then return nil end
  -- 2^63 compares as a uint64_t exactly (as an int64_t it has no value); nor is -2^63 or 2^63 a
  -- bound an int64_t can be compared with, nor one it can pass
  local v = ffi.istype(I64, x) and x or x < 2 ^ 63 and ffi.cast(I64, x) or nil
  if v and (lo <= -2 ^ 63 or v >= lo) and (hi >= 2 ^ 63 or v < hi) then return v end
  return nil
end

-- The whole numbers an integer dtype holds: [lo, hi).
local WHOLE = { i64 = { -2 ^ 63, 2 ^ 63 }, i32 = { -2 ^ 31, 2 ^ 31 } }

-- element's error, its name made only then: id_array checks every id of a list through element
local function element_error(what, k, got, want, level)
  error(("%s is %s; expected %s"):format(k and ("%s[%d]"):format(what, k) or what, got, want), level + 1)
end

-- x as element k of list `what` for an array of dtype (i64, i32; any number for others), or an
-- error "<what>[k] is 1.5; expected a whole number that fits i64" at level; k nil: x is `what`
-- itself (a single value bound for such a type).  An integer dtype also takes a 64-bit integer
-- (M.whole_in).
function M.element(x, dtype, what, k, level)
  local w = WHOLE[dtype]
  local v = w and M.whole_in(x, w[1], w[2], true)
  if v then return v end
  if type(x) ~= "number" and not (w and is_int64(x)) then element_error(what, k, type(x), "a number", level + 1) end
  if w then element_error(what, k, tostring(x), "a whole number that fits " .. dtype, level + 1) end
  return x
end

-- v, a whole number >= lo (default 0) and below 2^63 (M.whole_in), for an option the engine
-- takes as an integer (a cast made math.huge -2^63 in the engine's messages, and a seed of 2^64
-- the seed 0); else "<what> is v; expected a whole number >= lo" (or "below 2^63") at level.
-- hi, if given, bounds it too (an int32_t field): "expected a whole number from lo to hi".
-- lo = -2^63 takes any whole number an int64_t holds ("expected a whole number"); with ints, a
-- 64-bit integer is taken too and returned as an int64_t (M.whole_in).
function M.whole(v, what, level, lo, hi, ints)
  lo = lo or 0
  local w = M.whole_in(v, lo, hi and hi + 1 or 2 ^ 63, ints)
  if w then return w end
  local num = type(v) == "number" and v == math.floor(v) -- whole, or infinite
  local want = hi and (" from %d to %d"):format(lo, hi) or num and v >= lo and " below 2^63"
               or lo > -2 ^ 63 and (" >= %d"):format(lo) or num and " >= -2^63" or ""
  error(("%s is %s; expected a whole number%s"):format(what, tostring(v), want), level + 1)
end

-- Refuses a key of table t that is not in keys (nor in the set `also`, keys it holds besides):
-- "<what>: unknown <noun> 'k'; expected a, b, c" at level (noun: "option" by default; `note`,
-- if given, follows in parentheses).  keys is a list of names, in the order the message gives
-- them, or a table name -> true, or name -> the Lua type its value takes ("boolean"), named in
-- sorted order; a value of another type is "<what>: k is v; expected a boolean".  A misspelt
-- option would otherwise leave its setting at the default, silently.
function M.known_keys(t, keys, what, level, noun, also, note)
  local set, names = keys, keys
  if keys[1] ~= nil then
    set = {}
    for _, k in ipairs(keys) do set[k] = true end
  end
  for k, v in pairs(t) do
    local want = set[k]
    if not want and not (also and also[k]) then
      if names == set then
        names = {}
        for n in pairs(set) do names[#names + 1] = n end
        table.sort(names)
      end
      error(("%s: unknown %s '%s'; expected %s%s"):format(what, noun or "option", tostring(k),
            table.concat(names, ", "), note and (" (" .. note .. ")") or ""), level + 1)
    end
    if type(want) == "string" and type(v) ~= want then
      error(("%s: %s is %s; expected a %s"):format(what, tostring(k), tostring(v), want), level + 1)
    end
  end
end

-- A call's options: opts (nil: {}), a table whose keys known_keys takes (note as its); another
-- value is refused at level, "<what>: options are number 3; expected a table such as <example>"
-- (the FFI would have truncated, wrapped or ignored what it was given).
function M.options(opts, keys, what, example, level, note)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(("%s: options are %s %s; expected a table such as %s"):format(what, type(opts), tostring(opts), example),
          level + 1)
  end
  M.known_keys(opts, keys, what, level + 1, nil, nil, note)
  return opts
end

-- A Lua list of ids as an int64_t array and its length, each checked by M.element.
function M.id_array(list, what, level)
  local n = #list
  local a = ffi.new("int64_t[?]", math.max(n, 1))
  for k = 1, n do a[k - 1] = M.element(list[k], "i64", what, k, (level or 1) + 1) end
  return a, n
end

-- The engine pointer of a handle, or an error naming the object when it was freed or is no
-- handle at all (a table or number in a handle's place, such as quantize()'s second result
-- passed on as a stream, was "used after free()").  A shorthand over it (T, S, H, ...) keeps its
-- result in a local before returning it: a tail call drops the shorthand's frame from the levels
-- error() counts, and the message would name the caller's caller, or no line.
function M.ptr(h, what, level)
  if type(h) ~= "cdata" then error(("%s: expected a handle, got a %s"):format(what, type(h)), (level or 2) + 1) end
  local p = h.p
  if p == nil then error(what .. ": used after free()", (level or 2) + 1) end
  return p
end

-- The shorthands of an object over an engine handle (self.h) for its methods, each pointing
-- its error at the line that called the method (level 2 from the method, as error() counts):
-- H(self) the handle's pointer (`what` names the object once it was freed), S(stream) an
-- optional stream's (nil: the default stream), T(t, name) a tensor's.
--   local H, S, T = lib.method_ptrs("embedding collection")
function M.method_ptrs(what)
  local streams = require "uvmrec.stream"
  -- (none a tail call: M.ptr)
  local function H(self, level)
    local p = M.ptr(self.h, what, (level or 2) + 1)
    return p
  end
  local function S(s, level)
    local p = streams.handle(s, (level or 2) + 1)
    return p
  end
  local function T(t, name, level)
    local p = M.ptr(t, name, (level or 2) + 1)
    return p
  end
  return H, S, T
end

return M
