-- scripts/bench/scale.lua (B5 and the synthetic scale runs) at a small scale on the CPU: the
-- flows scale_gpu.sh runs on the H200, its JSON lines and --table, and its refusals.
local cmd = require "command"
local json = require "uvmrec.json"
local q = cmd.quote

-- dlrm_dcnv2 cut down (dim 16, narrow MLPs, two cross layers of rank 32) with tables capped at
-- 200,000 rows: eight tables too large for the cache's two-slots-a-row floor, so a few MiB of
-- HBM give it misses.
local DCN = "--config dlrm_dcnv2 --set train.batch_size=256 --set embeddings.max_rows=200000 "
  .. "--set embeddings.dim=16 --set model.bottom_mlp=64,16 --set model.top_mlp=64,32,1 "
  .. "--set model.cross_rank=32 --set model.cross_layers=2"

local function scale(args) return cmd.run("scripts/bench/scale.lua " .. args) end

describe("scripts/bench/scale.lua", function()
  local dir
  before_each(function() dir = cmd.tmpdir() end)
  after_each(function() cmd.rmdir(dir) end)

  it("times a config's synthetic data all in HBM, then cached in each --hbm, first losses equal", function()
    local out = dir .. "/s.jsonl"
    local so, se, rc = scale(("%s --steps 6 --warm 3 --check 3 --hbm 64MiB,32MiB --out %s"):format(DCN, q(out)))
    assert.equal(0, rc, se .. so)
    assert.matches("cached 64MiB: first 3 losses equal all%-in%-HBM's", so)
    assert.matches("cached 32MiB: first 3 losses equal all%-in%-HBM's", so)
    local recs = assert(json.read_lines(out))
    assert.equal(5, #recs)
    local ref = recs[1]
    assert.same({ "scale", "timed", "hbm", "synthetic:dcnv2", 6, 256 },
                { ref.bench, ref.mode, ref.placement, ref.data, ref.steps, ref.batch })
    assert.is_nil(ref.hit_rate)
    assert.is_true(ref.samples_per_s > 0 and ref.table_bytes > 0)
    local hits = {}
    for k, size in ipairs({ 64, 32 }) do
      local t, c = recs[2 * k], recs[2 * k + 1]
      assert.same({ "scale", "timed", "cached", size * 2 ^ 20 }, { t.bench, t.mode, t.placement, t.hbm_embeddings })
      assert.is_true(t.samples_per_s > 0)
      -- tables past the cache: misses, rows over the host link
      assert.is_true(t.hit_rate > 0 and t.hit_rate < 1, tostring(t.hit_rate))
      assert.is_true(t.link_bytes_per_step > 0)
      -- the cache's figures a step (uvmrec.cache.per_step), its GPU phases none on the CPU
      assert.same({ t.hit_rate, t.link_bytes_per_step, 0 },
                  { t.cache.hit_rate, t.cache.link_bytes, t.cache.gpu_seconds })
      hits[k] = t.hit_rate
      assert.same({ "scale", "check", true, 3, size * 2 ^ 20 }, { c.bench, c.mode, c.equal, c.steps, c.hbm_embeddings })
      assert.equal(3, #c.losses)
      for s = 1, 3 do
        assert.is_number(c.base[s])
        assert.equal(c.base[s], c.losses[s])
      end
    end
    assert.is_true(hits[2] < hits[1], "half the cache, fewer hits: " .. hits[1] .. " " .. hits[2])
    local tab, te, trc = scale("--table " .. q(out))
    assert.equal(0, trc, te)
    assert.matches("dlrm_dcnv2 all in HBM +[%d.]+ M samples/s +6 steps, HBM peak", tab)
    assert.matches("dlrm_dcnv2 cached 64%.0 MiB +[%d.]+ M samples/s +hit [%d.]+%%, link", tab)
    assert.matches("dlrm_dcnv2 first losses, 32%.0 MiB vs all in HBM equal +3 steps", tab)
  end)

  it("runs B5 from day files as before: check runs, then the timed one", function()
    local days, out = dir .. "/days", dir .. "/b5.jsonl"
    local _, ge, grc = cmd.run(("datagen tiny --cpu --out %s --samples 20000"):format(q(days)))
    assert.equal(0, grc, ge)
    local so, se, rc = scale(("--config dlrm_tiny --set train.batch_size=1024 --dir %s --steps 4 --warm 2 "
      .. "--check 2 --out %s"):format(q(days), q(out)))
    assert.equal(0, rc, se .. so)
    assert.matches("cached: built in [%d.]+ s; first 2 losses equal all%-in%-HBM's", so)
    local recs = assert(json.read_lines(out))
    assert.same({ "B5", "check", true }, { recs[1].bench, recs[1].mode, recs[1].equal })
    assert.same({ "B5", "timed", 4, 1024 }, { recs[2].bench, recs[2].mode, recs[2].steps, recs[2].batch })
    assert.is_nil(recs[2].placement)
    assert.is_number(recs[2].epoch_minutes)
    assert.matches("B5 first losses vs all in HBM +equal", (scale("--table " .. q(out))))
  end)

  it("goes on past a failed run, a line each, and fails at the end naming them", function()
    local out = dir .. "/f.jsonl"
    local so, se, rc = scale(("--config dlrm_tiny --steps 2 --warm 2 --check 2 --hbm 1MiB,2MiB --host-memory 1KiB "
      .. "--out %s"):format(q(out)))
    assert.equal(1, rc, so)
    assert.matches("failed: all in HBM, 1MiB, 2MiB", se, 1, true)
    local recs = assert(json.read_lines(out))
    assert.equal(3, #recs)
    for k, want in ipairs({ { "hbm" }, { "cached", 2 ^ 20 }, { "cached", 2 ^ 21 } }) do
      assert.same({ "scale", "error", want[1], want[2] }, { recs[k].bench, recs[k].mode, recs[k].placement,
                                                            recs[k].hbm_embeddings })
      assert.matches("but 1.0 KiB are allowed (--host-memory)", recs[k].error, 1, true)
    end
    assert.matches("dlrm_tiny cached 2.0 MiB +FAILED +host memory: the run needs", (scale("--table " .. q(out))))
  end)

  it("refuses what it cannot run, naming it", function()
    local function refused(args, msg)
      local so, se, rc = scale(args)
      assert.are_not.equal(0, rc, so)
      assert.matches(msg, se .. so, 1, true)
    end
    cmd.spit(dir .. "/files.yaml", cmd.slurp("models/dlrm_tiny.yaml"):gsub("train: synthetic:tiny",
      "train: criteo-bin:/nowhere"))
    refused("--config " .. q(dir .. "/files.yaml"), "needs --dir DAYS: " .. dir .. "/files.yaml's data.train is "
      .. "'criteo-bin:/nowhere', not synthetic:NAME")
    refused("--config dlrm_tiny --check 5 --warm 4",
            "--check 5: the checked steps are read in the warm-up of 4 (--warm)")
    refused("--config dlrm_tiny --dir " .. q(dir) .. " --hbm 1GiB,2GiB", "--hbm 1GiB,2GiB: one size with --dir")
  end)
end)
