-- The dense optimizers (lua/uvmrec/optim/init.lua, Optimizer.lua) against their formulas
-- (PyTorch's), in float64, over several steps with fresh gradients each step; their names,
-- kinds and defaults, one set for dense parameters and embedding tables; and the errors.
local ur = require "uvmrec"
local R = require "dense_ref"
local optim = ur.optim
local f32 = R.f32

-- One parameter entry as model:parameters() gives it, with a bf16 copy.
local function param(n, seed)
  local t, v = R.rand({ n }, seed)
  return { name = "p" .. seed, tensor = t, grad = R.zeros({ n }), half = R.zeros({ n }, { dtype = "bf16" }) }, v
end

-- Runs `steps` steps of the optimizer made by make(params) and of ref(p, g, state, step)
-- (float64, elementwise on one value; returns the new p), on two parameters.
local function against(make, ref, steps, tol)
  local p1, v1 = param(37, 1)
  local p2, v2 = param(5, 2)
  local opt = make({ p1, p2 })
  local refs = { { p = p1, v = v1, s = {} }, { p = p2, v = v2, s = {} } }
  for step = 1, steps do
    for k, r in ipairs(refs) do
      local g, gv = R.rand({ #r.v }, 100 * step + k, { lo = -2, hi = 2 })
      r.p.grad:copy(g)
      for i = 1, #r.v do
        r.s[i] = r.s[i] or {}
        r.v[i] = ref(r.v[i], gv[i], r.s[i], step)
      end
    end
    opt:step()
    for _, r in ipairs(refs) do
      R.close(r.p.tensor:totable(), r.v, tol, ("step %d"):format(step))
      local h = R.zeros({ #r.v }, { dtype = "bf16" })
      ur.dense.cast(r.p.tensor, h)
      assert.same(h:totable(), r.p.half:totable())
    end
  end
  return opt
end

describe("uvmrec.optim", function()
  it("SGD: plain, with weight decay, momentum and nesterov", function()
    against(function(ps) return optim.SGD(ps, { lr = 0.1 }) end,
      function(p, g) return p - 0.1 * g end, 3, 1e-6)
    against(function(ps) return optim.SGD(ps, { lr = 0.05, momentum = 0.9, weight_decay = 0.01 }) end,
      function(p, g, s, step)
        g = g + 0.01 * p
        s.b = step == 1 and g or 0.9 * s.b + g
        return p - 0.05 * s.b
      end, 4, 1e-5)
    against(function(ps) return optim.SGD(ps, { lr = 0.05, momentum = 0.5, nesterov = true }) end,
      function(p, g, s, step)
        s.b = step == 1 and g or 0.5 * s.b + g
        return p - 0.05 * (g + 0.5 * s.b)
      end, 4, 1e-5)
  end)

  it("Adagrad, with an initial accumulator", function()
    against(function(ps) return optim.Adagrad(ps, { lr = 0.1, initial_accumulator_value = 0.1, eps = 1e-10 }) end,
      function(p, g, s)
        s.sum = (s.sum or 0.1) + g * g
        return p - 0.1 * g / (math.sqrt(s.sum) + 1e-10)
      end, 4, 1e-5)
  end)

  for _, kind in ipairs { "Adam", "AdamW" } do
    it(kind .. " with bias correction and weight decay", function()
      local lr, b1, b2, eps, wd = 0.01, 0.8, 0.95, 1e-8, 0.1
      against(function(ps) return optim[kind](ps, { lr = lr, betas = { b1, b2 }, eps = eps, weight_decay = wd }) end,
        function(p, g, s, t)
          if kind == "AdamW" then p = p * (1 - lr * wd) else g = g + wd * p end
          s.m = b1 * (s.m or 0) + (1 - b1) * g
          s.v = b2 * (s.v or 0) + (1 - b2) * g * g
          local denom = math.sqrt(s.v) / math.sqrt(1 - b2 ^ t) + eps
          return p - lr / (1 - b1 ^ t) * s.m / denom
        end, 5, 1e-5)
    end)
  end

  it("zeroes the gradients in the step when asked, and takes its rate from a schedule", function()
    local p = param(8, 3)
    local opt = optim.SGD({ p }, { lr = 1, zero_grad = true })
    local asked = {}
    local lrs = optim.Schedule(function(step)
      asked[#asked + 1] = step
      return 0.5 ^ step
    end, { opt })
    p.grad:fill(1)
    local before = p.tensor:totable()
    lrs:set(1)
    opt:step()
    for i, v in ipairs(p.tensor:totable()) do assert.is_true(math.abs(v - (before[i] - 0.5)) < 1e-6) end
    for _, v in ipairs(p.grad:totable()) do assert.equal(0, v) end
    lrs:set(2)
    opt:step()
    assert.same({ 1, 2 }, asked)
    assert.equal(0.25, opt:lr())
    assert.matches("^SGD %(lr 0.25, 1 parameters, 0.0 MiB of state, step 2%)$", tostring(opt))
  end)

  it("names each optimizer once: the engine's kinds, one set of defaults for parameters and tables", function()
    assert.same({ "adagrad", "adam", "adamw", "sgd" }, optim.names("dense"))
    assert.same({ "adagrad", "adam", "rowwise_adagrad", "sgd" }, optim.names("tables"))
    assert.equal(ur.C.UR_OPTIM_KIND_ROWWISE_ADAGRAD, optim.RULES.rowwise_adagrad.kind)
    local c = optim.config("adam", "tables", { lr = 0.02, max_grad = 1 }, "t")
    assert.same({ ur.C.UR_OPTIM_KIND_ADAM, 0.02, 1e-8, 0.9, 0.999, 1 },
                { c.kind, c.lr, c.eps, c.beta1, c.beta2, c.max_grad })
    local ebc = ur.nn.EmbeddingBagCollection { tables = { { name = "t", rows = 4, dim = 4 } }, optimizer = "adam",
                                               device = "cpu" }
    assert.equal(optim.RULES.adam.defaults.lr, ebc:lr())
    assert.equal(optim.RULES.adam.defaults.lr, optim.Adam({ (param(4, 6)) }):lr())
    assert.same({ 0, 1, 16, 32 }, { optim.state_floats("sgd", 16), optim.state_floats("rowwise_adagrad", 16),
                                     optim.state_floats("adagrad", 16), optim.state_floats("adam", 16) })
    assert.error_matches(function() optim.config("adamw", "tables", {}, "t") end,
      "t: optimizer 'adamw' is not one of adagrad, adam, rowwise_adagrad, sgd")
    assert.error_matches(function() optim.config("adam", "tables", { momentum = 0.9 }, "t") end,
      "^t: unknown optimizer setting 'momentum'; expected beta1, beta2, betas, eps, lr, max_grad, weight_decay$")
  end)

  it("takes the betas a training config leaves out from the optimizers' defaults, one home for them", function()
    -- uvmrec.train.optimizer filled a missing beta with its own 0.9 and 0.999, beside optim.RULES'
    local train = require "uvmrec.train"
    local cfg = assert(train.config.parse([[
model: {bottom_mlp: [8, 4], top_mlp: [6, 1]}
embeddings: {dim: 4, rows: [10, 20]}
optimizer: {name: adam, lr: 0.01, beta1: 0.8}
]], "t.yaml"))
    local model = { parameters = function() return { (param(4, 7)) } end }
    local d = optim.RULES.adam.defaults
    local keep = d.beta2
    d.beta2 = 0.75
    local ok, opt = pcall(train.optimizer, cfg, model)
    d.beta2 = keep
    assert(ok, opt)
    assert.same({ 0.8, 0.75 }, { opt.cfg.beta1, opt.cfg.beta2 })
    -- the dense optimizers take both spellings, as the tables' do, one at a time
    local a = optim.Adam({ (param(4, 8)) }, { beta2 = 0.9 })
    assert.same({ 0.9, 0.9 }, { a.cfg.beta1, a.cfg.beta2 })
    assert.error_matches(function() optim.Adam({ (param(4, 8)) }, { betas = { 0.8, 0.9 }, beta1 = 0.7 }) end,
      "Adam: betas and beta1 are two spellings of the same settings")
    assert.error_matches(function() optim.SGD({ (param(4, 8)) }, { beta1 = 0.7 }) end,
      "SGD: sgd takes no setting 'beta1'")
  end)

  -- PyTorch's clip_grad_norm_(params, clip): norm = sqrt(sum of every gradient's squares),
  -- each gradient times min(1, clip / (norm + 1e-6)), then the update: here SGD, worked out in
  -- f64 for the norm and in f32 for the rest (the engine's order), against every bit.
  for _, c in ipairs { { clip = 0.5, scaled = true, what = "above" },
                       { clip = 1e3, scaled = false, what = "below" } } do
    it("clips the gradients by their global norm before the update when the norm is " .. c.what .. " clip_norm",
       function()
      local p1, v1 = param(37, 1)
      local p2, v2 = param(5, 2)
      local g1, gv1 = R.rand({ 37 }, 7, { lo = -2, hi = 2 })
      local g2, gv2 = R.rand({ 5 }, 8, { lo = -2, hi = 2 })
      p1.grad:copy(g1)
      p2.grad:copy(g2)
      local opt = optim.SGD({ p1, p2 }, { lr = 0.1, clip_norm = c.clip })
      opt:step()
      local sum = 0
      for _, gv in ipairs { gv1, gv2 } do
        for i = 1, #gv do sum = sum + gv[i] * gv[i] end
      end
      local norm = math.sqrt(sum)
      local factor = math.min(1, c.clip / (norm + 1e-6))
      assert.equal(c.scaled, factor < 1)
      assert.equal(norm, opt:grad_norm())
      local cf = f32(factor)
      for _, t in ipairs { { p1, v1, gv1 }, { p2, v2, gv2 } } do
        local want_p, want_g = {}, {}
        for i = 1, #t[2] do
          want_g[i] = f32(t[3][i] * cf)
          want_p[i] = f32(t[2][i] - f32(f32(0.1) * want_g[i]))
        end
        assert.same(want_p, t[1].tensor:totable())
        -- the gradients keep the clipped values (the step does not zero them here), as PyTorch's
        assert.same(want_g, t[1].grad:totable())
      end
    end)
  end

  it("clips with a factor of 1 below the threshold: the update of no clipping, bit for bit (Adam)", function()
    local function run(clip)
      local p1 = param(37, 1)
      local p2 = param(5, 2)
      local opt = optim.Adam({ p1, p2 }, { lr = 0.01, clip_norm = clip, zero_grad = true })
      for step = 1, 3 do
        p1.grad:copy((R.rand({ 37 }, 10 * step + 1)))
        p2.grad:copy((R.rand({ 5 }, 10 * step + 2)))
        opt:step()
      end
      return { p1.tensor:totable(), p2.tensor:totable() }, opt
    end
    local free, opt0 = run(nil)
    local big, opt = run(1e6)
    local small = run(0.1)
    assert.same(free, big)
    assert.are_not.same(free, small)
    assert.is_nil(opt0:grad_norm())
    assert.is_true(opt:grad_norm() > 0.1)
  end)

  it("skips parameters without a gradient", function()
    local p = param(4, 4)
    local frozen = { name = "table", tensor = R.zeros({ 3 }) }
    local opt = optim.Adam({ frozen, p })
    assert.equal(1, opt.n)
  end)

  it("rejects bad settings with a message", function()
    local p = param(4, 5)
    assert.error_matches(function() optim.SGD({ p }, { max_grad = 1 }) end,
      "SGD: unknown optimizer setting 'max_grad'; expected beta1, beta2, betas, clip_norm, eps, "
      .. "initial_accumulator_value, lr, momentum, nesterov, weight_decay, zero_grad$")
    assert.error_matches(function() optim.SGD({ p }, { clip_norm = -1 }) end,
      "SGD: clip_norm must be a finite number >= 0, got %-1")
    assert.error_matches(function() optim.Adam({ p }, { clip_norm = 1 / 0 }) end,
      "Adam: clip_norm must be a finite number >= 0, got inf")
    assert.error_matches(function() optim.Adam({ p }, { clip_norm = "1" }) end,
      "Adam: clip_norm must be a finite number >= 0, got '1'")
    assert.error_matches(function() optim.config("adam", "tables", { clip_norm = 1 }, "t") end,
      "t: unknown optimizer setting 'clip_norm'")
    assert.error_matches(function() optim.dense("rowwise_adagrad", { p }) end,
      "optim: 'rowwise_adagrad' is not a dense optimizer %(adagrad, adam, adamw, sgd%)")
    assert.error_matches(function() optim.Adam({ p }, { lr = -1 }) end, "lr must be a finite number >= 0, got %-1")
    -- settings are checked when the optimizer is made, not at its first step
    assert.error_matches(function() optim.Adam({ p }, { betas = { 1, 0.9 } }) end,
      "Adam: beta1 must be a number in %[0, 1%), got 1")
    assert.error_matches(function() optim.AdamW({ p }, { betas = { 0.9, -0.1 } }) end,
      "AdamW: beta2 must be a number in %[0, 1%), got %-0.1")
    assert.error_matches(function() optim.Adam({ p }, { betas = { "0.9", 0.9 } }) end,
      "Adam: beta1 must be a number in %[0, 1%), got '0.9'")
    assert.error_matches(function() optim.Adam({ p }, { betas = 0.9 }) end,
      "Adam: betas must be a list of two numbers {beta1, beta2}, got 0.9")
    assert.error_matches(function() optim.Adam({ p }, { betas = { 0.9 } }) end,
      "Adam: betas must be a list of two numbers {beta1, beta2}, got a list of 1")
    -- a table optimizer takes betas = {b1, b2} or beta1 =, beta2 =: both at once left betas[1] unused
    -- ({"adam", betas = {0.9, 0.99}, beta1 = 0.5} stepped with beta1 0.5, no word of the 0.9)
    assert.error_matches(function() optim.config("adam", "tables", { betas = { 0.9, 0.99 }, beta1 = 0.5 }, "t") end,
      "^t: betas and beta1 are two spellings of the same settings: give betas = {beta1, beta2}, or beta1 = and "
      .. "beta2 =, not both$")
    assert.error_matches(function() optim.config("adam", "tables", { betas = { 0.9, 0.99 }, beta2 = 0.99 }, "t") end,
      "^t: betas and beta2 are two spellings")
    assert.error_matches(function() optim.config("adam", "tables", { beta2 = 0 / 0 }, "t") end,
      "t: beta2 must be a number in %[0, 1%), got nan")
    -- eps divides: 0 would give 0/0 on a weight whose gradients were all 0 (the training config agrees)
    assert.error_matches(function() optim.Adagrad({ p }, { eps = 0 }) end,
      "Adagrad: eps must be a finite number > 0, got 0")
    assert.error_matches(function() optim.config("rowwise_adagrad", "tables", { eps = 0 }, "t") end,
      "t: eps must be a finite number > 0, got 0")
    assert.error_matches(function() optim.Adam({ p }, { eps = 1 / 0 }) end,
      "Adam: eps must be a finite number > 0, got inf")
    -- a setting the optimizer would ignore is refused, naming what it takes
    assert.error_matches(function() optim.Adagrad({ p }, { momentum = 0.9 }) end,
      "Adagrad: adagrad takes no setting 'momentum' %(its settings: clip_norm, eps, initial_accumulator_value, lr, "
      .. "weight_decay, zero_grad%)")
    assert.error_matches(function() optim.SGD({ p }, { betas = { 0.9, 0.99 } }) end,
      "SGD: sgd takes no setting 'betas'")
    assert.error_matches(function() optim.Adam({ p }, { initial_accumulator_value = 0.1 }) end,
      "Adam: adam takes no setting 'initial_accumulator_value'")
    assert.error_matches(function() optim.config("rowwise_adagrad", "tables", { beta1 = 0.9 }, "t") end,
      "t: rowwise_adagrad takes no setting 'beta1' %(its settings: eps, lr, max_grad, weight_decay%)")
    assert.error_matches(function() optim.SGD({ p }, { momentum = 0.9, nesterov = "false" }) end,
      "SGD: nesterov must be true or false, got false")
    assert.error_matches(function() optim.SGD({ p }, "lr=0.1") end,
      "SGD: the settings must be a table %({lr = ...}%), got string")
    assert.error_matches(function() optim.SGD({ p }, { lr = 1, nesterov = true }):step() end,
      "optim step: nesterov needs momentum > 0")
    local bad = { name = "b", tensor = R.zeros({ 4 }), grad = R.zeros({ 5 }) }
    assert.error_matches(function() optim.SGD({ bad }, { lr = 1 }):step() end,
      "optim step: gradient 1 is f32 %[5%]; expected f32 of 4 elements")
  end)
end)
