-- The dense ops on the CPU backend against float64 references written in Lua (spec/support/
-- dense_ref.lua), on random inputs; and every documented error.
local ur = require "uvmrec"
local helpers = require "helpers"
local R = require "dense_ref"
local dense = ur.dense

local function rows_in_out(seed)
  -- Small odd sizes that no kernel tile divides.
  return 5 + seed % 4, 7 + seed % 5, 3 + seed % 6
end

describe("uvmrec.dense linear", function()
  for _, case in ipairs { { "none", true }, { "relu", true }, { "none", false }, { "relu", false } } do
    local act, bias = case[1], case[2]
    it(("computes act(x w^T + b) in f32 (act %s, bias %s)"):format(act, tostring(bias)), function()
      local rows, n, out = rows_in_out(#act + (bias and 1 or 0))
      local x, xv = R.rand({ rows, n }, 1)
      local w, wv = R.rand({ out, n }, 2)
      local b, bv = nil, nil
      if bias then b, bv = R.rand({ out }, 3) end
      local y = R.zeros({ rows, out })
      dense.linear_forward(x, w, b, y, act)
      R.close(y:totable(), R.linear(xv, wv, bv, rows, n, out, act), 1e-5, "y")
    end)
  end

  it("computes each row of a batch's slice bit for bit as that row of the whole batch (ROW0)", function()
    local rows, n, out = 300, 37, 19
    local x = R.rand({ rows, n }, 21)
    local w = R.rand({ out, n }, 22)
    local b = R.rand({ out }, 23)
    local gy = R.rand({ rows, out }, 24)
    local y = R.zeros({ rows, out })
    local gx = R.zeros({ rows, n })
    dense.linear_forward(x, w, b, y, "relu")
    local work = R.zeros({ rows, out })
    dense.linear_backward(x, w, y, gy, gx, nil, nil, work, "relu")
    local yw, gxw = y:totable(), gx:totable()
    for _, part in ipairs { { 0, 100 }, { 100, 100 }, { 200, 100 }, { 7, 45 }, { 299, 1 } } do
      local r0, m = part[1], part[2]
      local flags = (r0 % 256) * dense.ROW0
      local ys, gxs, ws = R.zeros({ m, out }), R.zeros({ m, n }), R.zeros({ m, out })
      dense.linear_forward(x:view(r0, m), w, b, ys, "relu", flags)
      dense.linear_backward(x:view(r0, m), w, ys, gy:view(r0, m), gxs, nil, nil, ws, "relu", flags)
      local a, g = ys:totable(), gxs:totable()
      for i = 1, m * out do assert.equal(yw[r0 * out + i], a[i], "y row " .. r0) end
      for i = 1, m * n do assert.equal(gxw[r0 * n + i], g[i], "gx row " .. r0) end
    end
  end)

  it("computes in bf16 as f32 products of bf16 values, rounded once", function()
    local rows, n, out = 9, 33, 17
    local x, xv = R.rand({ rows, n }, 11, { dtype = "bf16" })
    local w, wv = R.rand({ out, n }, 12, { dtype = "bf16" })
    local b, bv = R.rand({ out }, 13, { dtype = "bf16" })
    local y = R.zeros({ rows, out }, { dtype = "bf16" })
    dense.linear_forward(x, w, b, y, "relu")
    R.close(y:totable(), R.linear(xv, wv, bv, rows, n, out, "relu"), 2 ^ -8, "bf16 y")
  end)

  for _, act in ipairs { "none", "relu" } do
    it("computes gx, gw and gb from gy (act " .. act .. "), adding into gw and gb", function()
      local rows, n, out = 11, 6, 9
      local x, xv = R.rand({ rows, n }, 21)
      local w, wv = R.rand({ out, n }, 22)
      local b = R.rand({ out }, 23)
      local y = R.zeros({ rows, out })
      dense.linear_forward(x, w, b, y, act)
      local yv = y:totable()
      local gy, gyv = R.rand({ rows, out }, 24)
      local gx, gw, gb = R.zeros({ rows, n }), R.zeros({ out, n }), R.zeros({ out })
      local gw0, gw0v = R.rand({ out, n }, 25)
      gw:copy(gw0)
      local work = R.zeros({ rows, out })
      dense.linear_backward(x, w, y, gy, gx, gw, gb, work, act)
      local rgx, rgw, rgb, rg = R.linear_back(xv, wv, yv, gyv, rows, n, out, act)
      for i = 1, #rgw do rgw[i] = rgw[i] + gw0v[i] end
      R.close(gx:totable(), rgx, 1e-5, "gx")
      R.close(gw:totable(), rgw, 1e-5, "gw")
      R.close(gb:totable(), rgb, 1e-5, "gb")
      if act == "relu" then assert.same(rg, work:totable()) end
    end)
  end

  -- X_RELU: x is the layer below's ReLU output, which says itself which units passed; its
  -- forward's mask bits say the same, so the two backwards give the same bits.
  for _, dt in ipairs { "f32", "bf16" } do
    it("masks gx by its input under X_RELU as by the forward's mask, its gb_x too (" .. dt .. ")", function()
      local rows, n0, n, out = 9, 6, 21, 7 -- 21 columns: a partial byte of mask bits a row
      local x0 = R.rand({ rows, n0 }, 71, { dtype = dt })
      x0:set(3 * n0 + 2, 0 / 0) -- row 3 comes out NaN: it passes, as its mask bits say
      local x = R.zeros({ rows, n }, { dtype = dt })
      local mask = R.zeros({ rows, dense.mask_cols(n) }, { dtype = "u8" })
      dense.linear_forward(x0, R.rand({ n, n0 }, 72, { dtype = dt }), R.rand({ n }, 73, { dtype = dt }), x, "relu",
                           { flags = 0, mask = mask })
      local xv, zeros = x:totable(), 0
      for i = 1, #xv do if xv[i] == 0 then zeros = zeros + 1 end end
      assert.is_true(zeros > rows * n / 4 and zeros < rows * n * 3 / 4, dt .. ": the ReLU cut about half")
      local w, gy = R.rand({ out, n }, 74, { dtype = dt }), R.rand({ rows, out }, 75, { dtype = dt })
      local function back(opts) -- (gw, untouched by masks, has row 3's NaN)
        local gx, gb_x = R.zeros({ rows, n }, { dtype = dt }), R.zeros({ n })
        opts.gb_x = gb_x
        dense.linear_backward(x, w, nil, gy, gx, nil, nil, nil, "none", opts)
        return gx:totable(), gb_x:totable()
      end
      local mx, mb = back { flags = dense.GY_MASKED, x_mask = mask }
      local rx, rb = back { flags = dense.GY_MASKED + dense.X_RELU }
      assert.same(mx, rx, dt .. ": gx")
      assert.same(mb, rb, dt .. ": gb_x")
      for r = 0, rows - 1 do
        for c = 1, n do
          local i = r * n + c
          if xv[i] == 0 then assert.equal(0, rx[i], dt .. ": a unit the ReLU cut passes no gradient") end
        end
      end
      for c = 1, n do
        assert.is_true(rx[3 * n + c] == rx[3 * n + c] and rx[3 * n + c] ~= 0, dt .. ": the NaN row passes")
      end
    end)
  end

  it("adds into gx with ACCUMULATE and leaves out what is nil", function()
    local rows, n, out = 4, 5, 3
    local x, xv = R.rand({ rows, n }, 31)
    local w, wv = R.rand({ out, n }, 32)
    local gy, gyv = R.rand({ rows, out }, 33)
    local gx, gxv = R.rand({ rows, n }, 34)
    dense.linear_backward(x, w, nil, gy, gx, nil, nil, nil, "none", dense.ACCUMULATE)
    local rgx = R.linear_back(xv, wv, nil, gyv, rows, n, out, "none")
    for i = 1, #rgx do rgx[i] = rgx[i] + gxv[i] end
    R.close(gx:totable(), rgx, 1e-5, "gx")
  end)

  it("accumulates bf16 products into f32 gradients", function()
    local rows, n, out = 16, 12, 10
    local x, xv = R.rand({ rows, n }, 41, { dtype = "bf16" })
    local w, wv = R.rand({ out, n }, 42, { dtype = "bf16" })
    local gy, gyv = R.rand({ rows, out }, 43, { dtype = "bf16" })
    local gx = R.zeros({ rows, n }, { dtype = "bf16" })
    local gw, gb = R.zeros({ out, n }), R.zeros({ out })
    dense.linear_backward(x, w, nil, gy, gx, gw, gb, nil, "none")
    local rgx, rgw, rgb = R.linear_back(xv, wv, nil, gyv, rows, n, out, "none")
    R.close(gx:totable(), rgx, 2 ^ -8, "gx")
    R.close(gw:totable(), rgw, 1e-5, "gw")
    R.close(gb:totable(), rgb, 1e-5, "gb")
  end)

  it("names the tensor, its shape and what was expected when shapes or dtypes are wrong", function()
    local x, w = R.zeros({ 4, 5 }), R.zeros({ 3, 6 })
    local y = R.zeros({ 4, 3 })
    -- at the caller's line (here), not at a line of dense.lua
    helpers.raises_at_caller(function() dense.linear_forward(x, w, nil, y) end,
      "linear forward: w is f32 [3, 6]; expected f32 or bf16 [rows, 5]")
    assert.error_matches(function() dense.linear_forward(x, R.zeros({ 3, 5 }), R.zeros({ 4 }), y) end,
      "linear forward: b is f32 %[4%]; expected f32 or bf16 of 3 elements")
    assert.error_matches(function()
      dense.linear_forward(x, R.zeros({ 3, 5 }, { dtype = "bf16" }), nil, y)
    end, "linear forward: w is bf16 but x is f32; x, w, b and y take one dtype")
    assert.error_matches(function() dense.linear_forward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 2 })) end,
      "y is f32 %[4, 2%]; expected f32 or bf16 %[4, 3%]")
    assert.error_matches(function() dense.linear_forward(x, R.zeros({ 3, 5 }), nil, y, "sigmoid") end,
      "activation 2 is not none %(0%) or relu %(1%)")
    assert.error_matches(function() dense.linear_forward(R.zeros({ 4, 5 }, { dtype = "i32" }), w, nil, y) end,
      "x is i32 %[4, 5%]; expected f32 or bf16")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), nil, nil, nil, nil, "relu")
    end, "linear backward: y %(relu needs it%) is missing")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), nil, R.zeros({ 3, 5 }, { dtype = "bf16" }))
    end, "gw is bf16 %[3, 5%]; expected f32 %[3, 5%]")
    assert.error_matches(function() dense.linear_forward(x, R.zeros({ 3, 5 }), nil, y, "none", 4) end,
      "flags 0x4 include bits other than 0xffff01")
    assert.error_matches(function() dense.linear_forward(x, R.zeros({ 3, 5 }), nil, y, "none", dense.pad(6)) end,
      "linear forward: 6 padding columns but the input has 5")
    assert.error_matches(function()
      dense.linear_forward(x, R.zeros({ 3, 5 }), nil, y, "none", { mask = R.zeros({ 4, 16 }, { dtype = "u8" }) })
    end, "a mask is written only under relu")
    assert.error_matches(function()
      dense.linear_forward(x, R.zeros({ 3, 5 }), nil, y, "relu", { mask = R.zeros({ 4, 3 }, { dtype = "u8" }) })
    end, "mask is u8 of 12 elements; expected u8 %[4, 16%] %(the ReLU mask of 3 columns%)")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), R.zeros({ 4, 5 }), nil, R.zeros({ 3 }), nil,
                            "none", dense.GY_MASKED)
    end, "under GY_MASKED the layer above took the bias gradient: gb must be NULL")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), R.zeros({ 4, 5 }), nil, nil, nil, "none",
                            { flags = dense.ACCUMULATE, x_mask = R.zeros({ 4, 16 }, { dtype = "u8" }) })
    end, "x_mask cannot mask an accumulated gx")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), R.zeros({ 4, 5 }), nil, nil, nil, "none",
                            { gb_x = R.zeros({ 5 }) })
    end, "gb_x is the masked gradient's sum: it needs x_mask or X_RELU")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), R.zeros({ 4, 5 }), nil, nil, nil, "none",
                            { flags = dense.X_RELU, x_mask = R.zeros({ 4, 16 }, { dtype = "u8" }) })
    end, "x_mask and X_RELU both mask gx %(from the mask's bits, from x%): give one")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), R.zeros({ 4, 5 }), nil, nil, nil, "none",
                            dense.X_RELU + dense.ACCUMULATE)
    end, "X_RELU cannot mask an accumulated gx")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), nil, R.zeros({ 3, 5 }), nil, nil, "none",
                            dense.X_RELU)
    end, "linear backward: X_RELU acts on gx, which is NULL")
    assert.error_matches(function()
      dense.linear_backward(x, R.zeros({ 3, 5 }), nil, R.zeros({ 4, 3 }), nil, R.zeros({ 3, 5 }), nil, nil, "none",
                            { flags = dense.X_RELU, gb_x = R.zeros({ 5 }) })
    end, "linear backward: X_RELU and gb_x act on gx, which is NULL")
    local big = R.zeros({ 8, 5 })
    assert.error_matches(function() dense.linear_forward(big:view(0, 4), R.zeros({ 5, 5 }), nil, big:view(2, 4)) end,
      "y and x overlap in storage")
  end)

  -- ur_linear_backward_workspace: the GPU's bytes by kernels/linear.cu's rules, worked by hand
  -- here (cuBLASLt's 32 MiB, then the largest part; spec/dense_cuda_spec.lua holds a GPU to them).
  it("sizes a backward's GPU workspace: cuBLASLt's part and the largest partial sums it asks", function()
    local LT, SMS = 32 * 2 ^ 20, 132
    local ws = dense.linear_backward_workspace
    local all = { gx = true, gw = true, gb = true }
    -- a ReLU layer's bias gradient in chunks of rows: 4 SMs a 256-column tile (4 x 132 / 1 tile
    -- = 528 chunks of 128 floats; 4 x 132 / 4 tiles = 132 chunks of 1024), at most a chunk per 8
    -- rows; the weight gradient on the side stream holds cuBLASLt's part alone
    assert.same({ LT + 528 * 128 * 4, LT }, { ws(65536, 256, 128, all, "relu", dense.WGRAD_ASYNC, SMS) })
    assert.same({ LT + 132 * 1024 * 4, LT }, { ws(65536, 1024, 1024, all, "relu", dense.WGRAD_ASYNC, SMS) })
    assert.same({ LT + 1 * 64 * 4, LT }, { ws(3, 8, 64, all, "relu", dense.WGRAD_ASYNC, SMS) })
    assert.same({ LT + 13 * 4 * 4, 0 }, { ws(100, 3, 4, all, "relu", 0, SMS) })
    -- at most 65535 chunks, a grid's height: 4 x 20000 SMs would want 80000 of 2^20 / 8 rows
    assert.same({ LT + 65535 * 32 * 4, LT }, { ws(2 ^ 20, 16, 32, all, "relu", dense.WGRAD_ASYNC, 20000) })
    -- without gb the ReLU's pass keeps no partials
    assert.same({ LT, LT }, { ws(100, 3, 4, { gx = true, gw = true }, "relu", dense.WGRAD_ASYNC, SMS) })
    -- the layer below's mask folded into gx: its bias gradient's `in` floats; an unmasked layer's
    -- bias gradient in its weight gradient's product: `out` floats, on the side stream or on s
    local xm = { gx = true, gw = true, gb = true, x_mask = true }
    assert.same({ LT + 96 * 4, LT + 8 * 4 }, { ws(8, 96, 8, xm, "none", dense.WGRAD_ASYNC, SMS) })
    assert.same({ LT + 96 * 4, 0 }, { ws(8, 96, 8, xm, "none", 0, SMS) })
    assert.same({ LT + 200 * 4, 0 }, { ws(8, 96, 200, xm, "none", 0, SMS) })
    -- X_RELU: the layer below's ReLU folded into gx by the mask pass after the product, its bias
    -- gradient by chunks of rows of `in` floats (1 chunk at 8 rows; 132 of 1024 at 65536)
    local xr = { gx = true, gw = true, gb = true }
    assert.same({ LT + 96 * 4, LT + 8 * 4 }, { ws(8, 96, 8, xr, "none", dense.X_RELU + dense.WGRAD_ASYNC, SMS) })
    assert.same({ LT + 132 * 1024 * 4, LT + 512 * 4 },
                { ws(65536, 1024, 512, xr, "none", dense.X_RELU + dense.WGRAD_ASYNC, SMS) })
    assert.same({ LT + 200 * 4, 0 }, { ws(8, 96, 200, xr, "none", dense.X_RELU, SMS) })
    -- GY_MASKED: the layer above took the ReLU and the bias gradient; relu is then ignored
    assert.same({ LT + 64 * 4, LT }, { ws(8, 64, 32, { gx = true, gw = true, x_mask = true }, "relu",
                                         dense.GY_MASKED + dense.WGRAD_ASYNC, SMS) })
    -- a bias gradient without a weight gradient: chunks of rows, where the weight gradient goes
    assert.same({ 0, LT + 13 * 4 * 4 }, { ws(100, 3, 4, { gb = true }, "none", dense.WGRAD_ASYNC, SMS) })
    assert.same({ 0, LT + 13 * 4 * 4 }, { ws(100, 0, 4, { gb = true, gw = true }, "none", dense.WGRAD_ASYNC, SMS) })
    -- one output: at most 4 x 132 blocks of 32 rows or more, then as many as ceil(65536 / 528)
    -- = 125 rows a block leave (525), each 2 x 256 + 1 floats; all on s, whatever the flags
    assert.same({ LT + (525 * 256 * 2 + 525) * 4, 0 },
                { ws(65536, 256, 1, all, "none", dense.WGRAD_ASYNC, SMS) })
    assert.same({ LT + (32 * 7 * 2 + 32) * 4, 0 }, { ws(1000, 7, 1, { gw = true }, "relu", 0, SMS) })
    assert.same({ LT + (1 * 5 * 2 + 1) * 4, 0 }, { ws(1, 5, 1, all, "none", 0, SMS) })
    -- nothing to run: no rows; no columns and no bias gradient
    assert.same({ 0, 0 }, { ws(0, 256, 1, all, "relu", dense.WGRAD_ASYNC, SMS) })
    assert.same({ 0, 0 }, { ws(8, 0, 0, all, "none", dense.WGRAD_ASYNC, SMS) })
  end)

  it("names the value and the expectation when a backward's workspace is asked wrongly", function()
    local ws, all = dense.linear_backward_workspace, { gx = true, gw = true, gb = true }
    assert.error_matches(function() ws(-1, 4, 4, all, "none", 0, 132) end,
      "linear backward workspace: rows %-1, in 4, out 4; expected sizes of 0 or more")
    assert.error_matches(function() ws(8, 4, 4, all, "none", 0, 0) end,
      "sms is 0; expected the GPU's multiprocessors, 1 or more")
    assert.error_matches(function() ws(8, 4, 4, all, "sigmoid", 0, 132) end,
      "activation 2 is not none %(0%) or relu %(1%)")
    assert.error_matches(function() ws(8, 4, 4, { gw = true, x_mask = true }, "none", 0, 132) end,
      "workspace: x_mask acts on gx, which is NULL")
    assert.error_matches(function() ws(8, 4, 4, { gx = true, x_mask = true }, "none", dense.X_RELU, 132) end,
      "x_mask and X_RELU both mask gx")
    assert.error_matches(function() ws(8, 4, 4, all, "none", dense.GY_MASKED, 132) end,
      "under GY_MASKED the layer above took the bias gradient: gb must be NULL")
    assert.error_matches(function() ws(8, 4, 4, all, "none", 64, 132) end, "flags 0x40 include bits other than")
    assert.error_matches(function() ws(8, 4, 4, all, "none", dense.pad(5), 132) end,
      "5 padding columns but the input has 4")
    local ffi, C = require "ffi", require("uvmrec.lib").C
    local out = ffi.new("uint64_t[2]")
    assert.equal(C.UR_STATUS_INVALID, C.ur_linear_backward_workspace(8, 4, 4, 2, 1, 1, 0, out, out + 1, 0, 0, 132))
    assert.equal("linear backward workspace: gx is 2; expected 1 (given) or 0 (NULL)", ffi.string(C.ur_last_error()))
  end)
