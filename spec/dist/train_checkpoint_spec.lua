-- Checkpoints of `uvmrec train` over ranks (ranks as processes on the CPU, OpenMPI): every rank
-- writes its shards into RUN/checkpoints/ckpt-<step>.shards (uvmrec.dist.checkpoint), then rank 0
-- publishes ckpt-<step>.safetensors (dense part, optimizer, trainer); train.keep removes both.
-- --resume on the same world size gives the uninterrupted run's losses bit for bit; on another
-- world size, another sharding or in one process (resharding) within docs/distributed.md's 1e-5
-- relative (the dense gradients' all-reduce sums in another order).  SIGINT on launch stops every
-- rank at one step and saves one checkpoint that resumes bit for bit.  Managed shards' access
-- counters resume as the uninterrupted run's on the same world, and merged in one process.
local command = require "command"
local json = require "uvmrec.json"
local ck = require "uvmrec.checkpoint"
local dck = require "uvmrec.dist.checkpoint"

local helpers = require "helpers"

local COMMON = "--cpu --progress none --set train.log_every=1 --set eval.samples=0 --set eval.every=0 "
  .. "--set embeddings.sharding=row_wise"

local function train(prefix, args)
  local out, err, code = command.sh(("%s %s train dlrm_tiny %s %s"):format(command.bin(), prefix, COMMON, args))
  assert.equal(0, code, out .. err)
  return out
end

local losses = helpers.losses

-- The names in a folder, sorted.
local listing = require("uvmrec.lib").dir_list

-- The access counts of a sharded checkpoint folder's files: {tensor name = list} per rank file.
local function shard_counts(folder, world)
  local out = {}
  for r = 0, world - 1 do
    local f = assert(ck.open(("%s/rank-%05d-of-%05d.safetensors"):format(folder, r, world)))
    for _, name in ipairs(f:names()) do
      if name:match("%.counts") then
        local v = assert(f:view(name))
        out[("%d:%s"):format(r, name)] = v:totable()
        v:free()
      end
    end
    f:close()
  end
  return out
end

-- A sharded checkpoint folder's counts per logical table, merged as docs/distributed.md says:
-- a row's count is the sum of the saved counters of it (row blocks, one column block, every
-- data-parallel replica).
local function merged_counts(folder)
  local m = assert(dck.manifest(folder))
  local out = {}
  for name, t in pairs(m.tables) do
    local c = {}
    for i = 1, t.rows do c[i] = 0 end
    for _, d in ipairs(t.counts or {}) do
      local f = assert(ck.open(folder .. "/" .. d.file))
      local v = assert(f:view(d.tensor))
      for i, x in ipairs(v:totable()) do c[d.row0 + i] = c[d.row0 + i] + x end
      v:free()
      f:close()
    end
    out[name] = t.counts and c or nil
  end
  return out
end

