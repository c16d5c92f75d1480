-- uvmrec.train (lua/uvmrec/train/init.lua) on the CPU: dlrm_tiny trains (the loss falls, the
-- held-out AUC passes 0.70 and stays under the synthetic data's ceiling), the run directory
-- holds the resolved config and the metrics as JSON lines, and every component registered for
-- checkpoints comes back.  Checkpoints and exact resume: a run stopped at step N and resumed to
-- N+M gives the uninterrupted run's losses bit for bit on the CPU, on synthetic data and on
-- Criteo TSV files read in shuffled windows over two epochs (so the loader's position matters);
-- --checkpoint-every and --keep; the config must be the checkpoint's (every difference named);
-- SIGINT and SIGTERM stop at a step boundary with a checkpoint (exit 130 / 143); SIGKILL in the
-- middle of a save leaves the previous checkpoint to resume from; eval --checkpoint gives the
-- trainer's final AUC; Python's safetensors reads a trainer checkpoint; on the GPU a resumed
-- run gives the uninterrupted run's losses too (#cuda).
local ur = require "uvmrec"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local cmd = require "command"
local helpers = require "helpers"
local train = require "uvmrec.train"
local C = ur.C

local SYNTH = { "train.batch_size=256", "eval.samples=4096", "eval.batch_size=4096", "eval.every=0",
                "eval.min_auc=0", "train.log_every=1" }

local function sets_with(base, more)
  local all = {}
  for _, s in ipairs(base) do all[#all + 1] = s end
  for _, s in ipairs(more or {}) do all[#all + 1] = s end
  return all
end

local tiny = helpers.tiny

-- train.run quietly; opts as run's (cpu unless opts.cpu == false).
local function run(sets, opts)
  opts = opts or {}
  opts.progress, opts.print = "none", function() end
  opts.cpu = opts.cpu ~= false
  return train.run(tiny(sets), opts)
end

local function events(dir) return assert(json.read_lines(dir .. "/metrics.jsonl")) end

local losses = helpers.losses -- log_every = 1: every step

local function last_event(dir, kind)
  local found
  for _, e in ipairs(events(dir)) do if e.event == kind then found = e end end
  return found
end

-- Every step from..to has a loss in both, bit for bit equal.
local function same_losses(want, got, from, to)
  for s = from, to do
    assert.is_number(want[s], "uninterrupted step " .. s)
    assert.is_number(got[s], "resumed step " .. s)
    if want[s] ~= got[s] then
      error(("step %d: the uninterrupted run's loss is %.17g, the resumed run's %.17g"):format(s, want[s], got[s]), 2)
    end
  end
end

local function steps_of(dir)
  local out = {}
  for _, c in ipairs(assert(ck.list(dir))) do out[#out + 1] = c.step end
  return out
end

local function trainer_meta(path)
  local f = assert(ck.open(path))
  local m = assert(json.decode(f:meta("uvmrec.meta.trainer")))
  f:close()
  return m
end

-- Criteo TSV rows (label, 13 integers, 26 hex ids; some fields empty) from a Park-Miller
-- generator, ids drawn from a few hundred per column so rows repeat and training learns.
local function write_tsv(path, rows, seed)
  local x = seed
  local function rand(n)
    x = x * 16807 % 2147483647
    return x % n
  end
  local f = assert(io.open(path, "w"))
  for _ = 1, rows do
    local fields = { tostring(rand(4) == 0 and 1 or 0) }
    for i = 1, 13 do fields[i + 1] = rand(10) == 0 and "" or tostring(rand(1000)) end
    for i = 1, 26 do fields[i + 14] = rand(20) == 0 and "" or ("%08x"):format(rand(300) * 7919 + i * 104729) end
    f:write(table.concat(fields, "\t"), "\n")
  end
  f:close()
end

local function tsv_sets(dir)
  write_tsv(dir .. "/train.tsv", 1000, 11)
  write_tsv(dir .. "/eval.tsv", 300, 12)
  -- 10 batches an epoch (the last of 100 rows too), windows of 256 rows shuffled by (epoch,
  -- window): the next batch depends on where in which epoch the run stopped.
  return { "data.train=criteo-tsv:" .. dir .. "/train.tsv", "data.eval=criteo-tsv:" .. dir .. "/eval.tsv",
           "train.steps=0", "train.epochs=2", "train.batch_size=100", "data.shuffle_window=256",
           "eval.samples=0", "eval.every=0", "eval.min_auc=0", "train.log_every=1" }
end

-- The uvmrec command in the background, with job control so SIGINT reaches it as from a
-- terminal (a shell's background jobs otherwise ignore it), and SIGINT and SIGTERM set back to
-- their defaults (a runner started in the background passes them down ignored, which the
-- command keeps, as nohup asks).  env: "NAME=value " prefixes.
local function spawn(args, env, dir)
  local out, err = dir .. "/child.out", dir .. "/child.err"
  local script = ("set -m\n%s env --default-signal=INT,TERM %s %s > %s 2> %s &\necho $!\nwait $!\n"
    .. "echo \"rc=$?\"\n"):format(env or "", cmd.quote(cmd.bin()), args, cmd.quote(out), cmd.quote(err))
  local p = io.popen("bash -c " .. cmd.quote(script) .. " 2>/dev/null")
  local pid = tonumber(p:read("*l"))
  assert(pid, "no pid from the child's shell")
  return { p = p, pid = pid, out = out, err = err }
end

local function alive(pid) return os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0 end

-- The child's exit code, stdout and stderr; a child still running after `timeout` seconds is
-- killed and the spec fails (it never hangs the suite).
local function finish(child, timeout)
  local t0 = cmd.now()
  while alive(child.pid) do
    if cmd.now() - t0 > (timeout or 120) then
      os.execute("kill -KILL " .. child.pid)
      child.p:close()
      error(("the child %d was still running after %d s; killed"):format(child.pid, timeout or 120), 2)
    end
    cmd.sleep(0.05)
  end
  local rest = child.p:read("*a")
  child.p:close()
  return tonumber(rest:match("rc=(%d+)")), cmd.slurp(child.out) or "", cmd.slurp(child.err) or ""
end

local function wait_for(what, fn, timeout)
  local t0 = cmd.now()
  while not fn() do
    if cmd.now() - t0 > (timeout or 60) then error("timed out waiting for " .. what, 2) end
    cmd.sleep(0.05)
  end
end

local function train_lines(dir)
  local f = io.open(dir .. "/metrics.jsonl")
  if not f then return 0 end
  local n = 0
  for l in f:lines() do if l:find('"event":"train"', 1, true) then n = n + 1 end end
  f:close()
  return n
end

describe("uvmrec train checkpoints", function()
  local dir
  before_each(function() dir = cmd.tmpdir() end)
  after_each(function() cmd.rmdir(dir) end)

  it("resumes synthetic data to a later --steps with the uninterrupted run's losses, bit for bit", function()
    local whole = assert(run(sets_with(SYNTH, { "train.steps=24" }), { out = dir .. "/whole" }))
    assert.is_nil(whole.checkpoint)
    local first = assert(run(sets_with(SYNTH, { "train.steps=10", "train.checkpoint_every=5" }), { out = dir .. "/r" }))
    assert.equal(dir .. "/r/checkpoints/ckpt-000000000010.safetensors", first.checkpoint)
    assert.same({ 5, 10 }, steps_of(dir .. "/r/checkpoints"))
    assert.same({ step = 10, samples = 2560, position = { epoch = 0, sample = 2560 } },
                trainer_meta(first.checkpoint))
    -- the run directory goes on: its log holds steps 1..10, then 11..24
    local rest = assert(run(sets_with(SYNTH, { "train.steps=24" }), { out = dir .. "/r", resume = dir .. "/r" }))
    assert.same({ 10, first.checkpoint }, { rest.resumed.step, rest.resumed.path })
    assert.is_true(rest.resumed.seconds >= 0)
    assert.same({ 24, 24 * 256 }, { rest.steps, rest.samples })
    local want, n = losses(dir .. "/whole")
    local got, m = losses(dir .. "/r")
    assert.same({ 24, 24 }, { n, m })
    same_losses(want, got, 1, 24)
    assert.equal(whole.eval.auc, rest.eval.auc)
    assert.equal(whole.eval.logloss, rest.eval.logloss)
    local start = events(dir .. "/r")
    local resumed_start
    for _, e in ipairs(start) do if e.event == "start" and e.resumed_from then resumed_start = e end end
    assert.same({ first.checkpoint, 10 }, { resumed_start.resumed_from, resumed_start.step })
  end)

  it("resumes managed collisions exactly: the maps, their counts and the reset rows", function()
    -- ids from a space 10x the capped tables, drifting: rounds evict, and rows are reset
    local spec = dir .. "/wide.yaml"
    cmd.spit(spec, "synthetic: {preset: tiny, id_space_factor: 10, drift: 0.002}\n")
    local sets = sets_with(SYNTH, { "data.train=synthetic:" .. spec, "embeddings.max_rows=60",
                                    "embeddings.collisions.policy=lfu", "embeddings.collisions.evict_every=3",
                                    "data.samples=4096" })
    local whole = assert(run(sets_with(sets, { "train.steps=16" }), { out = dir .. "/whole" }))
    assert.is_true(whole.collisions.evictions > 0, "rounds evicted ids")
    local first = assert(run(sets_with(sets, { "train.steps=7", "train.checkpoint_every=7" }), { out = dir .. "/r" }))
    local f = assert(ck.open(first.checkpoint))
    local names = {}
    for _, n in ipairs(f:names()) do names[n] = true end
    f:close()
    assert.truthy(names["collisions.C16.ids"] and names["collisions.C16.cand_ids"], "the maps are saved")
    local rest = assert(run(sets_with(sets, { "train.steps=16", "train.checkpoint_every=16" }),
                            { out = dir .. "/r", resume = dir .. "/r" }))
    same_losses(losses(dir .. "/whole"), losses(dir .. "/r"), 1, 16)
    assert.equal(whole.eval.auc, rest.eval.auc)
    for _, k in ipairs { "resident", "candidates", "lookups", "fallback_lookups", "rounds", "admissions",
                         "evictions" } do
      assert.equal(whole.collisions[k], rest.collisions[k], k)
    end
    local c = last_event(dir .. "/r", "collisions")
    assert.same({ 16, whole.collisions.evictions }, { c.step, c.evictions })
    assert.is_number(c.tables.C3.resident_share)
    -- evaluating the checkpoint only looks up: the trainer's final AUC
    local ev = assert(train.eval(tiny(sets_with(sets, { "train.steps=16" })),
                                 { checkpoint = rest.checkpoint, cpu = true, print = function() end }))
    assert.equal(rest.eval.auc, ev.eval.auc)
  end)

  it("hands tables with managed collisions raw ids and takes the others' modulo their rows", function()
    local spec = dir .. "/wide2.yaml"
    cmd.spit(spec, "synthetic: {preset: tiny, id_space_factor: 10}\n")
    local cfg = tiny(sets_with(SYNTH, { "data.train=synthetic:" .. spec, "embeddings.max_rows=60", "train.steps=2",
                                        "embeddings.collisions.policy=lfu",
                                        "embeddings.tables.C16.collisions.policy=none" }))
    local rows = train.config.table_rows(cfg)
    local d = assert(train.data(cfg, rows))
    assert.same({ 0, rows[16] }, { d.train.rows[15], d.train.rows[16] })
    assert.same(d.train.rows, d.eval.rows, "the held-out samples as the training ones")
    local l = assert(ur.data.loader(d.train))
    local k = assert(l:next()).sparse:to_dict()
    local raw, modulo = 0, 0
    for _, v in ipairs(k.C15.values:totable()) do raw = math.max(raw, v) end
    for _, v in ipairs(k.C16.values:totable()) do modulo = math.max(modulo, v) end
    assert.is_true(raw >= rows[15], ("C15's raw ids pass its %d rows (largest %d)"):format(rows[15], raw))
    assert.is_true(modulo < rows[16], ("C16's ids lie within its %d rows (largest %d)"):format(rows[16], modulo))
    l:close()
  end)

  it("refuses day files convert reduced when every table keeps raw ids (managed collisions), naming day and table",
    function()
    local days = cmd.tmpdir()
    assert(ur.data.convert({ helpers.fixture("criteo_raw_sample.tsv") }, days, { rows = 1000 }))
    local cfg = tiny { "data.train=criteo-bin:" .. days, "embeddings.collisions.policy=lfu", "train.steps=2",
                       "eval.samples=0", "train.batch_size=64" }
    local r, err = train.run(cfg, { out = days .. "/run", progress = "none", cpu = true, print = function() end })
    assert.is_nil(r)
    assert.equal("criteo-bin: " .. days .. "/day_0's ids of C1 were taken mod 1000 (uvmrec convert --rows; "
      .. "day_0_sparse_rows.npy) but are read raw (the table keeps its raw ids: managed collisions): the model "
      .. "would not see the rows its served raw ids map to; convert again with these rows (--config or --rows) or "
      .. "without --rows", err)
    cmd.rmdir(days)
  end)

  it("resumes Criteo TSV files mid-window and in the second epoch at the loader's position", function()
    local sets = tsv_sets(dir)
    local whole = assert(run(sets_with(sets, { "train.checkpoint_every=7" }), { out = dir .. "/whole" }))
    assert.equal(20, whole.steps)
    local cks = dir .. "/whole/checkpoints"
    assert.same({ 7, 14, 20 }, steps_of(cks), "every 7 steps and at the end")
    assert.same({ epoch = 0, sample = 700 }, trainer_meta(ck.path_for(cks, 7)).position)
    assert.same({ epoch = 1, sample = 400 }, trainer_meta(ck.path_for(cks, 14)).position)
    local want = losses(dir .. "/whole")
    for _, at in ipairs { 7, 14 } do
      local out = dir .. "/from" .. at
      local rest = assert(run(sets, { out = out, resume = ck.path_for(cks, at) }))
      assert.equal(20, rest.steps)
      local got, n = losses(out)
      assert.equal(20 - at, n)
      same_losses(want, got, at + 1, 20)
      assert.equal(whole.eval.auc, rest.eval.auc)
    end
    -- one epoch, then the second added by a resume: train.epochs is how long the run goes
    local one = dir .. "/one"
    local first = assert(run(sets_with(sets, { "train.epochs=1", "train.checkpoint_every=10" }), { out = one }))
    assert.equal(10, first.steps)
    assert.equal(20, assert(run(sets, { out = one, resume = one })).steps)
    same_losses(want, losses(one), 1, 20)
    -- Starting the data over instead of at the saved position changes the very next loss.
    local wrong = assert(run(sets, { out = dir .. "/wrong", resume = ck.path_for(cks, 7), setup = function(ctx)
      local trainer = ctx.registry.by_name.trainer
      local load = trainer.load
      trainer.load = function(ts, meta)
        load(ts, meta)
        ctx.position = { epoch = 0, sample = 0 }
      end
    end }))
    assert.equal(7 + 20, wrong.steps, "both epochs again after step 7")
    assert.are_not.equal(want[8], losses(dir .. "/wrong")[8])
  end)

  it("resumes through the prefetch pipeline, cached tables too, at the trained batches' position", function()
    -- The pipeline reads batches ahead: the checkpoint must hold the position after the last
    -- batch trained, not the loader's.
    local cached = { "train.pipeline=true", "embeddings.placement=cached", "embeddings.cache.load_factor=0.1" }
    for _, extra in ipairs { { "train.pipeline=true" }, cached } do
      local sets = sets_with(SYNTH, extra)
      cmd.rmdir(dir)
      dir = cmd.tmpdir()
      assert(run(sets_with(sets, { "train.steps=16" }), { out = dir .. "/whole" }))
      assert(run(sets_with(sets, { "train.steps=8", "train.checkpoint_every=4" }), { out = dir .. "/r" }))
      assert.same({ epoch = 0, sample = 4 * 256 }, trainer_meta(ck.path_for(dir .. "/r/checkpoints", 4)).position)
      local r = assert(run(sets_with(sets, { "train.steps=16" }),
                           { out = dir .. "/from4", resume = ck.path_for(dir .. "/r/checkpoints", 4) }))
      assert.equal(16, r.steps)
      same_losses(losses(dir .. "/whole"), losses(dir .. "/from4"), 5, 16)
    end
    -- where the rows live may change on a resume: cached tables with the pipeline go on as host tables
    assert(run(sets_with(SYNTH, { "train.steps=16" }),
               { out = dir .. "/host", resume = ck.path_for(dir .. "/r/checkpoints", 4) }))
    assert(run(sets_with(SYNTH, { "train.steps=16" }), { out = dir .. "/hostwhole" }))
    same_losses(losses(dir .. "/hostwhole"), losses(dir .. "/host"), 5, 16)
  end)

  it("keeps the newest --keep checkpoints and saves at the end", function()
    local r = assert(run(sets_with(SYNTH, { "train.steps=9", "train.checkpoint_every=2", "train.keep=2" }),
                         { out = dir .. "/k" }))
    assert.same({ 8, 9 }, steps_of(dir .. "/k/checkpoints"))
    assert.equal(ck.path_for(dir .. "/k/checkpoints", 9), r.checkpoint)
    local saves = {}
    for _, e in ipairs(events(dir .. "/k")) do
      if e.event == "checkpoint" then saves[#saves + 1] = e.step .. ":" .. e.reason end
    end
    assert.same({ "2:every", "4:every", "6:every", "8:every", "9:end" }, saves)
    assert.is_true(last_event(dir .. "/k", "checkpoint").bytes > 1e6)
    -- a run starting before the folder's newest checkpoint (a fresh one, or one resumed from an
    -- older file) is refused before it writes: its saves would be removed by --keep as the older
    -- ones (they were, right after each save), and --resume of the folder would take the others
    local ckd = dir .. "/k/checkpoints"
    local lines = #events(dir .. "/k")
    local _, err = run(sets_with(SYNTH, { "train.steps=9", "train.checkpoint_every=2" }), { out = dir .. "/k" })
    assert.equal("--out: " .. ckd .. " holds a checkpoint at step 9 (" .. ck.path_for(ckd, 9) .. "), past step 0 "
      .. "where this run starts: its checkpoints would mix with those (--keep removing its own as the older ones, "
      .. "--resume taking theirs); give another --out, or resume the newest", err)
    _, err = run(sets_with(SYNTH, { "train.steps=12" }), { out = dir .. "/k", resume = ck.path_for(ckd, 8) })
    assert.matches("holds a checkpoint at step 9 .*, past step 8 where this run starts %(resumed from "
      .. ck.path_for(ckd, 8):gsub("%p", "%%%0") .. "%)", err)
    assert.same({ 8, 9 }, steps_of(ckd))
    assert.equal(lines, #events(dir .. "/k"))
    -- a checkpoints folder that cannot be written into fails the run before its first step
    cmd.sh("mkdir -p " .. dir .. "/f && touch " .. dir .. "/f/checkpoints")
    _, err = run(sets_with(SYNTH, { "train.steps=9", "train.checkpoint_every=4" }), { out = dir .. "/f" })
    assert.equal("train.checkpoint_every is 4: checkpoints cannot be saved into " .. dir .. "/f/checkpoints (dir: "
      .. dir .. "/f/checkpoints exists and is not a directory)", err)
    assert.is_false(cmd.exists(dir .. "/f/metrics.jsonl"))
    assert(run(sets_with(SYNTH, { "train.steps=12" }), { out = dir .. "/k", resume = dir .. "/k" }))
    assert.same({ 10, 12 }, steps_of(ckd))
  end)

  it("names every config key that differs from the checkpoint's, and what is missing", function()
    assert(run(sets_with(SYNTH, { "train.steps=3", "train.checkpoint_every=3" }), { out = dir .. "/c" }))
    local path = ck.path_for(dir .. "/c/checkpoints", 3)
    local r, err = run(sets_with(SYNTH, { "train.steps=6", "train.batch_size=128", "model.bottom_mlp=32,16",
                                          "eval.samples=100", "train.checkpoint_every=0" }),
                       { resume = dir .. "/c" })
    assert.is_nil(r)
    assert.equal("--resume: checkpoint " .. path .. ": config differs at 2 keys: model.bottom_mlp[1] (the " ..
      "checkpoint has 64, this run has 32), train.batch_size (the checkpoint has 256, this run has 128)", err)
    -- A key the checkpoint's config lacks (added to the schema since it was written) counts as
    -- its default; a value the checkpoint has is compared.
    local old = json.decode(json.encode(tiny(sets_with(SYNTH, { "train.steps=3" }))))
    old.train.keep, old.embeddings.dtype, old.data = nil, nil, nil
    local filled = train.fill_defaults(old)
    assert.same({ 0, "f32", "", 4 },
                { filled.train.keep, filled.embeddings.dtype, filled.data.train, filled.data.depth })
    -- the same through a resume: a schema grown by a key after the checkpoint was written
    local fields = train.config.schema.fields.train.fields
    fields.added_since = require("uvmrec.config").int { default = 7 }
    local ok1, r1 = pcall(run, sets_with(SYNTH, { "train.steps=4" }), { resume = dir .. "/c" })
    local ok2, r2, e2 = pcall(run, sets_with(SYNTH, { "train.steps=4", "train.added_since=8" }),
                              { resume = dir .. "/c" })
    fields.added_since = nil
    assert.is_true(ok1, r1)
    assert.is_truthy(r1, "a key added since, at its default, is no difference")
    assert.is_true(ok2, r2)
    assert.is_nil(r2)
    assert.matches("config differs at 1 key: train.added_since %(the checkpoint has 7, this run has 8%)$", e2)
    r, err = run(SYNTH, { resume = dir .. "/nothing" })
    assert.is_nil(r)
    assert.equal("--resume: checkpoint: " .. dir .. "/nothing is neither a run directory nor a checkpoint file", err)
    r, err = run(SYNTH, { resume = dir })
    assert.is_nil(r)
    assert.equal("--resume: checkpoint: the run directory " .. dir .. " holds no checkpoint (ckpt-N.safetensors)", err)
    r, err = run(sets_with(SYNTH, { "train.steps=3", "train.checkpoint_every=3" }))
    assert.is_nil(r)
    assert.equal("train.checkpoint_every is 3: checkpoints need a run directory (--out RUNDIR)", err)
    -- --keep without a run directory has nothing to keep (with one, it keeps what a signal saves)
    r, err = run(sets_with(SYNTH, { "train.steps=3", "train.keep=2" }))
    assert.is_nil(r)
    assert.equal("train.keep is 2: checkpoints need a run directory (--out RUNDIR)", err)
    -- a table's own settings are compared but for where its rows live: its managed collisions
    -- (raw ids through the checkpoint's map) are no setting to drop or add on a resume
    local mc = { "train.steps=3", "train.checkpoint_every=3", "embeddings.tables.C3.collisions.policy=lru" }
    assert(run(sets_with(SYNTH, mc), { out = dir .. "/mc" }))
    r, err = run(sets_with(SYNTH, { "train.steps=4" }), { resume = dir .. "/mc" })
    assert.is_nil(r)
    assert.matches("config differs at 1 key: embeddings.tables.C3.collisions.policy %(the checkpoint has \"lru\", "
      .. "this run has nothing%)$", err)
    assert(run(sets_with(SYNTH, { "train.steps=4", "embeddings.tables.C3.collisions.policy=lru",
                                  "embeddings.tables.C3.placement=managed", "embeddings.tables.C5.placement=managed" }),
               { resume = dir .. "/mc" }))
    r, err = run(sets_with(SYNTH, { "train.steps=4", "embeddings.tables.C5.collisions.policy=lru" }),
                 { resume = dir .. "/c" })
    assert.is_nil(r)
    assert.matches("config differs at 1 key: embeddings.tables.C5.collisions.policy %(the checkpoint has nothing, "
      .. "this run has \"lru\"%)$", err)
    -- the trainer's, the optimizer's and the tables' steps, edited by hand, are named (they failed in
    -- arithmetic, or at the first step after the resume)
    local st = assert(ck.load(path))
    for comp, text in pairs { trainer = '{"samples":768}', optimizer = '{"step":"3"}', embeddings = '{"step":-1}' } do
      local meta = {}
      for k, v in pairs(st.meta) do meta[k] = v end
      meta["uvmrec.meta." .. comp] = text
      local edited = dir .. "/edited.safetensors"
      assert(ck.save(edited, { tensors = st.tensors, meta = meta }))
      r, err = run(sets_with(SYNTH, { "train.steps=6" }), { resume = edited })
      assert.is_nil(r)
      assert.matches("^%-%-resume: checkpoint .*/edited.safetensors: the meta of component '" .. comp .. "' has "
        .. ".*step.*; expected a whole number >= 0$", err)
    end
    -- its components not a list of names: "init.lua:320: bad argument #1 to 'ipairs' (table expected,
    -- got number)" (5), "... got string" ("shards"), read before the registry's own checks
    for _, c in ipairs { { "5", "5" }, { '"shards"', '"shards"' }, { "[null]", nil, 1 } } do
      local meta = {}
      for k, v in pairs(st.meta) do meta[k] = v end
      meta["uvmrec.components"] = c[1]
      local edited = dir .. "/components.safetensors"
      assert(ck.save(edited, { tensors = st.tensors, meta = meta }))
      local want = ("checkpoint %s: uvmrec.components%s is %s; expected a JSON list of strings (the names of its "
        .. "components)"):format(edited, c[3] and ("[" .. c[3] .. "]") or "", c[2] or "null")
      r, err = run(sets_with(SYNTH, { "train.steps=6" }), { resume = edited })
      assert.is_nil(r)
      assert.equal("--resume: " .. want, err)
      local ok, er, eerr = pcall(train.eval, tiny(sets_with(SYNTH, { "train.steps=6" })),
                                 { checkpoint = edited, cpu = true, print = function() end })
      assert.is_true(ok, tostring(er))
      assert.is_nil(er)
      assert.truthy(tostring(eerr):find(want, 1, true), tostring(eerr))
    end
  end)

  it("stops at the step boundary after the interrupt flag rises, saving a checkpoint there", function()
    local flag = { after = function(_, at) if at.step == 6 then C.ur_interrupt_set(1) end end }
    local r = assert(run(sets_with(SYNTH, { "train.steps=50" }), { out = dir .. "/i", hooks = { flag } }))
    assert.same({ signal = 0, name = "the interrupt flag", step = 6 }, r.interrupted)
    assert.equal(6, r.steps)
    assert.is_nil(r.eval, "no final evaluation after a stop")
    assert.equal(0, C.ur_interrupt_get(), "the flag is down again")
    assert.same({ 6 }, steps_of(dir .. "/i/checkpoints"))
    assert.same({ "signal", 6 }, { last_event(dir .. "/i", "checkpoint").reason,
                                   last_event(dir .. "/i", "interrupted").step })
    assert.is_nil(last_event(dir .. "/i", "final"))
    -- a resume with nowhere further to go trains nothing and saves nothing again
    local again = assert(run(sets_with(SYNTH, { "train.steps=6", "train.checkpoint_every=2" }),
                             { out = dir .. "/i", resume = dir .. "/i" }))
    assert.same({ 6, 6 * 256 }, { again.steps, again.samples })
    assert.is_nil(again.checkpoint)
    assert.same({ 6 }, steps_of(dir .. "/i/checkpoints"))
    -- going on from there gives the losses of a run that was never stopped
    assert(run(sets_with(SYNTH, { "train.steps=9" }), { out = dir .. "/i", resume = dir .. "/i" }))
    assert(run(sets_with(SYNTH, { "train.steps=9" }), { out = dir .. "/w" }))
    same_losses(losses(dir .. "/w"), losses(dir .. "/i"), 1, 9)
  end)

  describe("through the uvmrec command", function()
    local args = "train dlrm_tiny --cpu --progress lines --set train.batch_size=256 --set eval.samples=4096 " ..
                 "--set eval.min_auc=0 --set train.log_every=1"

    for _, c in ipairs { { "INT", 130, "SIGINT" }, { "TERM", 143, "SIGTERM" } } do
      it("saves a checkpoint at the next step boundary on SIG" .. c[1] .. " and exits " .. c[2], function()
        local rd = dir .. "/run"
        local child = spawn(args .. " --steps 100000 --out " .. cmd.quote(rd), nil, dir)
        wait_for("three steps", function() return train_lines(rd) >= 3 end)
        assert(os.execute("kill -" .. c[1] .. " " .. child.pid) == 0)
        local rc, out, err = finish(child)
        assert.equal(c[2], rc, out .. err)
        local k = tonumber(out:match("stopped by " .. c[3] .. " at step (%d+): checkpoint "))
        assert(k and k >= 3, out)
        local path = ck.path_for(rd .. "/checkpoints", k)
        assert.matches("stopped by " .. c[3] .. " at step " .. k .. ": checkpoint " .. path:gsub("%p", "%%%0") ..
          "; go on with %-%-resume " .. rd:gsub("%p", "%%%0") .. "\n", out)
        assert.equal(path, ck.latest(rd .. "/checkpoints"))
        assert.same({ "interrupted", k, c[2] - 128 }, (function()
          local e = events(rd)[#events(rd)]
          return { e.event, e.step, e.signal }
        end)())
        if c[1] == "TERM" then return end
        -- resumed to k + 3 steps: the losses of a run never stopped
        local out2, err2, rc2 = cmd.run(args .. " --steps " .. (k + 3) .. " --resume " .. cmd.quote(rd))
        assert.equal(0, rc2, out2 .. err2)
        assert.matches("resumed from " .. path:gsub("%p", "%%%0") .. " at step " .. k, out2)
        assert(run(sets_with(SYNTH, { "train.steps=" .. (k + 3) }), { out = dir .. "/whole" }))
        same_losses(losses(dir .. "/whole"), losses(rd), 1, k + 3)
      end)
    end

    it("leaves the previous checkpoint to resume from when killed in the middle of a save", function()
      local rd = dir .. "/run"
      local base = args .. " --checkpoint-every 3 --keep 3 --out " .. cmd.quote(rd)
      local out, err, rc = cmd.run(base .. " --steps 6")
      assert.equal(0, rc, out .. err)
      assert.same({ 3, 6 }, steps_of(rd .. "/checkpoints"))
      local before = cmd.slurp(ck.path_for(rd .. "/checkpoints", 6))
      local child = spawn(base .. " --steps 12 --resume " .. cmd.quote(rd), "UVMREC_CHECKPOINT_TEST_DELAY=60 ", dir)
      -- The save of step 9 has written and synced its temporary file and waits to rename it.
      wait_for("the delayed save", function() return (cmd.slurp(child.err) or ""):find("TEST_DELAY", 1, true) end)
      assert(os.execute("kill -KILL " .. child.pid) == 0)
      local krc, _, kerr = finish(child)
      assert.equal(128 + 9, krc)
      local tmp = kerr:match("UVMREC_CHECKPOINT_TEST_DELAY: (%S+ckpt%-000000000009%.safetensors%.tmp%-%w+) is complete")
      assert(tmp, kerr)
      assert.equal(1, C.ur_path_kind(tmp), "the killed save's temporary file is still there")
      assert.equal(ck.path_for(rd .. "/checkpoints", 6), train.checkpoint_file(rd))
      assert.equal(before, cmd.slurp(ck.path_for(rd .. "/checkpoints", 6)))
      -- Resuming from the run directory takes step 6 and gets to 12 as if never killed; the
      -- rotation clears the stale temporary file.
      out, err, rc = cmd.run(base .. " --steps 12 --resume " .. cmd.quote(rd))
      assert.equal(0, rc, out .. err)
      assert.matches("resumed from .*ckpt%-000000000006%.safetensors at step 6", out)
      assert.equal(0, C.ur_path_kind(tmp))
      assert.same({ 6, 9, 12 }, steps_of(rd .. "/checkpoints"))
      assert(run(sets_with(SYNTH, { "train.steps=12" }), { out = dir .. "/whole" }))
      same_losses(losses(dir .. "/whole"), losses(rd), 1, 12)
    end)

    it("evaluates a checkpoint with eval --checkpoint to the trainer's final AUC", function()
      local rd = dir .. "/run"
      local out, err, rc = cmd.run(args .. " --steps 20 --checkpoint-every 10 --out " .. cmd.quote(rd))
      assert.equal(0, rc, out .. err)
      local final = last_event(rd, "final")
      local ev = "eval dlrm_tiny --cpu --data synthetic:tiny --set train.steps=20 --set train.batch_size=256 " ..
                 "--set eval.samples=4096"
      out, err, rc = cmd.run(ev .. " --checkpoint " .. cmd.quote(rd) .. " --out " .. cmd.quote(dir .. "/e"))
      assert.equal(0, rc, out .. err)
      assert.matches("\nweights: " .. ck.path_for(rd .. "/checkpoints", 20):gsub("%p", "%%%0") .. " %(step 20%)\n", out)
      local e = last_event(dir .. "/e", "eval")
      assert.equal(final.auc, e.auc)
      assert.equal(20, e.step)
      assert.equal(4096, e.samples)
      -- the file itself does the same; without weights the AUC is the untrained model's
      out, err, rc = cmd.run(ev .. " --checkpoint " .. cmd.quote(ck.path_for(rd .. "/checkpoints", 20)) ..
                             " --out " .. cmd.quote(dir .. "/f"))
      assert.equal(0, rc, out .. err)
      assert.equal(final.auc, last_event(dir .. "/f", "eval").auc)
      out, err, rc = cmd.run(ev .. " --out " .. cmd.quote(dir .. "/g"))
      assert.equal(0, rc, out .. err)
      assert.are_not.equal(final.auc, last_event(dir .. "/g", "eval").auc)
      -- another dense optimizer does not matter; a model of another shape is refused, naming the keys
      out, err, rc = cmd.run(ev .. " --set optimizer.name=sgd --checkpoint " .. cmd.quote(rd) ..
                             " --out " .. cmd.quote(dir .. "/h"))
      assert.equal(0, rc, out .. err)
      assert.equal(final.auc, last_event(dir .. "/h", "eval").auc)
      out, err, rc = cmd.run(ev .. " --set embeddings.dim=8 --set model.bottom_mlp=64,8 --checkpoint " .. cmd.quote(rd))
      assert.equal(1, rc, out)
      assert.matches("^uvmrec eval: %-%-checkpoint: checkpoint .*: config differs at 2 keys: embeddings.dim %(the " ..
        "checkpoint has 16, this run has 8%), model.bottom_mlp%[2%]", err)
    end)
  end)

  it("writes checkpoints Python's safetensors reads back to the same values (make pydeps)", function()
    local py = helpers.python("import safetensors")
    if not py then pending("Python's safetensors is not installed (make pydeps)") return end
    local r = assert(run(sets_with(SYNTH, { "train.steps=4", "train.checkpoint_every=4", "embeddings.max_rows=40" }),
                         { out = dir .. "/p" }))
    local p = io.popen(py .. " scripts/bench/read_safetensors.py --max-values 100000 " .. cmd.quote(r.checkpoint)
                       .. " 2>&1")
    local text = p:read("*a")
    p:close()
    local got = assert(json.decode(text), text)
    local mine = assert(ck.load(r.checkpoint))
    local n = 0
    for name, t in pairs(mine.tensors) do
      n = n + 1
      local e = got.tensors[name]
      assert.is_table(e, name)
      assert.equal(t:dtype():upper(), e.dtype)
      assert.same(t:size(), e.shape)
      local flat = {}
      local function walk(v)
        if type(v) ~= "table" then flat[#flat + 1] = v return end
        for _, x in ipairs(v) do walk(x) end
      end
      walk(t:totable())
      assert.same(flat, e.values, name)
    end
    local names = {}
    for name in pairs(got.tensors) do names[#names + 1] = name end
    assert.equal(n, #names)
    assert.equal("4", got.metadata["uvmrec.step"])
    local comps = assert(json.decode(got.metadata["uvmrec.components"]))
    assert.same({ "dense", "embeddings", "optimizer", "trainer" }, { unpack(comps, 1, 4) }) -- others may follow
    assert.same(mine.meta, got.metadata)
    assert.truthy(got.tensors["dense.top.3.weight"] and got.tensors["embeddings.C16"]
                  and got.tensors["embeddings.C16.sum"] and got.tensors["optimizer.top.3.weight.state1"])
  end)
end)

describe("uvmrec train checkpoints on the GPU", function()
  local dir
  before_each(function() dir = cmd.tmpdir() end)
  after_each(function() cmd.rmdir(dir) end)

  -- Exact when the GPU repeats itself bit for bit (two uninterrupted runs agree), which the
  -- kernels are written to do; within 2e-4 of the loss otherwise.
  local function check(sets, stop_at, total, what)
    assert(run(sets_with(sets, { "train.steps=" .. total }), { out = dir .. "/a", cpu = false }))
    assert(run(sets_with(sets, { "train.steps=" .. total }), { out = dir .. "/b", cpu = false }))
    local a, b = losses(dir .. "/a"), losses(dir .. "/b")
    local exact = true
    for s = 1, total do exact = exact and a[s] == b[s] end
    assert(run(sets_with(sets, { "train.steps=" .. stop_at, "train.checkpoint_every=" .. stop_at }),
               { out = dir .. "/r", cpu = false }))
    local r = assert(run(sets_with(sets, { "train.steps=" .. total }),
                         { out = dir .. "/r", resume = dir .. "/r", cpu = false }))
    assert.equal(stop_at, r.resumed.step)
    local got = losses(dir .. "/r")
    for s = 1, total do
      if exact then
        assert.equal(a[s], got[s], ("%s: step %d (the GPU repeats itself exactly)"):format(what, s))
      else
        helpers.near(got[s], a[s], 2e-4, ("%s: step %d (two uninterrupted GPU runs differ)"):format(what, s))
      end
    end
    return exact
  end

  helpers.cuda_it("resumes on the GPU with the uninterrupted run's losses (synthetic data)", function()
    check(SYNTH, 8, 16, "synthetic")
  end)

  helpers.cuda_it("resumes on the GPU through the prefetch pipeline with cached tables", function()
    local cached = { "train.pipeline=true", "embeddings.placement=cached", "embeddings.cache.load_factor=0.1" }
    check(sets_with(SYNTH, cached), 8, 16, "pipeline, cached")
  end)

  helpers.cuda_it("resumes on the GPU with the uninterrupted run's losses (TSV files, the second epoch)", function()
    local sets = tsv_sets(dir)
    for i, s in ipairs(sets) do if s == "train.steps=0" then table.remove(sets, i) break end end
    check(sets, 13, 20, "tsv")
  end)
end)

-- A dlrm_tiny long enough to reach its AUC.
local BASE = { "train.batch_size=512", "train.steps=160", "eval.samples=16384", "eval.every=80",
               "eval.batch_size=8192" }
local function tiny_to_auc(sets) return helpers.tiny(BASE, sets) end

local function lines_of(path) return assert(json.read_lines(path)) end

describe("uvmrec.train", function()
  local dir
  before_each(function() dir = cmd.tmpdir() end)
  after_each(function() cmd.rmdir(dir) end)

  it("trains and plans a model of 100 tables from the command line (uvmrec train, uvmrec plan)", function()
    cmd.spit(dir .. "/spec.lua", [[local t = {}
      for i = 1, 100 do
        t[i] = { name = "C" .. i, rows = 20 + i % 7, zipf = 1.1, hot = i % 5 == 0 and { 0, 2 } or 1 }
      end
      return { num_dense = 4, seed = 5, tables = t }]])
    local rows = {}
    for i = 1, 100 do rows[i] = tostring(20 + i % 7) end
    cmd.spit(dir .. "/wide.yaml", table.concat({
      "name: wide100",
      "model: {dense_features: 4, bottom_mlp: [8, 4], top_mlp: [8, 1], interaction: dot}",
      "embeddings: {dim: 4, rows: [" .. table.concat(rows, ", ") .. "], optimizer: {name: rowwise_adagrad, lr: 0.05}}",
      "optimizer: {name: adagrad, lr: 0.05}",
      "train: {batch_size: 64, steps: 4, log_every: 1}",
      "data: {train: 'synthetic:" .. dir .. "/spec.lua'}",
      "eval: {every: 4, samples: 256, batch_size: 256}", "" }, "\n"))
    local out, err, code = cmd.run("train " .. cmd.quote(dir .. "/wide.yaml") .. " --cpu --progress none --out "
      .. cmd.quote(dir .. "/run"))
    assert.equal(0, code, err)
    assert.matches("100 tables of dim 4", out)
    assert.matches("trained 4 steps, 256 samples", out)
    local n = 0
    for _, l in ipairs(lines_of(dir .. "/run/metrics.jsonl")) do
      if l.event == "train" then
        n = n + 1
        assert.is_true(l.loss > 0 and l.loss < 2, "loss " .. tostring(l.loss))
      end
    end
    assert.equal(4, n, "a loss a step")
    out, err, code = cmd.run("plan " .. cmd.quote(dir .. "/wide.yaml"))
    assert.equal(0, code, err)
    assert.matches("\nC100 ", out)
  end)

  it("trains a model of 30 tables on raw ids past its rows, every table's reduced (day files and synthetic)", function()
    -- ids from an id space 2000 times the tables': were tables 27 to 30 read raw, the embedding
    -- lookups (bounds: fatal) would fail on ids past their rows
    cmd.spit(dir .. "/spec.lua", [[local t = {}
      for i = 1, 30 do t[i] = { name = "C" .. i, rows = 40 + i, zipf = 1.1 } end
      return { num_dense = 2, seed = 4, id_space_factor = 2000, tables = t }]])
    local _, gerr, gcode = cmd.run("datagen " .. cmd.quote(dir .. "/spec.lua") .. " --cpu --samples 512 --out "
      .. cmd.quote(dir .. "/days"))
    assert.equal(0, gcode, gerr)
    local rows = {}
    for i = 1, 30 do rows[i] = tostring(40 + i) end
    local function config(name, data)
      cmd.spit(dir .. "/" .. name .. ".yaml", table.concat({
        "name: " .. name,
        "model: {dense_features: 2, bottom_mlp: [8, 4], top_mlp: [8, 1], interaction: dot}",
        "embeddings: {dim: 4, rows: [" .. table.concat(rows, ", ") .. "], optimizer: {name: sgd, lr: 0.05}}",
        "optimizer: {name: sgd, lr: 0.05}",
        "train: {batch_size: 128, steps: 3, log_every: 1}", data,
        "eval: {every: 3, samples: 256, batch_size: 256}", "" }, "\n"))
      return dir .. "/" .. name .. ".yaml"
    end
    for _, c in ipairs {
      { "synth", "data: {train: 'synthetic:" .. dir .. "/spec.lua'}" },
      { "days", "data: {train: 'criteo-bin:" .. dir .. "/days', eval: 'criteo-bin:" .. dir .. "/days'}" } } do
      local out, err, code = cmd.run("train " .. cmd.quote(config(c[1], c[2])) .. " --cpu --progress none --out "
        .. cmd.quote(dir .. "/run_" .. c[1]))
      assert.equal(0, code, c[1] .. ": " .. err)
      assert.matches("trained 3 steps, 384 samples", out)
      assert.matches("final AUC", out)
    end
    local cfg = assert(train.config.load(dir .. "/synth.yaml"))
    local d = assert(train.data(cfg, train.config.table_rows(cfg)))
    assert.equal(30, #d.train.rows)
    assert.equal(70, d.train.rows[30])
  end)

  it("trains dlrm_tiny on the CPU: the loss falls and the held-out AUC passes 0.70", function()
    local cfg = tiny_to_auc()
    local said, ctx = {}, nil
    local result = assert(train.run(cfg, { out = dir .. "/run", progress = "none", cpu = true,
                                           print = function(s) said[#said + 1] = s end,
                                           setup = function(c) ctx = c end }))
    assert.equal(160, result.steps)
    assert.equal(160 * 512, result.samples)
    assert.is_true(result.samples_per_s > 0)
    assert.equal(2, #result.evals, "at step 80 and at the end")
    assert.is_true(result.eval.auc > 0.70, "AUC " .. result.eval.auc)
    assert.is_true(result.eval.auc < result.ceiling + 0.01,
                   ("AUC %g, ceiling %g"):format(result.eval.auc, result.ceiling))
    assert.is_true(result.evals[2].auc > result.evals[1].auc - 0.01)
    assert.equal(16384, result.eval.samples)
    for _, k in ipairs { "ne", "logloss", "accuracy", "calibration", "ctr" } do
      assert.is_number(result.eval[k], k)
    end
    assert.matches("^final AUC %d%.%d+ %(the synthetic data's hidden%-model ceiling: %d%.%d+%)$", said[#said - 1])
    assert.matches("^uvmrec train: dlrm_tiny on the CPU$", said[1])

    -- the run directory: the config as resolved, then one JSON object a line
    local saved = assert(json.decode(assert(cmd.slurp(dir .. "/run/config.json"))))
    assert.equal(160, saved.train.steps)
    assert.equal(512, saved.train.batch_size)
    assert.same(cfg.embeddings.rows, saved.embeddings.rows)
    local log = lines_of(dir .. "/run/metrics.jsonl")
    assert.equal("start", log[1].event)
    local train_losses, evals = {}, 0
    for _, l in ipairs(log) do
      if l.event == "train" then train_losses[#train_losses + 1] = l.loss end
      if l.event == "eval" then evals = evals + 1 end
    end
    assert.equal(16, #train_losses, "the loss every log_every (10) steps")
    assert.equal(2, evals)
    local first = (train_losses[1] + train_losses[2]) / 2
    local last = (train_losses[#train_losses] + train_losses[#train_losses - 1]) / 2
    assert.is_true(last < first - 0.05, ("loss %g -> %g"):format(first, last))
    assert.same({ "final", 160 }, { log[#log].event, log[#log].steps })

    -- every component comes back through the checkpoint registry: the same held-out metrics
    -- the trainer's own four first; other subsystems' components (hints' layout) may follow
    assert.same({ "dense", "embeddings", "optimizer", "trainer" }, { unpack(ctx.registry:components(), 1, 4) })
    assert(ctx.registry:save(dir .. "/ck.safetensors", { step = ctx.step, config = cfg }))
    local back
    local r = assert(train.eval(tiny_to_auc(), { cpu = true, print = function() end, setup = function(c)
      back = assert(c.registry:load(dir .. "/ck.safetensors", { config = cfg }))
      assert.equal(160, c.first - 1)
      assert.equal(160, c.optimizer.step_count)
    end }))
    assert.equal(160, back.step)
    assert.near(result.eval.auc, r.eval.auc, 1e-6)
    assert.near(result.eval.logloss, r.eval.logloss, 1e-6)
  end)


  it("logs the dense and the tables' learning rates a schedule gives each step", function()
    -- the run log held the dense optimizer's alone: the tables', of another base, could not be seen
    local r = helpers.train_tiny { "train.steps=8", "train.log_every=2", "train.batch_size=256", "eval.samples=0",
                                   "eval.min_auc=0", "schedule.name=warmup", "schedule.warmup_steps=4",
                                   "optimizer.lr=0.02", "embeddings.optimizer.lr=0.3" }
    local seen = 0
    for _, e in ipairs(r.events) do
      if e.event == "train" then
        local f = math.min(e.step / 4, 1)
        assert.near(0.02 * f, e.lr, 1e-12, "step " .. e.step)
        assert.near(0.3 * f, e.tables_lr, 1e-6, "step " .. e.step)
        seen = seen + 1
      end
    end
    assert.equal(4, seen)
  end)

  it("evaluates a config's model on held-out data with uvmrec eval", function()
    local out, err, code = cmd.run("eval dlrm_tiny --cpu --data synthetic:tiny --set eval.samples=2048 --out "
                                   .. cmd.quote(dir .. "/ev"))
    assert.equal(0, code, err)
    assert.matches("^uvmrec eval: dlrm_tiny on the CPU\nmodel: DLRM: ", out)
    assert.matches("\ndata: synthetic:tiny: 307200 samples an epoch; evaluation on 2048 held%-out samples %(from "
                   .. "sample 2%^48%)\n", out)
    assert.matches("\neval: AUC 0%.%d+  NE %d+%.%d+  logloss %d+%.%d+  accuracy 0%.%d+  calibration %d+%.%d+  "
                   .. "CTR 0%.%d+  %(2048 samples, [%d.]+ s%)\n", out)
    assert.matches("\nthe synthetic data's hidden%-model ceiling: 0%.8%d+\n$", out)
    local log = lines_of(dir .. "/ev/metrics.jsonl")
    assert.same({ "eval", 2048 }, { log[1].event, log[1].samples })
    out, err, code = cmd.run("eval dlrm_tiny --cpu --data criteo-tsv:/nonexistent/day_0")
    assert.equal(1, code)
    assert.is_nil(out:find("\neval: "))
    assert.equal("uvmrec eval: criteo-tsv: /nonexistent/day_0: cannot open: No such file or directory\n", err)
  end)

  it("trains the pipeline's batches in flight at the end of the data, or drops them with train.drain", function()
    local sets = { "train.steps=0", "data.samples=2560", "train.batch_size=256", "train.pipeline=true",
                   "eval.samples=0", "eval.min_auc=0", "train.log_every=1" }
    local all = helpers.train_tiny(sets)
    local dropped = helpers.train_tiny(sets, { "train.drain=false" })
    assert.equal(10, all.result.steps)
    assert.equal(9, dropped.result.steps, "the batch prefetched when the data ended is dropped")
    for s = 1, 9 do assert.equal(all.losses[s], dropped.losses[s], "step " .. s) end
  end)

  it("holds out synthetic samples from 2^48, which training never reaches, and reports data errors", function()
    local cfg = tiny_to_auc()
    local d = assert(train.data(cfg, train.config.table_rows(cfg)))
    assert.equal(160 * 512, d.train.samples)
    assert.same({ epoch = 0, sample = 2 ^ 48 }, d.eval.position)
    assert.equal(2 ^ 48 + 16384, d.eval.samples)
    assert.equal(160, d.steps)
    -- a rows cap shrinks the synthetic tables too, so every id fits
    cfg = tiny { "embeddings.max_rows=100" }
    d = assert(train.data(cfg, train.config.table_rows(cfg)))
    assert.equal(100, d.train.data.spec.tables[16].rows)
    assert.equal(4, d.train.data.spec.tables[1].rows)
    cfg = tiny { "data.train=synthetic:nothing" }
    local none, err = train.data(cfg, train.config.table_rows(cfg))
    assert.is_nil(none)
    assert.matches("^%-%-data synthetic:nothing: 'nothing' is neither a preset", err)
    cfg = tiny { "data.train=parquet:/x" }
    none, err = train.data(cfg, train.config.table_rows(cfg))
    assert.is_nil(none)
    assert.matches("'parquet:/x' is not a data spec", err)
    cfg = tiny { "data.train=synthetic:kaggle", "embeddings.rows=5,5" }
    none, err = train.data(cfg, train.config.table_rows(cfg))
    assert.is_nil(none)
    assert.equal("--data synthetic:kaggle: 26 sparse features, but the model has 2 tables", err)
  end)

  it("refuses bad held-out data (data.eval, --eval-data) before any step, and caps a synthetic one's tables", function()
    for _, c in ipairs {
      { "data.eval=parquet:/x", "^%-%-set data.eval=parquet:/x: data.eval: 'parquet:/x' is not a data spec" },
      { "data.eval=synthetic:nothing", "^data.eval synthetic:nothing: 'nothing' is neither a preset" },
      { "data.eval=criteo-tsv:/no/such/file.tsv", "^data.eval criteo%-tsv: /no/such/file.tsv: cannot open" },
    } do
      local steps = 0
      local r, err = run(sets_with(SYNTH, { "train.steps=2", c[1] }),
                         { hooks = { { after = function() steps = steps + 1 end } } })
      assert.is_nil(r, c[1])
      assert.matches(c[2], err)
      assert.equal(0, steps, c[1])
    end
    -- the kaggle preset's tables held out for the tiny model: capped at its rows, as training data is
    local r = assert(run(sets_with(SYNTH, { "train.steps=2", "data.eval=synthetic:kaggle" })))
    assert.is_true(r.eval.auc > 0 and r.eval.auc < 1)
  end)
end)
