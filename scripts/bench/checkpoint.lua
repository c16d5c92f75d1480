-- Checkpoint throughput: saves a table of the given size and placement through the staging
-- buffer, loads it back into a second one, checks the rows match, and prints GB/s and the
-- host memory high-water mark's growth (which the staging buffer bounds) as a line of JSON.
-- usage: luajit scripts/bench/checkpoint.lua [GIB] [PLACEMENT] [STAGING_MIB] [DIR]   (--help)
local ur = require "uvmrec"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"

local o = require("uvmrec.cli").command {
  name = "scripts/bench/checkpoint.lua",
  summary = "checkpoint throughput: save and load a table through the staging buffer, GB/s and host memory",
  { "[GIB]", "the table's size in GiB", type = "number", default = 1 },
  { "[PLACEMENT]", "where the table lives", choices = { "host", "pinned", "device", "managed" }, default = "managed" },
  { "[STAGING_MIB]", "the staging buffer in MiB", type = "number", default = 64 },
  { "[DIR]", "where the file goes", default = "/tmp" },
}:parse(arg)
local gib, place, staging, dir = o.gib, o.placement, math.floor(o.staging_mib * 2 ^ 20), o.dir
local dim = 128
local rows = math.floor(gib * 2 ^ 30 / (dim * 4))

local function hwm_mib() return assert(require("uvmrec.host_memory").peak()) / 2 ^ 20 end

-- Wall-clock seconds (LuaJIT has none built in; the save and load take seconds, so a process
-- per reading costs nothing that matters).
local function now()
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("*l"))
  p:close()
  return t
end

local a = assert(ur.tensor({ rows, dim }, { placement = place }))
assert(a:uniform(-1, 1, 7))
local b = assert(ur.tensor({ rows, dim }, { placement = place }))
assert(b:fill(0))
assert(ur.sync())
local path = dir .. "/uvmrec-bench.safetensors"
local base = hwm_mib()

local t0 = now()
assert(ck.save(path, { tensors = { table = a } }, { staging = staging }))
local t1 = now()
local saved = hwm_mib()
local f = assert(ck.open(path))
local t2 = now()
assert(f:load({ table = b }, { staging = staging }))
assert(ur.sync())
local t3 = now()
local loaded = hwm_mib()

-- Rows spread over the table must match, and the file's view too.
local v = f:view("table")
for _, r in ipairs { 0, 1, math.floor(rows / 3), math.floor(rows / 2), rows - 1 } do
  local i = r * dim
  local want = a:totable(i, dim)
  local got, fv = b:totable(i, dim), v:totable(i, dim)
  for k = 1, dim do
    if got[k] ~= want[k] or fv[k] ~= want[k] then
      error(("row %d element %d: saved %g, file %g, loaded %g"):format(r, k - 1, want[k], fv[k], got[k]))
    end
  end
end
f:close()
os.remove(path)

local bytes = rows * dim * 4
print(("checkpoint %s %.2f GiB, staging %d MiB: save %.2f GB/s (%.2f s, fsync included), "
  .. "load %.2f GB/s (%.2f s); host high-water growth %.0f / %.0f MiB"):format(
  place, bytes / 2 ^ 30, staging / 2 ^ 20, bytes / 1e9 / (t1 - t0), t1 - t0,
  bytes / 1e9 / (t3 - t2), t3 - t2, saved - base, loaded - base))
print(json.encode { bench = "checkpoint", placement = place, bytes = bytes, staging = staging, save_s = t1 - t0,
  load_s = t3 - t2, save_rss_mib = saved - base, load_rss_mib = loaded - base })
