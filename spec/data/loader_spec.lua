local ffi = require "ffi"
local ur = require "uvmrec"
local h = require "helpers"
local cmd = require "command"
local data = ur.data

local SAMPLE1, SAMPLE2 = h.fixture("criteo_raw_sample.tsv"), h.fixture("criteo_raw_sample2.tsv")

local drain = h.drain

-- One row per sample: label, dense and ids as strings (and the epoch), in batch order.
-- scripts/datagen.lua on dir/SPEC.lua (its text written there) into dir/OUT with ARGS; returns
-- its log, having checked that it succeeded.
local function datagen(dir, spec, text, out, args)
  local bin = cmd.bin()
  if os.execute("test -x " .. cmd.quote(bin)) ~= 0 then bin = "luajit" end
  cmd.spit(("%s/%s.lua"):format(dir, spec), text)
  local line = ("%s scripts/datagen.lua %s/%s.lua --out %s/%s %s > %s/log 2>&1"):format(
    cmd.quote(bin), dir, spec, dir, out, args, dir)
  local ok = os.execute(line)
  local log = cmd.slurp(dir .. "/log")
  assert.equal(0, ok, log)
  return log
end

local function rows_of_batch(b, out)
  out = out or {}
  local dense, labels = b.dense:totable(), b.labels:totable()
  local t = b.sparse:totable()
  local nk, B, D = #t.keys, b.size, #dense / b.size
  local pos = 0
  local ids = {}
  for k = 1, nk do
    for i = 1, B do
      local n = t.lengths[(k - 1) * B + i]
      ids[i] = ids[i] or {}
      local bag = {}
      for j = 1, n do bag[j] = t.values[pos + j] end
      pos = pos + n
      ids[i][k] = table.concat(bag, " ")
    end
  end
  for i = 1, B do
    local d = {}
    for j = 1, D do d[j] = dense[(i - 1) * D + j] end
    out[#out + 1] = { label = labels[i], dense = table.concat(d, " "), ids = table.concat(ids[i], "|"),
                      epoch = b.epoch }
  end
  return out
end

local function rows_of(loader)
  local out = {}
  for b in loader:batches() do rows_of_batch(b, out) end
  return out
end

local function key(r) return r.label .. "/" .. r.dense .. "/" .. r.ids end

-- ---- the plain loader, written out: which sample each batch holds ----

-- Window w of epoch e, rows rows of a window of W: the Fisher-Yates permutation drawn from
-- Philox under key seed ^ 0x5DEECE66D at counter (e << 44) ^ (w << 24) ^ i while i < 2^24,
-- w < 2^20 and e < 2^20 (each its own bits), else at high word e + 1, low word w * W + i;
-- position -> row within the window.  Down to position `last` (default 1): positions from last
-- up are the rows they get whatever the draws below (the last n of a window too long to draw).
local function window_perm(e, w, rows, seed, W, last)
  local p = setmetatable({}, { __index = function(_, i) return i end })
  local u64 = ffi.typeof("uint64_t")
  local k = tonumber(bit.bxor(ffi.cast(u64, seed), 0x5DEECE66DULL))
  for i = rows - 1, last or 1, -1 do
    local lo, hi = w * W + i, e + 1
    if i < 2 ^ 24 and w < 2 ^ 20 and e < 2 ^ 20 then
      lo, hi = bit.bxor(bit.bxor(ffi.cast(u64, e) * 2 ^ 44, ffi.cast(u64, w) * 2 ^ 24), i), 0
    end
    local v0, v1 = h.philox(lo, k, hi)
    local x = tonumber((ffi.cast(u64, v0) * 4294967296 + v1) % (i + 1))
    p[i], p[x] = p[x], p[i]
  end
  return p
end

