-- ur.data: the data path.  Criteo raw TSV (parsed by the engine on every core), .npy day
-- files, synthetic data with a learnable signal, and the loader that turns any of them into
-- batches (uvmrec.data.Batch: dense, sparse a KJT, labels, groups; ur.data.Batch).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local C, check, must = lib.C, lib.check, lib.must

local M = {}
M.presets = require "uvmrec.data.presets"
M.NUM_DENSE, M.NUM_SPARSE = 13, 26

local out_tensor = ffi.new("ur_tensor *[1]")

-- ---- .npy ----

-- The parsed header of a .npy held in a string: {descr, shape, fortran_order, header_bytes}.
function M.npy_header(bytes, name)
  local info = ffi.new("ur_npy_info")
  local ok, err = check(C.ur_npy_parse_header(bytes, #bytes, name or "(string)", info), 2)
  if not ok then return nil, err end
  local shape = {}
  for i = 0, info.ndim - 1 do shape[i + 1] = tonumber(info.shape[i]) end
  return { descr = ffi.string(info.descr), shape = shape, fortran_order = info.fortran_order ~= 0,
           header_bytes = tonumber(info.header_bytes) }
end

-- A whole .npy as a host tensor (f32 for <f4, i32 for <i4, i64 for <u4 and <i8).
function M.npy_load(path)
  local ok, err = check(C.ur_npy_load(out_tensor, path), 2)
  if not ok then return nil, err end
  return tensor.wrap(out_tensor[0])
end

-- Writes a tensor (f32, i32, i64) as .npy; descr "<u4" saves an i32 tensor as unsigned ids.
function M.npy_save(path, t, descr)
  return check(C.ur_npy_save(path, lib.ptr(t, "npy_save tensor", 2), descr), 2)
end

-- ---- Criteo TSV ----

-- The TSV reader's 26 sizes (a number: the same for all), whole numbers from 1 to 2^32.
local function rows_list(rows, level)
  if rows == nil then return nil end
  if type(rows) == "number" then
    local r = {}
    for i = 1, 26 do r[i] = rows end
    rows = r
  end
  if type(rows) ~= "table" or #rows ~= 26 then
    error("criteo: rows must be 26 table sizes (one per categorical column) or one number", level + 1)
  end
  for i, r in ipairs(rows) do
    if type(r) ~= "number" or r < 1 or r > 2 ^ 32 or r ~= math.floor(r) then
      error(("criteo: rows of C%d is %s; table sizes are whole numbers from 1 to 2^32"):format(i, tostring(r)),
        level + 1)
    end
  end
  return rows
end

local TSV_OPTIONS = { "rows", "pad_missing_fields", "on_bad_line", "chunk_bytes" }

-- opts: rows (26 sizes or one), pad_missing_fields, on_bad_line ("fail" or "skip"), chunk_bytes;
-- any other key is refused, but extra (convert's days).  loader: the loader's options, which hold
-- its own keys too, and its rows, which it gives the engine as rows of any count (a size 0 keeps
-- the table's ids raw), not as the TSV reader's 26: they are left out here.
local function criteo_opts(opts, level, loader, extra)
  opts = opts or {}
  if type(opts) ~= "table" then error("criteo: options must be a table, got " .. type(opts), level + 1) end
  if not loader then
    local known = { unpack(TSV_OPTIONS) }
    known[#known + 1] = extra
    lib.known_keys(opts, known, "criteo", level + 1)
  end
  local cb = opts.chunk_bytes or 0
  if type(cb) ~= "number" or cb ~= math.floor(cb) or cb < 0 or cb > 2 ^ 40 then
    error(("criteo: chunk_bytes is %s; expected a whole number of bytes (0: the default, 16 MiB)"):format(
      tostring(cb)), level + 1)
  end
  local o = ffi.new("ur_criteo_opts")
  o.pad_missing_fields = opts.pad_missing_fields and 1 or 0
  local bad = opts.on_bad_line or "fail"
  if bad ~= "fail" and bad ~= "skip" then
    error("criteo: on_bad_line is '" .. tostring(bad) .. "'; expected fail or skip", level + 1)
  end
  o.skip_bad_lines = bad == "skip" and 1 or 0
  o.chunk_bytes = cb
  local rows = not loader and rows_list(opts.rows, level + 1)
  for i = 1, 26 do o.rows[i - 1] = rows and rows[i] or 0 end
  return o
end
M.criteo_opts = criteo_opts

-- The settings that take a bad line, as the config's keys given by --set (uvmrec train, uvmrec eval).
local CONFIG_SETS = { skip = "--set data.on_bad_line=skip", pad = "--set data.pad_missing_fields=true" }

-- A reader's error about a bad line of a TSV file, with the settings that would take the line,
-- in the caller's words: names = {skip = "--on-bad-line skip", pad = "--pad-missing-fields"} (a
-- command's flags; default: the config's keys, by --set).  Other errors come back as they are.
function M.bad_line_hint(err, names)
  names = names or CONFIG_SETS
  if type(err) ~= "string" or not err:find("criteo%-tsv: [^\n]-:%d+: ") then return err end
  local hints = {}
  if names.pad and err:find("fields; expected 40$") then
    hints[#hints + 1] = names.pad .. " accepts lines of 15 to 39 fields (copies that lost their trailing tabs)"
  end
  if names.skip then hints[#hints + 1] = names.skip .. " skips bad lines and counts them" end
  if #hints == 0 then return err end
  return err .. " (" .. table.concat(hints, "; ") .. ")"
end

local function path_list(paths, level)
  if type(paths) == "string" then paths = { paths } end
  if type(paths) ~= "table" or #paths == 0 then error("criteo: expected one or more paths", level + 1) end
  local arr = ffi.new("const char *[?]", #paths)
  for i, p in ipairs(paths) do arr[i - 1] = p end
  return arr, #paths, paths
end

local function stats_table(s)
  return { lines = tonumber(s.lines), rows = tonumber(s.rows), skipped = tonumber(s.skipped),
           padded = tonumber(s.padded), bytes = tonumber(s.bytes), seconds = s.seconds,
           first_skipped = s.skipped > 0 and ffi.string(s.first_skipped) or nil }
end

-- One line: {label, dense = 13 transformed values, cats = 26 raw ids, padded} or nil, err.
function M.parse_line(line, pad_missing_fields)
  local lb, d, c, p = ffi.new("int32_t[1]"), ffi.new("float[13]"), ffi.new("uint32_t[26]"), ffi.new("int32_t[1]")
  local ok, err = check(C.ur_criteo_parse_line(line, #line, pad_missing_fields and 1 or 0, lb, d, c, p), 2)
  if not ok then return nil, err end
  local r = { label = lb[0], dense = {}, cats = {}, padded = p[0] ~= 0 }
  for i = 0, 12 do r.dense[i + 1] = d[i] end
  for i = 0, 25 do r.cats[i + 1] = tonumber(c[i]) end
  return r
end

-- Every row of the files at once: {labels = i32 [N], dense = f32 [N,13], ids = i64 [N,26],
-- stats}; for tests and small files (the loader streams).
function M.read_tsv(paths, opts)
  local arr, n = path_list(paths, 2)
  local o = criteo_opts(opts, 2)
  local r = ffi.new("ur_criteo_reader *[1]")
  local ok, err = check(C.ur_criteo_open(r, arr, n, o), 2)
  if not ok then return nil, err end
  local reader = ffi.gc(r[0], C.ur_criteo_close)
  local chunk = 65536
  local lb, d, c = ffi.new("int32_t[?]", chunk), ffi.new("float[?]", chunk * 13), ffi.new("uint32_t[?]", chunk * 26)
  local got = ffi.new("int64_t[1]")
  local labels, dense, ids = {}, {}, {}
  local total = 0
  while true do
    ok, err = check(C.ur_criteo_read(reader, chunk, lb, d, c, got), 2)
    if not ok then return nil, err end
    local k = tonumber(got[0])
    if k == 0 then break end
    for i = 0, k - 1 do labels[total + i + 1] = lb[i] end
    for i = 0, k * 13 - 1 do dense[total * 13 + i + 1] = d[i] end
    for i = 0, k * 26 - 1 do ids[total * 26 + i + 1] = tonumber(c[i]) end
    total = total + k
  end
  local s = ffi.new("ur_criteo_stats")
  C.ur_criteo_stats_get(reader, s)
  local function fill(list, dtype, shape)
    local t = tensor.tensor(shape, { dtype = dtype })
    if #list > 0 then
      local buf = ffi.new(dtype == "f32" and "float[?]" or dtype == "i32" and "int32_t[?]" or "int64_t[?]", #list)
      for i = 1, #list do buf[i - 1] = list[i] end
      must(C.ur_tensor_write(t.p, 0, #list, buf))
    end
    return t
  end
  return { labels = fill(labels, "i32", { total }), dense = fill(dense, "f32", { total, 13 }),
           ids = fill(ids, "i64", { total, 26 }), stats = stats_table(s) }
end

-- TSV files to day files in out_dir (input i is day i unless days says otherwise).
function M.convert(paths, out_dir, opts)
  local arr, n, list = path_list(paths, 2)
  local o = criteo_opts(opts, 2, false, "days")
  local days
  if opts and opts.days ~= nil then
    -- Two inputs of one day would write the same files: the second's rows would replace the first's.
    local given = opts.days
    if type(given) ~= "table" or #given ~= n then
      error(("criteo convert: days is %s for %s; expected a list of one day number per input"):format(
        type(given) == "table" and "a list of " .. lib.things(#given, "number") or tostring(given),
        lib.things(n, "input")), 2)
    end
    days = ffi.new("int32_t[?]", n)
    local seen = {}
    for i = 1, n do
      local d = given[i]
      if type(d) ~= "number" or d ~= math.floor(d) or d < 0 or d > 2 ^ 31 - 1 then
        error(("criteo convert: days[%d] is %s; expected a whole number from 0"):format(i, tostring(d)), 2)
      end
      if seen[d] then
        error(("criteo convert: days[%d] and days[%d] are both %d; each input needs a day of its own"):format(
          seen[d], i, d), 2)
      end
      seen[d] = i
      days[i - 1] = d
    end
  else
    days = ffi.new("int32_t[?]", n)
    local named, seen = {}, {}
    for i, p in ipairs(list) do
      local d = p:match("day_(%d+)[^/]*$")
      d = d and tonumber(d)
      -- the int32_t would wrap it (day_4294967296 wrote day_-2147483648, which no loader reads)
      if d and d > 2 ^ 31 - 1 then
        error(("criteo convert: %s: its name gives day %s; days run from 0 to 2147483647 (give days = {...})")
          :format(p, ("%.0f"):format(d)), 2)
      end
      named[i] = d ~= nil
      days[i - 1] = d or i - 1
    end
    -- Two inputs of one day, by names or places, are refused: taking every input's place instead
    -- made day_1.tsv day 0 beside other.tsv, and over an older conversion's day 0.
    for i = 1, n do
      local d, j = days[i - 1], seen[days[i - 1]]
      if j then
        local function why(k)
          return named[k] and "by its name" or ("by its place: input %d, counting from 0"):format(k - 1)
        end
        error(("criteo convert: %s and %s would both be day %d (%s); give each input a day of its own with "
          .. "days = {...}"):format(list[j], list[i], d, named[j] and named[i] and "both by their names"
          or ("%s %s, %s %s"):format(list[j], why(j), list[i], why(i))), 2)
      end
      seen[d] = i
    end
  end
  local s = ffi.new("ur_criteo_stats")
  local ok, err = check(C.ur_criteo_convert(arr, n, s, o, out_dir, days), 2)
  if not ok then return nil, err end
  local st = stats_table(s)
  st.days = {}
  for i = 0, n - 1 do st.days[i + 1] = days[i] end
  return st
end

-- ---- metrics used by the data path ----

-- Exact ROC AUC of scores against 0/1 labels (ties count one half), from ranks.
function M.auc(scores, labels)
  local n = #scores
  local idx = {}
  for i = 1, n do idx[i] = i end
  table.sort(idx, function(a, b) return scores[a] < scores[b] end)
  local pos, neg, rank_sum = 0, 0, 0
  local i = 1
  while i <= n do
    local j = i
    while j < n and scores[idx[j + 1]] == scores[idx[i]] do j = j + 1 end
    local r = (i + j) / 2 -- average rank of the tie group
    for k = i, j do
      if labels[idx[k]] == 1 then
        pos = pos + 1
        rank_sum = rank_sum + r
      else
        neg = neg + 1
      end
    end
    i = j + 1
  end
  if pos == 0 or neg == 0 then return nil, "auc: needs both positive and negative labels" end
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)
end

-- ---- synthetic data and the loader ----
local synthetic = require "uvmrec.data.synthetic"
M.synthetic_spec = synthetic.spec
M.generate = synthetic.generate
M.hidden_auc = synthetic.hidden_auc
local loader = require "uvmrec.data.loader"
M.loader = loader.loader
M.open = loader.open
M.source = loader.source
M.Batch = require "uvmrec.data.batch"

return M
