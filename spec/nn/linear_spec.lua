-- uvmrec.nn.Linear (lua/uvmrec/nn/Linear.lua) on the CPU: act(x w^T + b) and its gradients against
-- a float64 reference and its central finite differences.
local R = require "dense_ref"
local nn = require("uvmrec").nn

describe("uvmrec.nn.Linear", function()
  it("computes act(x w^T + b) and its gradients, with and without bias and fused relu", function()
    nn.Module.manual_seed(7)
    R.gradcheck(nn.Linear(5, 4), { (R.rand({ 3, 5 }, 1)) }, function(xv, pv)
      return R.linear(xv[1], pv[1], pv[2], 3, 5, 4)
    end, 1e-4)
    R.gradcheck(nn.Linear(6, 3, { bias = false, act = "relu" }), { (R.rand({ 4, 6 }, 2)) }, function(xv, pv)
      return R.linear(xv[1], pv[1], nil, 4, 6, 3, "relu")
    end, 1e-4)
  end)

  it("leaves the layer below as it was when its backward fails", function()
    -- Linear + ReLU under a Linear: a full backward of the upper layer masks the gradient it passes
    -- down and tells the lower one so.  A failed backward told it too (the gradient of the wrong
    -- shape below), so the lower layer's own backward then skipped its ReLU mask and bias gradient.
    local ur = require "uvmrec"
    local function pair()
      nn.Module.manual_seed(11)
      local low = nn.Linear(4, 3)
      return low, nn.Sequential(low, nn.ReLU(), nn.Linear(3, 2))
    end
    local x, g = R.rand({ 5, 4 }, 3), R.rand({ 5, 3 }, 4)
    local want_low, want = pair()
    want:forward(x)
    want_low:backward(x, g)
    local low, m = pair()
    m:forward(x)
    assert.has_error(function() m:get(3):backward(low.output, ur.tensor({ 4, 2 }):fill(1)) end,
      "Linear(3 -> 2): linear backward: gy is f32 [4, 2]; expected f32 or bf16 [5, 2]")
    low:backward(x, g)
    assert.same(want_low.grad_bias:totable(), low.grad_bias:totable())
    assert.same(want_low.grad_weight:totable(), low.grad_weight:totable())
  end)

  it("refuses bad sizes and inputs, naming the input's own shape; a batch of no rows gives no rows", function()
    local ur = require "uvmrec"
    assert.has_error(function() nn.Linear(math.huge, 3) end, "Linear: in is inf; expected a whole number below 2^63")
    -- a cast made it 'tensor: dimension 2 is -9223372036854775808; expected >= 0', from inside Module
    assert.has_error(function() nn.Linear(3, 4, { pad_to = 2 ^ 63 }) end,
      "Linear: pad_to is 9.2233720368548e+18; expected a whole number from 1 to 256")
    -- 2^62 passed the whole-number check and failed inside Module: 'tensor: the shape's element
    -- count overflows', naming neither Linear nor in
    assert.has_error(function() nn.Linear(2 ^ 62, 3) end,
      "Linear: in 4611686018427387904 and out 3: a weight [out, in] of 13835058055282163712 elements; " ..
      "expected at most 281474976710656 (2^50 bytes of f32)")
    assert.has_error(function() nn.Linear(3, 2 ^ 62, { pad_to = 8 }) end,
      "Linear: in 3 (padded to 8) and out 4611686018427387904: a weight [out, in] of 36893488147419103232 " ..
      "elements; expected at most 281474976710656 (2^50 bytes of f32)")
    -- pad_to past 256 pads more than the 255 columns the linear ops take: 300 was refused at the
    -- first forward ('flags 0x1290000 include bits other than 0xffff01'), 2^16 + 8 wrapped
    assert.has_error(function() nn.Linear(3, 4, { pad_to = 300 }) end,
      "Linear: pad_to is 300; expected a whole number from 1 to 256")
    assert.has_error(function() nn.Linear(3, 4, { pad_to = 2 ^ 16 + 8 }) end,
      "Linear: pad_to is 65544; expected a whole number from 1 to 256")
    assert.has_error(function() ur.dense.pad(256) end, "dense.pad: n is 256; expected a whole number from 0 to 255")
    local wide = nn.Linear(3, 2, { pad_to = 256, seed = 5 })
    assert.equal(256, wide.in_width)
    local x = ur.tensor({ 2, 256 }):fill(0)
    local xs = R.rand({ 2, 3 }, 4)
    for r = 0, 1 do for c = 0, 2 do x:set(r * 256 + c, xs:get(r * 3 + c)) end end
    R.close(wide:forward(x):totable(), nn.Linear(3, 2, { seed = 5 }):forward(xs):totable(), 1e-6, "pad_to 256")
    -- a tensor of the largest size, which no host allocates (1 PiB): refused, named, before it is
    -- allocated where the host's memory can be read (host_memory.available), else by the engine
    local ok, err = pcall(function() nn.Linear(2 ^ 24, 2 ^ 24) end)
    assert.is_false(ok)
    local why = require("uvmrec.host_memory").available() and " and its gradient %(f32%) need " or ": tensor: "
    assert.matches("linear_spec%.lua:%d+: Linear: parameter weight %[16777216, 16777216%]" .. why, err)
    local l = nn.Linear(4, 3)
    assert.has_error(function() l:forward(ur.tensor({ 4 })) end, "Linear(4 -> 3): input is [4]; expected [rows, 4]")
    assert.has_error(function() l:forward(ur.tensor({ 2, 2, 4 })) end,
      "Linear(4 -> 3): input is [2, 2, 4]; expected [rows, 4]")
    assert.same({ 0, 3 }, l:forward(ur.tensor({ 0, 4 })):size())
    assert.same({ 0, 4 }, l:backward(ur.tensor({ 0, 4 }), ur.tensor({ 0, 3 })):size())
    assert.has_error(function() nn.Linear(4, 3):backward(ur.tensor({ 2, 4 }), ur.tensor({ 2, 3 })) end,
      "Linear(4 -> 3): backward before forward")
  end)
end)
