-- `uvmrec demo`: a table in unified memory steered by hints.  A 64 MiB table (128K rows x 128
-- f32) keeps its hottest 20% of rows on the GPU and the rest on the host, read in place by the
-- GPU; the HBM budget is set to what that needs.  Also runs as `luajit scripts/demo.lua [ROWS]`.
local ur = require "uvmrec"

-- The hot 20% must fill at least one 4 KiB page of 512-byte rows.
local function enough(rows)
  if rows < 40 then return nil, ("%d rows; at least 40, so that the hot 20%% fill a page"):format(rows) end
  return rows
end

local cmd = require("uvmrec.cli").command {
  name = "demo",
  summary = "a table in unified memory steered by hints: hot rows on the GPU, cold ones read in place",
  { "[ROWS]", "rows of the table (128 f32 each; at least 40)", type = "whole", default = 131072, check = enough },
}
local o = cmd:parse(arg)

-- A step that fails (memory, the device) ends the demo with its message, not a traceback.
local function must(v, err)
  if v == nil then cmd:fail(err) end
  return v
end

local rows, dim = o.rows, 128
local hot = math.floor(rows * 0.2 / 8) * 8 -- whole 4 KiB pages of 512-byte rows

local function mib(b) return ("%.1f MiB"):format(b / 2 ^ 20) end

print(("uvmrec %s, %s"):format(ur.version(),
  ur.gpu() and ("GPU: " .. ur.device_props(0).name) or ("no GPU (" .. ur.cuda_error() .. ")")))

local t = must(ur.uvm_tensor({ rows, dim }, { device = 0 }))
local bound = 1 / math.sqrt(rows)
t:uniform(-bound, bound, 2024)
print("table:  " .. tostring(t))

ur.set_hbm_budget(hot * dim * 4)
print("budget: " .. mib(ur.hbm_budget()) .. " of HBM for the hot rows")

local r = must(t:advise(hot * dim, (rows - hot) * dim, "preferred_location", "cpu"))
must(t:advise(hot * dim, (rows - hot) * dim, "accessed_by", "gpu"))
must(t:advise(0, hot * dim, "preferred_location", "gpu"))
must(t:prefetch(0, hot * dim, "gpu"))
print(("cold rows %d..%d: bytes %d..%d after rounding to %d-byte pages (rounded: %s)"):format(
  hot, rows - 1, r.byte_begin, r.byte_end, r.page_bytes, tostring(r.rounded)))

local ok, err = t:advise(0, rows * dim, "preferred_location", "gpu")
print("the whole table on the GPU? " .. (ok and "accepted" or ("refused: " .. err)))

for _, part in ipairs { { "hot", 0, hot }, { "cold", hot, rows - hot } } do
  local a = t:advised(part[2] * dim, part[3] * dim)
  local line = ("%-4s rows: preferred %s, last prefetch %s, accessed by {%s} (%s)"):format(part[1],
    a.preferred_location, a.last_prefetch_location, table.concat(a.accessed_by, ", "),
    a.from_driver and "driver" or "engine record")
  local res = t:residency(part[2] * dim, math.min(part[3], 8192) * dim)
  if res then line = line .. (", read at %.0f GB/s: %s"):format(res.gbps, res.where) end
  print(line)
end

local m = ur.memory()
print(("memory: managed %s, on the GPU %s, HBM used %s of %s"):format(
  mib(m.managed), mib(m.managed_on_gpu), mib(m.hbm_used), mib(m.hbm_budget)))
print(("hint log: %d records"):format(#ur.hint_log()))
t:free()
