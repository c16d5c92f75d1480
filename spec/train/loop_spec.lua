-- uvmrec.train.loop: dlrm_tiny trained on the CPU gives, bit for bit, the losses recorded before
-- the batch, loop and optimizer were made one (issue 17): plain, through the prefetch pipeline,
-- with cached tables (a tenth of the rows, conflict misses), with managed tables (a hint policy
-- and its relayout every 10 steps), each with and without the pipeline (the cached runs with an
-- evaluation every 10 steps: the pipelined one failed before, an evaluation's last batch left
-- in flight with staged rows the next prefetch needed; its losses are the plain cached run's),
-- and two runs that step every kind of update constant (Adam on both sides with f16 tables and
-- the dlrm schedule; SGD with momentum and Adagrad on bf16 tables with a warmup).  The values
-- are hex floats, each step's loss as train.run logged it, recorded with OpenBLAS's Haswell
-- kernels: the runs are made by the uvmrec command with OPENBLAS_CORETYPE=Haswell (a machine's
-- own choice of kernels rounds its matrix products its own way).  Re-recorded once at 408deed
-- (main before issue 17 merged), whose CPU products run in row blocks of 64 so that a
-- data-parallel rank's rows equal the whole batch's (issue 19): the plain and Adam/f16 runs of
-- that tree and of the merge gave the same bits, so the merge kept them.  The plain losses again
-- when rowwise Adagrad's step became one multiplier a row (tbe_plan.h's ur__tbe_rowwise_mult):
-- steps 10 and 11 moved by an ulp, the other 28 kept their bits.  And loop.run's
-- protocol: sources, hooks, stopping and failing.
local cmd = require "command"
local loop = require "uvmrec.train.loop"

local COMMON = { "train.steps=30", "train.batch_size=256", "train.log_every=1", "eval.samples=0",
                 "eval.min_auc=0" }

local RUNS = {
  { name = "plain", sets = {} },
  { name = "pipelined", sets = {
    "train.pipeline=true" } },
  { name = "cached", sets = {
    "embeddings.placement=cached", "embeddings.cache.load_factor=0.1", "embeddings.cache.min_slots=0",
    "eval.samples=2048", "eval.batch_size=1024", "eval.every=10" } },
  { name = "cached_pipelined", sets = {
    "embeddings.placement=cached", "embeddings.cache.load_factor=0.1", "embeddings.cache.min_slots=0",
    "train.pipeline=true", "eval.samples=2048", "eval.batch_size=1024", "eval.every=10" } },
  { name = "managed", sets = {
    "embeddings.placement=managed", "embeddings.hints.every=10", "embeddings.hints.allowance=20%" } },
  { name = "managed_pipelined", sets = {
    "embeddings.placement=managed", "embeddings.hints.every=10", "embeddings.hints.allowance=20%",
    "train.pipeline=true" } },
  { name = "adam_f16_dlrm_schedule", sets = {
    "optimizer.name=adam", "optimizer.lr=0.01", "embeddings.optimizer.name=adam",
    "embeddings.optimizer.lr=0.01", "embeddings.dtype=f16", "schedule.name=dlrm", "schedule.warmup_steps=5",
    "schedule.decay_start=15", "schedule.decay_steps=10" } },
  { name = "sgd_momentum_adagrad_warmup", sets = {
    "optimizer.name=sgd", "optimizer.lr=0.1", "optimizer.momentum=0.9", "embeddings.optimizer.name=adagrad",
    "embeddings.dtype=bf16", "schedule.name=warmup", "schedule.warmup_steps=8" } },
}

-- The pipeline, the cache and managed placement change none of the arithmetic: those runs' losses
-- are the plain run's.
local PLAIN = [[
    0x1.62ceb4p+0 0x1.7a5962p+0 0x1.79fc28p+0 0x1.371484p+0 0x1.e54b3ep-1 0x1.47373ep-1
    0x1.57202ep-1 0x1.42e632p-1 0x1.5f8aecp-1 0x1.508eb8p-1 0x1.48bccep-1 0x1.22d4c8p-1
    0x1.21c9d6p-1 0x1.2393p-1 0x1.2b83e6p-1 0x1.13283p-1 0x1.1e32aep-1 0x1.111ed6p-1
    0x1.31f888p-1 0x1.22f75cp-1 0x1.044106p-1 0x1.ef2478p-2 0x1.183ce2p-1 0x1.2a717cp-1
    0x1.18f51ep-1 0x1.1171bap-1 0x1.e7937ap-2 0x1.f2f484p-2 0x1.fd88fcp-2 0x1.e6d832p-2]]

