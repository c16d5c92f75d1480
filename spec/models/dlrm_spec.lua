-- models/dlrm.lua on the CPU: the logits and the loss against a float64 reference of DLRM
-- written here (bottom MLP, pooled embeddings, dot or DCNv2 interaction, top MLP, BCE), and
-- every gradient (dense parameters, and the embedding rows through the fused SGD step) against
-- central finite differences of that reference; on random weights, ids and bag sizes.
local ur = require "uvmrec"
local train = require "uvmrec.train"
local h = require "helpers"

local function model_of(yaml)
  local cfg = assert(train.config.parse(yaml, "t.yaml"))
  local def = assert(train.model_def(cfg))
  return assert(def.build(cfg, { cpu = true })), cfg
end

-- A batch of B samples: dense [B, D], a KJT of T keys with 0..3 ids a bag, 0/1 labels.
local function batch_of(B, D, rows, seed)
  math.randomseed(seed)
  local lengths, values = {}, {}
  for f = 1, #rows do
    for _ = 1, B do
      local n = math.random(0, 3)
      lengths[#lengths + 1] = n
      for _ = 1, n do values[#values + 1] = math.random(0, rows[f] - 1) end
    end
  end
  local keys = {}
  for f = 1, #rows do keys[f] = "C" .. f end
  local dense = ur.tensor({ B, D }):uniform(-1, 1, seed)
  local labels = ur.tensor({ B }):uniform(0, 1, seed + 1)
  local lv = labels:totable()
  for i = 1, B do labels:set(i - 1, lv[i] < 0.4 and 1 or 0) end
  return { dense = dense, labels = labels, size = B,
           sparse = ur.KJT { keys = keys, values = values, lengths = lengths } }, lengths, values
end

local function linear(x, w, b, rows, n, out, relu)
  local y = {}
  for r = 0, rows - 1 do
    for o = 0, out - 1 do
      local s = b[o + 1]
      for k = 0, n - 1 do s = s + x[r * n + k + 1] * w[o * n + k + 1] end
      y[r * out + o + 1] = (relu and s < 0) and 0 or s
    end
  end
  return y
end

-- Every parameter of the model as float64 lists, by role.
local function params_of(model)
  local P = { bottom = {}, top = {}, tables = {}, cross = {} }
  for _, part in ipairs { "bottom", "top" } do
    for _, l in ipairs(model[part].modules) do
      if l.weight then
        -- n: the row length of the weight (a padded input's width; the padding is zero)
        P[part][#P[part] + 1] = { w = l.weight:totable(), b = l.bias:totable(), n = l.in_width,
                                  out = l.out_features, t = l }
      end
    end
  end
  for f = 1, model.num_tables do
    local t = model.embeddings:table("C" .. f)
    P.tables[f] = t:totable()
    t:free()
  end
  local c = model.interaction
  if c.layers then
    for l = 1, c.layers do
      P.cross[l] = { w = c["weight_" .. l] and c["weight_" .. l]:totable(), V = c["V_" .. l] and c["V_" .. l]:totable(),
                     U = c["U_" .. l] and c["U_" .. l]:totable(), b = c["bias_" .. l]:totable() }
    end
  end
  return P
end

-- The reference: logits and the mean BCE loss of a batch.
local function reference(model, P, B, dense, lengths, values, labels)
  local x = dense
  for _, l in ipairs(P.bottom) do x = linear(x, l.w, l.b, B, l.n, l.out, true) end
  local d, T, dim = P.bottom[#P.bottom].out, model.num_tables, model.dim
  local e, pos, bag = {}, 0, 0
  for i = 1, B * T * dim do e[i] = 0 end
  for f = 1, T do
    for b = 1, B do
      bag = bag + 1
      for _ = 1, lengths[bag] do
        pos = pos + 1
        local id = values[pos]
        for k = 1, dim do
          local at = (b - 1) * T * dim + (f - 1) * dim + k
          e[at] = e[at] + P.tables[f][id * dim + k]
        end
      end
    end
  end
  -- z as the top MLP reads it: rows of its first layer's input width, zero past the interaction
  local z, width = {}, P.top[1].n
  for i = 1, B * width do z[i] = 0 end
  for b = 0, B - 1 do
    local vec = function(i, k) -- vector i (0: the bottom output), element k
      if i == 0 then return x[b * d + k] end
      return e[b * T * dim + (i - 1) * dim + k]
    end
    for k = 1, d do z[b * width + k] = x[b * d + k] end
    local at = d
    if model.interaction_kind == "dot" then
      for i = 1, T do
        for j = 0, i - 1 do
          local s = 0
          for k = 1, dim do s = s + vec(i, k) * vec(j, k) end
          at = at + 1
          z[b * width + at] = s
        end
      end
    else
      for k = 1, T * dim do z[b * width + d + k] = e[b * T * dim + k] end
    end
  end
  if model.interaction_kind == "dcnv2" then
    assert(width == model.interaction_width)
    local x0, xl = z, z
    for _, c in ipairs(P.cross) do
      local zz
      if c.w then
        zz = linear(xl, c.w, c.b, B, width, width)
      else
        local r = #c.V / width
        local zero = {}
        for i = 1, r do zero[i] = 0 end
        zz = linear(linear(xl, c.V, zero, B, width, r), c.U, c.b, B, r, width)
      end
      local y = {}
      for i = 1, #x0 do y[i] = x0[i] * zz[i] + xl[i] end
      xl = y
    end
    z = xl
  end
  for i, l in ipairs(P.top) do z = linear(z, l.w, l.b, B, l.n, l.out, i < #P.top) end
  local loss = 0
  for b = 1, B do
    local v, y = z[b], labels[b]
    loss = loss + math.max(v, 0) - v * y + math.log(1 + math.exp(-math.abs(v)))
  end
  return z, loss / B
end

-- Relative to |b|, but for values near 0 (gradients): to 1e-3.
local function close(a, b, tol, what) h.near(a, b, tol, what, 1e-3) end

-- The derivative of the reference loss (loss()'s second value) by element i of list `vals`.
local function fd(loss, vals, i)
  return h.central_difference(function() return select(2, loss()) end, vals, i, 1e-5)
end

local function check_model(yaml, seed)
  local model, cfg = model_of(yaml)
  local rows = cfg.embeddings.rows
  local B, D = 5, cfg.model.dense_features
  local batch, lengths, values = batch_of(B, D, rows, seed)
  local P = params_of(model)
  local dense, labels = batch.dense:totable(), batch.labels:totable()
  local function loss() return reference(model, P, B, dense, lengths, values, labels) end
  local ref_logits, ref_loss = loss()

  local logits = model:forward(batch)
  local got = logits:totable()
  for b = 1, B do close(got[b], ref_logits[b], 1e-4, "logit " .. b) end
  local l = model.criterion:forward(logits, batch.labels):get(0)
  close(l, ref_loss, 1e-5, "loss")

  -- backward: dense gradients land in .grad; the tables take an SGD step of lr 1 (row -= grad)
  model:backward(batch, model.criterion:backward(logits, batch.labels))
  for _, part in ipairs { "bottom", "top" } do
    for li, layer in ipairs(P[part]) do
      local gw, gb = layer.t.grad_weight:totable(), layer.t.grad_bias:totable()
      for i = 1, #layer.w, math.max(1, math.floor(#layer.w / 12)) do
        close(gw[i], fd(loss, layer.w, i), 2e-3, ("%s layer %d weight %d"):format(part, li, i))
      end
      for i = 1, #layer.b do close(gb[i], fd(loss, layer.b, i), 2e-3, ("%s layer %d bias %d"):format(part, li, i)) end
    end
  end
  local c = model.interaction
  for li, layer in ipairs(P.cross) do
    for _, k in ipairs { "w", "V", "U", "b" } do
      local gname = ({ w = "grad_weight_", V = "grad_V_", U = "grad_U_", b = "grad_bias_" })[k] .. li
      local g = layer[k] and c[gname]:totable()
      for i = 1, g and #layer[k] or 0, math.max(1, math.floor((g and #layer[k] or 1) / 10)) do
        close(g[i], fd(loss, layer[k], i), 2e-3, ("cross layer %d %s %d"):format(li, k, i))
      end
    end
  end
  for f = 1, #rows do
    local t = model.embeddings:table("C" .. f)
    local after = t:totable()
    t:free()
    for i = 1, #after do
      close(P.tables[f][i] - after[i], fd(loss, P.tables[f], i), 2e-3, ("table C%d element %d"):format(f, i))
    end
  end
end

describe("models/dlrm.lua", function()
  it("computes DLRM's logits and loss, and every gradient, with the dot interaction", function()
    check_model([[
model: {dense_features: 3, bottom_mlp: [5, 4], top_mlp: [6, 1]}
embeddings: {dim: 4, rows: [7, 11, 5], optimizer: {name: sgd, lr: 1}}
optimizer: {name: sgd, lr: 0.1}
train: {seed: 3}
]], 11)
  end)

  it("pads the dot interaction to 8 columns, read by zero weights that stay zero", function()
    local yaml = [[
model: {dense_features: 3, bottom_mlp: [5, 4], top_mlp: [6, 1]}
embeddings: {dim: 4, rows: [7, 11, 5]}
optimizer: {name: adam, lr: 0.1, weight_decay: 0.01}
train: {seed: 3}
]]
    local model, cfg = model_of(yaml)
    local first = model.top.modules[1]
    assert.same({ 10, 16 }, { model.interaction_width, first.in_width })
    -- drawn as the unpadded layer's: the same numbers in the first 10 columns of each row
    local unpadded = ur.nn.Linear(10, 6, { seed = 1 })
    local padded = ur.nn.Linear(10, 6, { seed = 1, pad_to = 8 })
    local u, p = unpadded.weight:totable(), padded.weight:totable()
    for o = 0, 5 do
      for k = 1, 16 do assert.equal(k <= 10 and u[o * 10 + k] or 0, p[o * 16 + k]) end
    end
    local opt = train.optimizer(cfg, model)
    local batch = batch_of(7, 3, { 7, 11, 5 }, 5)
    for _ = 1, 3 do
      local logits = model:forward(batch)
      assert.same({ 7, 16 }, model.interaction.output:size())
      model:backward(batch, model.criterion:backward(logits, batch.labels))
      opt:step()
    end
    local z, w = model.interaction.output:totable(), first.weight:totable()
    for r = 0, 6 do
      for k = 11, 16 do assert.equal(0, z[r * 16 + k]) end
    end
    for o = 0, 5 do
      for k = 11, 16 do assert.equal(0, w[o * 16 + k]) end
    end
  end)

  it("computes them with DCNv2 cross layers, full and low rank", function()
    for _, rank in ipairs { 0, 3 } do
      check_model(([[
model: {dense_features: 2, bottom_mlp: [3], top_mlp: [4, 1], interaction: dcnv2, cross_layers: 2, cross_rank: %d}
embeddings: {dim: 4, rows: [6, 4], optimizer: {name: sgd, lr: 1}}
optimizer: {name: adam, lr: 0.1}
train: {seed: 5}
]]):format(rank), 21 + rank)
    end
  end)

  it("names its parameters by part and leaves the fused tables without gradients", function()
    local model = model_of([[
model: {dense_features: 2, bottom_mlp: [4], top_mlp: [4, 1]}
embeddings: {dim: 4, rows: [6, 4]}
optimizer: {name: sgd, lr: 0.1}
]])
    local names = {}
    for _, p in ipairs(model:parameters()) do names[#names + 1] = p.name .. (p.fused and "*" or "") end
    assert.same({ "bottom.1.weight", "bottom.1.bias", "embeddings.C1*", "embeddings.C2*", "top.1.weight",
                  "top.1.bias", "top.3.weight", "top.3.bias" }, names)
    assert.matches("^DLRM: 2 dense %-> bottom 4; 2 tables of dim 4 %(10 rows, 160 B%); dot interaction %(7%) "
                   .. "%-> top 4%-1", tostring(model))
  end)

  it("passes embeddings.optimizer.deterministic to the tables (true unless set false)", function()
    for _, det in ipairs { "", ", deterministic: false", ", deterministic: true" } do
      local model = model_of(([[
model: {dense_features: 2, bottom_mlp: [4], top_mlp: [4, 1]}
embeddings: {dim: 4, rows: [6, 4], optimizer: {name: sgd%s}}
optimizer: {name: sgd, lr: 0.1}
]]):format(det))
      assert.equal(det ~= ", deterministic: false", model.embeddings.tbe.deterministic)
      model.embeddings.tbe:free()
    end
  end)

  it("gives probabilities in [0, 1] and runs in bf16", function()
    local model = model_of([[
model: {dense_features: 3, bottom_mlp: [8, 4], top_mlp: [6, 1], precision: bf16}
embeddings: {dim: 4, rows: [7, 11, 5]}
optimizer: {name: adagrad, lr: 0.1}
]])
    local batch = batch_of(9, 3, { 7, 11, 5 }, 31)
    assert.equal("bf16", ur.nn.Module.dtype_of(model:forward(batch)))
    local p = model:predict(batch)
    assert.same({ 9, 1 }, p:size())
    assert.equal("f32", p:dtype())
    for _, v in ipairs(p:totable()) do assert.is_true(v > 0 and v < 1) end
  end)

  -- predict turns the collisions' counting off for its forward; a forward that raised left it
  -- off, and training after it counted nothing (no rounds, the maps frozen) without a word.
  it("leaves managed collisions counting after a predict that fails", function()
    local model = model_of([[
model: {dense_features: 3, bottom_mlp: [4], top_mlp: [4, 1]}
embeddings: {dim: 4, rows: [7, 11], collisions: {policy: lfu}}
optimizer: {name: sgd, lr: 0.1}
]])
    assert.is_true(model.collisions.train)
    local batch = batch_of(5, 3, { 7, 11 }, 3)
    batch.dense = ur.tensor({ 5, 2 }):fill(0.5) -- two dense columns of three
    assert.has_error(function() model:predict(batch) end)
    assert.is_true(model.collisions.train)
  end)
end)
