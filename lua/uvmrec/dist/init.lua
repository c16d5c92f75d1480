-- uvmrec.dist: training over several GPUs and hosts, one process ("rank") per GPU.
--
--   local dist = require "uvmrec.dist"
--   local comm = dist.init()            -- the job's communicator (mpirun's or `uvmrec launch`'s)
--   print(dist.rank(), dist.world())
--   comm:all_reduce(t)                  -- NCCL for device tensors, MPI for host ones
--   local ebc = dist.shard(collection, "row_wise")          -- uvmrec.dist.sharded
--   local model = dist.shard_modules(model, { default = "table_wise", C3 = "row_wise" })
--
-- Collectives follow the engine's rule (uvmrec.h, section 9): each is ordered after the work
-- enqueued on its stream, and its output is ready after comm:wait(stream) (host memory: read
-- it once wait returned).  Every rank makes the same calls in the same order.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local C, check, must = lib.C, lib.check, lib.must

local M = {}

local OPS = { sum = C.UR_REDUCE_SUM, max = C.UR_REDUCE_MAX, min = C.UR_REDUCE_MIN }

local Comm = {}
Comm.__index = Comm
local wrap_comm, free_comm = lib.handle_type("ur_comm", C.ur_comm_free, {})

local P, S = lib.method_ptrs("communicator")
local function T(t, what, level)
  if not tensor.is_tensor(t) then
    error(("comm: %s must be a tensor, got %s"):format(what, type(t)), (level or 2) + 1)
  end
  local p = lib.ptr(t, what, (level or 2) + 1) -- not a tail call: lib.ptr
  return p
end

local function op_of(op, level)
  if op == nil then return C.UR_REDUCE_SUM end
  local v = OPS[op]
  if v == nil then error(("comm: reduction '%s' is not sum, max or min"):format(tostring(op)), level + 1) end
  return v
end

-- Per-rank counts from a Lua list (or an int64_t array) into the communicator's buffer k.
function Comm:_counts(list, k, what, level)
  if list == nil then return nil end
  if type(list) == "cdata" then return list end
  local w = self.world
  if type(list) ~= "table" or #list ~= w then
    error(("comm: %s must list %d counts, one per rank"):format(what, w), level + 1)
  end
  local buf = self._counts_buf[k]
  for r = 1, w do
    local v = list[r]
    -- a cast would truncate 4.5 to 4 and take it, and inf as -2^63; the engine checks the signs
    -- and the sums
    if not lib.whole_in(v, -2 ^ 63, 2 ^ 63) then
      error(("comm: %s[%d] is %s; expected a whole number of elements"):format(what, r - 1, tostring(v)), level + 1)
    end
    buf[r - 1] = v
  end
  return buf
end

-- comm:all_reduce(t[, out][, op][, stream]): out (default: t, in place) = op over the ranks.
function Comm:all_reduce(t, out, op, stream)
  if type(out) == "string" then out, op, stream = nil, out, op end
  out = out or t
  return check(C.ur_comm_all_reduce(S(stream), P(self), T(t, "input"), T(out, "output"), op_of(op, 2)), 2)
end

-- comm:reduce_scatter(in, out[, op][, stream]): out = op over the ranks of block `rank` of in.
function Comm:reduce_scatter(t, out, op, stream)
  return check(C.ur_comm_reduce_scatter(S(stream), P(self), T(t, "input"), T(out, "output"), op_of(op, 2)), 2)
end

-- comm:all_gather(in, out[, counts][, stream]): every rank's in, side by side in rank order.
function Comm:all_gather(t, out, counts, stream)
  if counts ~= nil and type(counts) ~= "table" and type(counts) ~= "cdata" then counts, stream = nil, counts end
  return check(C.ur_comm_all_gather(S(stream), P(self), T(t, "input"), T(out, "output"),
                                    self:_counts(counts, 1, "counts", 2)), 2)
end

-- comm:broadcast(t[, root = 0][, stream]).
function Comm:broadcast(t, root, stream)
  return check(C.ur_comm_broadcast(S(stream), P(self), T(t, "tensor"), root or 0), 2)
end

-- comm:all_to_all(in, out, send_counts, recv_counts[, stream]): counts per rank, in elements.
function Comm:all_to_all(t, out, send_counts, recv_counts, stream)
  return check(C.ur_comm_all_to_all(S(stream), P(self), T(t, "input"), T(out, "output"),
                                    self:_counts(send_counts, 1, "send_counts", 2),
                                    self:_counts(recv_counts, 2, "recv_counts", 2)), 2)
end

