-- Metrics over ranks (uvmrec.metrics with world_size and rank / my_rank): every value of a
-- MetricCollection and GroupedAUC over W ranks, each fed its share of the batches, equals the
-- one process's (spec/support/dist_metrics.lua): AUC exact over the union of the samples,
-- lifetime sums and histograms summed; and the options' errors.
local dist = require "uvmrec.dist"
local metrics = require "uvmrec.metrics"
local command = require "command"
local h = require "helpers"

describe("uvmrec.metrics over ranks", function()
  for _, w in ipairs { 2, 3 } do
    h.mpi_it(("equals one process's metrics over %d ranks"):format(w), function()
      local out, err, code = command.sh(("%s launch -n %d spec/support/dist_metrics.lua"):format(command.bin(), w))
      h.ranks_ok(w, out, err, code)
      assert.matches("\nauc 0%.[89]%d+ gauc 0%.[89]%d+ ne ", "\n" .. out)
    end)
  end

  it("names what world_size and rank get wrong", function()
    local comm = assert(dist.comm())
    assert.has_error(function() metrics.AUC { batch_size = 4, world_size = 2 } end,
      "metrics: world_size 2 needs rank (or my_rank)")
    assert.has_error(function() metrics.AUC { batch_size = 4, world_size = 2, rank = 1, comm = comm } end,
      "metrics: world_size 2 and rank 1, but the communicator is rank 0 of 1")
    assert.has_error(function()
      metrics.AUC { batch_size = 4, world_size = 2, my_rank = 0, comm = comm, reduce = function() end }
    end, "metrics: give reduce or world_size, not both")
    local m = metrics.NE { batch_size = 4, world_size = 1, rank = 0 }
    assert.equal(1, m.world_size)
  end)
end)
