-- uvmrec.dist.shard and shard_modules in a world of one (the collectives copy): every kind of
-- sharding gives the unsharded collection's outputs and steps bit for bit (column shards under
-- rowwise Adagrad within rounding: their row sums), shards start as the
-- unsharded table's rows (uvmrec.tbe's shard option), and a sharded, data-parallel DLRM trains
-- as the plain one.  Over several ranks: spec/dist/train_spec.lua.
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local tbe = require "uvmrec.tbe"
local train = require "uvmrec.train"
local h = require "helpers"
local R = require "tbe_ref"

local comm = assert(dist.comm())

local function opts(optimizer)
  return { tables = { { name = "a", rows = 100, dim = 16, features = { "f", "g" } },
                      { name = "b", rows = 7, dim = 8, dtype = "f16" }, { name = "c", rows = 30, dim = 12 } },
           optimizer = optimizer or { "adagrad", lr = 0.1 }, device = "cpu", seed = 5 }
end

-- Bags of 0 to 3 ids over every row of the features' tables.
local function batch(rng, n)
  return h.weighted_kjt(rng, { "f", "g", "b", "c" }, n, { f = 100, g = 100, b = 7, c = 30 }, 4, 8)
end

describe("uvmrec.dist.shard", function()
  it("makes shards start as the unsharded table's rows and columns", function()
    local full = assert(tbe.new { tables = { { name = "x", rows = 50, dim = 16 },
                                             { name = "y", rows = 9, dim = 8 } }, device = "cpu", seed = 3 })
    local part = assert(tbe.new { tables = { { name = "x/rc", rows = 15, dim = 8,
                                               shard = { logical = 0, rows = 50, dim = 16, row0 = 20, col0 = 4 } },
                                             { name = "y", rows = 9, dim = 8,
                                               shard = { logical = 1, rows = 9, dim = 8 } } },
                                  device = "cpu", seed = 3 })
    local x, s = full:table("x"):totable(), part:table("x/rc"):totable()
    for r = 0, 14 do
      for c = 0, 7 do assert.equal(x[(20 + r) * 16 + 4 + c + 1], s[r * 8 + c + 1]) end
    end
    assert.same(full:table("y"):totable(), part:table("y"):totable())
    assert.has_error(function()
      tbe.new { tables = { { name = "z", rows = 10, dim = 8,
                             shard = { logical = 0, rows = 50, dim = 16, row0 = 45 } } }, device = "cpu" }
    end, "tbe: table 'z' is rows [45, 55) and columns [0, 8) of logical table 0 of 50 x 16; expected a block inside "
      .. "it and a logical index >= 0")
  end)

  h.cuda_it("draws a shard on the GPU as on the CPU", function()
    local o = { tables = { { name = "x", rows = 40, dim = 8,
                             shard = { logical = 2, rows = 90, dim = 24, row0 = 33, col0 = 12 } } }, seed = 9 }
    local g = assert(tbe.new(o))
    o.device = "cpu"
    local c = assert(tbe.new(o))
    assert.same(c:table("x"):totable(), g:table("x"):totable())
  end)

  local specs = {
    table_wise = "table_wise", row_wise = "row_wise", data_parallel = "data_parallel",
    ["column_wise, a in 3 shards"] = { default = "column_wise", a = { "column_wise", ranks = { 0, 0, 0 } } },
    ["mixed"] = { a = "row_wise", b = "data_parallel", c = { "column_wise", ranks = { 0, 0 } } },
  }
  for _, what in ipairs { "table_wise", "row_wise", "data_parallel", "column_wise, a in 3 shards", "mixed" } do
    local spec = specs[what]
    it("gives the unsharded collection's forward and steps, bit for bit: " .. what, function()
      local plain = ur.nn.EmbeddingBagCollection(opts())
      local sharded = dist.shard(plain, spec, comm)
      local rng = h.rng(11)
      for step = 1, 3 do
        local kjt = batch(rng, 9)
        local a, b = plain:forward(kjt), sharded:forward(kjt)
        assert.same(a:totable(), b:totable(), "forward " .. step)
        local g = ur.tensor(a:size()):uniform(-1, 1, step)
        plain:backward(kjt, g)
        sharded:backward(kjt, g)
        for _, t in ipairs { "a", "b", "c" } do
          assert.same(plain:table(t):totable(), sharded:full_table(t):totable(), t .. " after step " .. step)
        end
      end
      assert.matches("^ShardedEmbeddingBagCollection%(3 tables: ", tostring(sharded))
      assert.has_error(function() sharded:full_table("q") end, "dist: no table named 'q'")
      sharded:free()
    end)
  end

  it("takes a model's precision: a sharded collection in a model gives the unsharded one's bf16 output", function()
    -- a model's set_precision marked the sharded collection bf16 and left its shards' outputs f32
    local plain = ur.nn.EmbeddingBagCollection(opts())
    local sharded = dist.shard(plain, "row_wise", comm)
    local m, pm = ur.nn.Sequential(sharded, ur.nn.ReLU()), ur.nn.Sequential(plain, ur.nn.ReLU())
    local kjt = batch(h.rng(3), 9)
    for _, p in ipairs { "bf16", "f32", "bf16" } do
      assert(m:set_precision(p))
      assert(pm:set_precision(p))
      local want = pm:forward(kjt)
      local got = m:forward(kjt)
      assert.equal(p, got:dtype(), p)
      assert.equal(p, sharded.output_dtype)
      assert.same(want:totable(), got:totable(), p)
    end
    sharded:free()
  end)

  it("takes the options themselves, so no rank builds a table it does not own", function()
    local s = dist.shard(opts(), "row_wise", comm)
    local names = {}
    for _, p in ipairs(s:parameters()) do names[#names + 1] = p.name end
    assert.same({ "a", "b", "c" }, names) -- views of the logical tables: rank 0 of 1 holds them whole
    local ok, err = pcall(function() s:set_precision("f16") end)
    assert.is_false(ok)
    assert.matches("sharded_spec%.lua:%d+: set_precision: 'f16' is not f32, tf32 or bf16$", err)
    assert(s:set_precision("bf16"))
    assert.equal("bf16", s.output_dtype)
    local bad = { tables = opts().tables, features = { "f", "g", "b", "q" }, device = "cpu" }
    assert.has_error(function() dist.shard(bad, "row_wise", comm) end, "dist.shard: feature 'q' is on no table")
    -- options the unsharded collection refuses were ignored: a misspelled optimizer trained with
    -- the default one
    local o = opts()
    o.optimiser = { "sgd", lr = 1 }
    assert.has_error(function() dist.shard(o, "row_wise", comm) end,
      "dist.shard: unknown collection option 'optimiser'; expected bounds, cache, device, dtype, features, "
      .. "optimizer, output_dtype, placement, pooling, seed, state_placement, stochastic_rounding, tables, vbe")
    o = opts()
    o.tables[2].bogus = 1
    local table_keys = "expected dim, dtype, features, name, placement, pooling, rows, state_placement"
    assert.has_error(function() dist.shard(o, "row_wise", comm) end,
      "dist.shard: unknown table option 'bogus'; " .. table_keys)
    o = opts()
    o.tables[1].shard = { logical = 0, rows = 100, dim = 16 } -- the plan sets each shard's
    assert.has_error(function() dist.shard(o, "row_wise", comm) end,
      "dist.shard: unknown table option 'shard'; " .. table_keys)
  end)

  it("refuses an input whose keys are not the collection's features, as the unsharded one does", function()
    -- the exchange fixed its key order at the first input: keys {c, b, g, f} first, then the
    -- features' order, pooled b's ids from c's table; an extra key was ignored
    local sharded = dist.shard(opts(), "table_wise", comm)
    local plain = ur.nn.EmbeddingBagCollection(opts())
    local swapped = ur.KJT { keys = { "c", "b", "g", "f" }, values = { 1, 2, 3, 4 }, lengths = { 1, 1, 1, 1 } }
    local want = "sharded_spec%.lua:%d+: ShardedEmbeddingBagCollection: the input's keys {c, b, g, f} are not the "
      .. "collection's features {f, g, b, c}$"
    local ok, err = pcall(function() local r = sharded:forward(swapped); return r end)
    assert.is_false(ok)
    assert.matches(want, err)
    ok, err = pcall(function() local r = sharded:prepare(swapped); return r end)
    assert.is_false(ok)
    assert.matches(want, err)
    local kjt = ur.KJT { keys = { "f", "g", "b", "c" }, values = { 1, 2, 3, 4 }, lengths = { 1, 1, 1, 1 } }
    assert.same(plain:forward(kjt):totable(), sharded:forward(kjt):totable())
    local extra = ur.KJT { keys = { "f", "g", "b", "c", "z" }, values = { 1, 2, 3, 4, 5 }, lengths = { 1, 1, 1, 1, 1 } }
    assert.has_error(function() sharded:forward(extra) end, "ShardedEmbeddingBagCollection: the input's keys "
      .. "{f, g, b, c, z} are not the collection's features {f, g, b, c}")
    sharded:free()
  end)

  it("refuses an id outside its table on the rank whose input holds it, at the caller's line", function()
    -- the rank holding the table's shard found it in the global batch: over 2 ranks, rank 1
    -- failed for rank 0's input, naming a sample of the global batch ('tbe: table 'c' (feature
    -- 'c', sample 1, value 1) has no row 9' at sharded.lua's line); row-wise ids at bucketize's
    for _, plan in ipairs { "table_wise", "row_wise" } do
      local sharded = dist.shard(opts(), plan, comm)
      local kjt = ur.KJT { keys = { "f", "g", "b", "c" }, values = { 1, 2, 3, 30 }, lengths = { 1, 1, 1, 1 } }
      local ok, err = pcall(function() local r = sharded:forward(kjt); return r end)
      assert.is_false(ok)
      assert.matches("sharded_spec%.lua:%d+: ShardedEmbeddingBagCollection: rank 0's input: kjt: key 'c' sample 0 "
        .. "%(values%[3%]%) has id 30, outside the table's 30 rows$", err)
      ok, err = pcall(function() local r = sharded:prepare(kjt); return r end)
      assert.is_false(ok)
      assert.matches("sharded_spec%.lua:%d+: ShardedEmbeddingBagCollection: rank 0's input: kjt: key 'c'", err)
      sharded:free()
    end
  end)

  it("checks an input not known checked on its own rank before the exchange, at the caller's line", function()
    -- bags of g {2, -1} (its span right) in pinned memory, where no rank looks at the ids: a table-wise batch
    -- was exchanged and failed in the forward of the rank holding g, naming the global batch's offsets
    -- ('tbe: offsets[4] = 3 is below offsets[3] = 4' at sharded.lua's line; prepare took it); a row-wise one
    -- failed in bucketize; on a GPU the kernels read them as given
    for _, plan in ipairs { "table_wise", "row_wise", "data_parallel" } do
      local sharded = dist.shard(opts(), plan, comm)
      local k = ur.KJT { keys = { "f", "g", "b", "c" }, values = { 1, 2, 3, 4, 5 },
                         lengths = { 1, 1, 2, -1, 1, 0, 0, 1 }, check = false }:to("pinned")
      assert.is_false(k:checked())
      local want = "sharded_spec%.lua:%d+: ShardedEmbeddingBagCollection: rank 0's input: kjt: key 'g' sample 1 "
        .. "%(lengths%[3%]%) has length %-1; lengths must be >= 0$"
      local ok, err = pcall(function() local r = sharded:forward(k); return r end)
      assert.is_false(ok, plan)
      assert.matches(want, err)
      ok, err = pcall(function() local r = sharded:prepare(k); return r end)
      assert.is_false(ok, plan)
      assert.matches(want, err)
      -- a sound one in pinned memory: the unsharded collection's output
      local good = ur.KJT { keys = { "f", "g", "b", "c" }, values = { 1, 2, 3, 4, 5 },
                            lengths = { 1, 1, 1, 0, 1, 0, 0, 1 } }
      assert.same(ur.nn.EmbeddingBagCollection(opts()):forward(good):totable(),
                  sharded:forward(good:to("pinned")):totable())
      -- the exchange's batches are known checked, VBE's too (their make reads the inverse indices): the
      -- shards' forwards check nothing again (on a GPU each check waits for the device)
      for _, vbe in ipairs { false, true } do
        sharded:set_vbe(vbe)
        local t = assert(sharded:prepare(good))
        for i, part in ipairs(t.parts) do assert.is_true(part:checked(), plan .. " part " .. i) end
        sharded:retire(t, false)
      end
      sharded:free()
    end
  end)

  h.mpi_it("refuses an id outside its table over 2 ranks on the rank whose input holds it, not on the table's, "
     .. "at the caller's line", function()
    -- table c lives on rank 1; rank 0's input holds the id past its rows
    local command = require "command"
    local dir = command.tmpdir()
    local script = command.spit(dir .. "/bad_id.lua", [[
      local ur = require "uvmrec"
      local dist = require "uvmrec.dist"
      local comm = assert(dist.init { cpu = true })
      local o = { tables = { { name = "a", rows = 3, dim = 8 }, { name = "c", rows = 5, dim = 4 } }, device = "cpu" }
      local ebc = dist.shard(o, { a = "table_wise", c = { "table_wise", rank = 1 } }, comm)
      local id = dist.rank() == 0 and 9 or 1
      ebc:forward(ur.KJT { keys = { "a", "c" }, values = { 0, 1, 2, id }, lengths = { 1, 1, 1, 1 } })
    ]])
    local out, err, code = command.sh(("timeout 120 %s launch -n 2 %s"):format(command.bin(), script))
    assert.equal(1, code, out .. err)
    assert.matches("uvmrec launch: rank 0 exited with 1: [^\n]*bad_id%.lua:7: ShardedEmbeddingBagCollection: rank 0's "
      .. "input: kjt: key 'c' sample 1 %(values%[3%]%) has id 9, outside the table's 5 rows", err)
    command.rmdir(dir)
  end)

  it("refuses shards on a GPU whose communicator cannot exchange their tensors, saying how to make one", function()
    -- checked before anything is built, so a machine without a GPU provokes it too
    local o = opts()
    o.device = 0
    assert.is_equal(-1, comm.device)
    local ok, err = pcall(dist.shard, o, "row_wise", comm)
    assert.is_false(ok)
    assert.matches("dist.shard: rank 0's shards are on GPU 0, and its communicator was made for host memory only "
      .. "(device -1), so it cannot exchange their tensors: make it with dist.comm{device = 0} (dist.init() takes "
      .. "the rank's GPU), or keep the shards on the host (device = \"cpu\")", err, 1, true)
    -- a communicator of another GPU
    local other = setmetatable({ device = 1 }, { __index = comm })
    ok, err = pcall(dist.shard, o, "row_wise", other)
    assert.is_false(ok)
    assert.matches("and its communicator runs its device collectives on GPU 1: make it with dist.comm{device = 0}",
      err, 1, true)
  end)

  it("steps column shards under rowwise Adagrad by the whole row's mean (row sums added over the shards)", function()
    -- a in 3 shards on this rank (two of them lent their own sums, added into the first's), c in
    -- 2: rows and state within rounding of the unsharded collection's (the shards' partial sums
    -- are added in another order than one row's); b, one column shard, bit for bit
    local o = opts { "rowwise_adagrad", lr = 0.1, weight_decay = 0.01 }
    local plain = ur.nn.EmbeddingBagCollection(o)
    local sharded = dist.shard(o, { default = "column_wise", a = { "column_wise", ranks = { 0, 0, 0 } },
                                    c = { "column_wise", ranks = { 0, 0 } } }, comm)
    assert.equal(130, sharded.row_sums.total) -- a's 100 rows and c's 30 in one all-reduce
    local rng = h.rng(12)
    for step = 1, 4 do
      local kjt = batch(rng, 9)
      local a = plain:forward(kjt)
      R.close(sharded:forward(kjt):totable(), a:totable(), 1e-5, 1e-7, "forward " .. step)
      local g = ur.tensor(a:size()):uniform(-1, 1, step)
      plain:backward(kjt, g)
      sharded:backward(kjt, g)
      for _, t in ipairs { "a", "c" } do
        R.close(sharded:full_table(t):totable(), plain:table(t):totable(), 1e-5, 1e-7, t .. " after step " .. step)
      end
      assert.same(plain:table("b"):totable(), sharded:full_table("b"):totable())
      local want = plain:state("a").sum:totable()
      for _, b in ipairs(sharded:blocks()) do
        if b.name == "a" then
          R.close(b.collection:state(b.shard).sum:totable(), want, 1e-5, 1e-9, b.shard .. " sum " .. step)
        end
      end
    end
    sharded:free()
  end)

  it("trains a sharded, data-parallel DLRM as the plain one (a world of one)", function()
    local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), { "train.batch_size=256" }))
    local def = assert(train.model_def(cfg))
    local plain = assert(def.build(cfg, { cpu = true }))
    local m = assert(def.build(cfg, { cpu = true }))
    -- 'lots' raised "attempt to compare string with number"; -5 and NaN were taken
    local ddp = require "uvmrec.dist.ddp"
    for _, bad in ipairs { "lots", -5, 0 / 0 } do
      assert.has_error(function() ddp.data_parallel(plain, { comm = comm, bucket_bytes = bad }) end,
        ("ddp: bucket_bytes is %s; expected a number of bytes >= 0"):format(tostring(bad)))
    end
    dist.shard_modules(m, { default = "row_wise", C3 = "table_wise" }, { comm = comm, bucket_bytes = 4096 })
    assert.matches("Sharded", tostring(m.embeddings))
    assert.is_true(m.data_parallel.buckets > 1)
    local o1, o2 = train.optimizer(cfg, plain), train.optimizer(cfg, m)
    local data = ur.data.loader { data = "synthetic:tiny", samples = 3 * 256, batch_size = 256 }
    for b in data:batches() do
      local l1 = train.loop.step(plain, o1, b):get(0)
      local l2 = train.loop.step(m, o2, b):get(0)
      assert.equal(l1, l2)
    end
    assert.same(plain.embeddings:table("C7"):totable(), m.embeddings:full_table("C7"):totable())
    assert.same(plain.top.modules[1].weight:totable(), m.top.modules[1].weight:totable())
  end)
end)
