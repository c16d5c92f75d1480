-- `uvmrec convert`: Criteo raw TSV (plain or .gz) to binary day files in the layout of the
-- public DLRM references: day_N_dense.npy (<f4 [N,13], already log(x+1) of the clamped
-- integers), day_N_sparse.npy (<i4 ids mod rows when every size is at most 2^31, else <u4 ids
-- mod rows, or raw without rows),
-- day_N_labels.npy (<i4 [N]).  Input i is day i (from 0), or day K when its name holds day_K, or
-- the day --days gives it; two inputs of one day are refused.  Its options
-- are declared below (`uvmrec convert --help`).  Also runs as `luajit scripts/convert.lua ...`
-- with the paths from `make -s env`.
local ur = require "uvmrec"
local data = ur.data

-- Table sizes: 26, or one for all, each a whole number of rows from 1 to 2^32.
local function rows(list)
  if #list ~= 1 and #list ~= 26 then return nil, ("%d sizes; give 26 or one"):format(#list) end
  for i, r in ipairs(list) do
    if not (r >= 1 and r <= 2 ^ 32 and r == math.floor(r)) then
      return nil, ("size %d is %s; table sizes are whole numbers from 1 to 2^32"):format(i, tostring(r))
    end
  end
  return #list == 1 and list[1] or list
end

-- The table sizes of a preset or config.
local function config_rows(name)
  local spec, err = require("uvmrec.data.synthetic").resolve(name)
  if not spec then return nil, tostring(err) end
  if #spec.tables ~= 26 then return nil, ("%d tables; Criteo has 26"):format(#spec.tables) end
  local out = {}
  for t = 1, 26 do out[t] = spec.tables[t].rows end
  return out
end

local cmd = require("uvmrec.cli").command {
  name = "convert",
  summary = "convert Criteo TSV files (plain or .gz) to the binary day files of the DLRM references",
  { "INPUT...", "Criteo TSV files: input i is day i (from 0), or day K when its name holds day_K; two inputs of "
    .. "one day are refused (give --days)" },
  { "--out DIR", "where day_N_{dense,sparse,labels}.npy go (created if missing)", required = true },
  { "--config CONFIG", "table sizes from a preset (kaggle, mlperf_v1, ...) or a config file; ids are taken "
    .. "mod rows", key = "rows_config", check = config_rows },
  { "--rows R1,...,R26", "table sizes (one number: the same for all); ids are taken mod rows", type = "numbers",
    check = rows },
  { "--on-bad-line MODE", "fail (stop at the first bad line) or skip (count them)", choices = { "fail", "skip" },
    default = "fail" },
  { "--pad-missing-fields", "accept lines of 15..39 fields as having empty trailing fields" },
  { "--days D1,D2,...", "the day of each input, in order: distinct whole numbers from 0 (day_D*.npy)",
    type = "numbers" },
  mutex = { { "--config", "--rows" } },
}
local o = cmd:parse(arg)
local inputs, out = o.input, o.out
local opts = { rows = o.rows or o.rows_config, on_bad_line = o.on_bad_line, pad_missing_fields = o.pad_missing_fields,
               days = o.days }
if o.days and #o.days ~= #inputs then
  local things = require("uvmrec.lib").things
  cmd:misuse(("--days gives %s for %s; expected one day per input"):format(things(#o.days, "day"),
    things(#inputs, "input")))
end
-- Every input is there before anything is made; the day files appear only when all converted.
for _, path in ipairs(inputs) do
  local f, ferr = io.open(path, "rb")
  if not f then cmd:fail(ferr) end
  f:close()
end
local existed = ur.C.ur_path_kind(out) ~= 0
local made, merr = require("uvmrec.lib").check(ur.C.ur_dir_create(out))
if not made then cmd:fail(merr) end

-- convert raises what it refuses in its arguments (days, and inputs of one day): said as its errors are
local ok, st, err = pcall(data.convert, inputs, out, opts)
if not ok then
  if type(st) ~= "string" or not st:find("^criteo") then error(st, 0) end
  st, err = nil, st
end
if not st then
  err = err:gsub("days = {%.%.%.}", "--days D1,D2,...")
  if not existed then os.remove(out) end -- the folder made for it, left empty
  cmd:fail(data.bad_line_hint(err, { skip = "--on-bad-line skip", pad = "--pad-missing-fields" }))
end

-- The sparse files' dtype as the engine chose it (<u4 when a size passes 2^31 or none is given).
local function sparse_descr(day)
  local f = assert(io.open(("%s/day_%d_sparse.npy"):format(out, day), "rb"))
  local info = assert(data.npy_header(f:read(4096)))
  f:close()
  return info.descr
end

-- README.txt says what the files hold now: a day converted again gets its line rewritten (an
-- appended one beside the old said two things of one day), other days' lines and other text stay.
local readme = out .. "/README.txt"
local said, lines = {}, {}
for k, path in ipairs(inputs) do
  said[st.days[k]] = ("day_%d_*.npy from %s: dense <f4 [N,13] = log(max(x,0)+1) of I1..I13 (empty = 0); "
    .. "sparse %s [N,26] = C1..C26 hex as uint32%s; labels <i4 [N]"):format(st.days[k], path,
    sparse_descr(st.days[k]), opts.rows and " mod rows (" .. (type(opts.rows) == "table"
    and table.concat(opts.rows, ",") or opts.rows) .. ")" or " (raw)")
end
local now, days = {}, {}
for day in pairs(said) do now[day] = true end
for line in ((require("uvmrec.lib").read_file(readme)) or ""):gmatch("[^\n]+") do
  local day = tonumber(line:match("^day_(%d+)_%*%.npy from "))
  if not day then lines[#lines + 1] = line
  elseif not now[day] then said[day] = line end -- a day's last line, where an older README has two
end
for day in pairs(said) do days[#days + 1] = day end
table.sort(days)
for _, day in ipairs(days) do lines[#lines + 1] = said[day] end
local tmp = readme .. ".tmp"
local f, ferr = io.open(tmp, "wb")
local written = f and f:write(table.concat(lines, "\n"), "\n") and f:close()
if f and not written then ferr = tmp .. ": write failed" end
if written then written, ferr = os.rename(tmp, readme) end
if not written then cmd:fail(ferr) end

print(("converted %d lines from %d file(s) into %s: %d rows, %d skipped, %d padded; %.1f MB in %.2f s: "
  .. "%.0f lines/s, %.1f MB/s"):format(st.lines, #inputs, out, st.rows, st.skipped, st.padded,
  st.bytes / 1e6, st.seconds, st.lines / math.max(st.seconds, 1e-9), st.bytes / 1e6 / math.max(st.seconds, 1e-9)))
if st.skipped > 0 then print("first skipped: " .. st.first_skipped) end
