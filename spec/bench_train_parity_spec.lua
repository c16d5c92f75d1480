-- scripts/bench/train_parity.lua (uvmrec against PyTorch's DLRM) where it needs no PyTorch: its
-- refusals before PyTorch trains.
local cmd = require "command"
local q = cmd.quote

describe("scripts/bench/train_parity.lua", function()
  -- 7 samples in 7 days: the held-out day is 1 sample, one class.  It printed 'a run wrote no
  -- final AUC' (which run, and why, said nowhere), after PyTorch had trained as well
  it("fails on an undefined final AUC, saying which run and why, before PyTorch trains", function()
    local dir = cmd.tmpdir()
    local out, err, code = cmd.run(("scripts/bench/train_parity.lua --config dlrm_tiny --cpu --samples 7 --days 7 "
      .. "--work %s --python %s"):format(q(dir .. "/w"), q(dir .. "/no-python")))
    assert.equal(1, code, out .. err)
    assert.matches("uvmrec has no final AUC to compare: it is undefined, the 1 held%-out label is [01]\n", err)
    assert.is_nil(out:find("torch_dlrm.py", 1, true), out)
    cmd.rmdir(dir)
  end)
end)