local RECORDED = {
  plain = PLAIN,
  pipelined = PLAIN,
  cached = PLAIN,
  cached_pipelined = PLAIN,
  managed = PLAIN,
  managed_pipelined = PLAIN,
  adam_f16_dlrm_schedule = [[
    0x1.62cecap+0 0x1.71f32cp+0 0x1.3e1e4ap+0 0x1.0417p+0 0x1.930fc4p-1 0x1.629ffep-1
    0x1.09e612p+0 0x1.95973cp-1 0x1.5e629ep-1 0x1.51fd8p-1 0x1.5971p-1 0x1.73108cp-1
    0x1.6ef378p-1 0x1.4ea3ep-1 0x1.46338ep-1 0x1.2e0b6ap-1 0x1.4ad8f8p-1 0x1.4427p-1
    0x1.5f5d04p-1 0x1.4c0798p-1 0x1.319b8ep-1 0x1.1d2eep-1 0x1.43d1e8p-1 0x1.4857e4p-1
    0x1.3d4434p-1 0x1.493abep-1 0x1.2568d4p-1 0x1.2cc32cp-1 0x1.2d3392p-1 0x1.363bf2p-1]],
  sgd_momentum_adagrad_warmup = [[
    0x1.62cf02p+0 0x1.7908f8p+0 0x1.4fddb2p+0 0x1.273ac2p+0 0x1.02d48ap+0 0x1.768594p-1
    0x1.677d06p-1 0x1.a6dc3p-1 0x1.caad0ep-1 0x1.89a72p-1 0x1.31484p-1 0x1.37196p-1
    0x1.389708p-1 0x1.318736p-1 0x1.36e7e6p-1 0x1.2f1972p-1 0x1.3b124ep-1 0x1.2e68d4p-1
    0x1.53d6b6p-1 0x1.49ccd8p-1 0x1.224b2ap-1 0x1.21424p-1 0x1.35d636p-1 0x1.2e78f8p-1
    0x1.2ecf06p-1 0x1.31ead2p-1 0x1.18ff1cp-1 0x1.1a753cp-1 0x1.1b013ap-1 0x1.1f95b2p-1]],
}

