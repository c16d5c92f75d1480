local ffi = require "ffi"
local ur = require "uvmrec"
local C = ur.C

describe("uvmrec FFI", function()
  it("sees each public struct at the size the C compiler gave it", function()
    for _, name in ipairs { "range", "advised", "hint_record", "device_props", "memory_stats",
                            "migration_stats", "residency", "yaml_node",
                            "safetensors_entry", "metrics_opts", "metric_values" } do
      assert.equal(tonumber(C["ur_sizeof_" .. name]()), ffi.sizeof("ur_" .. name), name)
    end
    for _, name in ipairs { "optim_config", "arena_stats" } do
      assert.equal(tonumber(C["ur_sizeof_" .. name]()), ffi.sizeof("ur_" .. name), name)
    end
    for _, name in ipairs { "qerror", "qtbe_table_config", "qtbe_config", "model_options", "model_props" } do
      assert.equal(tonumber(C["ur_sizeof_" .. name]()), ffi.sizeof("ur_" .. name), name)
    end
    for _, name in ipairs { "tbe_table_config", "tbe_config", "tbe_relayout_stats", "far_dma_stats",
                            "mc_table_config", "mc_config", "mc_stats", "mc_state" } do
      assert.equal(tonumber(C["ur_sizeof_" .. name]()), ffi.sizeof("ur_" .. name), name)
    end
    for _, name in ipairs { "npy_info", "criteo_opts", "criteo_stats", "synth_table", "synth_spec",
                            "loader_opts", "loader_stats", "comm_stats" } do
      assert.equal(tonumber(C["ur_sizeof_" .. name]()), ffi.sizeof("ur_" .. name), name)
    end
  end)

  it("has cdef.lua equal to the marked blocks of uvmrec.h and uvmrec_lua.h", function()
    local blocks = {}
    for _, path in ipairs { "engine/include/uvmrec.h", "engine/include/uvmrec_lua.h" } do
      local text = require("uvmrec.lib").read_file(path)
      if not text then pending("not in a source tree") return end
      local block = text:match("\n/%* UR_CDEF_BEGIN %*/\n(.-)/%* UR_CDEF_END %*/\n")
      assert.truthy(block, path .. ": marked block found")
      blocks[#blocks + 1] = block:gsub("\nUR_API ", "\n"):gsub("^UR_API ", "")
    end
    assert.equal(table.concat(blocks), require "uvmrec.cdef")
  end)

  it("loads from plain luajit with the paths `make env` prints", function()
    local mk = io.open("Makefile")
    if not mk then pending("not in a source tree") return end
    mk:close()
    local found = os.execute("command -v luajit >/dev/null 2>&1")
    if found ~= 0 and found ~= true then pending("no luajit on PATH") return end
    local p = io.popen("make -s env 2>&1")
    local exports = p:read("*a")
    p:close()
    assert.matches("^export LUA_PATH=", exports)
    -- A clean environment, but for a sanitizer build's preloaded runtimes.
    local cmd = "env -i PATH=\"$PATH\" LD_PRELOAD=\"${LD_PRELOAD:-}\" ASAN_OPTIONS=\"${ASAN_OPTIONS:-}\" " ..
      "sh -c '" .. exports:gsub("'", "'\\''"):gsub("\n", "") ..
      "; cd /tmp && luajit -e \"local ur = require [[uvmrec]]; print(ur.uvm_tensor({1024, 128}))\"' 2>&1"
    p = io.popen(cmd)
    local out = p:read("*a")
    p:close()
    assert.matches("^tensor f32 %[1024, 128%] managed", out)
  end)

  it("names statuses, dtypes, placements and advice both ways", function()
    assert.equal("out of memory", ffi.string(C.ur_status_name(C.UR_STATUS_OOM)))
    local d = ffi.new("ur_dtype[1]")
    for i, n in ipairs { "f32", "bf16", "f16", "i8", "u8", "i32", "i64" } do
      assert.equal(0, C.ur_dtype_parse(n, d))
      assert.equal(i - 1, tonumber(d[0]))
      assert.equal(n, ffi.string(C.ur_dtype_name(d[0])))
    end
    assert.equal(8, tonumber(C.ur_dtype_size(C.UR_DTYPE_I64)))
    local a = ffi.new("ur_advice[1]")
    assert.equal(0, C.ur_advice_parse("cudaMemAdviseSetAccessedBy", a))
    assert.equal(C.UR_ADVICE_ACCESSED_BY, tonumber(a[0]))
    local l = ffi.new("int32_t[1]")
    for text, want in pairs { cpu = -1, gpu = C.UR_LOC_CURRENT_GPU, ["cuda:3"] = 3, ["-1"] = -1, ["2"] = 2 } do
      assert.equal(0, C.ur_location_parse(text, l))
      assert.equal(want, l[0])
    end
  end)

  it("rejects unknown names with messages that list what is expected", function()
    local d = ffi.new("ur_dtype[1]")
    assert.equal(C.UR_STATUS_INVALID, C.ur_dtype_parse("f128", d))
    assert.matches("'f128' is not a dtype; expected f32", ffi.string(C.ur_last_error()))
    local l = ffi.new("int32_t[1]")
    for _, bad in ipairs { "cuda:", "cuda:-1", "gpu0", "64", "-2", "" } do
      assert.equal(C.UR_STATUS_INVALID, C.ur_location_parse(bad, l), bad)
      assert.matches("is not a location; expected cpu, gpu, cuda:N", ffi.string(C.ur_last_error()))
    end
  end)

  it("leaves a failed constructor's new handle NULL", function()
    local junk = ffi.cast("void *", 0x1234)
    local k = ffi.new("ur_kjt *[1]", ffi.cast("ur_kjt *", junk))
    local v, l = ur.tensor({ 1 }, { dtype = "i64" }), ur.tensor({ 1 }, { dtype = "i32" })
    assert.equal(C.UR_STATUS_INVALID, C.ur_kjt_new(k, -1, nil, 1, nil, v.p, l.p, nil, nil, 1))
    assert.is_true(k[0] == nil)
    local j = ffi.new("ur_json *[1]", ffi.cast("ur_json *", junk))
    assert.equal(C.UR_STATUS_INVALID, C.ur_json_new_string(j, nil, 3))
    assert.is_true(j[0] == nil)
  end)

  it("writes a file whole (ur_file_write): the old bytes or the new, never a part", function()
    local cmd = require "command"
    local dir = cmd.tmpdir()
    local path = dir .. "/plan.json"
    assert.equal(0, C.ur_file_write(path, "old\n", 4))
    local big = ("x"):rep(100000)
    -- a write the file-size limit stops (EFBIG) fails, naming it, and leaves the old file alone
    local code = select(3, cmd.sh(("trap '' XFSZ; ulimit -f 8; %s -e %s"):format(cmd.quote(cmd.bin()), cmd.quote(
      ("local ur = require 'uvmrec'; local s = ur.C.ur_file_write(%q, ('x'):rep(100000), 100000); "
       .. "io.write(require('ffi').string(ur.C.ur_last_error())); os.exit(s == 0 and 0 or 3)"):format(path)))))
    assert.equal(3, code)
    assert.equal("old\n", cmd.slurp(path))
    assert.equal(0, C.ur_file_write(path, big, #big))
    assert.equal(big, cmd.slurp(path))
    assert.same({ "plan.json" }, assert(require("uvmrec.lib").dir_list(dir, "", "")))
    assert.equal(C.UR_STATUS_IO, C.ur_file_write(dir .. "/none/plan.json", "x", 1))
    local where = (dir .. "/none/plan.json"):gsub("%p", "%%%0")
    assert.matches("^file: cannot create " .. where, ffi.string(C.ur_last_error()))
    cmd.rmdir(dir)
  end)

  it("reads a whole file and quotes a shell word (uvmrec.lib)", function()
    local lib = require "uvmrec.lib"
    local path = os.tmpname()
    local bytes = "a\0b'c\r\n" .. ("x"):rep(70000) .. "\n"
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
    assert.equal(bytes, lib.read_file(path))
    os.remove(path)
    local text, err = lib.read_file(path)
    assert.is_nil(text)
    assert.equal(path .. ": No such file or directory", err)
    text, err = lib.read_file("spec")
    assert.is_nil(text)
    assert.equal("spec: Is a directory", err)
    for _, word in ipairs { "plain", "it's", "''", "", "a b\t$HOME `id` \"q\" \\ *", "line\nbreak" } do
      local p = io.popen("printf '%s|' " .. lib.shell_quote(word))
      local out = p:read("*a")
      p:close()
      assert.equal(word .. "|", out, word)
    end
    assert.equal("'12'", lib.shell_quote(12))
  end)
end)
