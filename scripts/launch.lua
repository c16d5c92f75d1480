-- `uvmrec launch -n N COMMAND ARGS...`: starts N ranks of `uvmrec COMMAND ARGS...` on this host,
-- rank r on GPU r.  Where OpenMPI is installed it runs mpirun (with --allow-run-as-root as root,
-- --oversubscribe with more ranks than cores); where it is not (a GPU host with only the driver
-- and CUDA) it starts the ranks itself with UVMREC_RANK, UVMREC_WORLD, UVMREC_LOCAL_RANK and
-- UVMREC_RENDEZVOUS, a fresh folder through which rank 0 hands NCCL's unique id to the others
-- (a bootstrap, not a transport: NCCL carries every collective).  The environment passes on
-- unchanged, with NCCL_NVLS_ENABLE=0 (NVLink multicast off) added.  Rank 0 prints progress and
-- writes the run directory; the other ranks' lines carry "[rank R] ".  Exits with the first
-- failing rank's code (the others are stopped), naming that rank and its error (through the
-- job's folder, UVMREC_JOB), else 0; Ctrl-C on launch reaches every rank once, as SIGINT.
-- Across hosts, run mpirun yourself (docs/distributed.md).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local C = lib.C

local cmd = require("uvmrec.cli").command {
  name = "launch",
  summary = "run a command as N ranks on this host (mpirun where OpenMPI is, else processes of its own)",
  description = "Examples: uvmrec launch -n 2 train dlrm_tiny --cpu --steps 40 --set embeddings.sharding=row_wise; "
    .. "uvmrec launch -n 8 train dlrm_mlperf_v1_2m.  Options of launch come before COMMAND; everything "
    .. "after it goes to the command.",
  { "-n N", "ranks to start (one per GPU on a GPU host)", type = "whole", min = 1, required = true, key = "n" },
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
-- The ranks (or mpirun) in a session of their own, where setsid(1) is: Ctrl-C at the terminal
-- reaches launch alone, which hands it on to every rank once (mpirun would end the job at once,
-- and a rank that got it twice would stop without its checkpoint).
local setsid = on_path("setsid")
if setsid then table.insert(argv, 1, setsid) end
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
pcall(ffi.cdef, "int kill(int pid, int sig); int usleep(unsigned int usec);")

-- The job's folder (UVMREC_JOB): each rank notes its process id there when it starts and its
-- exit code and last error when it ends (the uvmrec command does, engine/host/main.c); launch
-- reads it to forward Ctrl-C and to name the rank that failed.  Without MPI it is also the
-- rendezvous through which rank 0 hands NCCL's unique id to the others.
local dir = ffi.new("char[?]", 256)
ffi.copy(dir, (os.getenv("TMPDIR") or "/tmp") .. "/uvmrec-launch-XXXXXX")
assert(lib.check(C.ur_dir_temp(dir)))
local jobdir = ffi.string(dir)
setenv("UVMREC_JOB", jobdir)

local function note(r, kind)
  local t = lib.read_file(("%s/rank-%d.%s"):format(jobdir, r, kind))
  if not t then return nil end
  local code, text = t:match("^(%-?%d+)\t(.-)\n?$")
  return tonumber(code), text
end
local function say(fmt, ...) io.stderr:write(("uvmrec launch: " .. fmt .. "\n"):format(...)) end

-- Ctrl-C (SIGINT) and SIGTERM on launch reach every rank as SIGINT: each stops at its next step
-- boundary (the ranks agree on which: uvmrec.dist.interrupted), saves and exits; a second one
-- ends them at once.  A rank that has not noted its process id yet when the signal comes gets it
-- as soon as it does, so a Ctrl-C while the ranks start is not lost.
assert(lib.check(C.ur_signals_catch(1)))
local forwarded, sent = 0, {}
local function forward()
  if C.ur_interrupt_get() ~= 0 then
    assert(lib.check(C.ur_signals_catch(1))) -- clears the flag and catches the next one again
    forwarded = forwarded + 1
    if forwarded == 1 then say("stopping every rank at its next step boundary (again: at once)") end
  end
  for r = 0, n - 1 do
    if (sent[r] or 0) < forwarded then
      local pid = note(r, "pid")
      if pid and pid > 0 then
        ffi.C.kill(pid, forwarded == 1 and 2 or 9)
        sent[r] = forwarded
      end
    end
  end
end

-- A rank that is gone without noting its exit died without a word: killed by a signal or by the
-- kernel out of memory, or crashed, as MPI does on collectives that disagree in size (which
-- MPI's error handler may also end with a code of its own).  The first such rank, or the first
-- failing one, is the job's cause.
local CHECK = "UVMREC_COMM_CHECK=1 makes the ranks compare each host collective's sizes before MPI takes it, "
  .. "naming the ranks that disagree"
local CHECK_HINT = mpirun and ", or crashed (in MPI? " .. CHECK .. ")" or ""
local cause
local watch_once
local function watch()
  watch_once()
  if cause and not cause.said then
    cause.said = true
    say("rank %d %s; stopping the other ranks", cause.rank, cause.text)
  end
end
function watch_once()
  if cause then return end
  -- A rank's noted failure first: it notes before its MPI_Abort, which kills the others
  -- without a note, whichever rank they are.
  for r = 0, n - 1 do
    local code, text = note(r, "exit")
    -- after Ctrl-C, ranks end with 130 (SIGINT's code) once their checkpoint is saved, or die of
    -- the signal itself when it came before they could catch it
    if code and code ~= 0 and not (forwarded > 0 and code == 130) then
      cause = { rank = r, text = ("exited with %d: %s"):format(code, text:match("^[^\n]*")) }
      return
    end
  end
  for r = 0, n - 1 do
    local pid = note(r, "pid")
    local code = note(r, "exit")
    if pid and not code and not sent[r] and ffi.C.kill(pid, 0) ~= 0 and not note(r, "exit") then
      cause = { rank = r, text = ("(process %d) died without a message: killed by a signal, or by the kernel "
        .. "out of memory%s"):format(pid, CHECK_HINT) }
      return
    end
  end
end

local rank_of, alive = {}
if mpirun then
  spawn(argv)
  alive = 1
else
  -- Without MPI: the ranks are our children, and meet through the job's folder.
  setenv("UVMREC_WORLD", tostring(n))
  setenv("UVMREC_LOCAL_WORLD", tostring(n))
  setenv("UVMREC_RENDEZVOUS", jobdir)
  for r = 0, n - 1 do
    setenv("UVMREC_RANK", tostring(r))
    setenv("UVMREC_LOCAL_RANK", tostring(r))
    rank_of[spawn(argv)] = r
  end
  alive = n
end

-- The first failure stops the others: mpirun does so itself (MPI_Abort, or a rank gone); the
-- ranks launch started get SIGTERM, and SIGKILL if still there 30 s later.
local code, stopped_at = 0, nil
while alive > 0 do
  forward()
  assert(lib.check(C.ur_proc_wait(-1, 1, status, which)))
  if which[0] > 0 then
    alive = alive - 1
    local r = rank_of[which[0]]
    if r then
      rank_of[which[0]] = nil
      if status[0] ~= 0 and not note(r, "exit") and not cause and not (forwarded > 0 and status[0] == 130) then
        cause = { rank = r, text = status[0] > 128 and ("was killed by signal %d"):format(status[0] - 128)
                  or ("exited with %d"):format(status[0]) }
      end
      watch()
    end
    if status[0] ~= 0 and code == 0 then code = status[0] end
  else
    watch()
    if cause and not stopped_at and not mpirun then
      stopped_at = os.time()
      for pid in pairs(rank_of) do C.ur_proc_kill(pid, 15) end
    end
    if stopped_at and os.time() - stopped_at > 30 then
      for pid in pairs(rank_of) do C.ur_proc_kill(pid, 9) end
    end
    ffi.C.usleep(20000)
  end
end
C.ur_signals_catch(0)
watch()
if code ~= 0 and not cause and forwarded == 0 then
  say("the job failed with %d%s", code, mpirun and " (a crash in MPI? " .. CHECK .. ")" or "")
end
for _, name in ipairs(lib.dir_list(jobdir, "", "") or {}) do os.remove(jobdir .. "/" .. name) end
os.remove(jobdir)
os.exit(code)
