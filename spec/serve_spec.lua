-- uvmrec.serve, the serving API under it (ur_model_*), `uvmrec predict`, `uvmrec eval` on a model
-- file and engine/examples/serve.c: an exported f32 model scores the training run's held-out
-- samples exactly as its final evaluation did (dot and DCNv2); quantized ones within each
-- format's AUC bound; 8 concurrent C callers get the single caller's bits; serve.c writes
-- `uvmrec predict`'s lines; bad requests fail alone; truncated, foreign and mismatched files are
-- refused with the file and the reason.
local ffi = require "ffi"
local ur = require "uvmrec"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local serve = require "uvmrec.serve"
local h = require "helpers"
local cmd = require "command"

local C = ur.C

-- The first batch of the model's held-out samples, and what the model gives it.
local function held_batch(m, n)
  local loader = assert(ur.data.loader(assert(serve.data(m, nil, { batch_size = n }))))
  local batch = assert(loader:next())
  return batch, loader
end

-- predict, eval and serve.data all refuse the model file's data spec with the message want,
-- predict writing nothing into dir.
local function refused_data(model, spec, want, dir)
  local out, err, code = cmd.run(("predict %s --data %s --out %s/p.txt --cpu"):format(model, spec, dir))
  assert.equal(1, code, out)
  assert.equal("uvmrec predict: " .. want .. "\n", err)
  assert.is_false(cmd.exists(dir .. "/p.txt"))
  out, err, code = cmd.run(("eval %s --data %s --cpu"):format(model, spec))
  assert.equal(1, code, out)
  assert.equal("uvmrec eval: " .. want .. "\n", err)
  local m = assert(serve.open(model, { device = "cpu" }))
  assert.same({ nil, want }, { serve.data(m, spec) })
  m:close()
end

