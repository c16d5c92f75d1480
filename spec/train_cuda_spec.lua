-- uvmrec.train on the GPU against the CPU backend: the same initial weights and batches give
-- the same losses (f32 and bf16), the loader's source hands over its batches unchanged (a KJT
-- on the device, its keys checked by the collection), evaluation agrees, managed collisions
-- make the CPU's decisions, and dlrm_tiny trains to the AUC make run asks for.  Pending
-- without a GPU.
local helpers = require "helpers"
local ur = require "uvmrec"
local train = require "uvmrec.train"

local BASE = { "train.batch_size=512", "train.steps=20", "eval.samples=8192", "eval.batch_size=4096" }
local function tiny(sets) return helpers.tiny(BASE, sets) end

local run = helpers.step_losses

describe("uvmrec.train on the GPU", function()
  -- Loss tolerances: f32 the products' order; bf16 with a CPU that rounds as the GPU does;
  -- tf32 against the CPU's exact f32, so TF32's own effect: on the H200 (scripts/bench/
  -- tf32_check.lua, 2026-12-02) the GPU's TF32 losses differed from its own f32 ones by 0.692%
  -- at step 5, exactly as much as from the CPU's, the f32 ones agreeing to 1e-6.
  for _, c in ipairs { { "f32", 2e-4 }, { "bf16", 3e-2 }, { "tf32", 1e-2 } } do
    helpers.cuda_it("trains dlrm_tiny as the CPU does, " .. c[1], function()
      local cfg = tiny { "model.precision=" .. c[1] }
      local a, ma = run(cfg, true, 8)
      local b, mb = run(cfg, false, 8)
      for s = 1, #a do helpers.near(b[s], a[s], c[2], ("loss of step %d"):format(s)) end
      assert.equal("device", mb.bottom.modules[1].weight:placement())
      assert.equal("device", mb.embeddings.tbe:placement())
      -- After the steps the tables still agree: in f32 element by element; in bf16 and tf32 the
      -- updates (after - before) agree in norm.  Adagrad divides each row's step by the root of
      -- its gradients' squares, so a row whose gradients are all rounding noise takes a full
      -- step either way: single elements can differ by several learning rates, not the whole.
      local _, m0 = run(cfg, true, 0)
      local t0 = m0.embeddings:table("C16"):totable()
      local ta, tb = ma.embeddings:table("C16"):totable(), mb.embeddings:table("C16"):totable()
      local worst, diff, norm = 0, 0, 0
      for i = 1, #ta do
        worst = math.max(worst, math.abs(ta[i] - tb[i]))
        diff = diff + (tb[i] - ta[i]) ^ 2
        norm = norm + (ta[i] - t0[i]) ^ 2
      end
      local rel = math.sqrt(diff / norm)
      if c[1] == "f32" then
        assert.is_true(worst < 1e-5, "table C16 differs by " .. worst)
      else
        local tol = c[1] == "bf16" and 0.15 or 0.05
        assert.is_true(rel < tol, ("table C16's update differs by %.4f of its norm (at most %g; "
          .. "largest element difference %.4f)"):format(rel, tol, worst))
      end
    end)
  end

  helpers.cuda_it("makes managed collisions' decisions as the CPU does, training dlrm_tiny alike", function()
    local cfg = tiny { "embeddings.max_rows=60", "embeddings.collisions.policy=distance_lfu",
                       "embeddings.collisions.evict_every=3", "embeddings.collisions.distance_power=1.5" }
    local a, ma = run(cfg, true, 12)
    local b, mb = run(cfg, false, 12)
    for s = 1, #a do helpers.near(b[s], a[s], 2e-4, ("loss of step %d"):format(s)) end
    assert.equal("device", mb.collisions.placement)
    local sa, sb = assert(ma.collisions:stats()), assert(mb.collisions:stats())
    assert.is_true(sa.evictions > 0, "rounds evicted ids")
    for name, t in pairs(sa.tables) do
      for _, k in ipairs { "resident", "candidates", "lookups", "resident_lookups", "fallback_lookups", "rounds",
                           "fills", "admissions", "evictions" } do
        assert.equal(t[k], sb.tables[name][k], name .. " " .. k)
      end
      local ia = assert(ma.collisions.map:state(name)).ids:totable()
      local ib = assert(assert(mb.collisions.map:state(name)).ids:to("host")):totable()
      assert.same(ia, ib, name .. ": the same id on every row")
    end
  end)

  helpers.cuda_it("copies the loader's batches to the device unchanged", function()
    local function loader()
      return assert(ur.data.loader { data = "synthetic:dcnv2", samples = 700, batch_size = 256 })
    end
    local a, b = loader(), loader()
    local source = train.source.loader(b, { placement = "device" })
    for _ = 1, 3 do
      local x, y = assert(a:next()), assert(source:next())
      assert.equal("device", y.dense:placement())
      assert.equal("device", y.sparse:placement())
      assert.same(x.dense:totable(), y.dense:totable())
      assert.same(x.labels:totable(), y.labels:totable())
      assert.same(x.sparse:values():totable(), y.sparse:values():totable())
      assert.same(x.sparse:offsets():totable(), y.sparse:offsets():totable())
    end
    assert.is_nil(source:next())
    source:free()
    a:close()
    b:close()
  end)

  helpers.cuda_it("evaluates as the CPU does from the same weights", function()
    local cfg = tiny()
    local _, ma, data = run(cfg, true, 20)
    local _, mb = run(cfg, false, 20)
    local function eval(model, gpu)
      local l = assert(ur.data.loader(data.eval))
      local source = train.source.loader(l, { placement = gpu and "device" or nil })
      local r = assert(train.evaluate.run(model, source, { samples = 8192, batch_size = 4096 }))
      source:free()
      l:close()
      return r
    end
    local ra, rb = eval(ma, false), eval(mb, true)
    helpers.near(rb.auc, ra.auc, 1e-3, "AUC")
    helpers.near(rb.logloss, ra.logloss, 1e-3, "log loss")
    assert.equal(8192, rb.samples)
  end)

  helpers.cuda_it("trains dlrm_tiny past 0.70 AUC as make run does", function()
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny"))))
    local result = assert(train.run(cfg, { progress = "none", print = function() end }))
    assert.is_true(result.eval.auc > 0.70, "AUC " .. result.eval.auc)
    assert.is_true(result.eval.auc < result.ceiling + 0.01)
  end)
end)
