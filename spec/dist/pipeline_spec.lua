-- Cached and managed shards through the prefetch pipeline, ranks as processes on the CPU
-- (`uvmrec launch -n W`, OpenMPI): uvmrec.pipeline.Prefetch over a sharded collection
-- (uvmrec.dist.shard) exchanges each batch's input ahead and brings its rows into the cached
-- shards' caches (spec/support/dist_pipeline.lua checks the rows are there before the forward,
-- and the losses against the same model without the pipeline, bit for bit); `uvmrec train`
-- over 2 and 4 ranks with train.pipeline gives the losses of the run without it bit for bit,
-- and the one-process run's within the dist tolerance (spec/support/dist_runs.lua); managed
-- shards keep their hint policies, per shard, and their checkpoints hold the rows in logical
-- order whatever the layout.  Each job's seconds are printed, for the CI's budget.
local dist = require "uvmrec.dist"
local json = require "uvmrec.json"
local command = require "command"
local ck = require "uvmrec.checkpoint"
local ur = require "uvmrec"
local h = require "helpers"
local Prefetch = require "uvmrec.pipeline.Prefetch"
local Batch = require "uvmrec.data.batch"

local function sh(cmd)
  local t0 = os.time()
  local out, err, code = command.sh_fixed_blas(cmd)
  io.stderr:write(("  [dist] %s: %d s\n"):format(cmd:gsub("^.-uvmrec ", ""):sub(1, 90), os.time() - t0))
  return out, err, code
end

