-- luacheck: ignore 631 (the tables of inputs and their exact messages read best one per line)
local ffi = require "ffi"
local ur = require "uvmrec"
local h = require "helpers"
local cmd = require "command"
local data = ur.data

local SAMPLE1, SAMPLE2 = h.fixture("criteo_raw_sample.tsv"), h.fixture("criteo_raw_sample2.tsv")

-- A valid line from its parts (nil fields empty).
local function line(label, ints, cats)
  local f = { tostring(label) }
  for i = 1, 13 do f[#f + 1] = ints[i] and tostring(ints[i]) or "" end
  for i = 1, 26 do f[#f + 1] = cats[i] or "" end
  return table.concat(f, "\t")
end

local GOOD = line(1, { 5, -2, 0, 123456 }, { "68fd1e64", "ffffffff", "0000000a" })

describe("uvmrec.data criteo-tsv", function()
  it("parses a line: log(x+1) of clamped integers, hex ids as unsigned 32-bit, empties as 0", function()
    local r = assert(data.parse_line(GOOD))
    assert.equal(1, r.label)
    assert.is_true(math.abs(r.dense[1] - math.log(6)) < 1e-6)
    assert.equal(0, r.dense[2]) -- -2 clamped
    assert.equal(0, r.dense[3])
    assert.is_true(math.abs(r.dense[4] - math.log(123457)) < 1e-5)
    assert.equal(0, r.dense[13])
    assert.same({ 0x68fd1e64, 0xffffffff, 10, 0 }, { r.cats[1], r.cats[2], r.cats[3], r.cats[26] })
    assert.is_false(r.padded)
    -- leading zeros are no digits of the value: 13 characters of 5 are inside 32 bits
    local z = assert(data.parse_line(line(0, { "0000000000005", "-00000000000002", "00002147483647" }, {})))
    assert.is_true(math.abs(z.dense[1] - math.log(6)) < 1e-6)
    assert.equal(0, z.dense[2])
    assert.is_true(math.abs(z.dense[3] - math.log(2147483648)) < 1e-5)
  end)

  it("reads both real samples with no error, as many rows and clicks as their README says", function()
    local a = assert(data.read_tsv(SAMPLE1, { chunk_bytes = 7777 })) -- chunks end mid-line
    assert.equal(1000, a.stats.rows)
    assert.equal(0, a.stats.skipped)
    local clicks = 0
    for _, v in ipairs(a.labels:totable()) do clicks = clicks + v end
    assert.equal(205, clicks)
    local b = assert(data.read_tsv(SAMPLE2))
    assert.equal(400, b.stats.rows)
    clicks = 0
    for _, v in ipairs(b.labels:totable()) do clicks = clicks + v end
    assert.equal(118, clicks)
    -- Every row agrees with a line-by-line parse.
    local lines = cmd.lines(SAMPLE1)
    local ids, dense = a.ids:totable(), a.dense:totable()
    for i = 1, #lines, 97 do
      local r = assert(data.parse_line(lines[i]))
      for k = 1, 26 do assert.equal(r.cats[k], ids[(i - 1) * 26 + k]) end
      for k = 1, 13 do assert.equal(r.dense[k], dense[(i - 1) * 13 + k]) end
    end
    -- Both files in one stream, ids reduced modulo rows.
    local both = assert(data.read_tsv({ SAMPLE1, SAMPLE2 }, { rows = 1000 }))
    assert.equal(1400, both.stats.rows)
    local bid = both.ids:totable()
    for k = 1, 26 do assert.equal(ids[26 * 999 + k] % 1000, bid[26 * 999 + k]) end
  end)

  local cases = {
    { "a truncated line", line(0, {}, {}):gsub("\t[^\t]*\t[^\t]*$", ""), "has 38 fields; expected 40" },
    { "an extra tab", GOOD .. "\t", "has 41 fields; expected 40" },
    { "non-hex", line(0, {}, { "68fd1e6g" }), "field C1 is '68fd1e6g': not hexadecimal" },
    { "9 hex digits", line(0, {}, { nil, "123456789" }), "field C2 is '123456789': 9 hex digits, more than 32 bits" },
    { "integer overflow", line(0, { 2147483648 }, {}), "field I1 is '2147483648': outside 32-bit integers" },
    { "a long non-integer", line(0, { "hello_world_x" }, {}), "field I1 is 'hello_world_x': not an integer" },
    { "a 0x prefix", line(0, {}, { "0x68fd1e64" }), "field C1 is '0x68fd1e64': not hexadecimal" },
    { "a non-integer", line(0, { nil, nil, "1.5" }, {}), "field I3 is '1.5': not an integer" },
    { "label 2", line(2, {}, {}), "label is '2'; expected 0 or 1" },
    { "CRLF endings", GOOD .. "\r", "ends with a carriage return (CRLF line endings; convert with dos2unix)" },
  }

  for _, c in ipairs(cases) do
    it("names file and line for " .. c[1] .. ", and skips it on request", function()
      local dir = cmd.tmpdir()
      local path = cmd.spit(dir .. "/bad.tsv", GOOD .. "\n" .. GOOD .. "\n" .. c[2] .. "\n" .. GOOD .. "\n")
      local t, err = data.read_tsv(path)
      assert.is_nil(t)
      assert.equal("criteo-tsv: " .. path .. ":3: " .. c[3], err)
      local s = assert(data.read_tsv(path, { on_bad_line = "skip" }))
      assert.equal(3, s.stats.rows)
      assert.equal(1, s.stats.skipped)
      assert.equal(path .. ":3: " .. c[3], s.stats.first_skipped)
      local _, e2 = data.parse_line(c[2])
      assert.equal("criteo-tsv: " .. c[3], e2)
      local C = ur.C -- the status uvmrec.h gives: malformed input
      assert.equal(C.UR_STATUS_FORMAT, C.ur_criteo_parse_line(c[2], #c[2], 0, ffi.new("int32_t[1]"),
        ffi.new("float[13]"), ffi.new("uint32_t[26]"), nil))
      cmd.rmdir(dir)
    end)
  end

  it("pads lines of 15 to 39 fields only when asked, and counts them", function()
    local dir = cmd.tmpdir()
    local short = GOOD:gsub("\t[^\t]*\t[^\t]*\t[^\t]*$", "") -- 37 fields
    local path = cmd.spit(dir .. "/short.tsv", GOOD .. "\n" .. short .. "\n")
    local _, err = data.read_tsv(path)
    assert.equal("criteo-tsv: " .. path .. ":2: has 37 fields; expected 40", err)
    local s = assert(data.read_tsv(path, { pad_missing_fields = true }))
    assert.equal(2, s.stats.rows)
    assert.equal(1, s.stats.padded)
    local tooshort = cmd.spit(dir .. "/s2.tsv", "1\t2\t3\n")
    _, err = data.read_tsv(tooshort, { pad_missing_fields = true })
    assert.equal("criteo-tsv: " .. tooshort .. ":1: has 3 fields; expected 40, or 15 to 39 with the missing ones padded", err)
    cmd.rmdir(dir)
  end)

  it("rejects an empty file, a missing final newline and a 10 MB line", function()
    local dir = cmd.tmpdir()
    local empty = cmd.spit(dir .. "/empty.tsv", "")
    local _, err = data.read_tsv(empty)
    assert.equal("criteo-tsv: " .. empty .. ": empty file (no lines)", err)
    local nonl = cmd.spit(dir .. "/nonl.tsv", GOOD .. "\n" .. GOOD)
    _, err = data.read_tsv(nonl)
    assert.equal("criteo-tsv: " .. nonl .. ":2: the last line has no final newline (a truncated file?)", err)
    local s = assert(data.read_tsv(nonl, { on_bad_line = "skip" }))
    assert.same({ 1, 1 }, { s.stats.rows, s.stats.skipped })
    local big = cmd.spit(dir .. "/big.tsv", GOOD .. "\n" .. string.rep("1", 10 * 2 ^ 20) .. "\n" .. GOOD .. "\n")
    _, err = data.read_tsv(big)
    assert.equal("criteo-tsv: " .. big .. ":2: line is over 1048576 bytes long (a Criteo line is under 1 KiB)", err)
    _, err = data.read_tsv(big, { chunk_bytes = 65536 })
    assert.equal("criteo-tsv: " .. big .. ":2: line is over 1048576 bytes long (a Criteo line is under 1 KiB)", err)
    s = assert(data.read_tsv(big, { chunk_bytes = 65536, on_bad_line = "skip" }))
    assert.same({ 2, 1 }, { s.stats.rows, s.stats.skipped })
    local _, e3 = data.read_tsv(dir .. "/missing.tsv")
    assert.matches("cannot open", e3)
    cmd.rmdir(dir)
  end)

  it("refuses options it does not take, and a chunk_bytes that is no size, at the caller's line", function()
    local bad_opts = {
      { { on_bad_lines = "skip" }, "criteo: unknown option 'on_bad_lines'; expected rows, pad_missing_fields, on_bad_line, chunk_bytes" },
      { { days = { 0 } }, "criteo: unknown option 'days'; expected rows, pad_missing_fields, on_bad_line, chunk_bytes" },
      { { chunk_bytes = "1MiB" }, "criteo: chunk_bytes is 1MiB; expected a whole number of bytes (0: the default, 16 MiB)" },
      { { chunk_bytes = -1 }, "criteo: chunk_bytes is -1; expected a whole number of bytes (0: the default, 16 MiB)" },
      { "skip", "criteo: options must be a table, got string" },
    }
    for _, c in ipairs(bad_opts) do
      local ok, err = pcall(data.read_tsv, SAMPLE2, c[1])
      assert.is_false(ok)
      assert.equal(c[2], err)
    end
    local ok, err = pcall(data.convert, SAMPLE2, "/nonexistent", { pad_missing_field = true })
    assert.is_false(ok)
    assert.equal("criteo: unknown option 'pad_missing_field'; expected rows, pad_missing_fields, on_bad_line, "
                 .. "chunk_bytes, days", err)
  end)

  it("reads gzip'd files", function()
    local dir = cmd.tmpdir()
    assert(os.execute(("gzip -c %s > %s/day_3.gz"):format(SAMPLE2, dir)) == 0)
    local a = assert(data.read_tsv(dir .. "/day_3.gz"))
    local b = assert(data.read_tsv(SAMPLE2))
    assert.same(b.ids:totable(), a.ids:totable())
    -- a cut gzip stream is an error, skipping or not, after the rows before it: cut in its size
    -- trailer every line is there and it read as whole; cut mid-line, skip lost its tail quietly
    local whole = io.open(dir .. "/day_3.gz", "rb"):read("*a")
    local trailer = cmd.spit(dir .. "/trailer.gz", whole:sub(1, -5))
    local _, err = data.read_tsv(trailer)
    assert.equal("criteo-tsv: " .. trailer .. ": the gzip stream is cut short after line 400 (a truncated file?)", err)
    local half = cmd.spit(dir .. "/half.gz", whole:sub(1, math.floor(#whole / 2)))
    for _, skip in ipairs { "fail", "skip" } do
      local l = assert(data.loader { data = "criteo-tsv:" .. half, batch_size = 50, on_bad_line = skip })
      local _, e, n = h.drain(l)
      l:close()
      local lines = assert(tonumber(e:match("^criteo%-tsv: [^\n]*half%.gz: the gzip stream is cut short after "
                                            .. "line (%d+) %(a truncated file%?%)$")), e)
      assert.is_true(lines > 0 and lines < 400)
      assert.equal(lines, n)
    end
    cmd.rmdir(dir)
  end)

  it("reads every member of a gzip file, and refuses bytes after the last one, after the rows before them", function()
    local dir = cmd.tmpdir()
    assert(os.execute(("gzip -c %s > %s/a.gz && gzip -c %s > %s/b.gz"):format(SAMPLE1, dir, SAMPLE2, dir)) == 0)
    local a, b = cmd.slurp(dir .. "/a.gz"), cmd.slurp(dir .. "/b.gz")
    -- cat a.gz b.gz: one file of two members, read whole in chunks of any size
    local two = cmd.spit(dir .. "/two.gz", a .. b)
    local both = assert(data.read_tsv({ SAMPLE1, SAMPLE2 }))
    for _, cb in ipairs { 0, 4096, 70001 } do
      local t = assert(data.read_tsv(two, { chunk_bytes = cb }))
      assert.equal(1400, t.stats.rows)
      assert.same(both.ids:totable(), t.ids:totable())
    end
    -- zlib took what follows a member and is no gzip header for its end, and dropped it: 1000 rows
    -- of 1400 read as whole (gzip -t says 'trailing garbage ignored', exit 2)
    local bad = {
      { "a damaged second member header", a .. "\31\200" .. b:sub(3), #b },
      { "a damaged second member method", a .. b:sub(1, 2) .. "\7" .. b:sub(4), #b },
      { "plain bytes appended", a .. "garbage", 7 },
      { "the TSV appended", a .. cmd.slurp(SAMPLE2), #cmd.slurp(SAMPLE2) },
      { "zero bytes appended", a .. string.rep("\0", 512), 512 },
      { "half a gzip header appended", a .. "\31\139", 2 },
    }
    for _, c in ipairs(bad) do
      local path = cmd.spit(dir .. "/bad.gz", c[2])
      local want = ("criteo-tsv: %s: its last %d bytes, from byte %d (after line 1000), are no gzip member: bytes "
                    .. "appended to the gzip data, or a member's header damaged"):format(path, c[3], #a)
      for _, skip in ipairs { "fail", "skip" } do
        for _, cb in ipairs { 0, 4096 } do
          local t, err = data.read_tsv(path, { on_bad_line = skip, chunk_bytes = cb })
          assert.is_nil(t, c[1])
          assert.equal(want, err, c[1])
        end
        local l = assert(data.loader { data = "criteo-tsv:" .. path, batch_size = 64, on_bad_line = skip })
        local _, e, n = h.drain(l)
        l:close()
        assert.equal(want, e, c[1])
        assert.equal(1000, n, c[1])
      end
    end
    cmd.rmdir(dir)
  end)
end)

describe("uvmrec.data npy", function()
  local function header(dict, major)
    major = major or 1
    local pad = 64 - (10 + #dict + 1) % 64
    local text = dict .. string.rep(" ", pad % 64) .. "\n"
    if major == 1 then
      return "\147NUMPY\1\0" .. string.char(#text % 256, math.floor(#text / 256)) .. text
    end
    return "\147NUMPY" .. string.char(major, 0) .. string.char(#text % 256, math.floor(#text / 256), 0, 0) .. text
  end

  it("parses version 1, 2 and 3 headers", function()
    local info = assert(data.npy_header(header("{'descr': '<f4', 'fortran_order': False, 'shape': (10, 13), }")))
    assert.same({ 10, 13 }, info.shape)
    assert.equal("<f4", info.descr)
    assert.equal(128, info.header_bytes)
    info = assert(data.npy_header(header('{"shape": (7,), "fortran_order": True, "descr": "<i8"}', 2)))
    assert.same({ 7 }, info.shape)
    assert.equal("<i8", info.descr)
    assert.is_true(info.fortran_order)
    info = assert(data.npy_header(header("{'descr': '<u4', 'fortran_order': False, 'shape': ()}", 3)))
    assert.same({}, info.shape)
  end)

  it("explains every bad header", function()
    local bad = {
      { "NUMPY", "not a .npy file (no \\x93NUMPY magic)" },
      { header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }"), "dtype '>f4'; expected '<f4', '<i4', '<u4' or '<i8'" },
      { header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }"), "dtype '<f8'; expected '<f4', '<i4', '<u4' or '<i8'" },
      { header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }"), "fortran (column-major) order is not supported; save it in C order" },
      { header("{'descr': '<f4', 'shape': (2, 3), }"), "header lacks 'fortran_order'" },
      { header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }"), "header: 'shape' holds something other than sizes" },
      { header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,2,3,4,5), }"), "header: 'shape' has more than 4 dimensions" },
      { header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}"), "header: unexpected key x" },
      { header("{'descr': '<f4'}"):sub(1, 20), "header truncated (54 header bytes announced, 10 present)" },
      { "\147NUMPY\4\0\0\0", "unsupported format version 4.0" },
    }
    for _, b in ipairs(bad) do
      local info, err = data.npy_header(b[1], "x.npy")
      assert.is_nil(info)
      assert.equal("npy: x.npy: " .. b[2], err)
    end
  end)

  it("saves and loads tensors, and refuses truncated files", function()
    local dir = cmd.tmpdir()
    local t = ur.tensor({ 5, 3 }, { dtype = "f32" }):uniform(-1, 1, 3)
    assert(data.npy_save(dir .. "/a.npy", t))
    local back = assert(data.npy_load(dir .. "/a.npy"))
    assert.same({ 5, 3 }, back:size())
    assert.same(t:totable(), back:totable())
    local ids = ur.tensor({ 4 }, { dtype = "i32" })
    ids[0], ids[1], ids[2], ids[3] = 1, -1, 7, 2147483647
    assert(data.npy_save(dir .. "/u.npy", ids, "<u4"))
    assert.same({ 1, 4294967295, 7, 2147483647 }, data.npy_load(dir .. "/u.npy"):totable())
    local big = ur.tensor({ 3 }, { dtype = "i64" })
    big[0], big[1], big[2] = -5, 2 ^ 40, 3
    assert(data.npy_save(dir .. "/i8.npy", big))
    assert.same({ -5, 2 ^ 40, 3 }, data.npy_load(dir .. "/i8.npy"):totable())
    local bytes = assert(cmd.slurp(dir .. "/a.npy"))
    cmd.spit(dir .. "/cut.npy", bytes:sub(1, #bytes - 4))
    local _, err = data.npy_load(dir .. "/cut.npy")
    assert.equal("npy: " .. dir .. "/cut.npy: truncated: the header's shape needs 60 data bytes but 56 follow", err)
    cmd.spit(dir .. "/long.npy", bytes .. "\0\0\0\0")
    _, err = data.npy_load(dir .. "/long.npy")
    assert.equal("npy: " .. dir .. "/long.npy: the header's shape needs 60 data bytes but 64 follow; expected "
                 .. "exactly those", err)
    cmd.rmdir(dir)
  end)
end)

describe("uvmrec.data convert", function()
  it("refuses table sizes that are not whole numbers from 1 to 2^32, at the caller's line", function()
    for _, rows in ipairs { -5, 0, 1.5, 2 ^ 32 + 1 } do
      local ok, err = pcall(data.convert, { SAMPLE2 }, "/nonexistent", { rows = rows })
      assert.is_false(ok)
      assert.equal(("criteo: rows of C1 is %s; table sizes are whole numbers from 1 to 2^32"):format(tostring(rows)),
        err:gsub("^[^:]*:%d+: ", ""))
    end
  end)

  it("takes days as one distinct whole number per input (two inputs of one day kept the second's rows alone)", function()
    local cases = {
      { { 0, 0 }, "criteo convert: days[1] and days[2] are both 0; each input needs a day of its own" },
      { { 3 }, "criteo convert: days is a list of 1 number for 2 inputs; expected a list of one day number per input" },
      { { 0, -1 }, "criteo convert: days[2] is -1; expected a whole number from 0" },
      { { 0, 1.5 }, "criteo convert: days[2] is 1.5; expected a whole number from 0" },
      { 4, "criteo convert: days is 4 for 2 inputs; expected a list of one day number per input" },
    }
    local dir = cmd.tmpdir()
    for _, c in ipairs(cases) do
      local ok, err = pcall(data.convert, { SAMPLE1, SAMPLE2 }, dir, { days = c[1] })
      assert.is_false(ok)
      assert.equal(c[2], err)
    end
    -- one input said 'days is a list of 2; expected a list of 1 day numbers'
    local ok, err = pcall(data.convert, { SAMPLE1 }, dir, { days = { 3, 4 } })
    assert.is_false(ok)
    assert.equal("criteo convert: days is a list of 2 numbers for 1 input; expected a list of one day number per input",
      err)
    local _, cerr, code = cmd.run(("convert %s --out %s --days 3,4"):format(cmd.quote(SAMPLE1), cmd.quote(dir)))
    assert.equal(2, code, cerr)
    assert.matches("%-%-days gives 2 days for 1 input; expected one day per input\n", cerr)
    assert.is_nil(io.open(dir .. "/day_0_labels.npy"))
    local st = assert(data.convert({ SAMPLE1, SAMPLE2 }, dir, { days = { 5, 2 } }))
    assert.same({ 5, 2 }, st.days)
    assert.same({ 1000 }, data.npy_load(dir .. "/day_5_labels.npy"):size())
    assert.same({ 400 }, data.npy_load(dir .. "/day_2_labels.npy"):size())
    -- a name's day past int32_t was wrapped: day_4294967296.tsv wrote day_-2147483648, which no loader reads
    local big = dir .. "/in/day_4294967296.tsv"
    os.execute(("mkdir -p %s/in %s/out && cp %s %s"):format(dir, dir, cmd.quote(SAMPLE2), cmd.quote(big)))
    ok, err = pcall(data.convert, { SAMPLE1, big }, dir .. "/out")
    assert.is_false(ok)
    assert.equal("criteo convert: " .. big .. ": its name gives day 4294967296; days run from 0 to 2147483647 "
      .. "(give days = {...})", err)
    assert.same({}, require("uvmrec.lib").dir_list(dir .. "/out", "day_", ".npy") or {})
    -- and the C API refuses a day below 0 before reading anything
    local days = ffi.new("int32_t[2]", { 0, -2147483648 })
    local paths = ffi.new("const char *[2]", { SAMPLE1, SAMPLE2 })
    assert.equal(ur.C.UR_STATUS_INVALID, ur.C.ur_criteo_convert(paths, 2, nil, nil, dir .. "/out", days))
    assert.equal("criteo convert: days[1] is -2147483648; expected a whole number from 0 (loaders read day_N for N "
      .. "from 0)", ffi.string(ur.C.ur_last_error()))
    assert.same({}, require("uvmrec.lib").dir_list(dir .. "/out", "day_", ".npy") or {})
    -- and two inputs of one day (the second's files replaced the first's, its rows lost)
    days = ffi.new("int32_t[2]", { 7, 7 })
    assert.equal(ur.C.UR_STATUS_INVALID, ur.C.ur_criteo_convert(paths, 2, nil, nil, dir .. "/out", days))
    assert.equal("criteo convert: days[0] and days[1] are both 7; each input needs a day of its own",
      ffi.string(ur.C.ur_last_error()))
    assert.same({}, require("uvmrec.lib").dir_list(dir .. "/out", "day_", ".npy") or {})
    cmd.rmdir(dir)
  end)

  it("refuses inputs whose names and places give one day, naming both (every input fell back to its place)", function()
    -- convert day_1.tsv other.tsv: day_1.tsv by its name and other.tsv by its place were both day 1, so
    -- every input took its place: day_1.tsv's rows went to day_0 (in an older --out, over its day 0)
    local dir = cmd.tmpdir()
    os.execute(("mkdir -p %s/a %s/b %s/out"):format(dir, dir, dir))
    local function input(name, src) return cmd.spit(dir .. "/" .. name, cmd.slurp(src or SAMPLE2)) end
    local d1, other, a3, b3 = input("day_1.tsv", SAMPLE1), input("other.tsv"), input("a/day_3.tsv"), input("b/day_3.tsv")
    local d0 = input("day_0.tsv")
    local tail = "; give each input a day of its own with days = {...}"
    local cases = {
      { { d1, other }, d1 .. " and " .. other .. " would both be day 1 (" .. d1 .. " by its name, " .. other
        .. " by its place: input 1, counting from 0)" .. tail },
      { { other, d0 }, other .. " and " .. d0 .. " would both be day 0 (" .. other .. " by its place: input 0, "
        .. "counting from 0, " .. d0 .. " by its name)" .. tail },
      { { a3, b3 }, a3 .. " and " .. b3 .. " would both be day 3 (both by their names)" .. tail },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(data.convert, c[1], dir .. "/out")
      assert.is_false(ok)
      assert.equal("criteo convert: " .. c[2], err)
    end
    assert.same({}, require("uvmrec.lib").dir_list(dir .. "/out", "day_", ".npy") or {})
    -- from the command line, with the option it has for it
    local _, err, code = cmd.run(("convert %s %s --out %s"):format(d1, other, cmd.quote(dir .. "/out")))
    assert.equal(1, code)
    assert.equal("uvmrec convert: criteo convert: " .. cases[1][2]:gsub("days = {%.%.%.}", "--days D1,D2,...") .. "\n",
      err)
    assert.same({}, require("uvmrec.lib").dir_list(dir .. "/out", "day_", ".npy") or {})
    -- names that give days of their own, alone or beside places, and days given
    assert.same({ 1, 0 }, assert(data.convert({ d1, d0 }, dir .. "/out")).days)
    assert.same({ 0, 3 }, assert(data.convert({ other, a3 }, dir .. "/out")).days)
    assert.same({ 1, 0 }, assert(data.convert({ d1, other }, dir .. "/out", { days = { 1, 0 } })).days)
    assert.same({ 1000 }, data.npy_load(dir .. "/out/day_1_labels.npy"):size())
    local text
    text, err, code = cmd.run(("convert %s %s --out %s --days 4,2"):format(d1, other, cmd.quote(dir .. "/out")))
    assert.equal(0, code, err)
    assert.matches("converted 1400 lines", text)
    assert.same({ 1000 }, data.npy_load(dir .. "/out/day_4_labels.npy"):size())
    assert.same({ 400 }, data.npy_load(dir .. "/out/day_2_labels.npy"):size())
    cmd.rmdir(dir)
  end)

  it("writes day files equal to what the TSV reader gives", function()
    local dir = cmd.tmpdir()
    local rows = {}
    for i = 1, 26 do rows[i] = 1000 + i end
    local st = assert(data.convert({ SAMPLE1, SAMPLE2 }, dir, { rows = rows }))
    assert.same({ 0, 1 }, st.days)
    assert.equal(1400, st.rows)
    local ref = assert(data.read_tsv(SAMPLE1, { rows = rows }))
    local dense = assert(data.npy_load(dir .. "/day_0_dense.npy"))
    local sparse = assert(data.npy_load(dir .. "/day_0_sparse.npy"))
    local labels = assert(data.npy_load(dir .. "/day_0_labels.npy"))
    assert.same({ 1000, 13 }, dense:size())
    assert.equal("i32", sparse:dtype())
    assert.same(ref.dense:totable(), dense:totable())
    assert.same(ref.ids:totable(), sparse:totable())
    assert.same(ref.labels:totable(), labels:totable())
    assert.same({ 400, 26 }, data.npy_load(dir .. "/day_1_sparse.npy"):size())
    -- Without rows: raw ids as <u4.
    local raw = cmd.tmpdir()
    assert(data.convert(SAMPLE2, raw))
    local info = assert(data.npy_header(io.open(raw .. "/day_0_sparse.npy", "rb"):read(128)))
    assert.equal("<u4", info.descr)
    assert.same(assert(data.read_tsv(SAMPLE2)).ids:totable(), data.npy_load(raw .. "/day_0_sparse.npy"):totable())
    cmd.rmdir(dir)
    cmd.rmdir(raw)
  end)
  it("writes .npy in parts, narrowing ids and labels to 32 bits on every core, naming the first value too big", function()
    local dir = require("command").tmpdir()
    local C = ur.C
    local function writer(path, descr, shape)
      local w = ffi.new("ur_npy_writer *[1]")
      assert.equal(0, C.ur_npy_writer_open(w, path, descr, #shape, ffi.new("int64_t[4]", shape)))
      return w[0]
    end
    local ids = ur.tensor({ 300000, 2 }, { dtype = "i64" }):uniform(0, 2 ^ 31 - 1, 5)
    local w = writer(dir .. "/ids.npy", "<i4", { 0, 2 })
    assert.equal(0, C.ur_npy_writer_append(w, ids.p))
    assert.equal(0, C.ur_npy_writer_append(w, ids:view(0, 7).p))
    assert.equal(0, C.ur_npy_writer_close(w))
    local back = assert(data.npy_load(dir .. "/ids.npy"))
    assert.same({ 300007, 2 }, back:size())
    assert.same(ids:totable(0, 1000), back:totable(0, 1000))
    assert.same(ids:totable(599000, 1000), back:totable(599000, 1000))
    local lw = writer(dir .. "/labels.npy", "<i4", { 0 })
    local whole, buf = ur.tensor({ 300000 }, { dtype = "f32" }), ffi.new("float[?]", 300000)
    for i = 0, 299999 do buf[i] = i % 3 == 0 and 1 or 0 end
    assert.equal(0, C.ur_tensor_write(whole.p, 0, 300000, buf))
    assert.equal(0, C.ur_npy_writer_append(lw, whole.p))
    assert.equal(0, C.ur_npy_writer_close(lw))
    local lb = assert(data.npy_load(dir .. "/labels.npy"))
    assert.same({ 0, 1, 0, 0 }, lb:totable(299996, 4)) -- 299997 is a multiple of 3
    whole:set(200000, 7.25)
    whole:set(123456, 0.5)
    local bad = writer(dir .. "/bad.npy", "<i4", { 0 })
    assert.is_not.equal(0, C.ur_npy_writer_append(bad, whole.p))
    assert.matches("value 0%.5 %(element 123456%) does not fit <i4", ffi.string(C.ur_last_error()))
    C.ur_npy_writer_close(bad)
    -- NaN and floats past int64 are refused before they are converted (the conversion itself is
    -- undefined: make SAN=1 checks float-cast-overflow)
    for _, v in ipairs({ 0 / 0, 3e20, -1e38 }) do
      local f = ur.tensor({ 8 }, { dtype = "f32" }):fill(1)
      f:set(5, v)
      local fw = writer(dir .. "/f.npy", "<i4", { 0 })
      assert.is_not.equal(0, C.ur_npy_writer_append(fw, f.p))
      assert.matches("%(element 5%) does not fit <i4", ffi.string(C.ur_last_error()))
      C.ur_npy_writer_close(fw)
    end
    local big = ur.tensor({ 3 }, { dtype = "i64" }):fill(0)
    big:set(2, 2 ^ 32)
    local u = writer(dir .. "/u.npy", "<u4", { 0 })
    assert.is_not.equal(0, C.ur_npy_writer_append(u, big.p))
    assert.matches("value 4294967296 %(element 2%) does not fit <u4", ffi.string(C.ur_last_error()))
    C.ur_npy_writer_close(u)
    require("command").rmdir(dir)
  end)
end)
