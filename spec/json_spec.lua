local ffi = require "ffi"
local json = require "uvmrec.json"
local train = require "uvmrec.train"

-- Metadata as checkpoints and run logs hold it: every model config, and values at the edges of
-- the number and string formats.
local function edges()
  return {
    numbers = { 0, -0.0, 1, -1, 0.1, 1 / 3, -2.5e-7, 1e-5, 1e-8, 1e20, 1e300, 5e-324, 2 ^ 53 - 1, -(2 ^ 53 - 1),
                2 ^ 53, 2 ^ 53 + 2, 2 ^ 63, 123456.789, 0.05 * 3 },
    int64 = { ffi.new("int64_t", 2 ^ 62) + 12345, ffi.new("int64_t", -2 ^ 62) - 7,
              ffi.new("uint64_t", 2 ^ 53) + 1, ffi.new("int64_t", 0) },
    strings = { "", "plain", "quote \" backslash \\ slash /", "\b\f\n\r\t", "\0\1\31\127", "é😀 ünïcödé" },
    nested = { a = { b = { c = { {}, { {} }, { d = false } } } }, ["key with space"] = 1, [""] = "empty key",
               ["Z"] = 1, ["b"] = 2, ["ä"] = 3, ["_"] = 4, ["1"] = 5 },
    trainer = { step = 1234, samples = 1234 * 4096, position = { epoch = 0, sample = 5054464 },
                counting = { t0 = true, t1 = false } },
  }
end

