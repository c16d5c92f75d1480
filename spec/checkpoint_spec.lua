local ffi = require "ffi"
local ur = require "uvmrec"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local h = require "helpers"
local command = require "command"
local C = ur.C
local bit = require "bit"

-- A scratch directory for this file's specs, removed at the end.
local root = command.tmpdir()
local serial = 0
local function scratch(name)
  serial = serial + 1
  return ("%s/%d-%s"):format(root, serial, name)
end

local write_file = command.spit

-- good's tensors saved at path with its metadata, but key set to value (nil: left out).
local function saved_with(path, good, key, value)
  local meta = {}
  for k, v in pairs(good.meta) do meta[k] = v end
  meta[key] = value
  assert(ck.save(path, { tensors = good.tensors, meta = meta }))
end
local function read_file(path) return assert(command.slurp(path)) end

local function le64(n)
  local b = {}
  for i = 1, 8 do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(b)
end

-- A safetensors file from a header text and data bytes, as written by hand: the header padded
-- with spaces to a multiple of 8 unless its length is given.
local function craft(name, header, data, len)
  if not len then header = header .. (" "):rep(-#header % 8) end
  return write_file(scratch(name), le64(len or #header) .. header .. (data or ""))
end

-- The status and message of opening path, straight from the C API.
local function open_status(path)
  local out = ffi.new("ur_safetensors *[1]")
  local st = C.ur_safetensors_open(out, path)
  if st == 0 then C.ur_safetensors_close(out[0]) end
  return st, ffi.string(C.ur_last_error())
end

-- Runs a Lua script in a child process under bash (prefix: shell lines before it, such as a
-- file-size limit); returns its output and exit code.  The child is the uvmrec command where
-- there is one (a dist tree has no luajit), else luajit.
local function child(script, prefix)
  local bin = command.bin()
  if C.ur_path_kind(bin) ~= 1 then bin = "luajit" end
  local file = write_file(scratch("child.lua"), script)
  local sh = write_file(scratch("child.sh"), ("%s\nexec %s %s\n"):format(prefix or "",
    command.quote(bin), command.quote(file)))
  local p = io.popen("bash " .. command.quote(sh) .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- Values a dtype holds exactly, drawn at random (never zeros).
local function random_tensor(shape, dtype, placement, seed)
  local lo, hi = -100, 100
  if dtype == "u8" then lo, hi = 1, 255 elseif dtype == "i8" then lo, hi = -128, 127 end
  local t = ur.tensor(shape, { dtype = dtype })
  if dtype:match("^[iu]") then t:uniform(lo, hi, seed) else t:uniform(-3, 3, seed) end
  if placement == "host" then return t end
  return assert(t:to(placement))
end

-- A random host tensor saved alone, as "t", to path: the tensor and the file's bytes.
local function saved(path, shape, dtype, seed)
  local t = random_tensor(shape, dtype, "host", seed)
  assert(ck.save(path, { tensors = { t = t } }))
  return t, read_file(path)
end

-- path still holds what saved() wrote there: the same bytes, loading as t.
local function unchanged(path, t, bytes)
  assert.equal(bytes, read_file(path))
  assert.same(t:totable(), assert(ck.load(path)).tensors.t:totable())
end

teardown(function() command.rmdir(root) end)

local crc32c = require("helpers").crc32c

describe("uvmrec.checkpoint files", function()
  it("writes the safetensors layout byte for byte (a small example computed by hand)", function()
    local ids = ur.tensor({ 2 }, { dtype = "i64" })
    ids[0], ids[1] = 7, -1
    local w = ur.tensor({ 1, 2 }, { dtype = "f32" })
    w[0], w[1] = 1.5, -2
    local b = ur.tensor({ 2 }, { dtype = "bf16" })
    b[0], b[1] = 1, -0.5
    local u = ur.tensor({ 3 }, { dtype = "u8" })
    u[0], u[1], u[2] = 1, 2, 255
    local path = scratch("hand.safetensors")
    assert(ck.save(path, { tensors = { w = w, ids = ids, b = b, u = u }, meta = { step = "7" } }))
    -- Widest dtype first, then by name (the reference's order): ids, w, b, u.  The metadata
    -- ends with each tensor's CRC32C, then the CRC32C of what the header says (its metadata by
    -- key, its tensors by name).  The JSON is 384 bytes, a multiple of 8, so the data starts at
    -- byte 392, 8-aligned.
    local data = {
      ids = "\7\0\0\0\0\0\0\0" .. "\255\255\255\255\255\255\255\255", -- i64 7, -1
      w = "\0\0\192\63" .. "\0\0\0\192",                                -- f32 1.5 (0x3fc00000), -2
      b = "\128\63" .. "\0\191",                                        -- bf16 1 (0x3f80), -0.5 (0xbf00)
      u = "\1\2\255" }                                                  -- u8
    assert.equal("e3069283", crc32c("123456789"))
    local crcs = ('{\\"ids\\":\\"%s\\",\\"w\\":\\"%s\\",\\"b\\":\\"%s\\",\\"u\\":\\"%s\\"}'):format(
      crc32c(data.ids), crc32c(data.w), crc32c(data.b), crc32c(data.u))
    local said = "step\0" .. "7\0" .. "uvmrec.crc32c\0" .. crcs:gsub("\\", "") .. "\0"
      .. "b\0BF16 [2] 24 28\0" .. "ids\0I64 [2] 0 16\0" .. "u\0U8 [3] 28 31\0" .. "w\0F32 [1, 2] 16 24\0"
    local header = '{"__metadata__":{"step":"7","uvmrec.crc32c":"' .. crcs .. '",' ..
      '"uvmrec.header_crc32c":"' .. crc32c(said) .. '"},' ..
      '"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},' ..
      '"w":{"dtype":"F32","shape":[1,2],"data_offsets":[16,24]},' ..
      '"b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},' ..
      '"u":{"dtype":"U8","shape":[3],"data_offsets":[28,31]}}'
    assert.equal(384, #header)
    local want = "\128\1\0\0\0\0\0\0" .. header .. data.ids .. data.w .. data.b .. data.u
    assert.equal(423, #want)
    assert.equal(want, read_file(path))
  end)

  it("writes an empty file as the reference does", function()
    local path = scratch("empty.safetensors")
    assert(ck.save(path, { tensors = {} }))
    assert.equal("\8\0\0\0\0\0\0\0{}      ", read_file(path))
    local f = assert(ck.open(path))
    assert.same({}, f:names())
  end)

  it("round-trips every dtype in every placement, exactly, as views and as copies", function()
    local tensors, want = {}, {}
    for pi, place in ipairs(h.placements()) do
      for di, dt in ipairs(h.dtypes) do
        local name = place .. "/" .. dt
        tensors[name] = random_tensor({ 7, 5 }, dt, place, pi * 10 + di)
        want[name] = tensors[name]:totable()
      end
    end
    local path = scratch("all.safetensors")
    assert(ck.save(path, { tensors = tensors, meta = { note = "every dtype" } }, { staging = 8192 }))
    local st = assert(ck.load(path))
    assert.equal("every dtype", st.meta.note)
    for name, vals in pairs(want) do
      assert.equal(name:match("/(.*)"), st.tensors[name]:dtype())
      assert.same({ 7, 5 }, st.tensors[name]:size())
      assert.same(vals, st.tensors[name]:totable(), name)
    end
    local f = assert(ck.open(path))
    for _, place in ipairs(h.placements()) do
      local dsts = {}
      for name in pairs(want) do
        dsts[name] = ur.tensor({ 7, 5 }, { dtype = name:match("/(.*)"), placement = place })
      end
      assert(f:load(dsts, { staging = 8192 }))
      for name, vals in pairs(want) do assert.same(vals, dsts[name]:totable(), place .. " <- " .. name) end
    end
    local copies = assert(ck.load(path, { placement = "managed" }))
    assert.equal("managed", copies.tensors["host/i32"]:placement())
    assert.same(want["host/i32"], copies.tensors["host/i32"]:totable())
  end)

  it("streams a table through a staging buffer far smaller than it, chunks splitting elements", function()
    -- 1.2 MB through 4 KiB halves: 293 chunks, none aligned to the 12-byte rows.
    local t = ur.uvm_tensor({ 100003, 3 }):uniform(-1, 1, 77)
    local small = ur.tensor({ 5 }, { dtype = "i64" }):uniform(-50, 50, 3)
    local path = scratch("big.safetensors")
    assert(ck.save(path, { tensors = { table = t, small = small } }, { staging = 8192 }))
    local f = assert(ck.open(path))
    local v = f:view("table")
    local want = t:totable()
    assert.same(want, v:totable())
    local back = ur.uvm_tensor({ 100003, 3 })
    assert(f:read("table", back, { staging = 8192 }))
    assert.same(want, back:totable())
    assert.same(small:totable(), f:view("small"):totable())
  end)

  it("saves and loads a 64 MiB managed table with host memory growing by about the 1 MiB staging buffer", function()
    local path = scratch("rss.safetensors")
    local out, rc = child(([[
      local ur = require "uvmrec"
      local ck = require "uvmrec.checkpoint"
      local function hwm() return assert(require("uvmrec.host_memory").peak()) / 2 ^ 20 end
      local t = ur.uvm_tensor({ 16 * 1024 * 1024 }):uniform(-1, 1, 5)
      local u = ur.uvm_tensor({ 16 * 1024 * 1024 }):fill(0)
      local base = hwm()
      assert(ck.save("%s", { tensors = { t = t } }, { staging = 1048576 }))
      local saved = hwm()
      assert(ck.open("%s"):read("t", u, { staging = 1048576 }))
      local loaded = hwm()
      assert(u:get(12345678) == t:get(12345678) and u:get(0) == t:get(0))
      print(("growth %%.1f %%.1f"):format(saved - base, loaded - base))
    ]]):format(path, path))
    assert.equal(0, rc, out)
    local save_mb, load_mb = out:match("growth ([%d.]+) ([%d.]+)")
    assert.truthy(save_mb, out)
    assert.is_true(tonumber(save_mb) < 8, out)
    assert.is_true(tonumber(load_mb) < 8, out)
  end)

  it("hands out views that share the file's pages, outlive close(), and never write the file", function()
    local path = scratch("views.safetensors")
    local t, bytes = saved(path, { 4, 3 }, "f32", 5)
    local f = assert(ck.open(path))
    local v1, v2 = f:view("t"), f:view("t")
    f:close()
    assert.same(t:totable(), v1:totable())
    v1[0] = 123.5 -- views of one open file share its pages, as views of one tensor do
    assert.equal(123.5, v2[0])
    assert.equal(bytes, read_file(path))
    v1:free()
    assert.equal(123.5, v2[0])
    assert.same(t:totable(), assert(ck.open(path)):view("t"):totable())
    local missing, err = assert(ck.open(path)):view("nope")
    assert.is_nil(missing)
    assert.matches("has no tensor 'nope'", err)
  end)

  it("replaces the previous file only when the new one is complete, and cleans up after a failure", function()
    local path = scratch("atomic.safetensors")
    local old, before = saved(path, { 10 }, "f32", 1)
    -- A full disk, emulated by a 64 KiB file-size limit (SIGXFSZ ignored, so write fails).
    local out, rc = child(([[
      local ur = require "uvmrec"
      local ck = require "uvmrec.checkpoint"
      local t = ur.uvm_tensor({ 100000 }):uniform(-1, 1, 9)
      print(ck.save("%s", { tensors = { t = t } }, { staging = 8192 }))
    ]]):format(path), "ulimit -f 64; trap '' XFSZ")
    assert.equal(0, rc, out)
    assert.matches("safetensors: writing " .. path:gsub("%p", "%%%0") ..
      "%.tmp%-%w+ failed after 65536 of 400%d+ bytes: File too large; .* is unchanged", out)
    unchanged(path, old, before)
    local name = path:match("[^/]+$")
    assert.same({ name }, require("uvmrec.lib").dir_list(root, name)) -- no temporary file (name.tmp-...) left
  end)

  it("leaves the previous file loadable when the saving process is killed mid-write", function()
    local dir = scratch("killed")
    assert(C.ur_dir_create(dir) == 0)
    local path = ck.path_for(dir, 5)
    local old, before = saved(path, { 10 }, "i32", 2)
    -- The file-size limit's signal kills the child in the middle of its write, as a crash would.
    local out, rc = child(([[
      local ur = require "uvmrec"
      local ck = require "uvmrec.checkpoint"
      ck.save("%s", { tensors = { t = ur.tensor({ 100000 }):fill(3) } })
      print("not reached")
    ]]):format(path), "ulimit -f 64")
    assert.equal(128 + 25, rc, out) -- SIGXFSZ
    assert.not_matches("not reached", out)
    unchanged(path, old, before)
    -- The killed save's temporary file stays until rotation clears it.
    local tmp = io.popen("ls " .. dir):read("*a")
    assert.matches("ckpt%-000000000005%.safetensors%.tmp%-", tmp)
    local removed = assert(ck.rotate(dir, 3))
    assert.equal(1, #removed)
    assert.matches("%.tmp%-", removed[1])
    assert.equal(ck.path_for(dir, 5), ck.latest(dir))
  end)

  it("fails a save into a missing directory with an IO error, writing nothing", function()
    local ok, err = ck.save(root .. "/no/such/dir/x.safetensors", { tensors = { t = ur.tensor({ 1 }) } })
    assert.is_nil(ok)
    assert.matches("cannot create a temporary file beside .*/no/such/dir/x.safetensors: No such file", err)
  end)

  it("names the file it was writing for every host allocation of a save that fails, publishing nothing", function()
    -- build/bin/model_oom FILE save (spec/support/model_oom.c) fails each host allocation of a save in
    -- turn: each said 'safetensors save: out of host memory' (the header's 'safetensors: out of host
    -- memory', the staging buffer's 'tensor: out of host memory'), naming no file, and a tensor's name
    -- that could not be copied was sorted anyway: strcmp of NULL, a segmentation fault
    local p = h.test_program("model_oom")
    if not p then return end
    local dir = command.tmpdir()
    local path = dir .. "/f.safetensors"
    local out, err, code = command.sh(("%s %s save"):format(p, command.quote(path)))
    assert.equal(0, code, out .. err)
    local n, failed = out:match("\nsave: (%d+) allocations, (%d+) failed\n$")
    assert.truthy(n, out)
    assert.equal(n, failed, "each allocation that fails fails the save")
    assert.is_true(tonumber(n) > 20, n .. " allocations")
    local lines, seen, last = 0, {}, nil
    for k, line in out:gmatch("save (%d+): ([^\n]*)") do
      if line:find(" published$") then
        -- the folder's sync after the rename, the last allocation: the file is whole, and said so
        assert.equal(n, k, line)
        assert.equal(path .. " published", line)
      else
        lines = lines + 1
        assert.equal("-2 safetensors save: " .. path, line:sub(1, #path + 21), line)
        seen[(line:sub(#path + 22):gsub("%(%d+ bytes%)", "(N bytes)"))] = true
        last = line
      end
    end
    assert.equal(tonumber(n), lines)
    assert.equal(("-2 safetensors save: %s is written, but its directory was not synced: out of host memory for a copy "
      .. "of its path (%d bytes)"):format(path, #path + 1), last)
    for _, want in ipairs {
      ": out of host memory for the list of its 3 tensors (N bytes)",
      ": out of host memory for a writer (N bytes)",
      ": out of host memory for its 3 tensors' entries (N bytes)",
      ": out of host memory for its path (N bytes)",
      ": out of host memory for the list of its 2 metadata entries (N bytes)",
      ": out of host memory for a copy of metadata entry 0's key (N bytes)",
      ": out of host memory for a copy of metadata entry 1's value (N bytes)",
      ": out of host memory for tensor 'table''s name (N bytes)",
      ": out of host memory for its header's checksum over 3 metadata pairs and 3 tensors (N bytes)",
      ": out of host memory for its header (N bytes)",
      ": tensor 'table': a staging buffer of 1048576 bytes: tensor: host allocation of 1048576 bytes failed",
    } do
      assert.is_true(seen[want], want)
    end
    -- no temporary file left by any of them
    assert.same({}, require("uvmrec.lib").dir_list(dir, "", ""))
    command.rmdir(dir)
  end)

  it("keeps saving when the interrupt flag is up, and stops a load", function()
    local path = scratch("interrupt.safetensors")
    local t = ur.uvm_tensor({ 1000 }):uniform(0, 1, 4)
    C.ur_interrupt_set(1)
    local ok, err = ck.save(path, { tensors = { t = t } })
    local f = ck.open(path)
    local lok, lerr = f:read("t", ur.uvm_tensor({ 1000 }))
    C.ur_interrupt_set(0)
    assert.is_true(ok, err)
    assert.is_nil(lok)
    assert.matches("reading tensor 't' of .* interrupted after 0 bytes", lerr)
  end)

  it("rejects bad arguments to save at the caller's line", function()
    local t = ur.tensor({ 2 })
    assert.has_error(function() ck.save(1, {}) end, "checkpoint save: path must be a string")
    assert.has_error(function() ck.save(scratch("x"), { tensors = { a = 5 } }) end,
      "checkpoint save: tensors must be {name = tensor}, got a = 5")
    assert.has_error(function() ck.save(scratch("x"), { tensors = { t = t }, meta = { k = {} } }) end)
    local ok, err = pcall(ck.save, scratch("x"), { tensors = { ["__metadata__"] = t } })
    assert.is_false(ok)
    assert.matches("is named '__metadata__'; expected a non%-empty name other than __metadata__", err)
    ok, err = pcall(ck.save, scratch("x"), { tensors = { ["bad\255name"] = t } })
    assert.is_false(ok)
    assert.matches("tensor name 'bad.name' is not valid UTF%-8", err)
  end)
end)

describe("uvmrec.checkpoint's writer of a file a part at a time", function()
  -- tensors of every dtype the layout orders, random values, meta: the file save writes of them
  local function sample()
    local ts = {
      w = ur.tensor({ 7, 3 }):uniform(-1, 1, 11), perm = ur.tensor({ 5 }, { dtype = "i64" }),
      q = ur.tensor({ 4, 6 }, { dtype = "u8" }),
      h = (require("uvmrec.qtbe").quantize(ur.tensor({ 3, 4 }):uniform(-2, 2, 12), "fp16")),
      b = ur.tensor({ 2, 2 }, { dtype = "bf16" }), c = ur.tensor({ 9 }, { dtype = "i32" }),
    }
    for i = 0, 4 do ts.perm[i] = (3 * i + 1) % 5 end
    for i = 0, 23 do ts.q[i] = (37 * i + 5) % 256 end
    for i = 0, 8 do ts.c[i] = 1000 * i - 4321 end
    ur.dense.cast(ur.tensor({ 2, 2 }):uniform(-2, 2, 13), ts.b)
    return ts, { ["uvmrec.format"] = "model", note = "parts" }
  end

  it("writes the file save writes, byte for byte, from parts given in any order", function()
    local ts, meta = sample()
    local whole = scratch("whole.safetensors")
    assert(ck.save(whole, { tensors = ts, meta = meta }))
    local path = scratch("parts.safetensors")
    local specs = {}
    for _, name in ipairs { "q", "perm", "w", "c", "h", "b" } do
      specs[#specs + 1] = { name = name, dtype = ts[name]:dtype(), shape = ts[name]:size() }
    end
    local w = assert(ck.writer(path, specs, meta))
    -- row by row, tensors interleaved, the last in the file's layout first
    for r = 0, 6 do
      if r < 4 then assert(w:put("q", ts.q:view(r, 1))) end
      if r == 2 then assert(w:put("perm", ts.perm)) end
      assert(w:put("w", ts.w:view(r, 1)))
    end
    assert.equal(path .. " was not published", (command.exists(path) and "" or path .. " was not published"))
    assert(w:put("c", ts.c:view_as(0, { 4 })))
    assert(w:put("c", ts.c:view_as(4, { 5 })))
    assert(w:put("h", ts.h))
    assert(w:put("b", ts.b))
    assert(w:close())
    assert.equal(read_file(whole), read_file(path))
    -- each tensor's checksum, over its parts in order, is its bytes' (the Lua reference), and a
    -- flipped bit in a tensor written by parts is refused
    local f = assert(ck.open(path))
    local sums = json.decode(assert(f:meta("uvmrec.crc32c"), "the file written by parts has no checksums"))
    local text = read_file(path)
    for name in pairs(ts) do
      local info = f:info(name)
      assert.equal(h.crc32c(text:sub(info.offset + 1, info.offset + info.nbytes)), sums[name], name)
    end
    local at = f:info("w").offset + 4 * 10
    f:close()
    write_file(path, text:sub(1, at) .. string.char(bit.bxor(text:byte(at + 1), 1)) .. text:sub(at + 2))
    local st, err = ck.load(path)
    assert.is_nil(st)
    assert.matches("tensor 'w' .* does not match the checksum written with it", err)
  end)

  it("names a part that does not fit, a tensor left short, and leaves the file as it was", function()
    local ts, meta = sample()
    local path = scratch("short.safetensors")
    write_file(path, "the previous file")
    local w = assert(ck.writer(path, { { name = "w", dtype = "f32", shape = { 7, 3 } },
                                       { name = "perm", dtype = "i64", shape = { 5 } } }, meta))
    assert.has_error(function() w:put("w", ts.q) end,
      ("safetensors writer: %s: tensor 'w' is F32 [7, 3], and a part of u8 was given"):format(path))
    assert(w:put("w", ts.w:view(0, 5)))
    assert.has_error(function() w:put("w", ts.w:view(0, 3)) end,
      ("safetensors writer: %s: tensor 'w' is F32 [7, 3] (84 bytes); 60 were given and a part of 36 "
       .. "more would pass its end"):format(path))
    assert.has_error(function() w:put("x", ts.w) end, ("checkpoint writer: %s has no tensor 'x'"):format(path))
    assert(w:put("perm", ts.perm))
    local ok, err = pcall(w.close, w)
    assert.is_false(ok)
    assert.matches("^safetensors writer: " .. path:gsub("%p", "%%%0") .. "%.tmp%-%w+: tensor 'w' is F32 %[7, 3%] "
      .. "%(84 bytes%) and 60 were given; " .. path:gsub("%p", "%%%0") .. " is unchanged$", err:gsub("^[^ ]*: ", ""))
    assert.equal("the previous file", read_file(path))
    assert.has_error(function() w:put("w", ts.w) end, ("checkpoint writer: %s was closed or abandoned"):format(path))
    -- a shape whose bytes overflow (their product wrapped to a small size, the header's offsets
    -- then apart from its shapes) or pass the engine's bound: refused by the tensor's name
    assert.has_error(function()
      ck.writer(path, { { name = "wrap", dtype = "f32", shape = { 2 ^ 61, 2 } } }, meta)
    end,
      "safetensors save: tensor 'wrap': f32 [2305843009213693952, 2]; expected a shape whose dimensions other "
      .. "than 0 make at most 2^50 bytes (the largest tensor)")
    assert.has_error(function()
      ck.writer(path, { { name = "huge", dtype = "f32", shape = { 2 ^ 40, 2 ^ 20 } } }, meta)
    end,
      "safetensors save: tensor 'huge': f32 [1099511627776, 1048576]; expected a shape whose dimensions other "
      .. "than 0 make at most 2^50 bytes (the largest tensor)")
    assert.equal("the previous file", read_file(path))
    -- abandoned: the temporary file goes, the previous file stays
    local w2 = assert(ck.writer(path, { { name = "w", dtype = "f32", shape = { 7, 3 } } }, meta))
    assert(w2:put("w", ts.w))
    w2:abandon()
    w2:abandon()
    assert.equal("the previous file", read_file(path))
    local dir = path:match("^(.*)/")
    for _, name in ipairs(assert(require("uvmrec.lib").dir_list(dir, "", ""))) do
      assert.is_nil(name:match("short%.safetensors%.tmp"), "left behind: " .. name)
    end
  end)

  it("reads a tensor's bytes a part at a time from the file", function()
    local ts = sample()
    local path = scratch("read.safetensors")
    assert(ck.save(path, { tensors = ts }))
    local f = assert(ck.open(path))
    local part = ur.tensor({ 2, 3 })
    assert(f:read_part("w", part, 4 * 3 * 4))
    assert.same(ts.w:view(4, 2):totable(), part:totable())
    assert.has_error(function() f:read_part("w", part, 4 * 3 * 6) end,
      ("safetensors read_part: %s: tensor 'w' has 84 bytes; 24 from byte 72 pass its end"):format(path))
    local ok, err = f:read_part("nope", part)
    assert.is_nil(ok)
    assert.equal(("checkpoint: %s has no tensor 'nope'"):format(path), err)
    f:close()
  end)

  -- sample() saved to path with one bit of w's row 5 flipped: the tensors, the file as written,
  -- and the message reading w gives
  local function flipped_w(path)
    local ts = sample()
    assert(ck.save(path, { tensors = ts }))
    local text = read_file(path)
    local f = assert(ck.open(path))
    local info = f:info("w")
    f:close()
    local at = info.offset + 4 * 16 -- row 5
    local flipped = text:sub(1, at) .. string.char(bit.bxor(text:byte(at + 1), 4)) .. text:sub(at + 2)
    write_file(path, flipped)
    return ts, text, ("safetensors: %s: tensor 'w' (file bytes %d..%d) does not match the checksum written with it "
      .. "(crc32c %s, its bytes give %s): the file is corrupted"):format(path, info.offset, info.offset + info.nbytes,
      h.crc32c(text:sub(info.offset + 1, info.offset + info.nbytes)),
      h.crc32c(flipped:sub(info.offset + 1, info.offset + info.nbytes)))
  end

  it("checks a tensor read a part at a time in order against its checksum at its last part", function()
    -- a flipped bit in a tensor read by parts (uvmrec export's blocks of rows) was read as it was
    local path = scratch("read_crc.safetensors")
    local _, text, want = flipped_w(path)
    local f = assert(ck.open(path))
    local part = ur.tensor({ 1, 3 })
    for r = 0, 5 do assert(f:read_part("w", part, 4 * 3 * r)) end
    local ok, err = f:read_part("w", part, 4 * 3 * 6)
    assert.is_nil(ok)
    assert.equal(want, err)
    -- read again from byte 0, the run starts again; the other tensors are intact
    for r = 0, 5 do assert(f:read_part("w", part, 4 * 3 * r)) end
    assert.is_nil(f:read_part("w", part, 4 * 3 * 6))
    local c = ur.tensor({ 3 }, { dtype = "i32" })
    for k = 0, 2 do assert(f:read_part("c", c, 12 * k)) end
    f:close()
    -- the file as written reads whole by parts
    write_file(path, text)
    f = assert(ck.open(path))
    for r = 0, 6 do assert(f:read_part("w", part, 4 * 3 * r)) end
    f:close()
  end)

  it("checks a tensor whole before a part read out of order, or after a break, hands out its bytes", function()
    -- rows read last to first, or the second half alone, were handed out unchecked
    local path = scratch("read_any.safetensors")
    local ts, text, want = flipped_w(path)
    local f
    local part = ur.tensor({ 1, 3 }):fill(9)
    for _, order in ipairs { { 6 }, { 3, 4, 5, 6 }, { 0, 1, 3 }, { 0, 1, 0, 2, 4 } } do
      f = assert(ck.open(path))
      local ok, err
      for _, r in ipairs(order) do
        ok, err = f:read_part("w", part:fill(9), 4 * 3 * r)
        if not ok then break end
      end
      assert.is_nil(ok, table.concat(order, ","))
      assert.equal(want, err)
      assert.same({ 9, 9, 9 }, part:totable(), "the part out of order is not written")
      f:close()
    end
    -- the file as written: any order reads, each part as it is in the file, the whole checked once
    write_file(path, text)
    f = assert(ck.open(path))
    for _, r in ipairs { 6, 2, 0, 5, 1, 3, 4, 6 } do
      assert(f:read_part("w", part, 4 * 3 * r))
      assert.same(ts.w:view(r, 1):totable(), part:totable())
    end
    f:close()
  end)
end)

describe("uvmrec.checkpoint validation", function()
  local F32_2 = '"dtype":"F32","shape":[2],"data_offsets":[0,8]'
  local data8 = "\0\0\128\63\0\0\0\64"

  local function rejects(path, status, pattern)
    local st, msg = open_status(path)
    assert.equal(status, st, msg)
    assert.matches(pattern, msg)
    assert.matches(path:gsub("%p", "%%%0"), msg) -- the file is named
    local f, err = ck.open(path)
    assert.is_nil(f)
    assert.equal(msg, err)
  end

  it("accepts a well-formed file made by hand", function()
    local path = craft("good.safetensors", '{"a":{' .. F32_2 .. '}}      ', data8)
    local f = assert(ck.open(path))
    assert.same({ 1, 2 }, f:view("a"):totable())
  end)

  it("rejects a truncated file", function()
    rejects(write_file(scratch("short.safetensors"), "\8\0\0\0\0"), C.UR_STATUS_FORMAT,
      "is 5 bytes, shorter than the 8%-byte header length: the file is truncated")
    rejects(craft("cut.safetensors", '{"a":{' .. F32_2 .. '}}      ', data8:sub(1, 6)), C.UR_STATUS_FORMAT,
      "tensor 'a': data_offsets %[0, 8%] run past the end of the data %(6 bytes%): the file is truncated")
  end)

  it("rejects a header length past the end, or over 100 MB", function()
    rejects(craft("hlen.safetensors", '{}', "", 4096), C.UR_STATUS_FORMAT,
      "header length 4096 runs past the end of the file %(10 bytes%)")
    rejects(craft("huge.safetensors", '{}', "", 2 ^ 40), C.UR_STATUS_FORMAT,
      "header length 1099511627776 is over the 100000000 bytes allowed")
  end)

  it("rejects bad JSON, with the position", function()
    rejects(craft("json.safetensors", '{"a":{"dtype":"F32",', nil, 20), C.UR_STATUS_FORMAT,
      "the header is not valid JSON: string or '}' expected near end of file %(at header byte 20%)")
    rejects(craft("brace.safetensors", ' {"a":1}'), C.UR_STATUS_FORMAT,
      "the header is not valid JSON: it does not start with '{'")
    rejects(craft("big.safetensors", '{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}}'),
      C.UR_STATUS_FORMAT, "not valid JSON: too big integer")
  end)

  it("rejects duplicate names", function()
    rejects(craft("dup.safetensors", '{"a":{' .. F32_2 .. '},"a":{' .. F32_2 .. '}}', data8),
      C.UR_STATUS_FORMAT, "the header names 'a' twice")
  end)

  it("rejects overlapping, out-of-range, gapped, trailing and unaligned offsets", function()
    local two = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' ..
                '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}'
    rejects(craft("overlap.safetensors", two, data8 .. data8), C.UR_STATUS_FORMAT,
      "tensor 'b' %(data_offsets %[4, 12%]%) overlaps tensor 'a' %(%[0, 8%]%)")
    rejects(craft("range.safetensors", '{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', data8),
      C.UR_STATUS_FORMAT, "tensor 'a': data_offsets %[8, 16%] run past the end of the data %(8 bytes%)")
    rejects(craft("gap.safetensors", '{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', data8 .. data8),
      C.UR_STATUS_FORMAT, "data bytes 0%.%.7 belong to no tensor %(a gap before tensor 'a'%)")
    rejects(craft("trail.safetensors", '{"a":{' .. F32_2 .. '}}', data8 .. "xyz"),
      C.UR_STATUS_FORMAT, "the tensors end at data byte 8 but the data runs to 11: 3 trailing bytes")
    -- A 13-byte header puts the data at file byte 21: an F32 there is unaligned.
    local odd = '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},' ..
                '"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}}'
    rejects(craft("align.safetensors", odd .. "  ", "\1\0\0\128\63", #odd + 2), C.UR_STATUS_FORMAT,
      "tensor 'b' starts at file byte " .. (8 + #odd + 2 + 1) .. ", which is not aligned to its 4%-byte elements")
  end)

  it("rejects offsets that do not match dtype times shape, and bad shapes", function()
    rejects(craft("size.safetensors", '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', data8),
      C.UR_STATUS_FORMAT, "tensor 'a': data_offsets %[0, 8%] hold 8 bytes but F32 %[3%] is 12 bytes")
    rejects(craft("over.safetensors",
      '{"a":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}', data8),
      C.UR_STATUS_FORMAT, "tensor 'a': i64 %[4294967296, 4294967296%]; expected a shape whose dimensions other "
      .. "than 0 make at most 2%^50 bytes")
    rejects(craft("neg.safetensors", '{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', data8),
      C.UR_STATUS_FORMAT, "tensor 'a': shape%[0%] is an integer below 0; expected an integer >= 0")
    rejects(craft("real.safetensors", '{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', data8),
      C.UR_STATUS_FORMAT, "tensor 'a': shape%[0%] is a real number; expected an integer >= 0")
    rejects(craft("back.safetensors", '{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}', data8),
      C.UR_STATUS_FORMAT, "data_offsets %[8, 0%] end before they begin")
    rejects(craft("dims.safetensors", '{"a":{"dtype":"U8","shape":[1,1,1,1,2],"data_offsets":[0,2]}}', "ab"),
      C.UR_STATUS_UNSUPPORTED, "tensor 'a' has 5 dimensions; uvmrec tensors have at most 4")
  end)

  it("bounds every dimension, of a tensor of no elements too: its shape, zeros taken as ones, in 2^50 bytes", function()
    -- [0, 2^53] opened (no element to count), and [0, 2^62, 2^62] whose other dimensions wrap;
    -- [2^62, 2^62, 0] was refused as more than 2^64 bytes, though it holds none
    local function empty(name, dtype, shape)
      return craft(name, ('{"a":{"dtype":"%s","shape":[%s],"data_offsets":[0,0]}}'):format(dtype, shape))
    end
    local edge = assert(ck.open(empty("edge.safetensors", "F32", "0,281474976710656")))
    assert.same({ 0, 2 ^ 48 }, edge:info("a").shape)
    for i, case in ipairs { { "F32", "0,9007199254740992", "f32 %[0, 9007199254740992%]" },
                            { "F32", "0,281474976710657", "f32 %[0, 281474976710657%]" },
                            { "U8", "0,4611686018427387904,4611686018427387904",
                              "u8 %[0, 4611686018427387904, 4611686018427387904%]" },
                            { "I64", "4611686018427387904,4611686018427387904,0",
                              "i64 %[4611686018427387904, 4611686018427387904, 0%]" } } do
      rejects(empty(("bound%d.safetensors"):format(i), case[1], case[2]), C.UR_STATUS_FORMAT,
        "tensor 'a': " .. case[3] .. "; expected a shape whose dimensions other than 0 make at "
        .. "most 2%^50 bytes %(the largest tensor%)$")
    end
    -- a writer refuses what open would refuse, before anything is made, as the engine refuses
    -- such a tensor (one home for the bound: ur__shape_bytes)
    local path = scratch("bound_save.safetensors")
    local bound = "f32 [0, 1152921504606846976]; expected a shape whose dimensions other than 0 make at most 2^50 "
      .. "bytes (the largest tensor)"
    assert.has_error(function() ur.tensor({ 0, 2 ^ 60 }) end, "tensor: " .. bound)
    assert.has_error(function() ck.writer(path, { { name = "a", dtype = "f32", shape = { 0, 2 ^ 60 } } }) end,
      "safetensors save: tensor 'a': " .. bound)
    assert.equal(0, C.ur_path_kind(path))
  end)

  it("reads the checksums only as the writer writes them, 8 lowercase hex digits, naming key and value", function()
    -- strtoul took a sign, spaces, "0x" and capitals: "-0000001" read as ffffffff
    local function tensor_crc(name, value)
      return craft(name, '{"__metadata__":{"uvmrec.crc32c":"{\\"a\\":\\"' .. value .. '\\"}"},"a":{' .. F32_2 .. '}}',
        data8)
    end
    local good = crc32c(data8)
    local f = assert(ck.open(tensor_crc("crc_good.safetensors", good)))
    assert.is_nil(f:verify({ "a" }))
    for i, bad in ipairs { "-0000001", "+1234567", " 1234567", "0x123456", "1234567 ", good:upper(), "1234567",
                           "123456789", "" } do
      rejects(tensor_crc(("crc_bad%d.safetensors"):format(i), bad), C.UR_STATUS_FORMAT,
        "__metadata__ 'uvmrec%.crc32c': tensor 'a' has checksum '" .. bad:gsub("%p", "%%%0")
        .. "'; expected 8 lowercase hex digits %(as uvmrec writes them%)$")
    end
    -- the header's own: notes whose checksum each form spells, so the value read matches
    local function note_crc(want)
      for i = 1, 100000 do
        local c = h.crc32c("note\0" .. i .. "\0")
        if want(c) then return tostring(i), c end
      end
    end
    local function header_crc(name, note, value)
      return craft(name, '{"__metadata__":{"note":"' .. note .. '","uvmrec.header_crc32c":"' .. value .. '"}}')
    end
    local note, c = note_crc(function(x) return x:sub(1, 2) == "00" end)
    assert(ck.open(header_crc("hcrc_good.safetensors", note, c)))
    local forms = { { note, "0x" .. c:sub(3) }, { note, " " .. c:sub(2) }, { note, "+" .. c:sub(2) } }
    local fnote, fc = note_crc(function(x) return x:sub(1, 1) == "f" end)
    forms[#forms + 1] = { fnote, ("-%07x"):format(2 ^ 32 - tonumber(fc, 16)) }
    local anote, ac = note_crc(function(x) return x:match("%a") end)
    forms[#forms + 1] = { anote, ac:upper() }
    for i, form in ipairs(forms) do
      rejects(header_crc(("hcrc_bad%d.safetensors"):format(i), form[1], form[2]), C.UR_STATUS_FORMAT,
        "__metadata__ 'uvmrec%.header_crc32c' is '" .. form[2]:gsub("%p", "%%%0")
        .. "'; expected 8 lowercase hex digits %(as uvmrec writes them%)$")
    end
  end)

  it("rejects unknown dtypes and malformed entries", function()
    rejects(craft("f16x.safetensors", '{"a":{"dtype":"F16x","shape":[1],"data_offsets":[0,8]}}', data8),
      C.UR_STATUS_FORMAT, "tensor 'a' has dtype 'F16x', which uvmrec does not read; expected F32, BF16")
    rejects(craft("q4.safetensors", '{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,8]}}', data8),
      C.UR_STATUS_FORMAT, "dtype 'Q4'")
    rejects(craft("field.safetensors", '{"a":{' .. F32_2 .. ',"scale":2}}', data8),
      C.UR_STATUS_FORMAT, "tensor 'a' has an unknown field 'scale'")
    rejects(craft("noshape.safetensors", '{"a":{"dtype":"F32","data_offsets":[0,8]}}', data8),
      C.UR_STATUS_FORMAT, "tensor 'a' has no shape")
    rejects(craft("entry.safetensors", '{"a":[1,2]}'), C.UR_STATUS_FORMAT,
      "tensor 'a' is an array; expected an object with dtype, shape and data_offsets")
    rejects(craft("meta.safetensors", '{"__metadata__":{"step":7}}'), C.UR_STATUS_FORMAT,
      "__metadata__ 'step' is an integer; metadata values must be strings")
  end)

  it("reports a missing file as an IO error", function()
    local st, msg = open_status(root .. "/missing.safetensors")
    assert.equal(C.UR_STATUS_IO, st)
    assert.matches("cannot open .*missing%.safetensors: No such file or directory", msg)
    st, msg = open_status(root)
    assert.equal(C.UR_STATUS_IO, st)
    assert.matches("is not a regular file", msg)
  end)

  it("rejects destinations of another shape or dtype before writing any", function()
    local path = scratch("dst.safetensors")
    local a, b = random_tensor({ 4, 3 }, "f32", "host", 8), random_tensor({ 6 }, "i32", "host", 9)
    assert(ck.save(path, { tensors = { a = a, b = b } }))
    local f = assert(ck.open(path))
    local da, db = ur.tensor({ 4, 3 }):fill(5), ur.tensor({ 3, 2 }, { dtype = "i32" }):fill(5)
    assert.has_error(function() f:load({ a = da, b = db }) end,
      "safetensors load: " .. path .. ": tensor 'b' is I32 [6] in the file but the destination is I32 [3, 2]")
    assert.equal(5, da[0]) -- a was not written either
    assert.has_error(function() f:read("a", ur.tensor({ 4, 3 }, { dtype = "bf16" })) end,
      "safetensors load: " .. path .. ": tensor 'a' is F32 [4, 3] in the file but the destination is BF16 [4, 3]")
    assert.has_error(function() f:read("zz", da) end, "safetensors load: " .. path .. " has no tensor 'zz'")
  end)

  it("refuses a file with a flipped bit anywhere in a tensor's bytes, naming it, before writing anything", function()
    local path = scratch("flip.safetensors")
    local a, ids = random_tensor({ 64, 4 }, "f32", "host", 21), random_tensor({ 100 }, "i64", "host", 22)
    assert(ck.save(path, { tensors = { a = a, ids = ids }, meta = { note = "x" } }))
    local good = read_file(path)
    local f = assert(ck.open(path))
    local ia, ii = f:info("a"), f:info("ids")
    f:close()
    -- one bit of ids' element 57 (not a float: nothing else would see it), one of a's mantissas
    for _, case in ipairs { { "ids", ii.offset + 8 * 57 + 2, 4 }, { "a", ia.offset + 4 * 201, 1 } } do
      local name, at, mask = case[1], case[2], case[3]
      write_file(path, good:sub(1, at) .. string.char(bit.bxor(good:byte(at + 1), mask)) .. good:sub(at + 2))
      local info = name == "a" and ia or ii
      local want = ("safetensors: %s: tensor '%s' (file bytes %d..%d) does not match the checksum written with it "
        .. "(crc32c %%x+, its bytes give %%x+): the file is corrupted"):format(path, name, info.offset,
        info.offset + info.nbytes):gsub("[%.%(%)%-]", "%%%0"):gsub("%%%%x%+", "%%x+")
      local st, err = ck.load(path)
      assert.is_nil(st)
      assert.matches("^" .. want .. "$", err)
      -- copies in a placement: freed when refused, not left to the garbage collector
      collectgarbage("stop")
      local held = ur.memory().host
      st, err = ck.load(path, { placement = "host" })
      local after = ur.memory().host
      collectgarbage("restart")
      assert.is_nil(st)
      assert.matches("^" .. want .. "$", err)
      assert.equal(held, after, "the copies were freed")
      local da, dids = ur.tensor({ 64, 4 }):fill(5), ur.tensor({ 100 }, { dtype = "i64" }):fill(5)
      local ok, lerr = assert(ck.open(path)):load({ a = da, ids = dids })
      assert.is_nil(ok)
      assert.matches("^" .. want .. "$", lerr)
      assert.same({ 5, 5 }, { da[0], dids[0] }, "nothing was written")
      -- the registry refuses it too, before any component is loaded
      local reg = ck.registry()
      local wa, wids = ur.tensor({ 64, 4 }):fill(5), ur.tensor({ 100 }, { dtype = "i64" }):fill(5)
      -- m's check reads its tensor: only after the checksum passed (it read the flipped bytes,
      -- and its own refusal hid that the file was corrupted)
      reg:register { name = "m", state = function() return { tensors = { a = wa } } end,
                     check = function(views)
                       for _, x in ipairs(views.a:totable()) do
                         if x ~= 5 then return "an element of a is not 5" end
                       end
                     end }
      reg:register { name = "v", views = true, state = function() return { tensors = { ids = wids } } end,
                     load = function() error("not reached") end }
      local cpath = scratch("flip_reg.safetensors")
      assert(reg:save(cpath, { step = 1 }))
      local cgood = read_file(cpath)
      local cf = assert(ck.open(cpath))
      local full = name == "a" and "m.a" or "v.ids"
      local cat = cf:info(full).offset + (at - info.offset)
      cf:close()
      write_file(cpath, cgood:sub(1, cat) .. string.char(bit.bxor(cgood:byte(cat + 1), mask)) .. cgood:sub(cat + 2))
      local r, rerr = reg:load(cpath)
      assert.is_nil(r)
      assert.matches("safetensors: " .. cpath:gsub("%p", "%%%0") .. ": tensor '" .. full:gsub("%.", "%%.")
        .. "' .* the file is corrupted", rerr)
      assert.same({ 5, 5 }, { wa[0], wids[0] })
    end
    write_file(path, good)
    assert.same(a:totable(), assert(ck.load(path)).tensors.a:totable(), "the file as written loads")
    -- the checksums themselves are checked when the file opens
    local bad = good:gsub('(,\\"a\\":\\")(%x)', "%1g", 1)
    assert.are_not.equal(good, bad)
    write_file(path, bad)
    local st, msg = open_status(path)
    assert.equal(C.UR_STATUS_FORMAT, st)
    assert.matches("__metadata__ 'uvmrec.crc32c': tensor 'a' has checksum 'g%x+'; expected 8 lowercase hex digits", msg)
  end)

  it("refuses a file with a flipped bit in its header's metadata or shapes, its checksums' key name too", function()
    -- 'uvmrec.crc32c' flipped to 'uvmrec.crc32b' loaded the file unchecked; a step of 7 read
    -- as 6 and a table [0 x 4] as [0 x 5] loaded as they read
    local path = scratch("header_flip.safetensors")
    local a, z = random_tensor({ 4, 3 }, "f32", "host", 31), ur.tensor({ 0, 4 })
    assert(ck.save(path, { tensors = { a = a, z = z }, meta = { step = "7" } }))
    local good = read_file(path)
    assert.equal(1, select(2, good:gsub('"uvmrec.header_crc32c":"' .. h.header_crc32c(good) .. '"', "")))
    local function flipped(from, to)
      local at = assert(good:find(from, 1, true), from)
      return good:sub(1, at - 1) .. to .. good:sub(at + #from)
    end
    for _, case in ipairs { { '"uvmrec.crc32c"', '"uvmrec.crc32b"' }, { '"step":"7"', '"step":"6"' },
                            { '"shape":[0,4]', '"shape":[0,5]' } } do
      local bad = flipped(case[1], case[2])
      write_file(path, bad)
      local want = ("safetensors: %s: the header does not match the checksum written with it (uvmrec.header_crc32c "
        .. "%s, its metadata and tensors' names, dtypes, shapes and offsets give %s): the file is corrupted"):format(
        path, h.header_crc32c(good), h.header_crc32c(bad))
      local st, msg = open_status(path)
      assert.equal(C.UR_STATUS_FORMAT, st, case[2])
      assert.equal(want, msg)
      local r, err = ck.load(path)
      assert.is_nil(r)
      assert.equal(want, err)
    end
    -- the header's own checksum key flipped: nothing else is changed, and the tensors' checksums
    -- still hold (a file without that key, another writer's or an older uvmrec's, opens as it was)
    local bad = flipped('"uvmrec.header_crc32c"', '"uvmrec.header_crc32b"')
    write_file(path, bad)
    assert.same(a:totable(), assert(ck.load(path)).tensors.a:totable())
    local at = assert(ck.open(path)):info("a").offset + 5
    write_file(path, bad:sub(1, at) .. string.char(bit.bxor(bad:byte(at + 1), 2)) .. bad:sub(at + 2))
    local r, err = ck.load(path)
    assert.is_nil(r)
    assert.matches("tensor 'a' .* the file is corrupted", err)
    -- the metadata of a loaded file saved again: its checksums are computed anew
    write_file(path, good)
    local st = assert(ck.load(path))
    assert(ck.save(path, st))
    assert.equal(good, read_file(path))
  end)

  it("reads a scalar (shape []) as shape [1]", function()
    local path = craft("scalar.safetensors", '{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}    ',
      "\0\0\32\65")
    local f = assert(ck.open(path))
    assert.same({}, f:info("s").shape)
    assert.same({ 1 }, f:view("s"):size())
    assert.equal(10, f:view("s")[0])
    local d = ur.tensor({ 1 })
    assert(f:read("s", d))
    assert.equal(10, d[0])
  end)
end)

describe("uvmrec.checkpoint registry", function()
  -- A small model: dense weights, a managed table, an optimizer state and a counter.
  local function model(seed, rows)
    local m = {
      w = random_tensor({ 8, 4 }, "f32", "host", seed),
      bias = random_tensor({ 4 }, "bf16", "host", seed + 1),
      table = ur.uvm_tensor({ rows or 100, 16 }):uniform(-0.1, 0.1, seed + 2),
      momentum = random_tensor({ rows or 100, 16 }, "f32", "managed", seed + 3),
      seen = random_tensor({ rows or 100 }, "i64", "host", seed + 4),
      lr = 0.05 * seed,
    }
    local reg = ck.registry()
    m.loaded = {}
    reg:register { name = "dense", state = function()
      return { tensors = { w = m.w, bias = m.bias }, meta = { lr = m.lr, layers = { 8, 4 } } }
    end, load = function(tensors, meta)
      m.loaded.dense = { tensors = tensors, meta = meta }
      m.lr = meta.lr
    end }
    reg:register { name = "emb", state = function()
      return { tensors = { table = m.table, momentum = m.momentum, seen = m.seen } }
    end }
    return m, reg
  end
  local config = { model = { tables = { { rows = 100, dim = 16 }, { rows = 50, dim = 16 } } },
                   train = { steps = 100, lr = 0.05 } }

  it("saves every component into one file and loads it back into the live tensors", function()
    local m, reg = model(1)
    local path = scratch("reg.safetensors")
    local rng = { seed = 42, counter = ffi.new("int64_t", 2 ^ 62) + 12345 }
    assert(reg:save(path, { step = 1234, rng = rng, config = config, staging = 8192 }))
    local f = assert(ck.open(path))
    assert.same({ "emb.seen", "dense.w", "emb.momentum", "emb.table", "dense.bias" }, f:names())
    assert.equal("1", f:meta("uvmrec.format"))
    assert.equal("1234", f:meta("uvmrec.step"))
    assert.equal('["dense","emb"]', f:meta("uvmrec.components"))
    assert.equal('{"counter":4611686018427400249,"seed":42}', f:meta("uvmrec.rng"))
    assert.equal('{"layers":[8,4],"lr":0.050000000000000003}', f:meta("uvmrec.meta.dense"))

    local m2, reg2 = model(2)
    local r = assert(reg2:load(path, { config = config, staging = 8192 }))
    assert.equal(1234, r.step)
    assert.equal(42, r.rng.seed)
    assert.is_true(r.rng.counter == rng.counter)
    assert.same(config, r.config)
    assert.same({}, r.unused)
    for _, k in ipairs { "w", "bias", "table", "momentum", "seen" } do
      assert.same(m[k]:totable(), m2[k]:totable(), k)
    end
    assert.equal(0.05, m2.lr)
    assert.same({ 8, 4 }, m2.loaded.dense.meta.layers)
    assert.equal(m2.w, m2.loaded.dense.tensors.w)
  end)

  it("names every config difference, and skips the paths it is told to", function()
    local _, reg = model(1)
    local path = scratch("cfg.safetensors")
    assert(reg:save(path, { step = 1, config = config }))
    local other = json.decode(json.encode(config))
    other.model.tables[2].rows = 60
    other.train.steps = 500
    local r, err = reg:load(path, { config = other })
    assert.is_nil(r)
    assert.equal("checkpoint " .. path .. ": config differs at 2 keys: model.tables[2].rows (the checkpoint " ..
      "has 50, this run has 60), train.steps (the checkpoint has 100, this run has 500)", err)
    r, err = reg:load(path, { config = other, config_ignore = { "model.tables[2]" } })
    assert.is_nil(r)
    assert.matches("config differs at 1 key: train.steps %(the checkpoint has 100, this run has 500%)$", err)
    local many = json.decode(json.encode(config))
    for i = 1, 10 do many["k" .. i] = i end
    r, err = reg:load(path, { config = many })
    assert.is_nil(r)
    assert.matches("config differs at 10 keys: k1 %(the checkpoint has nothing, this run has 1%), k10 .*, " ..
      "k7 %(the checkpoint has nothing, this run has 7%), and 2 more$", err)
    other.train.data = "/data/day_1"
    assert(reg:load(path, { config = other, config_ignore = { "model.tables[2]", "train.steps", "train.data" } }))
    -- "*" stands for any one key; a table on one side only is compared key by key with an empty one
    local t1 = { e = { tables = { C3 = { placement = "host", dtype = "f16" } }, dim = 4 } }
    local t2 = { e = { tables = { C5 = { placement = "managed" } }, dim = 4 } }
    assert.same({ { "e.tables.C3.dtype", "f16" } }, ck.config_diff(t1, t2, { "e.tables.*.placement" }))
    assert.same({}, ck.config_diff(t1, t2, { "e.tables.*" }))
    assert.same({ { "e.tables.C3.dtype", "f16" }, { "e.tables.C3.placement", "host" },
                  { "e.tables.C5.placement", nil, "managed" } },
                ck.config_diff(t1, t2, { "e.tables.*.dtyp", "e.tables.C" }))
  end)

  it("names a missing component, a missing tensor or a shape mismatch, and changes nothing", function()
    local _, reg = model(1)
    local path = scratch("mis.safetensors")
    assert(reg:save(path, { step = 3 }))
    local m2, reg2 = model(2, 120)
    local before = m2.w:totable()
    local r, err = reg2:load(path)
    assert.is_nil(r)
    assert.matches("tensor 'emb%.[%w]+' is [fi][36][24] %[100(.*)%] in the file but [fi][36][24] %[120%1%] in this run",
      err)
    assert.same(before, m2.w:totable())
    local _, reg3 = model(3)
    reg3:register { name = "opt", state = function() return { tensors = {} } end }
    r, err = reg3:load(path)
    assert.is_nil(r)
    assert.equal("checkpoint " .. path .. ": has no component 'opt' (it has: dense, emb)", err)
    reg3:unregister("opt")
    reg3:register { name = "opt", optional = true, state = function() return { tensors = {} } end }
    assert(reg3:load(path))
    local m4, reg4 = model(4)
    m4.extra = ur.tensor({ 2 })
    reg4:unregister("emb")
    reg4:register { name = "emb", state = function()
      return { tensors = { table = m4.table, momentum = m4.momentum, seen = m4.seen, extra = m4.extra } }
    end }
    r, err = reg4:load(path)
    assert.is_nil(r)
    assert.equal("checkpoint " .. path .. ": has no tensor 'emb.extra' (component 'emb')", err)
    local _, reg5 = model(5)
    reg5:unregister("emb")
    reg5:register { name = "emb", state = function() return { tensors = { table = m4.table } } end }
    r, err = reg5:load(path)
    assert.is_nil(r)
    assert.matches("holds tensor 'emb%.%w+', which component 'emb' does not have", err)
  end)

  it("hands views to components that ask for them, and reports unused components", function()
    local m, reg = model(1)
    local path = scratch("views-reg.safetensors")
    assert(reg:save(path, { step = 9 }))
    local got
    local reg2 = ck.registry()
    reg2:register { name = "emb", views = true, state = function() return { tensors = {} } end,
                    load = function(tensors) got = tensors end }
    local r = assert(reg2:load(path))
    assert.same({ "dense" }, r.unused)
    assert.equal(9, r.step)
    assert.equal("host", got.table:placement())
    assert.same(m.table:totable(), got.table:totable())
    assert.same(m.seen:totable(), got.seen:totable())
  end)

  it("frees the views a check took once it returns, and the views of a load that fails", function()
    -- they were left to the garbage collector, each keeping the whole file mapped
    local m, reg = model(1)
    local path = scratch("check-views.safetensors")
    assert(reg:save(path, { step = 2 }))
    local seen = {}
    local function registry(refuse)
      local r = ck.registry()
      r:register { name = "emb", views = true, state = function() return { tensors = {} } end,
                   check = function(views) seen.emb = views end, load = function(t) seen.loaded = t end }
      r:register { name = "dense", state = function() return { tensors = { w = m.w, bias = m.bias } } end,
                   check = function(views)
                     seen.dense = views
                     assert.same(m.w:totable(), views.w:totable())
                     return refuse
                   end }
      return r
    end
    assert(registry():load(path))
    assert.has_error(function() seen.dense.w:numel() end, "tensor: used after free()")
    assert.equal(seen.emb, seen.loaded, "a component that takes views keeps them")
    assert.same(m.table:totable(), seen.loaded.table:totable())
    seen = {}
    local r, err = registry("no"):load(path)
    assert.is_nil(r)
    assert.equal("checkpoint " .. path .. ": component 'dense': no", err)
    assert.has_error(function() seen.dense.w:numel() end, "tensor: used after free()")
    assert.has_error(function() seen.emb.table:numel() end, "tensor: used after free()")
    assert.is_nil(seen.loaded)
  end)

  it("refuses files that are not uvmrec checkpoints or of another format", function()
    local path = scratch("plain.safetensors")
    assert(ck.save(path, { tensors = { a = ur.tensor({ 1 }) } }))
    local r, err = ck.registry():load(path)
    assert.is_nil(r)
    assert.matches("not a uvmrec checkpoint %(no uvmrec%.format in its metadata%)", err)
    assert(ck.save(path, { tensors = {}, meta = { ["uvmrec.format"] = "2" } }))
    r, err = ck.registry():load(path)
    assert.is_nil(r)
    assert.matches("format 2, but this uvmrec reads format 1", err)
    r, err = ck.registry():load(root .. "/nothing.safetensors")
    assert.is_nil(r)
    assert.matches("cannot open", err)
  end)

  -- A registry whose component "dense" keeps meta (whole: the keys it checks), saved once with
  -- save_opts; edited(key, value, want, load_opts) saves that file again with metadata key set to
  -- value and checks that its load refuses it with "checkpoint PATH: " .. want, loading nothing.
  -- Returns edited and the file {m, reg, path, good}.
  local function edits_refused(name, meta, whole, save_opts)
    local m, reg = model(1)
    reg:unregister("dense")
    reg:register { name = "dense", whole = whole, state = function()
      return { tensors = { w = m.w, bias = m.bias }, meta = meta }
    end, load = function(_, got) m.step = got.step end }
    local path = scratch(name)
    assert(reg:save(path, save_opts))
    local good = assert(ck.load(path))
    local function edited(key, value, want, load_opts)
      saved_with(path, good, key, value)
      local before = m.w:totable()
      m.step = nil
      local ok, r, err = pcall(reg.load, reg, path, load_opts)
      assert.is_true(ok, tostring(r))
      assert.is_nil(r)
      assert.equal("checkpoint " .. path .. ": " .. want, err)
      assert.same(before, m.w:totable())
      assert.is_nil(m.step)
    end
    return edited, { m = m, reg = reg, path = path, good = good }
  end

  it("names a step, or a component's meta key that must be a whole number, that is not one (a file edited by hand)",
    function()
    local edited, f = edits_refused("meta.safetensors", { step = 3, samples = 96 }, { "step", "samples" }, { step = 3 })
    local m, reg, path, good = f.m, f.reg, f.path, f.good
    edited("uvmrec.step", "abc", 'uvmrec.step is "abc"; expected a whole number from 0 to below 2^53')
    edited("uvmrec.step", "-1", 'uvmrec.step is "-1"; expected a whole number from 0 to below 2^53')
    edited("uvmrec.meta.dense", '{"step":"3","samples":96}',
      "the meta of component 'dense' has step \"3\"; expected a whole number >= 0")
    edited("uvmrec.meta.dense", '{"step":3}', "the meta of component 'dense' has no samples; expected a whole "
      .. "number >= 0")
    edited("uvmrec.meta.dense", '{"step":3,"samples":1.5}', "the meta of component 'dense' has samples 1.5; "
      .. "expected a whole number >= 0")
    -- a file without a step (saved by hand) is at step 0, as save writes one not given
    saved_with(path, good, "uvmrec.step", nil)
    assert.equal(0, assert(reg:load(path)).step)
    assert.equal(3, m.step)
    local ok, e = pcall(reg.register, reg, { name = "x", whole = "step", state = function() end })
    assert.is_false(ok)
    assert.matches("component 'x': whole must be a list of meta keys", e)
  end)

  it("names a JSON metadata key that is not JSON, or JSON of another kind, with the file and what it should be",
    function()
    -- uvmrec.components 5 or "dense" raised "checkpoint.lua:585: bad argument #1 to 'ipairs' (table
    -- expected, got number)", ["dense",{}] "invalid value (table) at index 2 in table for 'concat'";
    -- {"dense":1} was read as no components ("has no component 'emb' (it has: none)"), a component's
    -- meta [3] as one without its keys ("has no step"), uvmrec.config [1] compared as a config
    -- ("config differs at 7 keys: [1] ..."); text not JSON was "uvmrec.rng is not valid: json: ...",
    -- without what was expected
    local edited, f = edits_refused("json.safetensors", { step = 3 }, { "step" },
                                    { step = 3, config = config, rng = { seed = 1 } })
    local m, reg, path, good = f.m, f.reg, f.path, f.good
    local names = "; expected a JSON list of strings (the names of its components)"
    edited("uvmrec.components", "5", "uvmrec.components is 5" .. names)
    edited("uvmrec.components", '"dense"', 'uvmrec.components is "dense"' .. names)
    edited("uvmrec.components", '{"dense":1}', 'uvmrec.components is {"dense":1}' .. names)
    edited("uvmrec.components", '["dense",{}]', "uvmrec.components[2] is {}" .. names)
    -- a null, which decode makes a hole: [null] read as no components, ["dense",null] as one
    edited("uvmrec.components", "[null]", "uvmrec.components[1] is null" .. names)
    edited("uvmrec.components", '["dense",null]', "uvmrec.components[2] is null" .. names)
    edited("uvmrec.config", "null", "uvmrec.config is null; expected a JSON object (the run's config)",
      { config = config })
    edited("uvmrec.components", '["dense"', "uvmrec.components is not JSON (json: ']' expected near end of file "
      .. "at byte 8)" .. names)
    edited("uvmrec.config", "[1]", "uvmrec.config is [1]; expected a JSON object (the run's config)",
      { config = config })
    edited("uvmrec.rng", "{", "uvmrec.rng is not JSON (json: string or '}' expected near end of file at byte 1); "
      .. "expected JSON (the run's random state)")
    -- null, which decode makes nil: read as no random state
    edited("uvmrec.rng", "null", "uvmrec.rng is null; expected JSON (the run's random state)")
    edited("uvmrec.meta.dense", "[3]", "uvmrec.meta.dense is [3]; expected a JSON object (component 'dense''s meta)")
    edited("uvmrec.meta.dense", "step", "uvmrec.meta.dense is not JSON (json: invalid token near 'step' at byte 4); "
      .. "expected a JSON object (component 'dense''s meta)")
    -- absent: no components, no config or rng, a component's meta empty, as before
    saved_with(path, good, "uvmrec.rng", nil)
    local r = assert(reg:load(path))
    assert.is_nil(r.rng)
    assert.same({}, r.unused)
    assert.equal(3, m.step)
  end)

  it("rejects misuse at the caller's line", function()
    local reg = ck.registry()
    assert.has_error(function() reg:register { name = "a.b", state = function() end } end,
      "checkpoint register: name must be letters, digits, _ or -, got a.b")
    reg:register { name = "a", state = function() return { tensors = { x = 5 } } end }
    assert.has_error(function() reg:register { name = "a", state = function() end } end,
      "checkpoint register: component 'a' is already registered")
    assert.has_error(function() reg:register { name = "b" } end, "checkpoint register: component 'b' needs state()")
    assert.has_error(function() reg:save(scratch("x"), { step = 1 }) end,
      "checkpoint: component 'a': state().tensors must be {name = tensor}, got x = 5")
    assert.has_error(function() reg:save(scratch("x"), { step = -1 }) end,
      "checkpoint save: step must be a whole number from 0 to below 2^53, got -1")
    -- inf was saved, as uvmrec.step -9223372036854775808; 2^53 + 2 was saved, and load refused it
    assert.has_error(function() reg:save(scratch("x"), { step = math.huge }) end,
      "checkpoint save: step must be a whole number from 0 to below 2^53, got inf")
    assert.has_error(function() reg:save(scratch("x"), { step = 2 ^ 53 + 2 }) end,
      "checkpoint save: step must be a whole number from 0 to below 2^53, got 9.007199254741e+15")
    assert.same({ "a" }, reg:components())
  end)

  it("refuses a header no reader would take (over 100,000,000 bytes), writing nothing", function()
    -- it was written, and every open refused it; with keep, rotation then removed the good one
    local path = scratch("big.safetensors")
    local ok, err = pcall(ck.save, path, { tensors = { w = ur.tensor({ 2 }) }, meta = { big = ("x"):rep(100000001) } })
    collectgarbage()
    assert.is_false(ok)
    assert.matches(("safetensors save: %s: the header %%(metadata and 1 tensor entries%%) takes %%d+ bytes; a reader "
                    .. "takes at most 100000000 %%(the largest metadata value: 'big', 100000001 bytes%%); nothing was "
                    .. "written"):format(path:gsub("%p", "%%%0")), err)
    assert.is_false(require("command").exists(path))
  end)
end)

describe("uvmrec.checkpoint run directories", function()
  it("saves by step, keeps the newest K, and resolves --resume RUNDIR|FILE", function()
    local dir = scratch("run") .. "/nested/dir"
    local t = ur.tensor({ 3 }):fill(1)
    local reg = ck.registry()
    reg:register { name = "m", state = function() return { tensors = { t = t } } end }
    for _, step in ipairs { 100, 20, 300, 5 } do
      t:fill(step)
      assert.equal(ck.path_for(dir, step), assert(reg:save_step(dir, { step = step, keep = 3 })))
    end
    local steps = {}
    for i, c in ipairs(assert(ck.list(dir))) do steps[i] = c.step end
    assert.same({ 20, 100, 300 }, steps) -- 5 was saved last but is the oldest step: rotated out
    assert.equal(dir .. "/ckpt-000000000300.safetensors", ck.latest(dir))
    assert.equal(ck.path_for(dir, 20), ck.latest(ck.path_for(dir, 20)))
    local r = assert(reg:load(ck.latest(dir)))
    assert.equal(300, r.step)
    assert.same({ 300, 300, 300 }, t:totable())
    local removed = assert(ck.rotate(dir, 1))
    assert.same({ ck.path_for(dir, 20), ck.path_for(dir, 100) }, removed)
    assert.is_false(command.exists(ck.path_for(dir, 20)))
    local empty = scratch("empty-run")
    assert(C.ur_dir_create(empty) == 0)
    local p, err = ck.latest(empty)
    assert.is_nil(p)
    assert.matches("holds no checkpoint", err)
    p, err = ck.latest(root .. "/nowhere")
    assert.is_nil(p)
    assert.matches("is neither a run directory nor a checkpoint file", err)
    assert.has_error(function() ck.rotate(dir, 0) end, "checkpoint rotate: keep is 0; expected a whole number >= 1")
    -- inf kept every checkpoint, silently
    assert.has_error(function() ck.rotate(dir, math.huge) end,
      "checkpoint rotate: keep is inf; expected a whole number below 2^63")
    assert.has_error(function() ck.rotate(dir, 1.5) end, "checkpoint rotate: keep is 1.5; expected a whole number >= 1")
    -- refused before the save (rotate refused it after)
    local before = #assert(ck.list(dir))
    assert.has_error(function() reg:save_step(dir, { step = 400, keep = math.huge }) end,
      "checkpoint save_step: info.keep is inf; expected a whole number below 2^63")
    assert.equal(before, #assert(ck.list(dir)))
  end)

  it("lists a directory of more names than the first buffer holds", function()
    local dir = scratch("many")
    assert(C.ur_dir_create(dir) == 0)
    for i = 1, 300 do write_file(ck.path_for(dir, i), "") end
    local all = assert(ck.list(dir))
    assert.equal(300, #all)
    assert.equal(300, all[300].step)
  end)
end)

describe("uvmrec.checkpoint interop", function()
  it("is read by the safetensors package, which writes the same bytes (make pydeps)", function()
    local py = h.python("import safetensors")
    if not py then pending("Python's safetensors is not installed (make pydeps)") return end
    local tensors = {}
    for i, dt in ipairs(h.dtypes) do tensors["t." .. dt] = random_tensor({ 3, 5 }, dt, "managed", 100 + i) end
    local path = scratch("interop.safetensors")
    assert(ck.save(path, { tensors = tensors, meta = { step = "12" } }))
    local p = io.popen(py .. " scripts/bench/read_safetensors.py --reserialize " .. path .. " 2>&1")
    local out = p:read("*a")
    p:close()
    local r = assert(json.decode(out), out)
    assert.is_true(r.identical, out)
    assert.equal("12", r.metadata.step) -- with the checksums (uvmrec.crc32c, uvmrec.header_crc32c)
    for name, t in pairs(tensors) do
      local e = r.tensors[name]
      assert.equal(t:dtype():upper(), e.dtype)
      assert.same({ 3, 5 }, e.shape)
      assert.same(t:totable(), e.values, name)
    end
  end)
end)

describe("uvmrec.checkpoint on the GPU", function()
  h.cuda_it("saves and loads device and managed tensors through the staging buffer as the CPU does", function()
    local s = ur.stream()
    for i, dt in ipairs(h.dtypes) do
      local host = random_tensor({ 1001, 33 }, dt, "host", 200 + i)
      local dev, man = assert(host:to("device")), assert(host:to("managed"))
      assert(man:prefetch(0, man:numel(), "gpu"))
      local path = scratch("gpu-" .. dt .. ".safetensors")
      assert(ck.save(path, { tensors = { host = host, dev = dev, man = man } }, { staging = 65536, stream = s }))
      local f = assert(ck.open(path))
      local want = host:totable()
      assert.same(want, f:view("dev"):totable())
      assert.same(want, f:view("man"):totable())
      local d2 = ur.tensor({ 1001, 33 }, { dtype = dt, placement = "device" }):fill(0)
      local m2 = ur.uvm_tensor({ 1001, 33 }, { dtype = dt }):fill(0)
      assert(m2:prefetch(0, m2:numel(), "gpu"))
      assert(f:load({ dev = d2, man = m2 }, { staging = 65536, stream = s }))
      assert.same(want, assert(d2:to("host")):totable(), dt .. " device")
      assert.same(want, m2:totable(), dt .. " managed")
    end
  end)
end)
