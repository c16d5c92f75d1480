-- uvmrec: `local ur = require "uvmrec"`.  The engine's Lua face: tensors, streams, events,
-- devices, memory and the HBM budget, hints and the migration monitor.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local stream = require "uvmrec.stream"
local C, check = lib.C, lib.check

local ur = {
  C = C,
  tensor = tensor.tensor,
  uvm_tensor = tensor.uvm_tensor,
  stream = stream.stream,
  event = stream.event,
  graph_begin = stream.graph_begin,
  graph_end = stream.graph_end,
}

ur.UvmTensor = ur.uvm_tensor -- the seed's spelling
ur.nn, ur.optim, ur.dense = require "uvmrec.nn", require "uvmrec.optim", require "uvmrec.dense"
ur.KJT = require("uvmrec.kjt").KJT
-- The data path (readers, synthetic data, the loader), loaded on first use.
setmetatable(ur, { __index = function(t, k)
  if k == "data" then
    local d = require "uvmrec.data"
    rawset(t, "data", d)
    return d
  end
end })

function ur.version() return ffi.string(C.ur_version()) end

-- The commit this tree was made from, for the records benchmarks write: a `make dist` tree's,
-- as its DIST file names it (`git describe`: "-dirty" kept), else the source checkout's HEAD
-- (`git rev-parse --short`, with "-dirty" when the checkout has changes), else nil (an
-- installed tree, or no git).  A copy of a dist tree inside another checkout names what was
-- built, not that checkout's HEAD.
function ur.commit()
  local init = package.searchpath("uvmrec", package.path)
  local root = init and init:match("^(.*)/lua/uvmrec/init%.lua$")
  if not root then return nil end
  local f = io.open(root .. "/DIST", "rb")
  if f then
    local d = f:read("*l") or ""
    f:close()
    return d:match("made by make dist %(([^,)]+),")
  end
  local function run(cmd)
    local p = io.popen(("git -C '%s' %s 2>/dev/null"):format(root, cmd))
    local out = p and p:read("*a") or ""
    if p then p:close() end
    return out
  end
  local c = run("rev-parse --short HEAD"):match("^(%x+)")
  if c and run("status --porcelain --untracked-files=no") ~= "" then c = c .. "-dirty" end
  return c
end

-- True when the CUDA backend is loaded and sees a GPU.
function ur.gpu() return C.ur_device_count() > 0 end
function ur.devices() return C.ur_device_count() end
function ur.cuda_built() return C.ur_cuda_built() ~= 0 end
function ur.cuda_archs() return ffi.string(C.ur_cuda_archs()) end
function ur.cuda_error() return ffi.string(C.ur_cuda_error()) end

function ur.device_props(dev)
  local p = ffi.new("ur_device_props")
  local ok, err = check(C.ur_device_props_get(dev or 0, p))
  if not ok then return nil, err end
  return {
    name = ffi.string(p.name), ordinal = p.ordinal, capability = p.major .. "." .. p.minor,
    sm_count = p.sm_count, l2_bytes = tonumber(p.l2_bytes), total_bytes = tonumber(p.total_bytes),
    free_bytes = tonumber(p.free_bytes), managed_memory = p.managed_memory ~= 0,
    concurrent_managed_access = p.concurrent_managed_access ~= 0,
    pageable_memory_access = p.pageable_memory_access ~= 0,
    stream_priority_low = p.stream_priority_low, stream_priority_high = p.stream_priority_high,
  }
end

function ur.set_device(dev) return check(C.ur_device_set(dev)) end
function ur.sync() return check(C.ur_device_sync()) end

-- Bytes from a whole number or a string such as "512MiB" or "16 GB" (lib.bytes).
function ur.bytes(v)
  local b, err = lib.bytes(v)
  if not b then error("bytes: " .. err, 2) end
  return b
end

-- Every byte the engine places on a GPU counts against the budget; nil or 0 removes it.
function ur.set_hbm_budget(v)
  return check(C.ur_hbm_budget_set(v and ur.bytes(v) or 0))
end

function ur.hbm_budget() return tonumber(C.ur_hbm_budget_get()) end

-- hbm_peak counts from now (from the HBM in use now).
function ur.reset_hbm_peak() C.ur_memory_peak_reset() end

-- The bytes per placement (host, pinned, device, managed), and allocs and frees by placement.
function ur.memory()
  local m = ffi.new("ur_memory_stats")
  C.ur_memory_get(m)
  local r = {
    managed_on_gpu = tonumber(m.managed_on_gpu), hbm_used = tonumber(m.hbm_used),
    hbm_budget = tonumber(m.hbm_budget), hbm_peak = tonumber(m.hbm_peak),
    workspace = tonumber(m.workspace), allocs = {}, frees = {},
  }
  for name, p in pairs({ host = C.UR_PLACE_HOST, pinned = C.UR_PLACE_PINNED, device = C.UR_PLACE_DEVICE,
                         managed = C.UR_PLACE_MANAGED }) do
    r[name], r.allocs[name], r.frees[name] = tonumber(m.bytes[p]), tonumber(m.allocs[p]), tonumber(m.frees[p])
  end
  return r
end

function ur.hint_page_bytes() return tonumber(C.ur_hint_page_bytes_get()) end
function ur.set_hint_page_bytes(n) return lib.must(C.ur_hint_page_bytes_set(n)) end

-- The hint log: every advise and prefetch, newest last; `since` is the last seq already seen.
function ur.hint_log(since)
  local total = tonumber(C.ur_hint_log_total())
  local first = math.max((since or 0) + 1, total - tonumber(C.ur_hint_log_capacity()) + 1, 1)
  local rec, out = ffi.new("ur_hint_record"), {}
  for seq = first, total do
    lib.must(C.ur_hint_log_get(seq, rec))
    out[#out + 1] = {
      seq = tonumber(rec.seq), tensor_id = tonumber(rec.tensor_id),
      kind = rec.is_prefetch ~= 0 and "prefetch" or "advise",
      advice = rec.is_prefetch == 0 and ffi.string(C.ur_advice_name(rec.advice)) or nil,
      location = lib.location_name(rec.location), applied = rec.applied ~= 0,
      range = tensor.range_table(rec.range),
    }
  end
  return out
end

function ur.clear_hint_log() C.ur_hint_log_clear() end

-- The migration monitor: bytes migrated each way and page faults, per interval.
ur.monitor = {}
function ur.monitor.start() return check(C.ur_monitor_start()) end
function ur.monitor.stop() return check(C.ur_monitor_stop()) end
function ur.monitor.read(reset)
  local s = ffi.new("ur_migration_stats")
  local ok, err = check(C.ur_monitor_read(s, reset and 1 or 0))
  if not ok then return nil, err end
  return {
    bytes_htod = tonumber(s.bytes_htod), bytes_dtoh = tonumber(s.bytes_dtoh),
    gpu_page_faults = tonumber(s.gpu_page_faults), cpu_page_faults = tonumber(s.cpu_page_faults),
    thrashing = tonumber(s.thrashing), throttling = tonumber(s.throttling),
    remote_map = tonumber(s.remote_map), seconds = s.seconds,
  }
end

return ur
