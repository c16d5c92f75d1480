-- uvmrec.serve.export: a training checkpoint of DLRM to one model file (docs/serving.md): the
-- description (metadata uvmrec.model), the dense weights in f32 or bf16, each table's rows in
-- its serving format (uvmrec.qtbe's), the id mapping each table needs, and where the training
-- run's held-out samples were.  `uvmrec export` (scripts/export.lua) is its command.
--
--   local export = require "uvmrec.serve.export"
--   local r = assert(export.run("runs/a", { out = "tiny.safetensors", tables = "int8",
--                                           per_table = { C3 = "int4" } }))
--   r.tables.C3.error.max_abs, r.bytes
local ur = require "uvmrec"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local qtbe = require "uvmrec.qtbe"
local train = require "uvmrec.train"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local dck = require "uvmrec.dist.checkpoint"

local M = {}

M.VERSION = lib.C.UR_MODEL_VERSION -- the description's, which the engine serves
-- Bytes of a table's rows read, quantized and written at a time (opts.chunk, --chunk): the
-- export's host memory is a few of these, whatever the tables' size.
M.CHUNK = "16MiB"

-- The Linear layers of a Sequential in the checkpoint, by index: prefix .. i .. ".weight".
local function linears(names, prefix)
  local idx = {}
  for _, n in ipairs(names) do
    local i = n:match("^" .. prefix:gsub("%.", "%%.") .. "(%d+)%.weight$")
    if i then idx[#idx + 1] = tonumber(i) end
  end
  table.sort(idx)
  return idx
end

-- "C3=int4,C5=fp16" (or a table) to {C3 = "int4", ...}, or nil and what is wrong (the caller
-- names the option: the command's --per-table check, export.run).
function M.parse_per_table(s)
  if type(s) == "table" then return s end
  local out = {}
  for item in (s or ""):gmatch("[^,]+") do
    local name, format = item:match("^%s*([^=%s]+)%s*=%s*(%S+)%s*$")
    if not name then return nil, ("'%s' is not TABLE=FORMAT"):format(item) end
    if out[name] then
      return nil, ("table '%s' is given twice (%s, %s)"):format(name, out[name], format)
    end
    out[name] = format
  end
  return out
end

-- Where the training run's held-out samples were, for the file's readers:
-- {data = spec, first = sample, samples = n, batch_size} (synthetic), or {data = spec}.
local function held_out(cfg, d)
  if not d or not d.eval then return nil end
  if cfg.data.eval ~= "" then
    return { data = cfg.data.eval, samples = cfg.eval.samples, batch_size = cfg.eval.batch_size }
  end
  return { data = cfg.data.train, first = d.eval.position.sample, samples = cfg.eval.samples,
           batch_size = cfg.eval.batch_size }
end

local function bf16_of(t)
  local out = assert(ur.tensor(t:size(), { dtype = "bf16" }))
  ur.dense.cast(t, out)
  return out
end

-- run(source, opts): source a checkpoint file or a run directory (its newest); opts: out (the
-- model file), tables (the format of every table: f32, fp16, int8 (default), int4, int2),
-- per_table ({name = format} or "C3=int4,..."), dense ("f32" or "bf16"), print (a function
-- of one line; default none).  Returns {path, bytes, tables = {name = {format, rows, dim,
-- bytes, error}}, description} or nil, message.
function M.run(source, opts)
  opts = opts or {}
  local say = opts.print or function() end
  if type(opts.out) ~= "string" or opts.out == "" then return nil, "export: --out FILE is required" end
  -- a folder there, or none to hold it, would refuse the file only after the work
  local can, target_err = require("uvmrec.lib").file_target(opts.out)
  if not can then return nil, ("export: --out %s: %s"):format(opts.out, target_err) end
  local path, perr = train.checkpoint_file(source)
  if not path then return nil, "export: " .. tostring(perr) end
  if lib.same_file(opts.out, path) then
    return nil, ("export: --out %s is the checkpoint it exports (%s); give another file"):format(opts.out, path)
  end
  local f, ferr = ck.open(path)
  if not f then return nil, "export: " .. ferr end
  -- what every refusal from here on releases (through fail), and the end: the file, the dense
  -- weights' views and their bf16 copies, the blocks' buffers (below) and the shards' reader
  local tensors, keep, bufs, reader = {}, {}, {}, nil
  local function release()
    if reader then reader:close() end
    for _, v in ipairs(keep) do v:free() end
    for _, t in pairs(tensors) do t:free() end
    for _, b in pairs(bufs) do b:free() end
    f:close()
  end
  local function fail(msg)
    release()
    return nil, "export: " .. msg
  end
  local fmt = f:meta("uvmrec.format")
  if fmt == "model" then return fail(("%s is already a model file"):format(path)) end
  if fmt ~= "1" then
    return fail(("%s is not a training checkpoint (uvmrec.format is %s)"):format(path, tostring(fmt)))
  end
  local cfg, config_err = train.config.stored(f, "checkpoint " .. path)
  if not cfg then return fail(config_err) end
  -- A table trained behind managed collisions (uvmrec.mc) maps raw ids through a map the model
  -- file cannot carry yet (the description's "collisions" slot): its rows under modulo ids would
  -- score wrongly, so it is refused rather than exported.
  local managed = {}
  for i in pairs(train.config.collisions(cfg)) do managed[#managed + 1] = "C" .. i end
  if #managed > 0 then
    table.sort(managed, function(a, b) return tonumber(a:sub(2)) < tonumber(b:sub(2)) end)
    return fail(("%s: tables %s were trained with managed collisions (embeddings.collisions), whose id "
      .. "map a model file cannot carry yet"):format(path, table.concat(managed, ", ")))
  end
  if cfg.model.file ~= "dlrm.lua" then
    return fail(("%s's model is %s; export knows DLRM (dlrm.lua)"):format(path, tostring(cfg.model.file)))
  end
  local default = opts.tables or "int8"
  local per, err = M.parse_per_table(opts.per_table)
  if not per then return fail("--per-table: " .. err) end
  local dense_dtype = opts.dense or "f32"
  if dense_dtype ~= "f32" and dense_dtype ~= "bf16" then
    return fail(("--dense %s; expected f32 or bf16"):format(dense_dtype))
  end
  local names = f:names()
  local rows = train.config.table_rows(cfg)
  -- What the training run's loader took each table's ids modulo (Criteo files, and synthetic
  -- ids from an id space wider than the tables; nil: ids were rows already): the model does the
  -- same to a request's raw ids.  A synthetic spec that no longer resolves cannot say.
  local synthetic = cfg.data.train:match("^synthetic:") ~= nil
  local data, derr = train.data(cfg, rows)
  if not data and synthetic then
    return fail(("%s: its training data %s: %s"):format(path, cfg.data.train, tostring(derr)))
  end
  local modulo = data and data.train.rows or not synthetic and rows or {}
  -- Which tables' ids training's batches weighted (synthetic tables marked weighted): the model
  -- takes weighted requests exactly when some were.  Criteo lines carry no weights; day files
  -- do when they have weights files (uvmrec datagen of a weighted spec), as the loader reads
  -- them, without saying which tables: every table is then weighted.
  local spec_tables = synthetic and data and data.train.data.spec and data.train.data.spec.tables or {}
  local days_weighted = false
  if cfg.data.train:match("^criteo%-bin:") then
    local l, lerr = ur.data.loader { data = cfg.data.train, batch_size = 1, depth = 1, epochs = 1,
                                     placement = "host", rows = train.load_rows(cfg, rows) }
    local b, berr
    if l then b, berr = l:next() end
    if not b then
      if l then l:close() end
      return fail(("%s: its training data %s, read to know whether its ids were weighted: %s"):format(
        path, cfg.data.train, tostring(lerr or berr or "no samples")))
    end
    days_weighted = b.sparse:weights() ~= nil
    l:close()
  end
  local e = cfg.embeddings
  for name, format in pairs(per) do
    local k = tonumber(name:match("^C(%d+)$"))
    if not k or k < 1 or k > #rows then
      return fail(("--per-table names table '%s'; tables are C1 to C%d"):format(name, #rows))
    end
    if not pcall(qtbe.format_of, format) then
      return fail(("--per-table %s=%s: expected f32, fp16, int8, int4 or int2"):format(name, format))
    end
  end
  if not pcall(qtbe.format_of, default) then
    return fail(("--tables %s: expected f32, fp16, int8, int4 or int2"):format(default))
  end

  -- the dense weights are taken whole from the file's pages: their bytes are checked against
  -- their checksums first (the tables' are checked as their blocks are read, in order), and
  -- their values: a run with train.nonfinite=off saves a NaN it trained into, which no model
  -- file may hold (the engine refuses to open one), so none is written
  local dense_names = {}
  for _, n in ipairs(names) do
    if n:match("^dense%.") then dense_names[#dense_names + 1] = n end
  end
  local finite_only = "a model file holds finite weights only"
  local bad = f:verify(dense_names, { refusal = finite_only .. " (the engine refuses one that does not)" })
  if bad then return fail(bad) end
  -- A tensor the config expects that the file lacks (a dcnv2 config of more cross layers than
  -- were trained) is refused below, naming what expects it; it raised a Lua error here.  A
  -- finite f32 weight beyond bf16's range rounds to infinity in a bf16 copy: refused too.
  local missing, overflow
  local function dense(name, expected_by)
    if not f:info(name) then
      missing = missing or { name = name, by = expected_by }
      return name
    end
    local v = assert(f:view(name))
    keep[#keep + 1] = v
    tensors[name] = dense_dtype == "bf16" and bf16_of(v) or v
    local at = not overflow and dense_dtype == "bf16" and tensors[name]:find_nonfinite()
    if at then
      local where = ("element %d"):format(at)
      local cols = v:dim() == 2 and v:size(2)
      if cols then where = ("%s (row %d, column %d)"):format(where, math.floor(at / cols), at % cols) end
      overflow = ("checkpoint %s: tensor '%s' at %s is %.9g, beyond bf16's range (--dense bf16); %s"):format(
        path, name, where, v[at], finite_only)
    end
    return name
  end
  local function mlp(prefix, relu_last)
    local layers = {}
    local idx = linears(names, prefix)
    for j, i in ipairs(idx) do
      layers[j] = { weight = dense(prefix .. i .. ".weight"), bias = dense(prefix .. i .. ".bias",
                                                                           "the bias of " .. prefix .. i .. ".weight"),
                    act = (j < #idx or relu_last) and "relu" or "none" }
    end
    return layers
  end
  local desc = {
    arch = "dlrm", version = M.VERSION, interaction = cfg.model.interaction,
    self_interaction = cfg.model.self_interaction, dense_features = cfg.model.dense_features,
    dense_dtype = dense_dtype, dim = e.dim,
    bottom = mlp("dense.bottom.", true), top = mlp("dense.top.", false),
    input = synthetic and "synthetic" or "criteo",
    features = {}, tables = {}, held_out = held_out(cfg, data),
  }
  if #desc.bottom ~= #cfg.model.bottom_mlp or #desc.top ~= #cfg.model.top_mlp then
    return fail(("%s holds %d bottom and %d top layers; its config has %d and %d"):format(
      path, #desc.bottom, #desc.top, #cfg.model.bottom_mlp, #cfg.model.top_mlp))
  end
  local interaction = cfg.model.interaction ~= "dcnv2" and "model.interaction " .. cfg.model.interaction
    or ("model.interaction dcnv2, model.cross_layers %d, model.cross_rank %d"):format(cfg.model.cross_layers,
                                                                                      cfg.model.cross_rank)
  if cfg.model.interaction == "dcnv2" then
    desc.cross = {}
    local m = cfg.model
    for l = 1, m.cross_layers do
      local by = ("%s: cross layer %d"):format(interaction, l)
      local layer = { bias = dense("dense.interaction.bias_" .. l, by) }
      if m.cross_rank > 0 then
        layer.V, layer.U = dense("dense.interaction.V_" .. l, by), dense("dense.interaction.U_" .. l, by)
      else
        layer.weight = dense("dense.interaction.weight_" .. l, by)
      end
      desc.cross[l] = layer
    end
  end
  if missing then
    return fail(("%s has no tensor '%s'; its config expects it (%s)"):format(path, missing.name, missing.by))
  end
  if overflow then return fail(overflow) end
  -- and one it holds that the config leaves out (model.cross_layers 1 of a run trained with 2)
  -- would leave a layer out of every score
  for _, n in ipairs(dense_names) do
    if not tensors[n] then
      return fail(("%s holds tensor '%s', which its config (%s) does not use"):format(path, n, interaction))
    end
  end
  -- A run over ranks saved its tables as shards (component "shards": the checkpoint's .shards
  -- folder), read a block of rows at a time from the saved blocks that hold them; one process's
  -- checkpoint holds each whole, read a block of rows at a time from the file.  No table is ever
  -- whole in memory: each block of rows is quantized and written before the next is read.
  local result = { tables = {}, description = desc }
  -- (a list that is not one would read as no components: a run over ranks then exported as one
  -- process's, its tables looked for in a file that holds none)
  local components, components_err = f:meta_json("uvmrec.components", "list of strings",
    { default = {}, what = "the names of its components" })
  if not components then return fail(components_err) end
  for _, c in ipairs(components) do
    if c == "shards" then
      local rerr
      reader, rerr = dck.reader(ck.shards_path(path))
      if not reader then return fail(rerr) end
    end
  end
  local chunk, cerr = lib.bytes(opts.chunk or M.CHUNK)
  if not chunk or chunk < 1 then
    return fail(("--chunk %s: %s"):format(tostring(opts.chunk), cerr or "expected 1 byte or more"))
  end
  -- each table's source: its dtype, checked against the config's shape
  local src_dtype = {}
  for i, r in ipairs(rows) do
    local name = "C" .. i
    local dtype, got
    if reader then
      local t = reader.manifest.tables[name]
      if not t then return fail(("%s has no table '%s'"):format(reader.where, name)) end
      dtype, got = t.dtype, { t.rows, t.dim }
    else
      local info = f:info("embeddings." .. name)
      if not info then return fail(("checkpoint: %s has no tensor 'embeddings.%s'"):format(path, name)) end
      dtype, got = info.dtype, info.shape
    end
    if #got ~= 2 or got[1] ~= r or got[2] ~= e.dim then
      return fail(("%s: table %s is [%s] there; its config (embeddings.rows, embeddings.dim) makes it [%d x %d]")
        :format(path, name, table.concat(got, " x "), r, e.dim))
    end
    if dtype ~= "f32" and dtype ~= "f16" and dtype ~= "bf16" then
      return fail(("%s: table %s is %s; expected f32, f16 or bf16"):format(path, name, dtype))
    end
    src_dtype[i] = dtype
  end
  -- the file's tensors, declared before any is written: the dense ones (small, whole), each
  -- table's rows in its format and its permutation
  local specs, perms = {}, {}
  for name, t in pairs(tensors) do specs[#specs + 1] = { name = name, dtype = t:dtype(), shape = t:size() } end
  for i, r in ipairs(rows) do
    local name = "C" .. i
    local format = per[name] or default
    local shape, dtype = qtbe.shape(format, r, e.dim)
    local bytes = shape[1] * shape[2] * tensor.dtype_bytes(dtype)
    local t = { name = name, rows = r, dim = e.dim, format = qtbe.FORMATS[tonumber(qtbe.format_of(format)) + 1],
                pooling = e.pooling, features = { name }, weights = "embeddings." .. name,
                modulo = modulo[i] or 0,
                weighted = days_weighted or spec_tables[i] ~= nil and spec_tables[i].weighted == true }
    specs[#specs + 1] = { name = t.weights, dtype = dtype, shape = shape }
    -- The slot for a managed-collision map (uvmrec.h's serving section): "collisions" names its
    -- tensor once managed collisions are trained; absent here, and the engine refuses a table
    -- that has one until it serves them.
    local pinfo = f:info("layout." .. name .. ".perm")
    if pinfo then
      if pinfo.dtype ~= "i64" or #pinfo.shape ~= 1 or pinfo.shape[1] ~= r then
        return fail(("%s: layout.%s.perm is %s [%s]; expected i64 [%d]"):format(path, name, pinfo.dtype,
          table.concat(pinfo.shape, " x "), r))
      end
      perms[i] = "layout." .. name .. ".perm"
      t.permutation = "embeddings." .. name .. ".perm"
      specs[#specs + 1] = { name = t.permutation, dtype = "i64", shape = { r } }
    end
    desc.features[i], desc.tables[i] = name, t
    result.tables[name] = { format = t.format, rows = r, dim = e.dim, bytes = bytes }
  end
  local meta = {
    ["uvmrec.format"] = "model",
    ["uvmrec.model"] = json.encode(desc),
    ["uvmrec.config"] = f:meta("uvmrec.config"),
    ["uvmrec.version"] = ur.version(),
    ["uvmrec.source"] = json.encode { checkpoint = path, step = tonumber(f:meta("uvmrec.step")) },
  }
  -- Each table's blocks: `step` rows read into a view of one buffer, quantized into a view of
  -- another, its permutation a view of a third.  One buffer per role and dtype serves every
  -- table, made at the largest block before the file is: the export's memory is these buffers,
  -- whatever the allocator keeps of buffers freed and made again, and one it cannot have fails
  -- the export before any file exists.
  local sizes, blocks = {}, {}
  local function need(key, numel) sizes[key] = math.max(sizes[key] or 0, numel) end
  for i, r in ipairs(rows) do
    local es = tensor.dtype_bytes(src_dtype[i])
    local b = { es = es, step = math.min(math.max(1, math.floor(chunk / (e.dim * es))), math.max(r, 1)),
                pstep = math.min(math.max(1, math.floor(chunk / 8)), r) }
    local qshape, qdtype = qtbe.shape(desc.tables[i].format, b.step, e.dim)
    b.rows, b.stored, b.qcols = "rows " .. src_dtype[i], "stored " .. qdtype, qshape[2]
    need(b.rows, b.step * e.dim)
    need(b.stored, b.step * b.qcols)
    if perms[i] then need("perm i64", b.pstep) end
    blocks[i] = b
  end
  for key, numel in pairs(sizes) do
    local buf, berr = ur.tensor({ numel }, { dtype = key:match("%S+$") })
    if not buf then return fail(("a buffer of %d %s elements for the blocks: %s"):format(numel, key, berr)) end
    bufs[key] = buf
  end
  local w, werr = ck.writer(opts.out, specs, meta)
  if not w then return fail(werr) end
  -- nil, message; or raises: either abandons the file
  local function write()
    for name, t in pairs(tensors) do
      local ok, put_err = w:put(name, t)
      if not ok then return nil, put_err end
    end
    say(("export: %s (step %s) -> %s"):format(path, tostring(f:meta("uvmrec.step")), opts.out))
    say(("%-5s %-5s %12s %5s %12s %12s %10s  %s"):format("table", "format", "rows", "dim", "max |err|",
                                                          "rms err", "rel rms", "bytes"))
    for i, r in ipairs(rows) do
      local name, t, b = "C" .. i, desc.tables[i], blocks[i]
      local qerr
      for row0 = 0, r - 1, b.step do
        -- the interrupt flag (SIGINT or SIGTERM where the command catches them, as uvmrec export
        -- does) stops it between blocks: the file is abandoned, its temporary file removed
        if lib.C.ur_interrupt_get() ~= 0 then
          return nil, ("interrupted at table %s's row %d of %d"):format(name, row0, r)
        end
        local n = math.min(b.step, r - row0)
        local src = bufs[b.rows]:view_as(0, { n, e.dim })
        local stored = bufs[b.stored]:view_as(0, { n, b.qcols })
        local ok, why, part_err
        if reader then
          ok, why = reader:rows(name, row0, n, src)
        else
          ok, why = f:read_part("embeddings." .. name, src, row0 * e.dim * b.es)
        end
        if ok then
          ok, why, part_err = pcall(qtbe.quantize, src, t.format, row0, stored)
          if not ok then why = ("checkpoint %s: table %s: %s"):format(path, name, tostring(why)) end
        end
        if ok then ok, why = w:put(t.weights, stored) end
        src:free()
        stored:free()
        if not ok then return nil, why end
        qerr = qtbe.merge_error(qerr, part_err)
      end
      for row0 = 0, perms[i] and r - 1 or -1, b.pstep do
        local part = bufs["perm i64"]:view_as(0, { math.min(b.pstep, r - row0) })
        local ok, perm_err = f:read_part(perms[i], part, row0 * 8)
        if ok then ok, perm_err = w:put(t.permutation, part) end
        part:free()
        if not ok then return nil, perm_err end
      end
      qerr = qerr or qtbe.merge_error(nil, nil)
      result.tables[name].error = qerr
      say(("%-5s %-5s %12d %5d %12.3g %12.3g %9.3f%%  %d"):format(name, t.format, r, e.dim, qerr.max_abs, qerr.rms,
                                                                 100 * qerr.rel_rms, result.tables[name].bytes))
    end
    return true
  end
  local done, ok, why = pcall(write)
  if not done or not ok then
    w:abandon()
    return fail(done and why or tostring(ok))
  end
  local source_bytes = f:bytes()
  release()
  local closed, close_err = w:close()
  if not closed then return nil, "export: " .. close_err end
  local st = assert(ck.open(opts.out))
  result.path, result.bytes = opts.out, st:bytes()
  st:close()
  say(("model file: %s, %d bytes (the checkpoint: %d)"):format(opts.out, result.bytes, source_bytes))
  return result
end

return M
