-- Shared spec helpers: GPU and MPI guards, tolerant comparison and finite differences, a
-- reproducible random stream, Philox written out, the shared data and a Python with the optional
-- tools, and dlrm_tiny runs.
-- (Files, temporary folders and the command itself: command.lua; references: dense_ref.lua,
-- tbe_ref.lua.)
local ur = require "uvmrec"
local command = require "command"

local M = {}

-- True in a sanitizer build's run (make SAN=1 test preloads ASan's runtime): its quarantine of
-- freed memory and its shadow make a process's resident memory no measure of the engine's.
function M.asan()
  return (os.getenv("LD_PRELOAD") or ""):find("asan", 1, true) ~= nil
end

-- Why this machine lacks what an `it` needs (needs: gpus, the GPUs it takes; mpi, jobs of several
-- ranks; no_gpu, no GPU in use; asan, a run under the address sanitizer), or nil when it has it
-- all.  A GPU missing altogether under `make test-gpu` (UVMREC_REQUIRE_GPU=1) is an error
-- instead: that run is for them.
local function lacking(needs)
  if needs.gpus then
    if not ur.gpu() then
      if os.getenv("UVMREC_REQUIRE_GPU") == "1" then error("no GPU in use: " .. ur.cuda_error()) end
      return "no GPU: " .. ur.cuda_error()
    end
    if ur.devices() < needs.gpus then
      return ("%d GPUs needed, and this machine has %d"):format(needs.gpus, ur.devices())
    end
  end
  if needs.mpi then
    local mpi, why = M.have_mpi()
    if not mpi then return "no MPI here: " .. why end
  end
  if needs.no_gpu and ur.gpu() then return "a GPU is in use" end
  if needs.asan and not M.asan() then return "not under the address sanitizer (make SAN=1 test)" end
end

-- The one home of the guards below: an `it` in env (the calling spec file's: busted gives each
-- its own) tagged by what it needs, pending with the reason where the machine lacks it, never
-- passed without running.
local function guarded_it(env, name, needs, fn)
  local tags = (needs.gpus and " #cuda" or "") .. (needs.mpi and " #mpi" or "")
  env.it(name .. tags, function(...)
    local why = lacking(needs)
    if why then
      -- Looked up now: busted resolves `pending` through the context that is running.
      env.pending(why)
      return
    end
    return fn(...)
  end)
end

-- An `it` for GPU behaviour, tagged #cuda: without a GPU it shows as pending, never passed;
-- under `make test-gpu` (UVMREC_REQUIRE_GPU=1) a missing GPU fails it instead.  needs (optional,
-- before fn): gpus = n, pending on a machine of fewer; mpi = true, also tagged #mpi and pending
-- without MPI (M.have_mpi).
function M.cuda_it(name, needs, fn)
  if fn == nil then needs, fn = nil, needs end
  local n = { gpus = 1 }
  for k, v in pairs(needs or {}) do n[k] = v end
  guarded_it(getfenv(2), name, n, fn)
end

-- An `it` for a job of several ranks, tagged #mpi: without MPI (M.have_mpi) it shows as pending
-- with the reason, never passed.
function M.mpi_it(name, fn)
  guarded_it(getfenv(2), name, { mpi = true }, fn)
end

-- An `it` for behaviour without a GPU (the CPU's stand-ins, the messages that say one is
-- needed): with a GPU in use it shows as pending, never passed.
function M.no_gpu_it(name, fn)
  guarded_it(getfenv(2), name, { no_gpu = true }, fn)
end

-- An `it` for what the address sanitizer sees of the engine: outside `make SAN=1 test` it shows
-- as pending, never passed.
function M.asan_it(name, fn)
  guarded_it(getfenv(2), name, { asan = true }, fn)
end

