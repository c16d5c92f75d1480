-- uvmrec.train.graph (lua/uvmrec/train/graph.lua) and the graph calls under it (uvmrec.h,
-- ur_graph_*): eager on the CPU; on a GPU (#cuda) a replayed training step gives the eager
-- step's bits, a changed learning rate is captured again, and steps a replay cannot repeat are
-- refused with the reason.
local ur = require "uvmrec"
local h = require "helpers"
local train = require "uvmrec.train"
local graph = require "uvmrec.train.graph"
local guard = require "uvmrec.train.guard"

local cuda_it = h.cuda_it

-- dlrm_tiny on the device (or the CPU), with extra --set values; the model and its optimizer.
local function tiny(sets, cpu)
  local cfg = h.tiny({ "embeddings.bounds=warn" }, sets)
  local model = assert(assert(train.model_def(cfg)).build(cfg, { cpu = cpu }))
  return model, train.optimizer(cfg, model)
end

-- n batches of 512 samples of the tiny synthetic data, on the device.
local function batches(n)
  return train.source.hold(ur.data.loader { data = "synthetic:tiny", samples = n * 512, batch_size = 512 }, n,
                           "device")
end

-- Every dense parameter and table of a model, as lists.
local function state(model)
  local s = {}
  for _, p in ipairs(model:parameters()) do s[p.name] = p.tensor:totable() end
  return s
end

describe("uvmrec.train.graph", function()
  h.no_gpu_it("captures nothing without a GPU: the calls run as they are made", function()
    local s = assert(ur.stream())
    local t = ur.tensor({ 4 }):fill(1)
    assert(ur.graph_begin(s))
    t:fill(3, s)
    assert.is_nil(ur.graph_end(s))
    assert.same({ 3, 3, 3, 3 }, t:totable())
    assert.matches("graph: launch needs a graph captured on a GPU", require("ffi").string((function()
      ur.C.ur_graph_launch(nil, s.p)
      return ur.C.ur_last_error()
    end)()))
    local model, opt = tiny({}, true)
    local ok, why = graph.usable(model, opt)
    assert.same({ false, "the model is not on a GPU" }, { ok, why })
    assert.same({ nil, "the model is not on a GPU" }, { graph.new(model, opt) })
    model.embeddings.tbe:free()
  end)

  cuda_it("refuses a model with managed collisions", function()
    local model, opt = tiny { "embeddings.max_rows=60", "embeddings.collisions.policy=lfu" }
    assert.same({ false, "managed collisions decide eviction rounds and reset rows on the host between steps" },
                { graph.usable(model, opt) })
    model.embeddings.tbe:free()
  end)

  cuda_it("replays a captured fill on its stream", function()
    local s = assert(ur.stream())
    local t = assert(ur.tensor({ 1000 }, { placement = "device" })):fill(0)
    assert(ur.graph_begin(s))
    t:fill(3, s)
    local g = assert(ur.graph_end(s))
    assert(s:sync())
    assert.equal(3, t:totable()[1000])
    t:fill(0, s)
    assert(g:launch(s))
    assert(s:sync())
    assert.equal(3, t:totable()[1000])
    assert.has_error(function() assert(ur.graph_begin(nil)) end)
    g:free()
  end)

  cuda_it("refuses to check a KJT not known checked inside a capture, before any CUDA call, the capture whole",
    function()
    local tbe = require "uvmrec.tbe"
    local c = assert(tbe.new { tables = { { name = "t", rows = 64, dim = 4, features = { "a", "b" },
                                            placement = "device" } } })
    -- offsets past the values, made unchecked: its check on the GPU waits for the device
    local k = assert(ur.KJT({ keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1 },
                              check = false }):to("device"))
    assert.is_false(k:checked())
    local s = assert(ur.stream())
    local t = assert(ur.tensor({ 1000 }, { placement = "device" })):fill(0)
    assert(ur.graph_begin(s))
    t:fill(3, s)
    local ok, err = pcall(c.forward, c, k)
    local g = assert(ur.graph_end(s))
    assert.is_false(ok)
    assert.matches("embedding collection: kjt: not known checked, and on the GPU its check waits for the device, "
                   .. "which a graph capture cannot", err, 1, true)
    assert(g:launch(s))
    assert(s:sync())
    assert.equal(3, t:totable()[1000])
    assert.is_false(k:checked())
    assert.has_error(function() c:forward(k) end, "embedding collection: kjt: key 'b' sample 0: offsets 2..402 "
                     .. "disagree with length 400 or pass the 3 values")
    g:free()
    c:free()
  end)

  -- clip_norm: the gradients' norm and factor stay on the GPU, so the step stays capturable
  for _, extra in ipairs { {}, { "optimizer.clip_norm=0.05" } } do
    cuda_it("replays the training step bit for bit, batches copied in, counters advanced" .. (extra[1] and " ("
            .. extra[1] .. ")" or ""), function()
      local bs = batches(4)
      local sets = { "optimizer.name=sgd", "embeddings.optimizer.name=sgd", extra[1] }
      local eager, eopt = tiny(sets)
      local replayed, ropt = tiny(sets)
      local runner = assert(graph.new(replayed, ropt, { warmup = 2 }))
      local el, rl = {}, {}
      for step = 1, 10 do
        local b = bs[(step - 1) % #bs + 1]
        el[step] = train.loop.step(eager, eopt, b):get(0)
        local loss = runner:step(b)
        assert(runner:sync())
        rl[step] = loss:get(0)
        if step == 6 then
          -- a new learning rate is a new capture, with the eager step's numbers
          eopt:set_lr(eopt:lr() * 0.5)
          ropt:set_lr(ropt:lr() * 0.5)
        end
      end
      assert.same(el, rl)
      assert.same(state(eager), state(replayed))
      assert.same({ 2, 6 }, { runner.captures, runner.replays })
      assert.same({ eopt.step_count, eager.embeddings.tbe:step() }, { ropt.step_count, replayed.embeddings.tbe:step() })
      if extra[1] then
        assert.is_true(eopt:grad_norm() > 0.05, "the norm is above clip_norm: the gradients were scaled")
        assert.equal(eopt:grad_norm(), ropt:grad_norm())
      end
      runner:free()
      eager.embeddings.tbe:free()
      replayed.embeddings.tbe:free()
    end)
  end

  cuda_it("replays steps with far rows' copies bit for bit, and captures again when the room changes", function()
    local bs = batches(4)
    local sets = { "optimizer.name=sgd", "embeddings.optimizer.name=sgd", "embeddings.placement=host" }
    local eager, eopt = tiny(sets)
    local replayed, ropt = tiny(sets)
    assert(eager.embeddings.tbe:set_far_rows(4096))
    assert(replayed.embeddings.tbe:set_far_rows(4096))
    local runner = assert(graph.new(replayed, ropt, { warmup = 2 }))
    local el, rl = {}, {}
    for step = 1, 8 do
      local b = bs[(step - 1) % #bs + 1]
      el[step] = train.loop.step(eager, eopt, b):get(0)
      rl[step] = runner:step(b):get(0)
      assert(runner:sync())
      assert.is_true(replayed.embeddings.tbe:far_taken() > 0, "step " .. step)
      if step == 5 then -- a new room is new memory: a new capture
        assert(eager.embeddings.tbe:set_far_rows(2048))
        assert(replayed.embeddings.tbe:set_far_rows(2048))
      end
    end
    assert.same(el, rl)
    assert.same(state(eager), state(replayed))
    assert.same({ 2, 4 }, { runner.captures, runner.replays })
    runner:free()
    eager.embeddings.tbe:free()
    replayed.embeddings.tbe:free()
  end)

  -- train.nonfinite's gates and flags live on the GPU (no wait, nothing decided on the host): a
  -- replayed step holds a batch with NaN back as the eager one does, and counts it
  cuda_it("replays guarded steps (train.nonfinite skip) bit for bit, a batch with NaN held back as eagerly",
          function()
    local host = train.source.hold(ur.data.loader { data = "synthetic:tiny", samples = 5 * 512, batch_size = 512 }, 5)
    host[5].dense:set(7, 0 / 0)
    local bs = {}
    for i, b in ipairs(host) do bs[i] = assert(b:to("device")) end
    assert(ur.sync())
    local sets = { "optimizer.name=sgd", "embeddings.optimizer.name=sgd" }
    local eager, eopt = tiny(sets)
    local replayed, ropt = tiny(sets)
    local eg, rg = guard.new(eager, eopt, "skip"), guard.new(replayed, ropt, "skip")
    local runner = assert(graph.new(replayed, ropt, { warmup = 2 }))
    -- NaN at step 5 (the first replay after the capture at 3) and at step 8
    local order, el, rl = { 1, 2, 3, 4, 5, 1, 2, 5, 3, 4 }, {}, {}
    local function shown(v) return v == v and ("%.17g"):format(v) or "nan" end
    for step, i in ipairs(order) do
      el[step] = shown(train.loop.step(eager, eopt, bs[i]):get(0))
      rl[step] = shown(runner:step(bs[i]):get(0))
      assert(runner:sync())
    end
    assert.same(el, rl)
    assert.equal("nan", rl[5])
    assert.same(state(eager), state(replayed))
    assert.same({ 1, 7 }, { runner.captures, runner.replays })
    local er, rr = eg:read(), rg:read()
    assert.same({ 10, 2 }, { er.steps, er.bad })
    assert.same({ er.steps, er.bad, er.first }, { rr.steps, rr.bad, rr.first })
    eg:detach()
    rg:detach()
    runner:free()
    eager.embeddings.tbe:free()
    replayed.embeddings.tbe:free()
  end)

  cuda_it("refuses steps a replay cannot repeat, saying why", function()
    local cases = {
      { { "optimizer.name=adam" }, "Adam's bias corrections change every step" },
      { { "embeddings.bounds=fatal" }, "bounds 'fatal' reads the GPU's flags every forward" },
      { { "embeddings.dtype=bf16" }, "f16/bf16 tables round stochastically with a key per step" },
    }
    for _, c in ipairs(cases) do
      local model, opt = tiny(c[1])
      assert.same({ nil, c[2] }, { graph.new(model, opt) })
      model.embeddings.tbe:free()
    end
  end)
end)
