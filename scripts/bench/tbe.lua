-- Embedding collection benchmark (BENCH.md B1, B2): pooled forward, and forward + backward
-- fused with SGD and rowwise Adagrad, next to a plain row gather of the same ids.
--
--   luajit scripts/bench/tbe.lua --gpu [--out FILE] [--torch FILE] [--quick]   (make bench-gpu)
--   luajit scripts/bench/tbe.lua --cpu [--out FILE]                             (make bench; --help)
--
-- GPU shapes: 26 tables of dim 128, 8 GiB of them, batch 65536, one id per bag (B1) and 20;
-- ids uniform and Zipf(1.05) with hot rows scattered over the table; f32 and f16 rows; tables
-- in HBM, in managed memory preferred on the host and accessed by the GPU, and in pinned host
-- memory.  Each case first checks a slice of its forward and one SGD step against a float64
-- reference from the same rows, then times with CUDA events: median of many runs after a
-- warm-up, rotating over several batches.  GB/s count every byte that must move (rows read,
-- output written, ids and offsets; backward adds the gradient read and each distinct row read
-- and written, with its state).  --torch reads scripts/bench/torch_embeddingbag.py's JSON
-- lines for the ratio to PyTorch.  Results: a table on stdout and JSON lines in --out.
local ffi = require "ffi"
local ur = require "uvmrec"
local tbe = require "uvmrec.tbe"
local json = require "uvmrec.json"
local streams = require "uvmrec.stream"
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/tbe.lua",
  summary = "embedding collection benchmark (BENCH.md B1, B2): pooled forward, and forward + backward",
  { "--gpu", "the GPU shapes (the default where a GPU is in use)" },
  { "--cpu", "the CPU shapes" },
  { "--quick", "fewer timed runs a case" },
  options.out,
  { "--torch FILE", "scripts/bench/torch_embeddingbag.py's JSON lines, for the ratio to PyTorch" },
  { "--only TEXT", "only the cases whose name holds TEXT" },
  mutex = { { "--gpu", "--cpu" } },
}
local args = cmd:parse(arg)
args.mode = cmd:mode(args)

local GPU = args.mode == "gpu"
local TABLES = GPU and 26 or 8
local DIM = GPU and 128 or 64
local BATCH = GPU and 65536 or 4096
local ROWS = GPU and math.floor(8 * 2 ^ 30 / TABLES / (DIM * 4)) or 100000
local NBATCH = GPU and 3 or 2
local WARM, RUNS = GPU and 5 or 2, GPU and (args.quick and 10 or 30) or 5

local place = GPU and "device" or "host"
local dev_opts = GPU and { placement = "device" } or {}

-- ---- ids ----

local ZIPF_S = 1.05
local PERM_MUL, PERM_ADD = 2654435761, 40503 -- scatter hot rows over the table

-- n ids in [0, rows): uniform, or Zipf(s) by the continuous inverse CDF, then scattered.
local function draw_ids(n, rows, dist, seed)
  math.randomseed(seed)
  local ids = ffi.new("int64_t[?]", n)
  local e = 1 - ZIPF_S
  local top = rows ^ e - 1
  local mul = PERM_MUL % rows
  for i = 0, n - 1 do
    if dist == "uniform" then
      ids[i] = math.random(0, rows - 1)
    else
      local x = math.floor((1 + math.random() * top) ^ (1 / e)) - 1
      if x >= rows then x = rows - 1 end
      ids[i] = (x * mul + PERM_ADD) % rows
    end
  end
  return ids
end

local function upload(buf, n, dtype)
  local h = assert(ur.tensor({ n }, { dtype = dtype }))
  assert(ur.C.ur_tensor_write(h.p, 0, n, buf) == 0)
  if not GPU then return h end
  local d = assert(h:to("device"))
  h:free()
  return d
end

