-- uvmrec.host_memory: the host memory a training run will hold, counted from its config before
-- anything is allocated, and checked against a limit: --host-memory, else the cgroup's memory
-- limit when one is set; never MemTotal, which can under-report on GPU hosts (and is no limit
-- where a cgroup holds the process).  What is counted: embedding tables living on the host
-- (placement host: pinned on a GPU; managed: they start there; cached: their backing store) and
-- their optimizer state, the loader's slots and windows, and the page cache the day files need
-- (read at random, they must stay in memory or the loader waits for the disk).
--   local need = host_memory.count(cfg, loader_opts, gpu)  -- {items = {{what, bytes}}, total}
--   assert(host_memory.check(need, "100GiB"))             -- nil, message with the numbers
--   host_memory.peak()                                    -- this process's peak resident bytes
--   host_memory.resident()                                -- and its resident bytes now
--   host_memory.available()                               -- the bytes the host can still give
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local C = lib.C

local M = {}

local function planner() return require "uvmrec.planner" end

local STATE = { sgd = function() return 0 end, rowwise_adagrad = function(rows) return rows * 4 end,
                adagrad = function(rows, dim) return rows * dim * 4 end,
                adam = function(rows, dim) return 2 * rows * dim * 4 end }

-- The bytes of the files of day-file folder dir (0 when it has none).
local function day_files(dir)
  local total = 0
  for _, name in ipairs(require("uvmrec.lib").dir_list(dir, "day_", ".npy") or {}) do
    if name:match("^day_%d+_%a+%.npy$") then
      local f = io.open(dir .. "/" .. name, "rb")
      if f then
        total = total + f:seek("end")
        f:close()
      end
    end
  end
  return total
end

-- The id columns of day-file folder dir (a multi-hot table takes several; uvmrec datagen): the
-- first day's day_N_sparse.npy's [N, columns]; nil when there is none to read.
local function day_columns(dir)
  for _, name in ipairs(require("uvmrec.lib").dir_list(dir, "day_", "_sparse.npy") or {}) do
    local f = name:match("^day_%d+_sparse%.npy$") and io.open(dir .. "/" .. name, "rb")
    if f then
      local head = f:read(4096) or ""
      f:close()
      local h = require("uvmrec.data").npy_header(head, name)
      return h and h.shape[2]
    end
  end
end

-- The loader's slots and windows for loader options o (ur.data.loader's) over data of the
-- given shape; 0 when the generator draws on the GPU.
local function loader_bytes(o, columns, tables, dense)
  if o.placement == "device" then return 0 end
  local co = ffi.new("ur_loader_opts")
  co.batch_size, co.depth, co.threads = o.batch_size, o.depth or 4, o.threads or 0
  co.shuffle_window = o.shuffle_window or 0
  local kind = type(o.data) == "table" and o.data.kind or tostring(o.data):match("^([%w-]+):")
  co.source = kind == "criteo-tsv" and C.UR_SOURCE_CRITEO_TSV or kind == "criteo-bin" and C.UR_SOURCE_CRITEO_BIN
              or C.UR_SOURCE_SYNTHETIC
  return tonumber(C.ur_loader_host_bytes(co, columns, tables, dense))
end

