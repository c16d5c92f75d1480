-- uvmrec.nn.arena (lua/uvmrec/nn/arena.lua): the blocks modules take their activations and
-- workspaces from.
describe("uvmrec.nn.arena", function()
  it("carves aligned tensors from few blocks, which outlive the arena", function()
    local arena = require "uvmrec.nn.arena"
    local a = arena.new("host", nil, 4096)
    local t1 = a:tensor({ 3, 5 }, "f32")
    local t2 = a:tensor({ 7 }, "bf16")
    local s = a:stats()
    assert.same({ used = 512, reserved = 4096, blocks = 1, tensors = 2 }, s)
    assert.equal(t1:id(), t2:id())
    local big = a:tensor({ 2000 }, "f32")
    assert.equal(2, a:stats().blocks)
    assert.are_not.equal(big:id(), t1:id())
    a:free()
    t1:fill(3)
    assert.equal(3, t1[14])
    -- at the caller's line (here), not at a line of arena.lua
    require("helpers").raises_at_caller(function() arena.new("host", nil, 1) end,
      "arena: block size 1 bytes; expected 256 to 2^40")
  end)

  it("checks a shape as ur.tensor does, naming the arena", function()
    -- five sizes were written past the engine's four (the process died: a segmentation fault),
    -- 2.5 rows made 2 and inf -2^63
    local a = require("uvmrec.nn.arena").new("host")
    assert.has_error(function() a:tensor({ 1, 1, 1, 1, 1 }) end, "arena: shape must be a list of 1 to 4 sizes, got 5")
    assert.has_error(function() a:tensor({ 2.5, 4 }) end,
      "arena: size 1 of the shape is 2.5; expected a whole number >= 0")
    assert.has_error(function() a:tensor({ 3, math.huge }) end,
      "arena: size 2 of the shape is inf; expected a whole number below 2^63")
    assert.same({ 2, 4 }, a:tensor({ 2, 4 }):size())
    a:free()
  end)

  require("helpers").asan_it("shows the address sanitizer a read past a carved tensor's end (make SAN=1)", function()
    -- into its padding to 256 bytes, and into the block's bytes not yet carved
    local h = require "helpers"
    local arena = 'local a = require("uvmrec.nn.arena").new("host", nil, 4096); '
    assert.equal("use-after-poison", h.asan_over_read(arena .. 't = a:tensor({ 3 }); a:tensor({ 2 })'))
    assert.equal("use-after-poison", h.asan_over_read(arena .. 'a:tensor({ 3 }); t = a:tensor({ 64 })'))
  end)
end)
