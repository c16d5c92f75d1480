-- Serving benchmark (BENCH.md B11): a trained run exported in several table formats, each file's
-- AUC on the run's held-out samples against the f32 file's and its size, then its speed through
-- the C serving API from client threads (engine/examples/serve_bench, `make examples`) next to
-- PyTorch eager inference of the same file (scripts/bench/torch_serve.py, where PyTorch is).
--
--   uvmrec scripts/bench/serve.lua --run RUNDIR [--formats f32,int8,int4] [--configs 4096x1,1x1,...]
--        [--seconds S] [--requests N] [--dir DIR] [--python PY] [--no-torch] [--no-speed]
--        [--gpu [--placement device|managed|host] [--hot-fraction F] [--hbm-budget 8GiB]] [--out FILE]
--
-- Before any time is reported: PyTorch's probabilities of the first 4096 requests must be
-- uvmrec's within 2e-6 (the same dequantized rows, another summation order), and every quantized
-- file's must be the f32 file's within its format's error.  Requests are the run's first held-out
-- samples (Zipf ids as trained on), rotated through by each client from its own offset.
-- Prints two tables and writes JSON lines to --out.
local ur = require "uvmrec"
local json = require "uvmrec.json"
local serve = require "uvmrec.serve"
local export = require "uvmrec.serve.export"
local ck = require "uvmrec.checkpoint"
local tensor = require "uvmrec.tensor"
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/serve.lua",
  summary = "serving benchmark (BENCH.md B11): AUC and size per table format, then samples/s and p50/p99 latency "
    .. "from client threads next to PyTorch",
  { "--run RUNDIR", "a training run directory or checkpoint (exported here in each format)", required = true },
  { "--formats LIST", "table formats to export and measure", type = "list",
    choices = { "f32", "fp16", "int8", "int4", "int2" }, default = { "f32", "fp16", "int8", "int4" } },
  { "--speed-formats LIST", "formats whose speed is measured", type = "list",
    choices = { "f32", "fp16", "int8", "int4", "int2" }, default = { "f32", "int8", "int4" } },
  { "--configs LIST", "BATCHxTHREADS to measure", type = "list",
    default = { "4096x1", "1x1", "1x4", "1x16", "64x1", "64x4", "64x16", "512x1", "512x4", "512x16" } },
  { "--seconds S", "measured seconds per configuration", type = "number", default = 3 },
  { "--requests N", "held-out samples the clients rotate through", type = "whole", default = 65536 },
  { "--dir DIR", "where the model files and requests go (default: a folder in /tmp)" },
  { "--python PY", "the Python with PyTorch (default: build/venv's, else python3)" },
  options.no_torch,
  { "--no-speed", "only the accuracy table" },
  { "--gpu", "serve on the GPU (the tables where --placement says; PyTorch on cuda)" },
  { "--placement P", "where the tables live when serving", choices = { "device", "managed", "host" } },
  { "--hot-fraction F", "managed tables: the share of each table's leading rows preferred on the GPU", type = "number",
    default = 0.2 },
  { "--hbm-budget BYTES", "the engine's HBM budget while serving (a model larger than the HBM it is given)" },
  options.out_append,
}
local o = cmd:parse(arg)
if o.gpu and not ur.gpu() then cmd:fail("--gpu: no GPU in use: " .. ur.cuda_error()) end

-- A shell command's output (stderr too) and whether it exited 0.
local function sh(line)
  local p = io.popen("(" .. line .. ") 2>&1; echo \"__exit=$?\"")
  local text = p:read("*a")
  p:close()
  local code = tonumber(text:match("__exit=(%d+)\n$"))
  return (text:gsub("__exit=%d+\n$", "")), code == 0
end

local dir = o.dir or sh("mktemp -d /tmp/uvmrec-serve.XXXXXX"):gsub("%s+$", "")
os.execute("mkdir -p '" .. dir .. "'")
local device = o.gpu and 0 or "cpu"
local function emit(t)
  t.bench, t.date, t.machine = "serve", os.date("!%Y-%m-%d"), o.gpu and "gpu" or "cpu"
  if o.out then json.append_lines(o.out, t) end
end

-- ---- the files ----

