-- uvmrec.lib (lua/uvmrec/lib.lua): the one rule for "a whole number in range" (whole_in) and the
-- two checks built on it, element (array elements of a dtype, 64-bit integers included) and
-- whole (integer options, with their bounds), each with its message.
local ffi = require "ffi"
local lib = require "uvmrec.lib"

describe("uvmrec.lib whole numbers", function()
  it("whole_in takes whole numbers from lo to below hi, and 64-bit integers only when asked", function()
    assert.equal(3, lib.whole_in(3, 0, 4))
    assert.equal(0, lib.whole_in(0, 0, 4))
    for _, v in ipairs { 4, -1, 1.5, 0 / 0, math.huge, -math.huge } do assert.is_nil(lib.whole_in(v, 0, 4)) end
    assert.equal(-2 ^ 63, lib.whole_in(-2 ^ 63, -2 ^ 63, 2 ^ 63))
    assert.is_nil(lib.whole_in(2 ^ 63, -2 ^ 63, 2 ^ 63))
    for _, v in ipairs { "3", {}, true } do assert.is_nil(lib.whole_in(v, 0, 4, true)) end
    -- an id past 2^53, which no Lua number holds
    local big = ffi.new("int64_t", 9007199254740993LL)
    assert.is_nil(lib.whole_in(big, 0, 2 ^ 63))
    assert.is_true(lib.whole_in(big, 0, 2 ^ 63, true) == 9007199254740993LL)
    assert.is_true(ffi.istype("int64_t", lib.whole_in(5ULL, 0, 2 ^ 63, true)))
    assert.is_nil(lib.whole_in(2 ^ 63 + 0ULL, 0, 2 ^ 63, true))
    assert.is_nil(lib.whole_in(-1LL, 0, 2 ^ 63, true))
    assert.is_nil(lib.whole_in(2LL ^ 31, -2 ^ 31, 2 ^ 31, true))
    assert.is_true(lib.whole_in(-2LL ^ 31, -2 ^ 31, 2 ^ 31, true) == -2LL ^ 31)
    assert.is_true(lib.whole_in(-2LL ^ 62, -2 ^ 63, 2 ^ 63, true) == -2LL ^ 62)
  end)

  it("element and whole give their messages from it", function()
    assert.has_error(function() lib.element(1.5, "i64", "ids", 2, 1) end,
      "ids[2] is 1.5; expected a whole number that fits i64")
    assert.has_error(function() lib.element(2 ^ 31, "i32", "sizes", nil, 1) end,
      "sizes is 2147483648; expected a whole number that fits i32")
    assert.has_error(function() lib.element(2LL ^ 31, "i32", "sizes", 1, 1) end,
      "sizes[1] is 2147483648LL; expected a whole number that fits i32")
    assert.has_error(function() lib.element("1", "i64", "ids", 1, 1) end, "ids[1] is string; expected a number")
    assert.has_error(function() lib.element(1LL, "f32", "w", 1, 1) end, "w[1] is cdata; expected a number")
    assert.equal(1.5, lib.element(1.5, "f32", "w", 1, 1))
    assert.is_true(lib.element(9007199254740993LL, "i64", "ids", 1, 1) == 9007199254740993LL)
    assert.equal(7, lib.whole(7, "opt", 1, 1, 7))
    assert.has_error(function() lib.whole(8, "opt", 1, 1, 7) end, "opt is 8; expected a whole number from 1 to 7")
    assert.has_error(function() lib.whole(0, "opt", 1, 1) end, "opt is 0; expected a whole number >= 1")
    assert.has_error(function() lib.whole(2 ^ 63, "opt", 1) end,
      "opt is 9.2233720368548e+18; expected a whole number below 2^63")
    assert.has_error(function() lib.whole(0 / 0, "opt", 1) end,
      ("opt is %s; expected a whole number >= 0"):format(tostring(0 / 0)))
    assert.has_error(function() lib.whole(3LL, "opt", 1) end, "opt is 3LL; expected a whole number >= 0")
    -- with ints, a 64-bit integer is one, returned as an int64_t; lo = -2^63 takes any that fits
    assert.is_true(lib.whole(3ULL, "opt", 1, 0, nil, true) == 3LL)
    assert.has_error(function() lib.whole(-1LL, "opt", 1, 0, nil, true) end,
      "opt is -1LL; expected a whole number >= 0")
    assert.equal(-5, lib.whole(-5, "at", 1, -2 ^ 63))
    assert.has_error(function() lib.whole(0.5, "at", 1, -2 ^ 63) end, "at is 0.5; expected a whole number")
    assert.has_error(function() lib.whole(-math.huge, "at", 1, -2 ^ 63) end,
      "at is -inf; expected a whole number >= -2^63")
    assert.has_error(function() lib.whole(math.huge, "at", 1, -2 ^ 63) end,
      "at is inf; expected a whole number below 2^63")
  end)
end)

