-- Held-out evaluation (uvmrec.train.evaluate): the set is the first `samples` samples of the
-- data, whatever the batches it comes in.
local ur = require "uvmrec"
local evaluate = require "uvmrec.train.evaluate"
local source = require "uvmrec.train.source"

-- A stand-in model whose prediction is a squashed dense feature: scores that vary by sample.
local function model()
  local m = ur.nn.Sequential()
  m.predict = function(_, b)
    local p = ur.tensor({ b.size, 1 })
    for i = 0, b.size - 1 do
      local x = b.dense[i * 13]
      p[i] = x / (1 + math.abs(x)) * 0.49 + 0.5
    end
    return p
  end
  return m
end

local function eval(batch_size, samples, loader_samples)
  local l = assert(ur.data.loader { data = "synthetic:tiny", samples = loader_samples, batch_size = batch_size })
  local r = assert(evaluate.run(model(), source.loader(l), { metrics = { "auc", "ne" }, samples = samples,
                                                             batch_size = batch_size }))
  l:close()
  return r
end

describe("uvmrec.train.evaluate", function()
  it("evaluates the first `samples` samples, also when they end inside a batch", function()
    local whole = eval(300, 300, 300)          -- exactly the first 300, in one batch
    for _, b in ipairs { 256, 64, 1000 } do
      local r = eval(b, 300, 1024)             -- the data goes on past them
      assert.equal(300, r.samples, b)
      assert.near(whole.auc, r.auc, 1e-12)
      assert.near(whole.logloss, r.logloss, 1e-9)
    end
  end)
end)