-- The batches of a source of `total` rows under loader options o: a list of {epoch, first,
-- samples = {global row, ...}}.  A rank reads rows [total*rank/world, total*(rank+1)/world) in
-- windows of shuffle_window rows (0: max(batch, 65536), in order), batches never cross an
-- epoch, a partial last batch is dropped on request, and a position resumes mid-epoch.
local function plain_batches(total, o)
  local B, world, rank = o.batch_size, o.world or 1, o.rank or 0
  local lo, hi = math.floor(total * rank / world), math.floor(total * (rank + 1) / world)
  local N = hi - lo
  local W = (o.shuffle_window or 0) > 0 and o.shuffle_window or math.max(B, 65536)
  local pos = o.position or { epoch = 0, sample = 0 }
  local perms, out = {}, {}
  for e = pos.epoch, (o.epochs or 1) - 1 do
    local k = e == pos.epoch and pos.sample or 0
    while k < N do
      local n = math.min(B, N - k)
      if n < B and o.drop_last then break end
      local b = { epoch = e, first = k, samples = {} }
      for q = k, k + n - 1 do
        local w, off = math.floor(q / W), q % W
        local r = off
        if (o.shuffle_window or 0) > 0 then
          local id = e .. ":" .. w
          perms[id] = perms[id] or window_perm(e, w, math.min(W, N - w * W), o.seed or 0, W)
          r = perms[id][off]
        end
        b.samples[#b.samples + 1] = lo + w * W + r
      end
      out[#out + 1] = b
      k = k + n
    end
  end
  return out
end

-- Every sample of a synthetic spec as the key rows_of gives it, by global row (1-based; from row
-- first when given, keys[s + 1] is row first + s); ids of table t reduced modulo rows[t] when given.
local function sample_keys(spec, total, rows, first)
  local g = assert(data.generate(spec, first or 0, total))
  local dense, labels, ids, lens = g.dense:totable(), g.labels:totable(), g.ids:totable(), g.lengths:totable()
  local D, H, T = g.dense:size(2), g.ids:size(2), g.lengths:size(2)
  local keys = {}
  for s = 0, total - 1 do
    local d, bags, col = {}, {}, 0
    for j = 1, D do d[j] = dense[s * D + j] end
    for t = 1, T do
      local bag = {}
      for q = 1, lens[s * T + t] do bag[q] = rows and ids[s * H + col + q] % rows[t] or ids[s * H + col + q] end
      col = col + spec.hot_max[t]
      bags[t] = table.concat(bag, " ")
    end
    keys[s + 1] = labels[s + 1] .. "/" .. table.concat(d, " ") .. "/" .. table.concat(bags, "|")
  end
  return keys
end

-- The loader's batches against the plain ones, batch by batch: epoch, first sample, size and
-- every sample.
local function same_as_plain(loader, plain, keys, what)
  local i = 0
  for b in loader:batches() do
    i = i + 1
    local want = plain[i]
    assert.is_not_nil(want, what .. ": batch " .. i .. " is one too many")
    assert.same({ want.epoch, want.first, #want.samples }, { b.epoch, b.first, b.size }, what .. ": batch " .. i)
    local got = rows_of_batch(b)
    for j = 1, b.size do
      if key(got[j]) ~= keys[want.samples[j] + 1] then
        error(("%s: batch %d sample %d is not row %d"):format(what, i, j, want.samples[j]))
      end
    end
  end
  assert.equal(#plain, i, what .. ": batches")
  loader:close()
end

describe("uvmrec.data loader", function()
  it("gives the generator's samples in order, as dense, key-major KJT and labels", function()
    local spec = data.synthetic_spec {
      num_dense = 3, seed = 11,
      tables = { { rows = 50, zipf = 1.1 }, { rows = 20, hot = { 0, 3 }, weighted = true }, { rows = 7 } },
      groups = 5,
    }
    local l = assert(data.loader { data = { kind = "synthetic", spec = spec }, samples = 1000, batch_size = 300,
                                   depth = 2 })
    local g = assert(data.generate(spec, 0, 1000))
    local gids, glen, gw = g.ids:totable(), g.lengths:totable(), g.weights:totable()
    local gdense, glab, ggroups = g.dense:totable(), g.labels:totable(), g.groups:totable()
    local seen, nb = 0, 0
    for b in l:batches() do
      nb = nb + 1
      assert.equal(nb < 4 and 300 or 100, b.size)
      assert.equal(seen, b.first)
      assert.same({ b.size, 3 }, b.dense:size())
      assert.equal("pinned", b.dense:placement())
      assert.same({ "C1", "C2", "C3" }, b.sparse:keys())
      assert.is_true(b.sparse:validate { 50, 20, 7 })
      local t = b.sparse:totable()
      local d, lb, gr = b.dense:totable(), b.labels:totable(), b.groups:totable()
      local pos = 0
      for k = 1, 3 do
        for i = 1, b.size do
          local s = seen + i - 1
          local n = glen[s * 3 + k]
          assert.equal(n, t.lengths[(k - 1) * b.size + i])
          local col0 = ({ 0, 1, 4 })[k]
          for j = 1, n do
            assert.equal(gids[s * 5 + col0 + j], t.values[pos + j])
            assert.equal(gw[s * 5 + col0 + j], t.weights[pos + j])
          end
          pos = pos + n
        end
      end
      for i = 1, b.size do
        local s = seen + i - 1
        assert.equal(glab[s + 1], lb[i])
        assert.equal(ggroups[s + 1], gr[i])
        for j = 1, 3 do assert.equal(gdense[s * 3 + j], d[(i - 1) * 3 + j]) end
      end
      seen = seen + b.size
    end
    assert.equal(1000, seen)
    local st = l:stats()
    assert.same({ 4, 1000, 1000 }, { st.batches, st.samples, st.samples_per_epoch })
    assert.is_true(st.bytes > 1000 * 4 * 4)
    assert.is_true(st.wait_seconds >= 0 and st.produce_seconds > 0)
    l:close()
  end)

  it("reads TSV -> day files -> batches the same as TSV -> batches", function()
    local dir = cmd.tmpdir()
    assert(data.convert({ SAMPLE1, SAMPLE2 }, dir, { rows = 5000 }))
    local opts = { batch_size = 333, rows = 5000 }
    local a = rows_of(assert(data.open("criteo-tsv:" .. SAMPLE1 .. "," .. SAMPLE2, opts)))
    local b = rows_of(assert(data.open("criteo-bin:" .. dir, opts)))
    assert.equal(1400, #a)
    assert.equal(#a, #b)
    for i = 1, #a do assert.equal(key(a[i]), key(b[i]), "row " .. i) end
    -- Raw ids in the day files, reduced modulo rows on read, give the same again.
    local raw = cmd.tmpdir()
    assert(data.convert({ SAMPLE1, SAMPLE2 }, raw))
    local c = rows_of(assert(data.open("criteo-bin:" .. raw, opts)))
    for i = 1, #a, 37 do assert.equal(key(a[i]), key(c[i]), "row " .. i) end
    cmd.rmdir(dir)
    cmd.rmdir(raw)
  end)

  it("reads day files convert reduced only with rows that divide convert's, as raw ids mod those rows", function()
    local dir = cmd.tmpdir()
    assert(data.convert({ SAMPLE1, SAMPLE2 }, dir, { rows = 1000 }))
    -- 500 divides 1000: (id mod 1000) mod 500 is id mod 500, the row a model given the raw id reads
    local tsv = rows_of(assert(data.open("criteo-tsv:" .. SAMPLE1 .. "," .. SAMPLE2, { batch_size = 400, rows = 500 })))
    local bin = rows_of(assert(data.open("criteo-bin:" .. dir, { batch_size = 400, rows = 500 })))
    assert.equal(1400, #bin)
    for i = 1, #tsv do assert.equal(key(tsv[i]), key(bin[i]), "row " .. i) end
    -- 300 does not: ids would be reduced twice, unlike the raw ids a served model maps
    local l, err = data.open("criteo-bin:" .. dir, { batch_size = 400, rows = 300 })
    assert.is_nil(l)
    assert.equal("criteo-bin: " .. dir .. "/day_0's ids of C1 were taken mod 1000 (uvmrec convert --rows; "
      .. "day_0_sparse_rows.npy) but are read mod 300 rows, which does not divide it: the model would not see "
      .. "the rows its served raw ids map to; convert again with these rows (--config or --rows) or without --rows",
      err)
    -- a table read raw beside tables given rows (training keeps a managed-collision table's raw ids)
    local some = {}
    for t = 1, 26 do some[t] = t == 3 and 0 or 500 end
    l, err = data.open("criteo-bin:" .. dir, { batch_size = 400, rows = some })
    assert.is_nil(l)
    assert.matches("day_0's ids of C3 were taken mod 1000 %(uvmrec convert %-%-rows; day_0_sparse_rows%.npy%) but "
      .. "are read raw %(the table keeps its raw ids: managed collisions%)", err)
    -- every table raw, as a config whose every table maps its ids by managed collisions trains: the
    -- rows are given (0 each), not left out
    l, err = data.open("criteo-bin:" .. dir, { batch_size = 400, rows = 0 })
    assert.is_nil(l)
    assert.equal("criteo-bin: " .. dir .. "/day_0's ids of C1 were taken mod 1000 (uvmrec convert --rows; "
      .. "day_0_sparse_rows.npy) but are read raw (the table keeps its raw ids: managed collisions): the model "
      .. "would not see the rows its served raw ids map to; convert again with these rows (--config or --rows) or "
      .. "without --rows", err)
    -- no rows at all: the files are only read
    assert.equal(1400, #rows_of(assert(data.open("criteo-bin:" .. dir, { batch_size = 400 }))))
    -- converted again with raw ids: the record goes with the reduced files
    assert(data.convert({ SAMPLE1, SAMPLE2 }, dir))
    assert.is_nil(io.open(dir .. "/day_1_sparse_rows.npy"))
    assert.equal(1400, #rows_of(assert(data.open("criteo-bin:" .. dir, { batch_size = 400, rows = 300 }))))
    cmd.rmdir(dir)
  end)

  it("reads back what datagen wrote (multi-hot with padding, weights, groups) as the generator's batches", function()
    local dir = cmd.tmpdir()
    local spec = [[return { num_dense = 5, seed = 21, groups = 9, tables = {
      { name = "a", rows = 100, zipf = 1.2 }, { name = "b", rows = 40, hot = { 0, 3 }, weighted = true },
      { name = "c", rows = 3000000000, hot = 2 } } }]]
    assert.matches("hidden model AUC", datagen(dir, "spec", spec, "days", "--samples 2500 --days 2"))
    assert.matches("hot 1,0%-3,2", cmd.slurp(dir .. "/days/layout.txt"))
    local from_files = rows_of(assert(data.open("criteo-bin:" .. dir .. "/days", { batch_size = 700 })))
    local synth = assert(loadstring(spec))()
    local from_gen = rows_of(assert(data.loader { data = { kind = "synthetic", spec = synth }, samples = 2500,
                                                  batch_size = 700, keys = { "C1", "C2", "C3" } }))
    assert.equal(2500, #from_files)
    for i = 1, 2500 do assert.equal(key(from_gen[i]), key(from_files[i]), "row " .. i) end
    local l = assert(data.open("criteo-bin:" .. dir .. "/days", { batch_size = 100 }))
    local b = assert(l:next())
    assert.is_not_nil(b.groups)
    assert.is_not_nil(b.sparse:weights())
    l:close()
    -- an id space beyond the rows: raw ids written (and said so), taken modulo rows on read
    datagen(dir, "wide", [[return { num_dense = 2, seed = 3, tables = {
      { name = "a", rows = 100, id_space = 100000 }, { name = "b", rows = 40 } } }]], "wide", "--samples 500")
    assert.matches("id_space 100000,40", cmd.slurp(dir .. "/wide/layout.txt"))
    -- samples of one class have no AUC: it says so (it printed a ceiling of 0.0000)
    local one = datagen(dir, "one", [[return { num_dense = 2, seed = 3, tables = { { name = "a", rows = 100 } } }]],
      "one", "--samples 1")
    assert.matches("hidden model AUC (the ceiling): none on 1 samples (auc: needs both positive and negative labels)\n",
      one, 1, true)
    local raw = rows_of(assert(data.open("criteo-bin:" .. dir .. "/wide", { batch_size = 500 })))
    local rows = { 100, 40 }
    local cut = rows_of(assert(data.open("criteo-bin:" .. dir .. "/wide", { batch_size = 500, rows = rows })))
    local past = 0
    for i = 1, 500 do
      local a, a_cut = raw[i].ids:match("^([%d-]+)|"), cut[i].ids:match("^([%d-]+)|")
      if tonumber(a) >= 100 then past = past + 1 end
      assert.equal(tonumber(a) % 100, tonumber(a_cut), "row " .. i)
    end
    assert.is_true(past > 400, "raw ids past the table's rows")
    cmd.rmdir(dir)
  end)

  it("reads back day files of 130 tables that datagen wrote (one column a table, and multi-hot)", function()
    local dir = cmd.tmpdir()
    for _, multi in ipairs { false, true } do
      local text = ([[local t = {}
        for i = 1, 130 do t[i] = { name = "C" .. i, rows = 50 + i, zipf = i %% 2 == 0 and 1.1 or 0,
                                   hot = %s } end
        return { num_dense = 3, seed = 17, tables = t }]]):format(multi and "i % 4 == 0 and { 0, 2 } or 1" or "1")
      local out = multi and "multi" or "one"
      datagen(dir, out, text, out, "--samples 600 --days 2")
      local H = multi and 130 + 32 or 130
      local sparse = cmd.slurp(("%s/%s/day_0_sparse.npy"):format(dir, out))
      assert.matches("'shape': %(300, " .. H .. "%)", sparse)
      local from_files = rows_of(assert(data.open("criteo-bin:" .. dir .. "/" .. out, { batch_size = 256 })))
      local from_gen = rows_of(assert(data.loader { data = { kind = "synthetic", spec = assert(loadstring(text))() },
                                                    samples = 600, batch_size = 256 }))
      assert.equal(600, #from_files)
      for i = 1, 600 do assert.equal(key(from_gen[i]), key(from_files[i]), out .. ": row " .. i) end
      local l = assert(data.open("criteo-bin:" .. dir .. "/" .. out, { batch_size = 10 }))
      local t = assert(l:next()).sparse:totable()
      assert.equal(130, #t.keys)
      assert.equal("C130", t.keys[130])
      l:close()
    end
    -- a layout.txt whose hot line is not one bag size a table is refused, naming the entry
    cmd.spit(dir .. "/one/layout.txt", "hot 1,x,1\n")
    local none, err = data.open("criteo-bin:" .. dir .. "/one", { batch_size = 10 })
    assert.is_nil(none)
    assert.matches("layout.txt: table 2's ids per sample 'x'; expected N or MIN-MAX", err, 1, true)
    -- an entry with more after its number (the last one's was read as its number alone)
    for hot, t in pairs({ ["1,2x,1"] = "2's ids per sample '2x'", ["1,1,1x"] = "3's ids per sample '1x'",
                          ["1,1,1 2"] = "3's ids per sample '1 2'" }) do
      cmd.spit(dir .. "/one/layout.txt", "hot " .. hot .. "\r\n")
      none, err = data.open("criteo-bin:" .. dir .. "/one", { batch_size = 10 })
      assert.is_nil(none)
      assert.matches("layout.txt: table " .. t .. "; expected N or MIN-MAX", err, 1, true)
    end
    cmd.rmdir(dir)
  end)

  it("takes every table's raw ids modulo its rows, past the 26th too (day files and synthetic data of 130 tables)",
      function()
    local dir = cmd.tmpdir()
    local text = [[local t = {}
      for i = 1, 130 do t[i] = { name = "C" .. i, rows = 50 + i, id_space = 100000, hot = i % 3 == 0 and 2 or 1 } end
      return { num_dense = 2, seed = 9, tables = t }]]
    datagen(dir, "spec", text, "days", "--samples 300")
    local rows = {}
    for i = 1, 130 do rows[i] = 50 + i end
    local function bags(l)
      local out = {}
      for b in l:batches() do
        local t = b.sparse:totable()
        local pos = 0
        for k = 1, #t.keys do
          out[k] = out[k] or {}
          for i = 1, b.size do
            for _ = 1, t.lengths[(k - 1) * b.size + i] do
              pos = pos + 1
              out[k][#out[k] + 1] = t.values[pos]
            end
          end
        end
      end
      return out
    end
    local raw = bags(assert(data.open("criteo-bin:" .. dir .. "/days", { batch_size = 128 })))
    local cut = bags(assert(data.open("criteo-bin:" .. dir .. "/days", { batch_size = 128, rows = rows })))
    local synth = bags(assert(data.loader { data = { kind = "synthetic", spec = assert(loadstring(text))() },
                                            samples = 300, batch_size = 128, rows = rows }))
    assert.equal(130, #cut)
    for k = 1, 130 do
      local past = 0
      assert.equal(#raw[k], #cut[k], "C" .. k)
      for j = 1, #raw[k] do
        if raw[k][j] >= rows[k] then past = past + 1 end
        assert.equal(raw[k][j] % rows[k], cut[k][j], ("C%d, id %d"):format(k, j))
      end
      assert.same(cut[k], synth[k], "C" .. k .. ": the generator's, reduced as the day files")
      assert.is_true(past > #raw[k] / 2, "C" .. k .. ": raw ids past the table's rows")
    end
    -- one size for every table reduces every one too
    for _, v in ipairs(bags(assert(data.open("criteo-bin:" .. dir .. "/days", { batch_size = 128, rows = 7 })))[130]) do
      assert.is_true(v < 7, "C130 mod 7: " .. v)
    end
    -- sizes for other than the tables there are (Criteo's 26) are refused, not read raw past them
    assert.has_error(function()
      data.open("criteo-bin:" .. dir .. "/days", { batch_size = 128, rows = { unpack(rows, 1, 26) } })
    end,
      "loader: 26 table sizes (rows) for criteo-bin: " .. dir .. "/days, which has 130 tables; expected one a table, "
      .. "or one for every table")
    -- and through the C API, criteo.rows (the TSV reader's 26) for a wider source
    local co = ffi.new("ur_loader_opts")
    local paths = ffi.new("const char *[1]", { dir .. "/days" })
    co.source, co.npaths, co.paths = ur.C.UR_SOURCE_CRITEO_BIN, 1, paths
    co.batch_size, co.depth, co.world, co.criteo.rows[0] = 10, 1, 1, 51
    local out = ffi.new("ur_loader *[1]")
    assert.is_true(ur.C.ur_loader_open(out, co) ~= 0)
    assert.equal("loader: criteo.rows hold the sizes of 26 tables, but criteo-bin: " .. dir .. "/days has 130: its "
      .. "tables 27 to 130 would be read raw; give rows (num_rows: one a table, or one for all)",
      ffi.string(ur.C.ur_last_error()))
    cmd.rmdir(dir)
  end)

  it("reads every day of a folder of more than 4096, in the order of N, and refuses a day's name written otherwise",
      function()
    -- day N holds one sample whose id is N; the files are written in an order readdir does not keep
    local dir = cmd.tmpdir()
    local N = 4200
    local tmp = cmd.tmpdir()
    local one = function(name, t, descr)
      assert(data.npy_save(tmp .. "/" .. name, t, descr))
      return cmd.slurp(tmp .. "/" .. name)
    end
    local dense = one("d.npy", ur.tensor({ 1, 1 }):fill(0.5))
    local labels = one("l.npy", ur.tensor({ 1 }, { dtype = "i32" }):fill(1))
    local header = one("s.npy", ur.tensor({ 1, 1 }, { dtype = "i32" }):fill(0))
    header = header:sub(1, #header - 4)
    local function put(path, bytes)
      local f = assert(io.open(path, "wb"))
      f:write(bytes)
      f:close()
    end
    for i = 1, N do
      local d = (i * 7919) % N -- every day once, out of order
      put(("%s/day_%d_dense.npy"):format(dir, d), dense)
      put(("%s/day_%d_labels.npy"):format(dir, d), labels)
      put(("%s/day_%d_sparse.npy"):format(dir, d), header .. ffi.string(ffi.new("int32_t[1]", d), 4))
    end
    local l = assert(data.open("criteo-bin:" .. dir, { batch_size = 1000 }))
    local ids = {}
    for b in l:batches() do
      for _, v in ipairs(b.sparse:values():totable()) do ids[#ids + 1] = v end
    end
    assert.equal(N, #ids, "every day read (4096 were, in readdir's order)")
    for i = 1, N do assert.equal(i - 1, ids[i], "day " .. (i - 1)) end
    -- day_01 would be read as day 1's files (twice, beside day_1): refused, named
    put(dir .. "/day_01_dense.npy", dense)
    local none, err = data.open("criteo-bin:" .. dir, { batch_size = 10 })
    assert.is_nil(none)
    assert.equal("criteo-bin: " .. dir .. "/day_01_dense.npy: not a day's name; expected day_N_dense.npy with N a "
      .. "whole number from 0 to 2147483647 without leading zeros (as uvmrec convert and datagen write them)", err)
    cmd.rmdir(dir)
    cmd.rmdir(tmp)
  end)

  it("finds a shuffled row's day by a binary search: 4000 small days read about as fast as one day", function()
    -- day_of walked from the day last read to the row's, one day a step: a window shuffled over
    -- 4000 days of 25 rows read 19-22 times slower than the same 100000 rows in one day (2.2-2.7 s
    -- against 0.10-0.15 s, 3 epochs); 1.3-2.9 times with the search
    local dir = cmd.tmpdir()
    local function days(sub, n, rows)
      local at = dir .. "/" .. sub
      os.execute("mkdir -p " .. cmd.quote(at))
      local files = {}
      for _, f in ipairs { { "dense", ur.tensor({ rows, 13 }):uniform(0, 1, 1) },
                           { "labels", ur.tensor({ rows }, { dtype = "i32" }):fill(1) },
                           { "sparse", ur.tensor({ rows, 26 }, { dtype = "i32" }):fill(3) } } do
        assert(data.npy_save(dir .. "/t.npy", f[2]))
        files[f[1]] = cmd.slurp(dir .. "/t.npy")
      end
      for d = 0, n - 1 do
        for name, bytes in pairs(files) do cmd.spit(("%s/day_%d_%s.npy"):format(at, d, name), bytes) end
      end
      return "criteo-bin:" .. at
    end
    local one, many = days("one", 1, 100000), days("many", 4000, 25)
    local function read(src) -- the fastest of 3 runs of 3 epochs, every row once an epoch
      local best = math.huge
      for _ = 1, 3 do
        local l = assert(data.open(src, { batch_size = 8192, shuffle_window = 100000, threads = 1, depth = 1,
                                          epochs = 3 }))
        local t0, n = ur.C.ur_clock_seconds(), 0
        for b in l:batches() do n = n + b.size end
        best = math.min(best, ur.C.ur_clock_seconds() - t0)
        assert.equal(300000, n)
        l:close()
      end
      return best
    end
    local t1, t2 = read(one), read(many)
    assert.is_true(t2 < 8 * t1, ("4000 days %.3f s, one day %.3f s"):format(t2, t1))
    cmd.rmdir(dir)
  end)

  it("shuffles within windows by seed: each epoch a permutation, the same for the same seed", function()
    local function run(seed, epochs)
      return rows_of(assert(data.loader { data = "synthetic:tiny", samples = 2500, batch_size = 256,
                                          shuffle_window = 1000, seed = seed, epochs = epochs }))
    end
    local plain = rows_of(assert(data.loader { data = "synthetic:tiny", samples = 2500, batch_size = 256 }))
    local a, b, c = run(5, 2), run(5, 2), run(6, 1)
    assert.equal(5000, #a)
    local same, moved = true, 0
    for i = 1, #a do same = same and key(a[i]) == key(b[i]) end
    assert.is_true(same)
    for e = 0, 1 do
      local want, got = {}, {}
      for i = 1, 2500 do
        want[#want + 1] = key(plain[i])
        got[#got + 1] = key(a[e * 2500 + i])
        if key(a[e * 2500 + i]) ~= key(plain[i]) then moved = moved + 1 end
        assert.equal(e, a[e * 2500 + i].epoch)
      end
      -- windows of 1000 rows: the samples of each window stay in it
      for w = 0, 2 do
        local ws, gs = {}, {}
        for i = w * 1000 + 1, math.min((w + 1) * 1000, 2500) do
          ws[#ws + 1] = want[i]
          gs[#gs + 1] = got[i]
        end
        table.sort(ws)
        table.sort(gs)
        assert.same(ws, gs)
      end
    end
    assert.is_true(moved > 4000)
    local differ = 0
    for i = 1, 2500 do if key(a[i]) ~= key(a[2500 + i]) then differ = differ + 1 end end
    assert.is_true(differ > 2000, "epochs are shuffled differently")
    differ = 0
    for i = 1, 2500 do if key(a[i]) ~= key(c[i]) then differ = differ + 1 end end
    assert.is_true(differ > 2000, "seeds are shuffled differently")
  end)

  it("gives the plain loader's batches one for one on 1 or 3 threads: shuffled, epochs, resumed, by rank", function()
    local spec = data.synthetic_spec {
      num_dense = 3, seed = 5, groups = 4,
      tables = { { rows = 90, zipf = 1.1 }, { rows = 30, hot = { 0, 3 }, weighted = true }, { rows = 7, hot = 2 } } }
    local total = 2300
    local keys = sample_keys(spec, total)
    local cases = {
      { batch_size = 200, shuffle_window = 700, seed = 9, epochs = 3 },
      { batch_size = 256, epochs = 2 },
      { batch_size = 300, shuffle_window = 110, seed = 3, epochs = 2, drop_last = true },
      { batch_size = 128, shuffle_window = 1000, seed = 1, epochs = 3, position = { epoch = 1, sample = 777 } },
      { batch_size = 100, shuffle_window = 333, seed = 4, epochs = 2, rank = 1, world = 3 },
      { batch_size = 64, shuffle_window = 500, seed = 7, epochs = 2, rank = 2, world = 3,
        position = { epoch = 0, sample = 640 } },
    }
    for ci, c in ipairs(cases) do
      local plain = plain_batches(total, c)
      for _, threads in ipairs { 1, 3 } do
        local o = { data = { kind = "synthetic", spec = spec }, samples = total, depth = 2, threads = threads }
        for k, v in pairs(c) do o[k] = v end
        same_as_plain(assert(data.loader(o)), plain, keys, ("case %d, %d threads"):format(ci, threads))
      end
    end
  end)

  it("gives the plain loader's batches from day files too, windows crossing days, ids reduced by rows", function()
    local dir = cmd.tmpdir()
    local text = [[return { num_dense = 4, seed = 33, groups = 6, tables = {
      { name = "C1", rows = 500, zipf = 1.05 }, { name = "C2", rows = 60, hot = { 0, 4 }, weighted = true },
      { name = "C3", rows = 9, hot = 3 } } }]]
    local total = 2500
    datagen(dir, "spec", text, "days", ("--samples %d --days 3"):format(total))
    local spec = data.synthetic_spec(assert(loadstring(text))())
    local keys, modded = sample_keys(spec, total), sample_keys(spec, total, { 77, 13, 5 })
    local cases = {
      { batch_size = 300, shuffle_window = 900, seed = 2, epochs = 2 },
      { batch_size = 256, epochs = 1, rows = { 77, 13, 5 } },
      { batch_size = 200, shuffle_window = 1300, seed = 8, epochs = 3, position = { epoch = 1, sample = 1000 },
        rows = { 77, 13, 5 } },
      { batch_size = 150, shuffle_window = 400, seed = 6, epochs = 2, rank = 1, world = 2, drop_last = true },
    }
    for ci, c in ipairs(cases) do
      local plain = plain_batches(total, c)
      for _, threads in ipairs { 1, 3 } do
        local o = { depth = 3, threads = threads }
        for k, v in pairs(c) do o[k] = v end
        same_as_plain(assert(data.open("criteo-bin:" .. dir .. "/days", o)), plain, c.rows and modded or keys,
          ("day files, case %d, %d threads"):format(ci, threads))
      end
    end
    cmd.rmdir(dir)
  end)

  it("shuffles each window on Philox counters of its own, past 2^24 rows a window, 2^20 windows or 2^20 epochs",
     function()
    -- in 64 bits, (e << 44) ^ (w << 24) ^ i: window 0's draw 2^24 + j was window 1's draw j, window
    -- 2^20 + v of epoch e was window v of epoch e + 1, and epoch 2^20 was epoch 0
    local spec = data.synthetic_spec { num_dense = 2, seed = 3, tables = { { rows = 1000 }, { rows = 50 } } }
    local big = 2 ^ 24 + 16
    local cases = { -- window W, samples, start position, the window and epoch it reads
      { 16, 2 ^ 24 + 32, { epoch = 0, sample = 2 ^ 24 }, 2 ^ 20, 0 },
      { 16, 2 ^ 24 + 32, { epoch = 3, sample = 2 ^ 24 + 16 }, 2 ^ 20 + 1, 3 },
      { 16, 32, { epoch = 2 ^ 20, sample = 16 }, 1, 2 ^ 20 },
      { 16, 32, { epoch = 2 ^ 20 - 1, sample = 16 }, 1, 2 ^ 20 - 1 }, -- still the old counters
      { big, big, { epoch = 0, sample = big - 16 }, 0, 0 },            -- its last draws, 2^24 on
    }
    for ci, c in ipairs(cases) do
      local W, total, pos, w, e = c[1], c[2], c[3], c[4], c[5]
      local l = assert(data.loader { data = { kind = "synthetic", spec = spec }, samples = total, batch_size = 16,
                                     shuffle_window = W, seed = 6, position = pos, epochs = e + 1, threads = 1 })
      local b = assert(l:next())
      assert.same({ e, pos.sample, 16 }, { b.epoch, b.first, b.size }, "case " .. ci)
      local got = rows_of_batch(b)
      l:close()
      local first = w * W -- the window's first row
      local off0 = pos.sample - first
      local p = window_perm(e, w, math.min(W, total - first), 6, W, off0)
      for j = 1, 16 do
        local row = first + p[off0 + j - 1]
        assert.equal(sample_keys(spec, 1, nil, row)[1], key(got[j]), ("case %d, sample %d"):format(ci, j))
      end
    end
  end)

  it("drops the last partial batch on request, and splits rows by rank", function()
    local l = assert(data.loader { data = "synthetic:tiny", samples = 1000, batch_size = 300, drop_last = true })
    local n = 0
    for b in l:batches() do
      assert.equal(300, b.size)
      n = n + 1
    end
    assert.equal(3, n)
    local all = rows_of(assert(data.loader { data = "synthetic:tiny", samples = 1001, batch_size = 100 }))
    local parts = {}
    for r = 0, 2 do
      local l2 = assert(data.loader { data = "synthetic:tiny", samples = 1001, batch_size = 100, rank = r, world = 3 })
      local rows = rows_of(l2)
      for _, x in ipairs(rows) do parts[#parts + 1] = key(x) end
      assert.equal(({ 333, 334, 334 })[r + 1], #rows)
    end
    assert.equal(#all, #parts)
    for i = 1, #all do assert.equal(key(all[i]), parts[i]) end
    do -- the real rows too
      local r1 = rows_of(assert(data.open("criteo-tsv:" .. SAMPLE1, { batch_size = 64, rank = 1, world = 2 })))
      local whole = rows_of(assert(data.open("criteo-tsv:" .. SAMPLE1, { batch_size = 64 })))
      assert.equal(500, #r1)
      assert.equal(key(whole[501]), key(r1[1]))
    end
  end)

  it("resumes from a saved position with exactly the batches that would have followed", function()
    local opts = { data = "synthetic:tiny", samples = 3000, batch_size = 200, shuffle_window = 700, seed = 9,
                   epochs = 2 }
    local full = rows_of(assert(data.loader(opts)))
    local l = assert(data.loader(opts))
    for _ = 1, 19 do assert(l:next()) end -- into the second epoch
    local pos = l:position()
    assert.same({ epoch = 1, sample = 800 }, pos)
    l:close()
    local o2 = {}
    for k, v in pairs(opts) do o2[k] = v end
    o2.position = pos
    local rest = rows_of(assert(data.loader(o2)))
    assert.equal(#full - 3800, #rest)
    for i = 1, #rest do assert.equal(key(full[3800 + i]), key(rest[i])) end
    do -- the real rows too
      local t = rows_of(assert(data.open("criteo-tsv:" .. SAMPLE1,
        { batch_size = 100, shuffle_window = 300, seed = 2 })))
      local r = rows_of(assert(data.open("criteo-tsv:" .. SAMPLE1, { batch_size = 100, shuffle_window = 300, seed = 2,
                                                                    position = { epoch = 0, sample = 600 } })))
      assert.equal(400, #r)
      for i = 1, 400 do assert.equal(key(t[600 + i]), key(r[i])) end
    end
  end)

  -- A position past the epoch's end (a resume from another data set) went on to the next epoch
  -- without a word, as if the rest of this one had been read.
  it("refuses a start position past the epoch's end: when opened where the size is known, else at the first batch",
    function()
    local opts = { data = "synthetic:tiny", samples = 3000, batch_size = 200, epochs = 2 }
    opts.position = { epoch = 0, sample = 3000 } -- the epoch's end: the next epoch's batches
    assert.equal(15, #rows_of(assert(data.loader(opts))) / 200)
    opts.position = { epoch = 0, sample = 3001 }
    local past = "loader: the start position (epoch 0, sample %d) lies past the epoch's end (sample %d); expected "
      .. "a position this data gave, at most its end"
    assert.has_error(function() data.loader(opts) end, past:format(3001, 3000))
    opts.placement = "managed" -- the generator's batches, made where they are used
    assert.has_error(function() data.loader(opts) end, past:format(3001, 3000))
    -- 1000 real rows in windows of 300: 1100 lies in the last window's 100 rows, 1200 and 1500 on
    -- windows past the end, 65536 on the default window's first past it (they read as the end)
    for _, c in ipairs { { 1100, 300 }, { 1200, 300 }, { 1500, 300 }, { 65536, 0 } } do
      local l = assert(data.open("criteo-tsv:" .. SAMPLE1, { batch_size = 100, shuffle_window = c[2], seed = 2,
                                                            position = { epoch = 0, sample = c[1] } }))
      assert.has_error(function() l:next() end, past:format(c[1], 1000))
      l:close()
    end
    -- a bad line ends the window's rows first: its error, not a position past the end
    local dir = cmd.tmpdir()
    local lines = cmd.lines(SAMPLE1)
    table.insert(lines, 951, "bad line")
    cmd.spit(dir .. "/bad.tsv", table.concat(lines, "\n") .. "\n")
    local l = assert(data.open("criteo-tsv:" .. dir .. "/bad.tsv", { batch_size = 100, shuffle_window = 300,
                                                                    position = { epoch = 0, sample = 960 } }))
    local ok, b, err = pcall(l.next, l) -- a reader's error is returned (nil, message), a misuse raised
    local said = ok and err or b
    assert.matches("bad.tsv:951: label is 'bad line'; expected 0 or 1", tostring(said), 1, true)
    l:close()
    cmd.rmdir(dir)
  end)

  it("reports a reader error after the batches before it, naming file and line", function()
    local dir = cmd.tmpdir()
    local f = assert(io.open(dir .. "/bad.tsv", "w"))
    local lines = cmd.lines(SAMPLE1)
    lines[150] = lines[150]:gsub("^0", "2"):gsub("^1", "2")
    f:write(table.concat(lines, "\n", 1, 300), "\n")
    f:close()
    local l = assert(data.open("criteo-tsv:" .. dir .. "/bad.tsv", { batch_size = 50, depth = 2 }))
    local sizes, err = drain(l)
    assert.same({ 50, 50, 49 }, sizes) -- the 149 good lines before it
    assert.equal("criteo-tsv: " .. dir .. "/bad.tsv:150: label is '2'; expected 0 or 1", err)
    l:close()
    local l2 = assert(data.open("criteo-tsv:" .. dir .. "/bad.tsv", { batch_size = 50, drop_last = true }))
    assert.has_error(function() for _ in l2:batches() do end end,
      "criteo-tsv: " .. dir .. "/bad.tsv:150: label is '2'; expected 0 or 1")
    l2:close()
    local s = assert(data.open("criteo-tsv:" .. dir .. "/bad.tsv", { batch_size = 50, on_bad_line = "skip" }))
    local n = 0
    for x in s:batches() do n = n + x.size end
    assert.equal(299, n)
    cmd.rmdir(dir)
  end)

  it("gives the rows before a line over 1 MiB, then the error, whatever the chunk size", function()
    -- the line left unfinished at a chunk's end was already over 1 MiB: the chunk's rows before
    -- it were dropped with the error (chunk_bytes 2 MiB: none of the 10 served; 4096: all 10)
    local dir = cmd.tmpdir()
    local lines = cmd.lines(SAMPLE1)
    local t = { unpack(lines, 1, 10) }
    t[11] = string.rep("1", 3 * 2 ^ 20)
    for i = 12, 16 do t[i] = lines[i] end
    local path = cmd.spit(dir .. "/long.tsv", table.concat(t, "\n") .. "\n")
    local msg = "criteo-tsv: " .. path .. ":11: line is over 1048576 bytes long (a Criteo line is under 1 KiB)"
    for _, cb in ipairs { 0, 4096, 65536, 2 ^ 20, 2 ^ 21, 2 ^ 21 + 12345 } do
      local l = assert(data.open("criteo-tsv:" .. path, { batch_size = 4, chunk_bytes = cb }))
      local sizes, err = drain(l)
      l:close()
      assert.same({ 4, 4, 2 }, sizes, "chunk_bytes " .. cb)
      assert.equal(msg, err, "chunk_bytes " .. cb)
      local s = assert(data.open("criteo-tsv:" .. path, { batch_size = 4, chunk_bytes = cb, on_bad_line = "skip" }))
      sizes, err = drain(s)
      s:close()
      assert.same({ 4, 4, 4, 3 }, sizes, "chunk_bytes " .. cb .. ", skipping")
      assert.is_nil(err)
    end
    cmd.rmdir(dir)
  end)

  it("gives the rows before a reader error at a window's first row, then the error (they were dropped)", function()
    -- the window after a batch's first rows failed to read: the batch went with it, so a bad line
    -- at row W + 1 of a day file lost the rows of the batch before it
    local dir = cmd.tmpdir()
    local lines = cmd.lines(SAMPLE1)
    for _, c in ipairs { { 101, 100, { 64, 36 } }, { 201, 100, { 64, 64, 64, 8 } }, { 150, 100, { 64, 64, 21 } },
                         { 101, 0, { 64, 36 } } } do
      local bad, window, want = c[1], c[2], c[3]
      local t = { unpack(lines, 1, 300) }
      t[bad] = t[bad]:gsub("^[01]", "2")
      local path = cmd.spit(("%s/bad%d.tsv"):format(dir, bad), table.concat(t, "\n") .. "\n")
      local msg = ("criteo-tsv: %s:%d: label is '2'; expected 0 or 1"):format(path, bad)
      for _, threads in ipairs { 1, 3 } do
        local what = ("bad line %d, window %d, %d threads"):format(bad, window, threads)
        local l = assert(data.open("criteo-tsv:" .. path, { batch_size = 64, shuffle_window = window, seed = 1,
                                                            threads = threads, depth = 2 }))
        local sizes, err = drain(l)
        assert.same(want, sizes, what)
        assert.equal(msg, err, what)
        l:close()
        -- dropped as a short last batch would be, the error still said
        l = assert(data.open("criteo-tsv:" .. path, { batch_size = 64, shuffle_window = window, seed = 1,
                                                      threads = threads, drop_last = true }))
        sizes, err = drain(l)
        local full = {}
        for i = 1, #want do if want[i] == 64 then full[#full + 1] = 64 end end
        assert.same(full, sizes, what .. ", drop_last")
        assert.equal(msg, err, what .. ", drop_last")
        l:close()
      end
    end
    cmd.rmdir(dir)
  end)

  it("with even_slices names the reader's error where it cuts a batch the ranks cannot share (it blamed the "
     .. "epoch's last batch)", function()
    local dir = cmd.tmpdir()
    local lines = cmd.lines(SAMPLE1)
    local t = { unpack(lines, 1, 300) }
    t[150] = t[150]:gsub("^[01]", "2")
    local path = cmd.spit(dir .. "/bad.tsv", table.concat(t, "\n") .. "\n")
    for r = 0, 1 do
      local l = assert(data.open("criteo-tsv:" .. path, { batch_size = 100, slice_rank = r, slice_world = 2,
                                                          even_slices = true }))
      local sizes, err = drain(l)
      assert.same({ 50 }, sizes) -- 49 rows before line 150: no equal halves
      assert.equal(("criteo-tsv: %s:150: label is '2'; expected 0 or 1"):format(path), err)
      l:close()
    end
    t[150] = lines[150]
    t[151] = t[151]:gsub("^[01]", "2") -- 150 rows before it: halves of 25 go out first
    path = cmd.spit(dir .. "/bad2.tsv", table.concat(t, "\n") .. "\n")
    local sizes, err = drain(assert(data.open("criteo-tsv:" .. path, { batch_size = 100, slice_rank = 1,
                                                                       slice_world = 2, even_slices = true })))
    assert.same({ 50, 25 }, sizes)
    assert.equal(("criteo-tsv: %s:151: label is '2'; expected 0 or 1"):format(path), err)
    cmd.rmdir(dir)
  end)

  it("stops early without waiting, and frees a batch's tensors once it is released", function()
    local l = assert(data.loader { data = "synthetic:tiny", samples = 1e6, batch_size = 1000, depth = 3 })
    local b1 = assert(l:next())
    local b2 = assert(l:next())
    assert.equal(1000, b1.labels:numel())
    assert(l:next()) -- releases b1
    assert.has_error(function() return b1.labels:numel() end, "tensor: used after free()")
    -- a module given a released batch says so (it used to read the freed tensor's null pointer)
    local lin = ur.nn.Linear(13, 4)
    assert.has_error(function() lin:forward(b1.dense) end)
    local ok, err = pcall(lin.forward, lin, b1.dense)
    assert.is_false(ok)
    assert.matches("tensor: used after free%(%)", err)
    assert.equal(1000, b2.labels:numel())
    local copy = b2:to("host")
    l:close()
    assert.equal(1000, copy.labels:numel())
    assert.same({ 1000, 13 }, copy.dense:size())
    assert.equal(26, copy.sparse:num_keys())
    l:close() -- twice is harmless
  end)

  it("feeds the embedding collection: a batch's KJT, and its dedup()ed VBE form, pool the same", function()
    local ok, EBC = pcall(function() return ur.nn.EmbeddingBagCollection end)
    if not ok or not EBC then pending("no uvmrec.nn.EmbeddingBagCollection") return end
    local tables = {}
    for i, t in ipairs(data.presets.tiny.tables) do
      tables[i] = { name = "t" .. i, rows = t.rows, dim = 8, features = { t.name } }
    end
    local ebc = EBC { tables = tables, optimizer = { "sgd", lr = 0.1 } }
    local l = assert(data.loader { data = "synthetic:tiny", samples = 2048, batch_size = 512 })
    local b = assert(l:next())
    local full = ebc:forward(b.sparse):totable()
    local vbe = b.sparse:dedup()
    assert.is_true(vbe:stride_per_key_per_rank()[1][1] < 512) -- tiny's first table has 4 rows
    local pooled = ebc:forward(vbe):totable()
    assert.equal(512 * 26 * 8, #full)
    for i = 1, #full do assert.is_true(math.abs(full[i] - pooled[i]) < 1e-5, "element " .. i) end
    l:close()
  end)

  it("takes synthetic ids from an id space larger than the table modulo rows where given", function()
    local spec = data.synthetic_spec { seed = 2, num_dense = 2,
                                       tables = { { name = "a", rows = 10, id_space = 500 },
                                                  { name = "b", rows = 7, id_space = 70 } } }
    local g = assert(data.generate(spec, 0, 64))
    local raw = g.ids:totable()
    local rows = { 10, 0 } -- b: raw ids
    local l = assert(data.loader { data = { kind = "synthetic", spec = spec }, samples = 64, batch_size = 64,
                                   rows = rows })
    local d = l:next().sparse:to_dict()
    local a, b = d.a.values:totable(), d.b.values:totable()
    local over = 0
    for i = 1, 64 do
      assert.equal(raw[2 * i - 1] % 10, a[i], "a: id mod rows, sample " .. i)
      assert.equal(raw[2 * i], b[i], "b: the raw id, sample " .. i)
      if raw[2 * i - 1] >= 10 then over = over + 1 end
    end
    assert.is_true(over > 32, "most raw ids lie past the table")
    l:close()
  end)

  it("refuses rows that would reduce the ids the generator draws where they are used", function()
    local spec = data.synthetic_spec { seed = 2, num_dense = 2, tables = { { name = "a", rows = 10, id_space = 500 } } }
    assert.has_error(function()
      data.loader { data = { kind = "synthetic", spec = spec }, samples = 64, batch_size = 64, rows = 10,
                    placement = "managed" }
    end, "loader: the generator (placement 'managed') keeps the ids it draws; table 1 draws from an id space of 500 "
      .. "and rows = 10 would take them modulo: use placement 'pinned' (the threaded loader reduces them)")
    -- past the 26th table too (the check looked at 26 and let table 30's ids through unreduced)
    local t30, r30 = {}, {}
    for i = 1, 30 do t30[i], r30[i] = { name = "C" .. i, rows = 10, id_space = i == 30 and 500 or 0 }, 10 end
    local wide = data.synthetic_spec { seed = 2, num_dense = 2, tables = t30 }
    assert.has_error(function()
      data.loader { data = { kind = "synthetic", spec = wide }, samples = 64, batch_size = 64, rows = r30,
                    placement = "managed" }
    end, "loader: the generator (placement 'managed') keeps the ids it draws; table 30 draws from an id space of 500 "
      .. "and rows = 10 would take them modulo: use placement 'pinned' (the threaded loader reduces them)")
    assert.has_error(function()
      data.loader { data = { kind = "synthetic", spec = wide }, samples = 64, batch_size = 64, rows = { 10, 10 },
                    placement = "managed" }
    end, "loader: 2 table sizes (rows) for synthetic data, which has 30 tables; expected one a table, or one for "
      .. "every table")
    -- a table without id_space draws from its rows: fewer rows would reduce them too (the generator gave
    -- ids up to 993 of a 1000-row table given rows = 10, where the threaded loader gave them mod 10)
    local plain = data.synthetic_spec { seed = 2, num_dense = 2, tables = { { name = "a", rows = 1000 } } }
    assert.has_error(function()
      data.loader { data = { kind = "synthetic", spec = plain }, samples = 64, batch_size = 64, rows = 10,
                    placement = "managed" }
    end, "loader: the generator (placement 'managed') keeps the ids it draws; table 1 draws from an id space of 1000 "
      .. "and rows = 10 would take them modulo: use placement 'pinned' (the threaded loader reduces them)")
    assert(data.loader { data = { kind = "synthetic", spec = plain }, samples = 64, batch_size = 64, rows = 1000,
                         placement = "managed" }):close()
    -- rows 0 (raw ids) or rows the space fits in leave the ids as drawn
    local l = assert(data.loader { data = { kind = "synthetic", spec = spec }, samples = 64, batch_size = 64,
                                   rows = 0, placement = "managed" })
    local raw = assert(data.generate(spec, 0, 64)).ids:totable()
    assert.same(raw, l:next().sparse:values():totable())
    l:close()
  end)

  it("gives each rank its slice of every global batch, the last one too", function()
    local whole = assert(data.loader { data = "synthetic:tiny", samples = 250, batch_size = 96 })
    local slices = {}
    for r = 0, 2 do
      slices[r] = assert(data.loader { data = "synthetic:tiny", samples = 250, batch_size = 96, slice_rank = r,
                                       slice_world = 3 })
    end
    for b in whole:batches() do
      local rows, at = rows_of_batch(b), 0
      for r = 0, 2 do
        local s = assert(slices[r]:next())
        local lo, hi = math.floor(b.size * r / 3), math.floor(b.size * (r + 1) / 3)
        assert.equal(hi - lo, s.size)
        assert.equal(b.first + lo, s.first)
        for i, x in ipairs(rows_of_batch(s)) do assert.equal(key(rows[at + i]), key(x)) end
        at = at + s.size
      end
      assert.equal(b.size, at)
    end
    for r = 0, 2 do assert.is_nil(slices[r]:next()) end
    assert.has_error(function()
      data.loader { data = "synthetic:tiny", samples = 10, batch_size = 4, slice_rank = 3, slice_world = 3 }
    end, "loader: batch slice 3 of 3; expected 0 <= slice_rank < slice_world")
  end)

  it("with even_slices fails on a global batch the slices cannot share, after the batches before it (TSV's last "
     .. "too, known only there); drop_last drops it", function()
    -- over ranks each rank got its slice of TSV files' short last batch: 49 and 50 samples of 99,
    -- which a run with every table data-parallel trained on as if they were halves of one batch
    local dir = cmd.tmpdir()
    local lines = cmd.lines(SAMPLE1)
    local odd = cmd.spit(dir .. "/odd.tsv", table.concat(lines, "\n", 1, 999) .. "\n")
    local want = "loader: the batch at sample 900 of epoch 0 (the epoch's last) has 99 samples (batch_size 100), "
      .. "which the 2 ranks (slice_world) cannot share equally: each takes an equal slice of every global batch "
      .. "(drop_last drops an epoch's short last batch)"
    local sources = {
      { "criteo-tsv:" .. odd, {} }, { "synthetic:tiny", { samples = 999 } },
      { "synthetic:tiny", { samples = 999, placement = "managed" } },
    }
    for _, src in ipairs(sources) do
      for r = 0, 1 do
        local o = { batch_size = 100, slice_rank = r, slice_world = 2, even_slices = true }
        for k, v in pairs(src[2]) do o[k] = v end
        local what = src[1] .. (o.placement or "") .. " rank " .. r
        local sizes, err = drain(assert(data.open(src[1], o)))
        assert.same({ 50, 50, 50, 50, 50, 50, 50, 50, 50 }, sizes, what)
        assert.equal(want, err, what)
        o.drop_last = true
        sizes, err = drain(assert(data.open(src[1], o)))
        assert.same({ 50, 50, 50, 50, 50, 50, 50, 50, 50 }, sizes, what)
        assert.is_nil(err, what)
        o.drop_last, o.batch_size = nil, 99
        local ok, opened, oerr = pcall(data.open, src[1], o)
        assert.is_true(not ok or opened == nil, what)
        local msg = ok and oerr or tostring(opened)
        assert.truthy(msg:find("loader: batch_size 99 is not a multiple of the 2 ranks (slice_world): with even_slices "
          .. "each takes an equal slice of every global batch", 1, true), what .. ": " .. msg)
      end
    end
    -- count_samples: TSV files counted as the loader opens, before the first batch (training over
    -- ranks checks the epoch's last batch with it before any step; unknown, it failed there, after
    -- an epoch of training); the batches are the same
    for r = 0, 1 do
      local o = { batch_size = 100, slice_rank = r, slice_world = 2, even_slices = true }
      local uncounted = assert(data.open("criteo-tsv:" .. odd, o))
      assert.is_nil(uncounted:stats().samples_per_epoch)
      uncounted:close()
      o.count_samples = true
      local counted = assert(data.open("criteo-tsv:" .. odd, o))
      assert.equal(999, counted:stats().samples_per_epoch)
      local sizes, err = drain(counted)
      assert.same({ 50, 50, 50, 50, 50, 50, 50, 50, 50 }, sizes)
      assert.equal(want, err)
    end
    -- a bad line fails the count, at open
    local bad = cmd.spit(dir .. "/bad.tsv", table.concat(lines, "\n", 1, 500) .. "\nnot a criteo line\n")
    local none, berr = data.open("criteo-tsv:" .. bad, { batch_size = 100, slice_world = 2, even_slices = true,
                                                         count_samples = true })
    assert.is_nil(none)
    assert.truthy(berr:find(bad .. ":501:", 1, true), berr)
    -- without it the slices are cut as they come (49 and 50)
    local l = assert(data.open("criteo-tsv:" .. odd, { batch_size = 100, slice_rank = 0, slice_world = 2 }))
    local sizes = drain(l)
    assert.equal(49, sizes[10])
    cmd.rmdir(dir)
  end)

  it("counts one thing as one in its messages (a short last batch of one said '1 samples')", function()
    for _, placement in ipairs { "pinned", "managed" } do
      local l = assert(data.open("synthetic:tiny", { samples = 5, batch_size = 4, slice_rank = 0, slice_world = 2,
                                                     even_slices = true, placement = placement }))
      local sizes, err = drain(l)
      assert.same({ 2 }, sizes, placement)
      assert.equal("loader: the batch at sample 4 of epoch 0 (the epoch's last) has 1 sample (batch_size 4), which "
        .. "the 2 ranks (slice_world) cannot share equally: each takes an equal slice of every global batch "
        .. "(drop_last drops an epoch's short last batch)", err, placement)
    end
    local one = data.synthetic_spec { seed = 1, num_dense = 1, tables = { { name = "a", rows = 10 } } }
    local two = data.synthetic_spec { seed = 1, num_dense = 1, tables = { { name = "a", rows = 10 },
                                                                          { name = "b", rows = 10 } } }
    local cases = {
      { two, { keys = { "a" } }, "loader: 1 key name for synthetic data, which has 2 tables; expected one a table" },
      { one, { rows = { 10, 10 } }, "loader: 2 table sizes (rows) for synthetic data, which has 1 table; expected one "
        .. "a table, or one for every table" },
    }
    for _, c in ipairs(cases) do
      for _, placement in ipairs { "pinned", "managed" } do
        local o = { data = { kind = "synthetic", spec = c[1] }, samples = 8, batch_size = 4, placement = placement }
        for k, v in pairs(c[2]) do o[k] = v end
        assert.has_error(function() data.loader(o) end, c[3])
      end
    end
  end)

  it("rejects bad options", function()
    assert.has_error(function() data.loader { data = "synthetic:tiny", samples = 10 } end,
      "loader: batch_size is required")
    assert.has_error(function() data.loader { data = "parquet:x", batch_size = 1 } end)
    assert.has_error(function()
      data.loader { data = "synthetic:tiny", samples = 10, batch_size = 4, rank = 2, world = 2 }
    end,
      "loader: rank 2 of world 2; expected 0 <= rank < world")
    -- an option it does not take, or a count that is no whole number, is named (a typo was ignored,
    -- batch_size 1.5 made batches of 1)
    assert.has_error(function()
      data.loader { data = "synthetic:tiny", samples = 10, batch_size = 4, shufle_window = 8 }
    end, "loader: unknown option 'shufle_window'; expected data, batch_size, samples, rows, depth, threads, "
      .. "drop_last, shuffle_window, seed, epochs, rank, world, slice_rank, slice_world, even_slices, count_samples, "
      .. "position, placement, stream, keys, on_bad_line, pad_missing_fields, chunk_bytes, synthetic")
    assert.has_error(function() data.loader { data = "synthetic:tiny", samples = 10, batch_size = 1.5 } end,
      "loader: batch_size is 1.5; expected a whole number that fits i64")
    assert.has_error(function() data.loader { data = "synthetic:tiny", samples = 10, batch_size = 4, epochs = "2" } end,
      "loader: epochs is string; expected a number")
    assert.has_error(function()
      data.loader { data = "synthetic:tiny", samples = 10, batch_size = 4, position = { epoch = 0, sample = 2.5 } }
    end, "loader: position.sample is 2.5; expected a whole number that fits i64")
    local l, err = data.loader { data = "criteo-bin:/nonexistent", batch_size = 4 }
    assert.is_nil(l)
    assert.equal("criteo-bin: /nonexistent: cannot open the folder", err)
    -- day files that disagree: each message says what the file holds
    local dir = cmd.tmpdir()
    assert(data.convert({ SAMPLE1, SAMPLE2 }, dir, { rows = 1000 }))
    os.execute(("cp %s/day_0_dense.npy %s/day_1_dense.npy"):format(dir, dir))
    l, err = data.loader { data = "criteo-bin:" .. dir, batch_size = 4 }
    assert.is_nil(l)
    assert.equal(("criteo-bin: %s/day_1_sparse.npy must be integer ids [1000, columns] (the dense file's rows), "
                  .. "got <i4 [400, 26]"):format(dir), err)
    assert(data.convert({ SAMPLE1, SAMPLE2 }, dir, { rows = 1000 }))
    os.execute(("cp %s/day_0_labels.npy %s/day_1_labels.npy"):format(dir, dir))
    l, err = data.loader { data = "criteo-bin:" .. dir, batch_size = 4 }
    assert.is_nil(l)
    assert.equal(("criteo-bin: %s/day_1_labels.npy must be [400] or [400, 1], got <i4 [1000]"):format(dir), err)
    cmd.rmdir(dir)
  end)

  it("refuses key names for other than the source's tables (fewer were read past their end)", function()
    local dir = cmd.tmpdir()
    assert(data.convert({ SAMPLE1 }, dir))
    -- in a process of its own: the loader read keys[2..25] past the two names, and crashed
    local lua = ("print(pcall(require('uvmrec').data.open, 'criteo-bin:%s', { batch_size = 10, keys = { 'a', 'b' } }))")
      :format(dir)
    local out, err, code = cmd.sh(cmd.quote(cmd.bin()) .. " -e " .. cmd.quote(lua))
    assert.equal(0, code, err)
    assert.equal(("false\tloader: 2 key names for criteo-bin: %s, which has 26 tables; expected one a table\n")
      :format(dir), (out:gsub("\t[^\t]-:%d+: ", "\t", 1)))
    -- the threaded loader's batches and the generator's (placement managed) alike
    local function refused(spec, keys, msg)
      for _, placement in ipairs { "pinned", "managed" } do
        assert.has_error(function()
          data.loader { data = { kind = "synthetic", spec = spec }, samples = 8, batch_size = 4, keys = keys,
                        placement = placement }
        end, msg)
      end
    end
    local spec = data.synthetic_spec { seed = 1, num_dense = 1, tables = { { name = "a", rows = 10 } } }
    refused(spec, { "a", "b" }, "loader: 2 key names for synthetic data, which has 1 table; expected one a table")
    -- two keys of one name: every batch's KJT found one table's bags for both (to_dict failed late)
    refused(data.synthetic_spec { seed = 1, num_dense = 1, tables = { { name = "a", rows = 10 },
                                                                      { name = "b", rows = 10 } } }, { "x", "x" },
            "loader: key names 1 and 2 (of synthetic data) are both 'x'; expected one name a table")
    local dup = {}
    for i = 1, 26 do dup[i] = i == 26 and "f3" or "f" .. i end
    assert.has_error(function() data.open("criteo-bin:" .. dir, { batch_size = 10, keys = dup }) end,
      ("loader: key names 3 and 26 (of criteo-bin: %s) are both 'f3'; expected one name a table"):format(dir))
    -- the generator checks its options where the loader does (ur_loader_check): it took threads
    -- -1, batch_size 0 (no batch: the data ended at once) and depth 0 without a word
    local bad = { { threads = -1 }, { batch_size = 0 }, { depth = 0 }, { slice_rank = 2, slice_world = 2 } }
    local says = { "loader: threads -1; expected 0 (UR_NUM_THREADS, else every core) to 256",
                   "loader: batch_size 0; expected >= 1", "loader: depth 0; expected 1..64",
                   "loader: batch slice 2 of 2; expected 0 <= slice_rank < slice_world" }
    for i, b in ipairs(bad) do
      for _, placement in ipairs { "pinned", "managed" } do
        local o = { data = { kind = "synthetic", spec = spec }, samples = 8, batch_size = 4, placement = placement }
        for k, v in pairs(b) do o[k] = v end
        local ok, l, lerr = pcall(data.loader, o)
        assert.is_true(not ok or l == nil, placement .. " " .. says[i])
        assert.equal(says[i], ok and lerr or tostring(l):gsub("^[^\n]-:%d+: ", ""), placement)
      end
    end
    local names = {}
    for i = 1, 26 do names[i] = "f" .. i end
    local l = assert(data.open("criteo-bin:" .. dir, { batch_size = 10, keys = names }))
    assert.same(names, l:next().sparse:keys())
    l:close()
    cmd.rmdir(dir)
  end)

  it("says which allocation failed when its slots do not fit in memory", function()
    -- The process's address space is capped, so the slots fail the same way on any machine.
    if (os.getenv("LD_PRELOAD") or ""):match("libasan") then
      return pending("a sanitizer build: its shadow memory does not fit under ulimit -v")
    end
    local out, err, code = cmd.sh("ulimit -v 4000000 && OPENBLAS_NUM_THREADS=1 " .. cmd.quote(cmd.bin()) .. " -e "
      .. cmd.quote("print(select(2, require('uvmrec').data.loader { data = 'synthetic:tiny', samples = 2^24, "
        .. "batch_size = 2^24, threads = 1 }))"))
    assert.equal(0, code, err)
    assert.matches("^loader: %d+ slots of [%d.]+ GiB %(batch 16777216, %d+ ahead%): tensor: host allocation of "
      .. "%d+ bytes failed\n$", out)
  end)

  it("fails on a day file's label outside [0, 1], id below -1, dense value or weight not finite, naming the file, "
     .. "the row and the value", function()
    local dir = cmd.tmpdir()
    assert(data.convert({ SAMPLE1 }, dir, { rows = 1000 }))
    local path = dir .. "/day_0_labels.npy"
    local labels = assert(data.npy_load(path))
    -- i32 labels (convert's) with a 2 at row 150; then f4 labels: 0.25 is a soft label, -0.5 is not;
    -- <u4 labels are unsigned (read through the <i4 branch: 4294967295 was 'label -1') and integer
    -- labels are named exactly (3000000001 was '3e+09')
    for _, case in ipairs { { "i32", "<i4", 2, "2" }, { "f32", "<f4", -0.5, "-0.5" },
                            { "i32", "<u4", -1, "4294967295" }, { "i32", "<u4", -2147483647, "2147483649" },
                            { "i64", "<i8", 3000000001, "3000000001" },
                            { "i64", "<i8", -1099511627777, "-1099511627777" } } do
      local t = assert(ur.tensor({ labels:size(1) }, { dtype = case[1] }))
      for i = 0, labels:size(1) - 1 do t[i] = labels[i] end
      if case[1] == "f32" then t[3] = 0.25 end
      t[150] = case[3]
      assert(data.npy_save(path, t, case[2]))
      local l = assert(data.open("criteo-bin:" .. dir, { batch_size = 50, depth = 2, shuffle_window = 0 }))
      local sizes, err = drain(l)
      l:close()
      assert.same({ 50, 50, 50 }, sizes) -- the batches before the one that holds it
      assert.equal(("criteo-bin: %s/day_0_labels.npy: row 150 holds label %s; expected 0 or 1 (or, in an <f4 "
                    .. "file, a value from 0 to 1)"):format(dir, case[4]), err)
      t:free()
    end
    -- an id below -1 (-1: no id) was read as an empty bag: 2^31 and more in an <i4 file, say
    assert(data.convert({ SAMPLE1 }, dir, { rows = 1000 }))
    path = dir .. "/day_0_sparse.npy"
    local ids = assert(data.npy_load(path))
    ids[150 * 26 + 4] = -5
    assert(data.npy_save(path, ids, "<i4"))
    local l = assert(data.open("criteo-bin:" .. dir, { batch_size = 50, depth = 2, shuffle_window = 0 }))
    local sizes, err = drain(l)
    l:close()
    assert.same({ 50, 50, 50 }, sizes)
    assert.equal(("criteo-bin: %s/day_0_sparse.npy: row 150, column 4 holds id -5; expected an id >= 0 or -1 (no "
                  .. "id; ids of 2^31 and more need a <u4 or <i8 file)"):format(dir), err)
    -- a dense value that is not finite went into the batch, and the model trained to NaN
    for _, bad in ipairs { math.huge, -math.huge, 0 / 0 } do
      assert(data.convert({ SAMPLE1 }, dir, { rows = 1000 }))
      path = dir .. "/day_0_dense.npy"
      local dense = assert(data.npy_load(path))
      dense[120 * 13 + 7] = bad
      assert(data.npy_save(path, dense))
      l = assert(data.open("criteo-bin:" .. dir, { batch_size = 50, depth = 2, shuffle_window = 0 }))
      sizes, err = drain(l)
      l:close()
      assert.same({ 50, 50 }, sizes)
      assert.matches(("^criteo%%-bin: %s/day_0_dense.npy: row 120, column 7 holds %%-?%s; expected a finite value$")
        :format((dir:gsub("%p", "%%%0")), bad ~= bad and "nan" or "inf"), err)
    end
    -- a weight that is not finite went into the batch (and the pooled embedding) silently; a -1
    -- slot's weight goes nowhere and is not read
    for _, bad in ipairs { math.huge, -math.huge, 0 / 0 } do
      assert(data.convert({ SAMPLE1 }, dir, { rows = 1000 }))
      ids = assert(data.npy_load(dir .. "/day_0_sparse.npy"))
      ids[60 * 26 + 2] = -1
      assert(data.npy_save(dir .. "/day_0_sparse.npy", ids, "<i4"))
      local w = assert(ur.tensor({ ids:size(1), 26 })):fill(0.5)
      w[60 * 26 + 2] = 0 / 0
      w[130 * 26 + 3] = bad
      assert(data.npy_save(dir .. "/day_0_weights.npy", w))
      l = assert(data.open("criteo-bin:" .. dir, { batch_size = 50, depth = 2, shuffle_window = 0 }))
      sizes, err = drain(l)
      l:close()
      assert.same({ 50, 50 }, sizes)
      assert.matches(("^criteo%%-bin: %s/day_0_weights.npy: row 130, column 3 holds %%-?%s; expected a finite weight$")
        :format((dir:gsub("%p", "%%%0")), bad ~= bad and "nan" or "inf"), err)
      os.remove(dir .. "/day_0_weights.npy")
    end
    cmd.rmdir(dir)
  end)

  it("reads every id of a multi-hot bag but its -1 slots, wherever they are (the ids after a -1 were dropped)",
     function()
    local dir = cmd.tmpdir()
    local rows = { { 5, -1, 7, 8 }, { -1, -1, 9, -1 }, { 1, 2, -1, -1 }, { -1, -1, -1, -1 } }
    local N = #rows
    local s = assert(ur.tensor({ N, 4 }, { dtype = "i64" }))
    local w = assert(ur.tensor({ N, 4 }, { dtype = "f32" }))
    for i = 1, N do
      for j = 1, 4 do
        s[(i - 1) * 4 + j - 1] = rows[i][j]
        w[(i - 1) * 4 + j - 1] = i + j / 8
      end
    end
    local dense = assert(ur.tensor({ N, 1 }, { dtype = "f32" }))
    local labels = assert(ur.tensor({ N }, { dtype = "i32" }))
    assert(data.npy_save(dir .. "/day_0_dense.npy", dense:fill(0.5)))
    assert(data.npy_save(dir .. "/day_0_sparse.npy", s))
    assert(data.npy_save(dir .. "/day_0_labels.npy", labels:fill(1)))
    cmd.spit(dir .. "/layout.txt", "hot 1,0-3\n")
    local l = assert(data.open("criteo-bin:" .. dir, { batch_size = N }))
    local t = l:next().sparse:totable()
    assert.same({ 1, 0, 1, 0, 2, 1, 1, 0 }, t.lengths)
    assert.same({ 5, 1, 7, 8, 9, 2 }, t.values)
    l:close()
    assert(data.npy_save(dir .. "/day_0_weights.npy", w))
    l = assert(data.open("criteo-bin:" .. dir, { batch_size = N }))
    t = l:next().sparse:totable()
    assert.same({ 5, 1, 7, 8, 9, 2 }, t.values)
    assert.same({ 1.125, 3.125, 1.375, 1.5, 2.375, 3.25 }, t.weights)
    l:close()
    for _, x in ipairs { s, w, dense, labels } do x:free() end
    cmd.rmdir(dir)
  end)

  it("reads a day's groups as integer keys, <u4 unsigned, and refuses an <f4 file (its bits were read as keys)",
     function()
    local dir = cmd.tmpdir()
    assert(data.convert({ SAMPLE1 }, dir, { rows = 1000 }))
    local path = dir .. "/day_0_groups.npy"
    local keys = { 3, 1, 2, 0, 4294967295, 2147483648 }
    local g = assert(ur.tensor({ 1000 }, { dtype = "i32" }))
    for i = 0, 999 do g[i] = i % 7 end
    for i = 0, 5 do g[i] = keys[i + 1] >= 2 ^ 31 and keys[i + 1] - 2 ^ 32 or keys[i + 1] end
    assert(data.npy_save(path, g, "<u4"))
    local l = assert(data.open("criteo-bin:" .. dir, { batch_size = 6, depth = 2 }))
    assert.same(keys, l:next().groups:totable())
    l:close()
    local f = assert(ur.tensor({ 1000 }, { dtype = "f32" }))
    for i = 0, 999 do f[i] = i % 7 end
    assert(data.npy_save(path, f))
    local none, err = data.open("criteo-bin:" .. dir, { batch_size = 6 })
    assert.is_nil(none)
    assert.equal(("criteo-bin: %s/day_0_groups.npy must be integer keys [1000] (<i4, <u4 or <i8), got <f4 [1000]")
      :format(dir), err)
    g:free()
    f:free()
    cmd.rmdir(dir)
  end)

  it("ends cleanly under valgrind (or ASan): early stop, and an error in the reader thread", function()
    -- A sanitized engine (make SAN=1, its runtime preloaded) cannot run under valgrind: there
    -- the check runs natively with LeakSanitizer on instead.
    local asan = (os.getenv("LD_PRELOAD") or ""):match("libasan") ~= nil
    if not asan and os.execute("command -v valgrind >/dev/null 2>&1") ~= 0 then pending("no valgrind") return end
    local libdir, root = h.engine_lib()
    if not libdir then return pending(root) end
    local dir = cmd.tmpdir()
    local bad = dir .. "/bad.tsv"
    local f = assert(io.open(bad, "w"))
    local n = 0
    for l in io.lines(SAMPLE1) do
      n = n + 1
      f:write(n == 90 and "2" .. l:sub(2) or l, "\n")
      if n == 120 then break end
    end
    f:close()
    local src = root .. "/engine/tests/loader_check.c"
    local exe = dir .. "/loader_check"
    local cc = ("cc -std=c11 -g -Iengine/include %s -L%s -luvmrec -Wl,-rpath,%s -o %s"):format(src, libdir, libdir, exe)
    assert.equal(0, os.execute(cc))
    local out = dir .. "/vg.txt"
    local run = asan and "ASAN_OPTIONS=detect_leaks=1 %s %s > %s 2>&1" or
      ("valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite "
       .. "--show-leak-kinds=definite %s %s > %s 2>&1")
    local rc = os.execute(run:format(exe, bad, out))
    local text = assert(cmd.slurp(out))
    cmd.rmdir(dir)
    assert.equal(0, rc, text)
    assert.matches("error after 6 batches: criteo%-tsv: [^\n]*:90: label is '2'", text)
    assert.matches("loader_check: ok", text)
    if not asan then assert.matches("ERROR SUMMARY: 0 errors", text) end
  end)

  h.asan_it("shows the address sanitizer a read past a batch's tensors, into its slot's tail (make SAN=1)", function()
    -- a slot's buffers hold a whole batch; the last batch, 44 of 256 samples, leaves the rest
    local last = 'local l = assert(ur.data.loader { data = "synthetic:tiny", samples = 300, batch_size = 256 }); '
      .. 'assert(l:next()); local b = assert(l:next()); assert(b.size == 44); '
    for _, what in ipairs { "b.dense", "b.labels", "b.sparse:values()", "b.sparse:lengths()", "b.sparse:offsets()" } do
      assert.equal("use-after-poison", h.asan_over_read(last .. "t = " .. what), what)
    end
  end)
end)