function Comm:barrier(stream) return check(C.ur_comm_barrier(S(stream), P(self)), 2) end
function Comm:group_start() return check(C.ur_comm_group_start(P(self)), 2) end
function Comm:group_end(stream) return check(C.ur_comm_group_end(S(stream), P(self)), 2) end
-- Work on stream from now on (the host: this very moment) sees every collective's output.
function Comm:wait(stream) return check(C.ur_comm_wait(S(stream), P(self)), 2) end

local stats = ffi.new("ur_comm_stats")
function Comm:stats()
  must(C.ur_comm_stats_get(P(self), stats))
  return { calls = tonumber(stats.calls), bytes_sent = tonumber(stats.bytes_sent),
           bytes_received = tonumber(stats.bytes_received), seconds = stats.seconds }
end
function Comm:reset_stats() C.ur_comm_reset_stats(P(self)) return self end

function Comm:engines()
  local p = P(self)
  return { host = ffi.string(C.ur_comm_host_engine(p)), device = ffi.string(C.ur_comm_device_engine(p)) }
end

function Comm:free() free_comm(self.h) end

function Comm:__tostring()
  if self.h.p == nil then return "communicator (freed)" end
  local e = self:engines()
  return ("communicator rank %d of %d (host %s, device %s%s)"):format(self.rank, self.world, e.host, e.device,
    self.device >= 0 and (", GPU %d"):format(self.device) or "")
end

-- A communicator of the job (from the environment).  opts.device: this rank's GPU for device
-- collectives (-1: host memory only).  Environmental failures return nil, message.
function M.comm(opts)
  opts = opts or {}
  local out = ffi.new("ur_comm *[1]")
  local ok, err = check(C.ur_comm_new(out, opts.device or -1), 2)
  if not ok then return nil, err end
  local p = out[0]
  local world = C.ur_comm_world(p)
  return setmetatable({ h = wrap_comm(p), rank = C.ur_comm_rank(p), world = world,
                        local_rank = C.ur_comm_local_rank(p), local_world = C.ur_comm_local_world(p),
                        device = C.ur_comm_device(p),
                        _counts_buf = { ffi.new("int64_t[?]", world), ffi.new("int64_t[?]", world) } }, Comm)
end

-- ---- the process's job ----

local job -- the communicator made by init

