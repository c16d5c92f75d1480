-- uvmrec.serve.export and `uvmrec export`: a training checkpoint becomes one model file whose
-- description, dense weights, quantized tables and id mappings are what the run trained (each
-- table's rows the quantizer's output of the checkpoint's rows, its layout's permutation along),
-- that Python's safetensors reads; the quantization error per table is printed; bad requests
-- are refused with the reason.
local ur = require "uvmrec"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local qtbe = require "uvmrec.qtbe"
local export = require "uvmrec.serve.export"
local h = require "helpers"
local cmd = require "command"
local bit = require "bit"

-- The model file export wrote when it held every table whole, made here the plain way: a run
-- over ranks' shards loaded into one process's collection (dist.checkpoint.load), or one
-- process's tables viewed whole, each quantized whole and saved by uvmrec.checkpoint.save with
-- the dense weights, the layout's permutations and the metadata of the file export wrote (f32
-- dense weights).  Returns its path (out) and the tables' errors.
local function whole_reference(run, exported, out)
  local train = require "uvmrec.train"
  local path = assert(train.checkpoint_file(run))
  local src = assert(ck.open(path))
  local model = assert(ck.open(exported))
  local d = json.decode(model:meta("uvmrec.model"))
  local tensors, errors = {}, {}
  for _, mlp in ipairs { d.bottom, d.top } do
    for _, l in ipairs(mlp) do
      tensors[l.weight], tensors[l.bias] = assert(src:view(l.weight)), assert(src:view(l.bias))
    end
  end
  local whole
  if src:info("embeddings.C1") == nil then
    local cfg = train.fill_defaults(json.decode(src:meta("uvmrec.config")))
    local m = assert(assert(train.model_def(cfg)).build(cfg, { cpu = true }))
    assert(require("uvmrec.dist.checkpoint").load(ck.shards_path(path), m.embeddings))
    whole = m.embeddings
  end
  for _, t in ipairs(d.tables) do
    local rows = whole and whole:table(t.name) or assert(src:view("embeddings." .. t.name))
    tensors[t.weights], errors[t.name] = qtbe.quantize(rows, t.format)
    if t.permutation then tensors[t.permutation] = assert(src:view("layout." .. t.name .. ".perm")) end
  end
  assert(ck.save(out, { tensors = tensors, meta = model:meta() }))
  return out, errors
end

