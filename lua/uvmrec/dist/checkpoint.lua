-- uvmrec.dist.checkpoint: checkpoints of sharded embedding collections.  Each rank writes its
-- own blocks of the logical tables, with their optimizer state, to one safetensors file of a
-- checkpoint folder (atomically: uvmrec.checkpoint.save); rank 0 then writes the manifest
-- naming every logical table, its sharding, its blocks (file, tensor, rows, columns) and the
-- world size.  Loading reassembles each block the loading process holds from the saved blocks
-- that overlap it, so a checkpoint of W ranks loads on W ranks exactly, on W' ranks, under
-- another plan, or into one process's unsharded collection, every row bit for bit.
--
--   local dck = require "uvmrec.dist.checkpoint"
--   assert(dck.save("runs/a/ckpt-000000000100.shards", ebc))   -- every rank (a collective)
--   assert(dck.load("runs/a/ckpt-000000000100.shards", ebc2))  -- a Sharded or an EmbeddingBagCollection
--
-- The folder: rank-<r>-of-<W>.safetensors per rank and manifest.json, written last, after every
-- rank's file is complete: a folder without the manifest is an unfinished save.  Tensors are
-- named as parameters() names them: "C3" for a whole table, "C3[250:500,0:16]" for rows
-- [250, 500) and columns [0, 16) of it, and "<block>.<state>" for its optimizer state ("sum",
-- "exp_avg", "exp_avg_sq").  Data-parallel tables are written by rank 0 alone (every replica is
-- the same).  Shards that count their accesses (uvmrec.hints) save their counters too,
-- "<block>.counts" ("C3.counts.r<rank>" for each data-parallel replica, whose counts differ),
-- merged per logical row on load (counted_rows).  Several hosts need the folder on a file system
-- they share.  Every file of a save carries the save's id ("uvmrec.dist.save", drawn by rank 0),
-- as does the manifest: a rank file of another save at the same name (an earlier run's, on a
-- disk rank 0 sees but the rank that saved did not write to) is refused, not read.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local json = require "uvmrec.json"
local ck = require "uvmrec.checkpoint"
local hints = require "uvmrec.hints"
local C, check = lib.C, lib.check

-- FORMAT 2 manifests carry crc32c (below); format 1 ones, written before, load without it.
local M = { FORMAT = 2, MANIFEST = "manifest.json" }

-- The CRC32C of manifest m's canonical content (json.encode: keys sorted, no spaces) without its
-- crc32c, as 8 hex digits (lib.crc32c: the engine's, the safetensors files' checksum), or nil,
-- message where that content is not JSON (a manifest decoded from a hand-edited file).
local function content_crc(m)
  local said = m.crc32c
  m.crc32c = nil
  local ok, text = pcall(json.encode, m)
  m.crc32c = said
  if not ok then return nil, text end
  return lib.crc32c(text)
end

-- The text of manifest m as save writes it, sealed: format 2 and crc32c, the CRC32C of the rest,
-- which M.manifest checks before anything is read (a tool that edits a manifest seals it again
-- with this).
function M.manifest_text(m)
  m.format = M.FORMAT
  m.crc32c = assert(content_crc(m))
  return json.encode(m) .. "\n"
end

-- Blocks are named as the sharded collection names them in parameters().
local block_name = require("uvmrec.dist.sharded").block_name
M.block_name = block_name

local function is_sharded(ebc) return type(ebc) == "table" and type(ebc.blocks) == "function" and ebc.plan end

-- The blocks a process holds, its communicator and its collections: a Sharded collection's
-- (uvmrec.dist.sharded), or every whole table of an EmbeddingBagCollection (or of a uvmrec.tbe
-- collection).
local function holdings(ebc, level)
  if is_sharded(ebc) then
    local shapes = {}
    for name, p in pairs(ebc.plan.tables) do shapes[name] = { rows = p.rows, dim = p.dim, kind = p.kind } end
    return ebc:blocks(), ebc.comm, ebc.collections, ebc.plan.order, shapes
  end
  local t = type(ebc) == "table" and (ebc.tbe or (ebc.table_names and ebc)) or nil
  if not t or type(t.table_names) ~= "table" then
    error("dist.checkpoint: expected a sharded collection (dist.shard), an EmbeddingBagCollection or a "
      .. "uvmrec.tbe collection, got " .. tostring(ebc), level + 1)
  end
  local blocks, shapes = {}, {}
  for _, name in ipairs(t.table_names) do
    local rows, dim = t.rows[name], t.dims[name]
    blocks[#blocks + 1] = { name = name, shard = name, collection = t, kind = "whole", row0 = 0, rows = rows,
                            col0 = 0, cols = dim, table_rows = rows, table_dim = dim }
    shapes[name] = { rows = rows, dim = dim, kind = "whole" }
  end
  return blocks, nil, { t }, t.table_names, shapes
end

local function step_of(collections, level)
  local step
  for _, c in ipairs(collections) do
    local s = c:step()
    if step and s ~= step then
      error(("dist.checkpoint: this process's collections are at steps %d and %d; expected one step"):format(step, s),
        level + 1)
    end
    step = s
  end
  return step or 0
end

local function file_name(rank, world) return ("rank-%05d-of-%05d.safetensors"):format(rank, world) end