describe("uvmrec.serve", function()
  it("scores the training run's held-out samples as its final evaluation did (f32 tables)", function()
    for _, kind in ipairs { "tiny", "dcnv2", "dcnv2_rank" } do
      local t = h.trained(kind)
      local m = assert(serve.open(h.exported(kind, { tables = "f32" }), { device = "cpu" }))
      local r = assert(serve.evaluate(m))
      assert.equal(t.result.eval.samples, r.samples)
      assert.equal(t.result.eval.auc, r.auc, kind)
      assert.equal(t.result.eval.logloss, r.logloss, kind)
      assert.equal(t.result.eval.calibration, r.calibration, kind)
      local info = m:info()
      assert.equal(kind == "tiny" and "dot" or "dcnv2", info.interaction)
      assert.equal(r.samples, info.samples)
      m:close()
    end
  end)

  it("keeps the AUC within each format's bound of f32's: fp16 5e-4, int8 1e-3, int4 5e-3", function()
    local base = assert(serve.evaluate(assert(serve.open(h.exported("tiny", { tables = "f32" }), { device = "cpu" }))))
    local sizes = {}
    for _, c in ipairs { { "fp16", 5e-4 }, { "int8", 1e-3 }, { "int4", 5e-3 } } do
      local path = h.exported("tiny", { tables = c[1] })
      local r = assert(serve.evaluate(assert(serve.open(path, { device = "cpu" }))))
      assert.is_true(math.abs(r.auc - base.auc) <= c[2], ("%s: AUC %.6f, f32 %.6f"):format(c[1], r.auc, base.auc))
      assert.is_true(r.auc ~= base.auc or c[1] == "fp16", c[1] .. " moved the AUC")
      sizes[#sizes + 1] = assert(ck.open(path)):bytes()
    end
    assert.is_true(sizes[1] > sizes[2] and sizes[2] > sizes[3])
  end)

  it("serves the same scores from bf16 dense weights within bf16's rounding", function()
    local a = assert(serve.open(h.exported("tiny", { tables = "int8" }), { device = "cpu" }))
    local b = assert(serve.open(h.exported("tiny", { tables = "int8", dense = "bf16" }), { device = "cpu" }))
    assert.equal("bf16", b:info().dense_dtype)
    local batch, loader = held_batch(a, 512)
    local x, y = a:predict(batch):totable(), b:predict(batch):totable()
    local worst = 0
    for i = 1, #x do worst = math.max(worst, math.abs(x[i] - y[i])) end
    assert.is_true(worst > 0 and worst < 0.05, "largest difference " .. worst)
    loader:close()
  end)

  it("gives 8 concurrent C callers the single caller's bits; bad requests fail alone", function()
    local dir = cmd.tmpdir()
    local exe, why = h.build_c("engine/tests/model_threads.c", dir, "model_threads")
    if not exe then return pending(why) end
    for _, c in ipairs { { "tiny", "8", "0" }, { "tiny", "8", "3" }, { "criteo", "8", "0" } } do
      local path = h.exported(c[1], { tables = "int4" })
      if path then
        local out, err, code = cmd.sh(("%s %s %s %s"):format(exe, path, c[2], c[3]))
        assert.equal(0, code, out .. err)
        assert.matches("0 mismatches, 0 errors", out)
        assert.matches("model_threads: ok", out)
        if c[3] == "3" then assert.matches(", 3 contexts,", out) end
      end
    end
    cmd.rmdir(dir)
  end)

  it("fails a bad request alone, naming what is wrong, and goes on serving", function()
    local m = assert(serve.open(h.exported("tiny", { tables = "int8" }), { device = "cpu" }))
    local batch, loader = held_batch(m, 64)
    local want = m:predict(batch):totable()
    local keys = batch.sparse:keys()
    local short = batch.sparse:permute((function()
      local o = {}
      for i = 1, 25 do o[i] = i end
      return o
    end)())
    local _, err = m:predict(batch.dense, short)
    assert.equal("model: the request has 25 sparse features; the model takes 26 (C1 .. C26)", err)
    _, err = m:predict(ur.tensor({ 64, 12 }), batch.sparse)
    assert.equal("model: dense is f32 with 2 dimensions (12 columns); expected f32 [batch, 13]", err)
    _, err = m:predict(ur.tensor({ 64 * 13 }):fill(0.5), batch.sparse)
    assert.equal("model: dense is f32 with 1 dimension; expected f32 [batch, 13]", err)
    _, err = m:predict(ur.tensor({ 64, 1, 13 }):fill(0.5), batch.sparse)
    assert.equal("model: dense is f32 with 3 dimensions; expected f32 [batch, 13]", err)
    _, err = m:predict(batch.dense, batch.sparse, ur.tensor({ 63 }))
    assert.equal("model: scores is f32 of 63 elements; expected f32 of 64", err)
    local bad = ur.KJT { keys = keys, values = (function()
      local v = {}
      for i = 1, 26 * 64 do v[i] = 1 end
      v[64 * 15 + 3] = 10000  -- C16 has 10000 rows
      return v
    end)(), lengths = (function()
      local l = {}
      for i = 1, 26 * 64 do l[i] = 1 end
      return l
    end)() }
    _, err = m:predict(batch.dense, bad)
    assert.equal("qtbe: table 'C16' (feature 'C16', sample 2, value 962) has no row 10000; ids run 0..9999", err)
    _, err = m:predict(batch.dense, batch.sparse:dedup())
    assert.equal("model: the request's KJT has a variable batch per feature; expand it first", err)
    -- keys in another order are matched by name
    local order = {}
    for i = 1, 26 do order[i] = 27 - i end
    assert.same(want, m:predict(batch.dense, batch.sparse:permute(order)):totable())
    assert.same(want, m:predict(batch):totable())
    local info = m:info()
    assert.equal(7, info.failed)
    assert.equal(10, info.calls)
    loader:close()
    m:close()
  end)

  it("names a bad id's value where the caller's KJT holds it, whatever the order of its keys", function()
    local m = assert(serve.open(h.exported("tiny", { tables = "int8" }), { device = "cpu" }))
    local b, keys, v, l = 4, {}, {}, {}
    for i = 1, 26 do keys[i] = "C" .. i end
    for i = 1, 26 * b do v[i], l[i] = 1, 1 end
    v[15 * b + 3] = 10000 -- C16 (10000 rows), sample 2
    local dense = ur.tensor({ b, 13 }):fill(0.5)
    local _, err = m:predict(dense, ur.KJT { keys = keys, values = v, lengths = l })
    assert.equal("qtbe: table 'C16' (feature 'C16', sample 2, value 62) has no row 10000; ids run 0..9999", err)
    -- the keys reversed: C16 is the request's key 11, its sample 2 the request's value 42 (it said 62, the
    -- place the id takes in the model's order, which the caller never sees)
    local rk, rv = {}, {}
    for j = 1, 26 do
      rk[j] = keys[27 - j]
      for s = 1, b do rv[(j - 1) * b + s] = v[(26 - j) * b + s] end
    end
    local reversed = ur.KJT { keys = rk, values = rv, lengths = l }
    assert.equal(10000, reversed:values():totable()[43])
    _, err = m:predict(dense, reversed)
    assert.equal("qtbe: table 'C16' (feature 'C16', sample 2, value 42) has no row 10000; ids run 0..9999", err)
    m:close()
  end)

  it("refuses a KJT made unchecked whose lengths do not add up to its values, before reading through them",
     function()
    -- a model with weighted and unweighted tables: the weights of the unweighted ones are read on the host
    local m = assert(serve.open(h.exported("multihot", { tables = "f32" }), { device = "cpu" }))
    local keys, b = m:features(), 2
    local v, l, w = {}, {}, {}
    for i = 1, #keys * b do v[i], l[i], w[i] = 1, 1, 1 end
    local dense = ur.tensor({ b, m:info().num_dense }):fill(0.5)
    local function kjt(ks)
      return ur.KJT { keys = ks, values = v, lengths = l, weights = w, check = false }
    end
    local rk = {}
    for j = 1, #keys do rk[j] = keys[#keys + 1 - j] end
    l[1] = 9 -- C1's first bag claims 9 ids: the lengths add up to 60 of the 52 values
    -- (a KJT not known checked is checked whole, ur_kjt_validate's check: the first bag past the end)
    local want = "model: key '%s' sample 0: offsets 52..53 disagree with length 1 or pass the 52 values"
    -- it read weights past the tensor's end ("has weight 2.8026e-45 at value 52")
    local _, err = m:predict(dense, kjt(keys))
    assert.equal(want:format(keys[23]), err)
    -- keys in another order: the reordered copy read ids past the values' end
    _, err = m:predict(dense, kjt(rk))
    assert.equal(want:format(rk[23]), err)
    -- a key whose lengths add up to less than 0, the total right
    l[1], l[#l - 3], l[#l - 2], l[#l - 1], l[#l] = 1, -1, 0, 4, 1
    want = "model: key '%s' sample 0 (lengths[48]) has length -1; lengths must be >= 0"
    _, err = m:predict(dense, kjt(keys))
    assert.equal(want:format(keys[#keys - 1]), err)
    _, err = m:predict(dense, kjt(rk))
    assert.equal(want:format(rk[#rk - 1]), err)
    -- every key's values in place, a bag's length below 0: on the CPU the collection's check of the
    -- offsets named it after the model's ("qtbe: offsets[1] = -1 is below offsets[0] = 0"); a GPU's
    -- kernels read them as given
    l[#l - 3], l[#l - 2], l[#l - 1], l[#l] = 1, 1, 1, 1
    l[1], l[2] = -1, 3
    _, err = m:predict(dense, kjt(keys))
    assert.equal("model: key 'C1' sample 0 (lengths[0]) has length -1; lengths must be >= 0", err)
    -- lengths {3, -1} for C1's bags (its span right), offsets rewritten to agree with neither but
    -- in order within the values: the collection's check on the CPU passed them, and the model
    -- scored a batch whose KJT is not what it says; now refused naming the bag
    l[1], l[2] = 3, -1
    local odd = kjt(keys)
    assert.is_false(odd:checked())
    odd:offsets():set(1, 2)
    _, err = m:predict(dense, odd)
    assert.equal("model: key 'C1' sample 0: offsets 0..2 disagree with length 3 or pass the 52 values", err)
    -- a key misnamed beside that bad bag: the name is checked first (on the host; the bags' check
    -- waits for the device where the KJT is there), and named
    local named = { unpack(keys) }
    named[5] = "nope"
    _, err = m:predict(dense, kjt(named))
    assert.equal(("model: the request has no feature '%s' (its key 5 is 'nope')"):format(keys[5]), err)
    l[1], l[2] = 1, 1
    assert.is_not_nil(m:predict(dense, kjt(rk))) -- each failed alone
    assert.same({ 8, 7 }, { m:info().calls, m:info().failed })
    m:close()
  end)

  it("takes per-id weights exactly when training's batches carried them, naming the table", function()
    -- a model trained without weights: weights would scale its rows, not ignored
    local m = assert(serve.open(h.exported("tiny", { tables = "f32" }), { device = "cpu" }))
    local batch, loader = held_batch(m, 32)
    local sp = batch.sparse
    local nv = sp:values():numel()
    local weighted = ur.KJT { keys = sp:keys(), values = sp:values(), lengths = sp:lengths(),
                              weights = ur.tensor({ nv }):fill(0.5) }
    local _, err = m:predict(batch.dense, weighted)
    assert.equal("model: the request carries per-id weights, but no table of the model was trained with them "
      .. "(table 'C1' serves feature 'C1' unweighted): send its KJT without weights", err)
    assert.same(m:predict(batch):totable(), m:predict(batch.dense, ur.KJT { keys = sp:keys(), values = sp:values(),
      lengths = sp:lengths() }):totable())
    loader:close()
    m:close()
    -- a model trained on weighted tables (C3, C6, ...): its held-out batches carry weights, 1 for the others
    local path = h.exported("multihot", { tables = "f32" })
    local desc = json.decode(assert(require("uvmrec.checkpoint").open(path)):meta("uvmrec.model"))
    assert.same({ false, false, true }, { desc.tables[1].weighted, desc.tables[2].weighted, desc.tables[3].weighted })
    m = assert(serve.open(path, { device = "cpu" }))
    batch, loader = held_batch(m, 32)
    sp = batch.sparse
    assert.is_not_nil(sp:weights())
    local want = m:predict(batch):totable()
    assert.equal(32, #want)
    _, err = m:predict(batch.dense, ur.KJT { keys = sp:keys(), values = sp:values(), lengths = sp:lengths() })
    assert.equal("model: table 'C3' (feature 'C3') was trained with per-id weights; the request carries none "
      .. "(its KJT's weights are NULL)", err)
    -- an unweighted table's ids weighted otherwise than 1
    local w = ur.tensor({ sp:weights():numel() }):copy(sp:weights())
    local span = sp:key_span("C2").values
    assert.is_true(span[2] > span[1], "C2 has ids in the batch")
    w:set(span[1], 0.25) -- 0-based, as the message counts values
    _, err = m:predict(batch.dense, ur.KJT { keys = sp:keys(), values = sp:values(), lengths = sp:lengths(),
                                             weights = w })
    assert.equal(("model: feature 'C2' (table 'C2', trained without per-id weights) has weight 0.25 at value %d; "
      .. "expected 1, as training gave its ids"):format(span[1]), err)
    loader:close()
    m:close()
  end)

  it("takes weighted requests from a model trained on day files with weights (uvmrec datagen)", function()
    local dir = cmd.tmpdir()
    local _, err, code = cmd.run(("datagen tiny_multihot --out %s/days --samples 2048 --cpu"):format(dir))
    assert.equal(0, code, err)
    local cfg = h.tiny { "data.train=criteo-bin:" .. dir .. "/days", "train.steps=4", "train.batch_size=256",
                         "eval.samples=0", "eval.min_auc=0" }
    cfg.train.checkpoint_every = 4
    assert(require("uvmrec.train").run(cfg, { out = dir .. "/run", progress = "none", cpu = true,
                                              print = function() end }))
    local r = assert(require("uvmrec.serve.export").run(dir .. "/run", { out = dir .. "/m.safetensors" }))
    for i, t in ipairs(r.description.tables) do assert.is_true(t.weighted, "table " .. i) end
    local m = assert(serve.open(dir .. "/m.safetensors", { device = "cpu" }))
    local e = assert(serve.evaluate(m, "criteo-bin:" .. dir .. "/days")) -- was: refused, as unweighted
    assert.equal(2048, e.samples)
    m:close()
    cmd.rmdir(dir)
  end)

  it("refuses data with no samples, naming it (it said 'serve: the data gave no samples')", function()
    local dir = cmd.tmpdir()
    local data, tensor = require "uvmrec.data", require "uvmrec.tensor"
    -- day files of no rows: a folder the loader opens, that ends before its first batch
    for _, f in ipairs { { "dense", { 0, 13 }, "f32" }, { "sparse", { 0, 26 }, "i64" }, { "labels", { 0 }, "i32" } } do
      local t = assert(tensor.tensor(f[2], { dtype = f[3] }))
      assert(data.npy_save(("%s/day_0_%s.npy"):format(dir, f[1]), t))
      t:free()
    end
    local path = h.exported("criteo", { tables = "f32" })
    if not path then return pending("no Criteo fixture") end
    local m = assert(serve.open(path, { device = "cpu" }))
    for _, opts in ipairs { {}, { samples = 10 } } do
      local r, err = serve.evaluate(m, "criteo-bin:" .. dir, opts)
      assert.is_nil(r)
      assert.equal(("serve: criteo-bin:%s gave no samples; expected at least one to score"):format(dir), err)
    end
    m:close()
    cmd.rmdir(dir)
  end)

  it("reads the training run's held-out day files with the model's table sizes (predict and eval without --data)",
      function()
    local dir = cmd.tmpdir()
    local sample = h.fixture("criteo_raw_sample.tsv")
    local cfg = h.tiny { "data.train=criteo-bin:" .. dir .. "/train", "data.eval=criteo-bin:" .. dir .. "/eval",
                         "train.steps=2", "train.batch_size=256", "eval.samples=1000", "eval.batch_size=500",
                         "eval.min_auc=0" }
    local train = require "uvmrec.train"
    local rows = train.config.table_rows(cfg)
    local other = {}
    for i, r in ipairs(rows) do other[i] = r + 1 end
    for _, d in ipairs { "train", "eval" } do
      os.execute("mkdir -p " .. cmd.quote(dir .. "/" .. d))
      assert(ur.data.convert({ sample }, dir .. "/" .. d, { rows = rows }))
    end
    cfg.train.checkpoint_every = 2
    assert(train.run(cfg, { out = dir .. "/run", progress = "none", cpu = true, print = function() end }))
    local path = dir .. "/m.safetensors"
    assert(require("uvmrec.serve.export").run(dir .. "/run", { out = path, tables = "f32" }))
    local out, err, code = cmd.run(("predict %s --out %s/a.txt"):format(path, dir))
    assert.equal(0, code, err)
    assert.matches("predict: 1000 samples of criteo%-bin:", out)
    -- the held-out days converted again by sizes that do not divide the model's: ids mod 'other'
    -- are not the rows the model maps the raw ids to; read raw, they were scored as if they were
    assert(ur.data.convert({ sample }, dir .. "/eval", { rows = other }))
    local want = ("criteo-bin: %s/eval/day_0's ids of C1 were taken mod %d (uvmrec convert --rows; "
      .. "day_0_sparse_rows.npy) but are read mod %d rows, which does not divide it"):format(dir, other[1], rows[1])
    out, err, code = cmd.run(("predict %s --out %s/b.txt"):format(path, dir))
    assert.equal(1, code, out)
    assert.matches(want, err, 1, true)
    assert.is_nil(io.open(dir .. "/b.txt"))
    out, err, code = cmd.run("eval " .. cmd.quote(path) .. " --cpu")
    assert.equal(1, code, out)
    assert.matches(want, err, 1, true)
    cmd.rmdir(dir)
  end)

  it("refuses truncated, foreign and mismatched files, naming the file and the reason", function()
    local good = h.exported("tiny", { tables = "int8" })
    local dir = cmd.tmpdir()
    local function try(path) return select(2, serve.open(path, { device = "cpu" })) end
    -- truncated
    local bytes = assert(cmd.slurp(good))
    cmd.spit(dir .. "/cut.safetensors", bytes:sub(1, #bytes - 100))
    local err = try(dir .. "/cut.safetensors")
    assert.truthy(err:find(dir .. "/cut.safetensors", 1, true), err)
    assert.matches("the file is truncated", err)
    -- not safetensors at all
    cmd.spit(dir .. "/text.safetensors", "hello, world\n")
    err = try(dir .. "/text.safetensors")
    assert.truthy(err:find(dir .. "/text.safetensors", 1, true), err)
    -- a training checkpoint, and a safetensors file of someone else's
    local ckpt = assert(require("uvmrec.train").checkpoint_file(h.trained("tiny").run))
    assert.equal(("model file %s: uvmrec.format is '1', not 'model' (a training checkpoint: `uvmrec export` "
                  .. "makes a model of it)"):format(ckpt), try(ckpt))
    assert(ck.save(dir .. "/other.safetensors", { tensors = { w = ur.tensor({ 2, 2 }) }, meta = { note = "x" } }))
    assert.equal(("model file %s/other.safetensors: not a uvmrec model: its metadata has no uvmrec.format"):format(dir),
                 try(dir .. "/other.safetensors"))
    -- the good file changed one way at a time
    local st = assert(ck.load(good))
    local function variant(name, edit_desc, edit_tensors)
      local d = json.decode(st.meta["uvmrec.model"])
      local tensors = {}
      for k, v in pairs(st.tensors) do tensors[k] = v end
      if edit_desc then edit_desc(d) end
      if edit_tensors then edit_tensors(tensors) end
      local meta = {}
      for k, v in pairs(st.meta) do meta[k] = v end
      meta["uvmrec.model"] = json.encode(d)
      local path = ("%s/%s.safetensors"):format(dir, name)
      assert(ck.save(path, { tensors = tensors, meta = meta }))
      return try(path), path
    end
    local e, p = variant("arch", function(d) d.arch = "two_tower" end)
    assert.equal(("model file %s: its architecture is 'two_tower'; the serving API serves DLRM (dot or dcnv2 "
                  .. "interaction)"):format(p), e)
    e, p = variant("shape", nil, function(t) t["dense.top.1.weight"] = ur.tensor({ 64, 360 }) end)
    assert.equal(("model file %s: tensor 'dense.top.1.weight' is f32 [64, 360]; top[1] needs f32 [64, 367]")
                 :format(p), e)
    e, p = variant("missing", nil, function(t) t["embeddings.C3"] = nil end)
    assert.equal(("model file %s: no tensor 'embeddings.C3' (C3)"):format(p), e)
    e, p = variant("extra", nil, function(t) t.extra = ur.tensor({ 3 }) end)
    assert.equal(("model file %s: it holds tensor 'extra', which its description does not name"):format(p), e)
    e, p = variant("format", function(d) d.tables[5].format = "int4" end)
    assert.equal(("model file %s: tensor 'embeddings.C5' is u8 [30, 20]; C5 needs u8 [30, 12]"):format(p), e)
    e, p = variant("collisions", function(d) d.tables[2].collisions = "embeddings.C2.mc" end)
    assert.equal(("model file %s: table 'C2' maps its ids through a managed-collision map, which this engine "
                  .. "does not serve yet"):format(p), e)
    -- ids taken modulo more than the rows: every id past the rows would be a bad one (it opened, and under
    -- bounds warn or off dropped those ids from the bags without a word)
    e, p = variant("modulo", function(d) d.tables[2].modulo = 11 end)
    assert.equal(("model file %s: table 'C2' takes ids modulo 11, but has 10 rows; expected a modulo of at "
                  .. "most its rows (0: ids as they come)"):format(p), e)
    -- an input transform the engine does not know (it opened, and ur_model_info gave it cut to 15 bytes)
    e, p = variant("input", function(d) d.input = "criteo-tsv-hashed-v2" end)
    assert.equal(("model file %s: its input is 'criteo-tsv-hashed-v2'; expected criteo or synthetic"):format(p), e)
    e, p = variant("input_type", function(d) d.input = 3 end)
    assert.equal(("model file %s: the description's input is not a string"):format(p), e)
    e, p = variant("features", function(d) d.tables[7].features = { "C8" } end)
    assert.equal(("model file %s: feature 'C8' is on two tables"):format(p), e)
    -- what the tables' own checks found once the dense weights were placed: raised (not nil,
    -- message), without the file's name
    e, p = variant("names", function(d) d.tables[2].name = "C1" end)
    assert.equal(("model file %s: the description's tables[1] and tables[2] are both named 'C1'"):format(p), e)
    e, p = variant("repeat", function(d) d.features[#d.features + 1] = "C1" end)
    assert.equal(("model file %s: the description's features[27] 'C1' repeats features[1]"):format(p), e)
    e, p = variant("perm", function(d) d.tables[1].permutation = "embeddings.C1.perm" end, function(t)
      local rows = t["embeddings.C1"]:size(1)
      t["embeddings.C1.perm"] = ur.tensor({ rows }, { dtype = "i64" }):fill(0)
    end)
    assert.matches(("^model file %s: qtbe: table 'C1' permutation sends row id 1 to row 0, which another id has")
                   :format(p:gsub("%p", "%%%0")), e)
    e, p = variant("dim", function(d) d.dim = 6 end)
    assert.equal(("model file %s: its dim is 6; expected a multiple of 4 (the tables' rows)"):format(p), e)
    -- a later format, or none: its meaning is not this engine's to guess
    e, p = variant("version", function(d) d.version = 2 end)
    assert.equal(("model file %s: its description is of version 2; this engine serves version 1"):format(p), e)
    e, p = variant("noversion", function(d) d.version = nil end)
    assert.equal(("model file %s: the description's version is missing or not a whole number; this engine serves "
                  .. "version 1"):format(p), e)
    e, p = variant("self", function(d) d.self_interaction = "yes" end)
    assert.equal(("model file %s: the description's self_interaction is not true or false"):format(p), e)
    e, p = variant("zero", function(d) d.bottom[1].weight = "zero.w" end, function(t)
      t["zero.w"] = ur.tensor({ 0, 13 })
    end)
    assert.equal(("model file %s: 'zero.w' (bottom[1]'s weight) has no rows: a layer of 0 outputs"):format(p), e)
    -- a weight that is no matrix: what a layer needs, not a shape of -1 rows (it said 'needs f32 [-1, 13]')
    e, p = variant("flat", nil, function(t) t["dense.bottom.1.weight"] = ur.tensor({ 13 }) end)
    assert.equal(("model file %s: tensor 'dense.bottom.1.weight' is f32 [13]; bottom[1] needs f32 [outputs, 13]")
                 :format(p), e)
    st = assert(ck.load(h.exported("dcnv2_rank", { tables = "int8" })))
    e, p = variant("flat_v", nil, function(t) t["dense.interaction.V_1"] = ur.tensor({ 432 }) end)
    assert.equal(("model file %s: tensor 'dense.interaction.V_1' is f32 [432]; cross[1] needs f32 [rank, 432]")
                 :format(p), e)
    cmd.rmdir(dir)
  end)

  it("refuses a file whose bytes changed after export (checksums), or turned a weight, a value or a row's scale "
     .. "non-finite, naming tensor and place", function()
    local dir = cmd.tmpdir()
    -- Overwrites bytes of tensor `name` of file `good` at byte `at` of its data; returns open's
    -- error.  restamp: the checksum made to match, so that only the values can tell.
    local function corrupt(good, name, at, bytes, tag, restamp)
      local text = assert(cmd.slurp(good))
      local info = assert(assert(ck.open(good)):info(name))
      local o = info.offset + at
      local path = ("%s/%s.safetensors"):format(dir, tag)
      text = text:sub(1, o) .. bytes .. text:sub(o + #bytes + 1)
      cmd.spit(path, restamp ~= false and h.restamp(text, name, info) or text)
      local m, err = serve.open(path, { device = "cpu" })
      if m then m:close() end
      return err, path
    end
    local nan32, inf16 = string.char(0, 0, 0xc0, 0x7f), string.char(0, 0x7c)
    -- f32 dense weight [64, 368]: element 3 of row 2
    local f32 = h.exported("tiny", { tables = "f32" })
    local e, p = corrupt(f32, "dense.top.1.weight", 4 * (2 * 368 + 3), nan32, "w")
    assert.equal(("model file %s: tensor 'dense.top.1.weight' holds a non-finite value at row 2, column 3 "
                  .. "(a file changed after export?)"):format(p), e)
    e, p = corrupt(f32, "dense.bottom.1.bias", 4 * 5, nan32, "b")
    assert.equal(("model file %s: tensor 'dense.bottom.1.bias' holds a non-finite value at element 5 "
                  .. "(a file changed after export?)"):format(p), e)
    e, p = corrupt(f32, "embeddings.C4", 4 * (7 * 16 + 1), nan32, "t32")
    assert.equal(("model file %s: tensor 'embeddings.C4' holds a non-finite value at row 7, column 1 "
                  .. "(a file changed after export?)"):format(p), e)
    -- int4 rows of dim 16: 12 bytes a row, the f16 scale first, then the bias
    local int4 = h.exported("tiny", { tables = "int4" })
    e, p = corrupt(int4, "embeddings.C3", 12 * 9 + 2, inf16, "bias")
    assert.equal(("model file %s: tensor 'embeddings.C3' holds a non-finite f16 scale or bias at row 9 "
                  .. "(a file changed after export?)"):format(p), e)
    e, p = corrupt(int4, "embeddings.C3", 12 * 9, inf16, "scale")
    assert.equal(("model file %s: tensor 'embeddings.C3' holds a non-finite f16 scale or bias at row 9 "
                  .. "(a file changed after export?)"):format(p), e)
    -- any byte changed, the codes' included, fails the tensor's checksum
    local info = assert(assert(ck.open(int4)):info("embeddings.C3"))
    e, p = corrupt(int4, "embeddings.C3", 12 * 9 + 5, string.char(0x5a), "codes", false)
    assert.truthy(e:find(("safetensors: %s: tensor 'embeddings.C3' (file bytes %d..%d) does not match the checksum "
      .. "written with it (crc32c "):format(p, info.offset, info.offset + info.nbytes), 1, true), e)
    assert.truthy(e:find("): the file is corrupted", 1, true), e)
    e = corrupt(f32, "dense.top.1.weight", 4 * (2 * 368 + 3), nan32, "wn", false)
    assert.matches("tensor 'dense.top.1.weight' .* does not match the checksum", e)
    cmd.rmdir(dir)
  end)

  it("grows a context to the batch itself when twice its last batch cannot be had", function()
    -- build/bin/model_oom (spec/support/model_oom.c): the engine with every host allocation over a
    -- size failing.  A context warmed at 1000 samples asked 1001 grew to 2000 or failed, where a
    -- fresh one scores 1001
    local p = h.test_program("model_oom")
    if not p then return end
    local path = h.exported("tiny", { tables = "int8" })
    local out, err, code = cmd.sh(("%s %s grow 1000"):format(p, cmd.quote(path)))
    assert.equal(0, code, out .. err)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal("fresh B+1: 0 ok", lines[1])
    assert.equal("B: 0 ok", lines[3])
    assert.equal("B+1: 0 ok", lines[4])
    -- over what B + 1 took: refused; the buffers stay as they were
    assert.matches("^B%+2: %-2 ", lines[5])
    assert.equal("B+1 again: 0 ok", lines[6])
    assert.equal("B again: 0 ok", lines[7])
  end)

  it("names the model file, what it could not place, its bytes and the batch when host memory runs out", function()
    -- the allocator's message came alone ("tensor: host allocation of N bytes failed"), for a
    -- context's buffers and for the tables and weights placed when the file is opened
    local p = h.test_program("model_oom")
    if not p then return end
    local path = h.exported("tiny", { tables = "int8" })
    local out = cmd.sh(("%s %s grow 1000"):format(p, cmd.quote(path)))
    local line = out:match("\nB%+2: ([^\n]*)")
    local bytes = line:match("^%-2 model file .-: a context's activations %((%d+) bytes%) for a batch of 1002 samples: "
      .. "tensor: host allocation of (%d+) bytes failed$")
    assert.truthy(bytes, line)
    assert.truthy(line:find("model file " .. path .. ":", 1, true), line)
    assert.is_true(tonumber(bytes) > tonumber(out:match("\nfresh (%d+)\n")))
    out = cmd.sh(("%s %s open 150000"):format(p, cmd.quote(path)))
    assert.equal(("open: -2 model file %s: qtbe: table 'C16' (10000 rows, int8, 200000 bytes in host memory): "
      .. "tensor: host allocation of 200000 bytes failed\n"):format(path), out)
    local int2 = h.exported("tiny", { tables = "int2" })
    out = cmd.sh(("%s %s open 90000"):format(p, cmd.quote(int2)))
    assert.equal(("open: -2 model file %s: tensor 'dense.top.1.weight' (f32 [64, 368], 94208 bytes): tensor: host "
      .. "allocation of 94208 bytes failed\n"):format(int2), out)
  end)

  it("names the model file, and what it could not have, for every host allocation that fails while opening or "
     .. "scoring", function()
    -- ur_safetensors_open said 'safetensors: out of host memory' alone, model.c 'model: out of host memory'
    -- (the model, its tables' and features' lists and names, a context), and what they called their own
    -- words ('tensor view: out of host memory', 'stream: out of host memory', 'linear forward: out of host
    -- memory for 64 f32 elements of scratch')
    local p = h.test_program("model_oom")
    if not p then return end
    local path = h.exported("tiny", { tables = "int8" })
    local out = cmd.sh(("%s %s sweep"):format(p, cmd.quote(path)))
    local seen = {}
    for _, call in ipairs { "open", "predict" } do
      local n, failed = out:match("\n?" .. call .. ": (%d+) allocations, (%d+) failed\n")
      assert.truthy(n, out)
      assert.equal(n, failed, call .. ": each allocation that fails fails the call")
      assert.is_true(tonumber(n) > (call == "open" and 300 or 20), call .. ": " .. n .. " allocations")
      local lines = 0
      for line in out:gmatch(call .. " %d+: ([^\n]*)") do
        lines = lines + 1
        local named = line:sub(1, 3) == "-2 " and (line:find("model file " .. path .. ": ", 4, true) == 4
          or line:find("safetensors: " .. path .. ": ", 4, true) == 4)
        assert.truthy(named, call .. ": " .. line)
        seen[(line:gsub("%(%d+ bytes%)", "(N bytes)"))] = true
      end
      assert.equal(tonumber(n), lines)
    end
    for _, want in ipairs {
      "safetensors: %s: out of host memory for opening it (N bytes)",
      "safetensors: %s: out of host memory for its 34 tensors' entries (N bytes)",
      "safetensors: %s: out of host memory for its metadata's 7 keys (N bytes)",
      "safetensors: %s: out of host memory for tensor 'embeddings.C7''s name (N bytes)",
      "safetensors: %s: out of host memory for its 34 tensors' checksums (N bytes)",
      "safetensors: %s: out of host memory for reading tensor 'embeddings.C7' (N bytes)",
      "safetensors: %s: a view of tensor 'embeddings.C7': tensor: out of host memory",
      "safetensors: %s: out of host memory for loading 1 tensor (N bytes)",
      "model file %s: out of host memory for the model (N bytes)",
      "model file %s: out of host memory for the description's 26 tables and 26 features (N bytes)",
      "model file %s: out of host memory for feature 'C7''s name (N bytes)",
      "model file %s: table 'C7''s rows: tensor view: out of host memory",
      "model file %s: out of host memory for a context (N bytes)",
      "model file %s: a context's stream: stream: out of host memory",
      "model file %s: linear forward: out of host memory for 64 f32 elements of scratch",
    } do
      assert.truthy(seen["-2 " .. want:format(path)], want)
    end
  end)

  it("places the tables where it is told, and reads the same from each placement on the CPU", function()
    local path = h.exported("tiny", { tables = "int4" })
    local a = assert(serve.open(path, { device = "cpu", placement = "host" }))
    local b = assert(serve.open(path, { device = "cpu", placement = "managed", hot_fraction = 0.5 }))
    assert.equal("managed", b:info().placement)
    local before = ur.memory().managed
    assert.is_true(before >= b:info().table_bytes)
    local batch, loader = held_batch(a, 300)
    assert.same(a:predict(batch):totable(), b:predict(batch):totable())
    loader:close()
    assert.has_error(function() serve.open(path, { device = "cpu", placement = "device" }) end,
                     "qtbe: table 'C1' placement 'device' needs the collection on a GPU, and it runs on the "
                     .. "CPU (device -1)")
    assert.has_error(function() serve.open(path, { oops = 1 }) end,
                     "serve: unknown option 'oops'; expected bounds, device, hot_fraction, max_callers, placement")
    for _, c in ipairs {
      { { device = "cpu", max_callers = 1.5 }, "serve: max_callers 1.5; expected a whole number (0: no limit)" },
      { { device = "cpu", max_callers = 2 ^ 40 },
        "serve: max_callers 1099511627776; expected a whole number (0: no limit)" },
      { { device = "cpu", hot_fraction = "x" }, "serve: hot_fraction x; expected a number (< 0: no hints)" },
      { "cpu", "serve: options are string cpu; expected a table such as {device = \"cpu\"}" },
    } do
      h.raises_at_caller(function() serve.open(path, c[1]) end, c[2])
    end
    local o = ffi.new("ur_model_options")
    C.ur_model_options_init(o)
    o.device, o.hot_fraction = -1, 1.5
    local out = ffi.new("ur_model *[1]")
    assert.equal(C.UR_STATUS_INVALID, C.ur_model_open(out, path, o))
    assert.equal("model: hot_fraction 1.5; expected at most 1 (< 0: no hints)", ffi.string(C.ur_last_error()))
    o.hot_fraction, o.table_place = 0, C.UR_PLACE_PINNED
    assert.equal(C.UR_STATUS_INVALID, C.ur_model_open(out, path, o))
    assert.equal("model: table placement pinned (1); expected device, managed, host or -1 (where it runs)",
                 ffi.string(C.ur_last_error()))
    assert.has_error(function() serve.open(path, { device = "cpu", placement = "pinned" }) end,
                     "serve: placement 'pinned' is not one of device, host, managed")
  end)
end)

describe("uvmrec predict and engine/examples/serve.c", function()
  it("writes one probability a line, and serve.c writes the same lines from the same Criteo lines", function()
    local path, why = h.exported("criteo", { tables = "int8" })
    if not path then pending(why) return end
    local sample = h.fixture("criteo_raw_sample.tsv")
    local dir = cmd.tmpdir()
    local out, err, code = cmd.run(("predict %s --data criteo-tsv:%s --out %s/lua.txt"):format(path, sample, dir))
    assert.equal(0, code, err)
    assert.matches("predict: 1000 samples of criteo%-tsv:", out)
    local lua = assert(cmd.slurp(dir .. "/lua.txt"))
    local n = select(2, lua:gsub("\n", ""))
    assert.equal(1000, n)
    -- day files convert reduced by twice the model's rows score the same; by rows the model's do not
    -- divide, they are refused (the model would read other rows than for the raw ids)
    local rows = require("uvmrec.train").config.table_rows(assert(serve.open(path, { device = "cpu" })):config())
    local twice, other = {}, {}
    for i, r in ipairs(rows) do twice[i], other[i] = 2 * r, r + 1 end
    local days_twice, days_other = cmd.tmpdir(), cmd.tmpdir()
    assert(ur.data.convert({ sample }, days_twice, { rows = twice }))
    assert(ur.data.convert({ sample }, days_other, { rows = other }))
    out, err, code = cmd.run(("predict %s --data criteo-bin:%s --out %s/bin.txt"):format(path, days_twice, dir))
    assert.matches("predict: 1000 samples of criteo%-bin:", out)
    assert.equal(0, code, err)
    assert.equal(lua, cmd.slurp(dir .. "/bin.txt"))
    out, err, code = cmd.run(("predict %s --data criteo-bin:%s"):format(path, days_other))
    assert.equal(1, code, out)
    assert.matches(("day_0's ids of C1 were taken mod %d %%(uvmrec convert %%-%%-rows"):format(other[1]), err)
    cmd.rmdir(days_twice)
    cmd.rmdir(days_other)
    local exe, nobuild = h.build_c("engine/examples/serve.c", dir, "serve")
    if not exe then return pending(nobuild) end
    -- a count out of range is named with its limits
    local _, uerr, ucode = cmd.sh(("%s --threads 0 %s < %s"):format(exe, path, sample))
    assert.equal(2, ucode)
    assert.matches("^serve: %-%-threads is '0'; expected a whole number from 1 to 256\nusage: serve ", uerr)
    local c
    c, err, code = cmd.sh(("%s --threads 3 %s < %s"):format(exe, path, sample))
    assert.equal(0, code, err)
    assert.equal(lua, c)
    -- 39 fields (no label): the same lines
    c, err, code = cmd.sh(("cut -f2- %s | %s --threads 2 %s"):format(sample, exe, path))
    assert.equal(0, code, err)
    assert.equal(lua, c)
    -- a bad line scores nan and the rest go on
    local lines = {}
    for l in io.lines(sample) do lines[#lines + 1] = l if #lines == 4 then break end end
    lines[2] = "1\t2\t3"
    c, err, code = cmd.sh(exe .. " " .. path, table.concat(lines, "\n") .. "\n")
    assert.equal(1, code)
    assert.matches("serve: line 2: 3 fields; expected 40 %(the label first, as line 1; else %-%-labels no%)", err)
    local got = {}
    for l in c:gmatch("[^\n]+") do got[#got + 1] = l end
    local want = {}
    for l in lua:gmatch("[^\n]+") do want[#want + 1] = l if #want == 4 then break end end
    -- a batch of 4 is not one of 512: OpenBLAS may round the products of another row count
    -- differently, by a unit of the last place
    assert.equal("nan", got[2])
    for _, i in ipairs { 1, 3, 4 } do assert.is_true(math.abs(tonumber(got[i]) - tonumber(want[i])) < 1e-6) end
    -- a labeled line whose last field is missing is not read as a line without a label (its
    -- columns shifted by one): the input's first line said lines carry the label
    local short = {}
    for l in io.lines(sample) do short[#short + 1] = l if #short == 4 then break end end
    short[2] = short[2]:gsub("\t[^\t]*$", "")
    c, err, code = cmd.sh(exe .. " " .. path, table.concat(short, "\n") .. "\n")
    assert.equal(1, code, c)
    assert.matches("serve: line 2: 39 fields; expected 40 %(the label first, as line 1; else %-%-labels no%)", err)
    got = {}
    for l in c:gmatch("[^\n]+") do got[#got + 1] = l end
    assert.same({ "nan" }, { got[2] })
    -- --labels says it for every line, the first too
    c, err, code = cmd.sh(exe .. " --labels no " .. path, table.concat(lines, "\n", 3, 4) .. "\n")
    assert.equal(1, code, c)
    assert.matches("serve: line 1: 40 fields; expected 39 %(no label, %-%-labels no%)", err)
    assert.equal("nan\nnan\n", c)
    c, err, code = cmd.sh(exe .. " --labels yes " .. path, table.concat(short, "\n", 2, 3) .. "\n")
    assert.equal(1, code, c)
    assert.matches("serve: line 1: 39 fields; expected 40 %(the label first, %-%-labels yes%)", err)
    for _, u in ipairs {
      { "--labels", "serve: --labels needs a value" }, -- was: the bare usage
      { "--bogus " .. path, "serve: unknown option '--bogus'" },
      { path .. " " .. path, ("serve: one model file; '%s' and '%s' given"):format(path, path) },
      { "--cpu", "serve: no model file given" },
    } do
      c, err, code = cmd.sh(exe .. " " .. u[1], "")
      assert.equal(2, code, c)
      assert.equal(u[2], err:match("^[^\n]*"))
    end
    c, err, code = cmd.sh(exe .. " --labels maybe " .. path, "")
    assert.equal(2, code, c)
    assert.matches("^serve: %-%-labels is 'maybe'; expected yes %(40 fields, the label first%) or no %(39%)\n"
      .. "usage:", err)
    -- a line too long for its buffer is one bad line, not several
    lines[2] = "1" .. ("\t"):rep(39) .. ("f"):rep(70000)
    c, err, code = cmd.sh(exe .. " " .. path, table.concat(lines, "\n") .. "\n")
    assert.equal(1, code)
    assert.matches("serve: line 2: longer than 65535 bytes", err)
    assert.is_nil(err:find("line 5", 1, true))
    got = {}
    for l in c:gmatch("[^\n]+") do got[#got + 1] = l end
    assert.equal(4, #got)
    assert.equal("nan", got[2])
    for _, i in ipairs { 1, 3, 4 } do assert.is_true(math.abs(tonumber(got[i]) - tonumber(want[i])) < 1e-6) end
    -- a model of synthetic data does not take Criteo lines
    c, err, code = cmd.sh(exe .. " " .. h.exported("tiny", {}), "")
    assert.equal(2, code, c)
    assert.matches("takes synthetic input with 13 dense and 26 sparse features; serve reads Criteo lines", err)
    cmd.rmdir(dir)
  end)

  it("refuses Criteo data for a model not trained on Criteo input, as serve.c does", function()
    -- predict and eval scored Criteo lines with a model of synthetic input (its description's
    -- input was not read), where serve.c refuses them
    local tiny, criteo = h.exported("tiny", { tables = "int8" }), h.exported("criteo", { tables = "int8" })
    if not criteo then return pending("no Criteo fixture") end
    local sample = h.fixture("criteo_raw_sample.tsv")
    local dir = cmd.tmpdir()
    local days = dir
    assert(ur.data.convert({ sample }, days, {}))
    for _, spec in ipairs { "criteo-tsv:" .. sample, "criteo-bin:" .. days } do
      local want = ("serve: %s takes synthetic input with 13 dense and 26 sparse features; %s is Criteo data "
        .. "(13 and 26)"):format(tiny, spec)
      refused_data(tiny, spec, want, dir)
      -- a model of Criteo input takes them
      local out, err, code = cmd.run(("predict %s --data %s --samples 3 --cpu"):format(criteo, spec))
      assert.equal(0, code, err)
      assert.equal(3, select(2, out:gsub("\n", "")))
    end
    cmd.rmdir(dir)
  end)

  it("refuses synthetic data for a model trained on Criteo input, the mirror of the rule above", function()
    -- predict and eval scored synthetic:tiny with a Criteo model as "the training run's held-out
    -- samples": ids drawn as rows of its tables and labels from the generator's hidden model, none
    -- of it what the model learned (eval: AUC 0.5113)
    local tiny, criteo = h.exported("tiny", { tables = "int8" }), h.exported("criteo", { tables = "int8" })
    if not criteo then return pending("no Criteo fixture") end
    local dir = cmd.tmpdir()
    for _, spec in ipairs { "synthetic:tiny", "synthetic:kaggle" } do
      local want = ("serve: %s takes criteo input with 13 dense and 26 sparse features; %s is synthetic data "
        .. "(13 and 26)"):format(criteo, spec)
      refused_data(criteo, spec, want, dir)
    end
    -- a model of synthetic input takes them, and a Criteo model its own held-out samples
    local out, err, code = cmd.run(("predict %s --data synthetic:tiny --samples 3 --cpu"):format(tiny))
    assert.equal(0, code, err)
    assert.equal(3, select(2, out:gsub("\n", "")))
    out, err, code = cmd.run(("predict %s --samples 3 --cpu"):format(criteo))
    assert.equal(0, code, err)
    assert.equal(3, select(2, out:gsub("\n", "")))
    cmd.rmdir(dir)
  end)

  it("serve_bench measures what it was asked, and names an argument it cannot read", function()
    local path = h.exported("tiny", { tables = "int8" })
    local dir = cmd.tmpdir()
    local exe, nobuild = h.build_c("engine/examples/serve_bench.c", dir, "serve_bench")
    if not exe then return pending(nobuild) end
    local dense = ur.tensor({ 64, 13 }):fill(0.5)
    local ids = ur.tensor({ 64, 26 }, { dtype = "i64" }):fill(1) -- every table has a row 1
    assert.equal(0, C.ur_npy_save(dir .. "/d.npy", dense.p, nil))
    assert.equal(0, C.ur_npy_save(dir .. "/i.npy", ids.p, nil))
    assert.equal(0, C.ur_npy_save(dir .. "/di32.npy", ur.tensor({ 64, 13 }, { dtype = "i32" }).p, nil))
    local base = ("%s %s %s/d.npy %s/i.npy"):format(exe, path, dir, dir)
    local out, err, code = cmd.sh(base .. " 8x2 0.2 cpu '' 0.2 0")
    assert.equal(0, code, err)
    local r = json.decode(out:match("^[^\n]+"))
    assert.same({ 8, 2 }, { r.batch, r.threads })
    assert.is_true(r.calls > 0)
    for _, c in ipairs {
      { "8x2 0.2 CPU", "serve_bench: 'CPU' is not cpu or gpu" }, -- was: the GPU when there is one
      { "8x2 0.2s cpu", "serve_bench: SECONDS is '0.2s'; expected a number" },
      { "8x2 0.2 cpu host x", "serve_bench: HOT_FRACTION is 'x'; expected a number" },
      { "8x2 0.2 cpu host 0.2 4GB", "serve_bench: HBM_BUDGET_BYTES is '4GB'; expected a whole number" },
      { "8x2 0.2 cpu pinnned", "serve_bench: placement 'pinnned'; expected device, managed or host" },
      { "8x2,16 0.2 cpu", "serve_bench: configuration '16' is not BATCHxTHREADS (BATCH 1 or more, THREADS 1 to 256)" },
    } do
      out, err, code = cmd.sh(base .. " " .. c[1])
      assert.equal(2, code, c[1] .. ": " .. out .. err)
      assert.equal(c[2], err:match("^[^\n]+"), c[1])
    end
    if C.ur_device_count() == 0 then
      out, err, code = cmd.sh(base .. " 8x2 0.2 gpu")
      assert.equal(2, code, out) -- was: measured on the CPU
      assert.equal("serve_bench: gpu asked, but this machine has no GPU in use\n", err)
    end
    out, err, code = cmd.sh(("%s %s %s/di32.npy %s/i.npy 8x1 0.2 cpu"):format(exe, path, dir, dir))
    assert.equal(2, code, out)
    assert.equal("serve_bench: the requests are not dense f32 [N, 13] and ids i64 [N, 26]\n", err)
    assert.equal(0, C.ur_npy_save(dir .. "/d0.npy", ur.tensor({ 0, 13 }).p, nil))
    assert.equal(0, C.ur_npy_save(dir .. "/i0.npy", ur.tensor({ 0, 26 }, { dtype = "i64" }).p, nil))
    out, err, code = cmd.sh(("%s %s %s/d0.npy %s/i0.npy 8x1 0.2 cpu"):format(exe, path, dir, dir))
    assert.equal(2, code, out) -- was: SIGFPE, a division by the 0 samples
    assert.equal("serve_bench: the requests hold 0 samples; expected at least one\n", err)
    cmd.rmdir(dir)
  end)

  it("predicts the held-out samples of a synthetic run, and uvmrec eval scores them as training did", function()
    local t = h.trained("tiny")
    local path = h.exported("tiny", { tables = "f32" })
    local out, err, code = cmd.run("predict " .. path .. " --samples 1000 --batch-size 300")
    assert.equal(0, code, err)
    local m = assert(serve.open(path, { device = "cpu" }))
    local batch, loader = held_batch(m, 1000)
    local want = {}
    for i, v in ipairs(m:predict(batch):totable()) do want[i] = ("%.9g"):format(v) end
    loader:close()
    local got = {}
    for l in out:gmatch("[^\n]+") do got[#got + 1] = l end
    assert.equal(1000, #got)
    for i = 1, 1000 do assert.is_true(math.abs(tonumber(got[i]) - tonumber(want[i])) < 1e-6) end
    out, err, code = cmd.run("eval " .. path)
    assert.equal(0, code, err)
    assert.matches(("AUC %.4f"):format(t.result.eval.auc), out, 1, true)
    assert.matches(("samples %.0f to %.0f (the training run's held-out samples)"):format(2 ^ 48, 2 ^ 48 + 16383), out,
                   1, true)
    out, err, code = cmd.run("predict /nonexistent.safetensors")
    assert.equal(1, code, out)
    assert.matches("/nonexistent.safetensors", err)
    out, err, code = cmd.run("eval " .. path .. " --set train.steps=5") -- a wrong argument: exit 2, the usage
    assert.equal(2, code, out)
    assert.matches("^uvmrec eval: a model file takes neither %-%-checkpoint nor %-%-set\nusage: uvmrec eval ", err)
  end)

  it("names what needs the training config when a model file has none or one that is no JSON; Criteo files need none",
     function()
    -- a model file of another writer, or edited: the C API opens it, and predict and eval raised
    -- json's error with a traceback (serve/init.lua's methods:config), --data criteo-tsv: too
    local dir = cmd.tmpdir()
    local function with_config(src, name, text)
      local st = assert(ck.load(src))
      local meta = {}
      for k, v in pairs(st.meta) do meta[k] = v end
      meta["uvmrec.config"] = text
      local path = ("%s/%s.safetensors"):format(dir, name)
      assert(ck.save(path, { tensors = st.tensors, meta = meta }))
      return path
    end
    local tiny = h.exported("tiny", { tables = "int8" })
    local none, bad = with_config(tiny, "none", nil), with_config(tiny, "bad", "{\"train\":")
    local m = assert(serve.open(none, { device = "cpu" }))
    assert.same({ nil, ("model file %s: its metadata has no uvmrec.config; expected a JSON object (the training "
                        .. "run's config)"):format(none) },
                { m:config() })
    m:close()
    local missing = ("model file %s: its metadata has no uvmrec.config; expected a JSON object (the training run's "
      .. "config), which the training run's held-out samples need"):format(none)
    local out, err, code = cmd.run(("predict %s --samples 3 --cpu"):format(none))
    assert.equal(1, code, out)
    assert.equal("uvmrec predict: " .. missing .. "\n", err)
    out, err, code = cmd.run(("eval %s --cpu"):format(none))
    assert.equal(1, code, out)
    assert.equal("uvmrec eval: " .. missing .. "\n", err)
    out, err, code = cmd.run(("predict %s --data synthetic:tiny --samples 3 --cpu"):format(bad))
    assert.equal(1, code, out)
    assert.equal(("uvmrec predict: model file %s: uvmrec.config is not JSON (json: unexpected token near end of "
      .. "file at byte 9); expected a JSON object (the training run's config), which --data synthetic:tiny needs\n")
      :format(bad), err)
    -- Criteo files need nothing of the training run's: scored as with the config (training's
    -- defaults for what it would set: eval.samples, eval.metrics, data.pad_missing_fields)
    local criteo = h.exported("criteo", { tables = "int8" })
    if not criteo then return pending("no Criteo fixture") end
    local sample = h.fixture("criteo_raw_sample.tsv")
    for _, p in ipairs { with_config(criteo, "cnone", nil), with_config(criteo, "cbad", "not json") } do
      local want = cmd.run(("predict %s --data criteo-tsv:%s --samples 5 --cpu"):format(criteo, sample))
      out, err, code = cmd.run(("predict %s --data criteo-tsv:%s --samples 5 --cpu"):format(p, sample))
      assert.equal(0, code, err)
      assert.equal(want, out)
      want = cmd.run(("eval %s --data criteo-tsv:%s --cpu"):format(criteo, sample)):match("eval: AUC [%d.]+")
      out, err, code = cmd.run(("eval %s --data criteo-tsv:%s --cpu"):format(p, sample))
      assert.equal(0, code, err)
      assert.equal(want, out:match("eval: AUC [%d.]+"))
      -- its held-out samples do need the config; Criteo files are named as the way round
      out, err, code = cmd.run(("predict %s --samples 3 --cpu"):format(p))
      assert.equal(1, code, out)
      assert.matches(", which the training run's held%-out samples need; %-%-data criteo%-tsv:PATH or criteo%-bin:DIR "
        .. "needs none\n$", err)
    end
    cmd.rmdir(dir)
  end)

  it("names the file, the value and what it should be when a model file's training config holds a value of "
     .. "another type", function()
    -- JSON of the wrong shape ({"eval": 5}, eval.batch_size "x") raised a Lua error with a
    -- traceback from predict and eval ('serve/init.lua:184: attempt to index field 'eval' (a number
    -- value)', 'train/config.lua:436: bad argument #1 to 'ipairs' (table expected, got string)')
    local dir = cmd.tmpdir()
    local tiny = h.exported("tiny", { tables = "int8" })
    local st = assert(ck.load(tiny))
    local text = st.meta["uvmrec.config"]
    for _, c in ipairs {
      { "eval", function(cfg) cfg.eval = 5 end, "eval: 5 is not a mapping" },
      { "batch", function(cfg) cfg.eval.batch_size = "x" end, 'eval.batch_size: "x" is not an integer' },
      { "samples", function(cfg) cfg.eval.samples = -1 end, "eval.samples: -1 is not an integer >= 0" },
      { "rows", function(cfg) cfg.embeddings.rows = "x" end, 'embeddings.rows: "x" is not a list' },
      { "metric", function(cfg) cfg.eval.metrics = { "auc", "f1" } end,
        'eval.metrics[2]: "f1" is not one of auc, ne, accuracy, calibration, ctr' },
      { "train", function(cfg) cfg.data.train = 7 end, "data.train: 7 is not a string" },
    } do
      local cfg = json.decode(text)
      c[2](cfg)
      local meta = {}
      for k, v in pairs(st.meta) do meta[k] = v end
      meta["uvmrec.config"] = json.encode(cfg)
      local path = ("%s/%s.safetensors"):format(dir, c[1])
      assert(ck.save(path, { tensors = st.tensors, meta = meta }))
      local why = ("model file %s: uvmrec.config: %s"):format(path, c[3])
      local m = assert(serve.open(path, { device = "cpu" }))
      assert.same({ nil, why }, { m:config() })
      m:close()
      local out, err, code = cmd.run(("predict %s --samples 3 --cpu"):format(path))
      assert.equal(1, code, out)
      assert.equal(("uvmrec predict: %s, which the training run's held-out samples need\n"):format(why), err)
      out, err, code = cmd.run(("eval %s --data synthetic:tiny --cpu"):format(path))
      assert.equal(1, code, out)
      assert.equal(("uvmrec eval: %s, which --data synthetic:tiny needs\n"):format(why), err)
    end
    cmd.rmdir(dir)
  end)

  it("reads Criteo files as the training run did: lines that lost their trailing tabs, when it padded them", function()
    local sample = h.fixture("criteo_raw_sample2.tsv")
    if not cmd.exists(sample) then return pending("no " .. sample) end
    local dir = cmd.tmpdir()
    local lines = {}
    for l in io.lines(sample) do lines[#lines + 1] = (l:gsub("\t+$", "")) end
    cmd.spit(dir .. "/short.tsv", table.concat(lines, "\n") .. "\n")
    local spec = "criteo-tsv:" .. dir .. "/short.tsv"
    local train = require "uvmrec.train"
    local cfg = h.tiny { "train.steps=4", "train.batch_size=100", "train.checkpoint_every=4", "eval.min_auc=0",
                         "data.train=" .. spec, "data.eval=" .. spec, "data.pad_missing_fields=true" }
    local run = assert(train.run(cfg, { out = dir .. "/run", progress = "none", cpu = true, print = function() end }))
    assert(require("uvmrec.serve.export").run(dir .. "/run", { out = dir .. "/m.safetensors", tables = "f32" }))
    local m = assert(serve.open(dir .. "/m.safetensors", { device = "cpu" }))
    local r = assert(serve.evaluate(m, spec))
    assert.equal(400, r.samples)
    assert.equal(run.eval.auc, r.auc)
    m:close()
    cmd.rmdir(dir)
  end)

  it("writes --out only when every sample scored: a bad line later leaves no partial file", function()
    local path = h.exported("criteo", { tables = "int8" })
    if not path then return pending("no Criteo fixture") end
    local dir = cmd.tmpdir()
    local lines = {}
    for l in io.lines(h.fixture("criteo_raw_sample2.tsv")) do
      lines[#lines + 1] = l
      if #lines == 150 then break end
    end
    lines[#lines + 1] = "2\toops"
    cmd.spit(dir .. "/bad.tsv", table.concat(lines, "\n") .. "\n")
    cmd.spit(dir .. "/p.txt", "before\n")
    local out, err, code = cmd.run(("predict %s --data criteo-tsv:%s/bad.tsv --batch-size 100 --out %s/p.txt"):format(
      path, dir, dir))
    assert.equal(1, code, out)
    assert.matches("bad.tsv:151: label is '2'", err)
    assert.equal("before\n", cmd.slurp(dir .. "/p.txt"))
    out, err, code = cmd.run(("predict %s --data criteo-tsv:%s/bad.tsv --batch-size 100 --out %s/q.txt"):format(
      path, dir, dir))
    assert.equal(1, code, out .. err)
    assert.is_false(cmd.exists(dir .. "/q.txt"))
    assert.equal("bad.tsv\np.txt\n", (cmd.sh("ls " .. dir))) -- no temporary file left
    cmd.rmdir(dir)
  end)

  it("writes --out through a temporary file of its own: a file named OUT.tmp is left as it was", function()
    -- it wrote through OUT.tmp, a fixed name: the model scored, when named so, was overwritten
    -- by the scores and then renamed away (and any other file of that name lost)
    local model, dir = h.exported("tiny", {}), cmd.tmpdir()
    local bytes = assert(cmd.slurp(model))
    cmd.spit(dir .. "/model.tmp", bytes)
    local out, err, code = cmd.run(("predict %s/model.tmp --out %s/model --samples 3 --cpu"):format(dir, dir))
    assert.equal(0, code, err)
    assert.matches("predict: 3 samples of ", out)
    assert.is_true(bytes == cmd.slurp(dir .. "/model.tmp"), "the model file is as it was")
    assert.equal(3, select(2, cmd.slurp(dir .. "/model"):gsub("\n", "")))
    cmd.spit(dir .. "/p.txt.tmp", "mine\n")
    out, err, code = cmd.run(("predict %s --out %s/p.txt --samples 2 --cpu"):format(model, dir))
    assert.equal(0, code, err)
    assert.matches("predict: 2 samples of ", out)
    assert.equal("mine\n", cmd.slurp(dir .. "/p.txt.tmp"))
    assert.equal(2, select(2, cmd.slurp(dir .. "/p.txt"):gsub("\n", "")))
    assert.equal("model\nmodel.tmp\np.txt\np.txt.tmp\n", (cmd.sh("ls " .. cmd.quote(dir))))
    cmd.rmdir(dir)
  end)

  it("stops at the next batch on SIGINT or SIGTERM, removing its temporary file, and exits 128 + the signal",
    function()
    -- SIGTERM ended the process where it stood (exit 143) and SIGINT raised 'interrupted' with a
    -- traceback (exit 130): each left OUT.tmp-XXXXXX, half written, beside OUT
    if not cmd.can_background() then return pending("env --default-signal (coreutils 8.31) is needed") end
    -- a batch of one sample at a time: 16384 calls, over a second on this CPU
    local model = h.exported("tiny", {})
    local outs, out_path = cmd.interrupted_writes(function(out)
      return ("predict %s --out %s --cpu --batch-size 1"):format(cmd.quote(model), out)
    end, "p.txt")
    for sig, out in pairs(outs) do
      local samples = tonumber(out:match(("uvmrec predict: interrupted by SIG%s after (%%d+) samples; %s not "
        .. "written %%(its temporary file removed%%)\n"):format(sig, out_path:gsub("%p", "%%%0"))))
      assert.truthy(samples and samples < 16384, out)
    end
    cmd.rmdir(out_path:match("^(.*)/"))
  end)

  it("writes at most --samples lines from Criteo files too, whatever the batch size", function()
    local path = h.exported("criteo", { tables = "int8" })
    if not path then return pending("no Criteo fixture") end
    local sample = h.fixture("criteo_raw_sample2.tsv")
    local all, err, code = cmd.run(("predict %s --data criteo-tsv:%s"):format(path, sample))
    assert.equal(0, code, err)
    local out
    out, err, code = cmd.run(("predict %s --data criteo-tsv:%s --samples 5 --batch-size 3"):format(path, sample))
    assert.equal(0, code, err)
    local want = {}
    for l in all:gmatch("[^\n]+") do want[#want + 1] = l if #want == 5 then break end end
    local got = {}
    for l in out:gmatch("[^\n]+") do got[#got + 1] = l end
    assert.equal(5, #got)
    for i = 1, 5 do assert.is_true(math.abs(tonumber(got[i]) - tonumber(want[i])) < 1e-6) end
    local dir = cmd.tmpdir()
    out, err, code = cmd.run(("predict %s --data criteo-tsv:%s --samples 2 --out %s/p.txt"):format(path, sample, dir))
    assert.equal(0, code, err)
    assert.matches("predict: 2 samples of criteo%-tsv:", out)
    assert.equal(2, select(2, cmd.slurp(dir .. "/p.txt"):gsub("\n", "")))
    cmd.rmdir(dir)
  end)

  it("refuses a batch size of 0 on its command line, as a usage error", function()
    local out, err, code = cmd.run("predict " .. h.exported("tiny", {}) .. " --batch-size 0")
    assert.equal(2, code, out)
    assert.matches("%-%-batch%-size", err)
    assert.is_nil(err:find("traceback", 1, true))
    -- --samples 0 wrote nothing and exited 0, as if the model had been asked for something
    local dir = cmd.tmpdir()
    out, err, code = cmd.run("predict " .. h.exported("tiny", {}) .. " --samples 0 --out " .. dir .. "/p.txt")
    assert.equal(2, code, out)
    assert.matches("%-%-samples: '0' is less than 1", err)
    assert.is_nil(io.open(dir .. "/p.txt"))
    cmd.rmdir(dir)
  end)

  it("refuses an --out it cannot write before the work, naming it; eval makes its RUNDIR as for a config", function()
    local model, dir = h.exported("tiny", {}), cmd.tmpdir()
    -- predict: a folder took every score, then the rename failed naming 'DIR/sub.tmp'
    assert(cmd.sh("mkdir " .. cmd.quote(dir .. "/sub")))
    local out, err, code = cmd.run(("predict %s --samples 3 --out %s/sub"):format(model, dir))
    assert.equal(1, code, out)
    assert.equal(("uvmrec predict: --out %s/sub: Is a directory\n"):format(dir), err)
    out, err, code = cmd.run(("predict %s --samples 3 --out %s/no/p.txt"):format(model, dir))
    assert.equal(1, code, out)
    assert.equal(("uvmrec predict: --out %s/no/p.txt: %s/no: No such file or directory\n"):format(dir, dir), err)
    -- the model itself (through ./): it was replaced by the scores
    assert(cmd.sh(("cp %s %s/m.safetensors"):format(cmd.quote(model), cmd.quote(dir))))
    out, err, code = cmd.run(("predict %s/m.safetensors --samples 3 --out %s/./m.safetensors"):format(dir, dir))
    assert.equal(1, code, out)
    assert.equal(("uvmrec predict: --out %s/./m.safetensors is the model file it scores with; give another "
                  .. "file\n"):format(dir), err)
    -- eval of a model file: RUNDIR is made (it raised io.open's message with a traceback after the evaluation)
    out, err, code = cmd.run(("eval %s --out %s/new/run"):format(model, dir))
    assert.equal(0, code, err)
    local line = json.decode(assert(cmd.slurp(dir .. "/new/run/metrics.jsonl")))
    assert.equal("eval", line.event)
    assert.matches(("(%d samples,"):format(line.samples), out, 1, true)
    assert(cmd.spit(dir .. "/file", "x"))
    out, err, code = cmd.run(("eval %s --out %s/file/run"):format(model, dir))
    assert.equal(1, code, out)
    assert.matches("^uvmrec eval: %-%-out " .. dir:gsub("%p", "%%%0") .. "/file/run: ", err)
    assert.is_nil(err:find("traceback", 1, true))
    assert.is_nil(out:find("eval: AUC", 1, true), "refused before the evaluation")
    cmd.rmdir(dir)
  end)
end)