-- Under the address sanitizer: a child process of the command runs `setup` (Lua code that
-- leaves a tensor in `t`, `ur` and `ffi` in reach), copies t's bytes with libc's memcpy (which
-- ASan's interceptor checks), then one element more.  Returns what ASan called the second
-- copy ("heap-buffer-overflow", "use-after-poison"); an error where the first copy failed or
-- the second went unreported.
function M.asan_over_read(setup)
  local path = os.tmpname()
  command.spit(path, [[
    local ffi = require "ffi"
    local ur = require "uvmrec"
    ffi.cdef "void *memcpy(void *, const void *, size_t);"
    local t
    ]] .. setup .. [[

    local n = t:nbytes()
    local buf, p = ffi.new("uint8_t[?]", n + 64), ur.C.ur_tensor_data(t.p)
    ffi.C.memcpy(buf, p, n)
    io.stdout:write("in bounds\n")
    io.stdout:flush()
    ffi.C.memcpy(buf, p, n + n / t:numel())
    io.stdout:write("one element past the end, unseen\n")
  ]])
  local out, err, code = command.sh(command.quote(command.bin()) .. " " .. command.quote(path))
  os.remove(path)
  local kind = err:match("ERROR: AddressSanitizer: ([%w-]+)")
  if out ~= "in bounds\n" or code == 0 or not kind then
    error(("%s: expected the copy in bounds to pass and ASan to report the one past the end; exit %s:\n%s%s")
      :format(setup, tostring(code), out, err), 2)
  end
  return kind
end

-- A wall-clock limit of s seconds for a spec, stretched fourfold under the sanitizers (make SAN=1
-- test preloads them), which slow the engine down that much.
function M.seconds(s)
  return (os.getenv("LD_PRELOAD") or ""):find("libasan", 1, true) and 4 * s or s
end

-- Philox4x32-10 (Salmon et al., SC'11), written out here as the reference: the four output
-- words for a counter and a key each below 2^53 or a uint64_t cdata; high (below 2^53,
-- default 0) is the counter's upper 64 bits (philox.h's ur_philox128).
local PM0, PM1, PW0, PW1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
local TWO32 = 4294967296

local function mulhilo(a, b)
  local p = require("ffi").cast("uint64_t", a) * b
  return tonumber(p / TWO32), tonumber(p % TWO32)
end

local function xor32(a, b) return bit.bxor(a, b) % TWO32 end

function M.philox(counter, seed, high)
  local c0, c1, c2, c3
  if type(counter) == "cdata" then
    c0, c1, c2, c3 = tonumber(counter % TWO32), tonumber(counter / TWO32), 0, 0
  else
    c0, c1, c2, c3 = counter % TWO32, math.floor(counter / TWO32), 0, 0
  end
  if high then c2, c3 = high % TWO32, math.floor(high / TWO32) end
  local k0, k1
  if type(seed) == "cdata" then
    k0, k1 = tonumber(seed % TWO32), tonumber(seed / TWO32)
  else
    k0, k1 = seed % TWO32, math.floor(seed / TWO32)
  end
  for _ = 1, 10 do
    local hi0, lo0 = mulhilo(PM0, c0)
    local hi1, lo1 = mulhilo(PM1, c2)
    c0, c1, c2, c3 = xor32(xor32(hi1, c1), k0), lo1, xor32(xor32(hi0, c3), k1), lo0
    k0, k1 = (k0 + PW0) % TWO32, (k1 + PW1) % TWO32
  end
  return c0, c1, c2, c3
end

-- a within tol of b, relative to max(floor, |b|) (floor: 1 unless given).
function M.near(a, b, tol, what, floor)
  local d = math.abs(a - b)
  if d ~= d or d > tol * math.max(floor or 1, math.abs(b)) then
    error(("%s: %.9g differs from %.9g by more than %g (relative)"):format(what or "value", a, b, tol), 2)
  end
end

-- f() raises msg at a line of the file f is written in: a misuse the library raises with
-- error(msg, 2) names its caller's line, not one of the library's.  Else an error saying what
-- was raised.
function M.raises_at_caller(f, msg)
  local file = debug.getinfo(f, "S").source:match("([^/@]*)$")
  local ok, err = pcall(f)
  local at = not ok and tostring(err):gsub("^.-(" .. file:gsub("%p", "%%%0") .. "):%d+:", "%1:", 1)
  if at ~= file .. ": " .. msg then
    error(("expected an error at a line of %s: %s\nraised: %s"):format(file, msg, ok and "none" or tostring(err)), 2)
  end
end

-- Lists a and b equal element by element (a against the expected b): else an error naming
-- the first element that differs.
function M.same_list(a, b, what)
  if #a ~= #b then error(("%s: %d elements, expected %d"):format(what, #a, #b), 2) end
  for i = 1, #a do
    if a[i] ~= b[i] then
      error(("%s: element %d is %s, expected %s"):format(what, i, tostring(a[i]), tostring(b[i])), 2)
    end
  end
end

-- d f / d vals[i] by central differences with step h: f() reads vals and returns a number.
function M.central_difference(f, vals, i, h)
  local v = vals[i]
  vals[i] = v + h
  local a = f()
  vals[i] = v - h
  local b = f()
  vals[i] = v
  return (a - b) / (2 * h)
end

-- A 2-D tensor's rows as Lua lists: rows(t)[r][c] is element [r - 1, c - 1].
function M.rows(t)
  local flat, n, c = t:totable(), t:size(1), t:size(2)
  local out = {}
  for r = 1, n do
    local row = {}
    for j = 1, c do row[j] = flat[(r - 1) * c + j] end
    out[r] = row
  end
  return out
end

-- A small LCG for random inputs that stay the same across LuaJIT versions (math.random's
-- stream may not): rng(n) draws an integer in 1..n.
function M.rng(seed)
  local s = seed
  return function(n)
    s = (s * 1103515245 + 12345) % 2147483648
    return math.floor(s / 65536) % n + 1
  end
end

-- Sizes drawn from rng (M.rng) that add up to n, zeros among them, and a 0 last: a random
-- split of n keys into segments (KJT split).
function M.random_sizes(rng, n)
  local sizes, left = {}, n
  while left > 0 do
    local s = rng(left + 1) - 1
    sizes[#sizes + 1] = s
    left = left - s
  end
  sizes[#sizes + 1] = 0
  return sizes
end

-- A KJT of n weighted bags for each of keys, drawn from rng (M.rng): a bag holds 0 to most - 1
-- ids below ids[key] (ids: a table by key, or one count for every key), each weighted k / den
-- for k in 1..den.
function M.weighted_kjt(rng, keys, n, ids, most, den)
  local values, lengths, weights = {}, {}, {}
  for _, key in ipairs(keys) do
    local rows = type(ids) == "table" and ids[key] or ids
    for _ = 1, n do
      local len = rng(most) - 1
      lengths[#lengths + 1] = len
      for _ = 1, len do
        values[#values + 1] = rng(rows) - 1
        weights[#weights + 1] = rng(den) / den
      end
    end
  end
  return ur.KJT { keys = keys, values = values, lengths = lengths, weights = weights }
end

-- A fixture of spec/fixtures/ by name (real Criteo rows: spec/fixtures/README.md), for specs run
-- from the tree's root, as make test and `uvmrec test` run them.
-- A loader drained: every batch's size until it ends, their sum, and the error it ended with
-- (nil at the end).
function M.drain(l)
  local sizes, n = {}, 0
  local b, err = l:next()
  while b do
    sizes[#sizes + 1], n = b.size, n + b.size
    b, err = l:next()
  end
  return sizes, err, n
end

function M.fixture(name)
  return "spec/fixtures/" .. name
end

-- A Python for which `probe` (Python code) succeeds: UVMREC_PYTHON, build/venv's (make pydeps,
-- make pydeps-torch: the pinned versions), then python3; nil when none.
function M.python(probe)
  for _, py in ipairs { os.getenv("UVMREC_PYTHON") or "", "build/venv/bin/python", "python3" } do
    local r = py ~= "" and os.execute(py .. " -c " .. command.quote(probe) .. " >/dev/null 2>&1")
    if r == 0 or r == true then return py end
  end
end

-- dlrm_tiny's config with the given lists of --set values, in order.
function M.tiny(...)
  local train = require "uvmrec.train"
  local all = {}
  for i = 1, select("#", ...) do
    for _, s in ipairs(select(i, ...) or {}) do all[#all + 1] = s end
  end
  return assert(train.config.load(assert(train.find_config("dlrm_tiny")), all))
end

-- The losses of `steps` training steps of cfg's model on the CPU (on_cpu) or the GPU, its
-- batches from cfg's data through the loader (on the device for the GPU), and the model and data.
function M.step_losses(cfg, on_cpu, steps)
  local train = require "uvmrec.train"
  local def = assert(train.model_def(cfg))
  local model = assert(def.build(cfg, { cpu = on_cpu }))
  local opt = train.optimizer(cfg, model)
  local data = assert(train.data(cfg, train.config.table_rows(cfg)))
  local loader = assert(ur.data.loader(data.train))
  local source = train.source.loader(loader, { placement = not on_cpu and "device" or nil })
  local out = {}
  for s = 1, steps do out[s] = train.loop.step(model, opt, assert(source:next())):get(0) end
  source:free()
  loader:close()
  return out, model, data
end

-- The bytes a model's dense part holds outside its arena: each trained parameter, its gradient
-- and its bf16 copy, and the optimizer's state.
function M.dense_bytes(model, opt)
  local n = 0
  for _, p in ipairs(model:parameters()) do
    if p.grad then n = n + p.tensor:nbytes() + p.grad:nbytes() + (p.half and p.half:nbytes() or 0) end
  end
  for _, st in ipairs { opt.state1, opt.state2 } do
    for _, t in pairs(st) do n = n + t:nbytes() end
  end
  return n
end

-- {step = loss} of a run directory's train lines, and how many steps.  A step logged twice (a
-- killed run's steps after its last checkpoint, done again by the resumed run) must have the
-- same loss both times.
function M.losses(dir)
  local json = require "uvmrec.json"
  local out, n = {}, 0
  for _, e in ipairs(assert(json.read_lines(dir .. "/metrics.jsonl"))) do
    if e.event == "train" then
      if out[e.step] == nil then n = n + 1
      elseif out[e.step] ~= e.loss then
        error(("step %d logged twice with losses %.17g and %.17g"):format(e.step, out[e.step], e.loss), 2)
      end
      out[e.step] = e.loss
    end
  end
  return out, n
end

-- dlrm_tiny trained quietly (train.run) with the lists of --set values: {losses = {step =
-- loss}, logged = how many steps have one, events = metrics.jsonl's, lines = what it printed,
-- result = run's}.  opts go to
-- train.run (cpu = true unless opts.cpu is false); without opts.out the run directory is a
-- fresh one, removed afterwards.
function M.train_tiny(sets, more, opts)
  local train, json = require "uvmrec.train", require "uvmrec.json"
  local tmp = not (opts and opts.out) and command.tmpdir()
  local lines = {}
  local o = { out = tmp and tmp .. "/run", progress = "none", print = function(l) lines[#lines + 1] = l end }
  for k, v in pairs(opts or {}) do o[k] = v end
  o.cpu = o.cpu ~= false
  local result, err = train.run(M.tiny(sets, more), o)
  local out = result and { result = result, lines = lines,
                           events = assert(json.read_lines(o.out .. "/metrics.jsonl")) }
  if out then out.losses, out.logged = M.losses(o.out) end
  if tmp then command.rmdir(tmp) end
  if not result then error(err, 2) end
  return out
end

-- Trained runs for the serving specs, each made once per spec run (kept in a temporary folder):
-- "tiny" (dlrm_tiny on its synthetic data, 120 steps), "criteo" (dlrm_tiny on the shared Criteo
-- sample, 20 steps of 100, held out: the second sample), "dcnv2" and "dcnv2_rank" (DCNv2, full and
-- low rank).  Returns {dir, run (the run directory), result (train.run's)}; nil, why when a file
-- it needs is missing.
local trained = {}
local TRAINED = {
  tiny = { "train.steps=120", "train.batch_size=1024", "eval.samples=16384", "eval.every=0", "eval.min_auc=0" },
  criteo = { "train.steps=20", "train.batch_size=100", "train.epochs=2", "eval.min_auc=0", "eval.every=0" },
  dcnv2 = { "model.interaction=dcnv2", "model.cross_layers=2", "model.bottom_mlp=32,8", "train.steps=40",
            "train.batch_size=512", "eval.samples=4096", "eval.every=0", "eval.min_auc=0" },
  -- every third table weighted (the preset's C3, C6, ...): a model taking weighted requests
  multihot = { "data.train=synthetic:tiny_multihot", "train.steps=30", "train.batch_size=256", "eval.samples=2048",
               "eval.every=0", "eval.min_auc=0" },
  dcnv2_rank = { "model.interaction=dcnv2", "model.cross_layers=2", "model.cross_rank=16", "train.steps=40",
                 "train.batch_size=512", "eval.samples=4096", "eval.every=0", "eval.min_auc=0" },
}
function M.trained(kind)
  if trained[kind] then return trained[kind] end
  local sets = { unpack(TRAINED[kind]) }
  if kind == "criteo" then
    local a, b = M.fixture("criteo_raw_sample.tsv"), M.fixture("criteo_raw_sample2.tsv")
    if not command.exists(a) or not command.exists(b) then return nil, "no " .. a end
    sets[#sets + 1] = "data.train=criteo-tsv:" .. a
    sets[#sets + 1] = "data.eval=criteo-tsv:" .. b
  end
  local dir = command.tmpdir()
  local train = require "uvmrec.train"
  local cfg = M.tiny(sets)
  cfg.train.checkpoint_every = cfg.train.steps
  local result = assert(train.run(cfg, { out = dir .. "/run", progress = "none", cpu = true, print = function() end }))
  trained[kind] = { dir = dir, run = dir .. "/run", result = result }
  return trained[kind]
end

-- The model file of a trained run (M.trained) exported with opts (uvmrec.serve.export's: tables,
-- per_table, dense), made once per run.
local exported = {}
function M.exported(kind, opts)
  opts = opts or {}
  local key = kind .. ":" .. require("uvmrec.json").encode(opts)
  if exported[key] then return exported[key] end
  local t, why = M.trained(kind)
  if not t then return nil, why end
  local path = ("%s/%s_%s%s.safetensors"):format(t.dir, kind, opts.tables or "int8", opts.dense or "")
  local o = { out = path }
  for k, v in pairs(opts) do o[k] = v end
  exported[key] = assert(require("uvmrec.serve.export").run(t.run, o)).path
  return exported[key]
end

-- A loader of `samples` samples of the synthetic tiny data in batches of batch_size (256).
function M.tiny_loader(samples, batch_size)
  return assert(ur.data.loader { data = "synthetic:tiny", samples = samples, batch_size = batch_size or 256 })
end

-- Whether jobs of several ranks can run here: the engine's MPI plugin loads and mpirun is there;
-- else false and why not.
function M.have_mpi()
  local mpi, why = require("uvmrec.dist").mpi()
  if not mpi then return false, why end
  if not command.have("mpirun") then return false, "mpirun is not on PATH" end
  return true
end

-- A job of n ranks (command.sh's out, err and code) ended well: exit code 0 and a line
-- "rank <r>: ok" from every rank; else an error with the job's output.
function M.ranks_ok(n, out, err, code)
  if code ~= 0 then error(("a job of %d ranks exited with %s:\n%s%s"):format(n, tostring(code), out, err), 2) end
  for r = 0, n - 1 do
    if not out:find("rank " .. r .. ": ok", 1, true) then
      error(("rank %d of %d did not say 'rank %d: ok':\n%s%s"):format(r, n, r, out, err), 2)
    end
  end
end

-- Whether an M.mpi_it spec can start `uvmrec launch` in the background and send it SIGINT
-- (command.background's env --default-signal); marks the spec pending with the reason when not.
function M.can_signal_launch()
  local pending = getfenv(2).pending -- the calling spec's (busted gives each file its own)
  if not command.can_background() then
    pending("env --default-signal (coreutils 8.31) is needed to start launch in the background")
    return false
  end
  return true
end

-- The path of build/bin/<name>, a test program `make test` builds beside the command (a C program
-- linked with the engine, some of its calls wrapped); in a dist tree, which ships none, it marks
-- the calling spec pending and returns nil (the spec returns).  One not built fails the spec.
function M.test_program(name)
  if not command.exists("engine/include/uvmrec.h") then
    getfenv(2).pending(("a dist tree ships no test programs (make test builds build/bin/%s)"):format(name))
    return nil
  end
  local p = (command.bin():match("^(.*)/[^/]*$") or ".") .. "/" .. name
  assert(command.exists(p), p .. " is not built (make test builds it)")
  return p
end

-- Placements this machine can hold.
function M.placements()
  local p = { "host", "pinned", "managed" }
  if ur.gpu() then p[#p + 1] = "device" end
  return p
end

-- An LFU cache (decay every batch) of cached tables a and b, a set of 32 ways each, driven
-- past the 16-bit wrap of its counts' epochs: a's row 0 read in batch 1, b's row 0 alone in
-- batches 2..65535, a's rows 1..31 in batch 65536 and a's row 32 in batch 65537 (epoch 1
-- again, row 0's).  device: "cpu" or a GPU.  Returns the cache (cache_spec, cache_cuda_spec).
function M.lfu_past_wrap(device)
  local R = require "tbe_ref"
  local m = ur.nn.EmbeddingBagCollection{ device = device, seed = 5, optimizer = { "sgd", lr = 0.1 },
    tables = { { name = "a", rows = 1000, dim = 4, placement = "cached" },
               { name = "b", rows = 1000, dim = 4, placement = "cached" } },
    cache = { slots = 64, policy = "lfu", decay_batches = 1, min_slots = 0 } }
  local function batches(a, b, n)
    local values, offsets = {}, { 0 }
    for _, ids in ipairs({ a, b }) do -- one bag a table
      for _, id in ipairs(ids) do values[#values + 1] = id end
      offsets[#offsets + 1] = #values
    end
    local x = R.input({ values = values, offsets = offsets }, device == "cpu" and "host" or "device")
    for _ = 1, n or 1 do assert(m:retire(assert(m:prepare(x)), false)) end
  end
  local rest = {}
  for k = 1, 31 do rest[k] = k end
  batches({ 0 }, { 0 })
  batches({}, { 0 }, 65534)
  batches(rest, {})
  batches({ 32 }, {})
  assert(m.tbe.cache._next_ticket == 65538, "the batches had tickets 1..65537")
  return m.tbe.cache
end

-- An LFU cache on `device` ("cpu" or a GPU) of one set of 32 ways whose rows 0..31 were read
-- 5 times; rows 0..3 are dropped (cache:drop: their counts reset), read once, and rows 100..103
-- read: the dropped rows, least read since, made room (cache_spec, cache_cuda_spec).  Returns
-- the cache and the number drop gave.
function M.lfu_after_drop(device)
  local R = require "tbe_ref"
  local m = ur.nn.EmbeddingBagCollection{ device = device, seed = 5, optimizer = { "sgd", lr = 0.1 },
    tables = { { name = "a", rows = 1000, dim = 4, placement = "cached" } },
    cache = { slots = 32, policy = "lfu", min_slots = 0 } }
  local function batch(ids)
    local offsets = {}
    for k = 0, #ids do offsets[k + 1] = k end -- one bag an id
    local x = R.input({ values = ids, offsets = offsets }, device == "cpu" and "host" or "device")
    assert(m:retire(assert(m:prepare(x)), false))
  end
  local all = {}
  for k = 0, 31 do all[#all + 1] = k end
  for _ = 1, 5 do batch(all) end
  local dropped = assert(m.tbe.cache:drop("a", { 0, 1, 2, 3 }))
  batch({ 0, 1, 2, 3 })
  batch({ 100, 101, 102, 103 })
  return m.tbe.cache, dropped
end

M.dtypes = { "f32", "bf16", "f16", "i8", "u8", "i32", "i64" }

-- libuvmrec's folder and the folder of the C sources (the tree's root, where the specs run), for
-- specs that build C programs against the library; nil, why in a tree without both (a dist tree
-- ships the engine, lib/libuvmrec.so, but not its sources).
function M.engine_lib()
  local so = package.searchpath("libuvmrec", package.cpath)
  if not so then return nil, "no libuvmrec.so in this tree" end
  if not command.exists("engine/include/uvmrec.h") then
    return nil, "no C sources in this tree (engine/include/uvmrec.h): a dist tree ships the engine, not its sources"
  end
  return so:match("^(.*)/[^/]*$"), "."
end

-- The C file rel of the tree built with cc into dir/name, linked against libuvmrec (header_only:
-- against nothing, with engine/src's internal headers in reach and the engine's float flags, no
-- fused multiply-adds); the executable's path, or nil, why in a tree without the C sources (or,
-- linked, without libuvmrec.so). A dist tree carries some built, in spec/bin/ (make dist).
function M.build_c(rel, dir, name, header_only)
  local libdir, root = M.engine_lib()
  if header_only and command.exists("engine/include/uvmrec.h") then libdir, root = ".", "." end
  if not libdir and command.exists("spec/bin/" .. name) then return "spec/bin/" .. name end
  if not libdir then return nil, root end
  local exe, src = dir .. "/" .. name, root .. "/" .. rel
  local line = header_only
      and ("cc -std=c11 -O2 -ffp-contract=off -Iengine/include -Iengine/src %s -lm -o %s 2>&1"):format(src, exe)
      or ("cc -std=c11 -O2 -Iengine/include %s -L%s -luvmrec -lpthread -lm -Wl,-rpath,%s -o %s 2>&1")
          :format(src, libdir, libdir, exe)
  local out, _, code = command.sh(line)
  if code ~= 0 then error(("%s: cc exited with %s:\n%s"):format(rel, tostring(code), out), 2) end
  return exe
end

-- A header-only C check, engine/tests/<name>.c, built and run once in a folder of its own, `env`
-- (VAR=value ...) before it: what it printed; fails the spec where it exits other than 0; nil
-- and why where it cannot be built here (the spec is then pending).
function M.run_c_check(name, env)
  local dir = command.tmpdir()
  local exe, why = M.build_c("engine/tests/" .. name .. ".c", dir, name, true)
  if not exe then return nil, why end
  local out, err, code = command.sh((env and env .. " " or "") .. exe)
  command.rmdir(dir)
  if code ~= 0 then error(("%s exited with %s:\n%s%s"):format(name, tostring(code), out, err), 2) end
  return out
end

-- CRC32C (Castagnoli, reflected 0x82F63B78) of a string, bit by bit, as 8 hex digits: the
-- reference of the checksums a safetensors save keeps ("123456789" gives e3069283).
function M.crc32c(str)
  local c = 0xFFFFFFFF
  for i = 1, #str do
    c = bit.bxor(c, str:byte(i))
    for _ = 1, 8 do
      c = bit.band(c, 1) ~= 0 and bit.bxor(bit.rshift(c, 1), 0x82F63B78) or bit.rshift(c, 1)
    end
  end
  return bit.tohex(bit.bnot(c))
end

-- The reference of a safetensors header's own checksum (uvmrec.header_crc32c) of file text
-- `text`: every metadata pair but that one by key ("key\0value\0"), then every tensor by name
-- ("name\0DTYPE [shape] begin end\0"), as 8 hex digits.
function M.header_crc32c(text)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + text:byte(i) end
  local header = assert(require("uvmrec.json").decode(text:sub(9, 8 + n)))
  local parts, keys, names = {}, {}, {}
  for k in pairs(header.__metadata__ or {}) do
    if k ~= "uvmrec.header_crc32c" then keys[#keys + 1] = k end
  end
  for k in pairs(header) do if k ~= "__metadata__" then names[#names + 1] = k end end
  table.sort(keys)
  table.sort(names)
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. "\0" .. header.__metadata__[k] .. "\0" end
  for _, k in ipairs(names) do
    local e = header[k]
    parts[#parts + 1] = ("%s\0%s [%s] %d %d\0"):format(k, e.dtype, table.concat(e.shape, ", "), e.data_offsets[1],
      e.data_offsets[2])
  end
  return M.crc32c(table.concat(parts))
end

-- The bytes of safetensors file text `text` with tensor `name`'s checksum set to what its bytes
-- (info: the file's info of it) now give, and the header's then: a change a checksum does not
-- catch (a writer's bug).
function M.restamp(text, name, info)
  local key = '\\"' .. name .. '\\":\\"'
  local at = assert(text:find(key, 1, true), name)
  local crc = M.crc32c(text:sub(info.offset + 1, info.offset + info.nbytes))
  text = text:sub(1, at + #key - 1) .. crc .. text:sub(at + #key + 8)
  key = '"uvmrec.header_crc32c":"'
  at = text:find(key, 1, true)
  if not at then return text end
  return text:sub(1, at + #key - 1) .. M.header_crc32c(text) .. text:sub(at + #key + 8)
end

-- Runs script in a child process whose prelude gives it ffi, cap(kib), the address space
-- limited to what the process maps now and kib KiB more (allocations past 64 KiB mapped apart,
-- so that one fails at the cap), and uncap(); returns its output.  Under a sanitizer: nil (its
-- shadow memory does not fit under a cap: the caller's case is pending).  The cache's, the
-- collisions' and the maps' specs free or allocate there.
function M.capped_child(script)
  if (os.getenv("LD_PRELOAD") or ""):match("libasan") then return nil end
  local path = os.tmpname()
  command.spit(path, [[
    local ffi = require "ffi"
    ffi.cdef "struct capped_rlimit { uint64_t cur, max; }; int setrlimit(int, const struct capped_rlimit *);"
    local lim = ffi.new("struct capped_rlimit", -1ULL, -1ULL)
    local function cap(kib)
      local vm
      for l in io.lines("/proc/self/status") do vm = vm or tonumber(l:match("^VmSize:%s+(%d+)")) end
      lim.cur = (vm + kib) * 1024
      assert(ffi.C.setrlimit(9, lim) == 0) -- RLIMIT_AS
    end
    local function uncap()
      lim.cur = -1ULL
      assert(ffi.C.setrlimit(9, lim) == 0)
    end
  ]] .. script)
  local out, err, code = command.sh("MALLOC_MMAP_THRESHOLD_=65536 " .. command.quote(command.bin()) .. " "
                                    .. command.quote(path))
  os.remove(path)
  assert(code == 0, err)
  return out
end

return M
