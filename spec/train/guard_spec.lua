-- uvmrec.train.guard (train.nonfinite) and its engine ops: ur_nonfinite_check against a plain
-- reference on random tensors of every float dtype, the gates of the dense optimizer and the
-- tables' fused step, a skipped step that changes nothing (and equals a run that never saw the
-- batch), a stop that names the step and the first non-finite tensor (NaN in a batch's dense
-- features, in a gradient, in a table row hit by training), and checkpoints holding NaN refused
-- on load unless allowed.  The CUDA-versus-CPU parity is tagged #cuda.
local ffi = require "ffi"
local ur = require "uvmrec"
local helpers = require "helpers"
local command = require "command"
local train = require "uvmrec.train"
local loop = require "uvmrec.train.loop"
local guard = require "uvmrec.train.guard"
local ck = require "uvmrec.checkpoint"
local C = ur.C

local HEAD = 3
local FLOATS = { "f32", "bf16", "f16", "f64" }

local function finite(v) return v == v and v ~= math.huge and v ~= -math.huge end

-- Uniform numbers in [0, 1) from a seed.
local function uniform(seed)
  local r = helpers.rng(seed)
  return function() return (r(1000000) - 1) / 1e6 end
end

-- A random tensor of dtype with `bad` = {index = NaN / inf / -inf} written in.
local function random_tensor(rng, dtype, n, bad, place)
  local t = assert(ur.tensor({ n }, { dtype = dtype, placement = place or "host" }))
  assert(t:normal(0, 3, math.floor(rng() * 1e9)))
  for i, v in pairs(bad or {}) do t:set(i, v) end
  return t
end

local function flags_of(n, place)
  local f = assert(ur.tensor({ HEAD + n }, { dtype = "i32", placement = place or "host" }))
  return assert(f:fill(0))
end

