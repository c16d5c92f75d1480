-- uvmrec.train.run holds nothing once a run is over and its objects are collected: ur.memory()
-- is back to its level before the run in every category (host, pinned, device, managed; on a
-- GPU the HBM in use past the dense workspaces, which the default stream keeps for the process:
-- docs/tensors.md).  LuaJIT's traces outlive a run and keep every function they call as a
-- constant, with what its upvalues reach: hooks made as closures over the model (the guard's,
-- the log's, the trainer's) and nn.Module's closures over the arena kept the dense side of a
-- finished run alive, 2.2 GiB of HBM on the H200 (docs/results.md: the memory held after a run);
-- tbe.new's per-table callback, a closure over the collection, kept a run's tables (2.65 MB of
-- dlrm_tiny's on the CPU, 2.2 MB on an H100) until the traces were flushed: this spec, run alone,
-- failed at its first run.  A failure says what flushing the traces lets go.
-- Sixty steps a run, so that the hooks' calls are compiled; two runs of each, as in scale.lua.
local ur = require "uvmrec"
local h = require "helpers"
local train = require "uvmrec.train"

local KEYS = { "host", "pinned", "device", "managed", "managed_on_gpu" }

local function collected()
  collectgarbage()
  collectgarbage()
  return ur.memory()
end

-- What each run of dlrm_tiny with `sets` left held past the memory before it: a list (one a
-- run) of {category = bytes} for the categories that moved, and the workspace's growth.
local function held_after_runs(sets, cpu)
  local out = {}
  for run = 1, 2 do
    local cfg = h.tiny({ "train.steps=60", "train.log_every=5", "train.batch_size=512", "eval.samples=0",
                         "eval.min_auc=0" }, sets)
    local before = collected()
    local r, err = train.run(cfg, { progress = "none", print = function() end, cpu = cpu })
    assert(r, err)
    assert.equal(60, r.steps)
    r = nil -- luacheck: ignore 311 (the result holds nothing of the engine's; let go all the same)
    local after = collected()
    local moved = {}
    for _, k in ipairs(KEYS) do
      if after[k] ~= before[k] then moved[k] = after[k] - before[k] end
    end
    local ws = after.workspace - before.workspace
    local hbm = after.hbm_used - before.hbm_used - ws
    if hbm ~= 0 then moved.hbm_used_past_workspace = hbm end
    out[run] = { moved = moved, workspace = ws }
    if next(moved) then
      -- what the traces held: the same measure with them flushed (then compiled again)
      jit.flush()
      local flushed = collected()
      out[run].moved_traces_flushed = {}
      for _, k in ipairs(KEYS) do
        if flushed[k] ~= before[k] then out[run].moved_traces_flushed[k] = flushed[k] - before[k] end
      end
    end
  end
  return out
end

local CASES = {
  { "host tables, the guard (stop)", {} },
  { "the guard skipping, a schedule's warm-up, evaluations", { "train.nonfinite=skip", "schedule.name=warmup",
    "schedule.warmup_steps=30", "eval.samples=2048", "eval.every=20", "eval.batch_size=1024" } },
  { "cached tables through the prefetch pipeline", { "embeddings.placement=cached",
    "embeddings.cache.load_factor=0.1", "train.pipeline=true" } },
  { "managed tables under their hint policy", { "embeddings.placement=managed" } },
}

describe("uvmrec.train.run's memory", function()
  for _, c in ipairs(CASES) do
    it("holds nothing after a run is collected: " .. c[1], function()
      for run, r in ipairs(held_after_runs(c[2], true)) do
        assert.same({}, r.moved, ("run %d (with the traces flushed: %s)"):format(run,
                    require("uvmrec.json").encode(r.moved_traces_flushed or {})))
        assert.equal(0, r.workspace, ("run %d: the CPU has no workspaces"):format(run))
      end
    end)
  end

  h.cuda_it("holds nothing on the GPU after a run is collected but the dense workspaces it grew", function()
    -- every case's runs first, so that a failure shows them all (and what flushing the traces let go)
    local all = {}
    for i, c in ipairs(CASES) do all[i] = held_after_runs(c[2], false) end
    for i, c in ipairs(CASES) do
      for run, r in ipairs(all[i]) do
        assert.same({}, r.moved, ("%s, run %d (every case: %s)"):format(c[1], run, require("uvmrec.json").encode(all)))
        -- the default stream's workspace (and its side stream's) is kept for the process:
        -- grown by the first run, not by the second
        assert.is_true(r.workspace >= 0, ("%s, run %d: workspace %d"):format(c[1], run, r.workspace))
        if run == 2 then assert.equal(0, r.workspace, c[1] .. ": the second run grew the workspaces") end
      end
    end
  end)
end)