describe("uvmrec train over ranks: checkpoints and --resume", function()
  local dir
  before_each(function() dir = command.tmpdir() end)
  after_each(function() command.rmdir(dir) end)

  helpers.mpi_it("saves each step's shards and state, keeps train.keep, "
     .. "resumes bit for bit on 2 ranks and resharded on 1 and 4",
     function()
    train("launch -n 2", "--steps 20 --out " .. dir .. "/whole")
    train("launch -n 2", "--steps 10 --out " .. dir .. "/a --set train.checkpoint_every=4 --set train.keep=2")
    local ckd = dir .. "/a/checkpoints"
    assert.same({ "ckpt-000000000008.safetensors", "ckpt-000000000008.shards", "ckpt-000000000010.safetensors",
                  "ckpt-000000000010.shards" }, listing(ckd))
    assert.same({ "manifest.json", "rank-00000-of-00002.safetensors", "rank-00001-of-00002.safetensors" },
                listing(ckd .. "/ckpt-000000000010.shards"))
    local m = json.decode(command.slurp(ckd .. "/ckpt-000000000010.shards/manifest.json"))
    assert.equal(2, m.world)
    assert.equal(10, m.step)
    for _, d in ipairs { "b", "one", "four", "mixed", "world" } do
      command.sh(("cp -r %s/a %s/%s"):format(dir, dir, d))
    end
    -- the folder of another save under this checkpoint's name (step 8's as step 10's), or a
    -- manifest of another world: refused before anything loads, naming both values (the first
    -- resumed at step 10 with step 8's tables and the tables' step 8)
    local mixed = dir .. "/mixed/checkpoints/ckpt-000000000010.shards"
    command.sh(("rm -rf %s && mv %s/mixed/checkpoints/ckpt-000000000008.shards %s"):format(mixed, dir, mixed))
    local wm = dir .. "/world/checkpoints/ckpt-000000000010.shards/manifest.json"
    local sealed = json.decode(command.slurp(wm))
    sealed.world = 4
    local f = assert(io.open(wm, "wb"))
    f:write(dck.manifest_text(sealed))
    f:close()
    for d, want in pairs { mixed = "manifest.json has step 8, but this file's uvmrec.step is 10; expected one save's",
                           world = "manifest.json has world 4, but this file's component 'shards' world is 2; "
                             .. "expected one save's" } do
      local _, rerr, rcode = command.sh(("%s train dlrm_tiny %s --steps 20 --out %s/%s --resume %s/%s"):format(
        command.bin(), COMMON, dir, d, dir, d))
      assert.is_true(rcode ~= 0, d)
      assert.truthy(rerr:find(want, 1, true), rerr)
    end
    local whole = losses(dir .. "/whole")
    -- the same world size: bit for bit
    train("launch -n 2", "--steps 20 --out " .. dir .. "/b --resume " .. dir .. "/b")
    local b = losses(dir .. "/b")
    for s = 11, 20 do assert.equal(whole[s], b[s], "step " .. s) end
    -- one process, and 4 ranks under another sharding: the rows reassembled, losses within 1e-5
    local out = train("", "--steps 20 --out " .. dir .. "/one --resume " .. dir .. "/one")
    assert.matches("resumed from .*ckpt%-000000000010%.safetensors at step 10", out)
    train("launch -n 4", "--steps 20 --out " .. dir .. "/four --resume " .. dir .. "/four "
      .. "--set embeddings.sharding=table_wise")
    for _, d in ipairs { "one", "four" } do
      local l = losses(dir .. "/" .. d)
      for s = 11, 20 do
        local rel = math.abs(l[s] - whole[s]) / whole[s]
        assert.is_true(rel <= 1e-5, ("%s step %d: %.9g against %.9g"):format(d, s, l[s], whole[s]))
      end
    end
    -- the one-process run's own checkpoint: whole tables, not loadable over ranks
    local _, err, code = command.sh(("%s launch -n 2 train dlrm_tiny %s --steps 30 --resume %s/one"):format(
      command.bin(), COMMON, dir))
    assert.is_true(code ~= 0)
    assert.matches("ckpt%-000000000020%.safetensors was saved by one process %(its tables whole, component "
      .. "'embeddings'%): a run over 2 ranks resumes from checkpoints of runs over ranks", err)
  end)

  helpers.mpi_it("resumes managed shards' access counters: "
     .. "on 2 ranks as the uninterrupted run's, in one process merged", function()
    -- hot_prefix on every managed shard (row-wise, C3 data-parallel, C4 in column blocks), laid
    -- out hottest first at its intervals
    local hints = " --set embeddings.placement=managed --set embeddings.hints.every=3 --set train.checkpoint_every=4"
      .. " --set embeddings.tables.C3.sharding=data_parallel --set embeddings.tables.C4.sharding=column_wise"
    train("launch -n 2", "--steps 8 --out " .. dir .. "/whole" .. hints)
    train("launch -n 2", "--steps 4 --out " .. dir .. "/a" .. hints)
    command.sh(("cp -r %s/a %s/one"):format(dir, dir))
    train("launch -n 2", "--steps 8 --out " .. dir .. "/a --resume " .. dir .. "/a" .. hints)
    -- the same world: every shard's counters (each replica's own) as the uninterrupted run's
    local at8 = "/checkpoints/ckpt-000000000008.shards"
    local whole = shard_counts(dir .. "/whole" .. at8, 2)
    assert.truthy(whole["1:C3.counts.r1"], "rank 1's replica of C3")
    assert.truthy(whole["0:C1.counts"] or whole["0:C1[0:2,0:16].counts"], "rank 0's block of C1")
    local resumed = shard_counts(dir .. "/a" .. at8, 2)
    for name, c in pairs(whole) do assert.same(c, resumed[name], name) end
    for name in pairs(resumed) do assert.truthy(whole[name], name) end
    -- one process: its layout component counts every table as the shards' merged counts
    train("", "--steps 8 --out " .. dir .. "/one --resume " .. dir .. "/one" .. hints)
    local want = merged_counts(dir .. "/whole" .. at8)
    local f = assert(ck.open(dir .. "/one/checkpoints/ckpt-000000000008.safetensors"))
    for k = 1, 26 do
      local name = "C" .. k
      assert.truthy(want[name], name)
      local v = assert(f:view("layout." .. name .. ".counts"))
      assert.same(want[name], v:totable(), name)
      v:free()
    end
    f:close()
  end)

  helpers.mpi_it("stops every rank at one step on SIGINT to launch with one checkpoint that resumes bit for bit",
     function()
    if not helpers.can_signal_launch() then return end
    local fixed = " --set data.samples=10240000"
    local job = command.background(("%s launch -n 2 train dlrm_tiny %s --steps 10000 --out %s/int%s"):format(
      command.bin(), COMMON, dir, fixed), dir .. "/int.log")
    local t0, seen = command.now(), nil
    while not seen and command.now() - t0 < 120 do
      seen = (command.slurp(dir .. "/int/metrics.jsonl") or ""):match('"step":3[,}]')
      if not seen then command.sleep(0.2) end
    end
    assert.is_truthy(seen, ("no step 3 in metrics.jsonl %.0f s after launch: %s"):format(command.now() - t0,
      command.slurp(job.log) or ""))
    command.sh("kill -INT " .. job.pid)
    -- the ranks stop at their next step boundary and save: on a loaded machine that can take a
    -- while, so the wait (which ends as soon as launch does) is long
    local out, code = job:wait(300)
    assert.equal(130, code, out)
    local at = tonumber(out:match("stopped by SIGINT at step (%d+): checkpoint "))
    assert.is_truthy(at, out)
    local ckd = dir .. "/int/checkpoints"
    assert.same({ ("ckpt-%012d.safetensors"):format(at), ("ckpt-%012d.shards"):format(at) }, listing(ckd))
    train("launch -n 2", ("--steps %d --out %s/int --resume %s/int%s"):format(at + 3, dir, dir, fixed))
    train("launch -n 2", ("--steps %d --out %s/whole%s"):format(at + 3, dir, fixed))
    local r, w = losses(dir .. "/int"), losses(dir .. "/whole")
    for s = at + 1, at + 3 do assert.equal(w[s], r[s], "step " .. s) end
  end)

  helpers.mpi_it("stops the job on a SIGINT that comes while the ranks start, before any of them could catch it",
     function()
    if not helpers.can_signal_launch() then return end
    -- as soon as launch made its job folder (in a TMPDIR of this test's): the ranks are not
    -- started yet, or have not reached their loop; each gets the signal when it notes its process
    -- id, and the job ends (130, or killed by it) long before its 10000 steps (100 s here), with
    -- no rank named as failing.  (A SIGINT before launch catches it stops launch itself: 130 too.)
    local tmp = dir .. "/tmp"
    command.sh("mkdir " .. tmp)
    local job = command.background(("env TMPDIR=%s %s launch -n 2 train dlrm_tiny %s --steps 10000 --out %s/early "
      .. "--set data.samples=10240000"):format(tmp, command.bin(), COMMON, dir), dir .. "/early.log")
    local t0 = command.now()
    while command.sh("ls " .. tmp) == "" and command.now() - t0 < 30 do command.sleep(0.02) end
    command.sh("kill -INT " .. job.pid)
    local out, code = job:wait(120)
    assert.is_truthy(code, "launch still running 120 s after SIGINT: " .. out)
    assert.is_true(code ~= 0, out)
    assert.is_nil(out:match("trained 10000 steps"), out)
    assert.is_nil(out:match("uvmrec launch: rank %d+ exited"), out)
  end)
end)
