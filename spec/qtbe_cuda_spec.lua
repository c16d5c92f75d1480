-- The quantized collection on the GPU (#cuda; pending without one): its forward gives the CPU
-- reference's bits for every format, pooled and unpooled, weighted, with ids taken modulo and a
-- row permutation, with tables in device, managed and pinned host memory, bf16 outputs; a bad
-- id fails with the CPU's message; and an exported model served on the GPU scores as on the CPU.
local ur = require "uvmrec"
local qtbe = require "uvmrec.qtbe"
local h = require "helpers"
local R = require "tbe_ref"

local cuda_it = h.cuda_it

-- Two collections of the same rows, on the CPU and on the GPU (placement as given).
local function pair(format, placement, opts)
  opts = opts or {}
  local tables = { { name = "a", rows = 3000, dim = opts.dim or 64, features = { "f1", "f3" }, format = format,
                     modulo = opts.modulo and 3000 or nil, pooling = opts.pooling },
                   { name = "b", rows = 77, dim = opts.dim or 64, features = { "f2" }, format = format,
                     modulo = opts.modulo and 77 or nil, pooling = opts.pooling or "mean" } }
  local cpu = assert(qtbe.new { tables = tables, features = { "f1", "f2", "f3" }, device = "cpu",
                                output_dtype = opts.output_dtype })
  local gpu = assert(qtbe.new { tables = tables, features = { "f1", "f2", "f3" }, device = 0,
                                placement = placement, output_dtype = opts.output_dtype })
  for i, t in ipairs(tables) do
    local src = assert(ur.tensor({ t.rows, t.dim })):uniform(-0.2, 0.2, 100 + i)
    local rows = qtbe.quantize(src, format)
    assert(cpu:load(t.name, rows))
    assert(gpu:load(t.name, rows))
    if opts.perm then
      local p = {}
      -- r -> 13 r + 1 is one-to-one modulo 3000 and 77 (13 shares no factor with either)
      for r = 0, t.rows - 1 do p[r + 1] = (r * 13 + 1) % t.rows end
      assert(cpu:set_permutation(t.name, R.tensor(p, "i64")))
      assert(gpu:set_permutation(t.name, R.tensor(p, "i64")))
    end
  end
  return cpu, gpu
end

local function run(c, batch, placement)
  local inp = { values = R.tensor(batch.values, "i64", placement), offsets = R.tensor(batch.offsets, "i64", placement),
                weights = batch.weights and R.tensor(batch.weights, "f32", placement) or nil }
  local out = assert(c:forward(inp))
  return assert(out:to("host")):totable()
end

describe("uvmrec.qtbe on the GPU", function()
  for _, format in ipairs(qtbe.FORMATS) do
    cuda_it("gives the CPU's bits for " .. format .. " rows in device, managed and host memory", function()
      math.randomseed(#format)
      for _, placement in ipairs { "device", "managed", "host" } do
        for _, o in ipairs { {}, { weighted = true, perm = true, modulo = true }, { pooling = "none", dim = 16 },
                             { dim = 1024 }, { dim = 4 }, { output_dtype = "bf16" } } do
          local cpu, gpu = pair(format, placement, o)
          local batch = R.batch({ 3000, 77, 3000 }, { batch = 257, weighted = o.weighted, big = 300 })
          if o.modulo then -- ids past both tables' rows, each table taking them modulo its rows
            for i = 1, #batch.values do batch.values[i] = batch.values[i] + 3000 * 77 * math.random(0, 99) end
          end
          assert.same(run(cpu, batch), run(gpu, batch, "device"))
          cpu:free()
          gpu:free()
        end
      end
    end)
  end

  cuda_it("switches its output between f32 and bf16 after it is made, with the CPU's bits", function()
    local cpu, gpu = pair("int8", "device")
    local batch = R.batch({ 3000, 77, 3000 }, { batch = 129 })
    for _, dt in ipairs { "bf16", "f32", "bf16" } do
      assert(cpu:set_output_dtype(dt))
      assert(gpu:set_output_dtype(dt))
      local got = assert(gpu:forward { values = R.tensor(batch.values, "i64", "device"),
                                       offsets = R.tensor(batch.offsets, "i64", "device") })
      assert.equal(dt, got:dtype())
      assert.same(run(cpu, batch), run(gpu, batch, "device"), dt)
    end
    cpu:free()
    gpu:free()
  end)

  cuda_it("fails a bad id with the CPU's message, and counts skipped ids under warn", function()
    local _, gpu = pair("int8", "device")
    local batch = { values = { 1, 2, 77, 3 }, offsets = { 0, 1, 2, 3, 4, 4, 4 } }
    assert.has_error(function() run(gpu, batch, "device") end,
                     "qtbe: table 'b' (feature 'f2', sample 0, value 2) has no row 77; ids run 0..76")
    local w = assert(qtbe.new { tables = { { name = "a", rows = 10, dim = 8, format = "int4" } }, device = 0,
                                bounds = "warn" })
    run(w, { values = { 1, 10, -1 }, offsets = { 0, 3 } }, "device")
    assert.equal(2, w:skipped())
  end)

  cuda_it("checks a KJT not known checked before its kernels read its offsets", function()
    -- offsets past the values (lengths made unchecked, moved to the GPU): the CPU's forward refused them by its
    -- own check of the offsets, the GPU's kernels read 400 ids past the values' end
    local _, gpu = pair("int8", "device")
    local over = { keys = { "f1", "f2", "f3" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1, 0, 0 }, check = false }
    for _, place in ipairs { "device", "managed", "pinned" } do
      local k = assert(ur.KJT(over):to(place))
      assert.is_false(k:checked())
      assert.has_error(function() gpu:forward(k) end, "quantized collection: kjt: key 'f2' sample 0: offsets 2..402 "
        .. "disagree with length 400 or pass the 3 values")
    end
  end)

  cuda_it("checks a request's KJT not known checked before the model's kernels read its offsets", function()
    -- a request's KJT made unchecked, in device memory, C1's bags {60, -59}: its span fits (the model's
    -- check of the spans passed it), its first bag passes the 52 values (the GPU's kernels read past them; on
    -- the CPU the collection's check of the offsets refused it)
    local serve = require "uvmrec.serve"
    local path = h.exported("tiny", { tables = "int8" })
    local lengths, values = {}, {}
    local dense = ur.tensor({ 2, 13 }):fill(0.5)
    for _, place in ipairs { "device", "managed", "host" } do
      local m = assert(serve.open(path, { device = 0, placement = place }))
      local keys = m:features()
      for i = 1, 2 * #keys do lengths[i], values[i] = 1, 1 end
      lengths[1], lengths[2] = 60, -59
      local bad = assert(ur.KJT { keys = keys, values = values, lengths = lengths, check = false }:to("device"))
      local _, err = m:predict(dense, bad)
      assert.equal("model: key 'C1' sample 0: offsets 0..60 disagree with length 60 or pass the 52 values", err)
      m:close()
    end
  end)

  cuda_it("serves an exported model on the GPU as on the CPU", function()
    local dir = require("command").tmpdir()
    local train = require "uvmrec.train"
    local cfg = h.tiny { "train.steps=30", "train.checkpoint_every=30", "eval.samples=4096", "eval.min_auc=0" }
    assert(train.run(cfg, { out = dir .. "/run", progress = "none", cpu = true, print = function() end }))
    assert(require("uvmrec.serve.export").run(dir .. "/run", { out = dir .. "/m.safetensors", tables = "int4" }))
    local serve = require "uvmrec.serve"
    local cpu = assert(serve.open(dir .. "/m.safetensors", { device = "cpu" }))
    local data = assert(serve.data(cpu, nil, { batch_size = 1000 }))
    for _, placement in ipairs { "device", "managed", "host" } do
      local seen = tonumber(ur.C.ur_hint_log_total())
      local gpu = assert(serve.open(dir .. "/m.safetensors",
                                    { device = 0, placement = placement, hot_fraction = 0.25 }))
      if placement == "managed" then
        -- the hot_prefix split on each table: its leading quarter (floor(rows / 4) rows, none
        -- for a table of 3) preferred on the GPU
        local preferred, want = 0, 0
        for _, r in ipairs(ur.hint_log(seen)) do
          if r.advice == "preferred_location" and r.location ~= "cpu" then preferred = preferred + 1 end
        end
        for _, rows in ipairs(train.config.table_rows(cfg)) do
          if math.floor(0.25 * rows) > 0 then want = want + 1 end
        end
        assert.equal(25, want) -- dlrm_tiny: 26 tables, one of 3 rows
        assert.equal(want, preferred)
      end
      local loader = assert(ur.data.loader(data))
      local batch = loader:next()
      local a, b = cpu:predict(batch):totable(), gpu:predict(batch):totable()
      for i = 1, #a do assert.is_true(math.abs(a[i] - b[i]) <= 1e-5, placement) end
      loader:close()
      gpu:close()
    end
    require("command").rmdir(dir)
  end)

  cuda_it("refuses a request in device memory to a model the CPU serves, naming the request's part", function()
    -- it was refused by the first op that met it, naming the op ("linear forward: x is device
    -- memory but w is host memory; ..."), or by the collection ("qtbe: values is in device memory")
    local serve = require "uvmrec.serve"
    local cpu = assert(serve.open(h.exported("tiny", { tables = "int8" }), { device = "cpu" }))
    local keys, lengths = cpu:features(), {}
    for i = 1, 2 * #keys do lengths[i] = 1 end
    local values = {}
    for i = 1, 2 * #keys do values[i] = 1 end
    local dense = ur.tensor({ 2, 13 }):fill(0.5)
    local sparse = ur.KJT{ keys = keys, values = values, lengths = lengths }
    local want = "model: %s is in device memory (GPU 0), but the model is served by the CPU; expected host, "
      .. "pinned or managed memory"
    assert.same({ nil, want:format("dense") }, { cpu:predict(dense:to("device", 0), sparse) })
    assert.same({ nil, want:format("the sparse features' values") }, { cpu:predict(dense, sparse:to("device", 0)) })
    assert(cpu:predict(dense:to("managed", 0), sparse)) -- managed memory, which the CPU reads
    assert.equal(2, cpu:info().failed)
    cpu:close()
  end)

  cuda_it("scores a request of no ids (every bag empty) from host memory on the GPU as on the CPU", function()
    -- a context's first such request had no buffer for the ids it copies (0 of them): the call
    -- failed on a NULL view
    local serve = require "uvmrec.serve"
    local path = h.exported("tiny", { tables = "int8" })
    local cpu, gpu = assert(serve.open(path, { device = "cpu" })), assert(serve.open(path, { device = 0 }))
    local keys, lengths = cpu:features(), {}
    for i = 1, 2 * #keys do lengths[i] = 0 end
    local dense = ur.tensor({ 2, 13 }):fill(0.5)
    local sparse = ur.KJT{ keys = keys, values = {}, lengths = lengths }
    local a, b = assert(cpu:predict(dense, sparse)):totable(), assert(gpu:predict(dense, sparse)):totable()
    for i = 1, 2 do assert.is_true(math.abs(a[i] - b[i]) <= 1e-5, "sample " .. i) end
    cpu:close()
    gpu:close()
  end)
end)
