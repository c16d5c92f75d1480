-- Checkpoints of sharded collections (uvmrec.dist.checkpoint): a checkpoint written by 4 ranks
-- loads on 2 ranks under another plan, in one process and back on 4 ranks, every row and every
-- optimizer state value bit for bit (the 4-rank files written again equal the first ones byte
-- for byte); a resumed 4-rank run gives the uninterrupted run's outputs and tables bit for bit;
-- a checkpoint loads into one process's unsharded collection; the shards' access counters are
-- saved merged as one process's unsharded tables count them (resharded on load, whatever the
-- plan, world or layout: every value held to such a reference); every refusal is named.  Ranks
-- are processes on the CPU (spec/support/dist_checkpoint.lua under `uvmrec launch`).
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local dck = require "uvmrec.dist.checkpoint"
local ck = require "uvmrec.checkpoint"
local command = require "command"
local h = require "helpers"

local SCRIPT = "spec/support/dist_checkpoint.lua"

-- Runs the script on n ranks (n = 1: one process, no launcher): its output.
local function job(n, env)
  local launch = n > 1 and (" launch -n " .. n) or ""
  local out, err, code = command.sh(("env %s %s%s %s"):format(command.assignments(env), command.bin(), launch, SCRIPT))
  h.ranks_ok(n, out, err, code)
  return out
end

-- Every tensor of a file, as bytes, by name.
local function contents(path)
  local st = assert(ck.load(path))
  local out = {}
  for name, t in pairs(st.tensors) do
    local n = t:nbytes()
    out[name] = require("ffi").string(require("uvmrec.lib").C.ur_tensor_data(t.p), n)
  end
  return out
end

local function same_files(a, b, world)
  for r = 0, world - 1 do
    local name = ("/rank-%05d-of-%05d.safetensors"):format(r, world)
    local x, y = contents(a .. name), contents(b .. name)
    for k, v in pairs(x) do assert.is_true(v == y[k], ("rank %d's %s differs"):format(r, k)) end
    for k in pairs(y) do assert.is_truthy(x[k], ("rank %d's %s is new"):format(r, k)) end
  end
end

-- The step lines of a run's output, rank by rank, in order.
local function steps(out)
  local lines = {}
  for l in out:gmatch("[^\n]+") do
    if l:match("step %d+ out ") then lines[#lines + 1] = l end
  end
  table.sort(lines)
  return table.concat(lines, "\n")
end

-- The ranks' collection (the script's own options) and their batches.
local opts = require("dist_checkpoint").opts
local batch = require("dist_checkpoint").batch

local TABLES = { "a", "b", "c", "d" }

-- Every table's access counts (lists by row id) of a uvmrec.tbe collection.
local function counts_of(tbe)
  local out = {}
  for _, t in ipairs(TABLES) do
    local c = tbe:counts(t)
    out[t] = c:totable()
    c:free()
  end
  return out
end

-- A collection of one process, counting, after the forwards of the global batches of steps
-- [s0, s1].
local function counted(s0, s1)
  local m = ur.nn.EmbeddingBagCollection(opts())
  assert(m.tbe:set_counting(true))
  for step = s0, s1 do
    local kjt = batch(step, 0, 1)
    m:forward(kjt)
    kjt:free()
  end
  return m
end

-- What one process's unsharded tables count over the global batches of steps [s0, s1]: the
-- reference every merged count is held to.
local function reference(s0, s1)
  local plain = counted(s0, s1)
  local out = counts_of(plain.tbe)
  plain.tbe:free()
  return out
end

-- A checkpoint folder's counts, merged: loaded into one process's unsharded collection.
local function merged(folder)
  local plain = ur.nn.EmbeddingBagCollection(opts())
  assert(dck.load(folder, plain))
  local out = counts_of(plain.tbe)
  plain.tbe:free()
  return out
end

-- Every table and optimizer state of two unsharded collections of opts(), element for element.
local function same_tables(x, y)
  for _, t in ipairs { "a", "b", "c", "d" } do
    assert.same(x:table(t):totable(), y:table(t):totable(), t)
    for k, v in pairs(x:state(t)) do assert.same(v:totable(), y:state(t)[k]:totable(), t .. "." .. k) end
  end
end

-- Every table and optimizer state of an unsharded collection of opts(), as lists by name: what a
-- refused load leaves as it was.
local function snapshot(ebc)
  local out = {}
  for _, t in ipairs(TABLES) do
    out[t] = ebc:table(t):totable()
    for k, v in pairs(ebc:state(t)) do out[t .. "." .. k] = v:totable() end
  end
  return out
end

-- The first value where two snapshots differ, named, or nil.
local function changed(before, after)
  for k, v in pairs(before) do
    for i = 1, #v do
      if v[i] ~= after[k][i] then return ("%s[%d] was %s and is %s"):format(k, i, v[i], after[k][i]) end
    end
  end
  return nil
end

-- A small trained collection of opts() (one step): a checkpoint's source.
local function trained()
  local plain = ur.nn.EmbeddingBagCollection(opts())
  local kjt = ur.KJT { keys = { "f", "g", "b", "c", "d" }, values = { 1, 2, 3, 4, 2 }, lengths = { 1, 1, 1, 1, 1 },
                       stride = 1 }
  plain:backward(kjt, ur.tensor(plain:forward(kjt):size()):uniform(-1, 1, 3))
  kjt:free()
  return plain
end

