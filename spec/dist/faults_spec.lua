-- Faults over ranks as processes on the CPU (spec/support/dist_fault.lua under `uvmrec launch`):
-- a rank killed, failing or out of memory in the middle of a step ends the job non-zero within
-- 60 s, launch naming the rank and its error; a rank that hangs makes the others' collectives
-- time out (UVMREC_COMM_TIMEOUT); SIGINT on launch stops every rank at one step boundary with a
-- checkpoint from which the run resumes with the uninterrupted run's losses, bit for bit.
local command = require "command"

local h = require "helpers"

local SCRIPT = "spec/support/dist_fault.lua"

local function env(vars) return "env " .. command.assignments(vars) end

-- A job of n ranks: output (stdout and stderr), exit code, seconds.
local function job(n, vars)
  local t0 = command.now()
  local out, err, code = command.sh(("%s timeout 120 %s launch -n %d %s"):format(env(vars), command.bin(), n, SCRIPT))
  return out .. err, code, command.now() - t0
end

local function losses(out)
  local l = {}
  for s, x in out:gmatch("\nstep (%d+) loss (%S+)") do l[tonumber(s)] = x end
  return l
end

describe("faults over ranks", function()
  local dir = command.tmpdir()
  teardown(function() command.rmdir(dir) end)

  local cases = {
    { "kill", "rank 1 %(process %d+%) died without a message: killed by a signal, or by the kernel out of memory, "
      .. "or crashed %(in MPI%? UVMREC_COMM_CHECK=1 makes the ranks compare each host collective's sizes before MPI "
      .. "takes it, naming the ranks that disagree%)" },
    { "error", "rank 1 exited with 1: .*an injected failure in step 3" },
    { "oom", "rank 1 exited with 1: .*tensor: host allocation of 4398046511104 bytes failed" },
  }
  for _, c in ipairs(cases) do
    h.mpi_it(("ends the job within 60 s when a rank fails mid-step (%s), naming the rank and its error"):format(c[1]),
      function()
        local out, code, s = job(3, { FAULT = c[1], FAULT_RANK = "1", FAULT_STEP = "3", STEPS = "8" })
        assert.is_true(code ~= 0, out)
        assert.is_true(s < 60, ("%.1f s"):format(s))
        assert.matches("uvmrec launch: " .. c[2] .. "; stopping the other ranks", out)
        assert.matches("\nstep 2 loss", "\n" .. out)
        assert.is_nil(out:match("step 3 loss"), out)
        assert.is_nil(out:match("rank %d: ok"), out)
      end)
  end

  h.mpi_it("names a rank's own one-line failure, before the job starts and after, not a death without a word",
    function()
      local failures = {
        { "nosuchcmd", "rank %d exited with 2: 'nosuchcmd' is not a command; the commands are: " },
        { "train dlrm_tiny --cpu --frobnicate", "rank %d exited with 2: unknown option '%-%-frobnicate'" },
        { "train dlrm_tiny --cpu --set train.batch_size=1023", "rank %d exited with 1: %-%-set "
          .. "train.batch_size=1023: train.batch_size: 1023 is not a multiple of the 2 ranks" },
        { "train dlrm_tiny --cpu --steps 1 --progress none --set eval.samples=1024 --set eval.min_auc=0.99",
          "rank %d exited with 1: the final AUC %S+ is below eval.min_auc 0.9900; stopping the other ranks" },
      }
      for _, c in ipairs(failures) do
        local out, err, code = command.sh(("timeout 120 %s launch -n 2 %s"):format(command.bin(), c[1]))
        assert.is_true(code ~= 0, out .. err)
        assert.matches("uvmrec launch: " .. c[2], err)
        assert.is_nil(err:match("died without a message"), err)
      end
      -- every rank of 3 failing alike with an all-to-all posted and not waited for: the first to
      -- note its failure aborts the job; closing Lua freed the all-to-all's buffers before the
      -- communicator, whose close completed it into freed memory (SIGSEGV in every run: launch
      -- exited 139, mpirun saying 'exited on signal 11'), so the communicator holds them
      local script = command.spit(dir .. "/all_fail.lua", [[
        local ur = require "uvmrec"
        local dist = require "uvmrec.dist"
        local comm = assert(dist.init { cpu = true })
        local n, counts = 65536, {}
        for r = 1, dist.world() do counts[r] = n end
        local send, recv = ur.tensor({ n * dist.world() }):fill(1), ur.tensor({ n * dist.world() })
        assert(comm:all_to_all(send, recv, counts, counts))
        local q = ur.tensor({ 4 * dist.world() }, { dtype = "i8" })
        assert(comm:reduce_scatter(q, ur.tensor({ 4 }, { dtype = "i8" })))
      ]])
      for _ = 1, 4 do
        local out, err, code = command.sh(("timeout 120 %s launch -n 3 %s"):format(command.bin(), script))
        assert.equal(1, code, out .. err)
        assert.matches("uvmrec launch: rank %d exited with 1: .*comm reduce_scatter: dtype i8 cannot be reduced;",
          err)
        assert.is_nil(err:match("died without a message"), err)
        assert.is_nil((out .. err):match("Segmentation fault"), out .. err)
        assert.is_nil((out .. err):match("signal 11"), out .. err)
      end
    end)

  h.mpi_it("times out the others' collectives when a rank hangs (UVMREC_COMM_TIMEOUT)", function()
    local out, code, s = job(3, { FAULT = "hang", FAULT_RANK = "2", FAULT_STEP = "2", STEPS = "8",
                                  UVMREC_COMM_TIMEOUT = "4" })
    assert.is_true(code ~= 0, out)
    assert.is_true(s < 60, ("%.1f s"):format(s))
    assert.matches("comm: rank [01] of 3 waited [4-9] s for its collectives %(UVMREC_COMM_TIMEOUT%): another rank "
      .. "stopped, failed or made other calls", out)
    assert.matches("uvmrec launch: rank [01] exited with 1: .*waited", out)
    local _, err = command.sh(env { UVMREC_COMM_TIMEOUT = "soon" } .. " " .. command.bin() .. " launch -n 2 "
      .. "spec/support/dist_collectives.lua")
    assert.matches("comm: UVMREC_COMM_TIMEOUT is 'soon'; expected seconds >= 0 %(0: no limit%)", err)
  end)

  h.mpi_it("stops every rank at one step boundary on SIGINT to launch, saving a checkpoint that resumes exactly",
    function()
      if not h.can_signal_launch() then return end
      local ck, log = dir .. "/int", dir .. "/int.log"
      -- launch in the background, SIGINT to it alone once a few steps are done
      local bg = command.background(("%s %s launch -n 3 %s"):format(env { STEPS = "60", SLOW = "0.2", OUT = ck },
        command.bin(), SCRIPT), log)
      local t0 = command.now()
      while not (command.slurp(log) or ""):match("step 4 loss") and command.now() - t0 < 120 do command.sleep(0.2) end
      assert.matches("step 4 loss", command.slurp(log) or "")
      command.sh("kill -INT " .. bg.pid)
      -- the ranks stop at their next step boundary and save: on a loaded machine that can take a
      -- while, so the wait (which ends as soon as launch does) is long
      local out, ended = bg:wait(300)
      assert.equal(130, ended, out)
      assert.matches("uvmrec launch: stopping every rank at its next step boundary", out)
      local at = tonumber(out:match("\nstopped at step (%d+) by SIGINT"))
      assert.is_truthy(at, out)
      assert.is_true(at < 60)
      for r = 1, 2 do assert.matches(("%%[rank %d%%] stopped at step %d by SIGINT"):format(r, at), out) end
      assert.is_nil(out:match("uvmrec launch: rank"), "no rank is named as failing")
      -- resumed to 3 steps later: the uninterrupted run's losses, bit for bit
      local resumed, code = job(3, { STEPS = tostring(at + 3), IN = ck })
      assert.equal(0, code, resumed)
      local whole, wcode = job(3, { STEPS = tostring(at + 3) })
      assert.equal(0, wcode, whole)
      local r, w = losses("\n" .. resumed), losses("\n" .. whole)
      assert.is_nil(r[at])
      for s = at + 1, at + 3 do assert.equal(w[s], r[s], "step " .. s) end
    end)
end)
