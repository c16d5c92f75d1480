-- Sharded training over ranks as processes on the CPU (`uvmrec launch -n W`, OpenMPI): DLRM
-- with its tables sharded (uvmrec.dist.shard) and its dense part data-parallel
-- (uvmrec.dist.ddp), against the one-process run on the same global batches, which rank 0 of
-- each job trains beside it (spec/support/dist_train.lua): every table row bit for bit after
-- the first step, the global batch's loss within 1e-5 relative at every step, the AUC over the
-- ranks within 1e-3.  Each job's seconds are printed, for the CI's budget.  The jobs run with
-- OpenBLAS's Haswell kernels (as spec/train/loop_spec.lua's runs): the rows of a block of 64 come
-- out of them the same whatever the batch's row count, which the bit-for-bit rows need; the
-- kernel OpenBLAS picks in CI's hidden environment rounds some rows otherwise (losses 1e-7 apart).
local lfs = require "lfs"
local command = require "command"

local helpers = require "helpers"

local function job(n, env)
  local vars = command.assignments(env)
  local t0 = os.time()
  local out, err, code = command.sh_fixed_blas(("%s %s launch -n %d spec/support/dist_train.lua")
    :format(vars, command.bin(), n))
  io.stderr:write(("  [dist] -n %d %s: %d s\n"):format(n, vars, os.time() - t0))
  helpers.ranks_ok(n, out, err, code)
  return out
end

-- dlrm_tiny's tables take rowwise Adagrad: a table in several column shards steps its rows by the
-- whole row's sum of squared gradients, the shards' partial sums added over the ranks in another
-- order than one row's, so its rows agree within rounding (ROWS_TOL, measured 1.5e-8 absolute)
-- rather than bit for bit; with elementwise Adagrad (ADAGRAD) column shards are bit for bit.
local ADAGRAD = "embeddings.optimizer.name=adagrad"
local ROWS = "1e-5"