-- dist.init{cpu = false, device = n}: joins the job (idempotent) and returns its communicator.
-- Rank r uses GPU local_rank of its host when a GPU is in use (not with cpu = true), and makes
-- it the current device.  In a job of several ranks a failing exit (os.exit(n ~= 0), or the
-- uvmrec command's error exit) aborts the whole job, so no rank waits on a dead one.
function M.init(opts)
  if job then return job end
  opts = opts or {}
  local device = opts.device
  if device == nil then
    device = -1
    if not opts.cpu and C.ur_device_count() > 0 then
      -- the GPU of this rank on its host: its rank among the host's ranks
      local local_rank = M.environment().local_rank
      if not local_rank then
        local probe, err = M.comm({ device = -1 })
        if not probe then return nil, err end
        local_rank = probe.local_rank
        probe:free()
      end
      -- two ranks on one GPU would fail in NCCL's setup ("duplicate GPU"), naming neither
      local gpus = C.ur_device_count()
      if local_rank >= gpus then
        return nil, ("dist: rank %d is rank %d of its host, which has %s: one rank per GPU (launch "
          .. "-n %d or fewer a host, or --cpu for ranks on the CPU)"):format(M.environment().rank or local_rank,
          local_rank, lib.things(gpus, "GPU"), gpus)
      end
      device = local_rank
    end
  end
  if device >= 0 then
    local ok, err = check(C.ur_device_set(device))
    if not ok then return nil, err end
  end
  local c, err = M.comm({ device = device })
  if not c then return nil, err end
  job = c
  if c.world > 1 then
    local exit = os.exit
    os.exit = function(code, close) -- luacheck: ignore 122
      local n = code == nil and 0 or (code == true and 0) or (code == false and 1) or code
      -- under `uvmrec launch`, the exit code for its report, with the command's failure if it printed one
      local cli = require "uvmrec.cli"
      cli.note_exit(n, cli.failure)
      -- every rank agreed to stop on a signal (dist.interrupted): an orderly end, not an abort
      C.ur_comm_exit((M.stopped_by_signal and (n == 130 or n == 143)) and 0 or n)
      return exit(code, close)
    end
  end
  return c
end

function M.is_initialized() return job ~= nil end


local function need(what)
  if not job then error("dist." .. what .. ": call dist.init() first", 3) end
  return job
end

function M.rank() return need("rank").rank end
function M.world() return need("world").world end
function M.local_rank() return need("local_rank").local_rank end
function M.job() return need("job") end

-- The interrupt over the job's ranks (a collective, every rank calls it once a step): sig is
-- this rank's (the signal caught, 0 for the interrupt flag alone, nil for none); the result is
-- the largest over the ranks, or nil when no rank was interrupted.  So every rank stops at the
-- same step boundary, whichever rank the signal reached first (a signal between two ranks'
-- checks would otherwise stop one a step before the others, which would wait for it).
local flag_t
function M.interrupted(sig)
  local comm = need("interrupted")
  if comm.world == 1 then return sig end
  flag_t = flag_t or assert(tensor.tensor({ 1 }, { dtype = "i32" }))
  flag_t:set(0, sig or -1)
  assert(comm:all_reduce(flag_t, "max"))
  assert(comm:wait())
  local v = flag_t:get(0)
  if v < 0 then return nil end
  M.stopped_by_signal = true
  return v
end

-- Rank root's bytes of text on every rank (a collective: its length, then its bytes).
local function broadcast_text(comm, text, root)
  local n = assert(tensor.tensor({ 1 }, { dtype = "i64" }))
  n:set(0, comm.rank == root and #text or 0)
  assert(comm:broadcast(n, root))
  assert(comm:wait())
  local len = tonumber(n:get(0))
  n:free()
  local buf = assert(tensor.tensor({ math.max(len, 1) }, { dtype = "u8" }))
  local p = ffi.cast("uint8_t *", C.ur_tensor_data(buf.p))
  if comm.rank == root then ffi.copy(p, text, len) end
  assert(comm:broadcast(buf, root))
  assert(comm:wait())
  local out = ffi.string(p, len)
  buf:free()
  return out
end

-- Whether every rank of the job runs config cfg (a collective, every rank calls it once before
-- it builds anything): nil when they all do, else the same message on every rank, naming the
-- first rank whose config is not rank 0's and where they differ.  Ranks given other configs
-- (another file or --set on one host) would make collectives of other sizes, or, with the
-- same shapes, train replicas that drift apart silently (another learning rate on one rank).
function M.config_mismatch(comm, cfg)
  if comm.world == 1 then return nil end
  local json = require "uvmrec.json"
  local mine = json.encode(cfg)
  local differs = broadcast_text(comm, mine, 0) ~= mine
  local flag = assert(tensor.tensor({ 1 }, { dtype = "i32" }))
  flag:set(0, differs and comm.rank or comm.world)
  assert(comm:all_reduce(flag, "min"))
  assert(comm:wait())
  local first = flag:get(0)
  flag:free()
  if first == comm.world then return nil end
  local ck = require "uvmrec.checkpoint"
  local theirs = json.decode(broadcast_text(comm, mine, first))
  local zero = json.decode(broadcast_text(comm, mine, 0))
  local at = ("rank %d"):format(first)
  return ("dist: rank %d's config is not rank 0's (every rank of a job runs the same config: the same file "
    .. "and --set on every host): %s"):format(first,
    ck.diff_message(ck.config_diff(zero, theirs), "rank 0", at))
end

-- NCCL's version and file, or nil, why (opening it needs no GPU).
function M.nccl()
  local v, path = ffi.new("int32_t[1]"), ffi.new("char[1024]")
  local ok, err = check(C.ur_nccl_version(v, path, 1024))
  if not ok then return nil, err end
  return { version = v[0], path = ffi.string(path) }
end

-- The MPI plugin's MPI and file, or nil, why (opening it does not start MPI).
function M.mpi()
  local v, path = ffi.new("char[512]"), ffi.new("char[1024]")
  local ok, err = check(C.ur_mpi_version(v, 512, path, 1024))
  if not ok then return nil, err end
  return { library = ffi.string(v), path = ffi.string(path) }
end

-- The job as the environment describes it, without joining it: {rank, world, local_rank,
-- launcher = "mpi" | "uvmrec" | nil} (uvmrec.dist.environment).
M.environment = require "uvmrec.dist.environment"

-- Sharding (uvmrec.dist.sharded, uvmrec.dist.plan), data-parallel dense modules
-- (uvmrec.dist.ddp) and checkpoints of sharded collections (dist.checkpoint: uvmrec.dist.checkpoint),
-- loaded on first use.
setmetatable(M, { __index = function(t, k)
  if k == "checkpoint" then
    local v = require "uvmrec.dist.checkpoint"
    rawset(t, k, v)
    return v
  end
  local where = ({ shard = "uvmrec.dist.sharded", shard_modules = "uvmrec.dist.sharded",
                   plan = "uvmrec.dist.plan", data_parallel = "uvmrec.dist.ddp" })[k]
  if where then
    local v = require(where)[k]
    rawset(t, k, v)
    return v
  end
end })

return M
