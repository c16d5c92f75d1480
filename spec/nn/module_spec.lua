-- uvmrec.nn.Module (lua/uvmrec/nn/Module.lua), the protocol every module follows, on the CPU:
-- parameter names, zero_grad, to(placement), bf16 precision with f32 masters, no allocation in
-- a training step once the batch size was seen, subclassing.  Each module's own forward and
-- gradients: spec/nn/<module>_spec.lua.
local ur = require "uvmrec"
local h = require "helpers"
local R = require "dense_ref"
local nn = ur.nn

-- f() fails with msg at a line of this file (the caller's line of the module's method).
local fails = h.raises_at_caller

describe("uvmrec.nn.Module", function()
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

  it("take seeds that are whole numbers, each drawing its own parameters", function()
    -- 1.5 drew seed 1's weights (the cast truncated it)
    assert.has_error(function() nn.Linear(3, 4, { seed = 1.5 }) end,
      "Linear: seed is 1.5; expected a whole number from 0 to 4503599627370496")
    assert.has_error(function() nn.CrossNet(3, 1, { seed = -1 }) end,
      "CrossNet: seed is -1; expected a whole number from 0 to 4503599627370496")
    assert.has_error(function() nn.Module.manual_seed(0.5) end,
      "manual_seed: seed is 0.5; expected a whole number from 0 to 4503599627370495")
    -- seeds are made modulo 2^52: 0 and 2^60 built the same model, so seeds past it are refused
    assert.has_error(function() nn.Module.manual_seed(2 ^ 60) end,
      "manual_seed: seed is 1.1529215046068e+18; expected a whole number from 0 to 4503599627370495")
    -- the config's train.seed, which models/dlrm.lua hands to manual_seed, takes the same range
    assert.equal(nn.Module.MAX_SEED - 1, require("uvmrec.train.config").schema.fields.train.fields.seed.max)
    -- seeds past 2^53 / 1000003 made module seeds past 2^64, which all reached the engine as one
    local function weights(s)
      nn.Module.manual_seed(s)
      return nn.Linear(3, 4).weight:totable()
    end
    assert.are_not.same(weights(2 ^ 52 - 1), weights(2 ^ 52 - 1 - 2 ^ 40))
    assert.are_not.same(weights(0), weights(2 ^ 52 - 1))
    assert.same(weights(2 ^ 52 - 1), weights(2 ^ 52 - 1))
    nn.Module.manual_seed(3)
    assert.equal(3 * 1000003 + 7919, nn.Module.next_seed()) -- small seeds as they were
  end)

  it("name the module and the parameter or buffer whose memory cannot be had", function()
    local m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.CrossNet(4, 1))
    if not ur.gpu() then -- with a GPU, module_cuda_spec provokes the HBM budget instead
      local ok, err = m:to("device")
      assert.is_nil(ok)
      -- it was the tensor's alone: "tensor: placement 'device' needs a GPU, ..."
      assert.matches("^Linear%(3 %-> 4, %+relu%): parameter 1%.weight to device: tensor: placement 'device' "
                     .. "needs a GPU", err)
      assert.equal("host", m.placement)
    end
    -- an output of 2^48 bytes, which no host allocates: "tensor: host allocation of ... failed" alone
    local l = nn.Linear(1, 2 ^ 22)
    local ok, err = pcall(function() l:forward(ur.tensor({ 2 ^ 24, 1 })) end)
    assert.is_false(ok)
    assert.matches("Linear%(1 %-> 4194304%): buffer output %[16777216, 4194304%] of f32", err)
  end)

  it("refuse a parameter or buffer that the host memory left cannot hold, before allocating it", function()
    local host_memory = require "uvmrec.host_memory"
    local available = host_memory.available
    local l = nn.Linear(1, 4096)
    -- 100 MiB left: Linear(4096, 4096)'s weight and gradient are 128 MiB, which malloc promised
    -- and the fills took (on a real host, Linear(65536, 65536) of 24 GiB: killed by the OOM killer)
    host_memory.available = function() return 100 * 2 ^ 20, "a stub" end
    local ok, err = pcall(function() return nn.Linear(4096, 4096) end)
    local bok, berr = pcall(function() l:forward(ur.tensor({ 8192, 1 }):fill(1)) end)
    host_memory.available = available
    assert.is_false(ok)
    assert.equal("Linear: parameter weight [4096, 4096] and its gradient (f32) need 134217728 bytes (128.0 MiB) "
                 .. "but the host has 100.0 MiB available (a stub)", tostring(err):gsub("^[^\n]-:%d+: ", ""))
    assert.is_false(bok)
    assert.equal("Linear(1 -> 4096): buffer output [8192, 4096] of f32 needs 134217728 bytes (128.0 MiB) but the host "
                 .. "has 100.0 MiB available (a stub)", tostring(berr):gsub("^[^\n]-:%d+: ", ""))
    -- on the host itself: a weight of more than its memory and swap, refused before malloc is asked
    local info = require("uvmrec.lib").read_file("/proc/meminfo")
    if not (info and host_memory.available()) then return end
    local total = (tonumber(info:match("MemTotal:%s*(%d+)")) + tonumber(info:match("SwapTotal:%s*(%d+)") or 0)) * 1024
    local inf = math.ceil(total / 4 / 2 ^ 20) + 1
    ok, err = pcall(function() return nn.Linear(inf, 2 ^ 20) end)
    assert.is_false(ok)
    assert.matches(("^Linear: parameter weight %%[1048576, %d%%] and its gradient %%(f32%%) need %%d+ bytes %%(.-%%) "
                    .. "but the host has .- available %%("):format(inf), tostring(err):gsub("^[^\n]-:%d+: ", ""))
  end)

  it("refuse a precision other than f32, tf32 or bf16 where set_precision was called, as the tables do", function()
    local ebc = nn.EmbeddingBagCollection { tables = { { name = "t", rows = 4, dim = 4 } }, device = "cpu" }
    for _, m in ipairs { nn.MLP({ 3, 2 }), ebc } do
      local ok, err = pcall(function() m:set_precision("f16") end)
      assert.is_false(ok)
      assert.matches("module_spec%.lua:%d+: set_precision: 'f16' is not f32, tf32 or bf16$", err)
      assert.are_not.equal("f16", m.precision) -- nothing changed
    end
    assert(ebc:set_precision("bf16"))
    assert.equal("bf16", ebc:forward(ur.KJT { keys = { "t" }, values = { 1, 2 }, lengths = { 1, 1 } }):dtype())
    ebc.tbe:free()
    -- the collection's refusal names the module, at this line ('embedding collection: used
    -- after free()' alone, at no line, through a bare assert)
    local ok, err = pcall(function() ebc:set_precision("f32") end)
    assert.is_false(ok)
    assert.matches("^[^\n]*module_spec%.lua:%d+: EmbeddingBagCollection%(1 table, 1 feature %-> 4, sgd%): "
                   .. "embedding collection: used after free%(%)$", err)
    assert.equal("bf16", ebc.precision)
  end)

  it("set an embedding collection's output in a model to the model's precision, as its own does", function()
    -- a model's set_precision marked the collection bf16 and left its output f32
    local ebc = nn.EmbeddingBagCollection { tables = { { name = "t", rows = 4, dim = 4 } }, device = "cpu" }
    local m = nn.Sequential(ebc, nn.ReLU())
    local kjt = ur.KJT { keys = { "t" }, values = { 1, 2 }, lengths = { 1, 1 } }
    for _, p in ipairs { "bf16", "tf32", "bf16", "f32" } do
      assert(m:set_precision(p))
      assert.equal(p, ebc.precision)
      assert.equal(p == "bf16" and "bf16" or "f32", m:forward(kjt):dtype())
      assert.equal(p == "bf16" and "bf16" or "f32", ebc.output:dtype())
    end
    ebc.tbe:free()
    -- a refusal at any depth names the collection at this line; the model stays as it was
    local outer = nn.Sequential(nn.Sequential(m))
    for _, model in ipairs { m, outer } do
      local ok, err = pcall(function() model:set_precision("bf16") end)
      assert.is_false(ok)
      assert.matches("^[^\n]*module_spec%.lua:%d+: EmbeddingBagCollection%(1 table, 1 feature %-> 4, sgd%): "
                     .. "embedding collection: used after free%(%)$", err)
      assert.equal("f32", ebc.precision)
    end
  end)

  it("set a quantized collection's output to the precision, alone and in a model", function()
    -- the quantized collection's output dtype was fixed when it was made: bf16 marked, f32 given
    local ebc = nn.EmbeddingBagCollection { tables = { { name = "t", rows = 4, dim = 4 } }, device = "cpu", seed = 2 }
    local q = nn.QuantEmbeddingBagCollection.quantize(ebc, { format = "f32" })
    local kjt = ur.KJT { keys = { "t" }, values = { 1, 2, 3 }, lengths = { 1, 2 } }
    for _, model in ipairs { q, nn.Sequential(q, nn.ReLU()) } do
      for _, p in ipairs { "bf16", "f32", "bf16" } do
        assert(ebc:set_precision(p))
        assert(model:set_precision(p))
        assert.equal(p, q.precision)
        assert.equal(p, q:forward(kjt):dtype(), p)
        assert.same(ebc:forward(kjt):totable(), q:forward(kjt):totable(), p)
      end
    end
    assert.has_error(function() q:set_precision("f16") end)
  end)

  it("refuse an option they do not take, or of the wrong type, where the module was built", function()
    assert.has_error(function() nn.Linear(3, 4, { acts = "relu" }) end,
      "Linear: unknown option 'acts'; expected act, bias, input_grad, pad_to, seed")
    assert.has_error(function() nn.MLP({ 3, 4 }, { lst = "none" }) end,
      "MLP: unknown option 'lst'; expected input_grad, last, pad_to")
    assert.has_error(function() nn.CrossNet(4, 1, { rnk = 2 }) end,
      "CrossNet: unknown option 'rnk'; expected rank, seed")
    assert.has_error(function() nn.Interaction { self = true } end,
      "Interaction: unknown option 'self'; expected pad, self_interaction")
    assert.has_error(function() nn.Interaction { self_interaction = "no" } end,
      "Interaction: self_interaction is no; expected a boolean")
    assert.has_error(function() nn.Interaction(true) end,
      "Interaction: options must be a table (of pad, self_interaction), got true")
    assert.has_error(function() nn.BCEWithLogits { reduce = "sum" } end,
      "BCEWithLogits: unknown option 'reduce'; expected reduction")
  end)

  it("name themselves and the argument, at the caller's line, for an input that is no tensor or of a dtype they "
     .. "do not take", function()
    local l = nn.Linear(4, 3)
    -- each failed inside the engine or Lua: 'tensor: expected a handle, got a nil', 'dense cast: src is i32 [2, 4];
    -- expected f32 or bf16 of 8 elements', 'linear forward: x is f32 [2, 2, 2]; expected f32 or bf16 [rows, cols]'
    fails(function() l:forward(nil) end, "Linear(4 -> 3): input is nil; expected a tensor")
    fails(function() l:forward({}) end, "Linear(4 -> 3): input is a table; expected a tensor")
    fails(function() l:forward(ur.tensor({ 2, 4 }, { dtype = "i32" })) end,
      "Linear(4 -> 3): input is i32 [2, 4]; expected f32 or bf16")
    fails(function() l:forward(ur.tensor({ 2, 2, 2 })) end, "Linear(4 -> 3): input is [2, 2, 2]; expected [rows, 4]")
    l:forward(ur.tensor({ 2, 4 }):fill(1))
    fails(function() l:backward(ur.tensor({ 2, 4 }), ur.tensor({ 2, 3 }, { dtype = "f64" })) end,
      "Linear(4 -> 3): gradOutput is f64 [2, 3]; expected f32 or bf16")
    fails(function() l:backward(ur.tensor({ 2, 4 }), nil) end, "Linear(4 -> 3): gradOutput is nil; expected a tensor")
    local c = nn.CrossNet(4, 1)
    fails(function() c:forward(5) end, "CrossNet(4, 1 layers): input is 5; expected a tensor")
    fails(function() c:forward(ur.tensor({ 2, 4 }, { dtype = "i64" })) end,
      "CrossNet(4, 1 layers): input is i64 [2, 4]; expected f32 or bf16")
    -- 'ur_act_backward: argument 'y' is NULL'; a nil input indexed nil in Module:follow
    fails(function() nn.ReLU():backward(ur.tensor({ 2, 4 }), ur.tensor({ 2, 4 })) end, "ReLU: backward before forward")
    fails(function() nn.Sigmoid():forward(nil) end, "Sigmoid: input is nil; expected a tensor")
    -- 'ur_bce_forward: argument 'targets' is NULL'
    fails(function() nn.BCEWithLogits():forward(ur.tensor({ 2, 1 }), nil) end,
      "BCEWithLogits(mean): target is nil; expected a tensor")
    fails(function() nn.BCEWithLogits():forward(ur.tensor({ 2, 1 }), ur.tensor({ 2 }), {}) end,
      "BCEWithLogits(mean): weights is a table; expected a tensor")
    fails(function() nn.Interaction():forward({ ur.tensor({ 2, 4 }), 3 }) end,
      "Interaction: input must be {dense [rows, d], emb [rows, T*d]}, two tensors")
  end)

  it("name themselves, at the caller's line, for shapes and dtypes the engine's ops refuse", function()
    local function T(shape, dtype) return ur.tensor(shape, { dtype = dtype }):fill(1) end
    -- each was the op's message alone, raised at a line of Interaction.lua or BCEWithLogits.lua
    local i = nn.Interaction { pad = true }
    fails(function() i:forward({ T { 3, 4 }, T { 3, 10 } }) end, "Interaction(padded to 8): interaction forward: "
          .. "emb has 10 columns; expected T * 4 (T tables of dense's width 4, 1 <= T < 65536)")
    fails(function() i:forward({ T({ 3, 4 }, "i32"), T { 3, 12 } }) end,
      "Interaction(padded to 8): interaction forward: dense is i32 [3, 4]; expected f32 or bf16 [rows, cols]")
    local x = { T { 3, 4 }, T { 3, 12 } }
    i:forward(x)
    fails(function() i:backward(x, T { 3, 5 }) end, "Interaction(padded to 8): interaction backward: gout is f32 "
          .. "[3, 5]; expected f32 or bf16 [3, 10] (or 16 columns: padded to a multiple of 8)")
    -- 'ur_interaction_backward: argument 'gout' is NULL'
    fails(function() i:backward(x, nil) end, "Interaction(padded to 8): gradOutput is nil; expected a tensor")
    local b = nn.BCEWithLogits { reduction = "sum" }
    fails(function() b:forward(T { 3 }, T { 2 }) end,
      "BCEWithLogits(sum): bce forward: targets is f32 [2]; expected f32 of 3 elements")
    fails(function() b:forward(T { 3, 2 }, T { 3 }) end,
      "BCEWithLogits(sum): bce forward: logits has 2 dimensions of which the second is 2; expected [rows] or [rows, 1]")
    fails(function() b:backward(T { 3 }, T { 3 }, T { 4 }) end,
      "BCEWithLogits(sum): bce backward: weights is f32 [4]; expected f32 of 3 elements")
    -- a gradient of another shape: 'linear backward: gy is f32 [2, 3]; ...' at Linear.lua, 'activation
    -- backward: ...' at Activation.lua, 'cross backward: ...' at CrossNet.lua
    local l = nn.Linear(4, 3)
    l:forward(T { 3, 4 })
    for _, f in ipairs { "backward", "updateGradInput", "accGradParameters" } do
      fails(function() l[f](l, T { 3, 4 }, T { 2, 3 }) end,
        "Linear(4 -> 3): linear backward: gy is f32 [2, 3]; expected f32 or bf16 [3, 3]")
    end
    -- an embedding collection's call (nil, err or raised): the collection's message alone, raised
    -- at a line of EmbeddingBagCollection.lua or QuantEmbeddingBagCollection.lua
    local e = nn.EmbeddingBagCollection { tables = { { name = "t", rows = 10, dim = 4, features = { "a" } } },
                                          optimizer = { "sgd", lr = 0.1 }, device = "cpu" }
    local kjt = ur.KJT { keys = { "a" }, values = { 1, 2 }, lengths = { 1, 1 } }
    e:forward(kjt)
    local E = "EmbeddingBagCollection(1 table, 1 feature -> 4, sgd): "
    for _, f in ipairs { "backward", "accGradParameters", "sparse_grad" } do
      fails(function() e[f](e, kjt, T { 2, 7 }) end, E .. "tbe: grad_out has shape [2, 7]; expected [2, 4]")
    end
    fails(function() e:forward(ur.KJT { keys = { "a" }, values = { 11, 2 }, lengths = { 1, 1 } }) end,
      E .. "tbe: table 't' (feature 'a', sample 0, value 0) has no row 11; ids run 0..9")
    fails(function() e:forward(ur.KJT { keys = { "b" }, values = { 1, 2 }, lengths = { 1, 1 } }) end,
      E .. "embedding collection: the input's keys {b} are not the collection's features {a}")
    local q = nn.QuantEmbeddingBagCollection.quantize(e, { format = "int8" })
    fails(function() q:forward(ur.KJT { keys = { "a" }, values = { 11, 2 }, lengths = { 1, 1 } }) end,
      "QuantEmbeddingBagCollection(1 table, 1 feature -> 4, int8): qtbe: table 't' (feature 'a', sample 0, "
      .. "value 0) has no row 11; ids run 0..9")
    local r = nn.ReLU()
    fails(function() r:forward(T({ 3, 4 }, "i32")) end,
      "ReLU: activation forward: x is i32 [3, 4]; expected f32 or bf16 of 12 elements")
    r:forward(T { 3, 4 })
    fails(function() r:backward(T { 3, 4 }, T { 3, 5 }) end,
      "ReLU: activation backward: gy is f32 [3, 5]; expected f32 or bf16 of 12 elements")
    local c = nn.CrossNet(4, 2)
    c:forward(T { 3, 4 })
    -- accGradParameters too (it raised at a line of CrossNet.lua)
    for _, f in ipairs { "backward", "updateGradInput", "accGradParameters" } do
      fails(function() c[f](c, T { 3, 4 }, T { 2, 4 }) end,
        "CrossNet(4, 2 layers): cross backward: gy is f32 [2, 4]; expected f32 or bf16 [3, 4]")
    end
    -- in a container, behind the child's index and type
    fails(function() nn.Sequential(nn.Interaction()):forward({ T { 2, 4 }, T { 3, 8 } }) end,
      "Sequential: (1) Interaction: Interaction: interaction forward: emb is f32 [3, 8]; expected f32 or bf16 "
      .. "[2, cols]")
    -- accGradParameters too (the child's message alone, at a line of Sequential.lua)
    local seq = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    seq:forward(T { 5, 4 })
    seq:updateGradInput(T { 5, 4 }, T { 5, 2 })
    fails(function() seq:accGradParameters(T { 5, 4 }, T { 4, 2 }) end,
      "Sequential: (2) Linear: Linear(3 -> 2): linear backward: gy is f32 [4, 2]; expected f32 or bf16 [5, 2]")
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

  it("take an f32 gradient into a bf16 module as its bf16 copy, as they take an f32 input", function()
    for _, m in ipairs { nn.MLP({ 6, 8, 4 }), nn.CrossNet(4, 2, { rank = 2 }) } do
      assert(m:set_precision("bf16"))
      local x = R.rand({ 5, m.d or 6 }, 41)
      local w = m:forward(x):size(2)
      local g32 = R.rand({ 5, w }, 42)
      local g16 = R.zeros({ 5, w }, { dtype = "bf16" })
      ur.dense.cast(g32, g16)
      local grads = {}
      for i, g in ipairs { g16, g32 } do
        m:zero_grad()
        m:forward(x)
        grads[i] = { m:backward(x, g):totable() }
        for _, p in ipairs(m:parameters()) do grads[i][#grads[i] + 1] = p.grad:totable() end
      end
      assert.same(grads[1], grads[2])
    end
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
    -- the garbage of earlier specs (tensors, collections) goes now, not while this one counts
    collectgarbage()
    collectgarbage()
    local s0, mem0 = m:arena():stats(), ur.memory()
    for _ = 1, 3 do
      step(x, t)
      step(x2, t:view(0, 16))
    end
    assert.same(s0, m:arena():stats())
    assert.same(mem0, ur.memory())
  end)

  it("keep one view of a buffer, whatever batch sizes come", function()
    -- a view was kept per batch size below the largest: 250 sizes, 250 handles on the buffer's
    -- block (an unpooled collection's values count differs nearly every batch)
    local l = nn.Linear(3, 2)
    local x = R.rand({ 400, 3 }, 43)
    local function handles()
      collectgarbage()
      collectgarbage()
      return l.output:refs()
    end
    local function forward(rows)
      local xv = x:view(0, rows)
      local y = l:forward(xv)
      assert.same({ rows, 2 }, y:size())
      xv:free()
      return y
    end
    forward(400)
    for rows = 399, 350, -1 do forward(rows) end
    local kept = handles()
    for rows = 349, 100, -1 do forward(rows) end
    assert.equal(kept, handles())
    -- a size seen before gives its rows again; a view given out earlier still reads its rows
    local y7 = forward(7)
    local first = y7:totable()
    local y9 = forward(9)
    assert.same(first, y7:totable())
    assert.same({ unpack(y9:totable(), 1, 14) }, first)
    assert.same(first, forward(7):totable())
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
    assert.error_matches(function() s:backward(1, 1) end, "Scale has no updateGradInput")
    -- a module over ids takes no_grad_input: backward leaves no gradInput
    Scale.updateGradInput = nn.Module.no_grad_input
    s.gradInput = 1
    assert.is_nil(s:backward(1, 1))
    assert.is_nil(s.gradInput)
  end)
end)