local function write_text(path, text)
  local ok, err = check(C.ur_file_write(path, text, #text))
  if not ok then return nil, "dist.checkpoint: " .. err end
  return true
end

-- Every rank's verdict: true where all succeeded, else nil and the first failing rank's message
-- (a collective).
local function agree(comm, ok, err)
  if not comm or comm.world == 1 then
    if ok then return true end
    return nil, err
  end
  local flag = tensor.tensor({ comm.world }, { dtype = "i32" })
  flag:fill(0)
  if not ok then flag:set(comm.rank, 1) end
  assert(comm:all_reduce(flag))
  assert(comm:wait())
  local bad = flag:totable()
  flag:free()
  for r = 1, #bad do
    if bad[r] ~= 0 then
      if r - 1 == comm.rank then return nil, err end
      return nil, ("dist.checkpoint: rank %d failed to save its blocks (its own message is on its output)")
        :format(r - 1)
    end
  end
  return true
end

-- The id of a save, rank 0's, on every rank: its clock to the nanosecond (a collective).
local function save_id(comm)
  local t = tensor.tensor({ 2 }, { dtype = "i64" })
  t:set(0, os.time())
  t:set(1, math.floor(C.ur_clock_seconds() * 1e9) % 2 ^ 52)
  if comm and comm.world > 1 then
    assert(comm:broadcast(t, 0))
    assert(comm:wait())
  end
  local v = t:totable()
  t:free()
  return ("%d-%d"):format(v[1], v[2])
end

-- What is wrong with a decoded manifest (below, with the block layouts it checks), or nil: save
-- checks the one it makes, load the one it reads.
local manifest_error

-- Saves `ebc` into the folder dir (made if missing): a collective, every rank calls it.
-- opts: meta (a table of strings and numbers, kept in the manifest), staging, stream.
-- Returns the manifest (a table) on every rank, or nil, message on every rank.
-- A shard its hint policy laid out hottest first (uvmrec.tbe's relayout: logical row id at
-- physical row perm[id]) is saved in logical row order, as every block is: t's rows gathered
-- through perm into a host copy (t freed).  Tensors not of one entry per row stay as they are.
local function logical_order(perm, t)
  local rows = perm:numel()
  if t:size(1) ~= rows or rows == 0 then return t end
  local h = assert(t:to("host"))
  local out = assert(tensor.tensor(t:size(), { dtype = t:dtype() }))
  if h ~= t then t:free() end
  local rb = out:nbytes() / rows
  local p = ffi.cast("const int64_t *", C.ur_tensor_data(perm.p))
  local src = ffi.cast("const uint8_t *", C.ur_tensor_data(h.p))
  local dst = ffi.cast("uint8_t *", C.ur_tensor_data(out.p))
  for id = 0, rows - 1 do ffi.copy(dst + id * rb, src + tonumber(p[id]) * rb, rb) end
  if h ~= out then h:free() end
  return out
end

function M.save(dir, ebc, opts)
  opts = opts or {}
  if type(dir) ~= "string" or dir == "" then error("dist.checkpoint save: dir must be a folder's path", 2) end
  local blocks, comm, collections, order, tables = holdings(ebc, 2)
  local W, me = comm and comm.world or 1, comm and comm.rank or 0
  local step = step_of(collections, 2)
  local ok, err = check(C.ur_dir_create(dir))
  if ok and me == 0 then
    -- a manifest left by an earlier save must not name files this save is replacing
    local old = dir .. "/" .. M.MANIFEST
    if C.ur_path_kind(old) ~= 0 then ok, err = os.remove(old) end
  end
  ok, err = agree(comm, ok, err)
  if not ok then return nil, err end
  local id = save_id(comm)
  local tensors, views, described, counted = {}, {}, {}, {}
  for _, b in ipairs(blocks) do
    local c = b.collection
    local name = block_name(b)
    -- the access counters (indexed by row id, so already in logical row order), by the rule of
    -- counted_rows: every replica its own, one column block of a table (each counts every lookup)
    local cok, cv = pcall(c.counts, c, b.shard)
    if cok and (b.replica or b.col0 == 0) then
      local cname = b.replica and ("%s.counts.r%d"):format(name, me) or name .. ".counts"
      tensors[cname], views[#views + 1] = cv, cv
      counted[#counted + 1] = { name = b.name, tensor = cname, row0 = b.row0, rows = b.rows, rank = me,
                                replica = b.replica, counting = c:counting(b.shard) }
    elseif cok then
      cv:free()
    end
    if not b.replica or me == 0 then
      local v = c:table(b.shard)
      local perm = c.permutation and c:permutation(b.shard)
      local hperm = perm and assert(perm:to("host"))
      if perm and hperm ~= perm then perm:free() end
      if hperm then v = logical_order(hperm, v) end
      tensors[name], views[#views + 1] = v, v
      local d = { name = b.name, tensor = name, row0 = b.row0, rows = b.rows, col0 = b.col0, cols = b.cols,
                  rank = me, dtype = v:dtype(), state = {} }
      for sname, st in pairs(c:state(b.shard)) do
        if hperm then st = logical_order(hperm, st) end
        tensors[name .. "." .. sname], views[#views + 1] = st, st
        d.state[sname] = name .. "." .. sname
      end
      if hperm then hperm:free() end
      described[#described + 1] = d
    end
  end
  local c1 = collections[1]
  local meta = { ["uvmrec.dist.blocks"] = json.encode(described), ["uvmrec.dist.counts"] = json.encode(counted),
                 ["uvmrec.dist.rank"] = me,
                 ["uvmrec.dist.world"] = W, ["uvmrec.step"] = step, ["uvmrec.dist.save"] = id }
  local path = dir .. "/" .. file_name(me, W)
  ok, err = ck.save(path, { tensors = tensors, meta = meta }, { staging = opts.staging, stream = opts.stream })
  for _, v in ipairs(views) do v:free() end
  ok, err = agree(comm, ok, err)
  if not ok then return nil, err end
  -- rank 0: the manifest, from every rank's file (each names its blocks)
  local manifest
  if me == 0 then
    manifest = { format = M.FORMAT, world = W, step = step, save = id, order = order, tables = {}, files = {},
                 optimizer = c1 and c1.optimizer, state = c1 and c1.state_names, meta = opts.meta }
    -- every rank has written its file into dir: where rank 0 does not see one, dir is a folder of
    -- each host's own disk (it failed opening the file, naming neither the folder nor the cause)
    local missing = {}
    for r = 1, W - 1 do
      if C.ur_path_kind(dir .. "/" .. file_name(r, W)) == 0 then missing[#missing + 1] = file_name(r, W) end
    end
    if #missing > 0 then
      local shown = table.concat(missing, ", ", 1, math.min(#missing, 3))
      ok, err = nil, ("dist.checkpoint: %s must be a folder every host shares (one file system): rank 0 does not "
        .. "see %d of the %d ranks' files the ranks wrote there (%s%s)"):format(dir, #missing, W, shown,
        #missing > 3 and (", and %d more"):format(#missing - 3) or "")
    end
    for r = 0, ok and W - 1 or -1 do
      local fname = file_name(r, W)
      local f, ferr = ck.open(dir .. "/" .. fname)
      if not f then ok, err = nil, ferr break end
      local theirs, at = f:meta("uvmrec.dist.save"), f:meta("uvmrec.step")
      if theirs ~= id then
        f:close()
        ok, err = nil, ("dist.checkpoint: %s/%s is another save's (step %s, save %s; this one is step %d, save %s): "
          .. "rank %d wrote its file where rank 0 does not see it, so %s must be a folder every host shares (one "
          .. "file system)"):format(dir, fname, tostring(at), tostring(theirs), step, id, r, dir)
        break
      end
      manifest.files[r + 1] = fname
      -- what rank r's file says it holds: blocks of this save's tables, then their counts (a
      -- file's counts follow its blocks; a replica's, rank 0's)
      local where = ("dist.checkpoint: rank %d's file %s/%s"):format(r, dir, fname)
      local function listed(k, known, default)
        local l, lerr = f:meta_json("uvmrec.dist." .. k, "list of objects",
          { where = where, default = default, what = ("the %s rank %d saved"):format(k, r) })
        for i, d in ipairs(l or {}) do
          if not known[d.name] then
            return nil, ("%s: uvmrec.dist.%s[%d] names %s; expected a table %s"):format(where, k, i,
              d.name == nil and "no table" or "table " .. json.encode(d.name),
              k == "blocks" and "of the collection saved" or "whose blocks a file of this save holds")
          end
        end
        return l, lerr
      end
      local held, counts
      held, err = listed("blocks", tables)
      for _, d in ipairs(held or {}) do
        local t = manifest.tables[d.name]
        if not t then
          local shape = tables[d.name]
          t = { rows = shape.rows, dim = shape.dim, dtype = d.dtype, kind = shape.kind, blocks = {} }
          manifest.tables[d.name] = t
        end
        d.file = fname
        t.blocks[#t.blocks + 1] = d
      end
      if held then counts, err = listed("counts", manifest.tables, {}) end
      for _, d in ipairs(counts or {}) do
        local t = manifest.tables[d.name]
        d.file = fname
        t.counts = t.counts or {}
        t.counts[#t.counts + 1] = d
      end
      if not counts then
        f:close()
        ok = nil
        break
      end
      f:close()
    end
    -- what load would refuse in the manifest the files make (a block's rows that are not a
    -- number) is named here, as there, not met as a Lua error below
    local merr = ok and manifest_error(manifest)
    if merr then
      ok, err = nil, ("dist.checkpoint: %s/%s: the blocks the ranks' files name (uvmrec.dist.blocks, "
        .. "uvmrec.dist.counts) make a manifest load refuses: %s"):format(dir, M.MANIFEST, merr)
    end
    for _, name in ipairs(ok and order or {}) do
      local t = manifest.tables[name]
      local area = 0
      for _, d in ipairs(t and t.blocks or {}) do area = area + d.rows * d.cols end
      if ok and (not t or area ~= t.rows * t.dim) then
        ok, err = nil, ("dist.checkpoint: the saved blocks of table '%s' cover %d of its %d x %d elements")
          :format(name, area, t and t.rows or 0, t and t.dim or 0)
      end
    end
    if ok then ok, err = write_text(dir .. "/" .. M.MANIFEST, M.manifest_text(manifest)) end
    if ok then
      -- files of an earlier save into this folder by another world size
      for _, n in ipairs(lib.dir_list(dir, "rank-", ".safetensors") or {}) do
        local w = tonumber(n:match("^rank%-%d+%-of%-(%d+)%.safetensors$"))
        if w and w ~= W then os.remove(dir .. "/" .. n) end
      end
    end
  end
  ok, err = agree(comm, ok, err)
  if not ok then return nil, err end
  return manifest or true
end

-- ---- block layouts ----

-- The merged column intervals {lo, hi, lo, hi, ...} of blocks `list` (sorted by col0), or nil and
-- a column two of them hold.
local function columns_of(list)
  local out = {}
  for _, h in ipairs(list) do
    local n = #out
    if n > 0 and h.col0 < out[n] then return nil, h.col0 end
    if n > 0 and h.col0 == out[n] then out[n] = h.col1 else out[n + 1], out[n + 2] = h.col0, h.col1 end
  end
  return out
end

-- The least column one of two lists of merged intervals holds and the other does not, or nil.
local function first_difference(a, b)
  for i = 1, math.max(#a, #b) do
    if a[i] ~= b[i] then return math.min(a[i] or b[i], b[i] or a[i]) end
  end
  return nil
end

-- Why `blocks` (a manifest's list, named `at`; each inside the rows x dim table) do not hold
-- every element of the table once, or nil.  By the blocks' horizontal edges, in O(n log n): at
-- each row where blocks start or end, those that start there overlap none of one another, nor
-- those that end there, and both hold the same columns (every column, at the first row and past
-- the last).  Then each column is held from the first row to the last by one chain of blocks,
-- each starting where the one before ends, and by no other block (one outside a column's chain
-- would start or end beside one in it, both holding that column).  Where that fails, the column
-- found is walked block by block to name the first element held twice or by none.
local function layout_error(at, blocks, rows, dim)
  if rows == 0 or dim == 0 then return nil end -- every block is empty: none is outside the table
  local starts, ends = {}, {}
  for i, d in ipairs(blocks) do
    if d.rows > 0 and d.cols > 0 then -- (an empty block holds nothing)
      local h = { i = i, d = d, row0 = d.row0, row1 = d.row0 + d.rows, col0 = d.col0, col1 = d.col0 + d.cols }
      starts[#starts + 1], ends[#ends + 1] = h, h
    end
  end
  table.sort(starts, function(a, b)
    if a.row0 ~= b.row0 then return a.row0 < b.row0 end
    if a.col0 ~= b.col0 then return a.col0 < b.col0 end
    return a.i < b.i
  end)
  table.sort(ends, function(a, b)
    if a.row1 ~= b.row1 then return a.row1 < b.row1 end
    if a.col0 ~= b.col0 then return a.col0 < b.col0 end
    return a.i < b.i
  end)
  local every, s, e, y, col = { 0, dim }, 1, 1, 0, nil
  while not col do
    local began, ended = {}, {}
    while starts[s] and starts[s].row0 == y do began[#began + 1], s = starts[s], s + 1 end
    while ends[e] and ends[e].row1 == y do ended[#ended + 1], e = ends[e], e + 1 end
    local bcols, twice = columns_of(began)
    local ecols, twice_above = columns_of(ended)
    col = twice or twice_above or first_difference(y == 0 and every or ecols, y == rows and every or bcols)
    if y == rows then break end
    y = math.min(rows, starts[s] and starts[s].row0 or rows, ends[e] and ends[e].row1 or rows)
  end
  if not col then return nil end
  local expected = ("expected every element of the %d x %d table in one block"):format(rows, dim)
  local function named(h) return ("%s[%d] (tensor '%s' of %s)"):format(at, h.i, h.d.tensor, h.d.file) end
  -- the blocks holding column col, by first row (starts' order)
  local g0, g1, last = 0, rows, nil
  for _, h in ipairs(starts) do
    if h.col0 <= col and col < h.col1 then
      if h.row0 < g0 then
        return ("%s and %s both hold rows [%d, %d), columns [%d, %d); %s"):format(named(last), named(h), h.row0,
          math.min(g0, h.row1), math.max(last.col0, h.col0), math.min(last.col1, h.col1), expected)
      end
      if h.row0 > g0 then g1 = h.row0 break end
      g0, last = h.row1, h
    end
  end
  assert(g0 < g1, "dist.checkpoint: the layout check found a column its walk finds held once")
  -- rows [g0, g1) of column col are in no block, nor are the columns around it that no block
  -- across those rows holds
  local c0, c1 = 0, dim
  for _, h in ipairs(starts) do
    if h.row0 < g1 and g0 < h.row1 then
      if h.col1 <= col then c0 = math.max(c0, h.col1) elseif h.col0 > col then c1 = math.min(c1, h.col0) end
    end
  end
  return ("%s hold no element of rows [%d, %d), columns [%d, %d); %s"):format(at, g0, g1, c0, c1, expected)
end

-- Why a table's saved access counters (`list`, named `at`, of a table of `rows` rows saved by
-- `world` ranks) do not fit, or nil: a row counted by two of a table- or row-wise table's (its
-- count is its one counter's; rows none holds are named by the load that needs them), or a
-- data-parallel replica's not of every row, of a rank past the world or twice.
local function counts_error(at, list, rows, world)
  local ranks, single = {}, {}
  for i, d in ipairs(list) do
    if d.replica then
      if d.row0 ~= 0 or d.rows ~= rows or d.rank >= world or ranks[d.rank] then
        return ("%s[%d] is rank %d's replica counters of rows [%d, %d); expected those of every row, [0, %d), one "
          .. "list a rank below %d"):format(at, i, d.rank, d.row0, d.row0 + d.rows, rows, world)
      end
      ranks[d.rank] = true
    elseif d.rows > 0 then
      single[#single + 1] = { i = i, d = d }
    end
  end
  table.sort(single, function(a, b)
    if a.d.row0 ~= b.d.row0 then return a.d.row0 < b.d.row0 end
    return a.i < b.i
  end)
  for k = 2, #single do
    local p, q = single[k - 1], single[k]
    if q.d.row0 < p.d.row0 + p.d.rows then
      return ("%s[%d] (tensor '%s' of %s) and %s[%d] (tensor '%s' of %s) both count rows [%d, %d); expected each "
        .. "row's count in one"):format(at, p.i, p.d.tensor, p.d.file, at, q.i, q.d.tensor, q.d.file, q.d.row0,
        math.min(p.d.row0 + p.d.rows, q.d.row0 + q.d.rows))
    end
  end
  return nil
end

-- What is wrong with a decoded manifest's fields (one edited by hand, or by another tool), or
-- nil: each must be as save writes it, every block inside its table and the blocks of each
-- table holding each of its elements once, before load reads a byte.
local function shown(v) return v == nil and "missing" or json.encode(v) end
local function whole(v, lo) return type(v) == "number" and v == math.floor(v) and v >= lo and v < 2 ^ 53 end
function manifest_error(m)
  local function bad(what, v, want) return ("%s is %s; expected %s"):format(what, shown(v), want) end
  if not whole(m.world, 1) then return bad("world", m.world, "a whole number >= 1") end
  if not whole(m.step, 0) then return bad("step", m.step, "a whole number >= 0") end
  if m.save ~= nil and type(m.save) ~= "string" then return bad("save", m.save, "a save's id") end
  if m.state ~= nil and type(m.state) ~= "table" then return bad("state", m.state, "a list of names") end
  for i, s in ipairs(m.state or {}) do
    if type(s) ~= "string" then return bad(("state[%d]"):format(i), s, "a name") end
  end
  -- each block's saved tensors (rows, state) its own: two blocks naming one (a manifest edited
  -- and sealed again) would load its rows twice and leave others' unread (counts lists: below)
  local used = {}
  local function once(where, file, name)
    local key = file .. "\0" .. name
    if used[key] then
      return ("%s names tensor '%s' of %s, which %s names too; expected each saved tensor in one place"):format(
        where, name, file, used[key])
    end
    used[key] = where
  end
  for name, t in pairs(m.tables) do
    local at = "tables." .. tostring(name)
    if type(t) ~= "table" then return bad(at, t, "a table's entry") end
    for _, k in ipairs { "rows", "dim" } do
      if not whole(t[k], 0) then return bad(at .. "." .. k, t[k], "a whole number >= 0") end
    end
    if type(t.dtype) ~= "string" then return bad(at .. ".dtype", t.dtype, "a dtype's name") end
    for _, list in ipairs { "blocks", "counts" } do
      local l = t[list]
      if (l ~= nil or list == "blocks") and type(l) ~= "table" then return bad(at .. "." .. list, l, "a list") end
      for i, d in ipairs(l or {}) do
        local bat = ("%s.%s[%d]"):format(at, list, i)
        if type(d) ~= "table" then return bad(bat, d, "a block's entry") end
        for _, k in ipairs { "file", "tensor" } do
          if type(d[k]) ~= "string" then return bad(bat .. "." .. k, d[k], "a name") end
        end
        local twice = list == "blocks" and once(bat, d.file, d.tensor)
        if twice then return twice end
        for _, k in ipairs(list == "blocks" and { "row0", "rows", "col0", "cols" } or { "row0", "rows", "rank" }) do
          if not whole(d[k], 0) then return bad(bat .. "." .. k, d[k], "a whole number >= 0") end
        end
        if d.row0 + d.rows > t.rows or list == "blocks" and d.col0 + d.cols > t.dim then
          return ("%s is rows [%d, %d)%s; the table is %d x %d"):format(bat, d.row0, d.row0 + d.rows,
            list == "blocks" and (", columns [%d, %d)"):format(d.col0, d.col0 + d.cols) or "", t.rows, t.dim)
        end
        if list == "blocks" then
          if type(d.state) ~= "table" then return bad(bat .. ".state", d.state, "a map of state names") end
          for _, s in ipairs(m.state or {}) do
            if type(d.state[s]) ~= "string" then return bad(bat .. ".state." .. s, d.state[s], "a name") end
            twice = once(bat .. ".state." .. s, d.file, d.state[s])
            if twice then return twice end
          end
        end
      end
    end
    local lerr = layout_error(at .. ".blocks", t.blocks, t.rows, t.dim)
      or counts_error(at .. ".counts", t.counts or {}, t.rows, m.world)
    if lerr then return lerr end
  end
  return nil
end

-- The manifest of a checkpoint folder, or nil, message.
function M.manifest(dir)
  if type(dir) ~= "string" then error("dist.checkpoint: dir must be a folder's path", 2) end
  local text = lib.read_file(dir .. "/" .. M.MANIFEST)
  if not text then
    if C.ur_path_kind(dir) ~= 2 then return nil, "dist.checkpoint: " .. dir .. " is not a folder" end
    return nil, ("dist.checkpoint: %s has no %s (an unfinished save, or not a sharded checkpoint)"):format(dir,
      M.MANIFEST)
  end
  local ok, m, jerr = pcall(json.decode, text)
  if not ok then m, jerr = nil, m end
  local function corrupted(got)
    return nil, ("dist.checkpoint: %s/%s says crc32c %s, but its content gives %s: the manifest is corrupted "
      .. "(or was edited and not sealed again: dist.checkpoint.manifest_text)"):format(dir, M.MANIFEST,
      shown(m.crc32c), got)
  end
  -- a flipped bit anywhere (a step of 100 read as 101) is refused before anything is applied,
  -- and before any field is read: one in "format":2 said format 3, one in the key "tables" not a
  -- manifest
  if type(m) == "table" and m.crc32c ~= nil then
    local got, cerr = content_crc(m)
    if got ~= m.crc32c then return corrupted(got or cerr) end
  end
  if type(m) ~= "table" or type(m.tables) ~= "table" then
    return nil, ("dist.checkpoint: %s/%s is not a manifest: %s"):format(dir, M.MANIFEST,
      jerr or "it holds no tables")
  end
  if m.format ~= M.FORMAT and m.format ~= 1 then
    return nil, ("dist.checkpoint: %s/%s has format %s; this build reads formats 1 and %d"):format(dir, M.MANIFEST,
      tostring(m.format), M.FORMAT)
  end
  -- a format 1 manifest (before the checksum) has none to check; a format 2 one without it lost
  -- it (the key's bits flipped)
  if m.format ~= 1 and m.crc32c == nil then
    local got, cerr = content_crc(m)
    return corrupted(got or cerr)
  end
  local merr = manifest_error(m)
  if merr then return nil, ("dist.checkpoint: %s/%s: %s"):format(dir, M.MANIFEST, merr) end
  return m
end

-- Copies the intersection of a saved block's rows and columns into a destination block.
-- dst: bytes of [rows, width] for the block {row0, rows, col0, cols}; src likewise; width is
-- cols for elementwise data and 1 (with equal columns) for a row's state.  Returns the
-- elements copied.
local function copy_overlap(dst, db, dw, src, sb, sw, es, rowwise)
  local r0, r1 = math.max(db.row0, sb.row0), math.min(db.row0 + db.rows, sb.row0 + sb.rows)
  if r1 <= r0 then return 0 end
  local n, dc, sc
  if rowwise then
    n, dc, sc = dw, 0, 0
  else
    local c0, c1 = math.max(db.col0, sb.col0), math.min(db.col0 + db.cols, sb.col0 + sb.cols)
    if c1 <= c0 then return 0 end
    n, dc, sc = c1 - c0, c0 - db.col0, c0 - sb.col0
  end
  if n == dw and n == sw then -- whole rows on both sides: one copy
    ffi.copy(dst + (r0 - db.row0) * dw * es, src + (r0 - sb.row0) * sw * es, (r1 - r0) * n * es)
  else
    for r = r0, r1 - 1 do
      ffi.copy(dst + ((r - db.row0) * dw + dc) * es, src + ((r - sb.row0) * sw + sc) * es, n * es)
    end
  end
  return (r1 - r0) * n
end

local function bytes(t) return ffi.cast("uint8_t *", C.ur_tensor_data(lib.ptr(t, "tensor", 3))) end

-- How many rows (or columns) [lo1, lo1 + n1) and [lo2, lo2 + n2) share; whether two blocks
-- {row0, rows, col0, cols} are the same rows and columns.
local function shared(lo1, n1, lo2, n2) return math.max(0, math.min(lo1 + n1, lo2 + n2) - math.max(lo1, lo2)) end
local function same_block(a, b)
  return a.row0 == b.row0 and a.rows == b.rows and a.col0 == b.col0 and a.cols == b.cols
end

-- The message of a load that failed writing blocks[done + 1] (or, every block written, emptying
-- a cache or dropping the far rows' copies, before the step is set), with err: which blocks hold
-- the checkpoint's rows, which may hold some of them and which are as they were (blocks are
-- written in order, each whole: rows, state, row order, counters), and the collections' step,
-- which was `step` and still is.
local function partly_loaded(where, blocks, done, err, step)
  local function names(from, to)
    local out = {}
    for k = from, to do
      if to - from < 12 or k < from + 6 or k > to - 3 then
        out[#out + 1] = ("'%s'"):format(block_name(blocks[k]))
      elseif k == from + 6 then
        out[#out + 1] = ("... (%d in all)"):format(to - from + 1)
      end
    end
    return table.concat(out, ", ")
  end
  local n, parts = #blocks, {}
  if done > 0 then
    parts[#parts + 1] = ("%s hold%s the checkpoint's rows and state"):format(names(1, done), done == 1 and "s" or "")
  end
  if done < n then parts[#parts + 1] = ("%s may hold some of them"):format(names(done + 1, done + 1)) end
  if done + 1 < n then
    parts[#parts + 1] = ("%s %s"):format(names(done + 2, n), done + 2 == n and "is as it was" or "are as they were")
  end
  local what = done < n and "writing " .. names(done + 1, done + 1)
    or "emptying a cache or dropping the far rows' copies, every block written"
  return ("%s: %s failed (%s); the collection is partly loaded: %s, and its step is still %d: load a checkpoint "
    .. "into it again before using it"):format(where, what, tostring(err), table.concat(parts, ", "), step)
end

-- The ceiling of an access counter (uvmrec.tbe: counters stop growing at 2^30); merged counts
-- are held to it too.
local COUNT_MAX = 2 ^ 30

-- The access counters of block b (logical rows [b.row0, b.row0 + b.rows)) from the saved ones
-- of its table (t.counts: {file, tensor, row0, rows, rank, replica, counting}): a host i32 [b.rows]
-- and whether they were counting, or nil where the checkpoint holds none (saved before counts
-- were, or from tables that never counted).  The merge rule (docs/distributed.md): a row's
-- count is the sum of the saved counters of it.  Table- and row-wise shards count disjoint rows
-- and column-wise tables save one column block's (every column block counts every lookup of its
-- rows), so there a row has one saved counter; data-parallel replicas count only their own rank's
-- lookups, so a row's count is the replicas' sum: in every case what one process's unsharded
-- table counts over the same global batches.  A replica in a loading world of W data-parallel
-- ranks takes its rank's saved counters where the checkpoint's world had W replicas too, else
-- an even share of the sum (floor(n / W), one more on n mod W of the ranks, in turns by row),
-- so that the replicas' sum, which the next save merges, is the count again.
-- view(d, d.tensor) gives saved counter d's tensor (the load frees it); W and me are the loading
-- world and rank.
local function counted_rows(where, m, b, view, W, me)
  local saved = m.tables[b.name].counts
  if not saved or #saved == 0 then return nil end
  local replicas = 0
  for _, d in ipairs(saved) do
    if d.replica then replicas = replicas + 1 end
  end
  if replicas > 0 and (replicas ~= m.world or replicas ~= #saved) then
    error(("%s: table '%s' has the access counts of %d data-parallel replicas and %d other blocks; expected one "
      .. "replica's per rank, %d"):format(where, b.name, replicas, #saved - replicas, m.world), 0)
  end
  -- a replica of a world as large as the saving one: its rank's own counters
  local exact = b.replica and replicas > 0 and W == m.world
  local sum = ffi.new("double[?]", b.rows)
  local got, counting = 0, false
  for _, d in ipairs(saved) do
    local r0, r1 = math.max(b.row0, d.row0), math.min(b.row0 + b.rows, d.row0 + d.rows)
    if r1 > r0 and (not exact or d.rank == me) then
      local v = view(d, d.tensor)
      if v:dtype() ~= "i32" or v:numel() ~= d.rows then
        local dtype, shape = v:dtype(), table.concat(v:size(), " x ")
        error(("%s: table '%s' has access counts '%s' of rows [%d, %d) as %s [%s] in %s; expected i32 [%d]")
          :format(where, b.name, d.tensor, d.row0, d.row0 + d.rows, dtype, shape, d.file, d.rows), 0)
      end
      local c = ffi.cast("const int32_t *", C.ur_tensor_data(v.p))
      for r = r0, r1 - 1 do sum[r - b.row0] = sum[r - b.row0] + c[r - d.row0] end
      if not d.replica then got = got + (r1 - r0) end
      counting = counting or d.counting
    end
  end
  if replicas == 0 and got ~= b.rows then
    error(("%s: the access counts of table '%s' give %d of the %d rows [%d, %d)"):format(where, b.name, got, b.rows,
      b.row0, b.row0 + b.rows), 0)
  end
  local share = b.replica and not exact and W or 1
  local out = assert(tensor.tensor({ b.rows }, { dtype = "i32" }))
  local o = ffi.cast("int32_t *", C.ur_tensor_data(out.p))
  for i = 0, b.rows - 1 do
    local n = math.min(sum[i], COUNT_MAX)
    local q = math.floor(n / share)
    o[i] = q + (((i + me) % share) < n - q * share and 1 or 0)
  end
  return out, counting
end

-- The open file of saved block d (files: those opened, by name), whose tensor tname must be, given
-- a dtype, that dtype and d.rows x w elements for one of the widths, as manifest m says (so that
-- no copy reads past it).  Raises the message naming the tensor, its file and what it should be.
-- A file opened here must carry the manifest's save id, step and world, which save wrote into
-- both (a rank file of another save, or a manifest that says another step: both values named).
-- Also returns the tensor's element count (given a dtype).
local function saved_file(files, dir, m, d, tname, where, dtype, widths)
  local f = files[d.file]
  if not f then
    local ferr
    f, ferr = ck.open(dir .. "/" .. d.file)
    if not f then error(ferr, 0) end
    -- a sealed manifest's rank files were saved with the checksum of their header, which opening
    -- checked, and of each tensor: a file without them (a key's bits flipped) would have what
    -- its header says trusted unchecked (the save, step and world below, the tensors' shapes and
    -- offsets), and its bytes read unchecked
    for _, k in ipairs(m.crc32c and { "uvmrec.header_crc32c", "uvmrec.crc32c" } or {}) do
      if not f:meta(k) then
        f:close()
        error(("%s: %s has no %s, which save writes into every rank file: %s cannot be verified; expected a "
          .. "file of the manifest's save"):format(where, d.file, k, k == "uvmrec.crc32c" and "its tensors' bytes"
          or "what its header says"), 0)
      end
    end
    -- a manifest with an id reads only its save's files (one without: written before ids were)
    local got = f:meta("uvmrec.dist.save")
    if m.save and got ~= m.save then
      f:close()
      error(("%s: %s is another save's (save %s; the manifest's is %s): not read"):format(where, d.file,
        tostring(got), m.save), 0)
    end
    files[d.file] = f
    for _, k in ipairs { "step", "world" } do
      local key = k == "step" and "uvmrec.step" or "uvmrec.dist.world"
      local said = f:meta(key)
      if said and tonumber(said) ~= m[k] then
        error(("%s: %s has %s %s, but the manifest's %s is %s; expected one save's"):format(where, d.file, key, said,
          k, tostring(m[k])), 0)
      end
    end
  end
  local info = f:info(tname)
  if not info then error(("checkpoint: %s has no tensor '%s'"):format(f:path(), tname), 0) end
  if not dtype then return f end
  local numel = 1
  for _, n in ipairs(info.shape) do numel = numel * n end
  local sized, want = false, {}
  for i, w in ipairs(widths) do
    sized = sized or numel == d.rows * w
    want[i] = w == 1 and ("[%d]"):format(d.rows) or ("[%d x %d]"):format(d.rows, w)
  end
  if info.dtype ~= dtype or not sized then
    local got = ("%s [%s]"):format(info.dtype, table.concat(#info.shape > 0 and info.shape or { 1 }, " x "))
    error(("%s: tensor '%s' of %s is %s; its block in the manifest needs %s %s"):format(where, tname, d.file,
      got, dtype, table.concat(want, " or ")), 0)
  end
  return f, numel
end

-- The logical tables of a checkpoint folder read a block of rows at a time from the saved blocks
-- that hold them, none of them whole in memory (uvmrec export of a run over ranks):
--   local r = assert(dck.reader(dir))
--   local rows = assert(r:rows("C3", 0, 4096))   -- a host tensor [4096, dim] of the table's dtype
--   r:close()
-- Each saved tensor read is checked against the manifest as load checks it, and its bytes against
-- their checksum as f:read_part checks them (a table read from its first row to its last, in
-- order, with no second read).
local reader_methods = {}
local Reader = { __index = reader_methods }

function M.reader(dir)
  local m, err = M.manifest(dir)
  if not m then return nil, err end
  return setmetatable({ dir = dir, manifest = m, files = {}, where = "dist.checkpoint: " .. dir }, Reader)
end

-- Rows [row0, row0 + rows) of table `name`, every column: into `into` (a host tensor [rows, dim]
-- of the table's dtype, reused from block to block) or a new host tensor; nil, message.
function reader_methods:rows(name, row0, rows, into)
  local t = self.manifest.tables[name]
  if not t then return nil, ("%s has no table '%s'"):format(self.where, tostring(name)) end
  if row0 < 0 or rows < 0 or row0 + rows > t.rows then
    error(("dist.checkpoint reader: rows [%d, %d) of table '%s', which has %d"):format(row0, row0 + rows, name,
      t.rows), 2)
  end
  if into and (into:dtype() ~= t.dtype or into:numel() ~= rows * t.dim) then
    error(("dist.checkpoint reader: rows [%d, %d) of table '%s' are %s [%d x %d]; into is %s [%s]"):format(row0,
      row0 + rows, name, t.dtype, rows, t.dim, into:dtype(), table.concat(into:size(), " x ")), 2)
  end
  local out, oerr = into, nil
  if not out then out, oerr = tensor.tensor({ rows, t.dim }, { dtype = t.dtype }) end
  if not out then return nil, oerr end
  local db = { row0 = row0, rows = rows, col0 = 0, cols = t.dim }
  local es = rows * t.dim > 0 and out:nbytes() / (rows * t.dim) or 0
  local ok, err = pcall(function()
    local got = 0
    for _, d in ipairs(t.blocks) do
      local r0, r1 = math.max(row0, d.row0), math.min(row0 + rows, d.row0 + d.rows)
      if r1 > r0 and d.cols > 0 then
        local f = saved_file(self.files, self.dir, self.manifest, d, d.tensor, self.where, t.dtype, { d.cols })
        -- a block of whole rows is read into place; a column block's rows through a part
        local full_rows = d.cols == t.dim
        local part = full_rows and out:view(r0 - row0, r1 - r0) or assert(tensor.tensor({ r1 - r0, d.cols },
                                                                                     { dtype = t.dtype }))
        local rok, rerr = f:read_part(d.tensor, part, (r0 - d.row0) * d.cols * es)
        if rok and full_rows then
          got = got + (r1 - r0) * d.cols
        elseif rok then
          got = got + copy_overlap(bytes(out), db, t.dim, bytes(part),
                                   { row0 = r0, rows = r1 - r0, col0 = d.col0, cols = d.cols }, d.cols, es, false)
        end
        part:free()
        if not rok then error(rerr, 0) end
      end
    end
    if got ~= rows * t.dim then
      error(("%s: the blocks of table '%s' give %d of the %d elements of rows [%d, %d)"):format(self.where, name,
        got, rows * t.dim, row0, row0 + rows), 0)
    end
  end)
  if not ok then
    if out ~= into then out:free() end
    return nil, err
  end
  return out
end

function reader_methods:close()
  for _, f in pairs(self.files) do f:close() end
  self.files = {}
end

-- Loads a checkpoint folder into `ebc` (a Sharded collection, an EmbeddingBagCollection or a
-- uvmrec.tbe collection): every block it holds is reassembled from the saved blocks that
-- overlap it, with its optimizer state, and the collections' step is the checkpoint's.  Not a
-- collective: each process reads the files it needs.  Everything that can be checked is checked
-- before anything is written: the manifest (its checksum, its fields, each table's blocks
-- holding every element once), every table's shape and dtype and the optimizer against it, and
-- every saved tensor read (its file's header checksum, its dtype and size, its bytes against
-- their checksum); the host memory the copies need is taken then too.  What can fail after that
-- is a copy (a device's): the collection is then partly loaded, which the message says, naming
-- the blocks written and those not (a copy of the whole collection to roll back to would double
-- its memory: 100 GB of tables over 8 ranks, another 12.5 GB and the optimizer's state a rank).
-- Returns the manifest, or nil, message.
function M.load(dir, ebc, opts)
  opts = opts or {}
  local m, err = M.manifest(dir)
  if not m then return nil, err end
  local blocks, comm, collections = holdings(ebc, 2)
  local where = ("dist.checkpoint: %s"):format(dir)
  -- checks first
  local held = {}
  for _, b in ipairs(blocks) do
    local t = m.tables[b.name]
    if not t then return nil, ("%s has no table '%s'"):format(where, b.name) end
    if t.rows ~= b.table_rows or t.dim ~= b.table_dim then
      return nil, ("%s: table '%s' is %d x %d there and %d x %d here"):format(where, b.name, t.rows, t.dim,
        b.table_rows, b.table_dim)
    end
    -- (a table whose rows a cache lost refuses its view: named, nothing written)
    local ok, v = pcall(b.collection.table, b.collection, b.shard)
    if not ok then return nil, ("%s: %s"):format(where, tostring(v):gsub("^[^:]*:%d+: ", "")) end
    local dtype = v:dtype()
    v:free()
    if t.dtype ~= dtype then
      return nil, ("%s: table '%s' is %s there and %s here"):format(where, b.name, t.dtype, dtype)
    end
    held[b.name] = true
  end
  if not is_sharded(ebc) and not opts.partial then -- a sharded collection's rank holds some tables
    for name in pairs(m.tables) do
      if not held[name] then return nil, ("%s holds table '%s', which this collection lacks"):format(where, name) end
    end
  end
  local c1 = collections[1]
  local mine = table.concat(c1 and c1.state_names or {}, ", ")
  local theirs = table.concat(m.state or {}, ", ")
  -- the same state names are not enough: adagrad's sum is a value an element, rowwise_adagrad's
  -- one a row (found only while copying, after a table was written)
  if mine ~= theirs or (c1 and m.optimizer ~= c1.optimizer) then
    return nil, ("%s: the optimizer state there is {%s} (%s) and here {%s} (%s)"):format(where, theirs,
      tostring(m.optimizer), mine, tostring(c1 and c1.optimizer))
  end
  local files, views = {}, {}
  -- saved block d's tensor tname, checked as saved_file checks it, and its bytes against their
  -- checksum the first time (before anything is written); one view of it, freed when the load ends
  local function view(d, tname, dtype, widths)
    local f = saved_file(files, dir, m, d, tname, where, dtype, widths)
    local key = d.file .. "/" .. tname
    if not views[key] then
      local bad = f:verify({ tname }, { allow_nonfinite = true })
      if bad then error(bad, 0) end
      views[key] = assert(f:view(tname))
    end
    return views[key]
  end
  -- The plan of every block this process holds: the saved tensors it takes its rows and each
  -- state from (those that overlap it, read once against their checksums), the access counters
  -- (merged), and host memory to reassemble it in (one buffer a dtype, the largest block's; a
  -- block saved as it is held is copied straight from its file), all before anything is written.
  local plans, counts, staging, made, dsts = {}, {}, {}, {}, {}
  local ok, perr = pcall(function()
    local need = {}
    for i, b in ipairs(blocks) do
      local t = m.tables[b.name]
      local p = { rows = {}, states = {} }
      plans[i] = p
      local got = 0
      for _, d in ipairs(t.blocks) do
        local nr, nc = shared(d.row0, d.rows, b.row0, b.rows), shared(d.col0, d.cols, b.col0, b.cols)
        if nr > 0 and nc > 0 then
          p.rows[#p.rows + 1] = { d = d, v = view(d, d.tensor, t.dtype, { d.cols }) }
          got = got + nr * nc
        end
      end
      assert(got == b.rows * b.cols, "dist.checkpoint: the layout check passed blocks that leave elements out")
      if #p.rows == 1 and same_block(p.rows[1].d, b) then
        p.direct = p.rows[1].v:view_as(0, { b.rows, b.cols })
        made[#made + 1] = p.direct
      else
        need[t.dtype] = math.max(need[t.dtype] or 0, b.rows * b.cols)
      end
      -- the optimizer state: per element ([rows, cols]) or per row ([rows]: rowwise Adagrad's sum
      -- of the whole row, the same in every column block of a row, so taken from the block that
      -- holds this one's first column)
      for sname, dst in pairs(b.collection:state(b.shard)) do
        dsts[#dsts + 1] = dst
        local st = { dst = dst, dw = dst:numel() / b.rows, from = {} }
        local sgot = 0
        for _, d in ipairs(t.blocks) do
          local nr, nc = shared(d.row0, d.rows, b.row0, b.rows), shared(d.col0, d.cols, b.col0, b.cols)
          if nr > 0 then
            local _, numel = saved_file(files, dir, m, d, d.state[sname], where, dst:dtype(), { d.cols, 1 })
            local sw = numel / d.rows
            local rowwise = st.dw ~= b.cols or sw ~= d.cols
            if rowwise and d.col0 <= b.col0 and b.col0 < d.col0 + d.cols or not rowwise and nc > 0 then
              if rowwise and st.dw ~= sw then
                error(("%s: table '%s' keeps its optimizer state '%s' with %d values a row there and %d here")
                  :format(where, b.name, sname, sw, st.dw), 0)
              end
              st.from[#st.from + 1] = { d = d, v = view(d, d.state[sname], dst:dtype(), { d.cols, 1 }), sw = sw,
                                        rowwise = rowwise }
              sgot = sgot + nr * (rowwise and st.dw or nc)
            end
          end
        end
        assert(sgot == dst:numel(), "dist.checkpoint: the layout check passed blocks that leave state out")
        local one = st.from[1]
        if #st.from == 1 and same_block(one.d, b) and one.sw == st.dw then
          st.direct = one.v
        else
          need[dst:dtype()] = math.max(need[dst:dtype()] or 0, dst:numel())
        end
        p.states[#p.states + 1] = st
      end
    end
    local W, me = comm and comm.world or 1, comm and comm.rank or 0
    for i, b in ipairs(blocks) do
      local c, counting = counted_rows(where, m, b, view, W, me)
      if c then counts[i] = { tensor = c, counting = counting } end
    end
    for dtype, n in pairs(need) do
      local buf, berr = tensor.tensor({ n }, { dtype = dtype })
      if not buf then
        error(("%s: %s (host memory to reassemble the blocks in: %d elements of %s; nothing written)"):format(where,
          berr, n, dtype), 0)
      end
      staging[dtype] = buf
    end
    for i, b in ipairs(blocks) do
      local p = plans[i]
      if not p.direct then
        p.host = staging[m.tables[b.name].dtype]:view_as(0, { b.rows, b.cols })
        made[#made + 1] = p.host
      end
      for _, st in ipairs(p.states) do
        if not st.direct then
          st.host = staging[st.dst:dtype()]:view_as(0, { st.dst:numel() })
          made[#made + 1] = st.host
        end
      end
    end
  end)
  -- then the writes, block by block, each whole once written (rows, state, row order, counters):
  -- only a copy can fail now (a device's), and if one does, what is written is named
  local step, done, writing = c1 and c1:step() or 0, 0, ok
  local function raised(v, e) -- a failure's own message (assert may add a position)
    if not v then error(e, 0) end
    return v
  end
  if ok then ok, perr = pcall(function()
    for i, b in ipairs(blocks) do
      local c, p = b.collection, plans[i]
      if not p.direct then
        local es = tensor.dtype_bytes(m.tables[b.name].dtype)
        for _, r in ipairs(p.rows) do copy_overlap(bytes(p.host), b, b.cols, bytes(r.v), r.d, r.d.cols, es, false) end
      end
      raised(c:load(b.shard, p.direct or p.host, opts.stream))
      for _, st in ipairs(p.states) do
        if not st.direct then
          local es = tensor.dtype_bytes(st.dst:dtype())
          for _, f in ipairs(st.from) do
            copy_overlap(bytes(st.host), b, st.dw, bytes(f.v), f.d, f.sw, es, f.rowwise)
          end
        end
        raised(st.dst:copy(st.direct or st.host, opts.stream))
      end
      -- the rows came in logical order: a shard laid out by a hint policy is laid out as they are
      local perm = c.permutation and c:permutation(b.shard)
      if perm then
        perm:free()
        raised(c:set_permutation(b.shard, nil))
      end
      if counts[i] then raised(hints.set_counts(c, b.shard, counts[i].tensor, counts[i].counting)) end
      done = i
    end
    -- the step last, once nothing else can fail: a failure before says the step is as it was
    for _, c in ipairs(collections) do
      if c.cache then raised(c.cache:invalidate()) end
      raised(c:far_refresh()) -- its far rows' copies (early ones too) are older than the rows now
    end
    for _, c in ipairs(collections) do c:set_step(m.step) end
  end) end
  for _, f in pairs(files) do f:close() end
  for _, v in pairs(views) do v:free() end
  for _, list in ipairs { made, dsts } do
    for _, t in ipairs(list) do t:free() end
  end
  for _, t in pairs(staging) do t:free() end
  for _, c in pairs(counts) do c.tensor:free() end
  if not ok and writing then perr = partly_loaded(where, blocks, done, perr, step) end
  if not ok then return nil, perr end
  return m
end

return M