-- Every run's losses {name = {loss, ...}}, made once by a child uvmrec on the recording's BLAS
-- kernels: its script trains each run (train.run on the CPU) and prints "name hex hex ...".
local made
local function losses_of(name)
  if not made then
    local dir = cmd.tmpdir()
    local src = { 'local train, json = require "uvmrec.train", require "uvmrec.json"',
                  "local runs = {" }
    for _, r in ipairs(RUNS) do
      local sets = {}
      for _, v in ipairs(COMMON) do sets[#sets + 1] = ("%q"):format(v) end
      for _, v in ipairs(r.sets) do sets[#sets + 1] = ("%q"):format(v) end
      src[#src + 1] = ("  { name = %q, sets = { %s } },"):format(r.name, table.concat(sets, ", "))
    end
    src[#src + 1] = [[}
for _, r in ipairs(runs) do
  local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), r.sets))
  local out = arg[1] .. "/" .. r.name
  assert(train.run(cfg, { out = out, progress = "none", cpu = true, print = function() end }))
  local hex = {}
  for _, e in ipairs(assert(json.read_lines(out .. "/metrics.jsonl"))) do
    if e.event == "train" then hex[#hex + 1] = ("%a"):format(e.loss) end
  end
  print(r.name .. " " .. table.concat(hex, " "))
end]]
    local script = cmd.spit(dir .. "/runs.lua", table.concat(src, "\n") .. "\n")
    local out, err, code = cmd.sh_fixed_blas(cmd.quote(cmd.bin()) .. " " .. cmd.quote(script)
                                  .. " " .. cmd.quote(dir))
    cmd.rmdir(dir)
    assert(code == 0, "the runs failed: " .. err)
    made = {}
    for line in out:gmatch("[^\n]+") do
      local n, rest = line:match("^(%S+) (.*)$")
      made[n] = {}
      for hex in rest:gmatch("%S+") do made[n][#made[n] + 1] = tonumber(hex) end
    end
  end
  return made[name]
end

describe("uvmrec.train.loop", function()
  for _, r in ipairs(RUNS) do
    it("trains dlrm_tiny to the recorded losses bit for bit: " .. r.name:gsub("_", " "), function()
      local got = assert(losses_of(r.name), "no losses for " .. r.name)
      local k = 0
      for hex in RECORDED[r.name]:gmatch("%S+") do
        k = k + 1
        local want = tonumber(hex)
        if got[k] ~= want then
          error(("%s, step %d: loss %s (%.9g); recorded %s (%.9g)"):format(r.name, k,
                got[k] and ("%a"):format(got[k]) or "missing", got[k] or 0, hex, want), 0)
        end
      end
      assert.equal(30, k)
      assert.is_nil(got[31])
    end)
  end
end)

-- A model and an optimizer that write down what the loop asks of them, and a source of n
-- batches of sizes 1, 2, ... that notes its close.
local function fakes(n, fail_at)
  local log = {}
  local loss = { get = function() return 0.5 end }
  local model = {
    criterion = { forward = function() return loss end, backward = function() return "grad" end },
    forward = function(_, b)
      if b.size == fail_at then error("step " .. b.size .. " failed", 0) end
      log[#log + 1] = "forward " .. b.size
      return "logits"
    end,
    backward = function(_, b) log[#log + 1] = "backward " .. b.size end,
  }
  local opt = { step = function() log[#log + 1] = "step" end }
  local k = 0
  local source = { next = function()
    k = k + 1
    if k > n then return nil end
    return { size = k }
  end, close = function() log[#log + 1] = "close" end }
  return model, opt, source, log
end

describe("uvmrec.train.loop.run", function()
  it("takes batches from a source until it ends, the hooks around each step in order, then closes it", function()
    local model, opt, source, log = fakes(2)
    local function hook(name)
      return { start = function(_, r) log[#log + 1] = name .. " start " .. r.step end,
               before = function(_, r, b) log[#log + 1] = name .. " before " .. r.step .. " " .. b.size end,
               after = function(_, r, b)
                 log[#log + 1] = name .. " after " .. r.step .. " " .. r.samples .. " " .. b.size
               end,
               done = function(_, r) log[#log + 1] = name .. " done " .. r.step end,
               finish = function(_, r) log[#log + 1] = name .. " finish " .. r.step .. " " .. tostring(r.error) end }
    end
    local run = loop.run(model, opt, source, { hook("a"), hook("b") })
    assert.same({ "a start 0", "b start 0",
                  "a before 0 1", "b before 0 1", "forward 1", "backward 1", "step", "a after 1 1 1", "b after 1 1 1",
                  "a before 1 2", "b before 1 2", "forward 2", "backward 2", "step", "a after 2 3 2", "b after 2 3 2",
                  "a done 2", "b done 2", "close", "a finish 2 nil", "b finish 2 nil" }, log)
    assert.same({ 2, 3, false }, { run.step, run.samples, run.stopped })
    assert.equal(0.5, run.loss:get(0))
  end)

  it("starts where a hook says (a resumed run's step) and stops when one asks", function()
    local model, opt, source, log = fakes(10)
    local run = loop.run(model, opt, source, {
      { start = function(_, r) r.step, r.samples = 40, 400 end },
      { after = function(_, r) if r.step == 42 then r:stop() end end } })
    assert.same({ 42, 403, true }, { run.step, run.samples, run.stopped })
    assert.equal("close", log[#log])
  end)

  it("lets a hook take the step over (as uvmrec.train.graph's runner does)", function()
    local model, opt, source, log = fakes(3)
    local run = loop.run(model, opt, source, { { take_step = function(_, r, b)
      log[#log + 1] = "taken " .. r.step .. " " .. b.size
      return { get = function() return 7 end }
    end } })
    assert.same({ "taken 0 1", "taken 1 2", "taken 2 3", "close" }, log)
    assert.same({ 3, 6, 7 }, { run.step, run.samples, run.loss:get(0) })
  end)

  it("closes the source and runs the hooks' finish with the error when a step fails, then raises it", function()
    local model, opt, source, log = fakes(5, 3)
    local seen
    assert.has_error(function()
      loop.run(model, opt, source, { { finish = function(_, r) seen = { r.step, r.error } end } })
    end, "step 3 failed")
    assert.same({ 2, "step 3 failed" }, seen)
    assert.equal("close", log[#log])
  end)
end)

