-- The nn modules on the CPU: forward against a float64 reference, and every gradient (input
-- and parameters) against central finite differences of that float64 reference; then the
-- module protocol: names, zero_grad, to, precision, printing, errors, the arena.
local ur = require "uvmrec"
local R = require "dense_ref"
local h = require "helpers"
local nn = ur.nn

-- Central differences of f (which reads vals) with respect to each element of vals.
local function fd(f, vals)
  local g = {}
  for i = 1, #vals do g[i] = h.central_difference(f, vals, i, 1e-6) end
  return g
end

-- Checks m's forward against ref(inputs' values, parameters' values) and every gradient of
-- sum(gout * output) against finite differences of ref.
local function gradcheck(m, inputs, ref, tol)
  local input = #inputs == 1 and inputs[1] or inputs
  local xv = {}
  for i, x in ipairs(inputs) do xv[i] = x:totable() end
  local params = m:parameters()
  local pv = {}
  for i, p in ipairs(params) do pv[i] = p.tensor:totable() end
  local y = m:forward(input)
  R.close(y:totable(), ref(xv, pv), tol, "forward")
  local gout, gv = R.rand(y:size(), 999)
  m:zero_grad()
  local gi = m:backward(input, gout)
  local function loss()
    local out, s = ref(xv, pv), 0
    for i = 1, #out do s = s + out[i] * gv[i] end
    return s
  end
  if #inputs == 1 then gi = { gi } end
  for i = 1, #inputs do R.close(gi[i]:totable(), fd(loss, xv[i]), tol, "gradient of input " .. i) end
  for i, p in ipairs(params) do R.close(p.grad:totable(), fd(loss, pv[i]), tol, "gradient of " .. p.name) end
end

