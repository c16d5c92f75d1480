-- Learning-rate schedules (lua/uvmrec/optim/schedule.lua) against their formulas, and the
-- Schedule that scales the rates of parameter groups (a dense optimizer, an embedding collection).
local ur = require "uvmrec"
local optim = ur.optim

describe("uvmrec.optim.schedule", function()
  local S = optim.schedule

  it("warms up linearly, decays polynomially and in steps", function()
    local w = S.linear_warmup { base = 2, warmup = 4 }
    assert.same({ 0.5, 1, 1.5, 2, 2 }, { w(1), w(2), w(3), w(4), w(100) })
    local p = S.polynomial { base = 1, start = 10, steps = 4, power = 2, min = 0.01 }
    assert.same({ 1, 1, 0.5625, 0.25, 0.0625, 0.0625, 0.0625 }, { p(1), p(9), p(11), p(12), p(13), p(14), p(99) })
    local st = S.step_decay { base = 1, every = 3, gamma = 0.5 }
    assert.same({ 1, 1, 1, 0.5, 0.25 }, { st(1), st(2), st(3), st(4), st(7) })
  end)

  it("gives the public DLRM code's warmup and polynomial decay", function()
    local f = S.dlrm { base = 1, warmup = 2, decay_start = 5, decay_steps = 2, min = 0 }
    assert.same({ 0.5, 1, 1, 1, 1, 0.25, 0.25, 0.25 }, { f(1), f(2), f(3), f(4), f(5), f(6), f(7), f(50) })
    assert.error_matches(function() S.step_decay { base = 1, every = 0, gamma = 1 } end,
      "schedule: every must be a finite number >= 1, got 0")
    -- a power below 0 would raise the rate as it decays (to 100x at the end for -2), an
    -- infinite warmup would hold it at 0: both refused, as a power that is not a number is
    assert.error_matches(function() S.polynomial { start = 1, steps = 10, power = -2 } end,
      "schedule: power must be a finite number >= 0, got %-2")
    assert.error_matches(function() S.dlrm { warmup = 2, decay_start = 5, decay_steps = 2, power = "x" } end,
      "schedule: power must be a finite number >= 0, got x")
    assert.error_matches(function() S.dlrm { warmup = 2, decay_start = 5, decay_steps = 2, min = -1 } end,
      "schedule: min must be a finite number >= 0, got %-1")
    assert.error_matches(function() S.linear_warmup { warmup = math.huge } end,
      "schedule: warmup must be a finite number >= 1, got inf")
  end)

  it("gives each parameter group its own base rate times the factor, before each step as a hook", function()
    local w = ur.tensor({ 4 }):fill(0)
    local opt = optim.Adagrad({ { name = "w", tensor = w, grad = ur.tensor({ 4 }):fill(0) } }, { lr = 0.2 })
    local ebc = ur.nn.EmbeddingBagCollection { tables = { { name = "t", rows = 4, dim = 4 } }, device = "cpu",
                                               optimizer = { "rowwise_adagrad", lr = 0.5 } }
    local s = optim.Schedule(S.linear_warmup { warmup = 4 }, { opt, ebc })
    s:set(1)
    assert.same({ 0.05, 0.125 }, { opt:lr(), ebc:lr() })
    s:before { step = 3 }
    assert.same({ 0.2, 0.5 }, { opt:lr(), ebc:lr() })
    assert.error_matches(function() optim.Schedule(S.linear_warmup { warmup = 4 }, { opt, {} }) end,
      "Schedule: group 2 has no lr%(%) and set_lr%(lr%)")
  end)
end)
