local ur = require "uvmrec"
local streams = require "uvmrec.stream"
local C = ur.C

describe("uvmrec streams and events", function()
  it("makes streams with a priority, and syncs them", function()
    local s = assert(ur.stream { priority = -1 })
    assert.equal(-1, s:priority())
    assert.truthy(s:sync())
    assert.equal("stream (priority -1)", tostring(s))
    local t = ur.tensor({ 100 }):fill(2, s)
    assert.truthy(s:sync())
    assert.equal(2, t[99])
    s:free()
    s:free()
    assert.has_error(function() s:sync() end, "stream: used after free()")
    assert.has_error(function() t:fill(1, s) end, "stream: used after free()")
  end)

  it("refuses stream options it would ignore or mangle, at the caller's line", function()
    for _, c in ipairs {
      { { priority = 1.5 }, "stream: priority is 1.5; expected a whole number that fits i32" },
      { { priority = 2 ^ 40 }, "stream: priority is 1099511627776; expected a whole number that fits i32" },
      { { priority = 0 / 0 }, "stream: priority is " .. tostring(0 / 0) .. "; expected a whole number that fits i32" },
      { { priority = "-1" }, "stream: priority is string; expected a number" },
      { { prio = -1 }, "stream: unknown option 'prio'; expected priority" },
      { -1, "stream: options are number -1; expected a table such as {priority = -1}" },
    } do
      local ok, err = pcall(ur.stream, c[1])
      assert.is_false(ok)
      assert.equal(c[2], err:gsub("^[^:]*:%d+: ", ""))
    end
    local line = debug.getinfo(1, "l").currentline
    local _, err = pcall(function() local s = ur.stream { priority = 0.5 } return s end)
    assert.matches("stream_spec%.lua:" .. (line + 1) .. ": stream: priority is 0%.5", err)
    assert.equal(-100, assert(ur.stream { priority = -100 }):priority()) -- CUDA clamps it; kept as asked
  end)

  it("orders a stream after an event (streams.wait), naming a freed event or stream at the caller's line", function()
    local s, e = assert(ur.stream()), assert(ur.event())
    assert.truthy(streams.wait(s, e)) -- never recorded: nothing to wait for
    local t = ur.tensor({ 1000 }):fill(3)
    assert.truthy(e:record())
    assert.truthy(streams.wait(s, e))
    assert.truthy(streams.wait(nil, e))
    local u = t:to("host", nil, s) -- copied on s, after the fill
    assert.truthy(s:sync())
    assert.equal(3, u[999])
    e:free()
    local line = debug.getinfo(1, "l").currentline
    local ok, err = pcall(function() local r = streams.wait(s, e) return r end)
    assert.is_false(ok)
    assert.matches("stream_spec%.lua:" .. (line + 1) .. ": event: used after free%(%)", err)
    s:free()
    ok, err = pcall(function() local r = streams.wait(s, assert(ur.event())) return r end)
    assert.is_false(ok)
    assert.matches("stream_spec%.lua:" .. (line + 5) .. ": stream: used after free%(%)", err)
  end)

  it("times work between two events", function()
    local a, b = assert(ur.event()), assert(ur.event())
    assert.truthy(a:record())
    ur.tensor({ 1000000 }):uniform(0, 1, 1)
    assert.truthy(b:record())
    assert.truthy(b:sync())
    local ms = assert(a:elapsed(b))
    assert.is_true(ms >= 0 and ms < 10000)
  end)

  it("times a span by events or by the clock, each reading ending it anew", function()
    for _, events in ipairs { true, false } do
      local timed = streams.span(nil, events)
      ur.tensor({ 1000000 }):uniform(0, 1, 1)
      local s1 = timed()
      local t0 = C.ur_clock_seconds()
      while C.ur_clock_seconds() - t0 < 0.02 do end -- 20 ms of the host, inside the span
      local s2 = timed()
      assert.is_true(s1 >= 0 and s1 < 10, tostring(events))
      assert.is_true(s2 >= s1 + 0.015, ("%s: %g then %g"):format(tostring(events), s1, s2))
    end
  end)

  it("times each of n calls by events and gives their median, the middle two's mean for an even n", function()
    local calls, slow = {}, { [2] = 0.03, [3] = 0.01 }
    for _, n in ipairs { 3, 4 } do
      local m, ms = streams.median_ms(function(i)
        calls[#calls + 1] = i
        local t0 = C.ur_clock_seconds()
        while C.ur_clock_seconds() - t0 < (slow[i] or 0) do end
      end, n)
      assert.equal(n, #ms)
      assert.is_true(ms[2] >= 29 and ms[3] >= 9 and ms[3] < ms[2] and ms[1] < ms[3], table.concat(ms, " "))
      if n == 3 then
        assert.equal(ms[3], m)
      else
        assert.is_true(ms[4] < ms[3])
        assert.equal((math.max(ms[1], ms[4]) + ms[3]) / 2, m)
      end
    end
    assert.same({ 1, 2, 3, 1, 2, 3, 4 }, calls)
    -- 10,000 runs (their copy was unpack's, which fails past ~8000 values)
    local m, ms = streams.median_ms(function() end, 10000)
    assert.equal(10000, #ms)
    assert.is_true(m >= 0)
    assert.has_error(function() streams.median_ms(function() end, 0) end,
                     "median_ms: runs is 0; expected a whole number >= 1")
  end)

  it("refuses to time an event never recorded", function()
    local a, b = ur.event(), ur.event()
    a:record()
    assert.has_error(function() a:elapsed(b) end, "event: elapsed time asked of an event never recorded")
    assert.has_error(function() b:sync() end, "event: synchronised before it was recorded")
  end)
end)
