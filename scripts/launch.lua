-- `uvmrec launch -n N COMMAND ARGS...`: starts N ranks of `uvmrec COMMAND ARGS...` on this host,
-- rank r on GPU r.  Where OpenMPI is installed it runs mpirun (with --allow-run-as-root as root,
-- --oversubscribe with more ranks than cores); where it is not (a GPU host with only the driver
-- and CUDA) it starts the ranks itself with UVMREC_RANK, UVMREC_WORLD, UVMREC_LOCAL_RANK and
-- UVMREC_RENDEZVOUS, a fresh folder through which rank 0 hands NCCL's unique id to the others
-- (a bootstrap, not a transport: NCCL carries every collective).  The environment passes on
-- unchanged, with NCCL_NVLS_ENABLE=0 (NVLink multicast off) added.  Rank 0 prints progress and
-- writes the run directory; the other ranks' lines carry "[rank R] ".  Exits with the first
-- failing rank's code (the others are stopped), else 0.  Across hosts, run mpirun yourself
-- (docs/distributed.md).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local C = lib.C

local cmd = require("uvmrec.cli").command {
  name = "launch",
  summary = "run a command as N ranks on this host (mpirun where OpenMPI is, else processes of its own)",
  description = "Examples: uvmrec launch -n 2 train dlrm_tiny --cpu --steps 40 --set embeddings.sharding=row_wise; "
    .. "uvmrec launch -n 8 train dlrm_mlperf_v1_2m.  Options of launch come before COMMAND; everything "
    .. "after it goes to the command.",
  { "-n N", "ranks to start (one per GPU on a GPU host)", type = "whole", required = true, key = "n" },
  { "--fork", "start the ranks as processes of this command even where mpirun is installed (GPU jobs "
    .. "bootstrap NCCL through a rendezvous folder; jobs on the CPU need MPI)" },
  { "COMMAND", "the command every rank runs (train, eval, or a script)" },
  { "[ARGS...]", "its arguments (after COMMAND, launch reads none of them but --cpu)" },
}

-- launch's own options end at the first word that is not one of them: the command.
local own, rest = {}, {}
do
  local i = 1
  while arg[i] do
    local a = arg[i]
    if a == "-n" then
      own[#own + 1], own[#own + 2] = a, arg[i + 1]
      i = i + 2
    elseif a:match("^%-n%d+$") or a == "--fork" or a == "-h" or a == "--help" then
      own[#own + 1] = a
      i = i + 1
    else
      break
    end
  end
  if arg[i] then own[#own + 1] = arg[i] end
  for j = i + 1, #arg do rest[#rest + 1] = arg[j] end
end
local o = cmd:parse(own)
local n = o.n
if n < 1 then cmd:fail(("-n %d: expected at least 1 rank"):format(n)) end

local host = package.loaded["uvmrec.host"]
if not host or not host.binary then cmd:fail("scripts/launch.lua runs under the uvmrec command: `uvmrec launch`") end

local function on_path(name)
  for dir in (os.getenv("PATH") or ""):gmatch("[^:]+") do
    local p = dir .. "/" .. name
    if C.ur_path_kind(p) == 1 then return p end
  end
  return nil
end

local cpu = false
for _, a in ipairs(rest) do
  if a == "--cpu" then cpu = true end
end
local mpirun = not o.fork and on_path("mpirun")
if n > 1 and cpu and not mpirun then
  cmd:fail(("%d ranks on the CPU need MPI for their collectives, and %s: install OpenMPI (Debian: "
    .. "apt-get install openmpi-bin libopenmpi-dev, or `make deps`)"):format(n,
    o.fork and "--fork starts the ranks without it" or "mpirun is not on PATH"))
end

local function setenv(k, v) assert(lib.check(C.ur_env_set(k, v))) end
-- NVLink multicast (NVLS) stays off in every rank's environment.
setenv("NCCL_NVLS_ENABLE", "0")

local argv = {}
if mpirun then
  argv = { mpirun, "-np", tostring(n) }
  if C.ur_proc_uid() == 0 then argv[#argv + 1] = "--allow-run-as-root" end
  if n > C.ur_cpu_count() then argv[#argv + 1] = "--oversubscribe" end
  -- mpirun passes our environment to the ranks of this host; -x names what other hosts need.
  argv[#argv + 1], argv[#argv + 2] = "-x", "NCCL_NVLS_ENABLE"
end
argv[#argv + 1] = host.binary
argv[#argv + 1] = o.command
for _, a in ipairs(rest) do argv[#argv + 1] = a end

local function cargv(list)
  local a = ffi.new("const char *[?]", #list + 1)
  for i, s in ipairs(list) do a[i - 1] = s end
  a[#list] = nil
  return a
end

local function spawn(list)
  local pid = ffi.new("int32_t[1]")
  local keep = cargv(list) -- luacheck: ignore 311 (alive until spawn returns)
  assert(lib.check(C.ur_proc_spawn(keep, pid)))
  return pid[0]
end

local status, which = ffi.new("int32_t[1]"), ffi.new("int32_t[1]")

if mpirun then
  local pid = spawn(argv)
  assert(lib.check(C.ur_proc_wait(pid, 0, status, nil)))
  os.exit(status[0])
end

-- Without MPI: the ranks are our children, and meet through a folder of their own.
local dir = ffi.new("char[?]", 256)
ffi.copy(dir, (os.getenv("TMPDIR") or "/tmp") .. "/uvmrec-launch-XXXXXX")
assert(lib.check(C.ur_dir_temp(dir)))
local rendezvous = ffi.string(dir)
setenv("UVMREC_WORLD", tostring(n))
setenv("UVMREC_LOCAL_WORLD", tostring(n))
setenv("UVMREC_RENDEZVOUS", rendezvous)
local rank_of, alive = {}, n
for r = 0, n - 1 do
  setenv("UVMREC_RANK", tostring(r))
  setenv("UVMREC_LOCAL_RANK", tostring(r))
  rank_of[spawn(argv)] = r
end

-- The first rank to fail stops the others (SIGTERM); SIGINT reaches every rank from the terminal.
local code = 0
while alive > 0 do
  assert(lib.check(C.ur_proc_wait(-1, 0, status, which)))
  local r = rank_of[which[0]]
  if r then
    rank_of[which[0]], alive = nil, alive - 1
    if status[0] ~= 0 and code == 0 then
      code = status[0]
      io.stderr:write(("uvmrec launch: rank %d exited with %d; stopping the other ranks\n"):format(r, code))
      for pid in pairs(rank_of) do C.ur_proc_kill(pid, 15) end
    end
  end
end
local buf, needed = ffi.new("char[4096]"), ffi.new("uint64_t[1]")
if C.ur_dir_list(rendezvous, "", "", buf, 4096, needed) == 0 then
  for name in ffi.string(buf):gmatch("[^\n]+") do os.remove(rendezvous .. "/" .. name) end
end
os.remove(rendezvous)
os.exit(code)
