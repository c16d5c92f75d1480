-- uvmrec.train.hooks, each on a run of uvmrec.train.loop.run with a model that does nothing: the
-- trainer's position registered and restored, a resumed run starting at its step; the loss
-- read every `every` steps and at the end; evaluations every N steps but the last; checkpoints
-- every N steps, at the end and on a signal, never twice at a step nor before the first step;
-- the interrupt flag stopping the run at the step boundary.
local ur = require "uvmrec"
local hooks = require "uvmrec.train.hooks"
local loop = require "uvmrec.train.loop"
local ck = require "uvmrec.checkpoint"
local cmd = require "command"
local C = ur.C

-- A run of n steps of a model and optimizer doing nothing, on batches that know their place.
local function run(n, list)
  local loss = { get = function() return 0.25 end }
  local model = { criterion = { forward = function() return loss end, backward = function() end },
                  forward = function() end, backward = function() end }
  local k = 0
  local source = { next = function()
    k = k + 1
    if k > n then return nil end
    return { size = 10, position = function() return { epoch = 0, sample = 10 * k } end }
  end, close = function() end }
  return loop.run(model, { step = function() end }, source, list)
end

-- A progress display that notes what it is shown, and a run log that keeps its lines.
local function quiet()
  local p = { shown = {}, messages = {}, rate = 5, elapsed = function() return 1 end, pause = function() end,
              resume = function() end }
  function p.update(_, step) p.shown[#p.shown + 1] = step end
  function p.message(_, m) p.messages[#p.messages + 1] = m end
  local lines = {}
  return p, lines, function(l) lines[#lines + 1] = l end
end

-- The checkpoints hook over a registry of one component, saving into a fresh folder; what it
-- saved as "reason step" from its log lines; the folder.
local function saving(every)
  local progress, lines, line = quiet()
  local dir = cmd.tmpdir()
  local reg = ck.registry()
  reg:register { name = "n", state = function() return { meta = { n = 1 } } end, load = function() end }
  local c = hooks.checkpoints { every = every, registry = reg, dir = dir, config = {}, progress = progress,
                                line = line }
  return c, function()
    local out = {}
    for _, l in ipairs(lines) do out[#out + 1] = l.reason .. " " .. l.step end
    return out
  end, dir
end

describe("uvmrec.train.hooks", function()
  it("keeps the trainer's position as a checkpoint component, and starts a resumed run at its step", function()
    local ctx = { step = 0, samples = 0 }
    local t = hooks.trainer(ctx)
    local reg = ck.registry()
    t:register(reg)
    assert.same({ "trainer" }, reg:components())
    run(3, { t })
    assert.same({ 3, 30, { epoch = 0, sample = 30 } }, { ctx.step, ctx.samples, ctx.position })
    reg.by_name.trainer.load({}, { step = 7, samples = 70, position = { epoch = 1, sample = 5 } })
    assert.same({ 7, 8, 70 }, { ctx.step, ctx.first, ctx.samples })
    local r = run(2, { t })
    assert.same({ 9, 90 }, { r.step, r.samples })
    -- the steps train.nonfinite skipped: saved when there are any, and a count a run of its
    -- steps cannot have is refused before anything is loaded
    assert.is_nil(reg.by_name.trainer.state().meta.skipped)
    reg.by_name.trainer.load({}, { step = 7, samples = 70, skipped = 2 })
    assert.equal(2, reg.by_name.trainer.state().meta.skipped)
    local check = reg.by_name.trainer.check
    assert.is_nil(check({}, { step = 7, samples = 70, skipped = 7 }))
    assert.equal("the meta of component 'trainer' has skipped 8; expected a whole number of steps up to its step 7",
                 check({}, { step = 7, samples = 70, skipped = 8 }))
    assert.matches("has skipped 1.5;", check({}, { step = 7, samples = 70, skipped = 1.5 }))
  end)

  it("reads the loss every `every` steps and after the last", function()
    local progress, lines, line = quiet()
    local opt, tables = { lr = function() return 0.1 end }, { lr = function() return 0.3 end }
    local log = hooks.log { progress = progress, line = line, every = 3, optimizer = opt, tables = tables }
    run(7, { log })
    assert.same({ 3, 6, 7 }, progress.shown)
    assert.same({ event = "train", step = 7, samples = 70, loss = 0.25, seconds = 1, samples_per_s = 5, lr = 0.1,
                  tables_lr = 0.3 }, lines[3])
    assert.equal(0.25, log.loss)
  end)

  it("evaluates every N steps but the last, on held-out data through a source it attaches", function()
    local progress, lines, line = quiet()
    local model = ur.nn.Sequential()
    local asked = {}
    model.predict = function(_, b)
      asked[#asked + 1] = b.size
      return ur.tensor({ b.size, 1 }):fill(0.5)
    end
    local e = hooks.evaluation { every = 2, last = 5, model = model, metrics = { "auc" }, samples = 512,
                                 batch_size = 256, progress = progress, line = line,
                                 data = { data = "synthetic:tiny", samples = 512, batch_size = 256 },
                                 source = require("uvmrec.train.source").loader(nil) }
    run(5, { e })
    assert.same({ 2, 4 }, { e.evals[1].step, e.evals[2].step })
    assert.same({ 256, 256, 256, 256 }, asked)
    assert.equal(0.5, e.evals[1].auc) -- every prediction the same
    -- the kinds asked for alone: one not computed would read 0
    assert.same({}, { e.evals[1].ne, e.evals[1].logloss, e.evals[1].accuracy, e.evals[1].calibration, e.evals[1].ctr })
    assert.same({ "eval", "eval" }, { lines[1].event, lines[2].event })
    assert.matches("^eval at step 2: AUC 0.5000", progress.messages[1])
    e:free()
  end)

  it("saves every N steps and at the end, once a step, and not before a resumed run's first step", function()
    local c, saved, dir = saving(2)
    run(5, { c })
    assert.same({ "every 2", "every 4", "end 5" }, saved())
    assert.equal(5, c.saved.step)
    assert.matches("ckpt%-0+5%.safetensors$", c.saved.path)
    cmd.rmdir(dir)
    c, saved, dir = saving(2)
    run(4, { c })
    assert.same({ "every 2", "every 4" }, saved(), "the end is step 4, saved already")
    cmd.rmdir(dir)
    c, saved, dir = saving(0)
    run(0, { { start = function(_, r) r.step = 6 end }, c })
    assert.same({}, saved(), "nothing trained since the checkpoint resumed from")
    cmd.rmdir(dir)
  end)

  it("stops at the step boundary when the interrupt flag rises, with a signal's checkpoint", function()
    local c, saved, dir = saving(0)
    local flag = { after = function(_, r) if r.step == 3 then C.ur_interrupt_set(1) end end }
    local r = run(10, { flag, c, hooks.signals(true) })
    assert.same({ 3, true }, { r.step, r.stopped })
    assert.same({ signal = 0, name = "the interrupt flag", step = 3 }, r.interrupted)
    assert.same({ "signal 3" }, saved())
    assert.equal(0, C.ur_interrupt_get(), "the handlers restored, the flag down")
    cmd.rmdir(dir)
  end)

  it("logs managed collisions' statistics every N steps and at the last, and registers their maps", function()
    local ebc = ur.nn.EmbeddingBagCollection { tables = { { name = "t", rows = 20, dim = 4 } }, device = "cpu" }
    local mcc = ur.nn.ManagedCollisionCollection { collection = ebc, evict_every = 2, fallback_rows = 2 }
    for step = 1, 4 do
      local ids = {}
      for i = 1, 16 do ids[i] = (step * 7 + i * i) % 50 end
      mcc:forward(ur.KJT { keys = { "t" }, values = ids, lengths = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 } })
    end
    local progress, lines, line = quiet()
    local h = hooks.collisions { collisions = mcc, every = 2 }
    h:attach { progress = progress, line = line }
    local reg = ck.registry()
    h:register(reg)
    assert.same({ "collisions" }, reg:components())
    run(5, { h })
    local steps = {}
    for _, l in ipairs(lines) do
      assert.equal("collisions", l.event)
      steps[#steps + 1] = l.step
    end
    assert.same({ 2, 4, 5 }, steps)
    local s = assert(mcc:stats())
    assert.same({ 64, s.resident, s.evictions }, { lines[3].lookups, lines[3].resident, lines[3].evictions })
    assert.equal(s.tables.t.admissions, lines[3].tables.t.admissions)
    assert.equal(s.resident_lookups + s.fallback_lookups, s.lookups)
    assert.equal(("collisions %.0f%% full, %.1f%% resident"):format(100 * s.occupancy, 100 * s.resident_share),
                 progress.note)
    assert.equal(mcc:summary(), h:summary())
    assert.equal(lines[3], h.last)
    ebc.tbe:free()
  end)
end)
