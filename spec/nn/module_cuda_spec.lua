-- nn modules (lua/uvmrec/nn/Module.lua and its subclasses) on CUDA against the CPU backend: a
-- small DLRM-shaped model trains alike, and a training step allocates nothing once the batch
-- size was seen.  Every test is #cuda: pending without a GPU.
local ur = require "uvmrec"
local h = require "helpers"
local R = require "dense_ref"
local dense = ur.dense
local cuda_it = h.cuda_it

local function dev(t) return assert(t:to("device")) end

describe("uvmrec.nn on CUDA", function()
  local function model()
    ur.nn.Module.manual_seed(11)
    local bottom = ur.nn.MLP({ 13, 64, 16 }, { input_grad = false })
    local width = dense.interaction_width(26, 16, false)
    local top = ur.nn.Sequential(ur.nn.CrossNet(width, 2, { rank = 8 }),
                                 ur.nn.MLP({ width, 32, 1 }, { last = "none" }))
    return bottom, ur.nn.Interaction(), top
  end

  local function step(parts, x, emb, t, opt, crit)
    local bottom, inter, top = parts[1], parts[2], parts[3]
    local b = bottom:forward(x)
    local z = inter:forward({ b, emb })
    local logit = top:forward(z)
    local loss = crit:forward(logit, t)
    bottom:zero_grad()
    top:zero_grad()
    local gz = top:backward(z, crit:backward(logit, t))
    local gi = inter:backward({ b, emb }, gz)
    bottom:backward(x, gi[1])
    opt:step()
    return loss, gi[2]
  end

  for _, precision in ipairs { "f32", "bf16" } do
    cuda_it("trains a small DLRM-shaped model like the CPU (" .. precision .. ")", function()
      local rows = 256
      local x, emb, t = R.rand({ rows, 13 }, 1), R.rand({ rows, 26 * 16 }, 2), R.rand({ rows }, 3, { lo = 0, hi = 1 })
      local runs = {}
      for _, place in ipairs { "host", "device" } do
        local parts = { model() }
        local params = {}
        for _, m in ipairs(parts) do
          assert(m:to(place))
          assert(m:set_precision(precision))
          for _, p in ipairs(m:parameters()) do params[#params + 1] = p end
        end
        local opt = ur.optim.Adam(params, { lr = 1e-3 })
        local crit = ur.nn.BCEWithLogits()
        local xs, es, ts = x, emb, t
        if place == "device" then xs, es, ts = dev(x), dev(emb), dev(t) end
        local losses, gemb = {}, nil
        for i = 1, 3 do
          local loss, ge = step(parts, xs, es, ts, opt, crit)
          losses[i], gemb = loss:get(0), ge
        end
        runs[place] = { losses = losses, gemb = gemb:totable(), w = params[1].tensor:totable() }
      end
      -- Gradients pass ReLUs, whose masks the backends may set apart where a pre-activation is
      -- within rounding of zero: in f32 a few elements, compared in norm; in bf16, where each
      -- rounding step moves values by 2^-8, many, compared elementwise against max(1, |cpu|).
      local close = precision == "bf16" and R.close or R.close_norm
      local tol = precision == "bf16" and 3e-2 or 1e-3
      R.close(runs.device.losses, runs.host.losses, precision == "bf16" and 3e-2 or 1e-5, "losses")
      close(runs.device.gemb, runs.host.gemb, tol, "embedding gradient")
      close(runs.device.w, runs.host.w, tol, "first weight after 3 steps")
    end)
  end

  cuda_it("names the module and the parameter or buffer the HBM budget refuses, and keeps nothing of a failed to()",
          function()
    ur.nn.Module.manual_seed(5)
    local m = ur.nn.Sequential(ur.nn.Linear(64, 256), ur.nn.ReLU(), ur.nn.Linear(256, 1024))
    collectgarbage("collect")
    local used = ur.memory().hbm_used
    -- room for the first layer's weight and gradient and no more
    ur.set_hbm_budget(used + 2 * 64 * 256 * 4 + 512)
    local ok, err = m:to("device")
    ur.set_hbm_budget(nil)
    assert.is_nil(ok)
    assert.matches("^Linear%(64 %-> 256, %+relu%): parameter 1%.bias to device: hbm budget: ", err)
    assert.equal(used, ur.memory().hbm_used) -- the copies made before it went at once
    assert.equal("host", m:parameters()[1].tensor:placement())
    assert(m:to("device"))
    m:forward(R.rand({ 16, 64 }, 6, { placement = "device" })) -- the arena's first block, the workspaces
    -- a batch whose activations outgrow that block, under a budget that holds no more
    local x = R.rand({ 131072, 64 }, 7, { placement = "device" })
    ur.set_hbm_budget(ur.memory().hbm_used + 1024)
    local fok, ferr = pcall(function() m:forward(x) end)
    ur.set_hbm_budget(nil)
    assert.is_false(fok)
    assert.matches("Linear%(64 %-> 256, %+relu%): buffer output %[131072, 256%] of f32: hbm budget: ", tostring(ferr))
    -- bf16 copies the budget does not hold: the model stays in f32 and still computes
    ur.set_hbm_budget(ur.memory().hbm_used + 1024)
    local pok, perr = m:set_precision("bf16")
    ur.set_hbm_budget(nil)
    assert.is_nil(pok)
    assert.matches("^Linear%(64 %-> 256, %+relu, bf16%): parameter 1%.weight's bf16 copy: hbm budget: .*; the model "
                   .. "stays in f32$", perr)
    assert.equal("f32", m.precision)
    assert.equal("f32", m:get(3).precision)
    assert.same({ 131072, 1024 }, m:forward(x):size())
  end)

  cuda_it("allocates nothing on the GPU in a training step once the batch size was seen", function()
    local parts = { model() }
    local params = {}
    for _, m in ipairs(parts) do
      assert(m:to("device"))
      for _, p in ipairs(m:parameters()) do params[#params + 1] = p end
    end
    local opt = ur.optim.SGD(params, { lr = 0.01 })
    local crit = ur.nn.BCEWithLogits()
    local x = R.rand({ 512, 13 }, 1, { placement = "device" })
    local emb = R.rand({ 512, 416 }, 2, { placement = "device" })
    local t = R.rand({ 512 }, 3, { lo = 0, hi = 1, placement = "device" })
    step(parts, x, emb, t, opt, crit)
    ur.sync()
    -- Earlier specs' tensors are collected first and the collector is held during the steps, so
    -- what it frees of theirs (device tensors included) cannot look like the step's doing.
    collectgarbage("collect")
    collectgarbage("collect")
    collectgarbage("stop")
    local before = ur.memory()
    for _ = 1, 3 do step(parts, x, emb, t, opt, crit) end
    ur.sync()
    local after = ur.memory()
    collectgarbage("restart")
    assert.same(before, after)
  end)
end)