end)

describe("uvmrec.dense activations", function()
  it("computes relu and sigmoid and their gradients from the output, in place too", function()
    local x, xv = R.rand({ 7, 9 }, 51, { lo = -8, hi = 8 })
    local _, gyv = R.rand({ 7, 9 }, 52)
    for _, act in ipairs { "relu", "sigmoid" } do
      local y = R.zeros({ 7, 9 })
      dense.act_forward(x, y, act)
      local ry, rg = {}, {}
      for i, v in ipairs(xv) do
        ry[i] = act == "relu" and math.max(v, 0) or R.sigmoid(v)
        rg[i] = act == "relu" and (v > 0 and gyv[i] or 0) or gyv[i] * ry[i] * (1 - ry[i])
      end
      R.close(y:totable(), ry, 1e-6, act)
      local g = R.tensor({ 7, 9 }, gyv)
      dense.act_backward(y, g, g, act)
      R.close(g:totable(), rg, 1e-6, act .. " gradient")
    end
  end)

  it("passes NaN on through relu, alone and in a linear layer's epilogue, its mask bit set", function()
    local y = R.zeros({ 3 })
    dense.act_forward(R.tensor({ 3 }, { 0 / 0, -1, 2 }), y, "relu")
    local v = y:totable()
    assert.is_true(v[1] ~= v[1], "relu(NaN) is NaN")
    assert.same({ 0, 2 }, { v[2], v[3] })
    for _, dt in ipairs { "f32", "bf16" } do
      local x = R.rand({ 4, 5 }, 61, { dtype = dt })
      x:set(2 * 5 + 1, 0 / 0) -- row 2
      local out = R.zeros({ 4, 6 }, { dtype = dt })
      local mask = R.zeros({ 4, dense.mask_cols(6) }, { dtype = "u8" })
      dense.linear_forward(x, R.rand({ 6, 5 }, 62, { dtype = dt }), R.rand({ 6 }, 63, { dtype = dt }), out, "relu",
                           { flags = 0, mask = mask })
      local o, m = out:totable(), mask:totable()
      for j = 1, 6 do assert.is_true(o[2 * 6 + j] ~= o[2 * 6 + j], dt .. ": row 2 is NaN") end
      -- NaN lets its gradient through (the bits cuBLASLt's RELU_AUX epilogues set): 6 bits
      assert.equal(63, m[2 * dense.mask_cols(6) + 1], dt .. ": row 2's mask bits are set")
      for i = 1, 2 * 6 do assert.is_true(o[i] >= 0, dt .. ": the other rows pass relu") end
    end
  end)

  it("keeps sigmoid exact at extreme inputs", function()
    local x = R.tensor({ 4 }, { -100, 100, -1e30, 1e30 })
    local y = R.zeros({ 4 })
    dense.act_forward(x, y, "sigmoid")
    local v = y:totable()
    assert.same({ 1, 1 }, { v[2], v[4] })
    assert.is_true(v[1] >= 0 and v[1] < 1e-40 and v[3] == 0)
  end)

  it("rejects an activation it does not have", function()
    assert.error_matches(function() dense.act_forward(R.zeros({ 2 }), R.zeros({ 2 }), "none") end,
      "activation forward: activation 0 is not relu %(1%) or sigmoid %(2%)")
    assert.error_matches(function() dense.act_forward(R.zeros({ 2 }), R.zeros({ 3 }), "relu") end,
      "activation forward: y is f32 %[3%]; expected f32 or bf16 of 2 elements")
  end)
end)

-- The interaction's input gradients for the output gradient go against the float64 reference's:
-- dense dn and embeddings em (rows by T tables of d) with their values dv and ev, and gov the
-- gradient's values for the unpadded output.
local function check_interaction_backward(dn, dv, em, ev, go, gov, rows, T, d, self)
  local gd, ge = R.zeros({ rows, d }), R.zeros({ rows, T * d })
  dense.interaction_backward(dn, em, go, gd, ge, self)
  local rgd, rge = R.interaction_back(dv, ev, gov, rows, T, d, self)
  R.close(gd:totable(), rgd, 1e-5, "gdense")
  R.close(ge:totable(), rge, 1e-5, "gemb")
end

describe("uvmrec.dense interaction", function()
  for _, self in ipairs { false, true } do
    it("computes dense and the lower triangle of dot products (self " .. tostring(self) .. ")", function()
      local rows, T, d = 6, 5, 8
      local dn, dv = R.rand({ rows, d }, 61)
      local em, ev = R.rand({ rows, T * d }, 62)
      local ref, w = R.interaction(dv, ev, rows, T, d, self)
      assert.equal(w, dense.interaction_width(T, d, self))
      local out = R.zeros({ rows, w })
      dense.interaction_forward(dn, em, out, self)
      R.close(out:totable(), ref, 1e-5, "out")
      local go, gov = R.rand({ rows, w }, 63)
      check_interaction_backward(dn, dv, em, ev, go, gov, rows, T, d, self)
    end)
  end

  it("pads its output with zero columns to a multiple of 8 and ignores their gradient", function()
    local rows, T, d = 4, 3, 8
    local dn, dv = R.rand({ rows, d }, 64)
    local em, ev = R.rand({ rows, T * d }, 65)
    local ref, w = R.interaction(dv, ev, rows, T, d, false)
    local wp = dense.interaction_width(T, d, false, true)
    assert.same({ 14, 16 }, { w, wp })
    assert.equal(0, dense.interaction_width(0, d))
    assert.has_error(function() dense.interaction_width(2.5, d) end,
      "interaction_width: T is 2.5; expected a whole number from 0 to 2147483647")
    assert.has_error(function() dense.interaction_width(T, 2 ^ 32 + 8) end,
      "interaction_width: d is 4294967304; expected a whole number from 0 to 2147483647")
    assert.has_error(function() dense.interaction_width(nil, d) end,
      "interaction_width: T is nil; expected a whole number from 0 to 2147483647")
    local out = R.rand({ rows, wp }, 66) -- not zeros: the padding must be written
    dense.interaction_forward(dn, em, out, false)
    local got = out:totable()
    for r = 0, rows - 1 do
      for k = 1, wp do
        if k <= w then R.close({ got[r * wp + k] }, { ref[r * w + k] }, 1e-5, "out")
        else assert.equal(0, got[r * wp + k]) end
      end
    end
    -- the gradient of the padded output, whatever its padding holds, is the unpadded one's
    local go, gov = R.rand({ rows, wp }, 67)
    local gou = {}
    for r = 0, rows - 1 do
      for k = 1, w do gou[r * w + k] = gov[r * wp + k] end
    end
    check_interaction_backward(dn, dv, em, ev, go, gou, rows, T, d, false)
  end)

  it("mixes dtypes: bf16 dense, f32 embeddings, bf16 output", function()
    local rows, T, d = 3, 26, 16
    local dn, dv = R.rand({ rows, d }, 71, { dtype = "bf16" })
    local em, ev = R.rand({ rows, T * d }, 72)
    local ref, w = R.interaction(dv, ev, rows, T, d, false)
    local out = R.zeros({ rows, w }, { dtype = "bf16" })
    dense.interaction_forward(dn, em, out, false)
    R.close(out:totable(), ref, 2 ^ -8, "out")
  end)

  it("says what shapes it expected", function()
    assert.error_matches(function()
      dense.interaction_forward(R.zeros({ 2, 4 }), R.zeros({ 2, 10 }), R.zeros({ 2, 7 }))
    end, "interaction forward: emb has 10 columns; expected T %* 4")
    assert.error_matches(function()
      dense.interaction_forward(R.zeros({ 2, 4 }), R.zeros({ 2, 8 }), R.zeros({ 2, 9 }))
    end, "interaction forward: out is f32 %[2, 9%]; expected f32 or bf16 %[2, 7%] %(or 8 columns: "
      .. "padded to a multiple of 8%)")
    assert.error_matches(function()
      dense.interaction_backward(R.zeros({ 2, 4 }), R.zeros({ 2, 8 }), R.zeros({ 2, 7 }), R.zeros({ 2, 4 }),
                                 R.zeros({ 2, 8 }), false, 4)
    end, "interaction backward: flags 0x4 include bits other than TF32 %(0x1%)")
    assert.error_matches(function()
      dense.interaction_forward(R.zeros({ 2, 4 }), R.zeros({ 3, 8 }), R.zeros({ 2, 7 }))
    end, "emb is f32 %[3, 8%]; expected f32 or bf16 %[2, cols%]")
  end)
end)

describe("uvmrec.dense cross layer", function()
  it("computes x0 * z + xl and its gradients, with and without a separate xl", function()
    local shape = { 5, 6 }
    local x0, a = R.rand(shape, 81)
    local z, b = R.rand(shape, 82)
    local xl, c = R.rand(shape, 83)
    local y = R.zeros(shape)
    dense.cross_forward(x0, z, xl, y)
    local ry = {}
    for i = 1, #a do ry[i] = a[i] * b[i] + c[i] end
    R.close(y:totable(), ry, 1e-6, "y")
    local gy, g = R.rand(shape, 84)
    local gz, gx0, gxl = R.zeros(shape), R.zeros(shape), R.zeros(shape)
    local gx0_0, g0 = R.rand(shape, 85)
    gx0:copy(gx0_0)
    dense.cross_backward(x0, z, gy, gz, gx0, gxl, dense.ACCUMULATE)
    local rgz, rgx0 = {}, {}
    for i = 1, #a do rgz[i], rgx0[i] = g[i] * a[i], g0[i] + g[i] * b[i] end
    R.close(gz:totable(), rgz, 1e-6, "gz")
    R.close(gx0:totable(), rgx0, 1e-6, "gx0")
    R.close(gxl:totable(), g, 0, "gxl")
    dense.cross_backward(x0, z, gy, gz, gx0, nil, 0)
    for i = 1, #a do rgx0[i] = g[i] * b[i] + g[i] end
    R.close(gx0:totable(), rgx0, 1e-6, "gx0 when xl is x0")
  end)

  it("wants every tensor of one shape", function()
    assert.error_matches(function()
      dense.cross_forward(R.zeros({ 2, 3 }), R.zeros({ 2, 3 }), R.zeros({ 2, 4 }), R.zeros({ 2, 3 }))
    end, "cross forward: xl is f32 %[2, 4%]; expected f32 or bf16 %[2, 3%]")
  end)
end)

describe("uvmrec.dense concat and split", function()
  it("puts parts side by side and takes them apart again", function()
    local a, av = R.rand({ 4, 3 }, 91)
    local b, bv = R.rand({ 4, 5 }, 92)
    local out = R.zeros({ 4, 8 })
    dense.concat({ a, b }, out)
    local o = out:totable()
    for r = 0, 3 do
      for c = 1, 3 do assert.equal(av[r * 3 + c], o[r * 8 + c]) end
      for c = 1, 5 do assert.equal(bv[r * 5 + c], o[r * 8 + 3 + c]) end
    end
    local a2, b2 = R.zeros({ 4, 3 }), R.zeros({ 4, 5 })
    dense.split(out, { a2, b2 })
    assert.same(av, a2:totable())
    assert.same(bv, b2:totable())
    assert.error_matches(function() dense.concat({ a, b }, R.zeros({ 4, 9 })) end,
      "features concat: the parts have 8 columns together but out has 9")
  end)
end)

describe("uvmrec.dense BCE with logits", function()
  it("is exact and finite at logits of +-100 and large ones", function()
    local x = R.tensor({ 6 }, { 100, -100, 100, -100, 1e4, -1e4 })
    local t = R.tensor({ 6 }, { 0, 1, 1, 0, 0, 1 })
    local loss = R.zeros({ 6 })
    dense.bce_forward(x, t, nil, loss, "none")
    local l = loss:totable()
    assert.same({ 100, 100, 1e4, 1e4 }, { l[1], l[2], l[5], l[6] })
    assert.is_true(l[3] >= 0 and l[3] < 1e-40 and l[4] >= 0 and l[4] < 1e-40)
    local g = R.zeros({ 6 })
    dense.bce_backward(x, t, nil, g, "sum")
    local gv = g:totable()
    assert.same({ 1, -1, 0, 1, -1 }, { gv[1], gv[2], gv[3], gv[5], gv[6] })
    assert.is_true(math.abs(gv[4] - R.sigmoid(-100)) < 2 ^ -149) -- f32's smallest step there
  end)

  for _, red in ipairs { "mean", "sum", "none" } do
    it("weights samples and reduces by " .. red, function()
      local n = 37
      local x, xv = R.rand({ n, 1 }, 101, { lo = -6, hi = 6 })
      local t, tv = R.rand({ n }, 102, { lo = 0, hi = 1 })
      local w, wv = R.rand({ n }, 103, { lo = 0, hi = 2 })
      local loss = R.zeros({ red == "none" and n or 1 })
      dense.bce_forward(x, t, w, loss, red)
      local ref, sum = {}, 0
      for i = 1, n do
        ref[i] = R.bce(xv[i], tv[i], wv[i])
        sum = sum + ref[i]
      end
      if red ~= "none" then ref = { red == "mean" and sum / n or sum } end
      R.close(loss:totable(), ref, 1e-6, "loss")
      local g = R.zeros({ n, 1 })
      dense.bce_backward(x, t, w, g, red, 0.5)
      local rg = {}
      for i = 1, n do
        rg[i] = 0.5 * wv[i] * (R.sigmoid(xv[i]) - tv[i]) / (red == "mean" and n or 1)
      end
      R.close(g:totable(), rg, 1e-6, "gradient")
    end)
  end

  it("checks shapes and the reduction", function()
    assert.error_matches(function() dense.bce_forward(R.zeros({ 4, 2 }), R.zeros({ 4 }), nil, R.zeros({ 1 })) end,
      "bce forward: logits has 2 dimensions of which the second is 2; expected %[rows%] or %[rows, 1%]")
    assert.error_matches(function() dense.bce_forward(R.zeros({ 4 }), R.zeros({ 3 }), nil, R.zeros({ 1 })) end,
      "bce forward: targets is f32 %[3%]; expected f32 of 4 elements")
    assert.error_matches(function() dense.bce_forward(R.zeros({ 4 }), R.zeros({ 4 }), nil, R.zeros({ 1 }), "max") end,
      "reduction 'max' is not mean, sum or none")
    assert.error_matches(function() dense.bce_forward(R.zeros({ 0 }), R.zeros({ 0 }), nil, R.zeros({ 1 })) end,
      "the mean of no samples is undefined")
  end)
end)

describe("uvmrec.dense mean and cast", function()
  it("averages every element in double and casts f32 <-> bf16 to nearest even", function()
    local x, xv = R.rand({ 13, 7 }, 111)
    local out = R.zeros({ 1 })
    dense.mean(x, out)
    local s = 0
    for _, v in ipairs(xv) do s = s + v end
    R.close(out:totable(), { s / #xv }, 1e-6, "mean")
    local h = R.zeros({ 3 }, { dtype = "bf16" })
    dense.cast(R.tensor({ 3 }, { 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, -2.5 }), h)
    assert.same({ 1, 1 + 2 ^ -6, -2.5 }, h:totable())
    local f = R.zeros({ 3 })
    dense.cast(h, f)
    assert.same({ 1, 1 + 2 ^ -6, -2.5 }, f:totable())
    assert.error_matches(function() dense.cast(R.zeros({ 3 }), R.zeros({ 3 }, { dtype = "i32" })) end,
      "dense cast: dst is i32 %[3%]; expected f32 or bf16 of 3 elements")
    assert.error_matches(function() dense.mean(R.zeros({ 0 }), out) end, "dense mean: x has no elements")
  end)
end)