local function check(xs, flags, slot0, stream)
  local arr = ffi.new("const ur_tensor *[?]", #xs)
  for i, x in ipairs(xs) do arr[i - 1] = x.p end
  if C.ur_nonfinite_check(stream, #xs, arr, flags.p, slot0) ~= 0 then return nil, ffi.string(C.ur_last_error()) end
  return true
end

local function ints(t)
  local out = {}
  for i, v in ipairs(assert(t:totable())) do out[i] = math.floor(v) end
  return out
end

-- Three steps over random tensors, some made non-finite in some steps; the flags each step
-- against what a reference reading every element says.
local function random_steps(seed, place)
  local rng = uniform(seed)
  local n = 37 -- two groups of the GPU's launch (32 a launch)
  local dts, sizes = {}, {}
  for i = 1, n do
    dts[i] = FLOATS[1 + math.floor(rng() * #FLOATS)]
    sizes[i] = 1 + math.floor(rng() * (i % 5 == 0 and 70000 or 300))
  end
  local flags = flags_of(n, place)
  local want_first, bad_steps = {}, 0
  local steps = {}
  for step = 1, 3 do
    local xs, any = {}, false
    for i = 1, n do
      local bad = {}
      if rng() < 0.15 then
        local vals = { 0 / 0, math.huge, -math.huge }
        bad[math.floor(rng() * sizes[i])] = vals[1 + math.floor(rng() * 3)]
      end
      xs[i] = random_tensor(rng, dts[i], sizes[i], bad, place)
      -- the reference: every element read back as a double
      local ok = true
      for _, v in ipairs(assert(xs[i]:totable())) do ok = ok and finite(v) end
      if not ok then
        any = true
        want_first[i] = want_first[i] or step
      end
    end
    steps[step] = xs
    assert(check(xs, flags, 0))
    local f = ints(flags)
    assert.equal(any and 1 or 0, f[1], "step " .. step .. ": the step's flag")
    for i = 1, n do
      assert.equal(want_first[i] or 0, f[HEAD + i], ("step %d: slot %d (%s)"):format(step, i - 1, dts[i]))
    end
    assert(require("uvmrec.lib").check(C.ur_nonfinite_end_step(nil, flags.p, 0)))
    if any then bad_steps = bad_steps + 1 end
    f = ints(flags)
    assert.same({ 0, step, bad_steps }, { f[1], f[2], f[3] })
  end
  return flags, steps
end

describe("ur_nonfinite_check", function()
  it("raises a tensor's flag at the step it first holds NaN or infinity, in every float dtype", function()
    for seed = 1, 3 do random_steps(seed) end
  end)

  it("keeps the step's flag up at the step's end when sticky, counting every step after as bad", function()
    local flags = flags_of(1)
    local x = random_tensor(uniform(4), "f32", 100, { [17] = 0 / 0 })
    assert(check({ x }, flags, 0))
    for _ = 1, 3 do assert(require("uvmrec.lib").check(C.ur_nonfinite_end_step(nil, flags.p, 1))) end
    assert.same({ 1, 3, 3, 1 }, ints(flags))
  end)

  it("refuses integer tensors, short flags and a negative slot, naming them", function()
    local flags = flags_of(1)
    local ok, err = check({ assert(ur.tensor({ 4 }, { dtype = "i32" })) }, flags, 0)
    assert.is_nil(ok)
    assert.matches("tensor 0 %(slot 0%) is i32; expected f32, bf16, f16 or f64", err)
    ok, err = check({ random_tensor(uniform(1), "f32", 4), random_tensor(uniform(2), "f32", 4) }, flags, 0)
    assert.is_nil(ok)
    assert.matches("flags are i32 of 4 elements; expected i32 of at least 5", err)
    ok, err = check({}, flags, -1)
    assert.is_nil(ok)
    assert.matches("from slot %-1; expected both >= 0", err)
  end)
end)

describe("tensor:find_nonfinite", function()
  it("gives the index of the first NaN or infinity, or nil", function()
    local rng = uniform(7)
    for _, dt in ipairs(FLOATS) do
      local t = random_tensor(rng, dt, 200000)
      assert.is_nil(t:find_nonfinite())
      t:set(150001, -math.huge)
      t:set(190000, 0 / 0)
      assert.equal(150001, t:find_nonfinite())
      t:set(3, 0 / 0)
      assert.equal(3, t:find_nonfinite())
    end
    assert.has_error(function() assert(ur.tensor({ 2 }, { dtype = "i64" })):find_nonfinite() end,
                     "tensor find_nonfinite: the tensor is i64; expected f32, bf16, f16 or f64")
  end)
end)

-- dlrm_tiny on the CPU (SGD on both sides unless sets say otherwise) and its optimizer.
local function tiny_model(sets)
  local cfg = helpers.tiny({ "train.batch_size=256" }, sets)
  local def = assert(train.model_def(cfg))
  local model = assert(def.build(cfg, { cpu = true }))
  return model, train.optimizer(cfg, model), cfg
end

-- Every number the model's training state holds: dense parameters, their optimizer's state,
-- every table and its optimizer state, as one list (bits compared by equality; NaN never
-- appears in a state that stayed finite).
local function state_of(model, opt)
  local out = {}
  local function add(t) for _, v in ipairs(assert(t:totable())) do out[#out + 1] = v end end
  for _, p in ipairs(model:parameters()) do add(p.tensor) end
  for i = 1, opt.n do
    if opt.state1[i] then add(opt.state1[i]) end
    if opt.state2[i] then add(opt.state2[i]) end
  end
  local tbe = model.embeddings.tbe
  for _, t in ipairs(tbe:tables()) do
    add(t.tensor)
    local st = tbe:state(t.name)
    for _, k in ipairs(tbe.state_names) do add(st[k]) end
  end
  return out
end

local function batches(n)
  local l = helpers.tiny_loader(256 * n)
  local out = {}
  for i = 1, n do
    local b = assert(l:next())
    out[i] = b:to("host")
  end
  l:close()
  return out
end

local function list_source(list)
  local k = 0
  return { next = function()
    k = k + 1
    return list[k]
  end, close = function() end }
end

-- Seven batches with Adam on both sides (on the GPU when device), the third made non-finite
-- and skipped with the flags read every `every` steps, against the run of the six others:
-- the same losses, step counts and every bit of the training state.  dtype: the tables' (bf16
-- rows are rounded stochastically, by a key drawn from the update's number).
local function adam_skip_matches_clean(every, device, dtype)
  local bs = batches(7)
  local function run(list, mode)
    local sets = { "train.batch_size=256", "embeddings.dtype=" .. (dtype or "f32") }
    for _, v in ipairs { "optimizer.name=adam", "embeddings.optimizer.name=adam", "optimizer.lr=0.01",
                         "embeddings.optimizer.lr=0.01" } do sets[#sets + 1] = v end
    local cfg = helpers.tiny(sets)
    local model = assert(assert(train.model_def(cfg)).build(cfg, { cpu = not device }))
    local opt = train.optimizer(cfg, model)
    local g = mode and guard.new(model, opt, mode)
    local losses = {}
    local hooks = { { after = function(_, rr) losses[#losses + 1] = rr.loss:get(0) end } }
    if g then table.insert(hooks, 1, g:hook { every = every }) end
    local src = list
    if device then
      src = {}
      for i, b in ipairs(list) do src[i] = assert(b:to("device")) end
    end
    local r = loop.run(model, opt, list_source(src), hooks)
    return losses, state_of(model, opt), r, { opt.step_count, model.embeddings.tbe:step() }
  end
  local clean = {}
  for i = 1, 7 do if i ~= 3 then clean[#clean + 1] = bs[i] end end
  local want_losses, want_state, _, want_counts = run(clean)
  bs[3].dense:set(0, 0 / 0)
  local got_losses, got_state, r, got_counts = run(bs, "skip")
  assert.equal(1, r.skipped)
  table.remove(got_losses, 3)
  assert.same(want_losses, got_losses)
  assert.same(want_counts, got_counts)
  assert.same(want_state, got_state)
end

describe("uvmrec.train.guard", function()
  for _, opt_sets in ipairs {
    { "optimizer.name=sgd", "embeddings.optimizer.name=sgd" },
    { "optimizer.name=adam", "embeddings.optimizer.name=adam", "optimizer.lr=0.01", "embeddings.optimizer.lr=0.01" },
    { "optimizer.name=adagrad", "embeddings.optimizer.name=rowwise_adagrad" },
    -- clipping's norm is NaN with the gradient: the step is held back all the same
    { "optimizer.clip_norm=0.01", "optimizer.name=adam", "embeddings.optimizer.name=adam" },
  } do
    it("leaves tables, parameters and optimizer state as they were after a skipped step (" .. opt_sets[1] .. ")",
       function()
      local model, opt = tiny_model(opt_sets)
      local g = guard.new(model, opt, "skip")
      local bs = batches(4)
      for i = 1, 2 do loop.step(model, opt, bs[i]) end
      local before = state_of(model, opt)
      bs[3].dense:set(5, 0 / 0)
      loop.step(model, opt, bs[3])
      assert.same(before, state_of(model, opt))
      for _, p in ipairs(opt.params) do assert.is_nil(p.grad:find_nonfinite()) end
      for _, p in ipairs(opt.params) do
        for _, v in ipairs(assert(p.grad:totable())) do assert.equal(0, v) end
      end
      local r = g:read()
      assert.same({ 3, 1 }, { r.steps, r.bad })
      -- a NaN among the dense features reaches the loss: the ReLUs pass NaN on (dense/act.h)
      assert.same({ step = 3, slot = 0, name = "loss" }, r.first)
      -- the next step trains again
      loop.step(model, opt, bs[4])
      assert.are_not.same(before, state_of(model, opt))
      assert.equal(1, g:read().bad)
      g:detach()
    end)
  end

  it("trains past a skipped batch as if it had never been there (SGD)", function()
    local bs = batches(9)
    local function run(list, mode)
      local model, opt = tiny_model { "optimizer.name=sgd", "embeddings.optimizer.name=sgd" }
      local g = mode and guard.new(model, opt, mode)
      local losses = {}
      local hooks = { { after = function(_, rr) losses[#losses + 1] = rr.loss:get(0) end } }
      if g then table.insert(hooks, 1, g:hook { every = 1 }) end
      local r = loop.run(model, opt, list_source(list), hooks)
      return losses, state_of(model, opt), r
    end
    local clean = {}
    for i = 1, 9 do if i ~= 5 then clean[#clean + 1] = bs[i] end end
    local want_losses, want_state = run(clean)
    bs[5].dense:set(0, math.huge)
    local got_losses, got_state, r = run(bs, "skip")
    assert.equal(1, r.skipped)
    table.remove(got_losses, 5)
    assert.same(want_losses, got_losses)
    assert.same(want_state, got_state)
    assert.equal(9, r.step)
  end)

  -- Adam's bias corrections count the updates made: the update after a skipped step must be
  -- the one a run that never saw the batch makes, whenever the flags are read (train.log_every)
  -- and in the tables (whose step count the engine keeps) as in the dense parameters.
  for _, every in ipairs { 1, 100 } do
    for _, dtype in ipairs { "f32", "bf16", "f16" } do
      it("trains past a skipped batch as if it had never been there (Adam, dense and " .. dtype .. " tables, "
         .. "flags read every " .. every .. ")", function()
        adam_skip_matches_clean(every, false, dtype)
      end)
    end
  end

  it("refuses a mode other than stop or skip", function()
    local model, opt = tiny_model()
    assert.has_error(function() guard.new(model, opt, "warn") end,
                     "guard: mode 'warn'; expected stop or skip (train.nonfinite: off has no guard)")
  end)
end)

-- A row of table C16 (10,000 rows; feature 16) that the tiny data's first `steps` batches of
-- 256 first read at batch `at` (nil: a row they never read).
local TABLE, KEY = "C16", 15
local function row_first_read(steps, at)
  local l = helpers.tiny_loader(256 * steps)
  local first = {}
  for s = 1, steps do
    local b = assert(l:next())
    local k = b.sparse
    local v = assert(k:values():totable())
    local o = assert(k:offsets():totable())
    -- key-major: the key's bags are the KEY-th run of stride bags
    local b0 = KEY * k:stride()
    for i = o[b0 + 1] + 1, o[b0 + k:stride() + 1] do
      local id = v[i]
      if not first[id] then first[id] = s end
    end
  end
  l:close()
  if at then
    local best
    for id, s in pairs(first) do if s == at and (not best or id < best) then best = id end end
    return best
  end
  for id = 0, 1e6 do if not first[id] then return id end end
end

local function nan_row(ctx, row)
  local t = ctx.model.embeddings:table(TABLE)
  local dim = t:size(2)
  t:set(row * dim + 2, 0 / 0)
end

describe("train.nonfinite", function()
  it("stops the run naming the step and the first non-finite tensor: NaN in a batch's dense features", function()
    local nan7 = { before = function(_, run, batch) if run.step + 1 == 7 then batch.dense:set(3, 0 / 0) end end }
    local ok, err = pcall(helpers.train_tiny, { "train.steps=12", "train.log_every=5", "eval.samples=0",
                                                "eval.min_auc=0" }, nil, { hooks = { nan7 } })
    assert.is_false(ok)
    -- the ReLUs pass NaN on (dense/act.h, as PyTorch's relu): the loss is the first non-finite tensor
    assert.matches("train.nonfinite: step 7: loss holds NaN or infinity %(the first non%-finite "
                   .. "tensor of that step; seen when the loss was read at step 10%); the run stops with the model "
                   .. "as after step 6", err)
  end)

  it("names the run's own step in a resumed run, and counts skipped steps from there", function()
    -- the guard took its first step from run.step before the trainer's start set a resumed run's
    -- (hooks start in order): resumed at step 4, a NaN at step 7 was named "step 3"
    local dir = command.tmpdir()
    local sets = { "train.log_every=5", "eval.samples=0", "eval.min_auc=0", "train.batch_size=256" }
    local function with(more)
      local t = { unpack(sets) }
      for _, v in ipairs(more) do t[#t + 1] = v end
      return t
    end
    helpers.train_tiny(with { "train.steps=4", "train.checkpoint_every=4" }, nil, { out = dir .. "/run" })
    local nan7 = { before = function(_, run, batch) if run.step + 1 == 7 then batch.dense:set(3, 0 / 0) end end }
    local ok, err = pcall(helpers.train_tiny, with { "train.steps=12" }, nil,
                          { out = dir .. "/run", resume = dir .. "/run", hooks = { nan7 } })
    assert.is_false(ok)
    assert.matches("train.nonfinite: step 7: loss holds NaN or infinity %(the first non%-finite "
                   .. "tensor of that step; seen when the loss was read at step 8%); the run stops with the model "
                   .. "as after step 6, the steps from 7 on not applied", err) -- read before its checkpoint of step 8
    local r = helpers.train_tiny(with { "train.steps=12", "train.nonfinite=skip" }, nil,
                                 { out = dir .. "/skip", resume = dir .. "/run/checkpoints", hooks = { nan7 } })
    local seen = {}
    for _, e in ipairs(r.events) do
      if e.event == "nonfinite" then seen[#seen + 1] = { e.step, e.skipped, e.new, e.first_step } end
    end
    assert.same({ { 8, 1, 1, 7 } }, seen)
    command.rmdir(dir)
  end)

  it("stops the run naming the step and the gradient that a model's backward made non-finite", function()
    local setup = function(ctx)
      local top = ctx.model.top
      local orig = top.backward
      local n = 0
      top.backward = function(self, input, grad)
        local out = orig(self, input, grad)
        n = n + 1
        if n == 4 then ctx.model.top.modules[3].grad_bias:set(0, -math.huge) end
        return out
      end
    end
    local ok, err = pcall(helpers.train_tiny, { "train.steps=8", "train.log_every=4", "eval.samples=0",
                                                "eval.min_auc=0" }, nil, { setup = setup })
    assert.is_false(ok)
    assert.matches("train.nonfinite: step 4: top.3.bias gradient holds NaN or infinity", err)
  end)

  it("stops the run at the step that first reads a NaN table row, logging the failure", function()
    local row = row_first_read(9, 6)
    assert.is_not_nil(row)
    local dir = command.tmpdir()
    local ok, err = pcall(helpers.train_tiny, { "train.steps=9", "train.log_every=3", "eval.samples=0",
                                                "eval.min_auc=0",
                                                "train.checkpoint_every=3", "train.batch_size=256" },
                          nil, { out = dir .. "/run", setup = function(ctx) nan_row(ctx, row) end })
    assert.is_false(ok)
    assert.matches("train.nonfinite: step 6: .* holds NaN or infinity", err)
    local events = assert(require("uvmrec.json").read_lines(dir .. "/run/metrics.jsonl"))
    assert.equal("failed", events[#events].event)
    assert.matches("step 6", events[#events].error)
    -- and where the run got to: the steps done before it and their samples
    assert.same({ 5, 5 * 256 }, { events[#events].step, events[#events].samples })
    -- the checkpoint of step 3 only: none saved after the bad step
    local saved = ck.list(dir .. "/run/checkpoints")
    assert.equal(1, #saved)
    assert.equal(3, saved[1].step)
    command.rmdir(dir)
  end)

  it("skips steps with NaN, counts them in the run log and the summary, and trains on", function()
    local nan = { before = function(_, run, batch)
      if run.step + 1 == 3 or run.step + 1 == 8 then batch.dense:set(0, 0 / 0) end
    end }
    local r = helpers.train_tiny({ "train.steps=12", "train.log_every=5", "eval.samples=0", "eval.min_auc=0",
                                   "train.nonfinite=skip" }, nil, { hooks = { nan } })
    assert.equal(2, r.result.skipped)
    local seen = {}
    for _, e in ipairs(r.events) do
      if e.event == "nonfinite" then seen[#seen + 1] = { e.step, e.skipped, e.new, e.first_step, e.tensor } end
      if e.event == "final" then assert.equal(2, e.skipped) end
    end
    assert.same({ { 5, 1, 1, 3, "loss" }, { 10, 2, 1, 3, "loss" } }, seen)
    local said = table.concat(r.lines, "\n")
    assert.matches("train.nonfinite: skip: 2 steps skipped", said)
    assert.equal(12, r.result.steps)
  end)

  it("counts the steps skipped before a resume: a resumed run reports the uninterrupted run's total", function()
    -- the count was not saved: resumed at step 4 (one step skipped by then), the run said 1 skipped of 2
    local nan = { before = function(_, run, batch)
      if run.step + 1 == 4 or run.step + 1 == 8 then batch.dense:set(0, 0 / 0) end
    end }
    local sets = { "train.log_every=5", "eval.samples=0", "eval.min_auc=0", "train.batch_size=256",
                   "train.nonfinite=skip" }
    local function with(more)
      local t = { unpack(sets) }
      for _, v in ipairs(more) do t[#t + 1] = v end
      return t
    end
    local whole = helpers.train_tiny(with { "train.steps=12" }, nil, { hooks = { nan } })
    assert.equal(2, whole.result.skipped)
    local dir = command.tmpdir()
    -- step 4 is skipped after the save at 3 and before any read but the last (done), which the
    -- end's save follows
    local first = helpers.train_tiny(with { "train.steps=4", "train.checkpoint_every=3" }, nil,
                                     { out = dir .. "/run", hooks = { nan } })
    assert.equal(1, first.result.skipped)
    local f = assert(ck.open(dir .. "/run/checkpoints/ckpt-000000000004.safetensors"))
    assert.equal(1, require("uvmrec.json").decode(f:meta("uvmrec.meta.trainer")).skipped)
    f:close()
    local rest = helpers.train_tiny(with { "train.steps=12" }, nil,
                                    { out = dir .. "/run", resume = dir .. "/run", hooks = { nan } })
    assert.equal(2, rest.result.skipped)
    local final, noted
    for _, e in ipairs(rest.events) do
      if e.event == "final" then final = e.skipped end
      if e.event == "nonfinite" and e.step > 4 then noted = { e.step, e.skipped, e.new } end
    end
    assert.same({ 2, { 9, 2, 1 } }, { final, noted }) -- read before the save at 9 (checkpoint_every 3 goes on)
    assert.matches("train.nonfinite: skip: 2 steps skipped", table.concat(rest.lines, "\n"))
    assert.same(whole.losses, rest.losses) -- and the run itself is the uninterrupted one's
    command.rmdir(dir)
  end)

  it("refuses to resume from or evaluate a checkpoint whose table holds NaN, naming tensor and element", function()
    local row = row_first_read(4, nil)
    local dir = command.tmpdir()
    local sets = { "train.steps=4", "train.log_every=2", "eval.samples=0", "eval.min_auc=0", "train.checkpoint_every=4",
                   "train.batch_size=256" }
    helpers.train_tiny(sets, nil, { out = dir .. "/run", setup = function(ctx) nan_row(ctx, row) end })
    local more = { "train.steps=6", "train.log_every=2", "eval.samples=0", "eval.min_auc=0", "train.checkpoint_every=4",
                   "train.batch_size=256" }
    local ok, err = pcall(helpers.train_tiny, more, nil, { out = dir .. "/run", resume = dir .. "/run" })
    assert.is_false(ok)
    local dim = 16
    assert.matches(("tensor 'embeddings.C16' holds NaN or infinity at element %d %%(row %d, column 2%%); refused "
                    .. "%%(load with allow_nonfinite, %%-%%-allow%%-nonfinite, to take it as it is%%)"):format(
                    row * dim + 2, row), err)
    local _, eerr = train.eval(helpers.tiny({ "eval.samples=512", "train.batch_size=256" }),
                               { checkpoint = dir .. "/run", cpu = true, print = function() end })
    assert.matches("tensor 'embeddings.C16' holds NaN or infinity", eerr)
    -- allowed: it loads, and training goes on (the row is not read in these steps)
    local r = helpers.train_tiny(more, nil, { out = dir .. "/run", resume = dir .. "/run", allow_nonfinite = true })
    assert.equal(6, r.result.steps)
    command.rmdir(dir)
  end)

  it("takes --allow-nonfinite on the command line", function()
    local row = row_first_read(2, nil)
    local dir = command.tmpdir()
    helpers.train_tiny({ "train.steps=2", "eval.samples=0", "eval.min_auc=0", "train.checkpoint_every=2",
                         "train.batch_size=256" }, nil,
                       { out = dir .. "/run", setup = function(ctx) nan_row(ctx, row) end })
    local base = "train dlrm_tiny --cpu --progress none --steps 3 --set eval.samples=0 --set eval.min_auc=0 "
      .. "--set train.batch_size=256 --resume " .. command.quote(dir .. "/run")
    local _, err, code = command.run(base)
    assert.equal(1, code)
    assert.matches("holds NaN or infinity", err)
    _, err, code = command.run(base .. " --allow-nonfinite")
    assert.equal(0, code, err)
    -- without a checkpoint to load the flag would be ignored: refused
    _, err, code = command.run("train dlrm_tiny --cpu --progress none --steps 1 --allow-nonfinite")
    assert.equal(2, code)
    assert.matches("^uvmrec train: %-%-allow%-nonfinite takes the checkpoint %-%-resume loads", err)
    _, err, code = command.run("eval dlrm_tiny --cpu --allow-nonfinite")
    assert.equal(2, code)
    assert.matches("^uvmrec eval: %-%-allow%-nonfinite takes the checkpoint %-%-checkpoint loads", err)
    command.rmdir(dir)
  end)
end)

-- ---- the GPU ----

describe("ur_nonfinite_check #cuda", function()
  helpers.cuda_it("raises the same flags on the GPU as the CPU reference, in every float dtype", function()
    for seed = 11, 13 do
      local cpu_flags, steps = random_steps(seed)
      local flags = flags_of(37, "device")
      for step = 1, 3 do
        local xs = {}
        for i, x in ipairs(steps[step]) do xs[i] = assert(x:to("device")) end
        assert(check(xs, flags, 0))
        assert(require("uvmrec.lib").check(C.ur_nonfinite_end_step(nil, flags.p, 0)))
      end
      assert.same(ints(cpu_flags), ints(assert(flags:to("host"))))
    end
  end)

  helpers.cuda_it("finds non-finite values in managed memory and keeps a sticky flag", function()
    local flags = flags_of(1, "device")
    local x = random_tensor(uniform(4), "bf16", 100000, { [99999] = math.huge }, "managed")
    assert(check({ x }, flags, 0))
    for _ = 1, 2 do assert(require("uvmrec.lib").check(C.ur_nonfinite_end_step(nil, flags.p, 1))) end
    assert.same({ 1, 2, 2, 1 }, ints(assert(flags:to("host"))))
  end)

  helpers.cuda_it("trains past a skipped batch on the GPU as if it had never been there (Adam; f32 and bf16 "
                  .. "tables), flags read every step or every 100", function()
    for _, dtype in ipairs { "f32", "bf16" } do
      adam_skip_matches_clean(1, true, dtype)
      adam_skip_matches_clean(100, true, dtype)
    end
  end)
  helpers.cuda_it("holds a guarded DLRM step on the GPU back as the CPU does: nothing changes", function()
    for _, sets in ipairs { {}, { "optimizer.name=adam", "embeddings.optimizer.name=adam" },
                            { "embeddings.optimizer.name=rowwise_adagrad", "model.precision=bf16" } } do
      local cfg = helpers.tiny({ "train.batch_size=256" }, sets)
      local def = assert(train.model_def(cfg))
      local model = assert(def.build(cfg))
      local opt = train.optimizer(cfg, model)
      local g = guard.new(model, opt, "skip")
      local bs = batches(3)
      for i = 1, 2 do loop.step(model, opt, assert(bs[i]:to("device"))) end
      local before = state_of(model, opt)
      bs[3].dense:set(5, 0 / 0)
      loop.step(model, opt, assert(bs[3]:to("device")))
      assert.same(before, state_of(model, opt))
      local r = g:read()
      assert.same({ 3, 1 }, { r.steps, r.bad })
      -- the loss where the bottom MLP's ReLUs pass NaN on (the CPU; cuBLASLt's epilogues in some
      -- kernels); else the first Linear's weight gradient (x^T gy with x's NaN row)
      assert.is_truthy(r.first.name == "loss" or r.first.name == "bottom.1.weight gradient", r.first.name)
      g:detach()
    end
  end)
end)
