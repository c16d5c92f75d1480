-- Training with `cached` tables: dlrm_tiny's loss sequence is the same as with tables in
-- memory, for any cache size, with the plain loop and with the prefetch pipeline (on the CPU
-- here; the #cuda test does the same against device tables).
local cmd = require "command"
local h = require "helpers"

local cuda_it = h.cuda_it

-- Losses by step (every second one logged), how many, and the cache's statistics.
local function losses(sets, cpu)
  local ctx
  local r = h.train_tiny({ "train.batch_size=256", "train.steps=40", "train.log_every=2", "eval.samples=2048",
                           "eval.every=0", "eval.batch_size=2048" }, sets,
                         { cpu = cpu, setup = function(c) ctx = c end })
  local cache = ctx and ctx.model.embeddings.tbe.cache
  return r.losses, r.logged, cache and cache:stats()
end

describe("training with cached tables", function()
  it("gives the loss sequence of host tables, any cache size, with and without the pipeline", function()
    local want, logged = losses({ "embeddings.placement=host" }, true)
    assert.equal(20, logged)
    for _, sets in ipairs({
      { "embeddings.placement=cached", "embeddings.cache.slots=32", "embeddings.cache.shared=true" },
      { "embeddings.placement=cached", "embeddings.cache.load_factor=0.05", "embeddings.cache.policy=lfu",
        "embeddings.cache.min_slots=0" },
      { "embeddings.placement=cached", "embeddings.cache.load_factor=1" },
      { "embeddings.placement=cached", "embeddings.cache.slots=32", "embeddings.cache.shared=true",
        "train.pipeline=true" },
      { "embeddings.placement=cached", "embeddings.cache.load_factor=0.1", "train.pipeline=true",
        "embeddings.cache.min_slots=0" },
      { "embeddings.placement=host", "train.pipeline=true" },
    }) do
      local got, _, stats = losses(sets, true)
      assert.same(want, got, table.concat(sets, " "))
      if sets[1]:find("cached") then assert.is_true(stats.lookups > 0 and stats.hits > 0) end
    end
  end)

  it("runs with more threads than tables (the engine's parallel ranges), as a 16-core host does", function()
    -- ur__parallel_for once called empty ranges [n, n) when threads did not divide the work;
    -- the cache's per-table set sort then read past its tables (SIGFPE on the H200's host).
    local dir = cmd.tmpdir()
    local out, err, code = cmd.sh("UR_NUM_THREADS=16 " .. cmd.quote(cmd.bin()) .. " train dlrm_tiny --cpu "
      .. "--steps 6 --progress lines --out " .. cmd.quote(dir .. "/run") .. " --set embeddings.placement=cached "
      .. "--set embeddings.cache.load_factor=0.1 --set train.pipeline=true --set eval.samples=2048 "
      .. "--set eval.batch_size=2048 --set eval.min_auc=0")
    cmd.rmdir(dir)
    assert.equal(0, code, out .. err)
  end)

  cuda_it("on the GPU: the loss sequence of device tables, with and without the pipeline", function()
    local want = losses({ "embeddings.placement=device" }, false)
    for _, sets in ipairs({
      { "embeddings.placement=cached", "embeddings.cache.load_factor=0.05" },
      { "embeddings.placement=cached", "embeddings.cache.load_factor=0.05", "train.pipeline=true" },
      { "embeddings.placement=cached", "embeddings.cache.slots=32", "embeddings.cache.shared=true",
        "train.pipeline=true" },
      { "embeddings.placement=device", "train.pipeline=true" },
    }) do
      local got = losses(sets, false)
      assert.same(want, got, table.concat(sets, " "))
    end
  end)
end)