local files, sizes = {}, {}
local ckpt = assert(require("uvmrec.train").checkpoint_file(o.run))
local ckpt_bytes = assert(ck.open(ckpt)):bytes()
local formats = { "f32" }
for _, f in ipairs(o.formats) do if f ~= "f32" then formats[#formats + 1] = f end end
-- and those whose speed is measured (none with --no-speed: it exported and scored the default int4)
for _, f in ipairs(o.no_speed and {} or o.speed_formats) do
  local have = false
  for _, g in ipairs(formats) do have = have or g == f end
  if not have then formats[#formats + 1] = f end
end
for _, f in ipairs(formats) do
  files[f] = ("%s/model_%s.safetensors"):format(dir, f)
  local r, err = export.run(ckpt, { out = files[f], tables = f })
  if not r then cmd:fail(err) end
  sizes[f] = r.bytes
end

-- ---- accuracy ----

print(("B11 accuracy: %s (checkpoint %d bytes), held-out samples of its training run"):format(ckpt, ckpt_bytes))
print(("%-6s %10s %12s %10s %14s"):format("tables", "AUC", "change", "log loss", "file bytes"))
local base
local opened = {}
for _, f in ipairs(formats) do
  local m = assert(serve.open(files[f], { device = device, placement = o.placement }))
  opened[f] = m
  local r = assert(serve.evaluate(m))
  if not r.auc then cmd:fail(("%s: the held-out AUC is undefined (%s)"):format(f, r.auc_undefined)) end
  base = base or r
  print(("%-6s %10.6f %+12.6f %10.6f %14d"):format(f, r.auc, r.auc - base.auc, r.logloss, sizes[f]))
  emit { kind = "accuracy", format = f, auc = r.auc, auc_change = r.auc - base.auc, logloss = r.logloss,
         samples = r.samples, bytes = sizes[f], checkpoint_bytes = ckpt_bytes, model = files[f] }
end
if o.no_speed then return end

-- ---- requests and the checks ----

local m32 = opened.f32
local lopts = assert(serve.data(m32, nil, { batch_size = o.requests }))
local loader = assert(ur.data.loader(lopts))
local batch = assert(loader:next())
local n = batch.size
local values = batch.sparse:values():totable()
local nf = #batch.sparse:keys()
local ids = assert(tensor.tensor({ n, nf }, { dtype = "i64" }))
local flat = require("ffi").new("int64_t[?]", n * nf)
for s = 0, n - 1 do
  for f = 0, nf - 1 do flat[s * nf + f] = values[f * n + s + 1] end
end
assert(ur.C.ur_tensor_write(ids.p, 0, n * nf, flat) == 0)
local dense_path, ids_path = dir .. "/dense.npy", dir .. "/ids.npy"
assert(ur.C.ur_npy_save(dense_path, batch.dense.p, nil) == 0, "npy save")
assert(ur.C.ur_npy_save(ids_path, ids.p, nil) == 0, "npy save")
local CHECK = math.min(4096, n)
local check_batch = assert(ur.data.loader((function()
  local l = {}
  for k, v in pairs(lopts) do l[k] = v end
  l.batch_size = CHECK
  return l
end)())):next()
local ref = m32:predict(check_batch):totable()
local checks = {}
for _, f in ipairs(o.speed_formats) do
  local p = opened[f]:predict(check_batch)
  local sum = 0
  for i, v in ipairs(p:totable()) do sum = sum + math.abs(v - ref[i]) end
  -- each format's error moves a probability by little on average; a wrong table, by much more
  local allowed = ({ f32 = 0, fp16 = 1e-4, int8 = 1e-3, int4 = 1e-2, int2 = 5e-2 })[f]
  if sum / CHECK > allowed then
    cmd:fail(("check: the %s file's probabilities differ from f32's by %.3g on average (allowed %g)"):format(
      f, sum / CHECK, allowed))
  end
  print(("check (%s): probabilities within %.3g of the f32 file's on average"):format(f, sum / CHECK))
  checks[f] = dir .. "/check_" .. f .. ".npy"
  assert(ur.C.ur_npy_save(checks[f], p.p, nil) == 0, "npy save")
end
loader:close()
for _, m in pairs(opened) do m:close() end

-- ---- speed ----

-- serve_bench beside the running uvmrec (build/bin of a checkout, bin/ of a `make dist` tree),
-- torch_serve.py in its tree's scripts/bench, so the bench runs from either.
local host = package.loaded["uvmrec.host"] or {}
local bin = host.binary or os.getenv("UVMREC_BIN") or "build/bin/uvmrec"
local bench_bin = (bin:match("^(.*)/[^/]*$") or ".") .. "/serve_bench"
if not io.open(bench_bin) then
  cmd:fail(bench_bin .. " is missing: build it with `make examples` (make dist ships it in bin/)")
end
local torch_serve = (host.root or ".") .. "/scripts/bench/torch_serve.py"
local py = o.python
if not py and not o.no_torch then
  for _, cand in ipairs { (host.root or ".") .. "/build/venv/bin/python", "python3" } do
    if os.execute(cand .. " -c 'import torch' >/dev/null 2>&1") == 0 then py = cand break end
  end
end
local configs = table.concat(o.configs, ",")
local rows = {}
for _, f in ipairs(o.speed_formats) do
  local budget = o.hbm_budget and ur.bytes(o.hbm_budget) or 0
  local text, ok = sh(("%s %s %s %s %s %g %s '%s' %g %d"):format(bench_bin, files[f], dense_path, ids_path, configs,
    o.seconds, o.gpu and "gpu" or "cpu", o.placement or "", o.hot_fraction, budget))
  if not ok then cmd:fail("serve_bench: " .. text) end
  for line in text:gmatch("[^\n]+") do
    local r = json.decode(line)
    if r then
      r.engine, r.format = "uvmrec", f
      rows[#rows + 1] = r
      emit { kind = "speed", engine = "uvmrec", format = f, batch = r.batch, threads = r.threads,
             samples_per_s = r.samples_per_s, p50_ms = r.p50_ms, p99_ms = r.p99_ms, calls = r.calls }
    end
  end
  if py then
    text, ok = sh(("%s %s --model %s --dense %s --ids %s --check %s --configs %s "
                   .. "--seconds %g --device %s"):format(py, torch_serve, files[f], dense_path, ids_path, checks[f],
                                                          configs, o.seconds, o.gpu and "cuda" or "cpu"))
    if not ok then
      print(("torch_serve (%s): %s"):format(f, text:gsub("\n+$", "")))
    else
      for line in text:gmatch("[^\n]+") do
        local r = json.decode(line)
        if r and r.engine then
          r.format = f
          rows[#rows + 1] = r
          emit { kind = "speed", engine = "pytorch", format = f, batch = r.batch, threads = r.threads,
                 samples_per_s = r.samples_per_s, p50_ms = r.p50_ms, p99_ms = r.p99_ms, calls = r.calls,
                 torch = r.torch }
        elseif r and r.check then
          print(("check (%s): PyTorch's probabilities of %d requests are uvmrec's within %.3g"):format(
            f, r.samples, r.max_abs_diff))
        end
      end
    end
  end
end

print(("B11 speed (%s): %d requests, %g s a configuration"):format(o.gpu and "GPU" or "CPU", n, o.seconds))
print(("%-6s %6s %7s | %12s %9s %9s | %12s %9s %9s | %6s"):format("tables", "batch", "threads", "uvmrec/s",
  "p50 ms", "p99 ms", "PyTorch/s", "p50 ms", "p99 ms", "ratio"))
for _, f in ipairs(o.speed_formats) do
  for _, c in ipairs(o.configs) do
    local b, t = c:match("^(%d+)x(%d+)$")
    b, t = tonumber(b), tonumber(t)
    local u, p
    for _, r in ipairs(rows) do
      if r.format == f and r.batch == b and r.threads == t then
        if r.engine == "uvmrec" then u = r else p = r end
      end
    end
    if u then
      print(("%-6s %6d %7d | %12.0f %9.3f %9.3f | %12s %9s %9s | %6s"):format(f, b, t, u.samples_per_s, u.p50_ms,
        u.p99_ms, p and ("%.0f"):format(p.samples_per_s) or "-", p and ("%.3f"):format(p.p50_ms) or "-",
        p and ("%.3f"):format(p.p99_ms) or "-", p and ("%.2fx"):format(u.samples_per_s / p.samples_per_s) or "-"))
    end
  end
end
print("files: " .. dir)