describe("uvmrec.lib things", function()
  it("gives a count and its noun, plural but for 1: the one home of the messages' plurals", function()
    assert.same({ "0 ranks", "1 rank", "2 ranks", "1 held-out sample" },
                { lib.things(0, "rank"), lib.things(1, "rank"), lib.things(2, "rank"),
                  lib.things(1, "held-out sample") })
    assert.equal(lib.things, require("uvmrec.train.progress").things)
    -- a noun whose plural is not noun .. "s" ("a pass over 2 batchs" would be written by hand)
    assert.same({ "1 batch", "2 batches", "0 batches" }, { lib.things(1, "batch", "batches"),
      lib.things(2, "batch", "batches"), lib.things(0, "batch", "batches") })
    -- a batch of one sample printed 'Batch(1 samples, pinned)'
    local ur = require "uvmrec"
    local l = assert(ur.data.loader { data = "synthetic:tiny", samples = 1, batch_size = 1 })
    local b = assert(l:next())
    assert.equal("Batch(1 sample, pinned)", tostring(b))
    b:free()
    l:close()
    -- a plan of one table said 'plan: 1 tables on 1 rank' (its tables were counted '%d tables')
    local planner = require "uvmrec.planner"
    local p = assert(planner.plan({ { name = "C1", rows = 1000, dim = 16 } },
      { C1 = planner.profile.zipf { rows = 1000, s = 1.05 } }, "1GiB",
      { batch = 1024, calibration = assert(planner.calib.find("h200")),
        dense = { dense_features = 13, bottom = { 64, 16 }, top = { 64, 1 }, tables = 1, dim = 16,
                  precision = "f32" } }))
    assert.matches("^plan: 1 table on 1 rank, ", p:table())
  end)
end)

-- A handle used after free() is named at the line that called the method, through each module's
-- pointer shorthand (lib.ptr under a wrapper): a wrapper that ended in a tail call dropped its
-- frame from error()'s count, and the message lost its line.
describe("uvmrec.lib handles used after free()", function()
  local ur = require "uvmrec"
  local mc = require "uvmrec.mc"

  -- the error of f (which calls the method on its first line) and that line
  local function raised(f)
    local line = debug.getinfo(f, "S").linedefined
    local ok, err = pcall(f)
    assert.is_false(ok)
    return err, line
  end

  it("names the line that called the method", function()
    local s = assert(ur.stream())
    s:free()
    local t = ur.tensor({ 4 })
    local dead = ur.tensor({ 4 })
    dead:free()
    local k = ur.KJT { keys = { "a" }, values = { 1, 2 }, lengths = { 1, 1 } }
    k:free()
    local m = assert(mc.new { tables = { { name = "t", rows = 30, features = { "a" } } } })
    local ev = assert(ur.event())
    for _, case in ipairs {
      { "stream: used after free()", function() local r = t:fill(1, s) return r end }, -- tensor.lua's S
      { "tensor: used after free()", function() local r = dead:fill(1) return r end }, -- tensor.lua's T
      { "stream: used after free()", function() local r = ev:record(s) return r end }, -- streams.handle
      { "kjt: used after free()", function() local r = k:num_keys() return r end }, -- kjt.lua's K
      { "stream: used after free()", function() local r = m:round("t", s) return r end }, -- lib.method_ptrs' S
    } do
      local err, line = raised(case[2])
      assert.equal(("spec/lib_spec.lua:%d: %s"):format(line, case[1]), err)
    end
    m:free()
    local err, line = raised(function() local r = m:round("t") return r end) -- lib.method_ptrs' H
    assert.equal(("spec/lib_spec.lua:%d: managed collisions: used after free()"):format(line), err)
  end)
end)

describe("uvmrec.lib device options", function()
  it("takes \"gpu\" as the current GPU for every object's device (it was refused as device -2)", function()
    assert.equal(lib.current_device(0), lib.device_option("gpu"))
    assert.equal(-1, lib.device_option("cpu"))
    assert.equal(lib.current_device(-1), lib.device_option(nil))
    if lib.C.ur_device_count() == 0 then
      local _, err = require("uvmrec.mc").new{ tables = { { name = "t", rows = 5 } }, device = "gpu" }
      assert.matches("^mc: device 0 asked, but 0 GPUs are in use", err)
      _, err = require("uvmrec.serve").open(require("helpers").exported("tiny", {}), { device = "gpu" })
      assert.matches("^model: device 0 asked, but 0 GPUs are in use", err)
    end
  end)
end)