-- The exported file equals the whole tables' reference byte for byte, and each table's error is
-- theirs (sums within rounding: they are added a block at a time).
local function same_as_whole(run, r, dir)
  local ref, errors = whole_reference(run, r.path, dir .. "/reference.safetensors")
  local a, b = assert(cmd.slurp(r.path)), assert(cmd.slurp(ref))
  assert.equal(#b, #a)
  assert.is_true(a == b, "the exported file differs from the whole tables' reference")
  for name, e in pairs(errors) do
    assert.equal(e.max_abs, r.tables[name].error.max_abs, name)
    assert.equal(e.count, r.tables[name].error.count, name)
    assert.near(e.rms, r.tables[name].error.rms, 1e-12 + 1e-9 * e.rms, name)
  end
end

-- Runs f with ur.tensor seen from export.lua: calls(shape, opts) is told of each and may return
-- nil, message for it instead of a tensor (an allocation that fails).
local function export_allocations(calls, f)
  local real = ur.tensor
  ur.tensor = function(shape, opts)
    if debug.getinfo(2, "S").source:match("serve/export%.lua$") then
      local none, why = calls(shape, opts)
      if none == nil and why then return nil, why end
    end
    return real(shape, opts)
  end
  local ok, r, err = pcall(f)
  ur.tensor = real
  return ok, r, err
end

-- An export run under pcall (ran: pcall's first result) that returned nil and a message matching
-- `want`, leaving nothing at out, nor a temporary file beside it.
local function refused_leaving_nothing(out, ran, none, err, want)
  assert.is_true(ran, tostring(none))
  assert.is_nil(none)
  assert.matches(want, err)
  assert.is_false(cmd.exists(out), "nothing published")
  local dir, base = out:match("^(.*)/([^/]+)$")
  assert.same({}, require("uvmrec.lib").dir_list(dir, base .. ".tmp-", ""), "no temporary file left")
end

-- Flips a bit of tensor `name` in the safetensors file at path, near its end (in the last block
-- of rows export reads): the checksum error (a pattern) reading it gives.
local function flip(path, name)
  local f = assert(ck.open(path))
  local info = assert(f:info(name), name)
  f:close()
  local text = assert(cmd.slurp(path))
  local at = info.offset + info.nbytes - 3 -- in the last block read
  local o = assert(io.open(path, "wb"))
  o:write(text:sub(1, at), string.char(bit.bxor(text:byte(at + 1), 16)), text:sub(at + 2))
  o:close()
  return ("safetensors: %s: tensor '%s' %%(file bytes %d%%.%%.%d%%) does not match the checksum written with it")
    :format(path:gsub("%p", "%%%0"), name:gsub("%p", "%%%0"), info.offset, info.offset + info.nbytes)
end

describe("uvmrec.serve.export", function()
  it("writes the description, the dense weights and every table in its format", function()
    local t = h.trained("tiny")
    local path = h.exported("tiny", { tables = "int8", per_table = { C3 = "int4", C16 = "fp16" } })
    local f = assert(ck.open(path))
    assert.equal("model", f:meta("uvmrec.format"))
    local d = assert(json.decode(f:meta("uvmrec.model")))
    assert.equal("dlrm", d.arch)
    assert.equal("dot", d.interaction)
    assert.equal(13, d.dense_features)
    assert.equal("synthetic", d.input)
    assert.same({ "relu", "relu" }, { d.bottom[1].act, d.bottom[2].act })
    assert.same({ "relu", "none" }, { d.top[1].act, d.top[2].act })
    assert.equal(26, #d.tables)
    -- where the run's final evaluation read: the held-out stream from sample 2^48, which training never draws
    assert.same({ data = "synthetic:tiny", first = 2 ^ 48, samples = 16384, batch_size = 16384 }, d.held_out)
    local src = assert(ck.open(assert(require("uvmrec.train").checkpoint_file(t.run))))
    for i, tb in ipairs(d.tables) do
      local want = i == 3 and "int4" or i == 16 and "fp16" or "int8"
      assert.equal(want, tb.format)
      assert.equal(0, tb.modulo)   -- synthetic ids are rows already
      assert.is_nil(tb.collisions)
      local rows = qtbe.quantize(assert(src:view("embeddings.C" .. i)), want)
      assert.same(rows:totable(), assert(f:view("embeddings.C" .. i)):totable())
    end
    for _, l in ipairs(d.bottom) do
      assert.same(assert(src:view(l.weight)):totable(), assert(f:view(l.weight)):totable())
    end
    assert.same(json.decode(src:meta("uvmrec.config")), json.decode(f:meta("uvmrec.config")))
  end)

  h.mpi_it("exports a run trained over ranks, its tables reassembled from the checkpoint's shards", function()
    -- the tables of a run over ranks are in ckpt-<step>.shards: export read the file alone and
    -- failed, 'checkpoint: ... has no tensor 'embeddings.C1''
    local dir = cmd.tmpdir()
    -- 3 ranks: row-wise blocks of 334, 334 and 332 rows, which no block of rows read lines up with
    local _, err, code = cmd.sh(("%s launch -n 3 train dlrm_tiny --cpu --steps 4 --out %s/run --progress none "
      .. "--set train.checkpoint_every=4 --set train.batch_size=1020 --set embeddings.sharding=column_wise "
      .. "--set embeddings.tables.C3.sharding=row_wise --set embeddings.tables.C12.sharding=row_wise "
      .. "--set embeddings.tables.C16.sharding=table_wise --set embeddings.tables.C5.sharding=data_parallel "
      .. "--set eval.min_auc=0 --set eval.samples=16380 --set eval.batch_size=5460"):format(cmd.bin(), dir))
    assert.equal(0, code, err)
    local r = assert(export.run(dir .. "/run", { out = dir .. "/m.safetensors", tables = "f32" }))
    assert.equal(26, #r.description.tables)
    -- read a block of rows at a time (it held every table whole, gathered in one process): the
    -- file is the whole tables' byte for byte, with blocks of 15 rows (1000 bytes of 16 f32s)
    -- across every shard's edges, and with the default blocks
    same_as_whole(dir .. "/run", r, dir)
    local q = assert(export.run(dir .. "/run", { out = dir .. "/q.safetensors", tables = "int4",
                                                per_table = "C3=int8,C5=fp16", chunk = 1000 }))
    same_as_whole(dir .. "/run", q, dir)
    -- the exported model scores the held-out samples as the checkpoint does
    local a, e1, c1 = cmd.sh(("%s eval dlrm_tiny --cpu --checkpoint %s/run --set eval.samples=16380 "
      .. "--set eval.batch_size=5460"):format(cmd.bin(), dir))
    assert.equal(0, c1, e1)
    local b, e2, c2 = cmd.sh(("%s eval %s/m.safetensors"):format(cmd.bin(), dir))
    assert.equal(0, c2, e2)
    local function scores(out) return assert(out:match("\neval: (AUC %S+  NE %S+  logloss %S+)"), out) end
    assert.equal(scores(a), scores(b))
    cmd.rmdir(dir)
  end)

  h.mpi_it("exports a run over ranks holding a block of rows at a time, never a table whole", function()
    -- it built one process's whole collection and loaded every shard into it, then held every
    -- quantized table until the file was written: 100 GB of tables needed as much host memory
    local dir = cmd.tmpdir()
    -- Kaggle's tables held to 200,000 rows: 1.4 M rows of 16 f32s (86 MiB), the largest 12 MiB
    local _, err, code = cmd.sh(("%s launch -n 2 train dlrm_kaggle --cpu --steps 1 --out %s/run --progress none "
      .. "--set embeddings.max_rows=200000 --set embeddings.sharding=row_wise "
      .. "--set embeddings.tables.C3.sharding=column_wise --set train.checkpoint_every=1 "
      .. "--set eval.samples=0 --set eval.min_auc=0"):format(cmd.bin(), dir))
    assert.equal(0, code, err)
    -- the growth of the exporting process's peak resident memory, from its own /proc/self/status
    local script = cmd.spit(dir .. "/peak.lua", ([[
      local function kib(field)
        return tonumber(io.open("/proc/self/status"):read("*a"):match(field .. ":%%s+(%%d+)"))
      end
      local export = require "uvmrec.serve.export"
      collectgarbage()
      local before = kib("VmRSS")
      local r = assert(export.run("%s/run", { out = "%s/m.safetensors", chunk = "1MiB" }))
      print(kib("VmHWM") - before, r.bytes)
    ]]):format(dir, dir))
    local out, perr, pcode = cmd.sh(cmd.bin() .. " " .. script)
    assert.equal(0, pcode, perr)
    local grew = assert(tonumber(out:match("^(%d+)")), out)
    -- the tables are 86 MiB; blocks of 1 MiB of rows, their int8 form and the writer's share (a
    -- sanitizer build's quarantine keeps freed blocks resident: 37 MiB there, not the engine's)
    if not h.asan() then
      assert.is_true(grew < 24 * 1024, ("the export's peak grew by %d KiB"):format(grew))
    end
    cmd.rmdir(dir)
  end)

  it("keeps the row layout's permutation, and Criteo-trained tables take ids modulo their rows", function()
    local path = assert(h.exported("criteo", { tables = "int4" }))
    local d = assert(json.decode(assert(ck.open(path)):meta("uvmrec.model")))
    assert.equal("criteo", d.input)
    assert.equal(4, d.tables[1].modulo)
    assert.equal(10000, d.tables[16].modulo)
    -- a layout: a run with managed tables and hot_prefix relays rows out; the file keeps it
    local dir = cmd.tmpdir()
    local train = require "uvmrec.train"
    local cfg = h.tiny { "train.steps=30", "train.checkpoint_every=30", "eval.samples=2048", "eval.min_auc=0",
                         "embeddings.placement=managed", "embeddings.hints.every=10" }
    assert(train.run(cfg, { out = dir .. "/run", progress = "none", cpu = true, print = function() end }))
    local src = assert(ck.open(assert(train.checkpoint_file(dir .. "/run"))))
    assert.truthy(src:info("layout.C12.perm"), "the run laid its rows out")
    assert(export.run(dir .. "/run", { out = dir .. "/m.safetensors", tables = "f32" }))
    local f = assert(ck.open(dir .. "/m.safetensors"))
    d = json.decode(f:meta("uvmrec.model"))
    assert.equal("embeddings.C12.perm", d.tables[12].permutation)
    assert.same(src:view("layout.C12.perm"):totable(), f:view("embeddings.C12.perm"):totable())
    -- a block of rows at a time, the permutation too, gives the whole tables' file byte for byte
    local r = assert(export.run(dir .. "/run", { out = dir .. "/p.safetensors", tables = "int2",
                                                per_table = { C12 = "f32" }, chunk = "600B" }))
    same_as_whole(dir .. "/run", r, dir)
    -- the permutation's buffer not had: refused, nothing left (it raised, indexing nil, with the
    -- file half written beside --out)
    local ok, none, err = export_allocations(function(_, o)
      if o.dtype == "i64" then return nil, "out of host memory (as a spec says)" end
    end, function() return export.run(dir .. "/run", { out = dir .. "/q.safetensors", chunk = "600B" }) end)
    refused_leaving_nothing(dir .. "/q.safetensors", ok, none, err,
      "^export: a buffer of 75 perm i64 elements for the blocks: out of host memory %(as a spec says%)$")
    cmd.rmdir(dir)
  end)

  it("gives a synthetic run's tables the modulo its loader took ids from a wider id space by", function()
    local dir = cmd.tmpdir()
    local spec = assert(io.open(dir .. "/wide.lua", "w"))
    spec:write('local s = require("uvmrec.data.synthetic").resolve("tiny")\ns.id_space_factor = 4\nreturn s\n')
    spec:close()
    local train = require "uvmrec.train"
    local cfg = h.tiny { "train.steps=20", "train.checkpoint_every=20", "eval.samples=2048", "eval.min_auc=0",
                         "data.train=synthetic:" .. dir .. "/wide.lua" }
    local run = assert(train.run(cfg, { out = dir .. "/run", progress = "none", cpu = true, print = function() end }))
    assert(export.run(dir .. "/run", { out = dir .. "/m.safetensors", tables = "f32" }))
    local d = json.decode(assert(ck.open(dir .. "/m.safetensors")):meta("uvmrec.model"))
    assert.equal("synthetic", d.input)
    assert.equal(4, d.tables[1].modulo)
    assert.equal(10000, d.tables[16].modulo)
    local m = assert(require("uvmrec.serve").open(dir .. "/m.safetensors", { device = "cpu" }))
    local r = assert(require("uvmrec.serve").evaluate(m))
    assert.equal(run.eval.auc, r.auc)
    m:close()
    cmd.rmdir(dir)
  end)

  it("is read by Python's safetensors, the description included", function()
    local py = h.python("import safetensors, numpy")
    if not py then pending("no Python with safetensors (make pydeps)") return end
    local path = h.exported("tiny", { tables = "int4" })
    local out, err, code = cmd.sh(py .. " -c " .. cmd.quote([[
import json, sys
from safetensors import safe_open
with safe_open(sys.argv[1], "np") as f:
    meta = f.metadata()
    d = json.loads(meta["uvmrec.model"])
    t = f.get_tensor("embeddings.C3")
    w = f.get_tensor(d["top"][0]["weight"])
    print(meta["uvmrec.format"], d["tables"][2]["format"], t.dtype, t.shape[0], t.shape[1], w.dtype, len(f.keys()))
]]) .. " " .. path)
    assert.equal(0, code, err)
    assert.equal("model int4 uint8 1000 12 float32 34\n", out)
  end)

  it("prints each table's quantization error and the file's size (uvmrec export)", function()
    local t = h.trained("tiny")
    local dir = cmd.tmpdir()
    local out, err, code = cmd.run(("export %s --out %s/m.safetensors --tables int2 --per-table C1=f32,C2=fp16")
                                   :format(t.run, dir))
    assert.equal(0, code, err)
    assert.matches("C1    f32              4    16            0            0     0%.000%%  256", out)
    assert.matches("C2    fp16            10    16 ", out)
    assert.matches("C3    int2          1000    16 ", out)
    assert.truthy(out:find("model file: " .. dir .. "/m.safetensors, ", 1, true))
    local bytes = assert(ck.open(dir .. "/m.safetensors")):bytes()
    local f32 = assert(ck.open(h.exported("tiny", { tables = "f32" }))):bytes()
    assert.is_true(bytes < f32 / 3, "int2 tables: " .. bytes .. " of " .. f32)
    cmd.rmdir(dir)
  end)

  it("refuses what it cannot export, with the reason", function()
    local t = h.trained("tiny")
    local model = h.exported("tiny", {})
    local _, err = export.run(model, { out = "/tmp/never.safetensors" })
    assert.equal("export: " .. model .. " is already a model file", err)
    _, err = export.run(t.run, {})
    assert.equal("export: --out FILE is required", err)
    _, err = export.run(t.run, { out = "/tmp/never.safetensors", per_table = "C99=int4" })
    assert.equal("export: --per-table names table 'C99'; tables are C1 to C26", err)
    _, err = export.run(t.run, { out = "/tmp/never.safetensors", per_table = "C3:int4" })
    assert.equal("export: --per-table: 'C3:int4' is not TABLE=FORMAT", err)
    _, err = export.run(t.run, { out = "/tmp/never.safetensors", per_table = "C3=int4,C5=int2,C3=fp16" })
    assert.equal("export: --per-table: table 'C3' is given twice (int4, fp16)", err)
    _, err = export.run(t.run, { out = "/tmp/never.safetensors", chunk = 0 })
    assert.equal("export: --chunk 0: expected 1 byte or more", err)
    _, err = export.run(t.run, { out = "/tmp/never.safetensors", chunk = "lots" })
    assert.equal("export: --chunk lots: 'lots' is not a size; expected a number of bytes or e.g. '16GiB'", err)
    _, err = export.run("/nonexistent", { out = "/tmp/never.safetensors" })
    assert.matches("^export: ", err)
    local out, serr, code = cmd.run("export " .. t.run .. " --out /tmp/never.safetensors --tables int3")
    assert.equal(2, code, out)
    assert.matches("int3", serr)
    out, serr, code = cmd.run("export " .. t.run .. " --out /tmp/never.safetensors --per-table C3:int4")
    assert.equal(2, code, out)
    assert.matches("%-%-per%-table: 'C3:int4' is not TABLE=FORMAT", serr)
    assert.is_nil(serr:find("--per-table: --per-table", 1, true), serr)
    out, serr, code = cmd.run("export /nonexistent --out /tmp/never.safetensors")
    assert.equal(1, code, out)
    assert.equal("uvmrec export: checkpoint: /nonexistent is neither a run directory nor a checkpoint file\n", serr)
    assert.is_false(cmd.exists("/tmp/never.safetensors"))
    -- an --out it cannot write, refused before any table is quantized (it was, after them all:
    -- 'safetensors: renaming DIR.tmp-XXXXXX to DIR failed: Is a directory')
    local odir = cmd.tmpdir()
    _, err = export.run(t.run, { out = odir })
    assert.equal(("export: --out %s: Is a directory"):format(odir), err)
    _, err = export.run(t.run, { out = odir .. "/no/m.safetensors" })
    assert.equal(("export: --out %s/no/m.safetensors: %s/no: No such file or directory"):format(odir, odir), err)
    out, serr, code = cmd.run("export " .. t.run .. " --out " .. odir)
    assert.equal(1, code, out)
    assert.equal("", out, "no table quantized")
    assert.equal(("uvmrec export: --out %s: Is a directory\n"):format(odir), serr)
    -- the checkpoint it exports (it was replaced by the model file, optimizer state and all)
    local ckpt = assert(require("uvmrec.train").checkpoint_file(t.run))
    assert(cmd.sh(("cp %s %s/c.safetensors"):format(cmd.quote(ckpt), cmd.quote(odir))))
    local size = #assert(cmd.slurp(odir .. "/c.safetensors"))
    out, serr, code = cmd.run(("export %s/c.safetensors --out %s/./c.safetensors"):format(odir, odir))
    assert.equal(1, code, out)
    assert.equal(("uvmrec export: --out %s/./c.safetensors is the checkpoint it exports (%s/c.safetensors); give "
                  .. "another file\n"):format(odir, odir), serr)
    assert.equal(size, #assert(cmd.slurp(odir .. "/c.safetensors")))
    cmd.rmdir(odir)
    -- a run with managed collisions on two tables: its checkpoint's config says so
    local src = assert(ck.open(assert(require("uvmrec.train").checkpoint_file(t.run))))
    local cfg = json.decode(src:meta("uvmrec.config"))
    cfg.embeddings.tables = { C5 = { collisions = { policy = "lru" } }, C12 = { collisions = { policy = "lfu" } } }
    local dir = cmd.tmpdir()
    local meta = { ["uvmrec.format"] = "1", ["uvmrec.config"] = json.encode(cfg) }
    assert(ck.save(dir .. "/mc.safetensors", { tensors = { x = ur.tensor({ 2 }) }, meta = meta }))
    _, err = export.run(dir .. "/mc.safetensors", { out = dir .. "/never.safetensors" })
    assert.equal(("export: %s/mc.safetensors: tables C5, C12 were trained with managed collisions "
                  .. "(embeddings.collisions), whose id map a model file cannot carry yet"):format(dir), err)
    cmd.rmdir(dir)
  end)

  -- The trained tiny run's checkpoint with metadata `key` set to each case's value ({name, value,
  -- message}): export.run and uvmrec export refuse it with "checkpoint F: " .. message, writing
  -- nothing.
  local function refuses_metadata(key, cases)
    local t = h.trained("tiny")
    local st = assert(ck.load(assert(require("uvmrec.train").checkpoint_file(t.run)), { placement = "host" }))
    local dir = cmd.tmpdir()
    local out = dir .. "/m.safetensors"
    for _, c in ipairs(cases) do
      st.meta[key] = c[2]
      local path = ("%s/%s.safetensors"):format(dir, c[1])
      assert(ck.save(path, st))
      local ran, none, err = pcall(export.run, path, { out = out })
      refused_leaving_nothing(out, ran, none, err, "")
      assert.equal(("export: checkpoint %s: %s"):format(path, c[3]), err)
      local sout, serr, code = cmd.run(("export %s --out %s"):format(path, out))
      assert.equal(1, code, sout)
      assert.equal(("uvmrec export: checkpoint %s: %s\n"):format(path, c[3]), serr)
      assert.is_false(cmd.exists(out), "nothing published")
    end
    for _, x in pairs(st.tensors) do x:free() end
    cmd.rmdir(dir)
  end

  it("refuses a checkpoint whose training config is missing, not JSON or of values of another type, naming the file, "
     .. "before writing", function()
    -- one that was not JSON raised json's error through an assert, with a traceback ('export.lua:108:
    -- json: unexpected token ...'); one without said 'is not a training checkpoint (uvmrec.format is 1)';
    -- {"eval": 5} raised 'train/init.lua:149: attempt to index field 'eval' (a number value)'
    local f = assert(ck.open(assert(require("uvmrec.train").checkpoint_file(h.trained("tiny").run))))
    local typed = json.decode(f:meta("uvmrec.config"))
    f:close()
    typed.eval = 5
    local want = "; expected a JSON object (the training run's config)"
    refuses_metadata("uvmrec.config", {
      { "none", nil, "its metadata has no uvmrec.config" .. want },
      { "bad", '{"train":', "uvmrec.config is not JSON (json: unexpected token near end of file at byte 9)" .. want },
      { "five", "5", "uvmrec.config is 5" .. want },
      { "nulls", "null", "uvmrec.config is null" .. want },
      { "types", json.encode(typed), "uvmrec.config: eval: 5 is not a mapping" },
    })
  end)

  it("refuses a checkpoint whose uvmrec.components is not a JSON list of names, naming the file and the key, "
     .. "before writing", function()
    -- one not JSON, or JSON of another kind, was read as no components (a run over ranks then
    -- exported as one process's); a string or a number raised "export.lua:262: bad argument #1
    -- to 'ipairs' (table expected, got string)"
    local want = "; expected a JSON list of strings (the names of its components)"
    refuses_metadata("uvmrec.components", {
      { "bad", "[\"dense\",", "uvmrec.components is not JSON (json: ']' expected near end of file at byte 9)" .. want },
      { "object", '{"shards":1}', 'uvmrec.components is {"shards":1}' .. want },
      { "string", '"shards"', 'uvmrec.components is "shards"' .. want },
      { "numbers", '["dense",5]', "uvmrec.components[2] is 5" .. want },
      { "nulls", '["dense",null]', "uvmrec.components[2] is null" .. want },
    })
  end)

  it("closes the checkpoint and frees its views when it refuses one after opening it", function()
    -- a refusal before the tables (the checkpoint's layers not its config's, a bad --per-table)
    -- left the file open and the dense weights' views to the garbage collector, each keeping the
    -- whole file mapped
    local t = h.trained("tiny")
    local st = assert(ck.load(assert(require("uvmrec.train").checkpoint_file(t.run)), { placement = "host" }))
    local cfg = json.decode(st.meta["uvmrec.config"])
    cfg.model.bottom_mlp[#cfg.model.bottom_mlp + 1] = cfg.model.bottom_mlp[#cfg.model.bottom_mlp]
    st.meta["uvmrec.config"] = json.encode(cfg)
    local dir = cmd.tmpdir()
    local path = dir .. "/layers-mismatch.safetensors"
    assert(ck.save(path, st))
    for _, x in pairs(st.tensors) do x:free() end
    local function mapped()
      local n = 0
      for line in io.lines("/proc/self/maps") do
        if line:find("layers-mismatch.safetensors", 1, true) then n = n + 1 end
      end
      return n
    end
    collectgarbage()
    collectgarbage()
    collectgarbage("stop")
    local _, err = export.run(path, { out = dir .. "/never.safetensors" })
    local left = mapped()
    local _, perr = export.run(path, { out = dir .. "/never.safetensors", per_table = "C99=int4" })
    local left_too = mapped()
    collectgarbage("restart")
    assert.equal(("export: %s holds %d bottom and %d top layers; its config has %d and %d"):format(path,
      #cfg.model.bottom_mlp - 1, #cfg.model.top_mlp, #cfg.model.bottom_mlp, #cfg.model.top_mlp), err)
    assert.equal("export: --per-table names table 'C99'; tables are C1 to C26", perr)
    assert.equal(0, left, "the file left mapped after the layers' refusal")
    assert.equal(0, left_too, "the file left mapped after --per-table's")
    cmd.rmdir(dir)
  end)

  it("refuses a checkpoint whose dense tensors are not its config's, naming the tensor, before writing", function()
    -- a dcnv2 config of 3 cross layers over a file trained with 2 raised 'export.lua:179: checkpoint:
    -- ... has no tensor 'dense.interaction.bias_3''; one of 1 exported a model missing layer 2
    local t = h.trained("dcnv2")
    local st = assert(ck.load(assert(require("uvmrec.train").checkpoint_file(t.run)), { placement = "host" }))
    local cfg = json.decode(st.meta["uvmrec.config"])
    local dir = cmd.tmpdir()
    local function with(layers, rank)
      cfg.model.cross_layers, cfg.model.cross_rank = layers, rank
      st.meta["uvmrec.config"] = json.encode(cfg)
      local path = ("%s/cross%d_%d.safetensors"):format(dir, layers, rank)
      assert(ck.save(path, st))
      return path
    end
    local out = dir .. "/m.safetensors"
    for _, c in ipairs {
      { 3, 0, "has no tensor 'dense.interaction.bias_3'; its config expects it (model.interaction dcnv2, "
        .. "model.cross_layers 3, model.cross_rank 0: cross layer 3)" },
      { 2, 4, "has no tensor 'dense.interaction.V_1'; its config expects it (model.interaction dcnv2, "
        .. "model.cross_layers 2, model.cross_rank 4: cross layer 1)" },
      { 1, 0, "holds tensor 'dense.interaction.bias_2', which its config (model.interaction dcnv2, "
        .. "model.cross_layers 1, model.cross_rank 0) does not use" },
    } do
      local path = with(c[1], c[2])
      local ran, none, err = pcall(export.run, path, { out = out })
      refused_leaving_nothing(out, ran, none, err, "")
      assert.equal(("export: %s %s"):format(path, c[3]), err)
    end
    for _, x in pairs(st.tensors) do x:free() end
    cmd.rmdir(dir)
  end)

  it("refuses a checkpoint whose table or dense bytes do not match their checksum, publishing nothing", function()
    -- a bit flipped in a table read a block of rows at a time was quantized and served as it read
    local t = h.trained("tiny")
    local dir = cmd.tmpdir()
    local copy = dir .. "/ckpt.safetensors"
    local o = assert(io.open(copy, "wb"))
    o:write((assert(cmd.slurp(assert(require("uvmrec.train").checkpoint_file(t.run))))))
    o:close()
    local want = flip(copy, "embeddings.C7")
    local r, err = export.run(copy, { out = dir .. "/m.safetensors", chunk = 1000 })
    assert.is_nil(r)
    assert.matches(want, err)
    assert.is_false(cmd.exists(dir .. "/m.safetensors"), "nothing published")
    -- the dense weights, taken whole, likewise
    o = assert(io.open(copy, "wb"))
    o:write((assert(cmd.slurp(assert(require("uvmrec.train").checkpoint_file(t.run))))))
    o:close()
    local dense_name
    local cf = assert(ck.open(copy))
    for _, n in ipairs(cf:names()) do
      if n:match("^dense%.top%..*weight$") then dense_name = n end
    end
    cf:close()
    want = flip(copy, assert(dense_name))
    r, err = export.run(copy, { out = dir .. "/m.safetensors" })
    assert.is_nil(r)
    assert.matches("^export: " .. want, err)
    assert.is_false(cmd.exists(dir .. "/m.safetensors"), "nothing published")
    cmd.rmdir(dir)
  end)

  it("refuses a checkpoint whose dense weights hold NaN or infinity, naming it, the tensor and the element, "
     .. "publishing nothing", function()
    -- a run with train.nonfinite=off saves what it trained: such a file exported "ok", and the
    -- engine then refused the model ("a file changed after export?")
    local t = h.trained("tiny")
    local dir = cmd.tmpdir()
    local src = assert(require("uvmrec.train").checkpoint_file(t.run))
    local function poisoned(name, at, bytes, tag)
      local text = assert(cmd.slurp(src))
      local info = assert(assert(ck.open(src)):info(name))
      local o = info.offset + at
      text = text:sub(1, o) .. bytes .. text:sub(o + #bytes + 1)
      local path = ("%s/%s.safetensors"):format(dir, tag)
      cmd.spit(path, h.restamp(text, name, info))
      return path
    end
    local nan32, inf32 = string.char(0, 0, 0xc0, 0x7f), string.char(0, 0, 0x80, 0xff)
    local bias = poisoned("dense.bottom.1.bias", 4 * 5, nan32, "bias")
    local r, err = export.run(bias, { out = dir .. "/m.safetensors" })
    assert.is_nil(r)
    assert.equal(("export: checkpoint %s: tensor 'dense.bottom.1.bias' holds NaN or infinity at element 5; a model "
      .. "file holds finite weights only (the engine refuses one that does not)"):format(bias), err)
    assert.equal("bias.safetensors\n", (cmd.sh("ls " .. cmd.quote(dir))), "nothing published")
    local w = poisoned("dense.top.1.weight", 4 * (2 * 368 + 3), inf32, "w")
    r, err = export.run(w, { out = dir .. "/m.safetensors", dense = "bf16" })
    assert.is_nil(r)
    assert.equal(("export: checkpoint %s: tensor 'dense.top.1.weight' holds NaN or infinity at element 739 (row 2, "
      .. "column 3); a model file holds finite weights only (the engine refuses one that does not)"):format(w), err)
    assert.is_false(cmd.exists(dir .. "/m.safetensors"), "nothing published")
    -- finite in f32, infinite once rounded to bf16 (past its largest, 3.3895e38)
    local big = poisoned("dense.top.1.weight", 4 * 7, string.char(0xff, 0xff, 0x7f, 0x7f), "big")
    r, err = export.run(big, { out = dir .. "/m.safetensors", dense = "bf16" })
    assert.is_nil(r)
    assert.equal(("export: checkpoint %s: tensor 'dense.top.1.weight' at element 7 (row 0, column 7) is "
      .. "3.40282347e+38, beyond bf16's range (--dense bf16); a model file holds finite weights only"):format(big), err)
    assert.is_false(cmd.exists(dir .. "/m.safetensors"), "nothing published")
    assert(export.run(big, { out = dir .. "/m.safetensors" })) -- f32 holds it
    -- a table's, found as its rows are quantized, names the checkpoint too (it named the table alone)
    os.remove(dir .. "/m.safetensors")
    local tab = poisoned("embeddings.C4", 4 * 17, nan32, "tab")
    r, err = export.run(tab, { out = dir .. "/m.safetensors", tables = "f32" })
    assert.is_nil(r)
    assert.equal(("export: checkpoint %s: table C4: rows quantize: row 1 holds a value that is not finite"):format(tab),
                 err)
    assert.is_false(cmd.exists(dir .. "/m.safetensors"), "nothing published")
    cmd.rmdir(dir)
  end)

  h.mpi_it("refuses a shard whose table bytes do not match their checksum, publishing nothing", function()
    local dir = cmd.tmpdir()
    local _, terr, code = cmd.sh(("%s launch -n 2 train dlrm_tiny --cpu --steps 2 --out %s/run --progress none "
      .. "--set train.checkpoint_every=2 --set embeddings.sharding=row_wise "
      .. "--set embeddings.tables.C3.sharding=column_wise --set eval.samples=0 --set eval.min_auc=0")
      :format(cmd.bin(), dir))
    assert.equal(0, code, terr)
    local shards = ck.shards_path(assert(require("uvmrec.train").checkpoint_file(dir .. "/run")))
    for _, shard in ipairs { "rank-00001-of-00002.safetensors", "rank-00000-of-00002.safetensors" } do
      local path = shards .. "/" .. shard
      local f = assert(ck.open(path))
      local name -- the shard's largest tensor: a block of a table's rows
      for _, n in ipairs(f:names()) do
        if not name or f:info(n).nbytes > f:info(name).nbytes then name = n end
      end
      f:close()
      local good = assert(cmd.slurp(path))
      local want = flip(path, name)
      local r, err = export.run(dir .. "/run", { out = dir .. "/m.safetensors", chunk = 1000 })
      assert.is_nil(r)
      assert.matches(want, err)
      assert.is_false(cmd.exists(dir .. "/m.safetensors"), "nothing published")
      local o = assert(io.open(path, "wb"))
      o:write(good)
      o:close()
    end
    assert(export.run(dir .. "/run", { out = dir .. "/m.safetensors", chunk = 1000 }))
    cmd.rmdir(dir)
  end)

  it("reads every table's blocks into the same few buffers, made once, and abandons its file when a block raises",
    function()
    -- each table made and freed its own block buffers (what the allocator kept of them set the
    -- export's peak), and a block that raised left the file half written beside --out
    local t = h.trained("tiny")
    local dir = cmd.tmpdir()
    local made = {}
    local ok, r = export_allocations(function(shape, o)
      made[#made + 1] = { shape = shape, dtype = o.dtype }
    end, function() return export.run(t.run, { out = dir .. "/m.safetensors", chunk = "4KiB" }) end)
    assert.is_true(ok, tostring(r))
    assert(r, "exported")
    table.sort(made, function(a, b) return a.dtype < b.dtype end)
    -- 26 tables of 16 f32s a row: blocks of 64 rows (4 KiB), their int8 rows of 20 bytes
    assert.equal(20, qtbe.row_bytes("int8", 16))
    assert.same({ { shape = { 64 * 16 }, dtype = "f32" }, { shape = { 64 * 20 }, dtype = "u8" } }, made)
    -- a block that raises (here the error's sums): nil, the message; nothing published or left
    local real, calls = qtbe.merge_error, 0
    qtbe.merge_error = function(...)
      calls = calls + 1
      if calls == 30 then error("merge_error failed (as a spec says)") end
      return real(...)
    end
    local pok, none, err = pcall(export.run, t.run, { out = dir .. "/n.safetensors", chunk = "4KiB" })
    qtbe.merge_error = real
    refused_leaving_nothing(dir .. "/n.safetensors", pok, none, err,
      "^export: .*merge_error failed %(as a spec says%)$")
    cmd.rmdir(dir)
  end)

  it("stops at the next block of rows on SIGINT or SIGTERM, removing its temporary file, and exits 128 + the signal "
    .. "(uvmrec export)", function()
    -- SIGTERM ended the process where it stood, leaving OUT.tmp-XXXXXX, half written, beside OUT
    if not cmd.can_background() then return pending("env --default-signal (coreutils 8.31) is needed") end
    -- a row a block (--chunk 1) of a run whose C16 has 300,000 rows: some 325,000 blocks, about 3 s
    -- on this CPU (dlrm_tiny's 25,000 took 0.25 s, a short window for the signal)
    local rows = { 4, 10, 1000, 500, 30, 8, 200, 50, 3, 2000, 100, 5000, 60, 12, 300, 300000, 6, 150, 80, 4, 7000,
                   15, 9, 400, 40, 120 }
    local cfg = h.tiny { "train.steps=2", "train.batch_size=256", "eval.samples=1024", "eval.every=0", "eval.min_auc=0",
                         "train.checkpoint_every=2", "embeddings.rows=" .. table.concat(rows, ",") }
    local run_dir = cmd.tmpdir()
    assert(require("uvmrec.train").run(cfg, { out = run_dir .. "/run", progress = "none", cpu = true,
                                              print = function() end }))
    local outs, out_path = cmd.interrupted_writes(function(out)
      return ("export %s --out %s --chunk 1"):format(cmd.quote(run_dir .. "/run"), out)
    end, "m.safetensors")
    for sig, out in pairs(outs) do
      assert.truthy(out:find(("uvmrec export: interrupted by SIG%s; %s not written (its temporary file removed)\n")
        :format(sig, out_path), 1, true), out)
    end
    cmd.rmdir(out_path:match("^(.*)/"))
    cmd.rmdir(run_dir)
  end)

  it("stops between blocks when the interrupt flag is up, abandoning its file (uvmrec.serve.export)", function()
    -- the library's message, without the command's: "export: export: interrupted ..." at 9c8390e
    local t = h.trained("tiny")
    local dir = cmd.tmpdir()
    local C = require("uvmrec.lib").C
    C.ur_interrupt_set(1)
    local ok, r, err = pcall(export.run, t.run, { out = dir .. "/m.safetensors" })
    C.ur_interrupt_set(0)
    assert.is_true(ok, tostring(r))
    assert.is_nil(r)
    assert.equal("export: interrupted at table C1's row 0 of 4", err)
    assert.same({}, require("uvmrec.lib").dir_list(dir, "", ""))
    cmd.rmdir(dir)
  end)

  it("writes bf16 dense weights when asked", function()
    local path = h.exported("tiny", { tables = "int8", dense = "bf16" })
    local f = assert(ck.open(path))
    local d = json.decode(f:meta("uvmrec.model"))
    assert.equal("bf16", d.dense_dtype)
    assert.equal("bf16", f:info(d.bottom[1].weight).dtype)
    local w = assert(ck.open(h.exported("tiny", {}))):view(d.bottom[1].weight)
    local b = ur.tensor(w:size())
    ur.dense.cast(f:view(d.bottom[1].weight), b)
    local x, y = w:totable(), b:totable()
    for i = 1, #x do assert.is_true(math.abs(x[i] - y[i]) <= math.abs(x[i]) * 2 ^ -8) end
  end)
end)
