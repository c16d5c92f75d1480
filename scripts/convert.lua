-- uvmrec convert INPUT... --out DIR [--config CONFIG | --rows R1,...,R26]
--                 [--on-bad-line fail|skip] [--pad-missing-fields]
-- Criteo raw TSV (plain or .gz) to binary day files in the layout of the public DLRM
-- references: day_N_dense.npy (<f4 [N,13], already log(x+1) of the clamped integers),
-- day_N_sparse.npy (<i4 ids mod rows when rows are given, else <u4 raw ids), day_N_labels.npy
-- (<i4 [N]).  Input i is day i, or day K when its name holds day_K.  Also runs as
-- `luajit scripts/convert.lua ...` with the paths from `make -s env`.
local ur = require "uvmrec"
local data = ur.data

local usage = [[
usage: uvmrec convert INPUT... --out DIR [--config CONFIG | --rows R1,...,R26]
                      [--on-bad-line fail|skip] [--pad-missing-fields]
  --out DIR              where day_N_{dense,sparse,labels}.npy go (created if missing)
  --config CONFIG        table sizes from a preset (kaggle, mlperf_v1, ...) or a config file
  --rows R1,...,R26      table sizes (one number: the same for all); ids are taken mod rows
  --on-bad-line MODE     fail (default: stop at the first bad line) or skip (count them)
  --pad-missing-fields   accept lines of 15..39 fields as having empty trailing fields]]

local function die(msg)
  io.stderr:write("uvmrec convert: ", msg, "\n")
  os.exit(2)
end

local args = arg or {}
local inputs, opts, out = {}, { on_bad_line = "fail" }, nil
local i = 1
while i <= #args do
  local a = args[i]
  local function value()
    i = i + 1
    if args[i] == nil then die(a .. " needs a value") end
    return args[i]
  end
  local k, v = a:match("^(%-%-[%w-]+)=(.*)$")
  if k then a = k; table.insert(args, i + 1, v) end
  if a == "--out" then out = value()
  elseif a == "--rows" then
    local list = {}
    for n in value():gmatch("[^,]+") do
      if not tonumber(n) then die("--rows: '" .. n .. "' is not a number") end
      list[#list + 1] = tonumber(n)
    end
    if #list ~= 1 and #list ~= 26 then die(("--rows: %d sizes; give 26 or one"):format(#list)) end
    opts.rows = #list == 1 and list[1] or list
  elseif a == "--config" then
    local spec, err = require("uvmrec.data.synthetic").resolve(value())
    if not spec then die("--config: " .. tostring(err)) end
    if #spec.tables ~= 26 then die(("--config: %d tables; Criteo has 26"):format(#spec.tables)) end
    opts.rows = {}
    for t = 1, 26 do opts.rows[t] = spec.tables[t].rows end
  elseif a == "--on-bad-line" then opts.on_bad_line = value()
  elseif a == "--pad-missing-fields" then opts.pad_missing_fields = true
  elseif a == "-h" or a == "--help" then print(usage) os.exit(0)
  elseif a:match("^%-%-") then die("unknown option " .. a .. "\n" .. usage)
  else inputs[#inputs + 1] = a end
  i = i + 1
end
if #inputs == 0 or not out then die("needs INPUT... and --out DIR\n" .. usage) end
if opts.on_bad_line ~= "fail" and opts.on_bad_line ~= "skip" then
  die("--on-bad-line: '" .. opts.on_bad_line .. "'; expected fail or skip")
end
if os.execute(("mkdir -p '%s'"):format(out:gsub("'", "'\\''"))) ~= 0 then die("cannot create " .. out) end

local st, err = data.convert(inputs, out, opts)
if not st then
  io.stderr:write("uvmrec convert: ", err, "\n")
  os.exit(1)
end

local readme = assert(io.open(out .. "/README.txt", "a"))
for k, path in ipairs(inputs) do
  readme:write(("day_%d_*.npy from %s: dense <f4 [N,13] = log(max(x,0)+1) of I1..I13 (empty = 0); "
    .. "sparse %s [N,26] = C1..C26 hex as uint32%s; labels <i4 [N]\n"):format(st.days[k], path,
    opts.rows and "<i4" or "<u4", opts.rows and " mod rows (" .. (type(opts.rows) == "table"
    and table.concat(opts.rows, ",") or opts.rows) .. ")" or " (raw)"))
end
readme:close()

print(("converted %d lines from %d file(s) into %s: %d rows, %d skipped, %d padded; %.1f MB in %.2f s: "
  .. "%.0f lines/s, %.1f MB/s"):format(st.lines, #inputs, out, st.rows, st.skipped, st.padded,
  st.bytes / 1e6, st.seconds, st.lines / math.max(st.seconds, 1e-9), st.bytes / 1e6 / math.max(st.seconds, 1e-9)))
if st.skipped > 0 then print("first skipped: " .. st.first_skipped) end