-- Writes the checkpoint folder `folder` as a world of one would save plain (an unsharded
-- collection), but for table `name`, saved as the blocks given ({row0, rows, col0, cols} each:
-- they may overlap or leave gaps), each cut from plain's rows and optimizer state.  change, if
-- given, edits the rank file's tensors (by name) before it is written.  The manifest is sealed.
local function cut(folder, plain, name, blocks, change)
  local ffi, C = require "ffi", require("uvmrec.lib").C
  command.sh(("rm -rf %s && mkdir -p %s"):format(folder, folder))
  local tbe, F = plain.tbe, "rank-00000-of-00001.safetensors"
  local m = { world = 1, step = tbe:step(), save = "cut", order = TABLES, tables = {}, files = { F },
              optimizer = tbe.optimizer, state = tbe.state_names }
  local tensors = {}
  for _, t in ipairs(TABLES) do
    local v = tbe:table(t)
    local rows, dim = v:size(1), v:size(2)
    local e = { rows = rows, dim = dim, dtype = v:dtype(), kind = "whole", blocks = {} }
    local sources = { [""] = v }
    for k, st in pairs(tbe:state(t)) do sources["." .. k] = st end
    for _, b in ipairs(t == name and blocks or { { 0, rows, 0, dim } }) do
      local d = { name = t, row0 = b[1], rows = b[2], col0 = b[3], cols = b[4], rank = 0, dtype = v:dtype(),
                  file = F, state = {} }
      d.tensor = dck.block_name { name = t, row0 = d.row0, rows = d.rows, col0 = d.col0, cols = d.cols,
                                  table_rows = rows, table_dim = dim }
      while tensors[d.tensor] do d.tensor = d.tensor .. "'" end -- a block given twice
      for suffix, src in pairs(sources) do
        local out = ur.tensor({ d.rows, d.cols }, { dtype = src:dtype() })
        local es = src:nbytes() / src:numel()
        local from, to = ffi.cast("uint8_t *", C.ur_tensor_data(src.p)), ffi.cast("uint8_t *", C.ur_tensor_data(out.p))
        for r = 0, d.rows - 1 do
          ffi.copy(to + r * d.cols * es, from + ((d.row0 + r) * dim + d.col0) * es, d.cols * es)
        end
        tensors[d.tensor .. suffix] = out
        if suffix ~= "" then d.state[suffix:sub(2)] = d.tensor .. suffix end
      end
      e.blocks[#e.blocks + 1] = d
    end
    m.tables[t] = e
  end
  if change then change(tensors) end
  assert(ck.save(folder .. "/" .. F, { tensors = tensors, meta = { ["uvmrec.dist.save"] = "cut",
    ["uvmrec.step"] = m.step, ["uvmrec.dist.world"] = 1 } }))
  for _, t in pairs(tensors) do t:free() end
  local f = assert(io.open(folder .. "/manifest.json", "wb"))
  f:write(dck.manifest_text(m))
  f:close()
  return m
end

describe("uvmrec.dist.checkpoint", function()
  local dir = command.tmpdir()
  teardown(function() command.rmdir(dir) end)

  h.mpi_it("loads a 4-rank checkpoint on 2 ranks, in one process and on 4 ranks again, bit for bit", function()
    local A, B, C, D = dir .. "/A", dir .. "/B", dir .. "/C", dir .. "/D"
    job(4, { PLAN = "mixed4", STEPS = "2", OUT = A })
    local m = assert(dck.manifest(A))
    assert.equal(4, m.world)
    assert.equal(2, m.step)
    assert.same({ "a", "b", "c", "d" }, m.order)
    assert.same({ "row_wise", "data_parallel", "column_wise", "row_wise" },
                { m.tables.a.kind, m.tables.b.kind, m.tables.c.kind, m.tables.d.kind })
    assert.equal(4, #m.tables.a.blocks)
    assert.equal(3, #m.tables.d.blocks, "a row-wise block past the table's end holds nothing")
    assert.equal("a[26:52,0:16]", m.tables.a.blocks[2].tensor)
    -- on 2 ranks under another plan, then in one process, then on 4 ranks: the same files
    assert.matches("loaded .*A: 4 ranks' checkpoint at step 2",
                   job(2, { PLAN = "mixed2", IN = A, STEPS = "2", OUT = B }))
    job(1, { PLAN = "row_wise", IN = B, STEPS = "2", OUT = C })
    assert.equal(1, assert(dck.manifest(C)).world)
    job(4, { PLAN = "mixed4", IN = C, STEPS = "2", OUT = D })
    same_files(A, D, 4)
    -- and into one process's unsharded collection, every table and state as the 2-rank one's
    local plain = ur.nn.EmbeddingBagCollection(opts())
    local other = ur.nn.EmbeddingBagCollection(opts())
    assert(dck.load(A, plain))
    assert(dck.load(B, other))
    same_tables(plain, other)
    assert.equal(2, plain.tbe:step())
    plain.tbe:free()
    other.tbe:free()
  end)

  h.mpi_it("resumes a 4-rank run with the uninterrupted run's outputs and tables, bit for bit", function()
    local A, U, R = dir .. "/r2", dir .. "/U", dir .. "/R"
    -- the shards count their accesses too: the resumed counters go on from the saved ones
    job(4, { PLAN = "mixed4", COUNT = "1", STEPS = "2", OUT = A })
    local whole = job(4, { PLAN = "mixed4", COUNT = "1", STEPS = "4", OUT = U })
    local resumed = job(4, { PLAN = "mixed4", COUNT = "1", IN = A, STEPS = "4", OUT = R })
    local s = steps(resumed)
    assert.matches("step 3 out", s)
    assert.equal(steps(whole):gsub("[^\n]*step [12] out[^\n]*\n?", ""), s)
    same_files(U, R, 4)
    assert.truthy(contents(R .. "/rank-00001-of-00004.safetensors")["b.counts.r1"], "a replica's counts")
  end)

  h.mpi_it("saves every shard's access counts merged as the unsharded table counts them, and reshards them", function()
    local A, A2, B, Cc, D = dir .. "/nA", dir .. "/nA2", dir .. "/nB", dir .. "/nC", dir .. "/nD"
    -- every shard laid out hottest first before the save: the counts are by row id all the same
    job(4, { PLAN = "mixed4", COUNT = "1", RELAYOUT = "1", STEPS = "2", OUT = A })
    local m = assert(dck.manifest(A))
    assert.equal(4, #m.tables.a.counts, "row-wise: every rank's rows")
    assert.equal(3, #m.tables.d.counts, "row-wise: no block past the table's end")
    assert.equal(1, #m.tables.c.counts, "column-wise: one column block's (each counts every lookup)")
    assert.equal(4, #m.tables.b.counts, "data-parallel: every replica's own")
    for r, d in ipairs(m.tables.b.counts) do
      assert.is_true(d.replica)
      assert.equal(r - 1, d.rank)
      assert.equal(("b.counts.r%d"):format(r - 1), d.tensor)
    end
    local want = reference(1, 2)
    assert.same(want, merged(A))
    -- the same world: every shard's counters as saved (the replicas' each its own)
    job(4, { PLAN = "mixed4", IN = A, STEPS = "2", OUT = A2 })
    same_files(A, A2, 4)
    -- 2 ranks under another plan (b row-wise, d data-parallel: two replicas share the sum) go
    -- on counting; their checkpoint loads in one process, whose loads on 4 ranks
    job(2, { PLAN = "mixed2", COUNT = "1", IN = A, STEPS = "4", OUT = B })
    want = reference(1, 4)
    assert.same(want, merged(B))
    assert.equal(2, #assert(dck.manifest(B)).tables.d.counts)
    job(1, { PLAN = "row_wise", IN = B, STEPS = "4", OUT = Cc })
    assert.same(want, merged(Cc))
    job(4, { PLAN = "mixed4", COUNT = "1", IN = Cc, STEPS = "4", OUT = D })
    assert.same(want, merged(D))
  end)

  h.mpi_it("reshards rowwise Adagrad's per-row state of row-wise blocks", function()
    job(2, { PLAN = "row_wise", OPT = "rowwise_adagrad", STEPS = "1", OUT = dir .. "/A_rw" })
    job(1, { PLAN = "table_wise", OPT = "rowwise_adagrad", IN = dir .. "/A_rw", STEPS = "1" })
  end)

  h.mpi_it("reshards the per-row state of column-wise tables under rowwise Adagrad: every column block's is the row's",
     function()
    local A, B, Cd = dir .. "/A_cw", dir .. "/B_cw", dir .. "/C_cw"
    job(4, { PLAN = "column_wise", OPT = "rowwise_adagrad", STEPS = "2", OUT = A })
    job(1, { PLAN = "table_wise", OPT = "rowwise_adagrad", IN = A, STEPS = "2", OUT = B }) -- no step: loads, saves
    job(2, { PLAN = "mixed2", OPT = "rowwise_adagrad", IN = B, STEPS = "2", OUT = Cd })
    -- each saved block's "sum" of a table, as bytes
    local function sums(folder, name)
      local m = assert(dck.manifest(folder))
      local out = {}
      for _, d in ipairs(m.tables[name].blocks) do
        local f = assert(ck.open(folder .. "/" .. d.file))
        local v = assert(f:view(d.state.sum))
        out[#out + 1] = { cols = d.cols, bytes = require("ffi").string(require("uvmrec.lib").C.ur_tensor_data(v.p),
                                                                       v:nbytes()) }
        v:free()
        f:close()
      end
      return out
    end
    for _, name in ipairs { "a", "c" } do
      local whole = sums(B, name)
      assert.equal(1, #whole)
      local blocks = sums(A, name)
      assert.is_true(#blocks > 1, name)
      for i, b in ipairs(blocks) do assert.equal(whole[1].bytes, b.bytes, name .. " block " .. i .. " of 4 ranks") end
    end
    local again = sums(Cd, "a") -- column_wise over 2 ranks: 2 blocks of 8 columns
    assert.equal(2, #again)
    for i, b in ipairs(again) do assert.equal(sums(B, "a")[1].bytes, b.bytes, "a block " .. i .. " of 2 ranks") end
  end)

  it("saves and loads in one process: an unsharded collection or a world of one", function()
    local comm = assert(dist.comm())
    local plain = ur.nn.EmbeddingBagCollection(opts())
    local kjt = ur.KJT { keys = { "f", "g", "b", "c", "d" }, values = { 1, 2, 3, 4, 2 }, lengths = { 1, 1, 1, 1, 1 },
                         stride = 1 }
    plain:backward(kjt, ur.tensor(plain:forward(kjt):size()):uniform(-1, 1, 3))
    local P = dir .. "/plain"
    local m = assert(dck.save(P, plain))
    assert.equal(1, m.world)
    assert.equal("whole", m.tables.a.kind)
    assert.same({ "rank-00000-of-00001.safetensors" }, require("uvmrec.lib").dir_list(P, "rank-", ""))
    -- tensors named as the unsharded component names them
    local f = assert(ck.open(P .. "/rank-00000-of-00001.safetensors"))
    assert.same({ 103, 16 }, f:info("a").shape)
    assert.truthy(f:info("a.exp_avg"))
    f:close()
    local sharded = dist.shard(opts(), { a = "row_wise", b = "table_wise", c = { "column_wise", ranks = { 0, 0, 0 } },
                                         d = "data_parallel" }, comm)
    assert(dck.load(P, sharded))
    for _, t in ipairs { "a", "b", "c", "d" } do
      assert.same(plain:table(t):totable(), sharded:full_table(t):totable(), t)
    end
    local names = {}
    for _, p in ipairs(sharded:parameters("embeddings.")) do names[#names + 1] = p.name end
    assert.same({ "embeddings.a", "embeddings.b", "embeddings.c[0:30,0:4]", "embeddings.c[0:30,4:8]",
                  "embeddings.c[0:30,8:12]", "embeddings.d" }, names)
    assert.equal(1, sharded.collections[1]:step())
    -- saved by the sharded one, loaded by the plain one
    local S = dir .. "/sharded"
    assert(dck.save(S, sharded))
    local again = ur.nn.EmbeddingBagCollection(opts())
    assert(dck.load(S, again))
    same_tables(plain, again)
    -- a bit flipped in a shard file's table bytes: refused by its checksum, nothing written
    local file = S .. "/rank-00000-of-00001.safetensors"
    local good = command.slurp(file)
    local sf = assert(ck.open(file))
    local name = sf:names()[1]
    local at = sf:info(name).offset + 3
    sf:close()
    command.spit(file, good:sub(1, at) .. string.char(bit.bxor(good:byte(at + 1), 16)) .. good:sub(at + 2))
    local into = ur.nn.EmbeddingBagCollection(opts())
    local before = into:table("a"):totable()
    local ok, err = dck.load(S, into)
    assert.is_nil(ok)
    assert.matches(("safetensors: %s: tensor '%s' %%(file bytes %%d+%%.%%.%%d+%%) does not match the checksum"):format(
      file:gsub("%p", "%%%0"), name:gsub("%p", "%%%0")), err)
    assert.same(before, into:table("a"):totable())
    command.spit(file, good)
    -- the reader (uvmrec export's, a block of rows at a time) checks each saved block read
    -- through to its end against its checksum: a flipped bit was read as it was
    local r = assert(dck.reader(S))
    local d = r.manifest.tables.a.blocks[#r.manifest.tables.a.blocks]
    local bfile = S .. "/" .. d.file
    local bgood = command.slurp(bfile)
    sf = assert(ck.open(bfile))
    local binfo = sf:info(d.tensor)
    sf:close()
    at = binfo.offset + binfo.nbytes - 5
    command.spit(bfile, bgood:sub(1, at) .. string.char(bit.bxor(bgood:byte(at + 1), 1)) .. bgood:sub(at + 2))
    local rows_a = r.manifest.tables.a.rows
    local rerr
    for row0 = 0, rows_a - 1, 7 do
      local got
      got, rerr = r:rows("a", row0, math.min(7, rows_a - row0))
      if not got then break end
      got:free()
    end
    r:close()
    assert.matches(("safetensors: %s: tensor '%s' %%(file bytes %%d+%%.%%.%%d+%%) does not match the checksum"):format(
      bfile:gsub("%p", "%%%0"), d.tensor:gsub("%p", "%%%0")), rerr)
    command.spit(bfile, bgood)
    r = assert(dck.reader(S))
    local whole = assert(r:rows("a", 0, rows_a))
    r:close()
    assert.same(plain:table("a"):totable(), whole:totable())
    whole:free()
    into.tbe:free()
    sharded:free()
    again.tbe:free()
    plain.tbe:free()
  end)

  it("names a rank's file, the rank and the key when its blocks or counts are missing or not what save wrote",
    function()
    -- rank 0 read each rank's uvmrec.dist.blocks unguarded: missing, it raised "dist/checkpoint.lua:253:
    -- json decode: expected a string, got nil"; not JSON, "bad argument #1 to 'ipairs' (table expected,
    -- got nil)"; [5], "attempt to index local 'd' (a number value)"; a block of no table, "table index is
    -- nil"; {"a":1} said "the saved blocks of table 'a' cover 0 of its 0 x 0 elements"; a block's rows
    -- "x", "attempt to perform arithmetic on field 'rows'"; counts 7, "bad argument #1 to 'ipairs'"; counts
    -- of a table of no block, "attempt to index local 't' (a nil value)".  Each file is changed as it is
    -- saved (uvmrec.checkpoint.save, which dist.checkpoint calls for every rank)
    local save = ck.save
    local D = dir .. "/damaged"
    local function damaged(key, value)
      ck.save = function(path, st, o)
        st.meta[key] = value
        return save(path, st, o)
      end
      local plain = ur.nn.EmbeddingBagCollection(opts())
      local ok, m, err = pcall(dck.save, D, plain)
      ck.save = save
      plain.tbe:free()
      assert.is_true(ok, tostring(m))
      assert.is_nil(m)
      assert.is_false(command.exists(D .. "/manifest.json"), "no manifest written")
      return err
    end
    local file = ("dist.checkpoint: rank 0's file %s/rank-00000-of-00001.safetensors: "):format(D)
    local blocks = "; expected a JSON list of objects (the blocks rank 0 saved)"
    assert.equal(file .. "its metadata has no uvmrec.dist.blocks" .. blocks, damaged("uvmrec.dist.blocks", nil))
    assert.equal(file .. "uvmrec.dist.blocks is not JSON (json: invalid token near 'oops' at byte 4)" .. blocks,
      damaged("uvmrec.dist.blocks", "oops"))
    assert.equal(file .. 'uvmrec.dist.blocks is {"a":1}' .. blocks, damaged("uvmrec.dist.blocks", '{"a":1}'))
    assert.equal(file .. "uvmrec.dist.blocks[1] is 5" .. blocks, damaged("uvmrec.dist.blocks", "[5]"))
    assert.equal(file .. "uvmrec.dist.blocks[1] names no table; expected a table of the collection saved",
      damaged("uvmrec.dist.blocks", '[{"x":1}]'))
    assert.equal(file .. 'uvmrec.dist.blocks[1] names table "zz"; expected a table of the collection saved',
      damaged("uvmrec.dist.blocks", '[{"name":"zz"}]'))
    assert.equal(file .. "uvmrec.dist.counts is 7; expected a JSON list of objects (the counts rank 0 saved)",
      damaged("uvmrec.dist.counts", "7"))
    assert.equal(file .. 'uvmrec.dist.counts[1] names table "q"; expected a table whose blocks a file of this save '
      .. "holds", damaged("uvmrec.dist.counts", '[{"name":"q"}]'))
    -- a block's fields: checked as load checks a manifest's, before it is written
    assert.equal(("dist.checkpoint: %s/manifest.json: the blocks the ranks' files name (uvmrec.dist.blocks, "
      .. "uvmrec.dist.counts) make a manifest load refuses: tables.a.blocks[1].rows is \"x\"; expected a whole "
      .. "number >= 0")
      :format(D), damaged("uvmrec.dist.blocks", '[{"name":"a","dtype":"f32","tensor":"a","row0":0,"rows":"x"}]'))
    -- absent counts are none, as before
    local plain = ur.nn.EmbeddingBagCollection(opts())
    ck.save = function(path, st, o)
      st.meta["uvmrec.dist.counts"] = nil
      return save(path, st, o)
    end
    local ok, m = pcall(dck.save, D, plain)
    ck.save = save
    assert.is_true(ok, tostring(m))
    assert.truthy(m, "saved")
    plain.tbe:free()
  end)

  it("carries the access counters of one process through a world of one's shards and back", function()
    local comm = assert(dist.comm())
    local plain = counted(1, 3)
    assert(plain.tbe:relayout("a", "counts"))
    local want = counts_of(plain.tbe)
    assert.is_true(want.a[1] + want.a[2] + want.a[3] > 0)
    local P = dir .. "/counted"
    assert(dck.save(P, plain))
    local sharded = dist.shard(opts(), { a = "row_wise", b = "table_wise", c = { "column_wise", ranks = { 0, 0, 0 } },
                                         d = "data_parallel" }, comm)
    assert(dck.load(P, sharded))
    local function shard_counts(name, shard)
      for _, b in ipairs(sharded:blocks()) do
        if b.shard == shard then
          assert.is_true(b.collection:counting(shard), shard)
          local c = b.collection:counts(shard)
          assert.same(want[name], c:totable(), shard)
          c:free()
          return
        end
      end
      error("no shard " .. shard)
    end
    shard_counts("a", "a/r0")
    shard_counts("b", "b")
    for s = 0, 2 do shard_counts("c", "c/c" .. s) end -- every column block counts every lookup
    shard_counts("d", "d")
    local S = dir .. "/counted_sharded"
    local m = assert(dck.save(S, sharded))
    assert.equal(1, #m.tables.c.counts)
    assert.same(want, merged(S))
    sharded:free()
    plain.tbe:free()
  end)

  it("loads a checkpoint without counts (counters as a fresh run's) and names counts that do not fit", function()
    local P, Old = dir .. "/counted", dir .. "/old"
    -- an older save: its manifest has no counts (nor the checksum, format 1)
    command.sh(("cp -r %s %s"):format(P, Old))
    local m = assert(dck.manifest(Old))
    for _, t in pairs(m.tables) do t.counts = nil end
    m.format, m.crc32c = 1, nil
    local f = assert(io.open(Old .. "/manifest.json", "wb"))
    f:write(require("uvmrec.json").encode(m) .. "\n")
    f:close()
    local plain = ur.nn.EmbeddingBagCollection(opts())
    assert(dck.load(Old, plain))
    assert.is_false(plain.tbe:counting("a"))
    assert.is_false((pcall(plain.tbe.counts, plain.tbe, "a")), "no counters made")
    assert(plain.tbe:set_counting(true))
    for _, t in ipairs(TABLES) do
      local c = plain.tbe:counts(t)
      for _, x in ipairs(c:totable()) do assert.equal(0, x, t) end
      c:free()
    end
    local full = ur.nn.EmbeddingBagCollection(opts())
    assert(dck.load(P, full))
    same_tables(plain, full)
    -- counts of another dtype or length: named, and nothing written
    local file = "/rank-00000-of-00001.safetensors"
    local function tampered(name, t)
      local Bad = dir .. "/bad_" .. name
      command.sh(("rm -rf %s && cp -r %s %s"):format(Bad, P, Bad))
      local st = assert(ck.load(P .. file, { placement = "host" }))
      st.tensors["a.counts"]:free()
      st.tensors["a.counts"] = t
      assert(ck.save(Bad .. file, st))
      for _, x in pairs(st.tensors) do x:free() end
      local fresh = ur.nn.EmbeddingBagCollection(opts())
      local before = fresh:table("a"):totable()
      local _, err = dck.load(Bad, fresh)
      assert.same(before, fresh:table("a"):totable())
      assert.is_false(fresh.tbe:counting("a"))
      fresh.tbe:free()
      return err
    end
    local err = tampered("dtype", ur.tensor({ 103 }):fill(1))
    assert.matches("dist.checkpoint: .*/bad_dtype: table 'a' has access counts 'a.counts' of rows %[0, 103%) as f32 "
      .. "%[103%] in rank%-00000%-of%-00001%.safetensors; expected i32 %[103%]", err)
    err = tampered("rows", ur.tensor({ 102 }, { dtype = "i32" }):fill(1))
    assert.matches("table 'a' has access counts 'a.counts' of rows %[0, 103%) as i32 %[102%] in "
      .. "rank%-00000%-of%-00001%.safetensors; expected i32 %[103%]", err)
    -- a manifest (sealed) listing one counter twice: its rows were counted twice, loaded; or a
    -- replica's of a rank the saving world did not have
    local Twice = dir .. "/counted_twice"
    command.sh(("rm -rf %s && cp -r %s %s"):format(Twice, P, Twice))
    local function listed(change)
      local m2 = assert(dck.manifest(P))
      change(m2.tables.a.counts)
      command.spit(Twice .. "/manifest.json", dck.manifest_text(m2))
      local fresh = ur.nn.EmbeddingBagCollection(opts())
      local _, lerr = dck.load(Twice, fresh)
      assert.is_false(fresh.tbe:counting("a"))
      fresh.tbe:free()
      return lerr or "loaded"
    end
    local F = "rank%-00000%-of%-00001%.safetensors"
    assert.matches("manifest%.json: tables%.a%.counts%[1%] %(tensor 'a%.counts' of " .. F .. "%) and tables%.a%.counts"
      .. "%[2%] %(tensor 'a%.counts' of " .. F .. "%) both count rows %[0, 103%); expected each row's count in one",
      listed(function(c) c[2] = c[1] end))
    assert.matches("manifest%.json: tables%.a%.counts%[1%] is rank 5's replica counters of rows %[0, 103%); expected "
      .. "those of every row, %[0, 103%), one list a rank below 1",
      listed(function(c) c[1].replica, c[1].rank = true, 5 end))
    plain.tbe:free()
    full.tbe:free()
  end)

  h.cuda_it("saves shards of device tables and loads them into host collections, bit for bit", function()
    -- device shards exchange device tensors: the communicator is made for the GPU (in a world
    -- of one its device collectives copy), and the shards go where it is
    local comm = assert(dist.comm { device = 0 })
    local o = opts()
    o.device = nil
    local gpu = dist.shard(o, { a = "row_wise", b = "table_wise", c = { "column_wise", ranks = { 0, 0 } },
                                d = "data_parallel" }, comm)
    local kjt = ur.KJT { keys = { "f", "g", "b", "c", "d" }, values = { 1, 2, 3, 4, 2 }, lengths = { 1, 1, 1, 1, 1 },
                         stride = 1 }:to("device")
    gpu:forward(kjt)
    gpu:backward(kjt, ur.tensor({ 1, gpu.out_dim }, { placement = "device" }):uniform(-1, 1, 3))
    local G = dir .. "/gpu"
    assert(dck.save(G, gpu))
    local host = ur.nn.EmbeddingBagCollection(opts())
    assert(dck.load(G, host))
    for _, t in ipairs { "a", "b", "c", "d" } do
      assert.same(gpu:full_table(t):totable(), host:table(t):totable(), t)
    end
    -- and back into device shards under another plan
    local again = dist.shard(o, "table_wise", comm)
    assert(dck.load(G, again))
    for _, t in ipairs { "a", "b", "c", "d" } do
      assert.same(host:table(t):totable(), again:full_table(t):totable(), t)
    end
    gpu:free()
    again:free()
    host.tbe:free()
  end)

  h.mpi_it("names a folder the ranks do not share: rank 0 does not see the other ranks' files", function()
    -- each rank saving into a folder of its own, as into a folder on each host's own disk: rank 0
    -- failed writing the manifest with the error of opening rank 1's file, naming no cause
    local out, err, code = command.sh(("env OUT=%s/apart APART=1 STEPS=1 %s launch -n 2 %s"):format(dir,
      command.bin(), SCRIPT))
    assert.is_true(code ~= 0, out)
    assert.truthy(err:find(("dist.checkpoint: %s/apart-rank-0 must be a folder every host shares (one file system): "
      .. "rank 0 does not see 1 of the 2 ranks' files the ranks wrote there (rank-00001-of-00002.safetensors)")
      :format(dir), 1, true), err)
    assert.is_nil(require("lfs").attributes(dir .. "/apart-rank-0/manifest.json"))
  end)

  h.mpi_it("refuses another save's rank file where rank 0 looks for the rank's, on save and on load", function()
    -- an earlier save of 2 ranks left rank 1's file in rank 0's folder; a save whose ranks each
    -- wrote into a folder of their own then took it as rank 1's (its rows of step 1 published as
    -- step 2's) and the load read them
    job(2, { OUT = dir .. "/stale-rank-0", STEPS = "1" })
    local out, err, code = command.sh(("env OUT=%s/stale APART=1 STEPS=2 %s launch -n 2 %s"):format(dir,
      command.bin(), SCRIPT))
    assert.is_true(code ~= 0, out)
    local want = ("dist%%.checkpoint: %s/stale%%-rank%%-0/rank%%-00001%%-of%%-00002%%.safetensors is another save's "
      .. "%%(step 1, save %%d+%%-%%d+; this one is step 2, save %%d+%%-%%d+%%): rank 1 wrote its file where rank 0 "
      .. "does not see it, so %s/stale%%-rank%%-0 must be a folder every host shares %%(one file system%%)")
      :format((dir:gsub("%p", "%%%0")), (dir:gsub("%p", "%%%0")))
    assert.matches(want, err)
    assert.is_nil(require("lfs").attributes(dir .. "/stale-rank-0/manifest.json"))
    -- a rank file of another save put in a folder by hand: the load names it and reads nothing
    job(1, { OUT = dir .. "/one-a", STEPS = "1" })
    job(1, { OUT = dir .. "/one-b", STEPS = "2" })
    command.sh(("cp %s/one-b/rank-00000-of-00001.safetensors %s/one-a/"):format(dir, dir))
    local ebc = ur.nn.EmbeddingBagCollection(opts())
    local before = ebc:table("a"):totable()
    local m, lerr = dck.load(dir .. "/one-a", ebc)
    assert.is_nil(m)
    assert.matches("dist%.checkpoint: .*/one%-a: rank%-00000%-of%-00001%.safetensors is another save's %(save "
      .. "%d+%-%d+; the manifest's is %d+%-%d+%): not read", lerr)
    assert.same(before, ebc:table("a"):totable())
    ebc.tbe:free()
  end)

  it("names what does not fit before writing anything", function()
    local P = dir .. "/plain"
    local _, err = dck.load(dir .. "/none", ur.nn.EmbeddingBagCollection(opts()))
    assert.matches("dist.checkpoint: .*/none is not a folder", err)
    command.sh("mkdir -p " .. dir .. "/empty")
    _, err = dck.load(dir .. "/empty", ur.nn.EmbeddingBagCollection(opts()))
    assert.matches("/empty has no manifest.json %(an unfinished save, or not a sharded checkpoint%)", err)
    local o = opts()
    o.tables[3].rows = 31
    _, err = dck.load(P, ur.nn.EmbeddingBagCollection(o))
    assert.matches("table 'c' is 30 x 12 there and 31 x 12 here", err)
    o = opts()
    o.tables[2].dtype = nil
    _, err = dck.load(P, ur.nn.EmbeddingBagCollection(o))
    assert.matches("table 'b' is f16 there and f32 here", err)
    _, err = dck.load(P, ur.nn.EmbeddingBagCollection(opts("adagrad")))
    assert.matches("the optimizer state there is {exp_avg, exp_avg_sq} %(adam%) and here {sum} %(adagrad%)", err)
    -- the same state's name, another width (a value an element, one a row): it was found while
    -- copying, with table a already written
    local ada = dir .. "/adagrad"
    local plain = ur.nn.EmbeddingBagCollection(opts("adagrad"))
    assert(dck.save(ada, plain))
    local rowwise = ur.nn.EmbeddingBagCollection(opts("rowwise_adagrad"))
    local drawn = rowwise:table("a"):totable()
    _, err = dck.load(ada, rowwise)
    assert.matches("the optimizer state there is {sum} %(adagrad%) and here {sum} %(rowwise_adagrad%)", err)
    assert.same(drawn, rowwise:table("a"):totable())
    o = opts()
    table.remove(o.tables, 4)
    _, err = dck.load(P, ur.nn.EmbeddingBagCollection(o))
    assert.matches("holds table 'd', which this collection lacks", err)
    o = opts()
    o.tables[5] = { name = "e", rows = 4, dim = 4 }
    _, err = dck.load(P, ur.nn.EmbeddingBagCollection(o))
    assert.matches("has no table 'e'", err)
    -- a manifest edited by hand: each field as save writes it, every block inside its table and
    -- its tensors as the manifest says, before a byte is written
    local M = P .. "/manifest.json"
    local good = require("uvmrec.lib").read_file(M)
    local function edited(text, want)
      local f = assert(io.open(M, "wb"))
      f:write(text)
      f:close()
      local into = ur.nn.EmbeddingBagCollection(opts())
      local before = into:table("c"):totable()
      local _, lerr = dck.load(P, into)
      assert.matches(want, lerr or ("loaded, expected " .. want))
      assert.same(before, into:table("c"):totable(), want)
      assert.equal(0, into.tbe:step(), want)
      into.tbe:free()
    end
    local json = require "uvmrec.json"
    -- each edit sealed again (else the checksum refuses it first)
    local function with(change)
      local m = json.decode(good)
      change(m)
      return dck.manifest_text(m)
    end
    -- one bit flipped: the step read as another (it loaded, setting that step), the checksum's
    -- key (it loaded unchecked); refused naming the file and both checksums
    local step = assert(tonumber(good:match('"step":(%d+)')))
    local at = good:find('"step":', 1, true) + #'"step":' + #tostring(step) - 1
    local flipped = good:sub(1, at - 1) .. string.char(bit.bxor(good:byte(at), 1)) .. good:sub(at + 1)
    assert.is_not.equal(step, tonumber(flipped:match('"step":(%d+)')))
    -- the CRC32C of the rest of the manifest, as json.encode writes it (keys sorted, no spaces)
    local rest = json.decode(good)
    local sum = rest.crc32c
    rest.crc32c = nil
    assert.equal(h.crc32c(json.encode(rest)), sum)
    edited(flipped, ('manifest.json says crc32c "%s", but its content gives %%x+: the manifest is corrupted')
      :format(sum))
    edited((good:gsub('"crc32c"', '"crc32b"')), "manifest.json says crc32c missing, but its content gives %x+")
    -- a manifest sealed with another step or world than its rank files' (it loaded, setting that step)
    edited(with(function(m) m.step = m.step + 1 end), ("rank%%-00000%%-of%%-00001%%.safetensors has uvmrec.step %d, "
      .. "but the manifest's step is %d; expected one save's"):format(step, step + 1))
    edited(with(function(m) m.world = 2 end), "rank%-00000%-of%-00001%.safetensors has uvmrec.dist.world 1, but the "
      .. "manifest's world is 2; expected one save's")
    edited(with(function(m) m.tables.c.rows = "30" end), 'manifest.json: tables.c.rows is "30"; expected a whole '
      .. "number >= 0")
    edited(with(function(m) m.step = nil end), "manifest.json: step is missing; expected a whole number >= 0")
    edited(with(function(m) m.tables.d.blocks[1].cols = 4.5 end), "manifest.json: tables.d.blocks%[1%].cols is 4.5")
    edited(with(function(m) m.tables.d.blocks[1].state.exp_avg = nil end),
      "manifest.json: tables.d.blocks%[1%].state.exp_avg is missing; expected a name")
    edited(with(function(m) m.tables.d.blocks[1].row0 = 1 end),
      "manifest.json: tables.d.blocks%[1%] is rows %[1, 4%), columns %[0, 8%); the table is 3 x 8")
    -- one saved tensor named twice (its rows would load twice, another's not at all)
    edited(with(function(m) local st = m.tables.d.blocks[1].state; st.exp_avg_sq = st.exp_avg end),
      "manifest.json: tables%.d%.blocks%[1%]%.state%.exp_avg_sq names tensor '[^']+' of rank%-00000%-of%-00001%."
      .. "safetensors, which tables%.d%.blocks%[1%]%.state%.exp_avg names too; expected each saved tensor in one place")
    edited(with(function(m) m.tables.b.blocks[1].tensor = m.tables.a.blocks[1].tensor end),
      "names tensor '[^']+' of rank%-00000%-of%-00001%.safetensors, which tables%.%a%.blocks%[1%] names too")
    -- a manifest of another block size than the file's tensor: named, not read past
    edited(with(function(m)
      m.tables.c.rows, m.tables.c.blocks[1].rows = 31, 31
    end), "table 'c' is 31 x 12 there and 30 x 12 here")
    edited(with(function(m)
      m.tables.a.blocks[1].tensor, m.tables.d.blocks[1].tensor = "d", "a"
    end), "tensor 'd' of rank%-00000%-of%-00001.safetensors is f32 %[3 x 8%]; its block in the manifest needs f32 "
      .. "%[103 x 16%]")
    edited(good:sub(1, 40), "manifest.json is not a manifest: json: .* at byte")
    edited(with(function(m) m.tables.c.blocks[1].file = "rank-00003-of-00004.safetensors" end),
      "rank%-00003%-of%-00004.safetensors")
    local f = assert(io.open(M, "wb"))
    f:write(good)
    f:close()
    local again = ur.nn.EmbeddingBagCollection(opts())
    assert(dck.load(P, again))
    again.tbe:free()
    local ok, e = pcall(dck.save, P, {})
    assert.is_false(ok)
    assert.matches("dist.checkpoint: expected a sharded collection %(dist.shard%), an EmbeddingBagCollection or a "
      .. "uvmrec.tbe collection, got table: ", e)
  end)

  it("refuses blocks that leave an element out or hold one twice, naming them, before anything is written", function()
    local plain = trained()
    local X = dir .. "/cut"
    local F = "rank%-00000%-of%-00001%.safetensors"
    local function refused(blocks, want)
      cut(X, plain, "c", blocks)
      local into = ur.nn.EmbeddingBagCollection(opts())
      local before = snapshot(into)
      local m, err = dck.load(X, into)
      assert.is_nil(m, want)
      assert.matches("dist%.checkpoint: .*/cut/manifest%.json: " .. want, err)
      assert.is_nil(changed(before, snapshot(into)), want)
      assert.equal(0, into.tbe:step(), want)
      into.tbe:free()
      local r, rerr = dck.reader(X)
      assert.is_nil(r, want)
      assert.matches(want, rerr)
    end
    local expected = "; expected every element of the 30 x 12 table in one block"
    -- rows [10, 12) in no block: found while copying table c, after a and b were written
    refused({ { 0, 10, 0, 12 }, { 12, 18, 0, 12 } },
      "tables%.c%.blocks hold no element of rows %[10, 12%), columns %[0, 12%)" .. expected)
    -- two rows twice and two in none, the sizes adding up to the table's: it loaded, rows 20 and
    -- 21 as the copy's buffer held them
    refused({ { 0, 12, 0, 12 }, { 10, 10, 0, 12 }, { 22, 8, 0, 12 } },
      "tables%.c%.blocks%[1%] %(tensor 'c%[0:12,0:12%]' of " .. F .. "%) and tables%.c%.blocks%[2%] %(tensor "
      .. "'c%[10:20,0:12%]' of " .. F .. "%) both hold rows %[10, 12%), columns %[0, 12%)" .. expected)
    -- columns [8, 12) twice, [4, 8) in none: it loaded too
    refused({ { 0, 30, 0, 4 }, { 0, 30, 8, 4 }, { 0, 30, 8, 4 } },
      "tables%.c%.blocks%[2%] %(tensor 'c%[0:30,8:12%]' of " .. F .. "%) and tables%.c%.blocks%[3%] %(tensor "
      .. "'c%[0:30,8:12%]'' of " .. F .. "%) both hold rows %[0, 30%), columns %[8, 12%)" .. expected)
    refused({ { 0, 30, 0, 4 }, { 0, 30, 4, 4 } },
      "tables%.c%.blocks hold no element of rows %[0, 30%), columns %[8, 12%)" .. expected)
    refused({ { 0, 30, 0, 12 }, { 5, 2, 3, 4 } },
      "tables%.c%.blocks%[1%] .- and tables%.c%.blocks%[2%] .- both hold rows %[5, 7%), columns %[3, 7%)")
    -- blocks of any shape that hold every element once load, bit for bit
    for _, blocks in ipairs {
      { { 0, 10, 0, 12 }, { 10, 20, 0, 5 }, { 10, 20, 5, 7 } },
      { { 0, 30, 0, 6 }, { 15, 15, 6, 6 }, { 0, 15, 6, 6 } },
      { { 0, 1, 0, 1 }, { 0, 1, 1, 11 }, { 1, 29, 0, 12 } },
    } do
      cut(X, plain, "c", blocks)
      local into = ur.nn.EmbeddingBagCollection(opts())
      assert(dck.load(X, into))
      same_tables(plain, into)
      into.tbe:free()
    end
    plain.tbe:free()
  end)

  it("takes a manifest's blocks where they hold every element once: random layouts against a count of each", function()
    local X = dir .. "/layouts"
    command.sh("mkdir -p " .. X)
    local rng = h.rng(29)
    -- a random tiling of rows [r0, r1), columns [c0, c1): cut across or along, again and again
    local function tiling(out, r0, r1, c0, c1, depth)
      local tall, wide = r1 - r0 >= 2, c1 - c0 >= 2
      if depth == 0 or rng(4) == 1 or not (tall or wide) then
        out[#out + 1] = { r0, r1 - r0, c0, c1 - c0 }
      elseif tall and (not wide or rng(2) == 1) then
        local y = r0 + rng(r1 - r0 - 1)
        tiling(out, r0, y, c0, c1, depth - 1)
        tiling(out, y, r1, c0, c1, depth - 1)
      else
        local x = c0 + rng(c1 - c0 - 1)
        tiling(out, r0, r1, c0, x, depth - 1)
        tiling(out, r0, r1, x, c1, depth - 1)
      end
      return out
    end
    local taken, refusals = 0, 0
    for case = 1, 400 do
      local rows, dim = rng(40), rng(12)
      local blocks = tiling({}, 0, rows, 0, dim, 7)
      -- most spoilt: a block moved, grown, dropped or given twice, all within the table
      local b = blocks[rng(#blocks)]
      local how = rng(5)
      if how == 1 then
        b[1] = rng(rows - b[2] + 1) - 1
        b[3] = rng(dim - b[4] + 1) - 1
      elseif how == 2 then
        if b[1] + b[2] < rows then b[2] = b[2] + 1 elseif b[3] + b[4] < dim then b[4] = b[4] + 1 end
      elseif how == 3 and #blocks > 1 then
        table.remove(blocks, rng(#blocks))
      elseif how == 4 then
        blocks[#blocks + 1] = { b[1], b[2], b[3], b[4] }
      end
      -- the reference: how many blocks hold each element
      local held = {}
      for _, x in ipairs(blocks) do
        for r = x[1], x[1] + x[2] - 1 do
          for c = x[3], x[3] + x[4] - 1 do held[r * dim + c] = (held[r * dim + c] or 0) + 1 end
        end
      end
      local once = true
      for e = 0, rows * dim - 1 do once = once and held[e] == 1 end
      local list = {}
      for i, x in ipairs(blocks) do
        list[i] = { name = "t", tensor = "t" .. i, file = "rank-00000-of-00001.safetensors", row0 = x[1], rows = x[2],
                    col0 = x[3], cols = x[4], rank = 0, dtype = "f32", state = {} }
      end
      local f = assert(io.open(X .. "/manifest.json", "wb"))
      f:write(dck.manifest_text { world = 1, step = 0, order = { "t" },
                                  tables = { t = { rows = rows, dim = dim, dtype = "f32", blocks = list } } })
      f:close()
      local m, err = dck.manifest(X)
      local what = ("case %d: %d x %d, %s: %s"):format(case, rows, dim, require("uvmrec.json").encode(blocks),
        tostring(err))
      if once then
        assert.truthy(m, what)
        taken = taken + 1
      else
        assert.is_nil(m, what)
        refusals = refusals + 1
        -- the elements named are held twice (by both blocks named) or by none
        local i, j, r0, r1, c0, c1 = err:match("tables%.t%.blocks%[(%d+)%] %b() and tables%.t%.blocks%[(%d+)%] %b() "
          .. "both hold rows %[(%d+), (%d+)%), columns %[(%d+), (%d+)%); expected every element of the "
          .. rows .. " x " .. dim .. " table in one block$")
        local twice = i ~= nil
        if not twice then
          r0, r1, c0, c1 = err:match("tables%.t%.blocks hold no element of rows %[(%d+), (%d+)%), columns %[(%d+), "
            .. "(%d+)%); expected every element")
        end
        assert.truthy(r0, what)
        r0, r1, c0, c1 = tonumber(r0), tonumber(r1), tonumber(c0), tonumber(c1)
        assert.is_true(r0 < r1 and c0 < c1, what)
        for r = r0, r1 - 1 do
          for c = c0, c1 - 1 do
            if twice then
              for _, k in ipairs { tonumber(i), tonumber(j) } do
                local x = blocks[k]
                assert.is_true(r >= x[1] and r < x[1] + x[2] and c >= x[3] and c < x[3] + x[4], what)
              end
            else
              assert.is_nil(held[r * dim + c], what)
            end
          end
        end
      end
    end
    assert.is_true(taken > 50 and refusals > 200, ("%d taken, %d refused"):format(taken, refusals))
  end)

  it("trusts no field of a manifest or a rank file before its checksum: a corrupted key or value is named so",
     function()
    local plain = trained()
    local X = dir .. "/trust"
    assert(dck.save(X, plain))
    local M = X .. "/manifest.json"
    local good = command.slurp(M)
    local function refused(want)
      local into = ur.nn.EmbeddingBagCollection(opts())
      local before = snapshot(into)
      local m, err = dck.load(X, into)
      assert.is_nil(m, want)
      assert.matches(want, err)
      assert.is_nil(changed(before, snapshot(into)), want)
      into.tbe:free()
    end
    local function flip(text, at, mask)
      return text:sub(1, at - 1) .. string.char(bit.bxor(text:byte(at), mask)) .. text:sub(at + 1)
    end
    local corrupted = "manifest%.json says crc32c \"%x+\", but its content gives %x+: the manifest is corrupted"
    -- one bit of "format":2 (it said 'has format 3; this build reads formats 1 and 2') or of the
    -- key "tables" (it said 'is not a manifest: it holds no tables')
    command.spit(M, flip(good, good:find('"format":2', 1, true) + #'"format":', 1))
    refused(corrupted)
    command.spit(M, flip(good, good:find('"tables":', 1, true) + 1, 4))
    refused(corrupted)
    command.spit(M, good)
    -- a rank file whose header checksum and tensors' checksums are lost (a bit of each key
    -- flipped) and one bit of table c's bytes: every byte loaded unchecked
    local file = X .. "/rank-00000-of-00001.safetensors"
    local bytes = command.slurp(file)
    local f = assert(ck.open(file))
    local at = f:info("c").offset + 6
    f:close()
    local no_header = bytes:gsub('"uvmrec%.header_crc32c"', '"uvmrec.header_crc32b"')
    command.spit(file, flip(no_header:gsub('"uvmrec%.crc32c"', '"uvmrec.crc32b"'), at, 2))
    refused("dist%.checkpoint: .*/trust: rank%-00000%-of%-00001%.safetensors has no uvmrec%.header_crc32c, which save "
      .. "writes into every rank file: what its header says cannot be verified; expected a file of the manifest's "
      .. "save")
    -- the header's checksum alone lost: what the header says is not trusted either
    command.spit(file, no_header)
    refused("rank%-00000%-of%-00001%.safetensors has no uvmrec%.header_crc32c")
    -- a manifest of format 1 (before checksums) reads such files as they are
    local m = require("uvmrec.json").decode(good)
    m.format, m.crc32c = 1, nil
    command.spit(M, require("uvmrec.json").encode(m))
    local into = ur.nn.EmbeddingBagCollection(opts())
    assert(dck.load(X, into))
    same_tables(plain, into)
    into.tbe:free()
    plain.tbe:free()
  end)

  it("checks all it can before it writes, and names what a failed write leaves half loaded", function()
    local plain = trained()
    -- a state saved a value a row where Adam keeps one an element: found copying table c, a, b and
    -- c's rows written
    local X = dir .. "/half"
    cut(X, plain, "c", { { 0, 30, 0, 12 } }, function(ts)
      ts["c.exp_avg"]:free()
      ts["c.exp_avg"] = ur.tensor({ 30 }):fill(0.5)
    end)
    local into = ur.nn.EmbeddingBagCollection(opts())
    local before = snapshot(into)
    local _, err = dck.load(X, into)
    assert.matches("table 'c' keeps its optimizer state 'exp_avg' with 1 values a row there and 12 here", err)
    assert.is_nil(changed(before, snapshot(into)))
    into.tbe:free()
    -- a copy that fails (a device's; here table c's, made to): the collection is partly loaded,
    -- and the message says which tables hold the checkpoint's rows, which may hold some and which
    -- are as they were; a table written is in its own row order (the layout its old rows had is
    -- dropped with them), the others keep theirs
    local P = dir .. "/half_good"
    assert(dck.save(P, plain))
    into = counted(1, 3)
    assert(into.tbe:relayout("a", "counts"))
    assert(into.tbe:relayout("d", "counts"))
    local d_rows = into:table("d"):totable()
    local load = into.tbe.load
    into.tbe.load = function(self, name, src, stream)
      if name == "c" then return nil, "injected: the copy failed" end
      return load(self, name, src, stream)
    end
    _, err = dck.load(P, into)
    into.tbe.load = nil
    assert.equal(("dist.checkpoint: %s: writing 'c' failed (injected: the copy failed); the collection is partly "
      .. "loaded: 'a', 'b' hold the checkpoint's rows and state, 'c' may hold some of them, 'd' is as it was, and "
      .. "its step is still 0: load a checkpoint into it again before using it"):format(P), err)
    assert.same(plain:table("a"):totable(), into:table("a"):totable())
    assert.is_nil(into.tbe:permutation("a"))
    assert.truthy(into.tbe:permutation("d"))
    assert.same(d_rows, into:table("d"):totable())
    assert.equal(0, into.tbe:step())
    -- and loaded again, whole
    assert(dck.load(P, into))
    same_tables(plain, into)
    assert.is_nil(into.tbe:permutation("d"))
    into.tbe:free()
    plain.tbe:free()
  end)
end)