-- What checkpoint.lua's own encoder wrote for edges() before uvmrec.json replaced it: the
-- canonical bytes of checkpoint metadata, which must not change.
local EDGES_TEXT = table.concat {
  [[{"int64":[4611686018427400249,-4611686018427387911,9007199254740993,0],]],
  [["nested":{"":"empty key","1":5,"Z":1,"_":4,"a":{"b":{"c":[{},[{}],{"d":false}]}},"b":2,"key with space":1,]],
  [["ä":3},"numbers":[0,0,1,-1,0.10000000000000001,0.33333333333333331,-2.4999999999999999e-07,]],
  [[1.0000000000000001e-05,1e-08,1e+20,1.0000000000000001e+300,4.9406564584124654e-324,9007199254740991,]],
  [[-9007199254740991,9007199254740992,9007199254740994,9.2233720368547758e+18,123456.789,0.15000000000000002],]],
  [["strings":["","plain","quote \" backslash \\ slash /","\b\f\n\r\t","\u0000\u0001\u001f]], "\127",
  [[","é😀 ünïcödé"],"trainer":{"counting":{"t0":true,"t1":false},"position":{"epoch":0,"sample":5054464},]],
  [["samples":5054464,"step":1234}}]],
}

local function rich_values()
  local values = {}
  for _, name in ipairs { "dlrm_tiny", "dlrm_kaggle", "dlrm_mlperf_v1", "dlrm_mlperf_v1_2m", "dlrm_dcnv2" } do
    values[#values + 1] = assert(train.config.load(assert(train.find_config(name)),
      { "optimizer.lr=0.00001", "train.steps=123456789", "train.epochs=100000" })) -- epochs enough for the steps
  end
  values[#values + 1] = edges()
  return values
end

describe("uvmrec.json", function()
  it("writes the bytes checkpoint metadata has always had", function()
    assert.equal(EDGES_TEXT, json.encode(edges()))
  end)

  it("reads back what it writes: numbers exactly, 64-bit integers as int64 cdata", function()
    for i, v in ipairs(rich_values()) do
      local text = json.encode(v)
      local back = assert(json.decode(text))
      assert.equal(text, json.encode(back), "value " .. i)
    end
    local v = edges()
    local back = json.decode(json.encode(v))
    assert.same(v.numbers, back.numbers)
    assert.same(v.strings, back.strings)
    assert.same(v.trainer, back.trainer)
    for k, x in ipairs(v.int64) do
      assert.is_true(back.int64[k] == x, "int64 " .. k)
    end
    assert.is_true(ffi.istype("int64_t", back.int64[1]))
    assert.equal("number", type(back.numbers[14])) -- 2^53 - 1 stays a Lua number
  end)

  it("reads any JSON value; null is nil", function()
    assert.equal("é😀", json.decode('"\\u00e9\\ud83d\\ude00"'))
    assert.equal(42, json.decode(" 42 "))
    assert.equal(1, json.decode("1.0"))
    assert.same({ a = { 1, 2 } }, json.decode('{"a":[1,2],"b":null}'))
    assert.is_nil(json.decode("null"))
    local holes = json.decode("[1,null,3]")
    assert.equal(1, holes[1])
    assert.is_nil(holes[2])
    assert.equal(3, holes[3])
    -- or what opts.null gives, for a reader that must see every element (checkpoint.meta_json)
    assert.same({ 1, json.null, 3 }, json.decode("[1,null,3]", { null = json.null }))
    assert.same({ b = json.null, a = { json.null } }, json.decode('{"a":[null],"b":null}', { null = json.null }))
    assert.equal(json.null, json.decode("null", { null = json.null }))
  end)

  it("writes json.null as null (a value known to be missing), read back as nil", function()
    assert.equal('{"a":[1,null],"auc":null}', json.encode { auc = json.null, a = { 1, json.null } })
    assert.equal("null", json.encode(json.null))
    assert.same({ x = 1 }, json.decode(json.encode { x = 1, auc = json.null }))
  end)

  it("names the byte where text fails to parse", function()
    local cases = {
      { '{"a":[1,}', "json: unexpected token near '}' at byte 9" },
      { "[1,", "json: ']' expected near end of file at byte 3" },
      { '{"a":1} x', "json: end of file expected near 'x' at byte 9" },
      { "18446744073709551615", "json: too big integer near '18446744073709551615' at byte 20" },
      { '"\255"', "json: unable to decode byte 0xff near '\"' at byte 1" },
      -- a key given twice is refused, not read as its last value (a plan's table, a config key)
      { '{"a":1,"b":{"c":2,"c":3}}', "json: duplicate object key near '\"c\"' at byte 21" },
    }
    for _, c in ipairs(cases) do
      local v, err = json.decode(c[1])
      assert.is_nil(v)
      assert.equal(c[2], err)
    end
    assert.has_error(function() json.decode(nil) end, "json decode: expected a string, got nil")
  end)

  it("refuses what JSON cannot hold, naming where it is", function()
    local function refuses(v, msg)
      local ok, err = pcall(json.encode, v)
      assert.is_false(ok)
      assert.equal(msg, err)
    end
    refuses({ x = 0 / 0 }, "json: value.x is nan, which JSON cannot hold")
    refuses({ a = { 1, math.huge } }, "json: value.a[2] is inf, which JSON cannot hold")
    refuses({ 1, x = 2 }, "json: value mixes a list and a map (key 1)")
    refuses({ f = print }, "json: value.f is a function, which JSON cannot hold")
    refuses({ a = { "ok", "\255" } }, "json: value.a[2]: a string is not valid UTF-8 (1 bytes)")
    refuses({ ["\255"] = 1 }, "json: value.\255: the key '\255' is not valid UTF-8")
    refuses({ u = ffi.new("uint64_t", 0) - 1 },
      "json: value.u is 18446744073709551615, above 2^63 - 1, the largest integer JSON holds here")
    local deep = {}
    local t = deep
    for _ = 1, 70 do t.x = {}; t = t.x end
    local ok, err = pcall(json.encode, deep)
    assert.is_false(ok)
    assert.matches("^json: nesting deeper than 64 at value%.x%.x", err)
  end)

  it("refuses to put an array or an object inside itself, leaving it as it was (C API)", function()
    local C = require("uvmrec").C
    local out = ffi.new("ur_json *[1]")
    local buf, need = ffi.new("char[16]"), ffi.new("uint64_t[1]")
    for _, c in ipairs { { C.UR_JSON_OBJECT, "ur_json_set", "{}" }, { C.UR_JSON_ARRAY, "ur_json_append", "[]" } } do
      assert.equal(0, C.ur_json_new(out, c[1]))
      local v = out[0]
      local st = c[1] == C.UR_JSON_OBJECT and C.ur_json_set(v, "k", 1, v) or C.ur_json_append(v, v)
      assert.equal(C.UR_STATUS_INVALID, st)
      assert.equal("json: " .. c[2] .. ": a value cannot go inside itself", ffi.string(C.ur_last_error()))
      assert.equal(0, C.ur_json_dump(v, buf, 16, need))
      assert.equal(c[3], ffi.string(buf))
      C.ur_json_free(v)
    end
  end)

  it("reads a JSON-lines file, naming the line that is not JSON", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(json.encode { step = 1, loss = 0.5 }, "\n\n", json.encode { step = 2, loss = 0.25 }, "\n")
    f:close()
    assert.same({ { step = 1, loss = 0.5 }, { step = 2, loss = 0.25 } }, assert(json.read_lines(path)))
    f = assert(io.open(path, "a"))
    f:write("{oops\n")
    f:close()
    local v, err = json.read_lines(path)
    assert.is_nil(v)
    assert.equal(path .. ":4: json: string or '}' expected near 'oops' at byte 5", err)
    os.remove(path)
    v, err = json.read_lines(path)
    assert.is_nil(v)
    assert.matches("^json: " .. path:gsub("%p", "%%%0") .. ": No such file", err)
  end)

  it("appends values to a JSON-lines file, one a line, writing nothing when one cannot be encoded", function()
    local path = os.tmpname()
    os.remove(path)
    json.append_lines(path, { step = 1, loss = 0.5 }, { step = 2 })
    json.append_lines(path, { "a", 3 })
    assert.same({ { step = 1, loss = 0.5 }, { step = 2 }, { "a", 3 } }, assert(json.read_lines(path)))
    local ok, err = pcall(function() json.append_lines(path, { ok = 1 }, { bad = 0 / 0 }) end)
    assert.is_false(ok)
    assert.matches("json_spec.lua:%d+: json: value.bad is nan", err)
    assert.equal(3, #assert(json.read_lines(path)))
    os.remove(path)
    ok, err = pcall(json.append_lines, path .. "/no/such/folder.jsonl", {})
    assert.is_false(ok)
    assert.equal(path .. "/no/such/folder.jsonl: No such file or directory", err)
  end)

  it("writes a JSON-lines file made anew, a line at a time, each there once written", function()
    local path = os.tmpname()
    json.append_lines(path, { old = true })
    local w = json.lines(path)
    assert.equal(1, #assert(json.read_lines(path)), "made anew at the first line, not before")
    w:write { step = 1, loss = 0.5 }
    assert.same({ { step = 1, loss = 0.5 } }, assert(json.read_lines(path)), "written through")
    local ok, err = pcall(function() w:write { bad = 0 / 0 } end)
    assert.is_false(ok)
    assert.matches("json_spec.lua:%d+: json: value.bad is nan", err)
    w:write { "a", 3 }
    w:close()
    w:close()
    assert.same({ { step = 1, loss = 0.5 }, { "a", 3 } }, assert(json.read_lines(path)))
    w:write { step = 2 }
    w:close()
    assert.same({ { step = 2 } }, assert(json.read_lines(path)), "a write after close makes it anew")
    os.remove(path)
    local none = json.lines(nil)
    none:write { step = 1 }
    none:close()
    ok, err = pcall(function() json.lines(path .. "/no/such/folder.jsonl"):write {} end)
    assert.is_false(ok)
    assert.matches(path:gsub("%p", "%%%0") .. "/no/such/folder.jsonl: No such file or directory", err)
  end)
end)