-- A batch: `hot` ids per bag for every feature; host ids kept for the checks.
local function make_batch(hot, dist, seed)
  local bags = TABLES * BATCH
  local n = bags * hot
  local ids = draw_ids(n, ROWS, dist, seed)
  local off = ffi.new("int64_t[?]", bags + 1)
  for b = 0, bags do off[b] = b * hot end
  local global = ffi.new("int64_t[?]", n)
  return { n = n, bags = bags, hot = hot, ids = ids, global = global,
           input = { values = upload(ids, n, "i64"), offsets = upload(off, bags + 1, "i64") } }
end

-- Distinct rows per batch (each feature has its own table).
local function distinct(b)
  local seen = ffi.new("uint8_t[?]", ROWS)
  local per = BATCH * b.hot
  local u = 0
  for f = 0, TABLES - 1 do
    ffi.fill(seen, ROWS)
    for i = f * per, (f + 1) * per - 1 do
      local id = tonumber(b.ids[i])
      if seen[id] == 0 then seen[id] = 1; u = u + 1 end
    end
  end
  return u
end

-- ---- the collection ----

-- optimizer "sgd_atomic": SGD with deterministic = false (atomic adds, no sort, on the GPU).
local function collection(dtype, placement, optimizer)
  local tables = {}
  for t = 1, TABLES do tables[t] = { name = "t" .. t, rows = ROWS, dim = DIM, dtype = dtype } end
  if optimizer == "sgd_atomic" then optimizer = { "sgd", deterministic = false } end
  return assert(tbe.new { tables = tables, placement = placement, optimizer = optimizer,
                          bounds = "warn", seed = 1, device = GPU and 0 or "cpu" })
end

-- Managed tables: preferred on the host, mapped for the GPU (read in place, no faults).
local function advise_host(c)
  for _, name in ipairs(c.table_names) do
    local t = c:table(name)
    assert(t:advise(0, t:numel(), "preferred_location", "cpu"))
    assert(t:advise(0, t:numel(), "accessed_by", 0))
    t:free()
  end
end

-- Every table, as one [rows, dim] view of the storage, for the plain gather; and each
-- table's first row in it.
local function whole(c)
  local first = c:table(c.table_names[1])
  local last = c:table(c.table_names[TABLES])
  local total = (tonumber(ur.C.ur_tensor_offset(last.p)) - tonumber(ur.C.ur_tensor_offset(first.p))) / DIM + ROWS
  local base = {}
  for t, name in ipairs(c.table_names) do
    local v = c:table(name)
    base[t] = (tonumber(ur.C.ur_tensor_offset(v.p)) - tonumber(ur.C.ur_tensor_offset(first.p))) / DIM
    v:free()
  end
  return first:view_as(0, { total, DIM }), base
end

local function gather_ids(b, base)
  local per = BATCH * b.hot
  for i = 0, b.n - 1 do b.global[i] = b.ids[i] + base[math.floor(i / per) + 1] end
  b.gather = upload(b.global, b.n, "i64")
end

-- ---- checks ----

local function fail(msg) cmd:fail("CHECK FAILED: " .. msg, 2) end

-- A slice of the forward against float64 sums of the same rows.
local function check_forward(c, b, out)
  for _, f in ipairs { 0, math.floor(TABLES / 2), TABLES - 1 } do
    local t = c:table(c.table_names[f + 1])
    for _, s in ipairs { 0, 1, 777, BATCH - 1 } do
      local want = {}
      for k = 1, DIM do want[k] = 0 end
      for v = 0, b.hot - 1 do
        local id = tonumber(b.ids[(f * BATCH + s) * b.hot + v])
        local row = t:totable(id * DIM, DIM)
        for k = 1, DIM do want[k] = want[k] + row[k] end
      end
      local got = out:totable(s * TABLES * DIM + f * DIM, DIM)
      for k = 1, DIM do
        if math.abs(got[k] - want[k]) > 1e-5 * (1 + math.abs(want[k])) * b.hot then
          fail(("forward feature %d sample %d column %d: %.9g, expected %.9g"):format(f, s, k - 1, got[k], want[k]))
        end
      end
    end
    t:free()
  end
end