-- A run directory's train events' losses and its cache event.
local function events(dir)
  local losses, cache = {}, nil
  for line in io.lines(dir .. "/metrics.jsonl") do
    local e = json.decode(line)
    if e.event == "train" then losses[#losses + 1] = { e.step, e.loss } end
    if e.event == "cache" then cache = e end
  end
  return losses, cache
end

local TRAIN = "train dlrm_tiny --cpu --progress none --set train.log_every=1 --set eval.min_auc=0 "
  .. "--set eval.samples=16384 --set eval.batch_size=8192 "

-- In a world of one (the collectives copy), in this process: a sharded collection of cached
-- tables through Prefetch against the same collection's device (or host) tables without it.
local function opts(place, device)
  return { tables = { { name = "a", rows = 100, dim = 16, features = { "f", "g" } }, { name = "b", rows = 7, dim = 16 },
                      { name = "c", rows = 30, dim = 16 } },
           optimizer = { "adagrad", lr = 0.1 }, device = device, seed = 5, placement = place,
           cache = place == "cached" and { load_factor = 0.5 } or nil }
end

local function batches(rng, n, count)
  local list = {}
  local rows = { f = 100, g = 100, b = 7, c = 30 }
  for i = 1, count do
    local values, lengths = {}, {}
    for _, key in ipairs { "f", "g", "b", "c" } do
      for _ = 1, n do
        local len = rng(4) - 1
        lengths[#lengths + 1] = len
        for _ = 1, len do values[#values + 1] = rng(rows[key]) - 1 end
      end
    end
    list[i] = { values = values, lengths = lengths }
  end
  return list
end

local function kjt_of(b)
  return ur.KJT { keys = { "f", "g", "b", "c" }, values = b.values, lengths = b.lengths }
end

-- steps through Prefetch (`ahead`) and without (`plain`), outputs and tables compared each step
local function against(ahead, plain, list, n, device, plans)
  -- on the GPU the communicator is made for it (shards on a GPU exchange device tensors)
  local comm = assert(dist.comm(device and { device = 0 } or nil))
  local A, P = dist.shard(ahead, plans, comm), dist.shard(plain, plans, comm)
  local k = 0
  local source = { next = function()
    k = k + 1
    if not list[k] then return nil end
    return Batch.new { sparse = kjt_of(list[k]), size = n }
  end }
  local p = Prefetch.new { collection = A, source = source }
  local step = 0
  while true do
    local b = p:next()
    if not b then break end
    step = step + 1
    assert.is_truthy(b.ticket and b.ticket.ticket, "step " .. step .. " has no ticket")
    local x = kjt_of(list[step])
    if device then x = x:to("device") end
    local oa, op = A:forward(b.sparse, b.ticket), P:forward(x)
    assert.same(op:totable(), oa:totable(), "forward " .. step)
    local o = { placement = device and "device" or nil }
    local g = ur.tensor(oa:size(), o):uniform(-1, 1, step)
    A:backward(b.sparse, g, b.ticket)
    P:backward(x, g)
    assert.is_true(b.ticket.retired)
    for _, t in ipairs { "a", "b", "c" } do
      assert.same(P:full_table(t):totable(), A:full_table(t):totable(), t .. " after step " .. step)
    end
  end
  assert.equal(#list, step)
  local cs = A:cache_stats()
  assert.is_true(cs.batches > 0 and cs.hits > 0)
  p:free()
  A:free()
  P:free()
end

describe("a sharded collection through the prefetch pipeline in a world of one", function()
  local plans = { "row_wise", "table_wise", "data_parallel", { a = "row_wise", b = "data_parallel", c = "table_wise" } }
  it("gives cached shards the host shards' outputs and steps, bit for bit, each batch's rows prepared ahead", function()
    for i, plan in ipairs(plans) do
      against(opts("cached", "cpu"), opts("host", "cpu"), batches(h.rng(i), 9, 5), 9, false, plan)
    end
  end)

  h.cuda_it("gives cached shards on the GPU the device shards' outputs and steps, bit for bit", function()
    for i, plan in ipairs(plans) do
      against(opts("cached"), opts("device"), batches(h.rng(i), 64, 5), 64, true, plan)
    end
  end)
end)

describe("cached and managed shards through the prefetch pipeline", function()
  local cases = {
    { 2, "row_wise", "cached" }, { 2, "mixed", "cached" }, { 4, "mixed", "cached" },
    { 2, "mixed", "managed", "1" },
  }
  for _, c in ipairs(cases) do
    local n, plan, place, pages = c[1], c[2], c[3], c[4]
    h.mpi_it(("-n %d %s %s shards: the batch's ticket%s, the losses of the model without the pipeline bit for bit")
       :format(n, plan, place, place == "cached" and " brings its rows into the caches before its forward"
         or " prefetches the managed shards' pages from its exchanged ids"), function()
      local out, err, code = sh(("env PLAN=%s PLACEMENT=%s STEPS=4 PAGES=%s %s launch -n %d "
        .. "spec/support/dist_pipeline.lua"):format(plan, place, pages or "", command.bin(), n))
      h.ranks_ok(n, out, err, code)
      assert.matches("losses [%d.]+ [%d.]+ [%d.]+ [%d.]+", out)
      if place == "cached" then assert.matches("cache: %d+ ids checked in the cache before their forward", out) end
      if pages then assert.matches("pages: [1-9]%d* pages, [1-9]%d* runs prefetched", out) end
    end)
  end

  local runs = dofile("spec/support/dist_runs.lua")
  local mixed = "--set embeddings.sharding=row_wise --set embeddings.tables.C3.sharding=data_parallel "
    .. "--set embeddings.tables.C12.sharding=table_wise "
  -- column shards under dlrm_tiny's rowwise Adagrad take their row sums through the ticket too,
  -- with caches too small for the tables (evictions)
  local columns = "--set embeddings.sharding=column_wise --set embeddings.cache.min_slots=0 "
  for _, c in ipairs { { 2, 20, mixed, "row-wise, table-wise and data-parallel" }, { 4, 8, mixed, "the same" },
                       { 2, 20, columns, "column-wise, evicting" } } do
    local n, steps, sharding = c[1], c[2], c[3]
    h.mpi_it(("`uvmrec launch -n %d train` with cached shards (%s) and train.pipeline: the losses without it bit for "
       .. "bit, one process's within the dist tolerance"):format(n, c[4]), function()
      local d = command.tmpdir()
      local args = TRAIN .. ("--steps %d --set embeddings.placement=cached "):format(steps) .. sharding
      local out, err, code = sh(("%s %s --set train.pipeline=true --out %s/one"):format(command.bin(), args, d))
      assert.equal(0, code, out .. err)
      out, err, code = sh(("%s launch -n %d %s --set train.pipeline=false --out %s/off"):format(command.bin(), n, args,
        d))
      assert.equal(0, code, out .. err)
      out, err, code = sh(("%s launch -n %d %s --set train.pipeline=true --out %s/on"):format(command.bin(), n, args,
        d))
      assert.equal(0, code, out .. err)
      assert.matches("cache: [%d.]+%% of [%d.k]+ distinct rows hit", out)
      local off, coff = events(d .. "/off")
      local on, con = events(d .. "/on")
      assert.equal(steps, #on)
      assert.same(off, on) -- every step's loss, bit for bit
      -- rank 0's shards' caches: the same lookups, hits and misses with the fill ahead
      assert.is_truthy(con and coff)
      assert.same({ coff.hits, coff.unique, coff.misses }, { con.hits, con.unique, con.misses })
      assert.is_true(con.hits > 0)
      local worst, why = runs.compare(d .. "/one", d .. "/on")
      assert.is_truthy(worst, why)
      command.rmdir(d)
    end)
  end

  h.mpi_it("managed shards keep their hint policies per shard through the pipeline; "
     .. "their checkpoints hold logical rows",
     function()
    local d = command.tmpdir()
    local args = TRAIN .. "--steps 12 --set embeddings.placement=managed --set embeddings.sharding=row_wise "
      .. "--set embeddings.tables.C3.sharding=data_parallel --set embeddings.hints.every=5 "
      .. "--set train.checkpoint_every=12 "
    -- hot_prefix lays every shard out hottest first (rows moved) and places its prefix
    local out, err, code = sh(("%s launch -n 2 %s --set train.pipeline=true --out %s/hot"):format(command.bin(), args,
      d))
    assert.equal(0, code, out .. err)
    -- rank 0's 25 row-wise shards and its data-parallel table, each counted and placed
    local moved -- the summary at the end (the first is said at the start)
    local summary = "hints hot_prefix: 26 tables, hot [%d.]+%% of rows[^\n]-relayout [%d.]+ s %(([%d.]+) kB%)\n"
    for kb in out:gmatch(summary) do
      moved = kb
    end
    assert.is_truthy(moved, out)
    assert.is_true(tonumber(moved) > 0)
    out, err, code = sh(("%s launch -n 2 %s --set embeddings.hints.policy=none --set train.pipeline=false "
      .. "--out %s/none"):format(command.bin(), args, d))
    assert.equal(0, code, out .. err)
    assert.same(events(d .. "/none"), events(d .. "/hot"))
    -- the shards' files: every tensor bit for bit, whatever the layout the policy chose
    local dir = "/checkpoints/ckpt-000000000012.shards/"
    for r = 0, 1 do
      local f = ("rank-%05d-of-00002.safetensors"):format(r)
      local a, b = assert(ck.open(d .. "/hot" .. dir .. f)), assert(ck.open(d .. "/none" .. dir .. f))
      local names = a:names()
      assert.same(b:names(), names)
      assert.is_true(#names > 0)
      for _, name in ipairs(names) do
        local x, y = a:view(name), b:view(name)
        assert.same(y:totable(), x:totable(), name)
        x:free()
        y:free()
      end
      a:close()
      b:close()
    end
    command.rmdir(d)
  end)

  h.mpi_it("takes a table's own hint allowance on the rank holding it, not on the others", function()
    -- table-wise, C3 lives on one rank: the other refused its allowance ("hints: table C3 has an
    -- allowance of its own but is not a managed table of the collection") and the launch failed
    local d = command.tmpdir()
    local out, err, code = sh(("%s launch -n 2 %s --steps 2 --set embeddings.placement=managed "
      .. "--set embeddings.tables.C3.hints.allowance=50%% --out %s"):format(command.bin(), TRAIN, d))
    assert.equal(0, code, out .. err)
    command.rmdir(d)
  end)

  h.mpi_it("refuses what the pipeline over ranks still cannot do, naming it", function()
    -- managed collisions: not through the pipeline (nor over ranks), said at the value to change
    local out, err, code = sh(("%s launch -n 2 %s --steps 2 --set train.pipeline=true "
      .. "--set embeddings.collisions.policy=lru"):format(command.bin(), TRAIN))
    assert.is_not.equal(0, code)
    assert.matches("--set train.pipeline=true: train.pipeline: managed collisions run in the plain loop for now",
      out .. err, 1, true)
    -- a rank's cached shards share one cache: column shards narrower than its other tables cannot
    out, err, code = sh(("%s launch -n 2 %s --steps 2 --set train.pipeline=true --set embeddings.placement=cached "
      .. "--set embeddings.optimizer.name=adagrad --set embeddings.tables.C3.sharding=column_wise"):format(
      command.bin(), TRAIN))
    assert.is_not.equal(0, code)
    assert.matches("dist.shard: rank %d's cached table%- and column%-wise shards '[^']+' %(%d+ columns%) and '[^']+' "
      .. "%(%d+%) would share its cache, whose rows have one width: shard table 'C3' another way", out .. err)
  end)
end)