-- What the run of training config cfg holds in host memory: {items = {{what =, bytes =}},
-- total}.  loader: the training loader's options (uvmrec.train.data(...).train); gpu: whether the
-- model runs on a GPU (else everything is host memory).
function M.count(cfg, loader, gpu)
  local e = cfg.embeddings
  local rows = require("uvmrec.train.config").table_rows(cfg)
  local optim = (e.optimizer and e.optimizer.name) or "sgd"
  local state = STATE[optim] or STATE.adam
  local tables, states, columns = 0, 0, 0
  for i, r in ipairs(rows) do
    local own = e.tables["C" .. i] or {}
    local place = own.placement or e.placement
    local on_host = not gpu or place == "host" or place == "managed" or place == "cached"
    if on_host then
      tables = tables + r * e.dim * require("uvmrec.tensor").dtype_bytes(own.dtype or e.dtype or "f32")
      states = states + state(r, e.dim)
    end
    columns = columns + 1
  end
  local items = { { what = "tables on the host", bytes = tables },
                  { what = "their optimizer state", bytes = states } }
  if loader then
    local spec = type(loader.data) == "table" and loader.data.spec
    local dir = type(loader.data) == "string" and loader.data:match("^criteo%-bin:(.+)$")
    if spec then -- synthetic: its tables' ids per sample
      columns = 0
      for _, h in ipairs(spec.hot_max) do columns = columns + h end
    elseif dir then -- day files: their columns (a table a column was counted, a multi-hot one's short)
      columns = day_columns(dir) or columns
    end
    items[#items + 1] = { what = "the loader's buffers",
                          bytes = loader_bytes(loader, columns, #rows, cfg.model.dense_features) }
    if dir then items[#items + 1] = { what = "the day files in the page cache", bytes = day_files(dir) } end
  end
  local total = 0
  for _, it in ipairs(items) do total = total + it.bytes end
  return { items = items, total = total }
end

-- The first line of a file as a whole number; nil where it has none ("max").
local function file_number(path)
  local text = lib.read_file(path)
  return text and tonumber(text:match("^(%d+)"))
end

-- The cgroup's memory limit and what the cgroup uses now (v2, else v1), and the limit's file; nil
-- where no limit is set.
local CGROUPS = { { "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current" },
                  { "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes" } }
local function cgroup()
  for _, c in ipairs(CGROUPS) do
    local v = file_number(c[1])
    if v and v < 2 ^ 60 then return v, file_number(c[2]), c[1] end
  end
end

-- The limit: given (bytes or "100GiB"), else the cgroup's memory limit, else nil.  Returns
-- bytes, where it came from.
function M.limit(given)
  if given then
    local ok, b = pcall(require("uvmrec").bytes, given)
    if not ok then error("host memory: " .. tostring(b):gsub("^[^\n]-:%d+: ", ""), 3) end
    return b, "--host-memory"
  end
  local v, _, path = cgroup()
  if v then return v, "the cgroup's limit (" .. path .. ")" end
  return nil
end

-- The bytes this process can still have before an allocation fails or the OOM killer ends it,
-- and where that comes from: MemAvailable + SwapFree of /proc/meminfo, or the cgroup's limit
-- less its use where that is less; nil where neither can be read.  An estimate (the kernel may
-- reclaim a little more), read when asked: for a request that cannot fit, not a budget.
function M.available()
  local info = lib.read_file("/proc/meminfo")
  local avail, swap = info and info:match("MemAvailable:%s*(%d+) kB"), info and info:match("SwapFree:%s*(%d+) kB")
  local bytes = avail and (tonumber(avail) + tonumber(swap or 0)) * 1024
  local where = bytes and "MemAvailable + SwapFree of /proc/meminfo"
  local limit, used, path = cgroup()
  if limit and used and (not bytes or limit - used < bytes) then
    bytes, where = math.max(limit - used, 0), "the cgroup's limit less its use (" .. path .. ")"
  end
  return bytes, where
end

-- true when `bytes` more fit in what the host can still give (M.available; nothing known: true),
-- else nil and "<bytes> (<GiB>) but the host has <GiB> available (<where>)".
function M.fits(bytes)
  local avail, where = M.available()
  if not avail or bytes <= avail then return true end
  local fmt = planner().fmt_bytes
  return nil, ("%.0f bytes (%s) but the host has %s available (%s)"):format(bytes, fmt(bytes), fmt(avail), where)
end

-- A line of /proc/self/status in bytes ("VmHWM", "VmRSS"); nil, message where /proc gives none.
local function status_bytes(field)
  local status, err = lib.read_file("/proc/self/status")
  if not status then return nil, "host memory: " .. err end
  local kb = status:match("\n" .. field .. ":%s*(%d+) kB")
  if not kb then return nil, "host memory: /proc/self/status has no " .. field .. " line" end
  return tonumber(kb) * 1024
end

-- This process's peak resident memory (VmHWM of /proc/self/status) in bytes; nil, message
-- where /proc gives none.
function M.peak() return status_bytes("VmHWM") end

-- This process's resident memory now (VmRSS) in bytes; nil, message where /proc gives none.
function M.resident() return status_bytes("VmRSS") end

-- One line: "tables on the host 89.50 GiB, ..., in all 112.40 GiB".
function M.describe(need)
  local fmt, parts = planner().fmt_bytes, {}
  for _, it in ipairs(need.items) do
    if it.bytes > 0 then parts[#parts + 1] = ("%s %s"):format(it.what, fmt(it.bytes)) end
  end
  parts[#parts + 1] = "in all " .. fmt(need.total)
  return table.concat(parts, ", ")
end

-- true, or nil and a message with the numbers when need (count's) exceeds the limit (given,
-- else the cgroup's; no limit known: true).
function M.check(need, given)
  local limit, where = M.limit(given)
  if not limit or need.total <= limit then return true, limit, where end
  local fmt = planner().fmt_bytes
  return nil, ("host memory: the run needs %s (%s) but %s are allowed (%s); place tables in HBM, make fewer or "
    .. "smaller day files, or allow more"):format(fmt(need.total), M.describe(need), fmt(limit), where)
end

return M