local function mlp_ref(sizes, last)
  return function(xv, pv)
    local x, rows = xv[1], #xv[1] / sizes[1]
    for l = 1, #sizes - 1 do
      local act = (l < #sizes - 1 or last == "relu") and "relu" or "none"
      x = R.linear(x, pv[2 * l - 1], pv[2 * l], rows, sizes[l], sizes[l + 1], act)
    end
    if last == "sigmoid" then
      for i = 1, #x do x[i] = R.sigmoid(x[i]) end
    end
    return x
  end
end

local function cross_ref(d, L, rank)
  return function(xv, pv)
    local x0, rows = xv[1], #xv[1] / d
    local xl = x0
    for l = 1, L do
      local z
      if rank then
        local V, U, b = pv[3 * l - 2], pv[3 * l - 1], pv[3 * l]
        z = R.linear(R.linear(xl, V, nil, rows, d, rank), U, b, rows, rank, d)
      else
        z = R.linear(xl, pv[2 * l - 1], pv[2 * l], rows, d, d)
      end
      local y = {}
      for i = 1, #x0 do y[i] = x0[i] * z[i] + xl[i] end
      xl = y
    end
    return xl
  end
end

describe("uvmrec.nn gradients (finite differences of a float64 reference)", function()
  before_each(function() nn.Module.manual_seed(7) end)

  it("Linear, with and without bias and fused relu", function()
    gradcheck(nn.Linear(5, 4), { (R.rand({ 3, 5 }, 1)) }, function(xv, pv)
      return R.linear(xv[1], pv[1], pv[2], 3, 5, 4)
    end, 1e-4)
    gradcheck(nn.Linear(6, 3, { bias = false, act = "relu" }), { (R.rand({ 4, 6 }, 2)) }, function(xv, pv)
      return R.linear(xv[1], pv[1], nil, 4, 6, 3, "relu")
    end, 1e-4)
  end)

  it("ReLU and Sigmoid on their own", function()
    gradcheck(nn.ReLU(), { (R.rand({ 4, 5 }, 3)) }, function(xv)
      local y = {}
      for i, v in ipairs(xv[1]) do y[i] = math.max(v, 0) end
      return y
    end, 1e-4)
    gradcheck(nn.Sigmoid(), { (R.rand({ 4, 5 }, 4, { lo = -4, hi = 4 })) }, function(xv)
      local y = {}
      for i, v in ipairs(xv[1]) do y[i] = R.sigmoid(v) end
      return y
    end, 1e-4)
  end)

  it("Sequential: an MLP with fused relus, and one ending in a sigmoid", function()
    gradcheck(nn.MLP({ 5, 7, 4, 3 }), { (R.rand({ 6, 5 }, 5)) }, mlp_ref({ 5, 7, 4, 3 }, "relu"), 1e-4)
    gradcheck(nn.MLP({ 4, 6, 1 }, { last = "sigmoid" }), { (R.rand({ 5, 4 }, 6)) },
      mlp_ref({ 4, 6, 1 }, "sigmoid"), 1e-4)
  end)

  it("Interaction, without and with self-interaction", function()
    for _, self in ipairs { false, true } do
      gradcheck(nn.Interaction { self_interaction = self }, { (R.rand({ 3, 4 }, 7)), (R.rand({ 3, 12 }, 8)) },
        function(xv) return (R.interaction(xv[1], xv[2], 3, 3, 4, self)) end, 1e-4)
    end
  end)

  it("CrossNet, full rank and low rank", function()
    gradcheck(nn.CrossNet(5, 3), { (R.rand({ 4, 5 }, 9)) }, cross_ref(5, 3), 1e-4)
    gradcheck(nn.CrossNet(6, 2, { rank = 2 }), { (R.rand({ 3, 6 }, 10)) }, cross_ref(6, 2, 2), 1e-4)
  end)

  it("BCEWithLogits, weighted, mean and sum", function()
    local n = 9
    local x, xv = R.rand({ n, 1 }, 11, { lo = -5, hi = 5 })
    local t, tv = R.rand({ n }, 12, { lo = 0, hi = 1 })
    local w, wv = R.rand({ n }, 13, { lo = 0, hi = 2 })
    for _, red in ipairs { "mean", "sum" } do
      local crit = nn.BCEWithLogits { reduction = red }
      local function loss()
        local s = 0
        for i = 1, n do s = s + R.bce(xv[i], tv[i], wv[i]) end
        return red == "mean" and s / n or s
      end
      assert.is_true(math.abs(crit:forward(x, t, w):get(0) - loss()) < 1e-6)
      assert.is_true(math.abs(crit:value() - loss()) < 1e-6)
      R.close(crit:backward(x, t, w):totable(), fd(loss, xv), 1e-6, "gradient")
    end
  end)
end)

describe("uvmrec.nn modules", function()
  before_each(function() nn.Module.manual_seed(3) end)

  it("name parameters by path and zero their gradients", function()
    local m = nn.Sequential(nn.MLP({ 3, 4, 2 }), nn.CrossNet(2, 1, { rank = 1 }))
    local names = {}
    for _, p in ipairs(m:parameters()) do names[#names + 1] = p.name end
    assert.same({ "1.1.weight", "1.1.bias", "1.3.weight", "1.3.bias", "2.V_1", "2.U_1", "2.bias_1" }, names)
    m:forward(R.rand({ 5, 3 }, 1))
    m:backward(R.rand({ 5, 3 }, 1), R.rand({ 5, 2 }, 2))
    local nonzero = 0
    for _, p in ipairs(m:parameters()) do
      for _, v in ipairs(p.grad:totable()) do if v ~= 0 then nonzero = nonzero + 1 end end
    end
    assert.is_true(nonzero > 10)
    m:zero_grad()
    for _, p in ipairs(m:parameters()) do
      for _, v in ipairs(p.grad:totable()) do assert.equal(0, v) end
    end
  end)

  it("print as a tree", function()
    local m = nn.Sequential(nn.MLP({ 13, 8 }), nn.Interaction(), nn.CrossNet(4, 2), nn.BCEWithLogits())
    assert.equal(table.concat({
      "Sequential {",
      "  (1): Sequential {",
      "    (1): Linear(13 -> 8, +relu)",
      "    (2): ReLU (fused into the Linear before it)",
      "  }",
      "  (2): Interaction",
      "  (3): CrossNet(4, 2 layers)",
      "  (4): BCEWithLogits(mean)",
      "}" }, "\n"), tostring(m))
  end)

  it("give the same results in managed memory (host memory without a GPU)", function()
    local m = nn.MLP({ 6, 5, 2 })
    local x = R.rand({ 4, 6 }, 21)
    local y = m:forward(x):totable()
    assert(m:to("managed"))
    assert.equal("managed", m.placement)
    assert.equal("managed", m:parameters()[1].tensor:placement())
    local xm = assert(x:to("managed"))
    R.close(m:forward(xm):totable(), y, 1e-6, "managed")
    assert.error_matches(function() m:to("gpu") end, "to: placement 'gpu' is not host, pinned, device or managed")
  end)

  it("compute in bf16 with f32 master weights and gradients", function()
    local m = nn.MLP({ 16, 32, 8 }, { last = "none" })
    local x = R.rand({ 10, 16 }, 31)
    local y32 = m:forward(x):totable()
    assert(m:set_precision("bf16"))
    local y16 = m:forward(x)
    assert.equal("bf16", y16:dtype())
    R.close(y16:totable(), y32, 3e-2, "bf16 forward")
    local p = m:parameters()[1]
    assert.equal("f32", p.tensor:dtype())
    assert.equal("f32", p.grad:dtype())
    assert.equal("bf16", p.half:dtype())
    local gi = m:backward(x, R.rand({ 10, 8 }, 32, { dtype = "bf16" }))
    assert.equal("f32", gi:dtype()) -- the input's dtype
    local opt = ur.optim.SGD(m:parameters(), { lr = 0.1 })
    opt:step()
    local master, half = p.tensor:totable(), p.half:totable()
    local hb = R.zeros({ #master }, { dtype = "bf16" })
    ur.dense.cast(p.tensor, hb)
    assert.same(hb:totable(), half)
    assert.is_true(R.maxrel(master, half) > 0) -- the copy is rounded, the master is not
  end)

  it("allocate nothing in a training step once the batch size has been seen", function()
    local m = nn.Sequential(nn.MLP({ 8, 16, 4 }), nn.CrossNet(4, 2, { rank = 2 }))
    local crit = nn.BCEWithLogits()
    local head = nn.Linear(4, 1)
    m:add(head)
    local opt = ur.optim.Adam(m:parameters(), { lr = 1e-3 })
    local x, t = R.rand({ 32, 8 }, 41), R.rand({ 32 }, 42, { lo = 0, hi = 1 })
    local x2 = x:view(0, 16)
    local function step(xb, tb)
      local out = m:forward(xb)
      crit:forward(out, tb)
      m:zero_grad()
      m:backward(xb, crit:backward(out, tb))
      opt:step()
    end
    step(x, t)
    step(x2, t:view(0, 16))
    local s0, mem0 = m:arena():stats(), ur.memory()
    for _ = 1, 3 do
      step(x, t)
      step(x2, t:view(0, 16))
    end
    assert.same(s0, m:arena():stats())
    assert.same(mem0, ur.memory())
  end)

  it("prefix a child's error with its index and type", function()
    local m = nn.Sequential(nn.ReLU(), nn.Linear(13, 4))
    assert.error_matches(function() m:forward(R.rand({ 2, 9 }, 1)) end,
      "Sequential: %(2%) Linear: Linear%(13 %-> 4%): input is %[2, 9%]; expected %[rows, 13%]")
    assert.error_matches(function() nn.Linear(0, 3) end, "Linear: in must be a whole number >= 1, got 0")
    assert.error_matches(function() nn.Sequential():add({}) end, "Sequential:add: expected a module")
    assert.error_matches(function() nn.Interaction():forward(R.zeros({ 2, 2 })) end,
      "Interaction: input must be {dense %[rows, d%], emb %[rows, T%*d%]}")
  end)

  it("can be subclassed with Module:extend", function()
    local Scale = nn.Module:extend("Scale")
    function Scale:__init(n)
      nn.Module.__init(self)
      self:register_parameter("weight", { n }):fill(2)
    end
    local s = Scale(3)
    assert.is_true(nn.Module.is(s, nn.Module))
    assert.equal("Scale", tostring(s))
    assert.equal("weight", s:parameters()[1].name)
    assert.error_matches(function() s:forward(1) end, "Scale has no updateOutput")
    assert.error_matches(function() s:register_parameter("a.b", { 1 }) end, "without dots")
  end)
end)