describe("sharded training over ranks", function()
  local cases = {
    { 2, "table_wise", 40 }, { 2, "row_wise", 40 }, { 2, "column_wise", 40, nil, ROWS }, { 2, "data_parallel", 40 },
    { 2, "mixed", 2, ADAGRAD },
    { 4, "table_wise", 2 }, { 4, "row_wise", 2 }, { 4, "column_wise", 2, nil, ROWS }, { 4, "data_parallel", 2 },
    { 4, "mixed", 40, ADAGRAD }, { 4, "mixed", 2, nil, ROWS },
    -- 3 ranks of 344 samples: dlrm_tiny's optimizers as they are for 40 steps (elementwise
    -- Adagrad on the tables amplifies the dense all-reduce's rounding past 1e-5 there: 3.6e-4
    -- at step 21, for every plan), the mixed plan for a step
    { 3, "table_wise", 40, "train.batch_size=1032" }, { 3, "mixed", 2, "train.batch_size=1032," .. ADAGRAD },
    -- bf16 outputs: row-wise partial sums are reduced as f32 over MPI (which reduces no bf16) and
    -- rounded once, as one process rounds its pooled rows
    { 2, "row_wise", 5, "model.precision=bf16" },
    { 3, "mixed", 3, "train.batch_size=1032,model.precision=bf16," .. ADAGRAD },
  }
  for _, c in ipairs(cases) do
    local n, plan, steps, sets, rows = c[1], c[2], c[3], c[4], c[5]
    helpers.mpi_it(("-n %d %s: tables %s after a step, %d steps' losses and the AUC as one process's%s")
       :format(n, plan, rows and "within " .. rows or "bit for bit", steps, sets and (" (" .. sets .. ")") or ""),
       function()
      local out = job(n, { PLAN = plan, STEPS = tostring(steps), SETS = sets or "", ROWS_TOL = rows })
      assert.matches("step " .. steps .. " loss", out)
      if steps == 40 then assert.matches("\nauc 0%.[89]", out) end
    end)
  end

  helpers.mpi_it("trains multi-hot weighted bags alike; row-wise tables' partial sums agree within rounding", function()
    local sets = "data.train=synthetic:tiny_multihot," .. ADAGRAD
    -- row-wise pooling adds the ranks' partial sums of a bag in another order than one process:
    -- rows within 1e-4 after a step, losses within 1e-4 over 40 steps (4.3e-5 measured)
    job(2, { PLAN = "mixed", STEPS = "40", SETS = sets, EXACT = "0", TOL = "1e-4" })
    -- without row-wise tables the rows are bit for bit
    job(2, { PLAN = "column_wise", STEPS = "2", SETS = sets })
  end)

  helpers.mpi_it("runs docs/distributed.md's examples over 2 ranks with the one process's losses", function()
    local doc = command.slurp("docs/distributed.md")
    if not doc then pending("not in a source tree") return end
    local code = {}
    for body in doc:gmatch("```lua\n(.-)```") do code[#code + 1] = body end
    -- in a folder of their own: the examples write files (a checkpoint in runs/shards)
    local dir = command.tmpdir()
    local script = command.spit(dir .. "/examples.lua", table.concat(code, "\n"))
    local bin = command.bin()
    if not bin:match("^/") then bin = lfs.currentdir() .. "/" .. bin end
    local cd = "cd " .. command.quote(dir) .. " && " .. command.quote(bin)
    local one, err1, c1 = command.sh(cd .. " " .. script)
    local two, err2, c2 = command.sh(cd .. " launch -n 2 " .. script)
    command.rmdir(dir)
    assert.equal(0, c1, one .. err1)
    assert.equal(0, c2, two .. err2)
    local function losses(out)
      local l = {}
      for x in out:gmatch("\nloss ([%d%.]+)") do l[#l + 1] = x end
      return l
    end
    assert.equal(4, #losses("\n" .. one))
    assert.same(losses("\n" .. one), losses("\n" .. two))
    assert.matches("%[rank 1%] ShardedEmbeddingBagCollection%(3 tables: 1 row_wise, 1 column_wise, 1 data_parallel; "
      .. "rank 1 of 2", two)
  end)

  -- `uvmrec train` over ranks: the run directory's train events and final AUC against the
  -- one-process run of the same command without `launch -n W`; rank 0 alone writes and prints.
  -- Both under OpenBLAS's Haswell kernels, whose rows do not depend on the batch's row count
  -- (docs/distributed.md): with the AVX-512 kernels OpenBLAS picks on a machine that has them,
  -- the two runs' losses drift apart by rounding, 3.3e-4 relative by step 40 (2026-12-02).
  local json = require "uvmrec.json"
  local runs = dofile("spec/support/dist_runs.lua")
  local function against_one_process(launch, args, steps, log_every)
    local one_dir, many_dir = command.tmpdir(), command.tmpdir()
    local one, err1, c1 = command.sh_fixed_blas(("%s %s"):format(command.bin(),
      (args:gsub("RUN", one_dir .. "/run"))))
    assert.equal(0, c1, one .. err1)
    local t0 = os.time()
    local many, err2, c2 = command.sh_fixed_blas(("%s %s %s"):format(command.bin(), launch,
      (args:gsub("RUN", many_dir .. "/run"))))
    io.stderr:write(("  [dist] %s train: %d s\n"):format(launch, os.time() - t0))
    assert.equal(0, c2, many .. err2)
    -- rank 0 prints; the others are silent (their errors would carry "[rank R] ")
    assert.not_matches("%[rank %d%]", many)
    local _, starts = many:gsub("uvmrec train: ", "")
    assert.equal(1, starts, many)
    assert.matches("final AUC 0%.%d+", many)
    local worst, a, b = runs.compare(one_dir .. "/run", many_dir .. "/run")
    assert.is_truthy(worst, a)
    assert.equal(steps / log_every, #a)
    command.rmdir(one_dir)
    command.rmdir(many_dir)
    return a, b
  end

  helpers.mpi_it("trains with `uvmrec launch -n 2 train` as docs/distributed.md says, "
     .. "with the one process's losses and AUC",
     function()
    local doc = command.slurp("docs/distributed.md")
    if not doc then pending("not in a source tree") return end
    local line = doc:match("\n(uvmrec launch %-n 2 train [^\n]*)")
    assert.is_truthy(line, "docs/distributed.md has no `uvmrec launch -n 2 train` command")
    local args = line:gsub("^uvmrec launch %-n 2 ", ""):gsub("runs/a", "RUN")
    assert.matches("embeddings.sharding=row_wise", args)
    against_one_process("launch -n 2", args, 40, 10)
  end)

  helpers.mpi_it("trains per-table shardings of the config over 3 ranks as one process", function()
    against_one_process("launch -n 3", "train dlrm_tiny --cpu --steps 20 --out RUN --progress none "
      .. "--set train.batch_size=1032 --set eval.samples=16512 --set eval.batch_size=8256 "
      .. "--set eval.min_auc=0 --set embeddings.sharding=table_wise --set embeddings.tables.C3.sharding=row_wise "
      .. "--set embeddings.tables.C16.sharding=data_parallel --set embeddings.tables.C21.sharding=row_wise", 20, 10)
  end)

  helpers.mpi_it("trains dlrm_tiny under each sharding kind with its own optimizer (rowwise Adagrad) as one process",
     function()
    for _, kind in ipairs { "table_wise", "column_wise", "data_parallel" } do
      against_one_process("launch -n 2", "train dlrm_tiny --cpu --steps 20 --out RUN --progress none "
        .. "--set train.log_every=10 --set eval.min_auc=0 --set embeddings.sharding=" .. kind, 20, 10)
    end
  end)

  helpers.mpi_it("evaluates the first eval.samples of held-out files over ranks "
     .. "as one process where they end inside a batch",
     function()
    -- each rank scored its whole slice of the batch the set ended in: the first 600 rows in
    -- global batches of 400 scored 800 over 2 ranks (AUC 0.5642), one process 600 (AUC 0.5833)
    against_one_process("launch -n 2", "train dlrm_tiny --cpu --steps 10 --out RUN --progress none "
      .. "--set train.log_every=10 --set eval.min_auc=0 --set data.eval=criteo-tsv:"
      .. helpers.fixture("criteo_raw_sample.tsv") .. " --set eval.samples=600 --set eval.batch_size=400", 10, 10)
  end)

  helpers.mpi_it("trains with embeddings.vbe = true as without, losses within 1e-5 relative", function()
    local base = "train dlrm_tiny --cpu --steps 20 --out RUN --progress none --set train.log_every=1 "
      .. "--set embeddings.sharding=row_wise --set eval.min_auc=0 --set embeddings.vbe="
    local off, on = command.tmpdir(), command.tmpdir()
    local out, err, code = command.run("launch -n 2 " .. (base .. "false"):gsub("RUN", off .. "/run"))
    assert.equal(0, code, out .. err)
    assert.not_matches("VBE", out)
    out, err, code = command.run("launch -n 2 " .. (base .. "true"):gsub("RUN", on .. "/run"))
    assert.equal(0, code, out .. err)
    assert.matches("sharding: .*; VBE: each rank sends each feature's distinct bags", out)
    -- gradients of repeated bags are summed before the step: tables within rounding, not bit for bit
    local worst, a = runs.compare(off .. "/run", on .. "/run")
    assert.is_truthy(worst, a)
    assert.equal(20, #a)
    command.rmdir(off)
    command.rmdir(on)
  end)

  helpers.mpi_it("refuses what a run over ranks cannot do, naming the value and why", function()
    local out, err, code = command.run("launch -n 2 train dlrm_tiny --cpu --steps 2 --set train.batch_size=1025")
    assert.is_true(code ~= 0, out)
    assert.matches("train.batch_size: 1025 is not a multiple of the 2 ranks", err)
    assert.matches("%[rank 1%] ", err) -- every rank says why, the others with their rank
  end)

  helpers.mpi_it("refuses ranks whose configs differ, naming the rank and the keys, before it builds anything",
     function()
    -- two hosts with different config files (or --set) trained: rank 1 at another learning
    -- rate stepped its replica of the dense part apart from rank 0's, silently
    local dir = command.tmpdir()
    local script = command.spit(dir .. "/differ.lua", ([[
      local train = require "uvmrec.train"
      local rank = require("uvmrec.dist").environment().rank
      local sets = { "train.steps=2", "eval.samples=0", "eval.min_auc=0" }
      if rank == 1 then sets[#sets + 1] = "optimizer.lr=0.5" end
      local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), sets))
      local r, err = train.run(cfg, { cpu = true, out = "%s/run", progress = "none", print = function() end })
      io.stdout:write(r and "trained\n" or ("refused: " .. tostring(err) .. "\n"))
      os.exit(r and 0 or 1)
    ]]):format(dir))
    local out, err, code = command.sh(("%s launch -n 2 %s"):format(command.bin(), script))
    assert.equal(1, code, out .. err)
    assert.is_nil(out:find("trained", 1, true), out)
    local want = "dist: rank 1's config is not rank 0's (every rank of a job runs the same config: the same file "
      .. "and --set on every host): config differs at 1 key: optimizer.lr (rank 0 has 0.050000000000000003, "
      .. "rank 1 has 0.5)"
    assert.is_truthy(out:find("refused: " .. want, 1, true), out .. err)
    assert.is_truthy(out:find("[rank 1] refused: " .. want, 1, true), out .. err)
    assert.is_nil(command.exists(dir .. "/run/metrics.jsonl") or nil, "nothing was written")
    command.rmdir(dir)
  end)

  helpers.mpi_it("writes the final event and says where before every rank fails eval.min_auc", function()
    -- the other ranks exited with the failure first and their MPI_Abort killed rank 0 before
    -- metrics.jsonl had its final event or the run directory was named
    local dir = command.tmpdir()
    local out, err, code = command.run(("launch -n 2 train dlrm_tiny --cpu --steps 2 --out %s/run --progress none "
      .. "--set eval.min_auc=0.99 --set eval.samples=4096 --set eval.batch_size=2048"):format(dir))
    assert.equal(1, code, out .. err)
    assert.is_truthy(out:find("run directory: " .. dir .. "/run (config.json, metrics.jsonl)", 1, true), out)
    assert.matches("the final AUC 0%.%d+ is below eval.min_auc 0%.9900", err)
    local final = command.slurp(dir .. "/run/metrics.jsonl"):match('\n({[^\n]*"event":"final"[^\n]*})')
    assert.is_truthy(final, "no final event in metrics.jsonl")
    assert.equal(2, json.decode(final).steps)
    command.rmdir(dir)
  end)

  helpers.mpi_it("measures B9 over 2 ranks (scripts/bench/dist.lua): samples/s and each step's collectives", function()
    local dir = command.tmpdir()
    local out, err, code = command.run(("launch -n 2 scripts/bench/dist.lua --cpu --per-rank 128 --steps 2 --warmup 1 "
      .. "--sharding mixed --set embeddings.optimizer.name=adagrad --out %s/b9.jsonl"):format(dir))
    assert.equal(0, code, out .. err)
    assert.matches("B9: dlrm_tiny on 2 ranks %(the CPU%), 128 samples a rank and step %(global batch 256%)", out)
    local r = json.decode(command.slurp(dir .. "/b9.jsonl"))
    assert.equal(2, r.ranks)
    assert.is_true(r.samples_per_s > 0 and r.comm_calls_per_step > 0 and r.comm_bytes_sent_per_step > 0)
    command.rmdir(dir)
  end)

  helpers.mpi_it("is deterministic run to run", function()
    local a = job(2, { PLAN = "mixed", STEPS = "3", SETS = ADAGRAD })
    local b = job(2, { PLAN = "mixed", STEPS = "3", SETS = ADAGRAD })
    assert.equal(a:gsub("%[rank %d%][^\n]*\n", ""), b:gsub("%[rank %d%][^\n]*\n", ""))
  end)

  helpers.mpi_it("refuses batches the ranks do not share evenly, naming both ranks' sizes", function()
    local out, err, code = command.sh(("env PLAN=row_wise STEPS=1 SETS=train.batch_size=1025 %s launch -n 2 "
      .. "spec/support/dist_train.lua"):format(command.bin()))
    assert.is_true(code ~= 0, out)
    assert.matches("dist: rank %d has a batch of 51[23] samples and rank %d of 51[23]; the ranks take equal shares "
      .. "of a global batch", err)
  end)

  -- A folder holding datagen tiny's day files of 1025 samples (DIR/days).
  local function days_1025()
    local dir = command.tmpdir()
    local _, err, code = command.run(("datagen tiny --out %s/days --samples 1025 --cpu"):format(dir))
    assert.equal(0, code, err)
    return dir
  end

  -- config.check_epoch's and check_eval's refusals of n samples (`of`: where they are) ending in a
  -- batch of `last` (of 512) the 2 ranks cannot share.
  local function uneven_epoch(n, of, last)
    return ("data.train: an epoch of %d samples (%s) ends in a batch of %d (train.batch_size 512), which the 2 "
      .. "ranks cannot share equally: each rank takes an equal slice of every global batch (make it a multiple of "
      .. "2, or data.drop_last: true drops that batch)"):format(n, of, last)
  end
  local function uneven_eval(n, of, last)
    return ("eval.batch_size: held-out data of %d samples (%s) ends in a batch of %d (eval.batch_size 512), which "
      .. "the 2 ranks cannot share equally: each rank takes an equal slice of every global batch (make it a "
      .. "multiple of 2, or eval.samples at most %d)"):format(n, of, last, n - last)
  end

  -- `run` fails with `want` in its errors, having trained nothing.
  local function refused_before_training(run, want)
    local out, err, code = command.run(run)
    assert.is_true(code ~= 0, out)
    assert.is_nil(out:find("trained", 1, true), out)
    assert.truthy(err:find(want, 1, true), err)
  end

  helpers.mpi_it("refuses day files whose epoch ends in a batch the ranks cannot share, before any step; "
     .. "data.drop_last drops it",
     function()
    local dir = days_1025()
    local run = ("launch -n 2 train dlrm_tiny --cpu --set data.train=criteo-bin:%s/days --set train.batch_size=512 "
      .. "--set train.steps=0 --set eval.every=0 --set eval.min_auc=0"):format(dir)
    -- it trained 2 steps, then failed on the epoch's last batch of 1 sample ("dist: rank 0 has a
    -- batch of 0 samples and rank 1 of 1"), naming no key
    refused_before_training(run, uneven_epoch(1025, "the day files in " .. dir .. "/days", 1))
    local out, err, code = command.run(run .. " --set data.drop_last=true")
    assert.equal(0, code, out .. err)
    assert.truthy(out:find("data: each epoch's last batch, of 1 sample, is dropped (data.drop_last)", 1, true), out)
    assert.truthy(out:find("trained 2 steps, 1024 samples", 1, true), out)
    command.rmdir(dir)
  end)

  helpers.mpi_it("refuses held-out day files whose evaluation ends in a batch the ranks cannot share, before any step",
     function()
    local dir = days_1025()
    local run = ("launch -n 2 train dlrm_tiny --cpu --set data.train=criteo-bin:%s/days --set train.batch_size=512 "
      .. "--set train.steps=2 --set data.eval=criteo-bin:%s/days --set eval.batch_size=512 --set eval.every=0 "
      .. "--set eval.min_auc=0"):format(dir, dir)
    -- it trained both steps, then failed at the evaluation's last batch of 1 sample
    refused_before_training(run, uneven_eval(1025, "the day files in " .. dir .. "/days", 1))
    local out, err, code = command.run(run .. " --set eval.samples=1000")
    assert.equal(0, code, out .. err)
    assert.truthy(out:find("trained 2 steps, 1024 samples", 1, true), out)
    command.rmdir(dir)
  end)

  helpers.mpi_it("refuses TSV files whose epoch ends in a batch the ranks cannot share, counted before any step; "
     .. "data.drop_last drops it", function()
    -- 999 rows in global batches of 512: the ranks took 243 and 244 samples of the last batch and
    -- failed in the embeddings' forward ("dist: rank 0 has a batch of 243 samples and rank 1 of
    -- 244"), naming neither the data nor data.drop_last; then the loader failed at that batch
    -- ("loader: the batch at sample 512 of epoch 0 (the epoch's last) has 487 samples ..."), after
    -- an epoch of training, the files' count being known only at their end
    local dir = command.tmpdir()
    local lines = command.lines(helpers.fixture("criteo_raw_sample.tsv"))
    local odd = command.spit(dir .. "/odd.tsv", table.concat(lines, "\n", 1, 999) .. "\n")
    local even = command.spit(dir .. "/even.tsv", table.concat(lines, "\n", 1, 1000) .. "\n")
    local run = ("launch -n 2 train dlrm_tiny --cpu --progress none --set data.train=criteo-tsv:%s "
      .. "--set train.batch_size=512 --set train.steps=0 --set eval.samples=0 --set eval.min_auc=0 "
      .. "--set eval.every=0 --set embeddings.sharding=data_parallel"):format(odd)
    refused_before_training(run, uneven_epoch(999, "the TSV files " .. odd, 487))
    -- a run that stops before that batch is not refused
    local out, err, code = command.run(run .. " --set train.steps=1")
    assert.equal(0, code, out .. err)
    assert.truthy(out:find("trained 1 step, 512 samples", 1, true), out)
    -- held-out TSV files alike: it trained both steps, then failed at the evaluation's last batch
    refused_before_training(("launch -n 2 train dlrm_tiny --cpu --progress none --set data.train=criteo-tsv:%s "
      .. "--set train.batch_size=512 --set train.steps=2 --set data.eval=criteo-tsv:%s --set eval.batch_size=512 "
      .. "--set eval.every=0 --set eval.min_auc=0 --set embeddings.sharding=data_parallel"):format(even, odd),
      uneven_eval(999, "the TSV files " .. odd, 487))
    out, err, code = command.run(run .. " --set data.drop_last=true")
    assert.equal(0, code, out .. err)
    assert.truthy(out:find("data: each epoch's last batch, when short, is dropped (data.drop_last)", 1, true), out)
    assert.truthy(out:find("trained 1 step, 512 samples", 1, true), out)
    command.rmdir(dir)
  end)

  -- data.eval naming data.train's TSV files counted them twice before any step (two parsing
  -- passes, each about an epoch's reading): the training loader's count, then the held-out probe's
  helpers.mpi_it("counts TSV files that data.train and data.eval both name once a run", function()
    local dir = command.tmpdir()
    local lines = command.lines(helpers.fixture("criteo_raw_sample.tsv"))
    local tsv = command.spit(dir .. "/f.tsv", table.concat(lines, "\n") .. "\n")
    -- each rank counts the loaders it opens with count_samples, then trains and evaluates
    local script = command.spit(dir .. "/count.lua", ([[
local ur = require "uvmrec"
local train = require "uvmrec.train"
local counted, open = 0, ur.data.loader
ur.data.loader = function(o, ...)
  if o and o.count_samples then counted = counted + 1 end
  return open(o, ...)
end
local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), { "data.train=criteo-tsv:%s",
  "data.eval=criteo-tsv:%s", "train.batch_size=500", "train.steps=1", "eval.samples=1000", "eval.batch_size=500",
  "eval.every=0", "eval.min_auc=0", "embeddings.sharding=data_parallel" }))
local r = assert(train.run(cfg, { cpu = true, progress = "none", print = function() end }))
print(("counted %%d, evaluated %%d"):format(counted, r.eval.samples))
]]):format(tsv, tsv))
    local out, err, code = command.run("launch -n 2 " .. script)
    assert.equal(0, code, out .. err)
    local _, ranks = out:gsub("counted 1, evaluated 1000\n", "")
    assert.equal(2, ranks, out)
    command.rmdir(dir)
  end)
end)