-- One SGD step with a constant gradient: a row read k times moves by -lr * g * k.
local function check_backward(c, b, grad)
  local lr, g = 0.1, 0.5
  local f = 5
  local t = c:table(c.table_names[f + 1])
  local per = BATCH * b.hot
  local picks, count = {}, {}
  for _, i in ipairs { 0, 1, per - 1, math.floor(per / 2) } do
    local id = tonumber(b.ids[f * per + i])
    if not count[id] then picks[#picks + 1] = id; count[id] = 0 end
  end
  for i = f * per, (f + 1) * per - 1 do
    local id = tonumber(b.ids[i])
    if count[id] then count[id] = count[id] + 1 end
  end
  local before = {}
  for _, id in ipairs(picks) do before[id] = t:totable(id * DIM, DIM) end
  assert(grad:fill(g))
  c:set_lr(lr)
  assert(c:backward(b.input, grad))
  for _, id in ipairs(picks) do
    local after = t:totable(id * DIM, DIM)
    for k = 1, DIM do
      local want = before[id][k] - lr * g * count[id]
      if math.abs(after[k] - want) > 1e-3 * math.max(1, math.abs(want)) then
        fail(("backward row %d (read %d times) column %d: %.9g, expected %.9g")
             :format(id, count[id], k - 1, after[k], want))
      end
    end
  end
  t:free()
end

-- ---- timing ----

local function median_ms(fn, batches)
  local function nth(i) return fn(batches[(i - 1) % #batches + 1]) end
  for i = 1, WARM do nth(i) end
  assert(ur.sync())
  return (streams.median_ms(nth, RUNS))
end

-- ---- the cases ----

-- scripts/bench/torch_embeddingbag.py's lines: the best ms of each case/op.
local torch = {}
if args.torch then
  local recs, err = json.read_lines(args.torch)
  if not recs then io.stderr:write(cmd.prog, ": --torch: ", err, "; the ratios are left out\n") end
  for _, r in ipairs(recs or {}) do
    if r.case and r.op and r.ms then
      local key = r.case .. "/" .. r.op
      torch[key] = math.min(torch[key] or math.huge, r.ms)
    end
  end
end

local out_fh = json.lines(args.out)
local rows_out = {}
local function report(r)
  rows_out[#rows_out + 1] = r
  local rec = {}
  for _, k in ipairs { "bench", "case", "op", "ms", "bytes", "gbps", "gather_gbps", "pct_gather",
                       "torch_ms", "vs_torch", "device" } do
    rec[k] = r[k]
  end
  out_fh:write(rec)
end

local device_name = GPU and assert(ur.device_props(0)).name or "cpu"

local function run_group(dtype, placement, advise, shapes, ops)
  local c = collection(dtype, placement, "sgd")
  if advise then advise_host(c) end
  local all, base = whole(c)
  local esize = dtype == "f32" and 4 or 2
  local rb = DIM * esize
  for _, shp in ipairs(shapes) do
    local hot, dist = shp[1], shp[2]
    local case = ("%s %s %d-hot %s"):format(placement .. (advise and "(host,acc-by-gpu)" or ""), dtype, hot, dist)
    if not args.only or case:find(args.only, 1, true) then
      local batches = {}
      for k = 1, (hot > 1 and 2 or NBATCH) do batches[k] = make_batch(hot, dist, 100 * hot + k + #dist) end
      for _, b in ipairs(batches) do gather_ids(b, base) end
      local outshape = { BATCH, TABLES * DIM }
      local out = assert(ur.tensor(outshape, dev_opts))
      local grad = assert(ur.tensor(outshape, dev_opts))
      local gout = assert(ur.tensor({ batches[1].n, DIM }, { dtype = dtype, placement = place }))
      -- checks first: a fast wrong answer is a failure
      assert(c:forward(batches[1].input, out))
      check_forward(c, batches[1], out)
      check_backward(c, batches[1], grad)
      assert(grad:uniform(-1, 1, 3))
      local n, bags = batches[1].n, batches[1].bags
      local fwd_bytes = n * rb + bags * DIM * 4 + n * 8 + (bags + 1) * 8
      local gather_ms = median_ms(function(b)
        assert(ur.C.ur_tensor_gather_rows(nil, all.p, b.gather.p, gout.p) == 0)
      end, batches)
      local gather_bytes = 2 * n * rb + n * 8
      local gather_gbps = gather_bytes / gather_ms / 1e6
      report { bench = "tbe", case = case, op = "gather", ms = gather_ms, bytes = gather_bytes,
               gbps = gather_gbps, device = device_name }
      local uniq = 0
      for _, b in ipairs(batches) do uniq = uniq + distinct(b) / #batches end
      for _, op in ipairs(ops) do
        local ms, bytes
        if op == "forward" then
          ms = median_ms(function(b) assert(c:forward(b.input, out)) end, batches)
          bytes = fwd_bytes
        else
          local opt = op:match("%+(.*)$")
          local cc = c
          if opt ~= "sgd" then
            cc = collection(dtype, placement, opt)
            if advise then advise_host(cc) end
            -- the atomic step is checked as the sorted one was (the others are not SGD)
            if opt == "sgd_atomic" then
              check_backward(cc, batches[1], grad)
              assert(grad:uniform(-1, 1, 3))
            end
          end
          ms = median_ms(function(b)
            assert(cc:forward(b.input, out))
            assert(cc:backward(b.input, grad))
          end, batches)
          local state = opt == "rowwise_adagrad" and 8 or 0
          bytes = fwd_bytes + bags * DIM * 4 + uniq * (2 * rb + state) + n * 8 + (bags + 1) * 8
          if cc ~= c then cc:free() end
        end
        local gbps = bytes / ms / 1e6
        local tkey = case .. "/" .. op
        report { bench = "tbe", case = case, op = op, ms = ms, bytes = bytes, gbps = gbps,
                 gather_gbps = gather_gbps, pct_gather = 100 * gbps / gather_gbps,
                 torch_ms = torch[tkey], vs_torch = torch[tkey] and torch[tkey] / ms or nil,
                 device = device_name }
      end
      out:free()
      grad:free()
      gout:free()
      for _, b in ipairs(batches) do
        b.input.values:free()
        b.input.offsets:free()
        b.gather:free()
      end
      collectgarbage()
    end
  end
  all:free()
  c:free()
  collectgarbage()
end

local t0 = os.time()
if GPU then
  local full = { "forward", "forward+sgd", "forward+rowwise_adagrad" }
  local shapes = { { 1, "uniform" }, { 1, "zipf" }, { 20, "uniform" }, { 20, "zipf" } }
  -- the atomic SGD step beside the deterministic one (B2 is quoted with the latter)
  run_group("f32", "device", false, shapes, { "forward", "forward+sgd", "forward+sgd_atomic",
                                              "forward+rowwise_adagrad" })
  run_group("f16", "device", false, { { 1, "uniform" }, { 1, "zipf" } }, full)
  run_group("f32", "managed", true, { { 1, "uniform" }, { 1, "zipf" } }, { "forward", "forward+sgd" })
  run_group("f32", "host", false, { { 1, "uniform" }, { 1, "zipf" } }, { "forward", "forward+sgd" })
else
  run_group("f32", "host", false, { { 1, "uniform" }, { 8, "zipf" } }, { "forward", "forward+sgd" })
end

-- ---- the table ----

print(("embedding collection: %d tables x %d rows x dim %d, batch %d, on %s (%d s)")
      :format(TABLES, ROWS, DIM, BATCH, device_name, os.time() - t0))
print(("%-44s %-24s %9s %9s %9s %8s %9s"):format("case", "op", "ms", "GB/s", "gather", "%gather", "x torch"))
for _, r in ipairs(rows_out) do
  print(("%-44s %-24s %9.3f %9.1f %9s %8s %9s"):format(r.case, r.op, r.ms, r.gbps,
    r.gather_gbps and ("%.1f"):format(r.gather_gbps) or "", r.pct_gather and ("%.1f"):format(r.pct_gather) or "",
    r.vs_torch and ("%.2f"):format(r.vs_torch) or ""))
end
out_fh:close()
